//! Attenuated facets of a process: a read-only observer and a stdin
//! writer. Each forbidden call fails with its reason, neither keeps the
//! process alive, and an observer sees the end when the owner lets go. The
//! same bodies run on every backend.

use crate::common;

use std::time::Duration;

use capexec::client::{Error, RemoteProcess, Stdin};
use capexec::model::{EventBody, ExitStatus, PtySize, RefusalKind, Signal, WriteStatus};
use common::{Ctx, output_bytes, procfs, read_until_output_contains, sh};

pub(crate) const OBSERVER: &str =
    "an observer, which may only read, subscribe, ask for info and make observers";
pub(crate) const WRITER: &str =
    "a stdin writer, which may only write, close stdin and ask for info";

/// The refusal's message, which must be tagged `forbidden`.
pub(crate) fn refusal<T: std::fmt::Debug>(outcome: Result<T, Error>) -> String {
    match outcome.expect_err("the call was allowed") {
        Error::Refused(refusal) => {
            assert_eq!(refusal.kind, RefusalKind::Forbidden, "{refusal:?}");
            refusal.message
        }
        other => panic!("not a tagged refusal: {other:?}"),
    }
}

/// The refusal's message (its `[capexec:forbidden]` tag is its kind).
pub(crate) fn forbidden(call: &str, facet: &str) -> String {
    format!("`{call}` is not allowed: this capability is {facet}")
}

pub(crate) async fn spawn_cat(ctx: &Ctx) -> RemoteProcess {
    let mut cat = sh("echo pid-$$-; exec cat");
    cat.stdin(Stdin::Piped);
    cat.spawn(&ctx.executor).await.expect("start")
}

async fn an_observer_reads_but_cannot_act(ctx: Ctx) {
    let process = spawn_cat(&ctx).await;
    let view = process.observer();
    let (_, text) = read_until_output_contains(&view, "-\n").await;
    assert!(text.starts_with("pid-"), "{text:?}");
    assert_eq!(
        view.info().await.expect("info").pid,
        process.info().await.expect("info").pid
    );

    assert_eq!(
        refusal(view.write(b"x", "w").await),
        forbidden("write", OBSERVER)
    );
    assert_eq!(
        refusal(view.close_stdin().await),
        forbidden("closeStdin", OBSERVER)
    );
    assert_eq!(
        refusal(view.signal(Signal::Term).await),
        forbidden("signal", OBSERVER)
    );
    assert_eq!(
        refusal(view.terminate().await),
        forbidden("terminate", OBSERVER)
    );
    assert_eq!(
        refusal(view.resize(PtySize { rows: 2, cols: 2 }).await),
        forbidden("resize", OBSERVER)
    );
    assert_eq!(
        refusal(view.detachable(Duration::from_secs(5)).await),
        forbidden("detachable", OBSERVER)
    );
    assert_eq!(
        refusal(view.stdin_writer().info().await),
        forbidden("stdinWriter", OBSERVER)
    );
    // A view of a view is a view.
    let again = view.observer();
    assert_eq!(
        refusal(again.terminate().await),
        forbidden("terminate", OBSERVER)
    );

    // The owner still does everything, and the observer sees it all.
    process.write(b"hello\n", "w1").await.expect("write");
    process.close_stdin().await.expect("close");
    let events = common::read_until_closed(&view).await;
    assert!(output_bytes(&events, None).ends_with(b"hello\n"));
    assert_eq!(common::exit_of(&events), Some(ExitStatus::Code(0)));
}

async fn an_observer_does_not_keep_the_process_alive(ctx: Ctx) {
    let process = sh("echo pid-$$-; exec sleep 1000")
        .spawn(&ctx.executor)
        .await
        .expect("start");
    let view = process.observer();
    let (seq, text) = read_until_output_contains(&view, "\n").await;
    let pid = common::pid_after(&text, "pid-");
    drop(process);
    procfs::wait_gone(pid).await;
    let mut events = view.events(seq).await.expect("subscribe");
    let mut rest = Vec::new();
    while let Some(batch) = events.next_batch().await {
        rest.extend(batch.expect("events"));
        if matches!(rest.last().map(|e| &e.body), Some(EventBody::Closed)) {
            break;
        }
    }
    // Released, `sleep` is ended by SIGTERM.
    assert!(
        matches!(
            common::exit_of(&rest),
            Some(ExitStatus::Killed {
                signal: Some(Signal::Term),
                ..
            })
        ),
        "{rest:?}"
    );
    assert!(matches!(
        rest.last().map(|e| &e.body),
        Some(EventBody::Closed)
    ));
}

async fn a_stdin_writer_only_feeds(ctx: Ctx) {
    let process = spawn_cat(&ctx).await;
    let writer = process.stdin_writer();
    assert_eq!(
        writer.write(b"fed\n", "w1").await.expect("write"),
        WriteStatus::Accepted
    );
    assert_eq!(
        writer.info().await.expect("info").pid,
        process.info().await.expect("info").pid
    );
    assert_eq!(
        refusal(writer.read(0, 0, Duration::ZERO).await),
        forbidden("read", WRITER)
    );
    assert_eq!(
        refusal(writer.events(0).await.map(drop)),
        forbidden("subscribe", WRITER)
    );
    assert_eq!(
        refusal(writer.signal(Signal::Term).await),
        forbidden("signal", WRITER)
    );
    assert_eq!(
        refusal(writer.terminate().await),
        forbidden("terminate", WRITER)
    );
    assert_eq!(
        refusal(writer.observer().info().await),
        forbidden("observer", WRITER)
    );
    writer.close_stdin().await.expect("close");
    let events = common::read_until_closed(&process).await;
    assert!(output_bytes(&events, None).ends_with(b"fed\n"));
    assert_eq!(common::exit_of(&events), Some(ExitStatus::Code(0)));
}

async fn a_stdin_writer_does_not_keep_the_process_alive(ctx: Ctx) {
    let process = spawn_cat(&ctx).await;
    let writer = process.stdin_writer();
    let (_, text) = read_until_output_contains(&process, "\n").await;
    let pid = common::pid_after(&text, "pid-");
    writer.write(b"x", "w1").await.expect("write");
    drop(process);
    procfs::wait_gone(pid).await;
    assert_eq!(
        writer.write(b"late", "w2").await.expect("answered"),
        WriteStatus::Exited
    );
}

/// In lossless mode only the owner consumes: an observer reading as fast
/// as it can never makes the owner lose output.
async fn an_observer_consumes_nothing_in_lossless_mode(ctx: Ctx) {
    let mut head = capexec::client::Command::new("head");
    head.args(["-c", "3145728", "/dev/zero"])
        .flow(capexec::model::Flow::Lossless);
    let process = head.spawn(&ctx.executor).await.expect("start");
    let view = process.observer();
    let watching = tokio::task::spawn_local(async move {
        let mut events = view.events(0).await.expect("subscribe");
        while let Some(batch) = events.next_batch().await {
            let batch = batch.expect("events");
            if matches!(batch.last().map(|e| &e.body), Some(EventBody::Closed)) {
                return;
            }
        }
    });
    let events = common::read_until_closed(&process).await;
    assert!(
        !events
            .iter()
            .any(|e| matches!(e.body, EventBody::Gap { .. })),
        "the owner lost output"
    );
    assert_eq!(output_bytes(&events, None).len(), 3 << 20);
    watching.await.expect("the observer saw the end");
}

/// A writer's write ids are its own: the same id from the owner is a new
/// write, not a repeat.
async fn a_stdin_writer_has_its_own_write_ids(ctx: Ctx) {
    let process = spawn_cat(&ctx).await;
    let writer = process.stdin_writer();
    writer
        .write(b"from the writer\n", "stdin-1")
        .await
        .expect("write");
    process
        .write(b"from the owner\n", "stdin-1")
        .await
        .expect("write");
    process.close_stdin().await.expect("close");
    let events = common::read_until_closed(&process).await;
    assert!(
        output_bytes(&events, None).ends_with(b"from the writer\nfrom the owner\n"),
        "{:?}",
        String::from_utf8_lossy(&output_bytes(&events, None))
    );
}

backend_tests!(
    a_stdin_writer_has_its_own_write_ids,
    an_observer_consumes_nothing_in_lossless_mode,
    an_observer_reads_but_cannot_act,
    an_observer_does_not_keep_the_process_alive,
    a_stdin_writer_only_feeds,
    a_stdin_writer_does_not_keep_the_process_alive,
);
