//! The process contract: every test body here runs against every executor
//! backend (see `backend_tests!` at the bottom).

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;

use capexec::client::{Command, Error, Stdin};
use capexec::model::{
    Event, EventBody, ExitStatus, Flow, OutputStream, RefusalKind, Signal, WriteStatus,
};
use common::data::{PatternChecker, TempDir, write_pattern_file};
use common::{
    Ctx, assert_contiguous, exit_of, output_bytes, procfs, read_from, read_until_closed,
    read_until_output_contains, sh, spawn, wait_closed_at_head, without_usage,
};

fn output(seq: u64, stream: OutputStream, data: &'static str) -> Event {
    Event {
        seq,
        body: EventBody::Output {
            stream,
            data: Bytes::from_static(data.as_bytes()),
        },
    }
}

async fn starts_and_exits_zero(ctx: Ctx) {
    let process = spawn(&ctx, &Command::new("true")).await;
    let events = read_until_closed(&process).await;
    assert_eq!(
        without_usage(events),
        vec![
            Event {
                seq: 1,
                body: EventBody::Exited(ExitStatus::Code(0).into())
            },
            Event {
                seq: 2,
                body: EventBody::Closed
            },
        ]
    );
    assert_eq!(process.wait().await.expect("wait"), ExitStatus::Code(0));
}

async fn streamed_output_is_collected_by_read(ctx: Ctx) {
    let process = spawn(&ctx, &sh("sleep 0.05; printf 'session output\\n'")).await;
    let events = read_until_closed(&process).await;
    assert_eq!(output_bytes(&events, None), b"session output\n");
    assert_eq!(exit_of(&events), Some(ExitStatus::Code(0)));
    assert_contiguous(&events);
}

/// Output 1 stdout, output 2 stderr, exited 3 with code 7, closed 4. The
/// child waits for the test to have seen "out" before it writes "err", so
/// the order does not depend on scheduling.
async fn events_arrive_in_exact_order(ctx: Ctx) {
    let mut command = sh("printf out; read _go; printf err >&2; exit 7");
    command.stdin(Stdin::Piped);
    let process = spawn(&ctx, &command).await;
    let mut events = process.events(0).await.expect("subscribe");
    let first = events.next().await.expect("an event").expect("event");
    assert_eq!(first, output(1, OutputStream::Stdout, "out"));
    assert_eq!(
        process.write(b"\n", "go").await.expect("write"),
        WriteStatus::Accepted
    );
    let mut rest = Vec::new();
    while let Some(event) = events.next().await {
        rest.push(event.expect("event"));
    }
    assert_eq!(
        without_usage(rest),
        vec![
            output(2, OutputStream::Stderr, "err"),
            Event {
                seq: 3,
                body: EventBody::Exited(ExitStatus::Code(7).into())
            },
            Event {
                seq: 4,
                body: EventBody::Closed
            },
        ]
    );
}

async fn subscription_after_close_replays_everything(ctx: Ctx) {
    let process = spawn(&ctx, &sh("printf 'late one\\n'; printf 'late two\\n' >&2")).await;
    let read = read_until_closed(&process).await;
    assert_eq!(
        output_bytes(&read, Some(OutputStream::Stdout)),
        b"late one\n"
    );
    assert_eq!(
        output_bytes(&read, Some(OutputStream::Stderr)),
        b"late two\n"
    );
    let replayed: Vec<Event> = process
        .events(0)
        .await
        .expect("subscribe")
        .map(|event| event.expect("event"))
        .collect()
        .await;
    assert_eq!(replayed, read);
    // A subscription from the middle replays only what follows.
    let tail: Vec<Event> = process
        .events(read[0].seq)
        .await
        .expect("subscribe")
        .map(|event| event.expect("event"))
        .collect()
        .await;
    assert_eq!(tail, read[1..]);
}

/// A grandchild keeps stdout open after the child exits: its late output
/// gets the seq after the exit, and the close comes only when it is done.
async fn output_after_exit_is_kept_until_streams_close(ctx: Ctx) {
    let dir = TempDir::new("late");
    let go = dir.path().join("go");
    let script =
        "(while [ ! -e \"$1\" ]; do sleep 0.01; done; printf 'late output after exit\\n') & exit 0";
    let mut command = sh(script);
    command.arg("sh").arg(&go);
    let process = spawn(&ctx, &command).await;

    let first = process
        .read(0, 0, Duration::from_secs(20))
        .await
        .expect("read");
    assert_eq!(
        without_usage(first.events),
        vec![Event {
            seq: 1,
            body: EventBody::Exited(ExitStatus::Code(0).into())
        }]
    );
    assert_eq!(
        first.exit.map(|exit| exit.status),
        Some(ExitStatus::Code(0))
    );
    assert!(!first.closed, "the grandchild still holds stdout");
    let quiet = process
        .read(1, 0, Duration::from_millis(50))
        .await
        .expect("read");
    assert!(quiet.events.is_empty() && !quiet.closed);

    std::fs::write(&go, b"").expect("release the grandchild");
    let rest = read_from(&process, 1).await;
    assert_eq!(
        rest,
        vec![
            output(2, OutputStream::Stdout, "late output after exit\n"),
            Event {
                seq: 3,
                body: EventBody::Closed
            },
        ]
    );
}

async fn write_then_read_with_pipe_stdin(ctx: Ctx) {
    let mut command = sh("IFS= read -r line; printf 'from-stdin:%s\\n' \"$line\"");
    command.stdin(Stdin::Piped);
    let process = spawn(&ctx, &command).await;
    assert_eq!(
        process.write(b"hello\n", "w-1").await.expect("write"),
        WriteStatus::Accepted
    );
    let events = read_until_closed(&process).await;
    assert_eq!(output_bytes(&events, None), b"from-stdin:hello\n");
    assert_eq!(exit_of(&events), Some(ExitStatus::Code(0)));
}

async fn write_without_pipe_stdin_is_refused_and_child_sees_eof(ctx: Ctx) {
    let dir = TempDir::new("no-stdin");
    let go = dir.path().join("go");
    // The child reads only once the test has written, so it is still running.
    let mut command = sh("while [ ! -e \"$1\" ]; do sleep 0.01; done; \
         if IFS= read -r line; then echo \"got:$line\"; else echo eof; fi");
    command.arg("sh").arg(&go);
    let process = spawn(&ctx, &command).await;
    assert_eq!(
        process.write(b"hello\n", "w-1").await.expect("write"),
        WriteStatus::StdinClosed
    );
    std::fs::write(&go, b"").expect("let the child read");
    let events = read_until_closed(&process).await;
    assert_eq!(output_bytes(&events, None), b"eof\n");
    // Once the process has exited, that is what a write reports.
    assert_eq!(
        process.write(b"late\n", "w-2").await.expect("write"),
        WriteStatus::Exited
    );
}

async fn duplicate_write_id_is_written_once(ctx: Ctx) {
    let mut command = sh("while IFS= read -r l; do printf 'line:%s\\n' \"$l\"; done");
    command.stdin(Stdin::Piped);
    let process = spawn(&ctx, &command).await;
    for (data, id) in [
        (&b"first\n"[..], "write-1"),
        (b"first\n", "write-1"),
        (b"second\n", "write-2"),
    ] {
        assert_eq!(
            process.write(data, id).await.expect("write"),
            WriteStatus::Accepted
        );
    }
    process.close_stdin().await.expect("close stdin");
    let events = read_until_closed(&process).await;
    assert_eq!(output_bytes(&events, None), b"line:first\nline:second\n");
    assert_eq!(exit_of(&events), Some(ExitStatus::Code(0)));
}

/// A retry of a write still in flight reports what became of that write,
/// and never claims success for bytes that did not arrive.
async fn retried_write_reports_the_first_writes_outcome(ctx: Ctx) {
    // The child never reads stdin, so a 4 MiB write cannot complete.
    let mut command = Command::new("sleep");
    command.arg("1000").stdin(Stdin::Piped);
    let process = spawn(&ctx, &command).await;
    let big = vec![b'x'; 4 << 20];
    let first = process.write_in_order(&big, "w");
    let retry = process.write_in_order(&big, "w");
    let quiet = tokio::time::timeout(Duration::from_millis(300), retry.outcome()).await;
    assert!(
        quiet.is_err(),
        "the retry answered while the write was pending: {quiet:?}"
    );
    assert!(process.terminate().await.expect("terminate"));
    let first = first.outcome().await.expect("first");
    assert!(first != WriteStatus::Accepted, "{first:?}");
    let again = process.write(b"y", "w").await.expect("third");
    assert!(again != WriteStatus::Accepted, "{again:?}");
}

/// Writes pile up no further than the queue bound behind a child that does
/// not read; the refusal says why.
async fn stdin_queue_is_bounded(ctx: Ctx) {
    let mut command = Command::new("sleep");
    command.arg("1000").stdin(Stdin::Piped);
    let process = spawn(&ctx, &command).await;
    let chunk = vec![b'x'; 4 << 20];
    let pending: Vec<_> = (0..4)
        .map(|n| process.write_in_order(&chunk, &format!("w{n}")))
        .collect();
    let error = process.write(&chunk, "w4").await.expect_err("queue full");
    assert!(error.to_string().contains("stdin queue full"), "{error}");
    assert!(process.terminate().await.expect("terminate"));
    for write in pending {
        let status = write.outcome().await.expect("outcome");
        assert!(status != WriteStatus::Accepted, "{status:?}");
    }
}

async fn empty_write_id_is_an_error(ctx: Ctx) {
    let mut command = Command::new("cat");
    command.stdin(Stdin::Piped);
    let process = spawn(&ctx, &command).await;
    let error = process.write(b"x", "").await.expect_err("empty id");
    assert!(
        error.to_string().contains("writeId must not be empty"),
        "{error}"
    );
    // The process is untouched by the bad call.
    assert_eq!(
        process.write(b"ok", "w").await.expect("write"),
        WriteStatus::Accepted
    );
    process.close_stdin().await.expect("close");
    assert_eq!(
        output_bytes(&read_until_closed(&process).await, None),
        b"ok"
    );
}

async fn close_stdin_gives_eof(ctx: Ctx) {
    let mut command = sh("cat; echo done");
    command.stdin(Stdin::Piped);
    let process = spawn(&ctx, &command).await;
    let pending: Vec<_> = (0..3)
        .map(|n| process.write_in_order(format!("{n}").as_bytes(), &format!("w{n}")))
        .collect();
    process.close_stdin().await.expect("close stdin");
    for write in pending {
        assert_eq!(write.outcome().await.expect("write"), WriteStatus::Accepted);
    }
    let events = read_until_closed(&process).await;
    assert_eq!(output_bytes(&events, None), b"012done\n");
    assert_eq!(
        process.write(b"more", "w9").await.expect("write"),
        WriteStatus::Exited
    );
    process.close_stdin().await.expect("closing twice is fine");
}

async fn interrupt_reaches_a_trap(ctx: Ctx) {
    let process = spawn(
        &ctx,
        &sh("trap 'exit 7' INT; echo ready; while :; do sleep 0.01; done"),
    )
    .await;
    let (after, _) = read_until_output_contains(&process, "ready\n").await;
    process.signal(Signal::Int).await.expect("signal");
    let events = read_from(&process, after).await;
    assert_eq!(exit_of(&events), Some(ExitStatus::Code(7)));
}

async fn signal_after_exit_is_a_no_op(ctx: Ctx) {
    let process = spawn(&ctx, &Command::new("true")).await;
    read_until_closed(&process).await;
    process
        .signal(Signal::Term)
        .await
        .expect("signal after exit");
    process
        .signal(Signal::Kill)
        .await
        .expect("signal after exit");
    assert_eq!(process.wait().await.expect("wait"), ExitStatus::Code(0));
}

async fn terminate_running_then_exited(ctx: Ctx) {
    let process = spawn(&ctx, &Command::new("sleep").arg("1000").clone()).await;
    assert!(process.terminate().await.expect("terminate"));
    let status = process.wait().await.expect("wait");
    assert_eq!(
        status,
        ExitStatus::Killed {
            signal: Some(Signal::Term),
            number: libc::SIGTERM,
            core_dumped: false
        }
    );
    assert!(!process.terminate().await.expect("terminate after exit"));
}

async fn terminate_kills_what_ignores_sigterm(ctx: Ctx) {
    let process = spawn(&ctx, &sh("trap '' TERM; echo ready; sleep 1000")).await;
    read_until_output_contains(&process, "ready\n").await;
    assert!(process.terminate().await.expect("terminate"));
    let status = process.wait().await.expect("wait");
    assert!(
        matches!(
            status,
            ExitStatus::Killed {
                signal: Some(Signal::Kill),
                ..
            }
        ),
        "{status:?}"
    );
}

async fn exit_status_keeps_signal_apart_from_code(ctx: Ctx) {
    let killed = spawn(&ctx, &sh("kill -USR1 $$")).await;
    assert_eq!(
        killed.wait().await.expect("wait"),
        ExitStatus::Killed {
            signal: Some(Signal::Usr1),
            number: libc::SIGUSR1,
            core_dumped: false
        }
    );
    let code = spawn(&ctx, &sh("exit 138")).await;
    assert_eq!(code.wait().await.expect("wait"), ExitStatus::Code(138));
}

/// 3 MiB into a 1 MiB log that nobody reads: the oldest output is evicted
/// and a read from the start says so explicitly, then returns exactly the
/// tail.
async fn byte_limit_evicts_with_an_explicit_gap(ctx: Ctx) {
    let dir = TempDir::new("evict");
    let file = dir.path().join("data");
    let len = 3 << 20;
    write_pattern_file(&file, 7, len);
    let mut command = Command::new("cat");
    command.arg(&file);
    let process = spawn(&ctx, &command).await;
    wait_closed_at_head(&process).await;

    let info = process.info().await.expect("info");
    assert!(info.retained_bytes <= 1 << 20, "{info:?}");
    assert!(info.peak_retained_bytes <= 1 << 20, "{info:?}");
    assert!(info.evicted_through_seq > 0, "{info:?}");
    let read = process.read(0, 0, Duration::ZERO).await.expect("read");
    let first = &read.events[0];
    assert_eq!(
        first.body,
        EventBody::Gap { from_seq: 1 },
        "a read from the start begins with the gap"
    );
    assert_eq!(first.seq, info.evicted_through_seq);
    assert_contiguous(&read.events);
    let tail = output_bytes(&read.events, None);
    assert!(tail.len() as u64 > (1 << 20) - 64 * 1024, "{}", tail.len());
    let expected = common::data::Pattern::bytes(7, len);
    assert_eq!(&tail[..], &expected[len - tail.len()..]);
    assert!(matches!(
        read.events.last().map(|e| &e.body),
        Some(EventBody::Closed)
    ));
}

/// Unread output of uneven chunks (`seq` writes lines of every length)
/// never makes the retained log hold more than its 1 MiB, not even for the
/// moment a new chunk comes in.
async fn the_retained_log_never_holds_more_than_its_bound(ctx: Ctx) {
    let mut command = Command::new("seq");
    command.args(["1", "400000"]).flow(Flow::Retain);
    let process = spawn(&ctx, &command).await;
    wait_closed_at_head(&process).await;
    let info = process.info().await.expect("info");
    assert!(
        info.evicted_through_seq > 0,
        "the output outgrew the log: {info:?}"
    );
    assert!(info.peak_retained_bytes <= 1 << 20, "{info:?}");
    assert!(
        info.peak_retained_bytes > (1 << 20) - 64 * 1024,
        "the log was nearly full: {info:?}"
    );
    assert!(info.retained_bytes <= info.peak_retained_bytes, "{info:?}");
}

/// A subscriber that stops acknowledging while 3 MiB go by gets a gap event
/// and then the rest, with every seq accounted for exactly once.
async fn lagging_subscriber_gets_a_gap(ctx: Ctx) {
    let dir = TempDir::new("lag");
    let file = dir.path().join("data");
    let len = 3 << 20;
    write_pattern_file(&file, 11, len);
    let mut command = Command::new("cat");
    command.arg(&file);
    let process = spawn(&ctx, &command).await;
    let mut events = process.events(0).await.expect("subscribe");
    // Not polling `events` makes the sink stop acknowledging.
    wait_closed_at_head(&process).await;
    let mut received = Vec::new();
    while let Some(event) = events.next().await {
        received.push(event.expect("event"));
    }
    assert_contiguous(&received);
    assert!(
        received
            .iter()
            .any(|event| matches!(event.body, EventBody::Gap { .. })),
        "a lagging subscriber must see a gap"
    );
    assert_eq!(exit_of(&received), Some(ExitStatus::Code(0)));
    assert!(matches!(
        received.last().map(|e| &e.body),
        Some(EventBody::Closed)
    ));
    // Whatever arrived after the last gap is exactly the end of the data.
    let last_gap = received
        .iter()
        .rposition(|event| matches!(event.body, EventBody::Gap { .. }))
        .expect("gap");
    let tail = output_bytes(&received[last_gap..], None);
    let expected = common::data::Pattern::bytes(11, len);
    assert_eq!(&tail[..], &expected[len - tail.len()..]);
}

/// Lossless mode: 256 MiB through a reader that takes 64 KiB per call
/// arrive intact, while the server never holds more than its window.
async fn lossless_keeps_every_byte_with_a_slow_reader(ctx: Ctx) {
    let dir = TempDir::new("lossless");
    let file = dir.path().join("data");
    // 64 MiB: 128 windows' worth, so the window fills and drains many times.
    let len: usize = 64 << 20;
    write_pattern_file(&file, 42, len);
    let mut command = Command::new("cat");
    command.arg(&file).flow(Flow::Lossless);
    let process = spawn(&ctx, &command).await;

    let mut checker = PatternChecker::new(42);
    let mut after = 0;
    let mut closed = false;
    let mut reads = 0u64;
    let mut most_unconsumed = 0;
    while !closed {
        reads += 1;
        if reads.is_multiple_of(16) {
            let info = process.info().await.expect("info");
            most_unconsumed = most_unconsumed.max(info.unconsumed_bytes);
        }
        let outcome = process
            .read(after, 64 * 1024, Duration::from_secs(10))
            .await
            .expect("read");
        for event in &outcome.events {
            match &event.body {
                EventBody::Output { data, .. } => checker.check(data),
                EventBody::Gap { .. } => panic!("lossless mode lost {event:?}"),
                EventBody::Exited(exit) => assert_eq!(exit.status, ExitStatus::Code(0)),
                EventBody::Closed => closed = true,
            }
        }
        after = outcome.next_seq - 1;
    }
    assert_eq!(checker.checked, len as u64);
    // The child was held back to the window (plus the one chunk read after
    // the window check), and was actually made to wait: a slower reader than
    // `cat` lets the window fill up.
    assert!(
        most_unconsumed <= 512 * 1024 + 64 * 1024,
        "the server held {most_unconsumed} unconsumed bytes"
    );
    assert!(
        most_unconsumed >= 256 * 1024,
        "the window never filled ({most_unconsumed} bytes): nothing was held back"
    );
}

/// Lossless mode: a child that exits with much output still in its pipe
/// (more than the window) loses none of it, and its exit event comes after
/// that output.
async fn lossless_exit_waits_for_output_written_before_it(ctx: Ctx) {
    let dir = TempDir::new("lossless-exit");
    let file = dir.path().join("data");
    let len: usize = 3 << 20;
    write_pattern_file(&file, 9, len);
    let mut command = Command::new("cat");
    command.arg(&file).flow(Flow::Lossless);
    let process = spawn(&ctx, &command).await;
    let pid = process.info().await.expect("info").pid;

    let mut checker = PatternChecker::new(9);
    let mut after = 0;
    let mut events = Vec::new();
    // Read slowly until the child is gone, leaving its last output in the
    // pipe and the log, then read the rest.
    loop {
        let outcome = process
            .read(after, 64 * 1024, Duration::from_secs(10))
            .await
            .expect("read");
        after = outcome.next_seq - 1;
        let closed = outcome.closed && outcome.events.iter().any(|e| e.body == EventBody::Closed);
        events.extend(outcome.events);
        if closed {
            break;
        }
        if procfs::state(pid).is_none() {
            events.extend(read_from(&process, after).await);
            break;
        }
    }
    assert_contiguous(&events);
    for event in &events {
        match &event.body {
            EventBody::Output { data, .. } => checker.check(data),
            EventBody::Gap { .. } => panic!("lossless mode lost {event:?}"),
            _ => {}
        }
    }
    assert_eq!(checker.checked, len as u64);
    let exit_index = events
        .iter()
        .position(|e| matches!(e.body, EventBody::Exited(_)))
        .expect("exit event");
    assert_eq!(exit_index, events.len() - 2, "the exit follows all output");
}

/// Dropping the last reference kills the whole tree, grandchild included,
/// and leaves no zombie.
async fn dropping_the_process_kills_the_tree(ctx: Ctx) {
    let process = spawn(&ctx, &sh("sleep 1000 & echo $!; wait")).await;
    let (_, text) = read_until_output_contains(&process, "\n").await;
    let grandchild: u32 = text.trim().parse().expect("grandchild pid");
    let child = process.info().await.expect("info").pid;
    assert!(procfs::state(child).is_some() && procfs::state(grandchild).is_some());
    drop(process);
    procfs::wait_gone(child).await;
    procfs::wait_gone(grandchild).await;
}

/// A write still waiting for room in stdin (the child never reads) does
/// not keep the process: dropping the last reference ends it all the same
/// (capnp-rpc patch 0009).
async fn a_pending_write_does_not_keep_a_dropped_process(ctx: Ctx) {
    let mut command = sh("echo ready; exec sleep 1000");
    command.stdin(Stdin::Piped);
    let process = spawn(&ctx, &command).await;
    read_until_output_contains(&process, "ready").await;
    let child = process.info().await.expect("info").pid;
    // More than a grown pipe holds: the last writes wait for room for ever.
    let chunk = vec![b'x'; 256 * 1024];
    let writes: Vec<_> = (0..8)
        .map(|n| process.write_in_order(&chunk, &format!("w{n}")))
        .collect();
    // Every write has reached the server before the reference goes.
    process.info().await.expect("info after the writes");
    drop(process);
    procfs::wait_gone(child).await;
    drop(writes);
}

async fn start_failures_are_clear_and_leave_nothing_behind(ctx: Ctx) {
    // Each attempt forks three times; a leak would cost a descriptor (or a
    // zombie) for each of its failures at the least, far above what tests
    // running beside it in this process can add meanwhile (a chained
    // backend's runtimes and sockets, a few live children: dozens).
    const ATTEMPTS: usize = 150;
    const NOISE: usize = 100;
    let fds_before = procfs::open_fds(ctx.server_pid);
    for _ in 0..ATTEMPTS {
        let missing = Command::new("capexec-no-such-program")
            .spawn(&ctx.executor)
            .await;
        match missing {
            Err(Error::Refused(error)) => {
                assert_eq!(error.kind, RefusalKind::ProgramNotFound);
                assert_eq!(error.message, "program not found: capexec-no-such-program");
            }
            other => panic!("expected a start error, got {:?}", other.map(|_| ())),
        }
        let mut bad_cwd = Command::new("true");
        bad_cwd.current_dir("/capexec/no/such/dir");
        match bad_cwd.spawn(&ctx.executor).await {
            Err(Error::Refused(error)) => {
                assert_eq!(error.kind, RefusalKind::BadCwd);
                assert_eq!(
                    error.message,
                    "working directory /capexec/no/such/dir: No such file or directory"
                );
            }
            other => panic!("expected a start error, got {:?}", other.map(|_| ())),
        }
        let mut empty = ctx.executor.start_request();
        empty.get().init_params().init_argv(0);
        let error = empty.send().promise.await.err().expect("empty argv fails");
        assert!(
            error
                .to_string()
                .contains("argv must not be empty [capexec:invalid-argument]"),
            "{error}"
        );
        let not_executable = Command::new("/etc/passwd").spawn(&ctx.executor).await;
        match not_executable {
            Err(Error::Refused(error)) => assert_eq!(error.kind, RefusalKind::PermissionDenied),
            other => panic!("expected a start error, got {:?}", other.map(|_| ())),
        }
    }
    let fds_after = procfs::open_fds(ctx.server_pid);
    assert!(
        fds_after < fds_before + NOISE,
        "descriptors grew from {fds_before} to {fds_after}"
    );
    assert!(procfs::zombie_children(ctx.server_pid) < NOISE / 4);
    // The executor still works.
    let process = spawn(&ctx, &Command::new("true")).await;
    assert_eq!(process.wait().await.expect("wait"), ExitStatus::Code(0));
}

async fn read_rejects_a_cursor_past_the_end(ctx: Ctx) {
    let process = spawn(&ctx, &Command::new("true")).await;
    read_until_closed(&process).await;
    let error = process
        .read(9, 0, Duration::ZERO)
        .await
        .expect_err("cursor past the end");
    assert!(
        error
            .to_string()
            .contains("afterSeq 9 is past the newest event of the process (2)"),
        "{error}"
    );
    let error = process
        .read(0, 0, Duration::from_millis(3_600_001))
        .await
        .expect_err("wait too long");
    assert!(
        error.to_string().contains("waitMs 3600001 exceeds"),
        "{error}"
    );
}

async fn environment_cwd_and_arg0_are_applied(ctx: Ctx) {
    let dir = TempDir::new("cwd");
    let mut command =
        sh("printf '%s|%s|%s|%s' \"$0\" \"$CAPEXEC_A\" \"${HOME-unset}\" \"$(pwd -P)\"");
    command
        .env_clear()
        .env("CAPEXEC_A", "one")
        .env("PATH", "/usr/bin:/bin")
        .current_dir(dir.path())
        .arg0("renamed");
    let output = command.output(&ctx.executor).await.expect("output");
    let cwd = std::fs::canonicalize(dir.path()).expect("canonical");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        format!("renamed|one|unset|{}", cwd.display())
    );
    let mut inherit = sh("printf %s \"${CAPEXEC_TEST_UNSET-gone}\"");
    inherit
        .env("CAPEXEC_TEST_UNSET", "x")
        .env_remove("CAPEXEC_TEST_UNSET");
    assert_eq!(
        inherit.output(&ctx.executor).await.expect("output").stdout,
        b"gone"
    );
}

async fn children_start_with_clean_signals_and_descriptors(ctx: Ctx) {
    // SigIgn/SigBlk of the child itself, and its open descriptors.
    let script = "grep -E '^Sig(Ign|Blk)' /proc/self/status; ls /proc/self/fd | wc -l";
    let output = sh(script).output(&ctx.executor).await.expect("output");
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    let mask = |name: &str| {
        let line = text.lines().find(|l| l.starts_with(name)).expect(name);
        u64::from_str_radix(line[name.len()..].trim(), 16).expect("hex mask")
    };
    assert_eq!(mask("SigIgn:"), 0, "{text}");
    assert_eq!(mask("SigBlk:"), 0, "{text}");
    // grep's own 0, 1, 2 and the directory ls reads.
    let fds: usize = text
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .expect("count");
    assert!(fds <= 4, "the child inherited descriptors: {text}");
    // It leads its own session and process group.
    let stat = sh("cat /proc/$$/stat")
        .output(&ctx.executor)
        .await
        .expect("output");
    let stat = String::from_utf8_lossy(&stat.stdout).to_string();
    let pid = stat.split_whitespace().next().expect("pid").to_string();
    let fields: Vec<&str> = stat[stat.rfind(')').expect("comm") + 1..]
        .split_whitespace()
        .collect();
    assert_eq!(
        (fields[2], fields[3]),
        (pid.as_str(), pid.as_str()),
        "{stat}"
    );
}

/// `closeOutput(stdout)` is a reader going away, as in a local pipeline:
/// the writer of stdout gets SIGPIPE, the rest of the command goes on, its
/// stderr and exit arrive, and the close no longer waits for stdout. A
/// stream of a terminal cannot be closed alone, nor by an observer.
async fn close_output_ends_only_the_writer_of_that_stream(ctx: Ctx) {
    let mut command = sh("yes; echo \"yes ended $?\" >&2; exit 0");
    command.flow(Flow::Lossless);
    let process = spawn(&ctx, &command).await;
    let (after, _) = common::read_until_output_contains(&process, "y\n").await;
    process
        .close_output(OutputStream::Stdout)
        .await
        .expect("close stdout");
    // Idempotent.
    process
        .close_output(OutputStream::Stdout)
        .await
        .expect("close stdout again");
    let events = read_from(&process, after).await;
    assert_eq!(
        output_bytes(&events, Some(OutputStream::Stderr)),
        b"yes ended 141\n"
    );
    assert_eq!(exit_of(&events), Some(ExitStatus::Code(0)));
    let refused = |outcome: Result<(), Error>| match outcome {
        Err(Error::Refused(refusal)) => refusal.kind,
        other => panic!("not refused: {other:?}"),
    };
    assert_eq!(
        refused(process.close_output(OutputStream::Pty).await),
        RefusalKind::InvalidArgument
    );
    assert_eq!(
        refused(process.observer().close_output(OutputStream::Stderr).await),
        RefusalKind::Forbidden
    );
}

backend_tests!(
    starts_and_exits_zero,
    streamed_output_is_collected_by_read,
    events_arrive_in_exact_order,
    subscription_after_close_replays_everything,
    output_after_exit_is_kept_until_streams_close,
    write_then_read_with_pipe_stdin,
    write_without_pipe_stdin_is_refused_and_child_sees_eof,
    duplicate_write_id_is_written_once,
    empty_write_id_is_an_error,
    retried_write_reports_the_first_writes_outcome,
    stdin_queue_is_bounded,
    close_stdin_gives_eof,
    interrupt_reaches_a_trap,
    signal_after_exit_is_a_no_op,
    terminate_running_then_exited,
    terminate_kills_what_ignores_sigterm,
    exit_status_keeps_signal_apart_from_code,
    byte_limit_evicts_with_an_explicit_gap,
    the_retained_log_never_holds_more_than_its_bound,
    lagging_subscriber_gets_a_gap,
    lossless_keeps_every_byte_with_a_slow_reader,
    lossless_exit_waits_for_output_written_before_it,
    dropping_the_process_kills_the_tree,
    a_pending_write_does_not_keep_a_dropped_process,
    start_failures_are_clear_and_leave_nothing_behind,
    read_rejects_a_cursor_past_the_end,
    environment_cwd_and_arg0_are_applied,
    children_start_with_clean_signals_and_descriptors,
    close_output_ends_only_the_writer_of_that_stream,
);
