//! The hand-over's last resort, in a binary of its own (a freeze stops
//! this process's reaper for good): a process's I/O thread asleep at the
//! freeze on the lock of a pipe that something outside the process's tree
//! holds would keep the exec waiting for as long as that likes. An
//! upgrade is refused while one sleeps so, but one can begin between the
//! check and the freeze; then, once ending the tree has not freed the
//! lock, every other holder of the pipe is killed, and the freeze ends.

mod common;

use capexec::engine::Engine;
use capexec::model::StartSpec;
use common::data::TempDir;
use common::pipe_lock::{self, KillOnDrop};

#[test]
fn a_freeze_kills_what_holds_a_pipe_its_processes_thread_sleeps_on() {
    common::run_on_runtime(async {
        let dir = TempDir::new("last-resort");
        let (socket, ready) = (dir.path().join("holder.sock"), dir.path().join("ready"));
        let mut holder = pipe_lock::outside_holder(&socket, &ready);
        let engine = Engine::default();
        let owner = engine
            .start(&StartSpec::new(pipe_lock::sender_argv(&socket, None)))
            .expect("start the sender");
        let splicing = common::eventually_async("the holder holds stdout locked", async || {
            pipe_lock::holder_pid(&ready)
        })
        .await;
        let _unwedge = KillOnDrop::when_failing(splicing);
        // The sender exits: its pump asks the pipe what it still holds,
        // and sleeps on the lock.
        common::eventually_async("the process's I/O thread sleeps on the lock", async || {
            pipe_lock::io_thread_states(std::process::id()).contains(&'D')
        })
        .await;
        engine.freeze().await;
        // Killed (a zombie until the holder's parent waits for it), and
        // the thread that slept on its lock is done.
        common::eventually_async(
            "the holder is killed",
            async || match common::procfs::state(splicing as u32) {
                None | Some('Z') => Ok(()),
                Some(state) => Err(format!("state {state}")),
            },
        )
        .await;
        let holder_status = holder.wait().expect("the holder's parent");
        assert!(holder_status.success(), "{holder_status}");
        common::eventually_async("no I/O thread is left", async || {
            let states = pipe_lock::io_thread_states(std::process::id());
            states.is_empty().then_some(()).ok_or(format!("{states:?}"))
        })
        .await;
        drop(owner);
    });
}
