//! `StartParams.timeoutMs`: a process still running when its time is up is
//! terminated with its group, and says it timed out; one that finishes in
//! time does not. Every backend.

use crate::common;

use std::time::Duration;

use capexec::client::Command;
use capexec::model::ExitStatus;
use common::{Ctx, sh};

async fn a_process_past_its_timeout_is_terminated_and_says_so(ctx: Ctx) {
    let mut command = sh("exec sleep 1000");
    command.timeout(Duration::from_millis(300));
    let process = command.spawn(&ctx.executor).await.expect("start");
    common::read_until_timed_out(&process).await;
    // On the wire the exit status itself says so.
    let mut read = process.capability().read_request();
    read.get().set_after_seq(0);
    let response = read.send().promise.await.expect("read");
    let result = response
        .get()
        .expect("result")
        .get_result()
        .expect("result");
    match result.get_exit().which().expect("exit") {
        capexec::capexec_capnp::read_result::exit::Exited(status) => {
            assert!(status.expect("status").get_timed_out());
        }
        capexec::capexec_capnp::read_result::exit::Running(()) => panic!("still running"),
    }
}

async fn a_process_within_its_timeout_is_left_alone(ctx: Ctx) {
    let mut command = Command::new("true");
    command.timeout(Duration::from_secs(600));
    let process = command.spawn(&ctx.executor).await.expect("start");
    let events = common::read_until_closed(&process).await;
    assert_eq!(common::exit_of(&events), Some(ExitStatus::Code(0)));
    assert!(!process.info().await.expect("info").timed_out);
}

backend_tests!(
    a_process_past_its_timeout_is_terminated_and_says_so,
    a_process_within_its_timeout_is_left_alone,
);
