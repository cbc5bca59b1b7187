//! A released process must never signal an unrelated process that reused
//! its process group's number. Run in a fresh pid namespace (needs root and
//! `unshare`), where pid numbers can be steered with `ns_last_pid`.

mod common;

use std::process::Command;

use capexec::client::Command as Start;
use capexec::engine::Engine;
use common::{pid_after, procfs, read_until_output_contains};

const INNER: &str = "CAPEXEC_PID_REUSE_INNER";

#[test]
fn a_reused_group_number_is_never_signalled() {
    // SAFETY: getuid has no preconditions.
    let root = unsafe { libc::getuid() } == 0;
    let namespaces = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .output()
        .is_ok_and(|output| output.status.success());
    if !root || !namespaces {
        eprintln!("skipped: needs root and unshare(1) to make a pid namespace");
        return;
    }
    let status = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "--"])
        .arg(std::env::current_exe().expect("test binary"))
        .args(["inner_scenario", "--exact", "--ignored", "--nocapture"])
        .env(INNER, "1")
        .status()
        .expect("run the scenario in a pid namespace");
    assert!(status.success(), "the scenario failed: {status}");
}

#[test]
#[ignore = "runs inside the pid namespace made by a_reused_group_number_is_never_signalled"]
fn inner_scenario() {
    if std::env::var_os(INNER).is_none() {
        return;
    }
    common::run_local(async {
        let executor = capexec::rpc::local_executor(Engine::default());
        // The child exits at once; its background job leaves the group a
        // moment later (setsid), which frees the group's number without
        // capexec reaping anything.
        let script = "(sleep 0.3; exec setsid sleep 100) >/dev/null 2>&1 </dev/null & \
                      echo \"bg-$!-\"; exit 0";
        let mut command = Start::new("sh");
        command.args(["-c", script]);
        let process = command.spawn(&executor).await.expect("spawn");
        let (_, text) = read_until_output_contains(&process, "-\n").await;
        let daemon = pid_after(&text, "bg-");
        let group = process.info().await.expect("info").pid;
        process.wait().await.expect("wait");
        common::eventually_async("the job leaves the group", async || {
            session_of(daemon) == Some(daemon)
        })
        .await;
        // The number is free: give it to an unrelated session leader.
        std::fs::write("/proc/sys/kernel/ns_last_pid", format!("{}", group - 1))
            .expect("steer the next pid");
        // Reaped by this process's reaper thread once it ends, like every
        // child of a subreaper.
        #[allow(clippy::zombie_processes)]
        let mut unrelated = Command::new("setsid")
            .args(["sleep", "100"])
            .spawn()
            .expect("start the unrelated process");
        assert_eq!(unrelated.id(), group, "the number was not reused");
        common::eventually_async("the unrelated process leads its session", async || {
            session_of(group) == Some(group)
        })
        .await;

        // Releasing the finished process terminates what is left of its
        // tree: nothing, since its group is gone.
        drop(process);
        drop(executor);
        common::eventually_async("termination runs to its end", async || {
            capexec_live_processes() == 0
        })
        .await;
        // Termination has run to its end, so any signal it sent is either
        // still queued or has already killed the process.
        assert_eq!(procfs::pending_signals(group), 0, "{group} was signalled");
        assert!(
            matches!(procfs::state(group), Some(state) if state != 'Z'),
            "the unrelated process {group} was killed"
        );
        unrelated.kill().expect("end the unrelated process");
        procfs::wait_gone(group).await;
    });
}

fn session_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(3)?
        .parse()
        .ok()
}

/// Processes of this test still held anywhere: none once the termination
/// of the released one has run to its end (its pidfd closes with it).
fn capexec_live_processes() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|dir| {
            dir.flatten()
                .filter(|entry| {
                    std::fs::read_link(entry.path())
                        .map(|target| target.to_string_lossy().contains("pidfd"))
                        .unwrap_or(false)
                })
                .count()
        })
        .unwrap_or(0)
}
