//! A host without some kernel features (pretended: this process hides
//! Landlock and cgroups before its first start, as `capexec serve
//! --hide-kernel-feature` does): a sandbox or limits that must be enforced
//! are refused with one sentence naming what is missing; best effort starts
//! and says in ProcessInfo what was not enforced; trees are tracked by
//! their process group. Never silently unconfined.

mod common;

use capexec::client::Command;
use capexec::engine::Engine;
use capexec::model::{Limits, RefusalKind, Sandbox, Tracking};
use capexec::sandbox::{HostConfig, KernelFeature};

fn hide_features() {
    let _ = capexec::sandbox::configure(HostConfig {
        hidden: [KernelFeature::Landlock, KernelFeature::Cgroups]
            .into_iter()
            .collect(),
    });
}

#[test]
fn what_cannot_be_enforced_is_refused_or_said() {
    hide_features();
    common::run_local(async {
        let executor = capexec::rpc::local_executor(Engine::default());
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
