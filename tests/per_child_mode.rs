//! The engine without `become_subreaper` (the library default): each child
//! is waited for through its pidfd and held as a zombie until its tree is
//! terminated, so its group number can never be reused under it.

mod common;

use capexec::client::Command;
use capexec::engine::Engine;
use capexec::model::ExitStatus;
use common::{procfs, read_until_output_contains, sh};

#[test]
fn a_finished_child_is_held_until_released_then_reaped() {
    common::run_on_runtime(async {
        assert!(!capexec::engine::is_subreaper());
        let executor = capexec::rpc::local_executor(Engine::default());
        let process = Command::new("true").spawn(&executor).await.expect("spawn");
        assert_eq!(process.wait().await.expect("wait"), ExitStatus::Code(0));
        let pid = process.info().await.expect("info").pid;
        // Still held: a zombie keeps its numbers reserved.
        assert_eq!(procfs::state(pid), Some('Z'));
        process
            .signal(capexec::model::Signal::Term)
            .await
            .expect("no-op");
        drop(process);
        procfs::wait_gone(pid).await;
    });
}

#[test]
fn releasing_kills_the_tree() {
    common::run_on_runtime(async {
        let executor = capexec::rpc::local_executor(Engine::default());
        let process = sh("sleep 1000 & echo $!; wait")
            .spawn(&executor)
            .await
            .expect("spawn");
        let (_, text) = read_until_output_contains(&process, "\n").await;
        let grandchild: u32 = text.trim().parse().expect("pid");
        let child = process.info().await.expect("info").pid;
        drop(process);
        procfs::wait_gone(child).await;
        // Without a subreaper the grandchild goes to init, which may or may
        // not reap it: dead is what matters here.
        common::eventually_async(
            "the grandchild is dead",
            async || !matches!(procfs::state(grandchild), Some(state) if state != 'Z'),
        )
        .await;
    });
}
