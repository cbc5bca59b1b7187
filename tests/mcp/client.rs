//! A minimal MCP client over a `capexec mcp` child's stdio, and the
//! backends it is run against.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Instant;

use serde_json::{Value, json};

use crate::common::cli::{BIN, Served};
use crate::common::{TEST_DEADLINE, eventually};

/// Where the processes run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `capexec mcp`: the embedded executor, its processes its children.
    Embedded,
    /// `capexec mcp --connect unix:PATH` to a `capexec serve`.
    Unix,
}

/// A `capexec mcp` child, initialized.
pub struct Mcp {
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    next_id: u64,
    /// Notifications received while waiting for answers, in order.
    pub notifications: Vec<Value>,
    /// Each tool's output schema, from tools/list.
    output_schemas: std::collections::HashMap<String, Value>,
    /// What it wrote to stderr so far.
    stderr: Arc<Mutex<Vec<u8>>>,
    /// Whether its stderr has ended (every byte is in `stderr`).
    stderr_ended: Arc<std::sync::atomic::AtomicBool>,
    /// The server, for the Unix backend: dropped after the child.
    served: Option<Served>,
}

impl Mcp {
    /// Starts `capexec mcp --root ROOT EXTRA...` on `backend` and
    /// initializes the session.
    pub fn start(backend: Backend, root: &Path, extra: &[&str]) -> Mcp {
        let served = (backend == Backend::Unix).then(Served::start);
        let mut command = Command::new(BIN);
        command.arg("mcp").arg("--root").arg(root).args(extra);
        if let Some(served) = &served {
            command
                .args(["--connect", &served.unix])
                .env("HOME", served.home.path());
        }
        command
            .env_remove("CAPEXEC_CONNECT")
            .env_remove("XDG_CONFIG_HOME")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("start capexec mcp");
        let stdout = child.stdout.take().expect("stdout");
        let mut stderr_pipe = child.stderr.take().expect("stderr");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let collected = stderr.clone();
        let stderr_ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ended = stderr_ended.clone();
        std::thread::spawn(move || {
            let mut buffer = [0; 4096];
            while let Ok(n @ 1..) = stderr_pipe.read(&mut buffer) {
                collected
                    .lock()
                    .expect("stderr")
                    .extend_from_slice(&buffer[..n]);
            }
            ended.store(true, std::sync::atomic::Ordering::Release);
        });
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        let mut mcp = Mcp {
            child,
            stdin,
            lines,
            next_id: 0,
            notifications: Vec::new(),
            stderr,
            stderr_ended,
            served,
            output_schemas: std::collections::HashMap::new(),
        };
        let answer = mcp.request(
            "initialize",
            json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "capexec-tests", "version": "1"},
            }),
        );
        assert_eq!(
            answer["result"]["serverInfo"]["name"], "capexec",
            "{answer}"
        );
        mcp.send_line(
            &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string(),
        );
        let tools = mcp.request("tools/list", json!({}));
        for tool in tools["result"]["tools"].as_array().expect("tools") {
            let name = tool["name"].as_str().expect("name").to_string();
            mcp.output_schemas
                .insert(name, tool["outputSchema"].clone());
        }
        mcp
    }

    pub fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin is open");
        stdin
            .write_all(line.as_bytes())
            .expect("write to capexec mcp");
        stdin.write_all(b"\n").expect("write to capexec mcp");
        stdin.flush().expect("flush");
    }

    /// Sends a request and returns its id, without waiting.
    pub fn send_request(&mut self, method: &str, params: Value) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.send_line(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string(),
        );
        id
    }

    /// The next message from the server, within the test deadline.
    pub fn next_message(&mut self) -> Value {
        let line = match self.lines.recv_timeout(TEST_DEADLINE) {
            Ok(line) => line,
            Err(error) => panic!(
                "no message from capexec mcp ({error}); its stderr: {}",
                self.stderr_text()
            ),
        };
        serde_json::from_str(&line).unwrap_or_else(|error| panic!("not JSON ({error}): {line}"))
    }

    /// The answer to request `id`; notifications meanwhile are kept.
    pub fn answer(&mut self, id: u64) -> Value {
        loop {
            let message = self.next_message();
            if message.get("id") == Some(&json!(id)) {
                return message;
            }
            assert!(
                message.get("id").is_none(),
                "an answer to another request: {message}"
            );
            self.notifications.push(message);
        }
    }

    pub fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.send_request(method, params);
        self.answer(id)
    }

    /// `tools/call`'s whole answer.
    pub fn call_raw(&mut self, tool: &str, arguments: Value) -> Value {
        self.request("tools/call", json!({"name": tool, "arguments": arguments}))
    }

    /// A successful tool call's structured result, checked against its
    /// text block.
    pub fn call(&mut self, tool: &str, arguments: Value) -> Value {
        let answer = self.call_raw(tool, arguments.clone());
        let result = &answer["result"];
        assert_eq!(
            result["isError"], false,
            "{tool} {arguments} failed: {answer}"
        );
        let structured = result["structuredContent"].clone();
        let text: Value =
            serde_json::from_str(result["content"][0]["text"].as_str().expect("a text block"))
                .expect("the text block is JSON");
        assert_eq!(
            text, structured,
            "the text block says what structuredContent says"
        );
        let schema = &self.output_schemas[tool];
        if let Some(why) = crate::schema::mismatch(schema, schema, &structured, tool) {
            panic!("{tool}'s result does not match its outputSchema: {why}");
        }
        structured
    }

    /// A failed tool call's text.
    pub fn call_error(&mut self, tool: &str, arguments: Value) -> String {
        let answer = self.call_raw(tool, arguments.clone());
        assert_eq!(
            answer["result"]["isError"], true,
            "{tool} {arguments} should fail: {answer}"
        );
        answer["result"]["content"][0]["text"]
            .as_str()
            .expect("a text block")
            .to_string()
    }

    /// Reads process `id`'s output from seq 0 until it closed: stdout,
    /// stderr and the final answer.
    pub fn read_to_end(&mut self, id: &str) -> (Vec<u8>, Vec<u8>, Value) {
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let mut after = 0;
        let deadline = Instant::now() + TEST_DEADLINE;
        loop {
            let answer = self.call(
                "process_output",
                json!({"process_id": id, "after_seq": after, "wait_ms": 5000}),
            );
            assert_eq!(answer["gaps"], json!([]), "{answer}");
            stdout.extend(bytes(&answer["stdout"]));
            stderr.extend(bytes(&answer["stderr"]));
            after = answer["next_seq"].as_u64().expect("next_seq");
            if answer["closed"] == true {
                return (stdout, stderr, answer);
            }
            assert!(Instant::now() < deadline, "{id} did not close: {answer}");
        }
    }

    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().expect("stderr")).into_owned()
    }

    /// The `capexec serve` of the Unix backend.
    pub fn served(&self) -> Option<&Served> {
        self.served.as_ref()
    }

    /// Kills the `capexec serve` of the Unix backend.
    pub fn kill_server(&mut self) {
        let served = self.served.as_mut().expect("a server");
        served.child.kill().expect("kill capexec serve");
        served.child.wait().expect("wait for capexec serve");
    }

    /// Closes stdin (the session ends) and waits for capexec's exit code.
    pub fn finish(&mut self) -> i32 {
        self.stdin.take();
        self.wait()
    }

    /// Waits for capexec's exit code, and for the last of its stderr to
    /// be collected (the reader thread may be behind the exit).
    pub fn wait(&mut self) -> i32 {
        let status = eventually("capexec mcp ends", || self.child.try_wait().expect("wait"));
        eventually("capexec mcp's stderr to end", || {
            self.stderr_ended.load(std::sync::atomic::Ordering::Acquire)
        });
        status.code().unwrap_or(-1)
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The bytes of a `StreamText` that was not cut.
pub fn bytes(stream: &Value) -> Vec<u8> {
    use base64::Engine as _;
    assert_eq!(stream["cut_bytes"], 0, "{stream}");
    let text = stream["text"].as_str().expect("text");
    match stream["encoding"].as_str() {
        Some("utf-8") => text.as_bytes().to_vec(),
        Some("base64") => base64::engine::general_purpose::STANDARD
            .decode(text)
            .expect("base64"),
        other => panic!("encoding {other:?}"),
    }
}

/// Whether process `pid` (of this machine) is gone.
pub fn gone(pid: i32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks.
    let alive = unsafe { libc::kill(pid, 0) } == 0;
    if !alive {
        return true;
    }
    // A zombie is gone for every purpose here.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            stat.rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

/// The pid a command wrote to `file`, once it is there.
pub fn pid_in(file: &Path) -> i32 {
    eventually(&format!("{} holds a pid", file.display()), || {
        std::fs::read_to_string(file)
            .ok()
            .and_then(|text| text.trim().parse().ok())
    })
}
