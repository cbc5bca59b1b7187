//! Exec latency: `true` from start to `closed`, directly and through each
//! kind of executor (whole `capexec run` processes are in the `cli`
//! section).

use std::error::Error;
use std::process::Stdio;
use std::time::{Duration, Instant};

use capexec::capexec_capnp::executor;
use capexec::client::Command;
use capexec::engine::Engine;

use crate::Plan;
use crate::report::{Report, Target};
use crate::servers::Servers;

const SECTION: &str = "latency";

pub async fn run(
    plan: &Plan,
    servers: &Servers,
    report: &mut Report,
) -> Result<(), Box<dyn Error>> {
    eprintln!("latency: {} runs of `true` per variant", plan.latency_runs);
    let embedded = capexec::rpc::local_executor(Engine::default());
    let (unix, _unix_connection) = servers.unix.connect().await?;
    let (tcp, _tcp_connection) = servers.tcp.connect().await?;
    let (chain, _chain_connection) = servers.chain_front.connect().await?;
    let variants: [(&str, &executor::Client, Option<Target>); 4] = [
        ("embedded", &embedded, None),
        ("unix socket", &unix, Some(Target::AtMost(1.3))),
        ("tcp loopback", &tcp, None),
        ("chain A -> B (unix)", &chain, None),
    ];
    let command = Command::new("true");
    let runs: Vec<(&executor::Client, &Command)> = variants
        .iter()
        .map(|(_, executor, _)| (*executor, &command))
        .collect();
    let (direct, through) = alternate(plan, &runs).await?;
    let baseline = report.baseline(SECTION, "tokio::process spawn+wait `true`", direct, None);
    for ((name, _, target), samples) in variants.iter().zip(through) {
        report.case(SECTION, *name, samples, baseline, None, *target, "");
    }
    Ok(())
}

/// `true` spawned directly, then each of `variants` (a command on an
/// executor) run to `closed`, round after round: the direct samples and
/// each variant's, warm-up rounds left out.
pub(crate) async fn alternate(
    plan: &Plan,
    variants: &[(&executor::Client, &Command)],
) -> Result<(Vec<Duration>, Vec<Vec<Duration>>), Box<dyn Error>> {
    let mut direct = Vec::new();
    let mut through = vec![Vec::new(); variants.len()];
    for run in 0..plan.warmup_runs + plan.latency_runs {
        let keep = run >= plan.warmup_runs;
        let sample = time_direct().await?;
        if keep {
            direct.push(sample);
        }
        for ((executor, command), samples) in variants.iter().zip(&mut through) {
            let started = Instant::now();
            let status = command.status(executor).await?;
            let sample = started.elapsed();
            if !status.success() {
                return Err(format!("`true` through capexec: {status:?}").into());
            }
            if keep {
                samples.push(sample);
            }
        }
    }
    Ok((direct, through))
}

async fn time_direct() -> Result<Duration, Box<dyn Error>> {
    let started = Instant::now();
    let status = tokio::process::Command::new("true")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await?;
    let elapsed = started.elapsed();
    if !status.success() {
        return Err("`true` failed".into());
    }
    Ok(elapsed)
}
