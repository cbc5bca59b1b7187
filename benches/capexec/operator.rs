//! The operator's view: listing every process a server holds over its
//! admin socket (`capexec ps`), next to the floor of that work, reading
//! each process's /proc/PID/stat in this process.

use std::error::Error;
use std::time::{Duration, Instant};

use capexec::client::Command;
use futures::future::join_all;

use crate::Plan;
use crate::report::Report;
use crate::servers::Serve;

const SECTION: &str = "operator";

pub async fn run(plan: &Plan, report: &mut Report) -> Result<(), Box<dyn Error>> {
    let sockets = tempfile::tempdir()?;
    let admin = capexec::net::Address::Unix(sockets.path().join("admin.sock"));
    let serve = Serve::start(false, &["--admin".to_string(), admin.to_string()])?;
    let (executor, _connection) = serve.connect().await?;
    let n = plan.concurrent;
    eprintln!("operator: {n} idle processes, listed by the admin");
    let mut sleep = Command::new("sleep");
    sleep.arg("60");
    let (processes, spawned): (Vec<_>, Vec<_>) =
        (0..n).map(|_| sleep.spawn_pipelined(&executor)).unzip();
    for outcome in join_all(spawned).await {
        outcome?;
    }
    let connection = capexec::net::connect_admin(&admin).await?;
    let admin = connection.admin();
    let listed = capexec::client::admin::processes(&admin).await?;
    if listed.len() != n {
        return Err(format!("the admin listed {} of {n} processes", listed.len()).into());
    }
    let pids: Vec<u32> = listed.iter().map(|record| record.pid).collect();
    let runs = plan.latency_runs.min(200);
    let mut direct = Vec::with_capacity(runs);
    let mut remote = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        for pid in &pids {
            std::hint::black_box(capexec::engine::proc_stat::cpu_and_memory(*pid));
        }
        direct.push(started.elapsed());
        let started = Instant::now();
        let records = capexec::client::admin::processes(&admin).await?;
        remote.push(started.elapsed());
        std::hint::black_box(records);
    }
    let baseline = report.baseline(
        SECTION,
        format!("read /proc/PID/stat of {n} processes here"),
        direct,
        None,
    );
    let median = |samples: &[Duration]| {
        let mut sorted = samples.to_vec();
        sorted.sort();
        sorted[sorted.len() / 2]
    };
    let per = median(&remote).as_secs_f64() * 1e6 / n as f64;
    report.case(
        SECTION,
        format!("capexec ps: Admin.list of {n} processes over the admin socket"),
        remote,
        baseline,
        None,
        None,
        format!("{per:.1} µs per process"),
    );
    drop(processes);
    Ok(())
}
