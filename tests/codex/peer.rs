//! A client of Codex's exec-server protocol over stdio, for the
//! differential tests: the same requests go to `capexec codex-bridge` and
//! to the pinned `codex exec-server --listen stdio`.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

use crate::common::cli::BIN;

/// Far above what any answer takes on a loaded machine.
const DEADLINE: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Bridge,
    Codex,
}

/// An error answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub code: i64,
    pub message: String,
}

/// What a process's pushed notifications said.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pushed {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub pty: Vec<u8>,
    pub exit_code: Option<i64>,
    pub sandbox_denied: Option<bool>,
    /// The kinds in arrival order ("output", "exited", "closed").
    pub order: Vec<&'static str>,
    pub seqs: Vec<u64>,
}

pub struct Peer {
    pub kind: Kind,
    child: Child,
    stdin: Option<ChildStdin>,
    messages: Receiver<Value>,
    notifications: VecDeque<Value>,
    next_id: i64,
}

impl Peer {
    pub fn start(kind: Kind, codex: &Path, cwd: &Path) -> Peer {
        Peer::start_with(kind, codex, cwd, |_| {})
    }

    /// [`Peer::start`], with the command adjusted first (its environment).
    pub fn start_with(
        kind: Kind,
        codex: &Path,
        cwd: &Path,
        adjust: impl FnOnce(&mut Command),
    ) -> Peer {
        let mut command = match kind {
            Kind::Bridge => {
                let mut command = Command::new(BIN);
                command.arg("codex-bridge");
                command
            }
            Kind::Codex => {
                let mut command = Command::new(codex);
                command.args(["exec-server", "--listen", "stdio"]);
                // Codex keeps its state under CODEX_HOME: one of its own.
                command.env("CODEX_HOME", cwd.join(".codex-home"));
                let _ = std::fs::create_dir_all(cwd.join(".codex-home"));
                command
            }
        };
        command.current_dir(cwd);
        adjust(&mut command);
        Peer::spawn(kind, command)
    }

    pub fn spawn(kind: Kind, mut command: Command) -> Peer {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("start {kind:?}: {error}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let (sender, messages) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let value: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|error| panic!("not JSON ({error}): {line}"));
                if sender.send(value).is_err() {
                    break;
                }
            }
        });
        Peer {
            kind,
            stdin: child.stdin.take(),
            child,
            messages,
            notifications: VecDeque::new(),
            next_id: 1,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(bytes).expect("write to the peer");
        stdin.flush().expect("flush to the peer");
    }

    pub fn notify(&mut self, method: &str, params: Value) {
        let line = format!("{}\n", json!({"method": method, "params": params}));
        self.send_raw(line.as_bytes());
    }

    /// Sends a request and returns its id, without waiting.
    pub fn send(&mut self, method: &str, params: Value) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        let line = format!(
            "{}\n",
            json!({"id": id, "method": method, "params": params})
        );
        self.send_raw(line.as_bytes());
        id
    }

    /// The next message, within the deadline.
    fn receive(&mut self, what: &str) -> Value {
        match self.messages.recv_timeout(DEADLINE) {
            Ok(message) => message,
            Err(RecvTimeoutError::Timeout) => {
                panic!("{:?}: no {what} within {DEADLINE:?}", self.kind)
            }
            Err(RecvTimeoutError::Disconnected) => panic!("{:?} ended before {what}", self.kind),
        }
    }

    /// The answer to request `id`; notifications met on the way are kept.
    pub fn answer(&mut self, id: impl Into<Value>) -> Result<Value, Failure> {
        let id = id.into();
        loop {
            let mut message = self.receive(&format!("answer to {id}"));
            if message.get("id") == Some(&id) {
                if let Some(error) = message.get("error") {
                    return Err(Failure {
                        code: error["code"].as_i64().expect("an error code"),
                        message: error["message"].as_str().unwrap_or_default().to_string(),
                    });
                }
                return Ok(message["result"].take());
            }
            assert!(
                message.get("method").is_some(),
                "{:?}: unexpected {message}",
                self.kind
            );
            self.notifications.push_back(message);
        }
    }

    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, Failure> {
        let id = self.send(method, params);
        self.answer(id)
    }

    pub fn initialize(&mut self) -> Value {
        let result = self
            .call("initialize", json!({"clientName": "capexec-tests"}))
            .unwrap_or_else(|error| panic!("{:?}: initialize: {error:?}", self.kind));
        self.notify("initialized", json!({}));
        result
    }

    /// The next notification, within the deadline.
    pub fn notification(&mut self) -> Value {
        if let Some(kept) = self.notifications.pop_front() {
            return kept;
        }
        let message = self.receive("notification");
        assert!(
            message.get("id").is_none(),
            "{:?}: unexpected answer {message}",
            self.kind
        );
        message
    }

    /// Every notification of `process_id` until its `process/closed`
    /// (others are kept for later).
    pub fn pushed_until_closed(&mut self, process_id: &str) -> Pushed {
        let mut pushed = Pushed::default();
        let mut others = VecDeque::new();
        loop {
            let message = self.notification();
            let params = &message["params"];
            if params["processId"] != process_id {
                others.push_back(message);
                continue;
            }
            pushed.seqs.push(params["seq"].as_u64().expect("a seq"));
            match message["method"].as_str() {
                Some("process/output") => {
                    pushed.order.push("output");
                    let chunk = BASE64
                        .decode(params["chunk"].as_str().expect("a chunk"))
                        .expect("base64");
                    match params["stream"].as_str() {
                        Some("stdout") => pushed.stdout.extend(chunk),
                        Some("stderr") => pushed.stderr.extend(chunk),
                        Some("pty") => pushed.pty.extend(chunk),
                        other => panic!("stream {other:?}"),
                    }
                }
                Some("process/exited") => {
                    pushed.order.push("exited");
                    pushed.exit_code = params["exitCode"].as_i64();
                    pushed.sandbox_denied = params["sandboxDenied"].as_bool();
                }
                Some("process/closed") => {
                    pushed.order.push("closed");
                    self.notifications.extend(others);
                    return pushed;
                }
                other => panic!("{:?}: notification {other:?}", self.kind),
            }
        }
    }

    /// Output of `process_id` pushed so far, until `needle` is in it.
    pub fn wait_for_output(&mut self, process_id: &str, needle: &str) {
        let started = Instant::now();
        let mut seen = Vec::new();
        let mut others = VecDeque::new();
        while !String::from_utf8_lossy(&seen).contains(needle) {
            assert!(
                started.elapsed() < DEADLINE,
                "{:?}: no {needle:?} in {seen:?}",
                self.kind
            );
            let message = self.notification();
            if message["params"]["processId"] == process_id && message["method"] == "process/output"
            {
                seen.extend(
                    BASE64
                        .decode(message["params"]["chunk"].as_str().expect("a chunk"))
                        .expect("base64"),
                );
            } else {
                others.push_back(message);
            }
        }
        self.notifications.extend(others);
    }

    /// Closes the peer's stdin and waits for it to exit.
    pub fn close(mut self) -> std::process::ExitStatus {
        self.stdin.take();
        self.exit()
    }

    /// Waits for the peer to exit on its own (stdin still open).
    pub fn exit(&mut self) -> std::process::ExitStatus {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for the peer") {
                return status;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "{:?} did not exit after stdin closed",
                self.kind
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn file_uri(path: &Path) -> String {
    format!("file://{}", path.display())
}
