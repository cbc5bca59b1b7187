//! The one tagged error of capexec: why a call was refused or failed, in a
//! form that survives the wire and any number of forwarding hops. Every
//! kind is a `[capexec:<code>]` tag the schema documents; the wire layer
//! turns a [`Refusal`] into a `capnp::Error` whose description ends with
//! the tag, and finds it again on the other side.

use std::fmt;

macro_rules! refusal_kinds {
    ($($(#[$doc:meta])* $variant:ident = $code:literal,)*) => {
        /// What kind of refusal it is: the tag's code.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum RefusalKind {
            $($(#[$doc])* $variant,)*
        }

        impl RefusalKind {
            /// Every kind, in the schema's order.
            pub const ALL: &'static [RefusalKind] = &[$(RefusalKind::$variant,)*];

            /// The code in the tag, e.g. `program-not-found`.
            pub fn code(self) -> &'static str {
                match self {
                    $(RefusalKind::$variant => $code,)*
                }
            }
        }
    };
}

refusal_kinds! {
    /// Malformed or impossible parameters.
    InvalidArgument = "invalid-argument",
    /// `argv[0]` does not resolve to a file.
    ProgramNotFound = "program-not-found",
    /// The program exists but cannot be executed.
    PermissionDenied = "permission-denied",
    /// The working directory does not exist or is not a directory.
    BadCwd = "bad-cwd",
    /// The server cannot honour a requested feature.
    Unsupported = "unsupported",
    /// The executor does nothing new now (it is shutting down).
    Unavailable = "unavailable",
    /// Any other operating-system failure of a start.
    SpawnFailed = "spawn-failed",
    /// The call was for an upstream environment that cannot be reached.
    UpstreamUnavailable = "upstream-unavailable",
    /// No environment has the name asked for.
    UnknownEnvironment = "unknown-environment",
    /// `restore`: no process has this token (any more).
    UnknownToken = "unknown-token",
    /// A configured limit would be exceeded.
    LimitReached = "limit",
    /// A rule of a restricted executor forbids it.
    NotAllowed = "not-allowed",
    /// A socket operation of a port (dial, listen, a connection's
    /// transfer) failed on the executor's machine.
    SocketFailed = "socket-failed",
    /// The capability may not make this call (an attenuated facet).
    Forbidden = "forbidden",
    /// A login was refused.
    Unauthenticated = "unauthenticated",
    /// The server failed in a way the request could not have avoided (an
    /// operating-system failure outside a start).
    Internal = "internal",
    /// No file or directory by that name.
    NotFound = "not-found",
    /// A path component, or the target, is not a directory.
    NotADirectory = "not-a-directory",
    /// A file was expected; the path names a directory.
    IsADirectory = "is-a-directory",
    /// The target exists and may not be replaced.
    Exists = "exists",
    /// A directory to remove or replace is not empty.
    NotEmpty = "not-empty",
    /// A file is larger than a one-shot call carries.
    TooLarge = "too-large",
    /// The file changed since the version the call names.
    Conflict = "conflict",
    /// The path would leave the directory capability.
    OutsideDirectory = "outside-directory",
    /// The file system is full, or a quota is reached.
    NoSpace = "no-space",
    /// The file is in use (a mount point, a running program).
    Busy = "busy",
}

impl RefusalKind {
    /// The tag written at the end of an error description.
    pub fn tag(self) -> String {
        format!("[capexec:{}]", self.code())
    }

    /// The kind whose tag `description` carries, wherever forwarding hops
    /// put it.
    pub fn from_description(description: &str) -> Option<RefusalKind> {
        RefusalKind::ALL
            .iter()
            .copied()
            .find(|kind| description.contains(&kind.tag()))
    }

    /// The exit status `capexec run` reports for this failure.
    pub fn cli_exit_code(self) -> i32 {
        match self {
            RefusalKind::ProgramNotFound => 127,
            RefusalKind::PermissionDenied => 126,
            _ => 125,
        }
    }
}

/// A refused or failed call: what went wrong, for people (`message`, a
/// sentence without the tag) and for programs (`kind`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub kind: RefusalKind,
    pub message: String,
}

/// The prefix capnp-rpc puts before a peer's error description, once per
/// hop it crossed.
const REMOTE_PREFIX: &str = "remote exception:";

impl Refusal {
    pub fn new(kind: RefusalKind, message: impl Into<String>) -> Refusal {
        Refusal {
            kind,
            message: message.into(),
        }
    }

    /// The refusal an error description carries (see [`fmt::Display`]), as
    /// it arrives after any number of hops: the tag found, the hops'
    /// prefixes and the tag removed from the message.
    pub fn from_description(description: &str) -> Option<Refusal> {
        let kind = RefusalKind::from_description(description)?;
        let message = description.replace(&kind.tag(), "");
        let mut message = message.trim();
        while let Some(rest) = message.strip_prefix(REMOTE_PREFIX) {
            message = rest.trim_start();
        }
        Some(Refusal::new(kind, message.trim()))
    }
}

/// The message followed by the tag: the description on the wire.
impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.message, self.kind.tag())
    }
}

impl std::error::Error for Refusal {}

/// An error description for people: without the hops' prefixes or
/// capexec's machine tags.
pub fn human_description(description: &str) -> String {
    let mut text = description.trim();
    while let Some(rest) = text.strip_prefix(REMOTE_PREFIX) {
        text = rest.trim_start();
    }
    let mut text = text.to_string();
    while let Some(start) = text.find("[capexec:") {
        let Some(len) = text[start..].find(']') else {
            break;
        };
        text.replace_range(start..start + len + 1, "");
    }
    text.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_survive_prefixes() {
        let error = Refusal::new(RefusalKind::ProgramNotFound, "no such program \"x\"");
        let forwarded = format!("remote exception: remote exception: {error}");
        assert_eq!(Refusal::from_description(&forwarded), Some(error));
        assert_eq!(Refusal::from_description("plain failure"), None);
    }

    #[test]
    fn every_kind_has_its_own_tag() {
        for &kind in RefusalKind::ALL {
            let refusal = Refusal::new(kind, "why");
            assert_eq!(
                Refusal::from_description(&refusal.to_string()),
                Some(refusal),
                "{kind:?}"
            );
        }
        let codes: std::collections::HashSet<_> =
            RefusalKind::ALL.iter().map(|kind| kind.code()).collect();
        assert_eq!(codes.len(), RefusalKind::ALL.len());
    }

    #[test]
    fn human_descriptions_lose_prefixes_and_tags() {
        assert_eq!(
            human_description(
                "remote exception: remote exception: login refused: wrong token \
                 [capexec:unauthenticated]"
            ),
            "login refused: wrong token"
        );
    }
}
