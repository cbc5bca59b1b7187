use std::fmt;

use crate::model::{StartError, StartErrorKind};
use crate::rpc::convert;
pub use crate::rpc::convert::describe;

/// What can go wrong talking to an executor.
#[derive(Debug)]
pub enum Error {
    /// The executor could not start the process.
    Start(StartError),
    /// A call failed: the server refused it or the connection is gone.
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
    /// broke: the reason, and the break that started the recovery.
    Recovery { reason: String, cause: String },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Start(error) => write!(f, "{}", error.message),
            Error::Rpc(error) => write!(f, "{}", describe(error)),
            Error::EventsEnded => write!(f, "the event stream ended before the process closed"),
            Error::OutputLost { from_seq, to_seq } => write!(
                f,
                "output lost: events {from_seq}..={to_seq} were evicted before they were read"
            ),
            Error::Connect(reason) => write!(f, "{reason}"),
            Error::Recovery { reason, cause } => {
                write!(f, "{cause}; could not recover the process: {reason}")
            }
        }
    }
}

impl std::error::Error for Error {}

impl From<capnp::Error> for Error {
    fn from(error: capnp::Error) -> Error {
        Error::Rpc(error)
    }
}

impl Error {
    /// A failed call: start failures (their tags survive any number of
    /// hops) become [`Error::Start`], anything else [`Error::Rpc`].
    pub(crate) fn from_call(error: capnp::Error) -> Error {
        match StartErrorKind::from_description(&error.extra) {
            Some(_) => Error::Start(convert::start_error_from_wire(&error)),
            None => Error::Rpc(error),
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
                match text.strip_prefix(convert::LOST_CONNECTION_PREFIX) {
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
            Error::Start(error) => error.kind == StartErrorKind::UpstreamUnavailable,
            Error::EventsEnded | Error::Connect(_) => true,
            Error::OutputLost { .. } | Error::Recovery { .. } => false,
        }
    }
}

impl From<capnp::NotInSchema> for Error {
    fn from(error: capnp::NotInSchema) -> Error {
        Error::Rpc(capnp::Error::from(error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(
            Error::Rpc(silent).loss_reason(),
            "no answer from the server for 15 s"
        );
    }
}
