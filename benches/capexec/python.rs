//! What the Python package costs next to the Rust client, both in-process
//! clients of the same Unix-socket server in one run: `true` from start to
//! exit (`Executor.run`), and lossless output of `head -c N /dev/zero`
//! read to `closed` through a subscription (`Process.events()`).
//!
//! The Python side is `python/benchmarks/client_cost.py`, one long-lived
//! interpreter driven line by line, so its start-up is not counted. It
//! needs a Python with the package installed: `$CAPEXEC_PYTHON`, else the
//! virtual environment `.ci/run` makes (`target/py-venv/bin/python`).

use std::error::Error;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::time::{Duration, Instant};

use capexec::client::Command;
use capexec::model::{EventBody, Flow};

use crate::Plan;
use crate::report::Report;
use crate::servers::Servers;

const SECTION: &str = "python";
/// Runs of `true` per batch: each client runs a batch in turn, so noise
/// lands on both.
const BATCH: usize = 50;

pub async fn run(
    plan: &Plan,
    servers: &Servers,
    report: &mut Report,
) -> Result<(), Box<dyn Error>> {
    let (rust, _connection) = servers.unix.connect().await?;
    let mut python = PythonClient::start(&servers.unix.address.to_string())?;
    let batches = plan.latency_runs.div_ceil(BATCH);
    let warmup_batches = plan.warmup_runs.div_ceil(BATCH);
    eprintln!("python: {} runs of `true` per client", batches * BATCH);
    let (mut rust_true, mut python_true) = (Vec::new(), Vec::new());
    let command = Command::new("true");
    for batch in 0..warmup_batches + batches {
        let keep = batch >= warmup_batches;
        for _ in 0..BATCH {
            let started = Instant::now();
            let status = command.status(&rust).await?;
            let elapsed = started.elapsed();
            if !status.success() {
                return Err(format!("`true` through the Rust client: {status:?}").into());
            }
            if keep {
                rust_true.push(elapsed);
            }
        }
        let samples = python.ask(&format!("latency {BATCH}"))?;
        if keep {
            python_true.extend(samples);
        }
    }
    let baseline = report.baseline(
        SECTION,
        "Rust client: `true` start to exit",
        rust_true,
        None,
    );
    report.case(
        SECTION,
        "Python client: `true` start to exit",
        python_true,
        baseline,
        None,
        None,
        "",
    );

    let size = plan.output_bytes;
    eprintln!(
        "python: {} MiB of output, {} round(s)",
        size >> 20,
        plan.output_rounds
    );
    let (mut rust_output, mut python_output) = (Vec::new(), Vec::new());
    for _ in 0..plan.output_rounds {
        rust_output.push(rust_lossless(&rust, size).await?);
        python_output.extend(python.ask(&format!("output {size}"))?);
    }
    let baseline = report.baseline(
        SECTION,
        "Rust client: lossless output, subscribed",
        rust_output,
        Some(size),
    );
    report.case(
        SECTION,
        "Python client: lossless output, events()",
        python_output,
        baseline,
        Some(size),
        None,
        "",
    );
    Ok(())
}

async fn rust_lossless(
    executor: &capexec::capexec_capnp::executor::Client,
    size: u64,
) -> Result<Duration, Box<dyn Error>> {
    let mut command = Command::new("head");
    command
        .args(["-c", &size.to_string(), "/dev/zero"])
        .flow(Flow::Lossless);
    let started = Instant::now();
    let (process, spawned) = command.spawn_pipelined(executor);
    let mut events = process.events(0).await?;
    let mut received = 0u64;
    while let Some(batch) = events.next_batch().await {
        for event in batch? {
            match event.body {
                EventBody::Output { data, .. } => received += data.len() as u64,
                EventBody::Closed => {
                    spawned.await?;
                    let elapsed = started.elapsed();
                    if received != size {
                        return Err(format!("Rust client: {received} of {size} bytes").into());
                    }
                    return Ok(elapsed);
                }
                _ => {}
            }
        }
    }
    Err("Rust client: the event stream ended before `closed`".into())
}

/// The Python with the capexec package this section runs: `$CAPEXEC_PYTHON`,
/// else `target/py-venv/bin/python`; an error saying how to make one.
pub fn interpreter() -> Result<PathBuf, Box<dyn Error>> {
    let python = match std::env::var_os("CAPEXEC_PYTHON") {
        Some(python) => PathBuf::from(python),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/py-venv/bin/python"),
    };
    if !python.exists() {
        return Err(format!(
            "python: no Python with the capexec package at {}: set CAPEXEC_PYTHON, or make it \
             with `python3 -m venv target/py-venv && target/py-venv/bin/pip install ./python`",
            python.display()
        )
        .into());
    }
    Ok(python)
}

/// The Python benchmark process, asked one line at a time.
struct PythonClient {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl PythonClient {
    fn start(address: &str) -> Result<PythonClient, Box<dyn Error>> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let python = interpreter()?;
        let mut child = std::process::Command::new(&python)
            .arg(root.join("python/benchmarks/client_cost.py"))
            .arg(address)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|error| format!("python: cannot run {}: {error}", python.display()))?;
        let input = child.stdin.take().ok_or("python: no stdin")?;
        let output = BufReader::new(child.stdout.take().ok_or("python: no stdout")?);
        Ok(PythonClient {
            child,
            input,
            output,
        })
    }

    /// Sends `request`; the answer is one line of durations in seconds.
    fn ask(&mut self, request: &str) -> Result<Vec<Duration>, Box<dyn Error>> {
        writeln!(self.input, "{request}")?;
        self.input.flush()?;
        let mut line = String::new();
        if self.output.read_line(&mut line)? == 0 {
            return Err(format!("python: the benchmark process ended on {request:?}").into());
        }
        line.split_whitespace()
            .map(|seconds| {
                seconds
                    .parse::<f64>()
                    .map(Duration::from_secs_f64)
                    .map_err(|_| format!("python: {request:?} answered {line:?}").into())
            })
            .collect()
    }
}

impl Drop for PythonClient {
    fn drop(&mut self) {
        // Ended and reaped, not left behind.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
