//! Sessions that outlive their connection: a client that reconnects with
//! `initialize{resumeSessionId}` finds its processes running, with every
//! byte of their output (pushes wait while no connection is attached),
//! as Codex's websocket environments reconnect.

use std::io;
use std::rc::Rc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use capexec::codex::{Bridge, serve_connection};
use capexec::engine::Engine;
use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};

use crate::common::run_on_runtime;

const DEADLINE: Duration = Duration::from_secs(60);

/// A client connection to a bridge in this process.
struct Client {
    to_bridge: mpsc::UnboundedSender<io::Result<String>>,
    from_bridge: mpsc::Receiver<String>,
    next_id: i64,
    kept: Vec<Value>,
}

impl Client {
    fn connect(bridge: &Rc<Bridge>) -> Client {
        let (to_bridge, inbound) = mpsc::unbounded();
        let (outbound, from_bridge) = mpsc::channel(1);
        let outbound = outbound.sink_map_err(io::Error::other);
        tokio::task::spawn_local(serve_connection(
            bridge.clone(),
            inbound,
            Box::pin(outbound),
        ));
        Client {
            to_bridge,
            from_bridge,
            next_id: 1,
            kept: Vec::new(),
        }
    }

    async fn receive(&mut self) -> Value {
        let text = tokio::time::timeout(DEADLINE, self.from_bridge.next())
            .await
            .expect("a message within the deadline")
            .expect("the bridge still talks");
        serde_json::from_str(&text).expect("JSON")
    }

    async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let line = json!({"id": id, "method": method, "params": params}).to_string();
        self.to_bridge
            .unbounded_send(Ok(line))
            .expect("the bridge reads");
        loop {
            let message = self.receive().await;
            if message["id"] == id {
                return message;
            }
            self.kept.push(message);
        }
    }

    /// Pushed output of `process` until `needle` is in it.
    async fn output_until(&mut self, process: &str, needle: &str) -> String {
        let mut seen = String::new();
        let mut kept = std::mem::take(&mut self.kept).into_iter();
        while !seen.contains(needle) {
            let message = match kept.next() {
                Some(message) => message,
                None => self.receive().await,
            };
            if message["method"] == "process/output" && message["params"]["processId"] == process {
                let chunk = BASE64
                    .decode(message["params"]["chunk"].as_str().expect("chunk"))
                    .expect("base64");
                seen.push_str(&String::from_utf8_lossy(&chunk));
            }
        }
        seen
    }
}

fn start(cwd: &std::path::Path, id: &str, script: &str) -> Value {
    json!({
        "processId": id, "argv": ["sh", "-c", script], "cwd": format!("file://{}", cwd.display()),
        "env": {"PATH": "/usr/bin:/bin"}, "tty": false, "pipeStdin": true,
    })
}

#[test]
fn a_resumed_session_finds_its_processes_running_with_their_output() {
    run_on_runtime(async {
        let bridge = Bridge::new(
            capexec::rpc::local_executor(Engine::default()),
            None,
            Duration::from_secs(600),
        );
        let cwd = std::env::temp_dir();
        let mut first = Client::connect(&bridge);
        let session =
            first.call("initialize", json!({"clientName": "t"})).await["result"]["sessionId"]
                .as_str()
                .expect("a session id")
                .to_string();
        let started = first
            .call(
                "process/start",
                start(
                    &cwd,
                    "p",
                    "echo one; read line; echo \"got $line\"; seq 1 20000",
                ),
            )
            .await;
        assert!(started.get("result").is_some(), "{started}");
        first.output_until("p", "one").await;
        // The client goes away without a word (a dropped websocket).
        drop(first);

        let mut second = Client::connect(&bridge);
        let unknown = second
            .call(
                "initialize",
                json!({"clientName": "t", "resumeSessionId": "nope"}),
            )
            .await;
        assert_eq!(unknown["error"]["code"], -32600, "{unknown}");
        let resumed = second
            .call(
                "initialize",
                json!({"clientName": "t", "resumeSessionId": session}),
            )
            .await;
        assert_eq!(resumed["result"]["sessionId"], session, "{resumed}");
        // While it is attached, nobody else can take it.
        let mut third = Client::connect(&bridge);
        let taken = third
            .call(
                "initialize",
                json!({"clientName": "t", "resumeSessionId": session}),
            )
            .await;
        assert_eq!(taken["error"]["code"], -32010, "{taken}");

        let written = second
            .call(
                "process/write",
                json!({"processId": "p", "chunk": BASE64.encode("two\n"), "writeId": "w1"}),
            )
            .await;
        assert_eq!(written["result"]["status"], "accepted", "{written}");
        second.output_until("p", "20000\n").await;
        // Nothing was lost meanwhile: the retained log has it all.
        let read = second
            .call(
                "process/read",
                json!({"processId": "p", "afterSeq": 0, "waitMs": 10000}),
            )
            .await;
        let mut all = String::new();
        for chunk in read["result"]["chunks"].as_array().expect("chunks") {
            all.push_str(&String::from_utf8_lossy(
                &BASE64
                    .decode(chunk["chunk"].as_str().expect("chunk"))
                    .expect("base64"),
            ));
        }
        let mut expected = String::from("one\ngot two\n");
        for n in 1..=20000 {
            expected.push_str(&format!("{n}\n"));
        }
        assert_eq!(all, expected);
    });
}

#[test]
fn a_session_nobody_resumes_ends_with_its_processes() {
    run_on_runtime(async {
        let bridge = Bridge::new(
            capexec::rpc::local_executor(Engine::default()),
            None,
            Duration::from_millis(200),
        );
        let pid_file = crate::common::data::TempDir::new("codex-resume-expiry");
        let pid_path = pid_file.path().join("pid");
        let mut client = Client::connect(&bridge);
        client.call("initialize", json!({"clientName": "t"})).await;
        let script = format!(
            "echo $$ > {}; echo ready; exec sleep 1000",
            pid_path.display()
        );
        client
            .call("process/start", start(pid_file.path(), "p", &script))
            .await;
        client.output_until("p", "ready").await;
        let pid: i32 = std::fs::read_to_string(&pid_path)
            .expect("pid")
            .trim()
            .parse()
            .expect("pid");
        drop(client);
        crate::common::eventually_async(
            "the session and its process end after the keep time",
            async || {
                bridge.sessions() == 0 && !std::path::Path::new(&format!("/proc/{pid}")).exists()
            },
        )
        .await;
    });
}

#[test]
fn without_a_keep_time_a_session_ends_with_its_connection() {
    run_on_runtime(async {
        let bridge = Bridge::new(
            capexec::rpc::local_executor(Engine::default()),
            None,
            Duration::ZERO,
        );
        let mut client = Client::connect(&bridge);
        let session =
            client.call("initialize", json!({"clientName": "t"})).await["result"]["sessionId"]
                .clone();
        drop(client);
        crate::common::eventually_async("the session ends with its connection", async || {
            bridge.sessions() == 0
        })
        .await;
        let mut again = Client::connect(&bridge);
        let refused = again
            .call(
                "initialize",
                json!({"clientName": "t", "resumeSessionId": session}),
            )
            .await;
        assert_eq!(refused["error"]["code"], -32600, "{refused}");
    });
}
