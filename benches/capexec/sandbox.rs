//! Confinement's cost: spawn latency of `true` from start to `closed` on
//! a server without cgroups (`--hide-kernel-feature cgroups`) and on one
//! with a cgroup per process, each unsandboxed and sandboxed, next to a
//! direct spawn in the same run; and the server memory of many concurrent
//! sandboxed processes next to as many unsandboxed ones.

use std::error::Error;
use std::time::{Duration, Instant};

use capexec::client::Command;
use capexec::model::Sandbox;
use futures::future::join_all;

use crate::Plan;
use crate::report::Report;
use crate::servers::Serve;

const SECTION: &str = "sandbox";
/// Target: a sandbox and a cgroup together cost at most this much more
/// than neither (medians).
const MAX_EXTRA: Duration = Duration::from_micros(500);

fn median(samples: &[Duration]) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    sorted[sorted.len() / 2]
}

pub async fn run(plan: &Plan, report: &mut Report) -> Result<(), Box<dyn Error>> {
    eprintln!("sandbox: {} runs of `true` per variant", plan.latency_runs);
    let plain = Serve::start(false, &["--hide-kernel-feature".into(), "cgroups".into()])?;
    let tracked = Serve::start(false, &[])?;
    let (plain, _plain_connection) = plain.connect().await?;
    let (tracked_executor, _tracked_connection) = tracked.connect().await?;
    let cwd = tempfile::tempdir()?;
    let mut bare = Command::new("true");
    bare.current_dir(cwd.path());
    let mut sandboxed = bare.clone();
    sandboxed.sandbox(Sandbox::default());
    let variants = [
        ("process group, no sandbox", &plain, &bare),
        ("process group, sandbox", &plain, &sandboxed),
        ("cgroup, no sandbox", &tracked_executor, &bare),
        ("cgroup and sandbox", &tracked_executor, &sandboxed),
    ];
    let runs: Vec<_> = variants
        .iter()
        .map(|(_, executor, command)| (*executor, *command))
        .collect();
    let (direct, through) = crate::latency::alternate(plan, &runs).await?;
    let extra = median(&through[3]).saturating_sub(median(&through[0]));
    let baseline = report.baseline(SECTION, "tokio::process spawn+wait `true`", direct, None);
    for ((name, _, _), samples) in variants.iter().zip(through) {
        report.case(SECTION, *name, samples, baseline, None, None, "");
    }
    report.figure(
        SECTION,
        "cgroup and sandbox vs neither (medians)",
        format!("+{:.3} ms", extra.as_secs_f64() * 1e3),
        Some((
            format!("at most +{:.1} ms", MAX_EXTRA.as_secs_f64() * 1e3),
            extra <= MAX_EXTRA,
        )),
    );
    memory(plan, &tracked, report).await
}

/// Server memory per idle process, unsandboxed then sandboxed, on the
/// server with a cgroup per process.
async fn memory(plan: &Plan, serve: &Serve, report: &mut Report) -> Result<(), Box<dyn Error>> {
    let n = plan.concurrent;
    let (executor, _connection) = serve.connect().await?;
    let cwd = tempfile::tempdir()?;
    let mut figures = Vec::new();
    for sandbox in [false, true] {
        eprintln!("sandbox: {n} concurrent `sleep 60` (sandboxed: {sandbox})");
        let before = serve.usage()?;
        let mut sleep = Command::new("sleep");
        sleep.arg("60").current_dir(cwd.path());
        if sandbox {
            sleep.sandbox(Sandbox::default());
        }
        let (processes, spawned): (Vec<_>, Vec<_>) =
            (0..n).map(|_| sleep.spawn_pipelined(&executor)).unzip();
        for outcome in join_all(spawned).await {
            outcome?;
        }
        let during = serve.usage()?;
        if during.children < n as u64 {
            return Err(format!(
                "only {} of {n} processes were alive when measured",
                during.children
            )
            .into());
        }
        let per = during.rss_kib.saturating_sub(before.rss_kib) as f64 / n as f64;
        figures.push(per);
        report.figure(
            SECTION,
            format!(
                "server RSS with {n} idle {} processes",
                if sandbox { "sandboxed" } else { "unsandboxed" }
            ),
            format!(
                "{} KiB -> {} KiB, {per:.1} KiB per process, fds {} -> {}",
                before.rss_kib, during.rss_kib, before.fds, during.fds
            ),
            None,
        );
        // Released: each tree is terminated.
        drop(processes);
        // Let the releases finish before the next round's figure.
        let deadline = Instant::now() + Duration::from_secs(30);
        while serve.usage()?.children > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    report.figure(
        SECTION,
        "sandboxed vs unsandboxed, server memory per process",
        format!("{:+.1} KiB", figures[1] - figures[0]),
        None,
    );
    Ok(())
}
