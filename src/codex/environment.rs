//! `initialize`, the session it opens, and what the bridge says about the
//! executor (`environmentInfo`, `environment/status`).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::io::Read;
use std::path::Path;
use std::rc::Rc;

use serde_json::{Value, json};
use tokio::sync::watch;

use super::connection::{Answer, Connection, Outbound, later};
use super::jsonrpc::{self, RpcError};
use super::process::Entry;
use super::protocol::Initialize;
use super::sandbox_intent::Carving;
use super::uri;
use crate::client::{self, Command};

/// One client's session: its processes by the ids it chose, and what it
/// was told about the executor.
pub struct Session {
    pub id: String,
    pub info: Value,
    /// How a start's sandbox keeps `.git` and the like read-only inside a
    /// writable workspace: by mounts where the executor can make them.
    pub carving: Carving,
    /// The executor's own environment, which `envPolicy` filters.
    pub environment: BTreeMap<String, String>,
    pub processes: RefCell<HashMap<String, Rc<Entry>>>,
    /// The connection the session's notifications go to; `None` while
    /// detached (pushes wait for the next one meanwhile).
    attached: watch::Sender<Option<Outbound>>,
    /// Counts attachments, so that a detachment's timer knows whether the
    /// session was resumed since.
    attachments: Cell<u64>,
    /// `fs/watchMissing` watches by id.
    pub watches: RefCell<HashMap<u64, tokio::task::AbortHandle>>,
}

/// Codex's code for a session still attached to another connection.
const SESSION_ALREADY_ATTACHED: i64 = -32010;

impl Session {
    /// Releases every process of the session (the executor ends them).
    pub fn close(&self) {
        self.attached.send_replace(None);
        for (_, watch) in self.watches.borrow_mut().drain() {
            watch.abort();
        }
        let processes = std::mem::take(&mut *self.processes.borrow_mut());
        for entry in processes.values() {
            entry.release();
        }
    }

    /// Where notifications go now, waiting while the session is detached;
    /// `None` once it is closed for good.
    pub async fn outbound(&self) -> Option<Outbound> {
        let mut attached = self.attached.subscribe();
        attached
            .wait_for(|outbound| {
                outbound
                    .as_ref()
                    .is_some_and(|outbound| !outbound.is_closed())
            })
            .await
            .ok()?
            .clone()
    }

    fn attach(&self, outbound: Outbound) {
        self.attachments.set(self.attachments.get() + 1);
        self.attached.send_replace(Some(outbound));
    }

    fn is_attached(&self) -> bool {
        self.attached
            .borrow()
            .as_ref()
            .is_some_and(|outbound| !outbound.is_closed())
    }
}

/// The connection of `session` is gone: the session is kept for a resume
/// as long as the bridge says, then closed (unless resumed meanwhile).
pub fn detach(connection: &Connection, session: Rc<Session>) {
    let bridge = connection.bridge.clone();
    if bridge.keep_session.is_zero() {
        bridge.sessions.borrow_mut().remove(&session.id);
        session.close();
        return;
    }
    session.attached.send_replace(None);
    let attachment = session.attachments.get();
    tokio::task::spawn_local(async move {
        tokio::time::sleep(bridge.keep_session).await;
        if session.attachments.get() == attachment && !session.is_attached() {
            tracing::info!(session = %session.id, "no client resumed the session: its processes end");
            bridge.sessions.borrow_mut().remove(&session.id);
            session.close();
        }
    });
}

pub async fn initialize(connection: &Rc<Connection>, params: Value) -> Result<Value, RpcError> {
    let params: Initialize = jsonrpc::params(params)?;
    if connection.session.borrow().is_some() {
        return Err(RpcError::invalid_request(
            "initialize was already called on this connection",
        ));
    }
    if let Some(resumed) = params.resume_session_id {
        let session = connection.bridge.sessions.borrow().get(&resumed).cloned();
        let Some(session) = session else {
            return Err(RpcError::invalid_request(format!(
                "unknown session id {resumed}"
            )));
        };
        if session.is_attached() {
            return Err(RpcError::new(
                SESSION_ALREADY_ATTACHED,
                format!("session {resumed} is already attached to another connection"),
            ));
        }
        session.attach(connection.outbound.clone());
        *connection.session.borrow_mut() = Some(session.clone());
        return Ok(json!({"sessionId": session.id, "environmentInfo": session.info}));
    }
    let executor = &connection.bridge.executor;
    let (info, environment) =
        futures::join!(client::info(executor), executor_environment(executor));
    let info = info.map_err(|error| unreachable_executor(&error))?;
    let environment = environment.map_err(|error| unreachable_executor(&error))?;
    let cwd = connection
        .bridge
        .root
        .clone()
        .unwrap_or_else(|| info.cwd.clone());
    let shell = &info.default_shell;
    let mut environment_info = json!({
        "shell": {
            "name": shell.file_name().map(OsStr::to_string_lossy).unwrap_or_default(),
            "path": shell.to_string_lossy(),
        },
        "executorVersion": info.version,
        "cwd": uri::from_path(&cwd),
        "platformOs": info.os,
        "temporaryDirectories": [],
        "tempDir": uri::from_path(&info.temp_dir),
        "capabilities": {"fsWatchMissing": true},
    });
    if let Some(home) = environment.get("HOME").filter(|home| home.starts_with('/')) {
        environment_info["userHomeDir"] = Value::from(uri::from_path(Path::new(home)));
    }
    let session = Rc::new(Session {
        id: session_id(),
        info: environment_info.clone(),
        carving: if info
            .features
            .iter()
            .any(|feature| feature == crate::model::READ_ONLY_INSIDE_FEATURE)
        {
            Carving::Mount
        } else {
            Carving::Split
        },
        environment,
        processes: RefCell::new(HashMap::new()),
        attached: watch::channel(Some(connection.outbound.clone())).0,
        attachments: Cell::new(1),
        watches: RefCell::new(HashMap::new()),
    });
    let id = session.id.clone();
    connection
        .bridge
        .sessions
        .borrow_mut()
        .insert(id.clone(), session.clone());
    *connection.session.borrow_mut() = Some(session);
    Ok(json!({"sessionId": id, "environmentInfo": environment_info}))
}

/// `environment/status`: ready while the executor answers.
pub fn status(connection: &Rc<Connection>) -> Answer {
    let executor = connection.bridge.executor.clone();
    later(async move {
        client::info(&executor)
            .await
            .map_err(|error| unreachable_executor(&error))?;
        Ok(json!({"status": "ready"}))
    })
}

pub fn unreachable_executor(error: &client::Error) -> RpcError {
    RpcError::internal(format!("the capexec executor did not answer: {error}"))
}

/// The executor's environment, as its children inherit it: read once per
/// session from a child that prints it.
async fn executor_environment(
    executor: &crate::capexec_capnp::executor::Client,
) -> Result<BTreeMap<String, String>, client::Error> {
    let output = Command::new("/usr/bin/env")
        .arg("-0")
        .output(executor)
        .await?;
    let mut environment = BTreeMap::new();
    for entry in output.stdout.split(|&byte| byte == 0) {
        let Some(equals) = entry.iter().position(|&byte| byte == b'=') else {
            continue;
        };
        let (name, value) = (&entry[..equals], &entry[equals + 1..]);
        if let (Ok(name), Ok(value)) = (std::str::from_utf8(name), std::str::from_utf8(value)) {
            environment.insert(name.to_string(), value.to_string());
        }
    }
    Ok(environment)
}

/// A fresh session id: 128 random bits as a UUID (version 4) string.
fn session_id() -> String {
    let mut bytes = [0u8; 16];
    let filled =
        std::fs::File::open("/dev/urandom").and_then(|mut random| random.read_exact(&mut bytes));
    if filled.is_err() {
        // No /dev/urandom: unique within this bridge is all an id needs.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        bytes = (now ^ u128::from(std::process::id())).to_le_bytes();
    }
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}
