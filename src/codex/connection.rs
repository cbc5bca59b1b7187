//! One client connection: reads messages, answers requests, and carries
//! the processes' pushed notifications, all through one bounded queue to
//! the transport so that a client that stops reading slows everything
//! that would send to it.

use std::cell::RefCell;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

use futures::{Sink, SinkExt, Stream, StreamExt};
use serde_json::Value;
use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;

use super::Bridge;
use super::environment::Session;
use super::files::Files;
use super::jsonrpc::{self, Incoming, RpcError};
use super::process;

/// Messages waiting for the transport. Each is at most one output chunk
/// in base64 or one answer, so this bounds what a client that stops
/// reading makes the bridge hold.
const OUTBOUND_MESSAGES: usize = 32;

/// Requests of one connection being answered at once; past it the bridge
/// stops reading until one finishes.
const REQUESTS_IN_FLIGHT: usize = 256;

/// How long answers still being worked on may take once the client has
/// closed its side.
const LAST_ANSWERS: std::time::Duration = std::time::Duration::from_secs(2);

/// Why a connection ended other than by its client closing it.
#[derive(Debug)]
pub enum BridgeError {
    /// The transport failed.
    Transport(std::io::Error),
}

impl fmt::Display for BridgeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BridgeError::Transport(error) => write!(f, "the connection failed: {error}"),
        }
    }
}

impl std::error::Error for BridgeError {}

/// The way back to the client, shared by every task of the connection.
#[derive(Clone)]
pub struct Outbound(mpsc::Sender<String>);

impl Outbound {
    /// Queues a message, waiting while the queue is full; once the
    /// connection is gone, the message comes back.
    pub async fn send(&self, message: String) -> Result<(), String> {
        self.0.send(message).await.map_err(|unsent| unsent.0)
    }

    pub fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

/// The answer to a request, once its work is done.
pub type Answer = Pin<Box<dyn Future<Output = Result<Value, RpcError>>>>;

/// What a handler does with a request: the work that must happen in the
/// order of arrival (a start that reserves its id, a write that must reach
/// stdin before the next one) is done before it returns; the rest is the
/// answer's future, run beside later requests.
pub fn later(future: impl Future<Output = Result<Value, RpcError>> + 'static) -> Answer {
    Box::pin(future)
}

pub fn now(answer: Result<Value, RpcError>) -> Answer {
    Box::pin(std::future::ready(answer))
}

/// A connection's state.
pub struct Connection {
    pub bridge: Rc<Bridge>,
    pub outbound: Outbound,
    pub session: RefCell<Option<Rc<Session>>>,
    pub files: Files,
}

pub async fn serve<I, O>(bridge: Rc<Bridge>, inbound: I, outbound: O) -> Result<(), BridgeError>
where
    I: Stream<Item = std::io::Result<String>> + Unpin,
    O: Sink<String, Error = std::io::Error> + Unpin,
{
    let (sender, mut queue) = mpsc::channel::<String>(OUTBOUND_MESSAGES);
    let connection = Rc::new(Connection {
        files: Files::new(&bridge),
        bridge,
        outbound: Outbound(sender),
        session: RefCell::new(None),
    });
    let writer = async move {
        let mut outbound = outbound;
        while let Some(message) = queue.recv().await {
            outbound.send(message).await?;
        }
        outbound.close().await
    };
    let work = read_requests(connection.clone(), inbound);
    futures::pin_mut!(writer, work);
    match futures::future::select(writer, work).await {
        // The client stopped taking messages: nothing more can be said,
        // and the requests being worked on are dropped with `work`.
        futures::future::Either::Left((written, _)) => {
            detach(&connection);
            written.map_err(BridgeError::Transport)
        }
        // The client said everything: what is still queued goes out.
        futures::future::Either::Right((read, writer)) => {
            drop(connection);
            let written = writer.await;
            read.and(written.map_err(BridgeError::Transport))
        }
    }
}

/// The client is gone: its session is kept for a resume as long as the
/// bridge says, or its processes go with it (their capabilities are
/// released, which ends them on the executor).
fn detach(connection: &Connection) {
    let session = connection.session.borrow_mut().take();
    if let Some(session) = session {
        super::environment::detach(connection, session);
    }
}

/// Reads and answers requests until the client closes its side, then
/// ends the session's processes and lets the answers still being worked
/// on finish, briefly.
async fn read_requests<I>(connection: Rc<Connection>, mut inbound: I) -> Result<(), BridgeError>
where
    I: Stream<Item = std::io::Result<String>> + Unpin,
{
    let in_flight = Arc::new(Semaphore::new(REQUESTS_IN_FLIGHT));
    let mut requests = JoinSet::new();
    let ended = loop {
        while requests.try_join_next().is_some() {}
        let message = match inbound.next().await {
            None => break Ok(()),
            Some(Ok(message)) => message,
            Some(Err(error)) if error.kind() == std::io::ErrorKind::InvalidData => {
                let answer = jsonrpc::error(
                    &Value::from(-1),
                    &RpcError::invalid_request(error.to_string()),
                );
                if connection.outbound.send(answer).await.is_err() {
                    break Ok(());
                }
                continue;
            }
            Some(Err(error)) => break Err(BridgeError::Transport(error)),
        };
        let (id, answer) = match jsonrpc::parse(&message) {
            Ok(Incoming::Request { id, method, params }) => {
                let answer = if method == "initialize" {
                    // Answered before anything else is read: every later
                    // request needs the session it makes.
                    now(super::environment::initialize(&connection, params).await)
                } else {
                    dispatch(&connection, &method, params)
                };
                (id, answer)
            }
            Ok(Incoming::Notification { .. }) | Ok(Incoming::Response) => continue,
            Err((id, error)) => (id, now(Err(error))),
        };
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            break Ok(());
        };
        let outbound = connection.outbound.clone();
        requests.spawn_local(async move {
            let text = match answer.await {
                Ok(result) => jsonrpc::result(&id, result),
                Err(error) => jsonrpc::error(&id, &error),
            };
            // A client that left takes no answers.
            let _ = outbound.send(text).await;
            drop(permit);
        });
    };
    detach(&connection);
    drop(connection);
    // Answers already being worked on get a moment to go out (a client
    // may send its last requests and close at once); a long-poll does not
    // hold the end.
    let drained = async { while requests.join_next().await.is_some() {} };
    if tokio::time::timeout(LAST_ANSWERS, drained).await.is_err() {
        requests.abort_all();
    }
    ended
}

fn dispatch(connection: &Rc<Connection>, method: &str, params: Value) -> Answer {
    let Some(session) = connection.session.borrow().clone() else {
        return now(Err(RpcError::invalid_request(
            "client must call initialize before using exec methods",
        )));
    };
    match method {
        "process/start" => process::start(connection, &session, params),
        "process/read" => process::read(&session, params),
        "process/write" => process::write(&session, params),
        "process/signal" => process::signal(&session, params),
        "process/terminate" => process::terminate(&session, params),
        "process/resize" => process::resize(&session, params),
        "environment/info" => now(Ok(session.info.clone())),
        "environment/status" => super::environment::status(connection),
        "fs/watchMissing" => super::watch_missing::watch_missing(connection, &session, params),
        method if method.starts_with("fs/") => {
            connection.files.dispatch(connection, method, params)
        }
        method => now(Err(RpcError::unknown_method(method))),
    }
}
