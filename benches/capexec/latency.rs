//! Exec latency: `true` from start to `closed`, directly and through each
//! kind of executor; and whole `capexec run` invocations next to running
//! `true` itself.

use std::error::Error;
use std::process::Stdio;
use std::time::{Duration, Instant};

use capexec::capexec_capnp::executor;
use capexec::client::Command;
use capexec::engine::Engine;

use crate::Plan;
use crate::report::{Report, Target};
use crate::servers::{CAPEXEC, Servers};
use crate::wall::time_process;

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
    whole_process(plan, servers, report)
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

/// What a user at a shell pays: the `capexec` binary's own start-up
/// included.
fn whole_process(
    plan: &Plan,
    servers: &Servers,
    report: &mut Report,
) -> Result<(), Box<dyn Error>> {
    eprintln!("latency: {} whole-process runs per variant", plan.cli_runs);
    let (connect, token) = servers.unix.cli_args();
    let mut remote: Vec<String> = vec!["run".into()];
    remote.extend(connect);
    remote.extend(["-n".into(), "--".into(), "true".into()]);
    let embedded: Vec<String> = ["run", "-n", "--", "true"].map(String::from).to_vec();
    let (mut bare, mut through_unix, mut through_embedded) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..plan.cli_runs + plan.warmup_runs.min(20) {
        let keep = run >= plan.warmup_runs.min(20);
        let samples = [
            time_process("true", &[] as &[&str], None)?,
            time_process(CAPEXEC, &remote, token.as_ref())?,
            time_process(CAPEXEC, &embedded, None)?,
        ];
        if keep {
            bare.push(samples[0]);
            through_unix.push(samples[1]);
            through_embedded.push(samples[2]);
        }
    }
    let baseline = report.baseline(SECTION, "`true` as a process", bare, None);
    report.case(
        SECTION,
        "`capexec run --connect unix:… -- true`",
        through_unix,
        baseline,
        None,
        None,
        "",
    );
    report.case(
        SECTION,
        "`capexec run -- true` (embedded)",
        through_embedded,
        baseline,
        None,
        None,
        "",
    );
    Ok(())
}
