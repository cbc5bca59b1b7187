//! The exit status carries what the process tree used: CPU time and peak
//! resident memory, through every backend, on the exit event and in the
//! process's info.

use crate::common;

use std::time::Duration;

use capexec::model::ExitStatus;
use common::{Ctx, sh};

/// Spins until the shell itself has used at least 0.3 s of user CPU time
/// (field 14 of /proc/PID/stat, in 1/100 s), so the figure does not depend
/// on how loaded the machine is.
const BURN_300_MS: &str = "while :; do i=0; while [ $i -lt 5000 ]; do i=$((i+1)); done; \
     read -r _ _ _ _ _ _ _ _ _ _ _ _ _ utime _ < /proc/$$/stat; \
     [ \"$utime\" -ge 30 ] && exit 3; done";

async fn a_cpu_burning_child_reports_its_cpu_time(ctx: Ctx) {
    let output = sh(BURN_300_MS)
        .output(&ctx.executor)
        .await
        .expect("run the burner");
    assert_eq!(output.exit.status, ExitStatus::Code(3));
    let usage = output.exit.usage.expect("the exit event carries usage");
    assert!(
        usage.user_cpu >= Duration::from_millis(300),
        "user CPU {:?} should cover the 0.3 s the shell burned",
        usage.user_cpu
    );
    assert!(
        usage.user_cpu < Duration::from_secs(600),
        "implausible: {usage:?}"
    );
    assert!(usage.peak_rss_bytes > 0, "{usage:?}");
    assert!(!output.exit.timed_out);
}

async fn peak_memory_covers_what_the_child_held(ctx: Ctx) {
    // The shell holds a 30 MB string in one variable.
    let process = common::spawn(
        &ctx,
        &sh("x=$(head -c 30000000 /dev/zero | tr '\\0' a); echo ${#x}"),
    )
    .await;
    let events = common::read_until_closed(&process).await;
    assert_eq!(
        common::output_bytes(&events, Some(capexec::model::OutputStream::Stdout)),
        b"30000000\n"
    );
    assert_eq!(common::exit_of(&events), Some(ExitStatus::Code(0)));
    let info = process.info().await.expect("info");
    let usage = info
        .exit
        .and_then(|exit| exit.usage)
        .expect("process info carries usage");
    assert!(
        usage.peak_rss_bytes >= 30_000_000,
        "peak RSS {} bytes, below the 30 MB the shell held",
        usage.peak_rss_bytes
    );
    assert!(usage.peak_rss_bytes < 8 << 30, "implausible: {usage:?}");
}

async fn a_running_process_has_no_usage_yet(ctx: Ctx) {
    let process = common::spawn(&ctx, &sh("exec sleep 1000")).await;
    let info = process.info().await.expect("info");
    assert_eq!(info.exit, None);
    assert!(process.terminate().await.expect("terminate"));
}

backend_tests!(
    a_cpu_burning_child_reports_its_cpu_time,
    peak_memory_covers_what_the_child_held,
    a_running_process_has_no_usage_yet,
);
