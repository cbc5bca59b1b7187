//! The Codex bridge next to Codex's own exec-server, in one run: both are
//! child processes speaking Codex's exec-server protocol on stdio (one
//! JSON message a line), `capexec codex-bridge` with its embedded executor
//! and `codex exec-server --listen stdio` of the pinned version
//! (`scripts/install-codex.sh`), driven alike: start to `process/closed` of
//! `true`, bulk output through the pushed `process/output` notifications
//! (every byte counted: what arrives is what counts), and each server's
//! memory once its consumer has stopped reading for a while.

use std::error::Error;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::Plan;
use crate::report::{Report, Target};
use crate::servers::CAPEXEC;

const SECTION: &str = "codex";
/// Runs of `true` per peer, at most: within the bridge's 1024 processes
/// a session holds (with the other cases' few).
const MAX_RUNS: usize = 800;
const MAX_WARMUP: usize = 50;
/// How long the consumer stops reading in the memory case.
const STALL: Duration = Duration::from_secs(3);

/// The pinned Codex binary, as the tests find it.
fn codex_binary() -> Result<String, Box<dyn Error>> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install-codex.sh");
    let output = std::process::Command::new(script).output()?;
    if !output.status.success() {
        return Err(format!(
            "scripts/install-codex.sh failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    Ok(String::from_utf8(output.stdout)?.trim().to_string())
}

/// One exec-server peer on stdio.
struct Peer {
    name: &'static str,
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    line: String,
    next_id: u64,
}

impl Peer {
    async fn start(
        name: &'static str,
        program: &str,
        args: &[&str],
        home: &std::path::Path,
    ) -> Result<Peer, Box<dyn Error>> {
        let mut child = Command::new(program)
            .args(args)
            .env("CODEX_HOME", home)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = BufReader::with_capacity(1 << 20, child.stdout.take().ok_or("no stdout")?);
        let mut peer = Peer {
            name,
            child,
            stdin,
            stdout,
            line: String::new(),
            next_id: 1,
        };
        peer.call("initialize", json!({"clientName": "capexec-bench"}))
            .await?;
        peer.send(&json!({"method": "initialized", "params": {}}))
            .await?;
        Ok(peer)
    }

    fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }

    async fn send(&mut self, message: &Value) -> Result<(), Box<dyn Error>> {
        let mut text = serde_json::to_vec(message)?;
        text.push(b'\n');
        self.stdin.write_all(&text).await?;
        self.stdin.flush().await?;
        Ok(())
    }

    /// The next message.
    async fn next(&mut self) -> Result<Value, Box<dyn Error>> {
        self.line.clear();
        if self.stdout.read_line(&mut self.line).await? == 0 {
            return Err(format!("{} closed its stdout", self.name).into());
        }
        Ok(serde_json::from_str(&self.line)?)
    }

    /// Sends a request and returns its id.
    async fn request(&mut self, method: &str, params: Value) -> Result<u64, Box<dyn Error>> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"id": id, "method": method, "params": params}))
            .await?;
        Ok(id)
    }

    /// A request's result, notifications before it ignored.
    async fn call(&mut self, method: &str, params: Value) -> Result<Value, Box<dyn Error>> {
        let id = self.request(method, params).await?;
        loop {
            let message = self.next().await?;
            if message["id"] == id {
                return answer(self.name, method, message);
            }
        }
    }

    /// Starts `argv` as `process_id` and reads until its `process/closed`:
    /// the output bytes its notifications carried.
    async fn run(&mut self, process_id: &str, argv: &[&str]) -> Result<u64, Box<dyn Error>> {
        let cwd = std::env::current_dir()?;
        let id = self
            .request(
                "process/start",
                json!({
                    "processId": process_id,
                    "argv": argv,
                    "cwd": format!("file://{}", cwd.display()),
                    "env": {"PATH": "/usr/bin:/bin"},
                    "tty": false,
                    "pipeStdin": false,
                }),
            )
            .await?;
        let mut bytes = 0;
        loop {
            let message = self.next().await?;
            if message["id"] == id {
                answer(self.name, "process/start", message)?;
                continue;
            }
            let params = &message["params"];
            if params["processId"] != process_id {
                continue;
            }
            match message["method"].as_str() {
                Some("process/output") => bytes += base64_len(params["chunk"].as_str()),
                Some("process/closed") => return Ok(bytes),
                _ => {}
            }
        }
    }
}

fn answer(name: &str, method: &str, message: Value) -> Result<Value, Box<dyn Error>> {
    match message.get("result") {
        Some(result) => Ok(result.clone()),
        None => Err(format!("{name}: {method} failed: {}", message["error"]).into()),
    }
}

/// The bytes a standard base64 text decodes to.
fn base64_len(text: Option<&str>) -> u64 {
    let Some(text) = text else { return 0 };
    let padding = text.bytes().rev().take_while(|&b| b == b'=').count();
    (text.len() / 4 * 3).saturating_sub(padding) as u64
}

/// Resident memory of `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    crate::procfs::status_field(pid, "VmRSS:").unwrap_or(0) * 1024
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

pub async fn run(plan: &Plan, report: &mut Report) -> Result<(), Box<dyn Error>> {
    let codex = codex_binary()?;
    // Codex's state directory, removed when the section ends.
    let home = tempfile::tempdir()?;
    let mut peers = [
        Peer::start(
            "codex exec-server",
            &codex,
            &["exec-server", "--listen", "stdio"],
            home.path(),
        )
        .await?,
        Peer::start(
            "capexec codex-bridge",
            CAPEXEC,
            &["codex-bridge"],
            home.path(),
        )
        .await?,
    ];

    // Start to closed of `true`, alternating peers run by run; each then
    // terminated, as Codex does after every command. A session of the
    // bridge holds at most 1024 processes, ended ones kept 30 s.
    let runs = plan.latency_runs.min(MAX_RUNS);
    let warmup = plan.warmup_runs.min(MAX_WARMUP);
    eprintln!("codex: {runs} runs of `true` per peer");
    let mut samples = [Vec::with_capacity(runs), Vec::with_capacity(runs)];
    for run in 0..warmup + runs {
        for (index, peer) in peers.iter_mut().enumerate() {
            let process_id = format!("true-{run}");
            let started = Instant::now();
            peer.run(&process_id, &["true"]).await?;
            if run >= warmup {
                samples[index].push(started.elapsed());
            }
            peer.call("process/terminate", json!({"processId": process_id}))
                .await?;
        }
    }
    let [codex_true, bridge_true] = samples;
    let baseline = report.baseline(
        SECTION,
        "codex exec-server: `true` start to closed",
        codex_true,
        None,
    );
    report.case(
        SECTION,
        "codex-bridge: `true` start to closed",
        bridge_true,
        baseline,
        None,
        Some(Target::AtMost(1.0 / 3.0)),
        "",
    );

    // Bulk output through the pushed notifications, every byte counted.
    let size = plan.output_bytes;
    let size_text = size.to_string();
    eprintln!(
        "codex: {} of output per peer, {} rounds",
        mib(size),
        plan.output_rounds
    );
    let mut times = [Vec::new(), Vec::new()];
    let mut delivered = [u64::MAX, u64::MAX];
    for round in 0..plan.output_rounds {
        for (index, peer) in peers.iter_mut().enumerate() {
            let started = Instant::now();
            let bytes = peer
                .run(
                    &format!("bulk-{round}"),
                    &["head", "-c", &size_text, "/dev/zero"],
                )
                .await?;
            times[index].push(started.elapsed());
            delivered[index] = delivered[index].min(bytes);
        }
    }
    let [codex_bulk, bridge_bulk] = times;
    let baseline = report.baseline(
        SECTION,
        format!("codex exec-server: {} pushed", mib(size)),
        codex_bulk,
        Some(size),
    );
    report.case(
        SECTION,
        format!("codex-bridge: {} pushed", mib(size)),
        bridge_bulk,
        baseline,
        Some(size),
        Some(Target::AtLeastShare(2.0)),
        "",
    );
    for (peer, bytes) in peers.iter().zip(delivered) {
        report.figure(
            SECTION,
            format!(
                "{}: bytes delivered of {size} (fewest of the rounds)",
                peer.name
            ),
            bytes.to_string(),
            (peer.name == "capexec codex-bridge")
                .then(|| ("every byte".to_string(), bytes == size)),
        );
    }

    // A consumer that stops reading: the server's peak memory.
    for peer in &mut peers {
        let process_id = "stalled";
        peer.request(
            "process/start",
            json!({
                "processId": process_id,
                "argv": ["head", "-c", &size_text, "/dev/zero"],
                "cwd": format!("file://{}", std::env::current_dir()?.display()),
                "env": {"PATH": "/usr/bin:/bin"},
                "tty": false,
                "pipeStdin": false,
            }),
        )
        .await?;
        tokio::time::sleep(STALL).await;
        let stalled = rss(peer.pid());
        let mut bytes = 0;
        loop {
            let message = peer.next().await?;
            let params = &message["params"];
            if params["processId"] != process_id {
                continue;
            }
            match message["method"].as_str() {
                Some("process/output") => bytes += base64_len(params["chunk"].as_str()),
                Some("process/closed") => break,
                _ => {}
            }
        }
        let bounded = stalled < 64 << 20;
        report.figure(
            SECTION,
            format!(
                "{}: memory after its consumer stopped reading {} s (then {} of {} delivered)",
                peer.name,
                STALL.as_secs(),
                mib(bytes),
                mib(size)
            ),
            mib(stalled),
            (peer.name == "capexec codex-bridge").then(|| ("< 64 MiB".to_string(), bounded)),
        );
    }
    Ok(())
}
