//! Codex's exec-server protocol over capexec's capabilities: what
//! `capexec codex-bridge` serves, so that an unmodified Codex runs its
//! commands, file reads, writes and patches on a capexec executor.
//!
//! The bridge is a client of the same capabilities as every other
//! front-end: processes are [`RemoteProcess`]es started on the executor,
//! files go through [`Directory`]. Transports (stdio, websocket) hand
//! [`serve_connection`] each message's text and take each answer; nothing
//! here knows how the bytes travel.
//!
//! [`RemoteProcess`]: crate::client::RemoteProcess
//! [`Directory`]: crate::client::Directory

mod connection;
mod env_policy;
mod environment;
mod files;
pub mod jsonrpc;
mod process;
mod protocol;
pub mod sandbox_denied;
pub mod sandbox_intent;
pub mod stdio;
mod uri;
mod watch_missing;
pub mod websocket;

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use futures::{Sink, Stream};

use crate::capexec_capnp::executor;

pub use connection::BridgeError;

/// What every connection of one bridge shares: the executor its processes
/// and files live on, how the operator confined it, and the sessions a
/// client may resume.
pub struct Bridge {
    executor: executor::Client,
    root: Option<PathBuf>,
    keep_session: Duration,
    sessions: RefCell<HashMap<String, Rc<environment::Session>>>,
}

impl Bridge {
    /// A bridge to `executor`. With `root`, files are served beneath that
    /// directory only and commands start through its confined executor
    /// (`Directory.executor`), which writes only beneath it. A session
    /// whose connection is lost is kept `keep_session` for `initialize`
    /// with its `resumeSessionId` (its processes running meanwhile, their
    /// output held back rather than lost); zero ends it with its
    /// connection.
    pub fn new(
        executor: executor::Client,
        root: Option<PathBuf>,
        keep_session: Duration,
    ) -> Rc<Bridge> {
        let executor = match &root {
            Some(root) => crate::client::Directory::open(&executor, root).executor(),
            None => executor,
        };
        Rc::new(Bridge {
            executor,
            root,
            keep_session,
            sessions: RefCell::new(HashMap::new()),
        })
    }

    /// Sessions kept for a client to resume (attached or not).
    pub fn sessions(&self) -> usize {
        self.sessions.borrow().len()
    }
}

/// Serves one client connection of Codex's exec-server protocol until
/// `inbound` ends. `inbound` yields each JSON message's text; `outbound`
/// takes each message to send and is polled for readiness, so a client
/// that stops reading holds pushed output back (no unbounded queue). Runs
/// on the RPC thread (inside a `LocalSet`).
///
/// An `inbound` error of kind `InvalidData` (a message over the
/// transport's bound, say) is answered as a bad message and serving goes
/// on; any other error ends the connection.
pub async fn serve_connection<I, O>(
    bridge: Rc<Bridge>,
    inbound: I,
    outbound: O,
) -> Result<(), BridgeError>
where
    I: Stream<Item = std::io::Result<String>> + Unpin,
    O: Sink<String, Error = std::io::Error> + Unpin,
{
    connection::serve(bridge, inbound, outbound).await
}
