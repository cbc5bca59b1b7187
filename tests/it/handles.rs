//! Both handles on a process, the plain `RemoteProcess` and the recovering
//! `ResilientProcess`, speak one surface (`ProcessHandle`): the same generic
//! body drives each, on every backend, and gets the same bytes, events and
//! exit status.

use crate::common;

use futures::StreamExt;

use capexec::client::{Command, ProcessHandle, ResilientProcess, Session, Stdin};
use capexec::model::{EventBody, ExitStatus, WriteStatus};
use common::Ctx;

fn upcase() -> Command {
    let mut command = Command::new("tr");
    command.args(["a-z", "A-Z"]).stdin(Stdin::Piped);
    command
}

/// Feeds `handle`'s process two writes and an end-of-file, then collects
/// its stdout from the event stream and its exit status from `wait`.
async fn drive<H: ProcessHandle>(handle: &H) -> (Vec<u8>, ExitStatus) {
    let first = handle.write_in_order(b"hello ", "w1");
    assert_eq!(
        handle.write(b"world\n", "w2").await.expect("write"),
        WriteStatus::Accepted
    );
    assert_eq!(first.outcome().await.expect("write"), WriteStatus::Accepted);
    handle.close_stdin().await.expect("close stdin");
    let mut events = handle.events(0).await.expect("subscribe");
    let mut stdout = Vec::new();
    let mut exited = None;
    while let Some(event) = events.next().await {
        match event.expect("event").body {
            EventBody::Output { data, .. } => stdout.extend_from_slice(&data),
            EventBody::Exited(exit) => exited = Some(exit.status),
            EventBody::Closed => break,
            EventBody::Gap { .. } => panic!("lost output"),
        }
    }
    let status = handle.wait().await.expect("wait");
    assert_eq!(exited, Some(status), "the stream and wait agree");
    let info = handle.observer().info().await.expect("an observer's info");
    assert_eq!(info.exit.map(|exit| exit.status), Some(status));
    (stdout, status)
}

async fn both_handles_speak_one_surface(ctx: Ctx) {
    let plain = upcase().spawn(&ctx.executor).await.expect("start");
    let (resilient, started) =
        ResilientProcess::spawn_on(&upcase(), Session::new(ctx.executor.clone(), None), None);
    started.await.expect("start");
    let expected = (b"HELLO WORLD\n".to_vec(), ExitStatus::Code(0));
    assert_eq!(drive(&plain).await, expected);
    assert_eq!(drive(&resilient).await, expected);
}

backend_tests!(both_handles_speak_one_surface);
