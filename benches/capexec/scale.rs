//! Scale and soak: many concurrent idle processes on one server (start
//! time, server memory and descriptors per process), many short processes
//! one after another (rate), many concurrent clients; and whether anything
//! drifts from before the sequential processes to after the clients.

use std::error::Error;
use std::time::Instant;

use capexec::client::Command;
use futures::future::join_all;

use crate::Plan;
use crate::report::Report;
use crate::servers::{Serve, Usage};

const SECTION: &str = "scale";
/// Target: server memory per idle process, output excluded.
const MAX_RSS_PER_PROCESS_KIB: f64 = 64.0;

pub async fn run(plan: &Plan, report: &mut Report) -> Result<(), Box<dyn Error>> {
    // A fresh server, so its figures are this section's alone.
    let serve = Serve::start(false, &[])?;
    let (executor, _connection) = serve.connect().await?;
    Command::new("true").status(&executor).await?;
    concurrent(plan, &serve, &executor, report).await?;
    // Settle what the concurrent case left (released processes are reaped
    // asynchronously), then take the before figure.
    for _ in 0..10 {
        Command::new("true").status(&executor).await?;
    }
    let before = settled(&serve).await?;
    sequential(plan, &executor, report).await?;
    clients(plan, &serve, report).await?;
    // The server hands freed memory back a second after connections close.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let after = settled(&serve).await?;
    let steady = after.fds <= before.fds && after.threads == before.threads && after.zombies == 0;
    report.figure(
        SECTION,
        "server before the sequential processes -> after the clients",
        format!(
            "RSS {} -> {} KiB, fds {} -> {}, threads {} -> {}, zombies {}",
            before.rss_kib,
            after.rss_kib,
            before.fds,
            after.fds,
            before.threads,
            after.threads,
            after.zombies
        ),
        Some(("no more fds, same threads, no zombies".to_string(), steady)),
    );
    Ok(())
}

/// Many clients at once, each connecting, running `echo` and leaving.
async fn clients(plan: &Plan, serve: &Serve, report: &mut Report) -> Result<(), Box<dyn Error>> {
    let n = plan.clients;
    eprintln!("scale: {n} concurrent clients");
    let started = Instant::now();
    let runs = (0..n).map(|i| async move {
        let (executor, _connection) = serve.connect().await?;
        let mut echo = Command::new("echo");
        echo.arg(format!("client {i}"));
        let output = echo.output(&executor).await?;
        if output.stdout != format!("client {i}\n").into_bytes() {
            return Err::<(), Box<dyn Error>>(format!("client {i} got {:?}", output.stdout).into());
        }
        Ok(())
    });
    for outcome in join_all(runs).await {
        outcome?;
    }
    let elapsed = started.elapsed();
    report.figure(
        SECTION,
        format!("{n} concurrent clients, each connecting and running `echo`"),
        format!("{:.0} ms, every output exact", elapsed.as_secs_f64() * 1e3),
        None,
    );
    Ok(())
}

async fn concurrent(
    plan: &Plan,
    serve: &Serve,
    executor: &capexec::capexec_capnp::executor::Client,
    report: &mut Report,
) -> Result<(), Box<dyn Error>> {
    let n = plan.concurrent;
    eprintln!("scale: {n} concurrent `sleep 2`");
    let before = serve.usage()?;
    let mut sleep = Command::new("sleep");
    sleep.arg("2");
    let started = Instant::now();
    let (processes, spawned): (Vec<_>, Vec<_>) =
        (0..n).map(|_| sleep.spawn_pipelined(executor)).unzip();
    for outcome in join_all(spawned).await {
        outcome?;
    }
    let start_all = started.elapsed();
    let during = serve.usage()?;
    // Figures per process hold only if every process is still running.
    if during.children < n as u64 {
        return Err(format!(
            "only {} of {n} processes were alive when measured (starting took {start_all:?})",
            during.children
        )
        .into());
    }
    let per = |after: u64, before: u64| after.saturating_sub(before) as f64 / n as f64;
    let rss_per = per(during.rss_kib, before.rss_kib);
    let direct = spawn_directly(n)?;
    let baseline = report.baseline(
        SECTION,
        format!("std::process: spawn {n} `sleep 2`"),
        vec![direct],
        None,
    );
    report.case(
        SECTION,
        format!("capexec: start {n} `sleep 2` (pipelined)"),
        vec![start_all],
        baseline,
        None,
        None,
        format!("{:.0} starts/s", n as f64 / start_all.as_secs_f64()),
    );
    report.figure(
        SECTION,
        format!("server RSS with {n} idle processes"),
        format!(
            "{} KiB -> {} KiB, {rss_per:.1} KiB per process",
            before.rss_kib, during.rss_kib
        ),
        Some((
            format!("< {MAX_RSS_PER_PROCESS_KIB} KiB per process"),
            rss_per < MAX_RSS_PER_PROCESS_KIB,
        )),
    );
    report.figure(
        SECTION,
        format!("server descriptors with {n} idle processes"),
        format!(
            "{} -> {}, {:.1} per process",
            before.fds,
            during.fds,
            per(during.fds, before.fds)
        ),
        None,
    );
    for outcome in join_all(processes.iter().map(|process| process.wait())).await {
        outcome?;
    }
    drop(processes);
    Ok(())
}

async fn sequential(
    plan: &Plan,
    executor: &capexec::capexec_capnp::executor::Client,
    report: &mut Report,
) -> Result<(), Box<dyn Error>> {
    let n = plan.sequential;
    eprintln!("scale: {n} sequential `true`");
    let command = Command::new("true");
    let started = Instant::now();
    for _ in 0..n {
        let status = command.status(executor).await?;
        if !status.success() {
            return Err(format!("`true`: {status:?}").into());
        }
    }
    let elapsed = started.elapsed();
    let started = Instant::now();
    for _ in 0..n {
        crate::wall::time_process("true", &[] as &[&str], None)?;
    }
    let direct = started.elapsed();
    let baseline = report.baseline(
        SECTION,
        format!("std::process: {n} sequential `true`"),
        vec![direct],
        None,
    );
    report.case(
        SECTION,
        format!("capexec: {n} sequential `true`"),
        vec![elapsed],
        baseline,
        None,
        None,
        format!("{:.0} processes/s", n as f64 / elapsed.as_secs_f64()),
    );
    Ok(())
}

/// The server's usage once its descriptor count stops changing (releases
/// finish asynchronously), within a generous deadline.
async fn settled(serve: &Serve) -> Result<Usage, Box<dyn Error>> {
    let deadline = Instant::now() + std::time::Duration::from_secs(30);
    let mut last = serve.usage()?;
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let now = serve.usage()?;
        let quiet = now.fds == last.fds && now.zombies == 0 && now.children == 0;
        if quiet || Instant::now() > deadline {
            return Ok(now);
        }
        last = now;
    }
}

/// The baseline: `n` children started straight from this process (and
/// waited for afterwards, untimed).
fn spawn_directly(n: usize) -> Result<std::time::Duration, Box<dyn Error>> {
    let started = Instant::now();
    let children = (0..n)
        .map(|_| {
            std::process::Command::new("sleep")
                .arg("2")
                .stdin(std::process::Stdio::null())
                .spawn()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let elapsed = started.elapsed();
    for mut child in children {
        child.wait()?;
    }
    Ok(elapsed)
}
