//! [`Refusal`]s as `capnp::Error`s and back: the description carries the
//! tag, so it survives any number of hops.

use crate::model::{Refusal, human_description};

impl From<Refusal> for capnp::Error {
    fn from(refusal: Refusal) -> capnp::Error {
        capnp::Error::failed(refusal.to_string())
    }
}

/// The refusal an error carries, if it carries a tag.
pub fn refusal_of(error: &capnp::Error) -> Option<Refusal> {
    Refusal::from_description(&error.extra)
}

/// How [`describe`] begins the description of a lost connection.
pub const LOST_CONNECTION_PREFIX: &str = "the connection was lost: ";

/// A capnp error as one line for people: the peer's own words, without the
/// "remote exception:" prefixes each hop adds, capexec's machine tags or
/// Rust's " (os error N)".
pub fn describe(error: &capnp::Error) -> String {
    let text = human_description(&error.extra);
    let text = match text.find(" (os error ") {
        Some(at) if text.ends_with(')') => &text[..at],
        _ => text.as_str(),
    };
    match error.kind {
        capnp::ErrorKind::Disconnected if text.is_empty() => "the connection was lost".to_string(),
        // What capnp-rpc and the kernel say when the peer closed the
        // connection, cleanly or not (a process killed with unread data
        // resets it).
        capnp::ErrorKind::Disconnected
            if matches!(
                text,
                "Peer disconnected." | "Connection reset by peer" | "Broken pipe"
            ) =>
        {
            "the server closed the connection".to_string()
        }
        capnp::ErrorKind::Disconnected => format!("{LOST_CONNECTION_PREFIX}{text}"),
        _ if text.is_empty() => error.kind.to_string(),
        _ => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::RefusalKind;

    #[test]
    fn a_refusal_survives_the_wire() {
        for &kind in RefusalKind::ALL {
            let refusal = Refusal::new(kind, "why it was refused");
            let error = capnp::Error::from(refusal.clone());
            assert_eq!(refusal_of(&error), Some(refusal));
            assert_eq!(describe(&error), "why it was refused");
        }
        assert_eq!(refusal_of(&capnp::Error::failed("untagged".into())), None);
    }

    #[test]
    fn describe_strips_hops_and_tags() {
        let error = capnp::Error::failed(
            "remote exception: remote exception: login refused: wrong token [capexec:unauthenticated]"
                .to_string(),
        );
        assert_eq!(describe(&error), "login refused: wrong token");
        let closed = capnp::Error::disconnected("Peer disconnected.".to_string());
        assert_eq!(describe(&closed), "the server closed the connection");
        let reset =
            capnp::Error::disconnected("Connection reset by peer (os error 104)".to_string());
        assert_eq!(describe(&reset), "the server closed the connection");
        let silent = capnp::Error::disconnected("no answer from the server for 15 s".to_string());
        assert_eq!(
            describe(&silent),
            "the connection was lost: no answer from the server for 15 s"
        );
    }
}
