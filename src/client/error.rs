use std::fmt;

use crate::model::{Refusal, RefusalKind, show_duration};
pub use crate::wire::describe;

/// What can go wrong talking to an executor.
#[derive(Clone, Debug)]
pub enum Error {
    /// The executor refused the call or could not do it, for a reason its
    /// tag names (see [`RefusalKind`]): a start that failed, a facet's
    /// forbidden call, a limit, a refused login... wherever along a chain
    /// of executors it was raised.
    Refused(Refusal),
    /// A call failed otherwise: the connection is gone, or the peer failed
    /// without saying why in capexec's terms.
    Rpc(capnp::Error),
    /// The event stream ended before the process closed (the connection or
    /// the subscription was lost).
    EventsEnded,
    /// Output the caller asked to collect was evicted before it could be
    /// read (retain mode): seqs `from_seq..=to_seq` are lost.
    OutputLost { from_seq: u64, to_seq: u64 },
    /// The executor could not be reached (a [`crate::client::Connect`]
    /// attempt failed); worth trying again.
    Connect(String),
    /// A resilient process could not be recovered after its connection
    /// broke: why not, and the break that started the recovery.
    Recovery {
        failure: RecoveryFailure,
        cause: Box<Error>,
    },
}

/// Why a [`crate::client::ResilientProcess`] gave up recovering its process.
#[derive(Clone, Debug)]
pub enum RecoveryFailure {
    /// The handle was made without a way to reconnect.
    NotEnabled,
    /// The connection broke before the server had made the process
    /// detachable, so there is no token to restore it with.
    NotDetachable,
    /// The grace period ended while the server still could not be reached
    /// (`last`: what the last attempt met).
    GaveUp {
        grace: std::time::Duration,
        last: Box<Error>,
    },
    /// The server answered, and refused to give the process back.
    Refused(Box<Error>),
    /// Every handle on the process was dropped during the recovery.
    HandleDropped,
}

impl fmt::Display for RecoveryFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecoveryFailure::NotEnabled => write!(f, "recovery is not enabled"),
            RecoveryFailure::NotDetachable => {
                write!(f, "the connection broke before the process was detachable")
            }
            RecoveryFailure::GaveUp { grace, last } => {
                write!(f, "gave up after {}: {last}", show_duration(*grace))
            }
            RecoveryFailure::Refused(error) => write!(f, "{error}"),
            RecoveryFailure::HandleDropped => write!(f, "the process handle was dropped"),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Refused(error) => write!(f, "{}", error.message),
            Error::Rpc(error) => write!(f, "{}", describe(error)),
            Error::EventsEnded => write!(f, "the event stream ended before the process closed"),
            Error::OutputLost { from_seq, to_seq } => write!(
                f,
                "output lost: events {from_seq}..={to_seq} were evicted before they were read"
            ),
            Error::Connect(reason) => write!(f, "{reason}"),
            Error::Recovery { failure, cause } => {
                write!(f, "{cause}; could not recover the process: {failure}")
            }
        }
    }
}

impl std::error::Error for Error {}

/// A failed call: a tagged refusal (its tag survives any number of hops)
/// becomes [`Error::Refused`], anything else [`Error::Rpc`].
impl From<capnp::Error> for Error {
    fn from(error: capnp::Error) -> Error {
        match crate::wire::refusal_of(&error) {
            Some(refusal) => Error::Refused(refusal),
            None => Error::Rpc(error),
        }
    }
}

impl From<capnp::NotInSchema> for Error {
    fn from(error: capnp::NotInSchema) -> Error {
        Error::Rpc(capnp::Error::from(error))
    }
}

impl From<tokio::task::JoinError> for Error {
    fn from(error: tokio::task::JoinError) -> Error {
        Error::Rpc(capnp::Error::failed(format!(
            "a call's task failed: {error}"
        )))
    }
}

impl Error {
    /// The kind of refusal, if the executor refused.
    pub fn refusal_kind(&self) -> Option<RefusalKind> {
        match self {
            Error::Refused(refusal) => Some(refusal.kind),
            _ => None,
        }
    }

    /// Why the way to the process broke, for a note such as `connection
    /// lost: REASON`: the server closed the connection, no answer for a
    /// while, a reset...
    pub fn loss_reason(&self) -> String {
        match self {
            Error::EventsEnded => "the server stopped sending the command's events".to_string(),
            other => {
                let text = other.to_string();
                match text.strip_prefix(crate::wire::LOST_CONNECTION_PREFIX) {
                    Some(reason) => reason.to_string(),
                    None => text,
                }
            }
        }
    }

    /// Whether the error means the way to the process broke (rather than
    /// the process or the call being refused), so recovering may help.
    pub fn is_transport_loss(&self) -> bool {
        match self {
            Error::Rpc(error) => error.kind == capnp::ErrorKind::Disconnected,
            Error::Refused(error) => error.kind == RefusalKind::UpstreamUnavailable,
            Error::EventsEnded | Error::Connect(_) => true,
            Error::OutputLost { .. } | Error::Recovery { .. } => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_classified_through_any_number_of_hops() {
        let forwarded = capnp::Error::failed(format!(
            "remote exception: remote exception: {}",
            Refusal::new(RefusalKind::Forbidden, "`signal` is not allowed")
        ));
        match Error::from(forwarded) {
            Error::Refused(refusal) => {
                assert_eq!(refusal.kind, RefusalKind::Forbidden);
                assert_eq!(refusal.message, "`signal` is not allowed");
            }
            other => panic!("not classified: {other:?}"),
        }
        let lost = Error::from(capnp::Error::disconnected("Peer disconnected.".into()));
        assert!(matches!(lost, Error::Rpc(_)));
        assert!(lost.is_transport_loss());
        let silent = capnp::Error::disconnected("no answer from the server for 15 s".to_string());
        assert_eq!(
            Error::Rpc(silent).loss_reason(),
            "no answer from the server for 15 s"
        );
    }
}
