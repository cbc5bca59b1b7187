//! `initialize`, the session it opens, and what the bridge says about the
//! executor (`environmentInfo`, `environment/status`).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::io::Read;
use std::path::Path;
use std::rc::Rc;

use serde_json::{Value, json};

use super::connection::{Answer, Connection, later};
use super::jsonrpc::{self, RpcError};
use super::process::Entry;
use super::protocol::Initialize;
use super::uri;
use crate::client::{self, Command};

/// One client's session: its processes by the ids it chose, and what it
/// was told about the executor.
pub struct Session {
    pub id: String,
    pub info: Value,
    /// The executor's own environment, which `envPolicy` filters.
    pub environment: BTreeMap<String, String>,
    pub processes: RefCell<HashMap<String, Rc<Entry>>>,
}

impl Session {
    /// Releases every process of the session (the executor ends them).
    pub fn close(&self) {
        let processes = std::mem::take(&mut *self.processes.borrow_mut());
        for entry in processes.values() {
            entry.release();
        }
    }
}

pub async fn initialize(connection: &Rc<Connection>, params: Value) -> Result<Value, RpcError> {
    let params: Initialize = jsonrpc::params(params)?;
    if connection.session.borrow().is_some() {
        return Err(RpcError::invalid_request(
            "initialize was already called on this connection",
        ));
    }
    if let Some(resumed) = params.resume_session_id {
        return Err(RpcError::invalid_request(format!(
            "session {resumed} cannot be resumed: capexec codex-bridge keeps no session past its connection"
        )));
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
        "capabilities": {},
    });
    if let Some(home) = environment.get("HOME").filter(|home| home.starts_with('/')) {
        environment_info["userHomeDir"] = Value::from(uri::from_path(Path::new(home)));
    }
    let session = Rc::new(Session {
        id: session_id(),
        info: environment_info.clone(),
        environment,
        processes: RefCell::new(HashMap::new()),
    });
    let id = session.id.clone();
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
