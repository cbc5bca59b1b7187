//! Surviving a broken connection: detachable processes, restore, and the
//! resilient client handle, through a proxy that cuts and restores
//! connections. Every body runs against the Unix, TCP and chained backends.

use crate::common;

use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use capexec::client::{self, Command, Connect, Error, ResilientProcess, Session, Stdin};
use capexec::model::{Event, EventBody, ExitStatus, RefusalKind, WriteStatus};
use capexec::net::{Address, Token};
use common::data::TempDir;
use common::proxy::Proxy;
use common::{Ctx, output_bytes, pid_after, procfs, read_until_output_contains, sh};

const GRACE: Duration = Duration::from_secs(30);

/// Connects to `address` afresh each time, as a recovering client does.
fn connector(address: Address, token: Option<Token>) -> Connect {
    Rc::new(move || {
        let (address, token) = (address.clone(), token.clone());
        Box::pin(async move {
            let connection = capexec::net::connect(&address, token.as_ref())
                .await
                .map_err(|error| Error::Connect(error.to_string()))?;
            Ok(Session::new(
                connection.executor(),
                Some(Box::new(connection)),
            ))
        })
    })
}

async fn proxy_for(ctx: &Ctx, dir: &TempDir) -> Proxy {
    let address = ctx.address.clone().expect("a network backend");
    Proxy::in_front_of(&address, dir.path(), Duration::ZERO)
        .await
        .expect("start the proxy")
}

async fn resilient(command: &Command, connect: Connect) -> ResilientProcess {
    let (process, started) = ResilientProcess::spawn(command, connect, GRACE)
        .await
        .expect("connect");
    started.await.expect("start");
    process
}

/// Reads (through the resilient handle) until the output contains
/// `needle`; returns the last seq read and the text.
async fn read_until(process: &ResilientProcess, needle: &str) -> (u64, String) {
    let (mut after, mut text) = (0, String::new());
    while !text.contains(needle) {
        let outcome = process
            .read(after, 0, Duration::from_secs(10))
            .await
            .expect("read");
        assert!(!outcome.closed, "closed without {needle:?}: {text:?}");
        after = outcome.next_seq - 1;
        text.push_str(&String::from_utf8_lossy(&output_bytes(
            &outcome.events,
            None,
        )));
    }
    (after, text)
}

async fn wait_for_file(path: &Path) {
    common::eventually_async(&format!("{} exists", path.display()), async || {
        path.exists()
    })
    .await
}

/// The reference scenario: `ready`, a cut, `during` while cut, a read that
/// waits for the recovery, a write after it, and the rest of the events
/// with contiguous seqs, all from the same process.
async fn recovers_after_a_transport_disconnect(ctx: Ctx) {
    let dir = TempDir::new("recovery");
    let proxy = proxy_for(&ctx, &dir).await;
    let (go, said) = (dir.path().join("go"), dir.path().join("said"));
    let mut command = sh(&format!(
        "echo ready:$$; while [ ! -e {go} ]; do sleep 0.01; done; echo during:$$; : > {said}; \
         read line; echo after:$$:$line; exit 7",
        go = go.display(),
        said = said.display()
    ));
    command.stdin(Stdin::Piped);
    let process = resilient(
        &command,
        connector(proxy.address().clone(), ctx.token.clone()),
    )
    .await;
    let (ready_seq, text) = read_until(&process, "ready:").await;
    let pid = text.trim().trim_start_matches("ready:").to_string();

    proxy.cut();
    std::fs::write(&go, b"").expect("let it go on");
    wait_for_file(&said).await;
    let reading = tokio::task::spawn_local({
        let process = process.clone();
        async move { process.read(ready_seq, 0, Duration::from_secs(30)).await }
    });
    // Not a synchronisation: with the connection cut, nothing can answer.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!reading.is_finished(), "a read answered during the outage");
    proxy.restore();
    let during = reading.await.expect("task").expect("read after recovery");
    assert_eq!(during.events.len(), 1, "{:?}", during.events);
    assert_eq!(during.events[0].seq, ready_seq + 1);
    assert_eq!(
        output_bytes(&during.events, None),
        format!("during:{pid}\n").into_bytes()
    );

    assert_eq!(
        process.write(b"hello\n", "hello-1").await.expect("write"),
        WriteStatus::Accepted
    );
    let mut events = process.events(ready_seq + 1);
    let mut rest: Vec<Event> = Vec::new();
    while let Some(batch) = events.next_batch().await {
        rest.extend(batch.expect("events"));
    }
    let seqs: Vec<u64> = rest.iter().map(|event| event.seq).collect();
    let first = ready_seq + 2;
    assert_eq!(seqs, (first..first + seqs.len() as u64).collect::<Vec<_>>());
    assert_eq!(
        output_bytes(&rest, None),
        format!("after:{pid}:hello\n").into_bytes()
    );
    let tail: Vec<&EventBody> = rest.iter().rev().take(2).map(|e| &e.body).collect();
    assert!(matches!(tail[0], EventBody::Closed), "{rest:?}");
    assert!(
        matches!(tail[1], EventBody::Exited(exit) if exit.status == ExitStatus::Code(7)),
        "{rest:?}"
    );
}

/// A write whose answer was lost with the connection is sent again with
/// the same id after the recovery, and applied once.
async fn a_write_retried_after_a_cut_lands_once(ctx: Ctx) {
    let dir = TempDir::new("retried-write");
    let proxy = proxy_for(&ctx, &dir).await;
    let file = dir.path().join("stdin-copy");
    let mut command = sh(&format!("cat > {}", file.display()));
    command.stdin(Stdin::Piped);
    let process = resilient(
        &command,
        connector(proxy.address().clone(), ctx.token.clone()),
    )
    .await;
    proxy.set_open(false);
    let write = process.write_in_order(b"once\n", "once-1");
    // Applied by the server; its answer is held in the proxy, then lost.
    common::eventually_async("the server applies the write", async || {
        std::fs::read(&file).is_ok_and(|bytes| bytes == b"once\n")
    })
    .await;
    proxy.cut();
    proxy.set_open(true);
    proxy.restore();
    assert_eq!(write.outcome().await.expect("write"), WriteStatus::Accepted);
    process.close_stdin().await.expect("close stdin");
    let mut events = process.events(0);
    while let Some(batch) = events.next_batch().await {
        batch.expect("events");
    }
    assert_eq!(std::fs::read(&file).expect("copy"), b"once\n");
}

/// Nobody restores it: the process is terminated when the grace ends, and
/// its token is then unknown.
async fn the_grace_ends_and_the_process_with_it(ctx: Ctx) {
    let address = ctx.address.clone().expect("network");
    let connection = capexec::net::connect(&address, ctx.token.as_ref())
        .await
        .expect("connect");
    let process = sh("echo pid-$$-; exec sleep 1000")
        .spawn(&connection.executor())
        .await
        .expect("start");
    let token = process
        .detachable(Duration::from_secs(1))
        .await
        .expect("detachable");
    let (_, text) = read_until_output_contains(&process, "-\n").await;
    let pid = pid_after(&text, "pid-");
    drop(process);
    drop(connection);
    procfs::wait_gone(pid).await;
    let again = capexec::net::connect(&address, ctx.token.as_ref())
        .await
        .expect("connect again");
    let (_, restored) = client::restore(&again.executor(), &token);
    match restored.await {
        Err(Error::Refused(error)) => assert_eq!(error.kind, RefusalKind::UnknownToken),
        other => panic!("expected an unknown token, got {other:?}"),
    }
}

/// A server that accepts the new connection but never answers cannot hold
/// the recovery past the grace: the handle gives up with the reason.
async fn a_recovery_without_answers_gives_up_at_the_grace(ctx: Ctx) {
    let dir = TempDir::new("silent-recovery");
    let proxy = proxy_for(&ctx, &dir).await;
    let grace = Duration::from_secs(2);
    let (process, started) = ResilientProcess::spawn(
        &sh("exec sleep 1000"),
        connector(proxy.address().clone(), ctx.token.clone()),
        grace,
    )
    .await
    .expect("connect");
    started.await.expect("start");
    proxy.set_open(false);
    proxy.cut();
    proxy.restore();
    let outcome = tokio::time::timeout(Duration::from_secs(60), process.info())
        .await
        .expect("the recovery gave up in bounded time");
    match outcome {
        Err(Error::Recovery { failure, .. }) => {
            assert_eq!(
                failure.to_string(),
                "gave up after 2 s: no answer from the server"
            );
        }
        other => panic!("expected a failed recovery, got {other:?}"),
    }
    proxy.set_open(true);
}

async fn a_wrong_token_is_a_clear_error(ctx: Ctx) {
    let (_, restored) = client::restore(&ctx.executor, "not-a-token");
    match restored.await {
        Err(Error::Refused(error)) => {
            assert_eq!(error.kind, RefusalKind::UnknownToken);
            assert_eq!(
                error.message,
                "no process has this restore token (it never existed, it was not restored \
                 within its grace period, or it finished longer ago than the server keeps \
                 finished processes)"
            );
        }
        other => panic!("expected an unknown token, got {other:?}"),
    }
}

/// A process that finished while its owner was away is still restorable,
/// with its output and exit status; so is one whose owner is still
/// connected (the server may not have noticed the old connection died).
async fn a_finished_process_is_restored_with_its_output(ctx: Ctx) {
    let address = ctx.address.clone().expect("network");
    let first = capexec::net::connect(&address, ctx.token.as_ref())
        .await
        .expect("connect");
    let process = sh("echo done; exit 3")
        .spawn(&first.executor())
        .await
        .expect("start");
    let token = process.detachable(GRACE).await.expect("detachable");
    common::wait_closed_at_head(&process).await;

    let second = capexec::net::connect(&address, ctx.token.as_ref())
        .await
        .expect("connect");
    let (shared, restored) = client::restore(&second.executor(), &token);
    restored.await.expect("restore while still held");
    assert_eq!(
        shared.info().await.expect("info").pid,
        process.info().await.expect("info").pid
    );
    drop((shared, process, first));

    let third = capexec::net::connect(&address, ctx.token.as_ref())
        .await
        .expect("connect");
    let (restored_process, restored) = client::restore(&third.executor(), &token);
    restored.await.expect("restore after the end");
    let events = common::read_until_closed(&restored_process).await;
    assert_eq!(output_bytes(&events, None), b"done\n");
    assert_eq!(common::exit_of(&events), Some(ExitStatus::Code(3)));
    common::assert_contiguous(&events);
}

/// A command run to completion without a resilient handle, whose
/// connection is cut: `output` and `status` fail with the connection's
/// own loss (Disconnected), not only with "the events ended".
async fn a_plain_command_cut_off_fails_with_the_connection_s_loss(ctx: Ctx) {
    let dir = TempDir::new("plain-cut");
    let proxy = proxy_for(&ctx, &dir).await;
    for collect_output in [true, false] {
        let connection = capexec::net::connect(proxy.address(), ctx.token.as_ref())
            .await
            .expect("connect through the proxy");
        let executor = connection.executor();
        let started = dir.path().join(format!("started-{collect_output}"));
        let command = sh(&format!(
            ": > {started}; exec sleep 600",
            started = started.display()
        ));
        let running = tokio::task::spawn_local(async move {
            if collect_output {
                command.output(&executor).await.map(|_| ())
            } else {
                command.status(&executor).await.map(|_| ())
            }
        });
        wait_for_file(&started).await;
        proxy.cut();
        let error = running
            .await
            .expect("task")
            .expect_err("a cut connection fails the command");
        assert!(
            matches!(&error, Error::Rpc(error) if error.kind == capnp::ErrorKind::Disconnected),
            "output: {collect_output}: {error:?}"
        );
        proxy.restore();
        drop(connection);
    }
}

backend_tests!(
    on [unix, tcp, chained]:
    recovers_after_a_transport_disconnect,
    a_write_retried_after_a_cut_lands_once,
    the_grace_ends_and_the_process_with_it,
    a_recovery_without_answers_gives_up_at_the_grace,
    a_wrong_token_is_a_clear_error,
    a_finished_process_is_restored_with_its_output,
    a_plain_command_cut_off_fails_with_the_connection_s_loss,
);

/// The link that breaks is inside the chain (A -> B), not the client's:
/// B parks the process, and the client restores it through A, which
/// reconnects to B.
#[test]
fn a_break_inside_a_chain_is_recovered_too() {
    common::run_local(async {
        let dir = TempDir::new("inner-break");
        let far = common::server::ServerThread::start(false);
        let link = Proxy::in_front_of(&far.address, dir.path(), Duration::ZERO)
            .await
            .expect("proxy");
        let front = common::server::ServerThread::start_forwarding(
            TempDir::new("front"),
            vec![Address::Unix(dir.path().join("front.sock"))],
            vec![capexec::net::UpstreamConfig::new(
                "b",
                link.address().clone(),
                None,
            )],
            Some("b"),
        );
        let go = dir.path().join("go");
        let mut command = sh(&format!(
            "echo ready:$$; while [ ! -e {} ]; do sleep 0.01; done; echo after:$$",
            go.display()
        ));
        command.stdin(Stdin::Null);
        let process = resilient(&command, connector(front.address.clone(), None)).await;
        let (ready_seq, text) = read_until(&process, "ready:").await;
        let pid = text.trim().trim_start_matches("ready:").to_string();

        link.cut();
        std::fs::write(&go, b"").expect("go on");
        let rest = tokio::task::spawn_local({
            let process = process.clone();
            async move {
                let mut events = process.events(ready_seq);
                let mut all = Vec::new();
                while let Some(batch) = events.next_batch().await {
                    all.extend(batch.expect("events"));
                }
                all
            }
        });
        link.restore();
        let rest = rest.await.expect("task");
        assert_eq!(rest[0].seq, ready_seq + 1);
        assert_eq!(
            output_bytes(&rest, None),
            format!("after:{pid}\n").into_bytes()
        );
        assert!(matches!(
            rest.last().map(|e| &e.body),
            Some(EventBody::Closed)
        ));
    });
}
