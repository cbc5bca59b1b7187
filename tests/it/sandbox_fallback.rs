//! A host without some kernel features (pretended: each test's engine
//! hides Landlock and cgroups, as `capexec serve --hide-kernel-feature`
//! does, beside the engines of the other tests that have them): a sandbox
//! or limits that must be enforced are refused with one sentence naming
//! what is missing; best effort starts and says in ProcessInfo what was
//! not enforced; trees are tracked by their process group. Never silently
//! unconfined.

use capexec::client::Command;
use capexec::engine::{Engine, ProcessLimits};
use capexec::model::{Limits, RefusalKind, Sandbox, Tracking};
use capexec::sandbox::{HostConfig, KernelFeature};

use crate::common;

/// An engine on this kernel without Landlock and cgroups.
fn engine_without_landlock_and_cgroups() -> Engine {
    Engine::with_host(
        ProcessLimits::default(),
        HostConfig::hiding([KernelFeature::Landlock, KernelFeature::Cgroups]),
    )
}

#[test]
fn what_cannot_be_enforced_is_refused_or_said() {
    common::run_local(async {
        let executor = capexec::rpc::local_executor(engine_without_landlock_and_cgroups());
        let cwd = common::data::TempDir::new("fallback");
        let mut command = Command::new("true");
        command.current_dir(cwd.path()).sandbox(Sandbox::default());
        let error = command.output(&executor).await.expect_err("refused");
        assert_eq!(
            error.refusal_kind(),
            Some(RefusalKind::Unsupported),
            "{error}"
        );
        let message = error.to_string();
        assert!(
            message.contains("sandbox: this server cannot enforce filesystem, scope-signals, scope-abstract-sockets")
                && message.contains("the kernel has no Landlock"),
            "{message}"
        );

        let mut command = Command::new("true");
        command.limits(Limits {
            memory_bytes: Some(1 << 30),
            ..Limits::default()
        });
        let error = command.output(&executor).await.expect_err("refused");
        assert_eq!(
            error.refusal_kind(),
            Some(RefusalKind::Unsupported),
            "{error}"
        );
        assert!(
            error
                .to_string()
                .contains("limits: this server cannot enforce limit-memory"),
            "{error}"
        );

        // Best effort: started, and what is missing is said.
        let mut command = common::sh(
            "echo x > /tmp/capexec-fallback-probe-$$ && echo wrote; rm -f /tmp/capexec-fallback-probe-$$",
        );
        command.current_dir(cwd.path()).sandbox(Sandbox {
            best_effort: true,
            ..Sandbox::default()
        });
        command.limits(Limits {
            max_pids: Some(10),
            best_effort: true,
            ..Limits::default()
        });
        let process = command.spawn(&executor).await.expect("start");
        let events = common::read_until_closed(&process).await;
        // No Landlock: the file system is not confined (and says so).
        assert_eq!(common::output_bytes(&events, None), b"wrote\n");
        let confinement = process.info().await.expect("info").confinement;
        assert_eq!(confinement.tracking, Tracking::ProcessGroup);
        for name in [
            "filesystem",
            "scope-signals",
            "scope-abstract-sockets",
            "limit-pids",
        ] {
            assert!(
                confinement.not_enforced.iter().any(|n| n == name),
                "{name}: {confinement:?}"
            );
        }
        for name in [
            "no-new-privs",
            "network-sockets",
            "io-uring",
            "server-isolation",
        ] {
            assert!(
                confinement.enforced.iter().any(|n| n == name),
                "{name}: {confinement:?}"
            );
        }
        let info = capexec::client::info(&executor).await.expect("info");
        assert!(
            info.features.iter().any(|f| f == "process-group-tracking"),
            "{:?}",
            info.features
        );
        assert!(
            !info
                .features
                .iter()
                .any(|f| f.starts_with("sandbox-landlock")),
            "{:?}",
            info.features
        );
    });
}

/// Tracked by its process group: `terminate` after the child exited,
/// while what it left in its group runs, answers `running` true and ends
/// it, as with a cgroup; `treeRunning` says the same; once nothing runs
/// it answers false.
#[test]
fn terminate_after_the_exit_ends_what_the_child_left_in_its_group() {
    common::run_local(async {
        let executor = capexec::rpc::local_executor(engine_without_landlock_and_cgroups());
        let process = common::sh("sleep 300 </dev/null >/dev/null 2>&1 & echo $!")
            .spawn(&executor)
            .await
            .expect("start");
        let events = common::read_until_closed(&process).await;
        let text = String::from_utf8_lossy(&common::output_bytes(&events, None)).into_owned();
        let pid: u32 = text.trim().parse().expect("pid");
        let alive = || common::procfs::state(pid).is_some_and(|state| state != 'Z');
        let info = process.info().await.expect("info");
        assert_eq!(info.confinement.tracking, Tracking::ProcessGroup);
        assert!(info.exit.is_some());
        assert!(info.tree_running, "the background sleep is in its group");
        assert!(alive());
        assert!(process.terminate().await.expect("terminate"), "running");
        common::eventually_async("the background sleep ends", async || !alive()).await;
        assert!(!process.info().await.expect("info").tree_running);
        assert!(
            !process.terminate().await.expect("terminate"),
            "nothing runs"
        );
    });
}
