use std::fmt;

use crate::model::StartError;

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
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Start(error) => write!(f, "{}", error.message),
            Error::Rpc(error) => write!(f, "{error}"),
            Error::EventsEnded => write!(f, "the event stream ended before the process closed"),
        }
    }
}

impl std::error::Error for Error {}

impl From<capnp::Error> for Error {
    fn from(error: capnp::Error) -> Error {
        Error::Rpc(error)
    }
}

impl From<capnp::NotInSchema> for Error {
    fn from(error: capnp::NotInSchema) -> Error {
        Error::Rpc(capnp::Error::from(error))
    }
}
