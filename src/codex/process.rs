//! `process/*`: each process id of a session names a capexec process the
//! bridge owns. Its events are pushed to the client as Codex's
//! notifications, in seq order, at the pace the client reads them: the
//! process is started lossless, so a client that stops reading holds the
//! child back instead of losing its output.

use std::cell::{Cell, RefCell};
use std::fmt::Write as _;
use std::rc::Rc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::task::AbortHandle;

use super::connection::{Answer, Connection, later, now};
use super::env_policy;
use super::environment::Session;
use super::jsonrpc::{self, RpcError};
use super::protocol::{ProcessOnly, Read, Resize, Signal, Start, Write};
use super::sandbox_denied::{DenialScan, sandbox_denied};
use super::sandbox_intent::{Confinement, StartError, confinement_for, sandbox_type};
use super::uri;
use crate::client::{Command, RemoteProcess, Stdin};
use crate::model::{
    self, EventBody, ExitStatus, Flow, OutputStream, PtySize, RefusalKind, WriteStatus,
};

/// Processes one session may hold at once (running, or ended and still
/// kept for `process/read`).
const PROCESSES_PER_SESSION: usize = 1024;

/// How long an ended process stays readable (and its id taken), as in
/// Codex's own server.
const KEPT_AFTER_CLOSE: Duration = Duration::from_secs(30);

/// Codex's terminal size: its protocol has no way to give one at start.
const TERMINAL: PtySize = PtySize { rows: 24, cols: 80 };

/// The longest `process/read` long-poll the bridge waits.
const LONGEST_READ_WAIT: Duration = Duration::from_secs(300);

/// A process of a session.
pub struct Entry {
    /// `None` once released, or while a confined start is prepared.
    process: RefCell<Option<RemoteProcess>>,
    stdin_open: bool,
    exited: Cell<bool>,
    pump: RefCell<Option<AbortHandle>>,
    /// A confined start is being planned and started.
    starting: Cell<bool>,
    /// Released or terminated before its confined start finished: the
    /// process it gets is let go at once.
    cancelled: Cell<bool>,
    /// Codex's `sandboxDenied`, once the confined process exited.
    sandbox_denied: Cell<bool>,
}

impl Entry {
    fn process(&self) -> Option<RemoteProcess> {
        self.process.borrow().clone()
    }

    /// Lets the process go: the executor ends it once no capability holds
    /// it.
    pub fn release(&self) {
        self.cancelled.set(true);
        self.process.borrow_mut().take();
        if let Some(pump) = self.pump.borrow_mut().take() {
            pump.abort();
        }
    }
}

pub fn start(connection: &Rc<Connection>, session: &Rc<Session>, params: Value) -> Answer {
    match prepared(session, params, connection.bridge.root.as_deref()) {
        Ok((process_id, command, stdin_open, Some(confinement))) => start_confined(
            connection,
            session,
            process_id,
            command,
            stdin_open,
            confinement,
        ),
        Ok((process_id, command, stdin_open, None)) => {
            let (process, started) = command.spawn_pipelined(&connection.bridge.executor);
            let entry = Rc::new(Entry {
                process: RefCell::new(Some(process.clone())),
                stdin_open,
                exited: Cell::new(false),
                pump: RefCell::new(None),
                starting: Cell::new(false),
                cancelled: Cell::new(false),
                sandbox_denied: Cell::new(false),
            });
            session
                .processes
                .borrow_mut()
                .insert(process_id.clone(), entry.clone());
            let session = session.clone();
            later(async move {
                if let Err(error) = started.await {
                    session.processes.borrow_mut().remove(&process_id);
                    return Err(start_failure(&error));
                }
                let pump = tokio::task::spawn_local(push_events(
                    session,
                    process_id.clone(),
                    process,
                    entry.clone(),
                    false,
                ));
                *entry.pump.borrow_mut() = Some(pump.abort_handle());
                Ok(json!({"processId": process_id, "sandboxType": sandbox_type(None)}))
            })
        }
        Err(error) => now(Err(error)),
    }
}

/// A start with Codex's sandbox intent: its id reserved at once (a write
/// meanwhile is told `starting`), then planned on the executor's machine,
/// started and checked (`sandbox_intent::Confinement::start`).
fn start_confined(
    connection: &Rc<Connection>,
    session: &Rc<Session>,
    process_id: String,
    mut command: Command,
    stdin_open: bool,
    confinement: Confinement,
) -> Answer {
    let entry = Rc::new(Entry {
        process: RefCell::new(None),
        stdin_open,
        exited: Cell::new(false),
        pump: RefCell::new(None),
        starting: Cell::new(true),
        cancelled: Cell::new(false),
        sandbox_denied: Cell::new(false),
    });
    session
        .processes
        .borrow_mut()
        .insert(process_id.clone(), entry.clone());
    let executor = connection.bridge.executor.clone();
    let carving = session.carving;
    let session = session.clone();
    let tmpdir = command
        .spec()
        .env
        .set
        .iter()
        .rev()
        .find(|(name, _)| name == "TMPDIR")
        .map(|(_, value)| value.clone());
    later(async move {
        let started = confinement
            .start(&executor, &mut command, tmpdir.as_deref(), carving)
            .await;
        entry.starting.set(false);
        let process = match started {
            Ok(process) if !entry.cancelled.get() => process,
            Ok(_) => {
                // Released or terminated meanwhile: dropping it ends it.
                return Err(RpcError::invalid_request(format!(
                    "process {process_id} start was cancelled"
                )));
            }
            Err(error) => {
                let mut processes = session.processes.borrow_mut();
                if processes
                    .get(&process_id)
                    .is_some_and(|kept| Rc::ptr_eq(kept, &entry))
                {
                    processes.remove(&process_id);
                }
                return Err(match error {
                    StartError::Intent(error) => RpcError::new(error.code(), error.message()),
                    StartError::Start(error) => start_failure(&error),
                });
            }
        };
        *entry.process.borrow_mut() = Some(process.clone());
        let pump = tokio::task::spawn_local(push_events(
            session,
            process_id.clone(),
            process,
            entry.clone(),
            true,
        ));
        *entry.pump.borrow_mut() = Some(pump.abort_handle());
        Ok(json!({"processId": process_id, "sandboxType": sandbox_type(Some(&confinement))}))
    })
}

/// The command a `process/start` asks for, checked as Codex's own server
/// checks it, with its id reserved.
type Prepared = (String, Command, bool, Option<Confinement>);

/// The start `params` ask for; its confinement narrowed to `root` (the
/// bridge's `--root`).
fn prepared(
    session: &Session,
    params: Value,
    root: Option<&std::path::Path>,
) -> Result<Prepared, RpcError> {
    let start: Start = jsonrpc::params(params)?;
    let Some(program) = start.argv.first() else {
        return Err(RpcError::invalid_params("argv must not be empty"));
    };
    let cwd = uri::to_path(&start.cwd)?;
    // Codex's sandbox intent, enforced by capexec's sandbox or refused:
    // never "none" to a restricting intent.
    let confinement = confinement_for(start.sandbox.as_ref(), &cwd, start.enforce_managed_network)
        .map_err(|error| RpcError::new(error.code(), error.message()))?
        .map(|confinement| confinement.within(root));
    {
        let processes = session.processes.borrow();
        if processes.contains_key(&start.process_id) {
            return Err(RpcError::invalid_request(format!(
                "process {} already exists",
                start.process_id
            )));
        }
        if processes.len() >= PROCESSES_PER_SESSION {
            return Err(RpcError::invalid_request(format!(
                "a session holds at most {PROCESSES_PER_SESSION} processes: \
                 terminate finished ones first"
            )));
        }
    }
    let environment =
        env_policy::child_environment(&session.environment, start.env_policy.as_ref(), &start.env)
            .map_err(RpcError::invalid_params)?;
    let mut command = Command::new(program);
    command
        .args(&start.argv[1..])
        .env_clear()
        .envs(environment)
        .current_dir(cwd)
        .flow(Flow::Lossless);
    if let Some(arg0) = start.arg0 {
        command.arg0(arg0);
    }
    let stdin_open = start.tty || start.pipe_stdin;
    if start.tty {
        command.tty(TERMINAL);
    } else {
        command.stdin(if stdin_open {
            Stdin::Piped
        } else {
            Stdin::Null
        });
    }
    Ok((start.process_id, command, stdin_open, confinement))
}

fn start_failure(error: &crate::client::Error) -> RpcError {
    match error.refusal_kind() {
        Some(RefusalKind::InvalidArgument) => RpcError::invalid_params(error.to_string()),
        _ => RpcError::internal(error.to_string()),
    }
}

/// Pushes the process's events as `process/output`, `process/exited` and
/// `process/closed`, each sent only once the client's queue has room.
async fn push_events(
    session: Rc<Session>,
    process_id: String,
    process: RemoteProcess,
    entry: Rc<Entry>,
    confined: bool,
) {
    let mut events = match process.events(0).await {
        Ok(events) => events,
        Err(error) => {
            tracing::warn!(%process_id, %error, "cannot follow the process's events");
            return;
        }
    };
    drop(process);
    let mut closed = false;
    // Codex's words of denial, per stream, for `sandboxDenied`.
    let mut scans = [DenialScan::new(), DenialScan::new(), DenialScan::new()];
    let quoted_id = Value::from(process_id.as_str()).to_string();
    while let Some(event) = events.next().await {
        let Ok(event) = event else { break };
        let (method, params) = match event.body {
            EventBody::Output { stream, data } => {
                if confined {
                    scans[stream as usize].feed(&data);
                }
                let message = output_notification(&quoted_id, event.seq, stream, &data);
                if !push(&session, message).await {
                    return;
                }
                continue;
            }
            EventBody::Exited(exit) => {
                let code = exit_code(&exit.status);
                entry
                    .sandbox_denied
                    .set(confined && sandbox_denied(code, &scans));
                entry.exited.set(true);
                (
                    "process/exited",
                    json!({
                        "processId": process_id,
                        "seq": event.seq,
                        "exitCode": code,
                        "sandboxDenied": entry.sandbox_denied.get(),
                    }),
                )
            }
            EventBody::Closed => {
                closed = true;
                (
                    "process/closed",
                    json!({"processId": process_id, "seq": event.seq}),
                )
            }
            // Lossless: nothing is evicted while this pump reads.
            EventBody::Gap { .. } => continue,
        };
        if !push(&session, jsonrpc::notification(method, params)).await {
            return;
        }
    }
    drop(events);
    if closed {
        // Kept readable for a while, then the id is free again.
        tokio::time::sleep(KEPT_AFTER_CLOSE).await;
        let mut processes = session.processes.borrow_mut();
        if processes
            .get(&process_id)
            .is_some_and(|kept| Rc::ptr_eq(kept, &entry))
        {
            processes.remove(&process_id);
        }
        entry.process.borrow_mut().take();
    }
}

/// Sends `message` to the session's connection of the moment: while it
/// is detached the push waits (the process is held back, nothing is lost),
/// and a client that resumes catches up with process/read. False once the
/// session is closed.
async fn push(session: &Session, mut message: String) -> bool {
    loop {
        let Some(outbound) = session.outbound().await else {
            return false;
        };
        match outbound.send(message).await {
            Ok(()) => return true,
            Err(unsent) => message = unsent,
        }
    }
}

/// A `process/output` notification, written in one pass into one buffer:
/// the data path of the bridge (base64 needs no JSON escaping, and the id
/// was quoted once per process).
fn output_notification(quoted_id: &str, seq: u64, stream: OutputStream, data: &[u8]) -> String {
    let mut text = String::with_capacity(data.len().div_ceil(3) * 4 + quoted_id.len() + 96);
    text.push_str(r#"{"method":"process/output","params":{"processId":"#);
    text.push_str(quoted_id);
    let _ = write!(text, r#","seq":{seq},"stream":""#);
    text.push_str(stream_name(stream));
    text.push_str(r#"","chunk":""#);
    BASE64.encode_string(data, &mut text);
    text.push_str("\"}}");
    text
}

fn stream_name(stream: OutputStream) -> &'static str {
    match stream {
        OutputStream::Stdout => "stdout",
        OutputStream::Stderr => "stderr",
        OutputStream::Pty => "pty",
    }
}

/// The exit code Codex reports: the code, or 128 + the signal's number.
fn exit_code(status: &ExitStatus) -> i32 {
    status.shell_code()
}

fn entry(session: &Session, process_id: &str) -> Option<Rc<Entry>> {
    session.processes.borrow().get(process_id).cloned()
}

fn unknown_process(process_id: &str) -> RpcError {
    RpcError::invalid_request(format!("unknown process id {process_id}"))
}

pub fn read(session: &Rc<Session>, params: Value) -> Answer {
    let read: Read = match jsonrpc::params(params) {
        Ok(read) => read,
        Err(error) => return now(Err(error)),
    };
    let Some(entry) = entry(session, &read.process_id) else {
        return now(Err(unknown_process(&read.process_id)));
    };
    if entry.starting.get() {
        return now(Err(RpcError::invalid_request(format!(
            "process id {} is starting",
            read.process_id
        ))));
    }
    let Some(process) = entry.process() else {
        return now(Err(unknown_process(&read.process_id)));
    };
    later(async move {
        let wait = Duration::from_millis(read.wait_ms.unwrap_or(0)).min(LONGEST_READ_WAIT);
        let max_bytes = read
            .max_bytes
            .map(|max| u32::try_from(max).unwrap_or(u32::MAX).max(1))
            .unwrap_or(0);
        let outcome = process
            .read(read.after_seq.unwrap_or(0), max_bytes, wait)
            .await
            .map_err(|error| RpcError::internal(error.to_string()))?;
        let chunks: Vec<Value> = outcome
            .events
            .iter()
            .filter_map(|event| match &event.body {
                EventBody::Output { stream, data } => Some(json!({
                    "seq": event.seq,
                    "stream": stream_name(*stream),
                    "chunk": BASE64.encode(data),
                })),
                _ => None,
            })
            .collect();
        Ok(json!({
            "chunks": chunks,
            "nextSeq": outcome.next_seq,
            "exited": outcome.exit.is_some(),
            "exitCode": outcome.exit.as_ref().map(|exit| exit_code(&exit.status)),
            "closed": outcome.closed,
            "failure": null,
            "sandboxDenied": outcome.exit.is_some() && entry.sandbox_denied.get(),
        }))
    })
}

pub fn write(session: &Rc<Session>, params: Value) -> Answer {
    let write: Write = match jsonrpc::params(params) {
        Ok(write) => write,
        Err(error) => return now(Err(error)),
    };
    if write.write_id.is_empty() {
        return now(Err(RpcError::invalid_params("writeId must not be empty")));
    }
    let data = match BASE64.decode(write.chunk.as_bytes()) {
        Ok(data) => data,
        Err(error) => return now(Err(RpcError::invalid_params(format!("chunk: {error}")))),
    };
    let Some(entry) = entry(session, &write.process_id) else {
        return now(Ok(json!({"status": "unknownProcess"})));
    };
    if entry.starting.get() {
        return now(Ok(json!({"status": "starting"})));
    }
    if !entry.stdin_open {
        return now(Ok(json!({"status": "stdinClosed"})));
    }
    let Some(process) = entry.process() else {
        return now(Ok(json!({"status": "unknownProcess"})));
    };
    // Sent now, so writes reach stdin in the order they arrived.
    let pending = process.write_in_order(&data, &write.write_id);
    later(async move {
        let status = match pending.outcome().await {
            Ok(WriteStatus::Accepted) => "accepted",
            Ok(WriteStatus::StdinClosed) => "stdinClosed",
            Ok(WriteStatus::Starting) => "starting",
            Ok(WriteStatus::Exited) => {
                return Err(RpcError::internal("failed to write to process stdin"));
            }
            Err(error) => return Err(RpcError::internal(error.to_string())),
        };
        Ok(json!({"status": status}))
    })
}

/// Codex names `interrupt`; the bridge also takes the names of Rust's
/// ProcessSignal variants Codex may add and any POSIX name (`TERM`,
/// `SIGKILL`, `9`).
fn signal_named(name: &str) -> Result<model::Signal, RpcError> {
    let by_word = match name {
        "interrupt" => Some(model::Signal::Int),
        "terminate" => Some(model::Signal::Term),
        "kill" => Some(model::Signal::Kill),
        "hangup" => Some(model::Signal::Hup),
        "quit" => Some(model::Signal::Quit),
        _ => None,
    };
    match by_word {
        Some(signal) => Ok(signal),
        None => name
            .parse()
            .map_err(|error: String| RpcError::invalid_params(error)),
    }
}

pub fn signal(session: &Rc<Session>, params: Value) -> Answer {
    let request: Signal = match jsonrpc::params(params) {
        Ok(request) => request,
        Err(error) => return now(Err(error)),
    };
    let signal = match signal_named(&request.signal) {
        Ok(signal) => signal,
        Err(error) => return now(Err(error)),
    };
    // Unknown or ended processes: a silent success, as in Codex's server.
    let Some(entry) = entry(session, &request.process_id) else {
        return now(Ok(json!({})));
    };
    let Some(process) = entry.process().filter(|_| !entry.exited.get()) else {
        return now(Ok(json!({})));
    };
    later(async move {
        process
            .signal(signal)
            .await
            .map_err(|error| RpcError::internal(format!("failed to signal process: {error}")))?;
        Ok(json!({}))
    })
}

pub fn terminate(session: &Rc<Session>, params: Value) -> Answer {
    let request: ProcessOnly = match jsonrpc::params(params) {
        Ok(request) => request,
        Err(error) => return now(Err(error)),
    };
    let Some(entry) = entry(session, &request.process_id) else {
        return now(Ok(json!({"running": false})));
    };
    if entry.starting.get() {
        // As Codex's server: the reservation goes, the start fails.
        entry.cancelled.set(true);
        session.processes.borrow_mut().remove(&request.process_id);
        return now(Ok(json!({"running": true})));
    }
    let Some(process) = entry.process() else {
        return now(Ok(json!({"running": false})));
    };
    let exited = entry.exited.get();
    later(async move {
        // After the exit this still ends what the command left running.
        let running = process
            .terminate()
            .await
            .map_err(|error| RpcError::internal(format!("failed to terminate process: {error}")))?;
        Ok(json!({"running": running && !exited}))
    })
}

/// Not in Codex's protocol yet: a terminal's new size, honoured when sent.
pub fn resize(session: &Rc<Session>, params: Value) -> Answer {
    let request: Resize = match jsonrpc::params(params) {
        Ok(request) => request,
        Err(error) => return now(Err(error)),
    };
    let Some(process) = entry(session, &request.process_id).and_then(|entry| entry.process())
    else {
        return now(Err(unknown_process(&request.process_id)));
    };
    later(async move {
        process
            .resize(PtySize {
                rows: request.rows,
                cols: request.cols,
            })
            .await
            .map_err(|error| RpcError::invalid_params(error.to_string()))?;
        Ok(json!({}))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_notification_is_the_json_codex_reads() {
        let quoted = Value::from("p\"1").to_string();
        let text = output_notification(&quoted, 7, OutputStream::Stderr, b"\x00hi\xff");
        let parsed: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(
            parsed,
            json!({"method": "process/output", "params": {
                "processId": "p\"1", "seq": 7, "stream": "stderr",
                "chunk": BASE64.encode(b"\x00hi\xff"),
            }})
        );
    }
}
