//! Abuse: an honest client's start latency while each attack of
//! `tests/it/abuse.rs` runs against a TCP server, next to the same latency
//! without an attack, and the server's RSS before, at its peak during and
//! after each attack.
//!
//! The attacks run on a thread of their own (with their own runtime), round
//! after round, so the honest client's time is the server's answer, not
//! this process's contention. `CAPEXEC_BENCH_SERVER` points the section at
//! another build (an older one, for the figures before a change).

use std::error::Error;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use capexec::capexec_capnp::executor;
use capexec::client::Command;

use crate::Plan;
use crate::hostile;
use crate::procfs::{self, PeakRss};
use crate::report::Report;
use crate::servers::Serve;

const SECTION: &str = "abuse";
/// How long one round of an attack holds what it opened.
const ROUND: Duration = Duration::from_millis(500);
/// What an attack may add to the server's RSS, and how near its start the
/// server must come back after it.
const PEAK_BOUND_KIB: u64 = 80 * 1024;
const SETTLED_KIB: u64 = 4 * 1024;

#[derive(Clone, Copy)]
enum Attack {
    HugeHeadersBeforeLogin,
    HugeHeadersAfterLogin,
    UnfinishedBootstraps,
    UnfinishedReads,
    IdleConnections,
}

const ATTACKS: [Attack; 5] = [
    Attack::HugeHeadersBeforeLogin,
    Attack::HugeHeadersAfterLogin,
    Attack::UnfinishedBootstraps,
    Attack::UnfinishedReads,
    Attack::IdleConnections,
];

impl Attack {
    fn name(self) -> &'static str {
        match self {
            Attack::HugeHeadersBeforeLogin => "40 connections announcing 15 MiB, before login",
            Attack::HugeHeadersAfterLogin => {
                "40 logged-in connections announcing 15 MiB, sending 100 KiB"
            }
            Attack::UnfinishedBootstraps => "bootstraps never finished, 200,000 a round",
            Attack::UnfinishedReads => "1 MiB reads never finished nor read, 100 a round",
            Attack::IdleConnections => "768 idle connections from 3 addresses",
        }
    }
}

/// Where the attacker aims, and what it needs.
#[derive(Clone)]
struct Target {
    address: String,
    token: String,
    server_pid: u32,
    output_file: String,
}

pub async fn run(plan: &Plan, report: &mut Report) -> Result<(), Box<dyn Error>> {
    let serve = Serve::start(true, &[])?;
    let dir = tempfile::tempdir()?;
    let output_file = dir.path().join("output");
    std::fs::write(&output_file, vec![b'x'; 2 << 20])?;
    let target = Target {
        address: serve.address.to_string(),
        token: serve.token.as_ref().ok_or("no token")?.as_str().to_string(),
        server_pid: serve.pid(),
        output_file: output_file.display().to_string(),
    };
    let (executor, _connection) = serve.connect().await?;
    let runs = plan.abuse_runs;
    eprintln!("abuse: {runs} starts of `true` per attack, and without one");
    latency(&executor, plan.warmup_runs).await?;
    // Each attack's run comes right after a run without one, so drift on
    // the machine lands on both; the baseline is all the quiet runs.
    let mut quiet = Vec::new();
    let mut cases = Vec::new();
    for attack in ATTACKS {
        eprintln!("abuse: {}", attack.name());
        quiet.extend(latency(&executor, runs).await?);
        let before = settled_rss(serve.pid()).await;
        let peak = PeakRss::watch(serve.pid());
        let attacker = Attacker::start(attack, target.clone()).await?;
        let during = latency(&executor, runs).await;
        attacker.stop();
        let during = during?;
        let peak = peak.peak_kib();
        let after = settled_rss(serve.pid()).await;
        cases.push((attack, during));
        let held = peak <= before + PEAK_BOUND_KIB && after <= before + SETTLED_KIB;
        report.figure(
            SECTION,
            format!("server anonymous RSS, {}", attack.name()),
            format!("{before} -> peak {peak} -> {after} KiB"),
            Some((
                format!(
                    "peak < +{} MiB, after < +{} MiB",
                    PEAK_BOUND_KIB >> 10,
                    SETTLED_KIB >> 10
                ),
                held,
            )),
        );
    }
    let baseline = report.baseline(
        SECTION,
        "start `true`, logged-in TCP client, no attack",
        quiet,
        None,
    );
    for (attack, during) in cases {
        report.case(
            SECTION,
            format!("the same during: {}", attack.name()),
            during,
            baseline,
            None,
            None,
            "",
        );
    }
    Ok(())
}

async fn latency(
    executor: &executor::Client,
    runs: usize,
) -> Result<Vec<Duration>, Box<dyn Error>> {
    let command = Command::new("true");
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        let status = command.status(executor).await?;
        samples.push(started.elapsed());
        if !status.success() {
            return Err(format!("`true`: {status:?}").into());
        }
    }
    Ok(samples)
}

/// The server's RSS once it has handed back what closed connections
/// freed (a second after they close) and stopped changing.
async fn settled_rss(pid: u32) -> u64 {
    tokio::time::sleep(Duration::from_millis(1500)).await;
    procfs::rss_quiet(pid).await
}

/// An attack running round after round on its own thread.
struct Attacker {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Attacker {
    /// Starts `attack`; returns once its first round is under way.
    async fn start(attack: Attack, target: Target) -> Result<Attacker, Box<dyn Error>> {
        let stop = Arc::new(AtomicBool::new(false));
        let (under_way, started) = tokio::sync::oneshot::channel();
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("attacker runtime");
                runtime.block_on(attack_until(attack, target, stop, under_way));
            })
        };
        started.await?;
        Ok(Attacker { stop, thread })
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

async fn attack_until(
    attack: Attack,
    target: Target,
    stop: Arc<AtomicBool>,
    under_way: tokio::sync::oneshot::Sender<()>,
) {
    let mut under_way = Some(under_way);
    let mut started = || {
        if let Some(under_way) = under_way.take() {
            let _ = under_way.send(());
        }
    };
    let address = target.address.as_str();
    if let Attack::IdleConnections = attack {
        let mut held = Vec::new();
        for source in ["127.0.0.2", "127.0.0.3", "127.0.0.4"] {
            held.extend(hostile::idle_connections(source, address, 256).await);
        }
        started();
        while !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        return;
    }
    while !stop.load(Ordering::Relaxed) {
        match attack {
            Attack::HugeHeadersBeforeLogin => {
                let _held = hostile::huge_headers(address, None, 40).await;
                started();
                tokio::time::sleep(ROUND).await;
            }
            Attack::HugeHeadersAfterLogin => {
                let mut held = hostile::huge_headers(address, Some(&target.token), 40).await;
                for stream in &mut held {
                    hostile::send(stream, &vec![0u8; 100 << 10]).await;
                }
                started();
                tokio::time::sleep(ROUND).await;
            }
            Attack::UnfinishedBootstraps => {
                let mut stream = hostile::connect(address).await;
                started();
                hostile::unfinished_bootstraps(&mut stream, 200_000).await;
            }
            Attack::UnfinishedReads => {
                let pid = target.server_pid;
                while procfs::has_child_named(pid, "sleep") {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let mut stream = hostile::logged_in(address, &target.token).await;
                let script = format!("cat {}; exec sleep 1000", target.output_file);
                hostile::send(
                    &mut stream,
                    &hostile::start(2, 1, Some(0), &["sh", "-c", &script]),
                )
                .await;
                let deadline = Instant::now() + Duration::from_secs(5);
                while !procfs::has_child_named(pid, "sleep") && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                hostile::unfinished_reads(&mut stream, 100).await;
                started();
                tokio::time::sleep(ROUND).await;
            }
            Attack::IdleConnections => unreachable!("held above"),
        }
    }
}
