//! capexec's cost next to the physical baseline, every case in one run so
//! that machine noise cancels out in the ratios.
//!
//! ```sh
//! cargo bench --bench capexec                       # full sizes (a few minutes)
//! cargo bench --bench capexec -- --quick            # every case, small sizes
//! cargo bench --bench capexec -- --svg docs/benchmarks.svg --markdown table.md
//! cargo bench --bench capexec -- --only latency     # one section
//! ```
//!
//! Servers are real `capexec serve` processes (Unix socket, TCP with a
//! token, the same over TLS with a pinned certificate, and a two-server
//! chain); the clients run in this process. ssh, where rows compare with
//! it, runs against an sshd of the bench's own (`ssh.rs`). Cases
//! alternate their variants round by round, so a burst of noise lands on
//! all of them. Sections: latency, output, stdin, pipelining, scale, abuse,
//! operator, files, sandbox, ports, cli (the `capexec` binary as whole
//! processes and shell pipelines), codex (`capexec codex-bridge` next to
//! Codex's own exec-server), python (the Python package next to the Rust
//! client).

mod abuse;
mod cli;
mod codex;
mod cpu;
mod exhaustion;
mod files;
mod hop;
#[path = "../../tests/common/hostile.rs"]
#[allow(dead_code)]
mod hostile;
mod latency;
mod operator;
mod output;
mod pipelining;
mod ports;
#[path = "../../tests/common/procfs.rs"]
#[allow(dead_code)]
mod procfs;
mod python;
// The polling helper `procfs` finds beside it, as in the tests' `common`.
#[path = "../../tests/common/wait.rs"]
#[allow(dead_code)]
mod wait;
use wait::eventually_async;
mod report;
mod sandbox;
mod scale;
mod sealed;
mod servers;
mod ssh;
mod stdin;
mod wall;

use std::error::Error;

use report::Report;

/// Sizes and repetitions: full, or `--quick` for a smoke run.
#[derive(Clone, Copy)]
pub struct Plan {
    pub quick: bool,
    pub latency_runs: usize,
    pub warmup_runs: usize,
    pub cli_runs: usize,
    pub output_bytes: u64,
    pub output_rounds: usize,
    pub stdin_bytes: u64,
    pub stdin_rounds: usize,
    pub pipelining_rounds: usize,
    pub concurrent: usize,
    pub sequential: usize,
    pub clients: usize,
    pub abuse_runs: usize,
    pub file_bytes: u64,
    pub file_rounds: usize,
    pub small_files: usize,
    pub walk_entries: usize,
    pub ports_bytes: u64,
    pub ports_rounds: usize,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                quick,
                latency_runs: 20,
                warmup_runs: 5,
                cli_runs: 5,
                output_bytes: 16 << 20,
                output_rounds: 1,
                stdin_bytes: 4 << 20,
                stdin_rounds: 1,
                pipelining_rounds: 2,
                concurrent: 50,
                sequential: 200,
                clients: 10,
                abuse_runs: 10,
                file_bytes: 64 << 20,
                file_rounds: 1,
                small_files: 1000,
                walk_entries: 10_000,
                ports_bytes: 64 << 20,
                ports_rounds: 1,
            }
        } else {
            Plan {
                quick,
                latency_runs: 1000,
                warmup_runs: 100,
                cli_runs: 300,
                output_bytes: 1 << 30,
                output_rounds: 5,
                stdin_bytes: 256 << 20,
                stdin_rounds: 7,
                pipelining_rounds: 10,
                concurrent: 1000,
                sequential: 10_000,
                clients: 200,
                abuse_runs: 300,
                file_bytes: 1 << 30,
                file_rounds: 3,
                small_files: 10_000,
                walk_entries: 100_000,
                ports_bytes: 1 << 30,
                ports_rounds: 3,
            }
        }
    }
}

const SECTIONS: [&str; 13] = [
    "latency",
    "output",
    "stdin",
    "pipelining",
    "scale",
    "abuse",
    "operator",
    "files",
    "sandbox",
    "ports",
    "cli",
    "codex",
    "python",
];

fn main() -> Result<(), Box<dyn Error>> {
    let mut quick = false;
    let (mut svg, mut markdown, mut only) = (None, None, Vec::new());
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--svg" => svg = Some(args.next().ok_or("--svg FILE")?),
            "--markdown" => markdown = Some(args.next().ok_or("--markdown FILE")?),
            "--only" => only.push(args.next().ok_or("--only SECTION")?),
            // What `cargo bench` adds.
            "--bench" => {}
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    if let Some(unknown) = only.iter().find(|s| !SECTIONS.contains(&s.as_str())) {
        return Err(format!("unknown section {unknown:?}; sections: {SECTIONS:?}").into());
    }
    let wanted = |section: &str| only.is_empty() || only.iter().any(|s| s == section);
    // Before any section runs: a full run takes minutes, and one that
    // fails at its last section for want of a Python writes no table.
    if wanted("python") {
        python::interpreter()?;
    }
    let plan = Plan::new(quick);
    watchdog(if quick { 300 } else { 3600 });

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    let report = local.block_on(&runtime, async {
        let mut report = Report::new(quick);
        let servers = servers::Servers::start().await?;
        eprintln!("servers up: {servers}");
        if wanted("latency") {
            latency::run(&plan, &servers, &mut report).await?;
        }
        if wanted("output") {
            output::run(&plan, &servers, &mut report).await?;
        }
        if wanted("stdin") {
            stdin::run(&plan, &servers, &mut report).await?;
        }
        if wanted("pipelining") {
            pipelining::run(&plan, &mut report).await?;
        }
        if wanted("scale") {
            scale::run(&plan, &mut report).await?;
        }
        if wanted("abuse") {
            abuse::run(&plan, &mut report).await?;
            exhaustion::run(&plan, &mut report).await?;
        }
        if wanted("operator") {
            operator::run(&plan, &mut report).await?;
        }
        if wanted("files") {
            files::run(&plan, &servers, &mut report).await?;
        }
        if wanted("sandbox") {
            sandbox::run(&plan, &mut report).await?;
        }
        if wanted("ports") {
            ports::run(&plan, &servers, &mut report).await?;
        }
        if wanted("cli") {
            cli::run(&plan, &servers, &mut report)?;
        }
        if wanted("codex") {
            codex::run(&plan, &mut report).await?;
        }
        if wanted("python") {
            python::run(&plan, &servers, &mut report).await?;
        }
        Ok::<_, Box<dyn Error>>(report)
    })?;

    print!("{}", report.text());
    if let Some(path) = markdown {
        std::fs::write(&path, report.markdown())?;
        eprintln!("wrote {path}");
    }
    if let Some(path) = svg {
        std::fs::write(&path, report.svg())?;
        eprintln!("wrote {path}");
    }
    Ok(())
}

/// A run that hangs fails instead, after `secs` seconds (the servers die
/// with this process: see `servers::Serve::start`).
fn watchdog(secs: u64) {
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(secs));
        eprintln!("benchmarks still running after {secs} s: giving up");
        std::process::exit(3);
    });
}
