//! A client on the server's machine hands its own descriptors to a start
//! (`StartParams.passedStdio`): the child reads and writes them itself,
//! and neither the client nor the server keeps a copy, so a reader of the
//! child's output sees its end as soon as the child is done. Where they
//! cannot be taken (a chain forwards the start to another machine, a
//! restricted executor, a directory among them) the start has pipes as
//! usual, with the same bytes, and the descriptors are closed. TCP offers
//! no route for descriptors at all.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;

use capexec::client::{self, Command, Stdin, StdioHandoff};
use capexec::model::{EventBody, ExitStatus, OutputStream, Policy, Sandbox, WriteStatus};

use crate::common::{self, Backend, Ctx, read_until_closed, sh};

/// A pipe: the end we keep (as a file) and the end we hand over.
fn pipe() -> (std::fs::File, OwnedFd) {
    let (read, write) = std::io::pipe().expect("pipe");
    (OwnedFd::from(read).into(), OwnedFd::from(write))
}

/// Everything that comes out of `file` until every writer has closed it.
async fn drained(mut file: std::fs::File) -> Vec<u8> {
    tokio::task::spawn_blocking(move || {
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).expect("read");
        bytes
    })
    .await
    .expect("reader")
}

/// The relayed output of a closed process, by stream, and its status.
fn relayed(events: &[capexec::model::Event]) -> (Vec<u8>, Vec<u8>, Option<ExitStatus>) {
    let (mut stdout, mut stderr, mut status) = (Vec::new(), Vec::new(), None);
    for event in events {
        match &event.body {
            EventBody::Output {
                stream: OutputStream::Stderr,
                data,
            } => stderr.extend_from_slice(data),
            EventBody::Output { data, .. } => stdout.extend_from_slice(data),
            EventBody::Exited(exit) => status = Some(exit.status),
            _ => {}
        }
    }
    (stdout, stderr, status)
}

async fn a_start_on_this_machine_uses_the_descriptors_it_is_handed(ctx: Ctx) {
    let route = ctx.stdio_route.clone().expect("a route for descriptors");
    let (stdin_read, stdin_write) = std::io::pipe().expect("pipe");
    let mut stdin_write = std::fs::File::from(OwnedFd::from(stdin_write));
    let (stdout_read, stdout_write) = pipe();
    let (stderr_read, stderr_write) = pipe();
    let handoff = StdioHandoff::new(
        route,
        Some(OwnedFd::from(stdin_read)),
        Some(stdout_write),
        Some(stderr_write),
    );
    let mut command = sh("cat; echo err >&2; exit 3");
    command.stdin(Stdin::Piped).pass_stdio(handoff.clone());
    let process = common::spawn(&ctx, &command).await;
    // A chain's front server cannot take them to the far end's machine.
    let taken = ctx.backend != Backend::Chained;
    assert_eq!(handoff.taken(), taken);
    if taken {
        stdin_write.write_all(b"to the child\n").expect("write");
        // A handed stdin is the child's alone.
        assert_eq!(
            process.write(b"not piped", "w0").await.expect("write"),
            WriteStatus::StdinClosed
        );
    } else {
        process.write(b"to the child\n", "w1").await.expect("write");
        process.close_stdin().await.expect("close stdin");
    }
    drop(stdin_write);
    let events = read_until_closed(&process).await;
    let (relayed_out, relayed_err, status) = relayed(&events);
    assert_eq!(status, Some(ExitStatus::Code(3)));
    // Only the child held our pipes: they end with it, on every backend.
    let direct = (drained(stdout_read).await, drained(stderr_read).await);
    let expected = (b"to the child\n".to_vec(), b"err\n".to_vec());
    if taken {
        assert_eq!(direct, expected);
        assert_eq!((relayed_out, relayed_err), (Vec::new(), Vec::new()));
    } else {
        assert_eq!((relayed_out, relayed_err), expected);
        assert_eq!(direct, (Vec::new(), Vec::new()));
    }
}

/// The start runs with pipes, its output relayed, and the pipe handed
/// over is closed: `reader` sees its end with nothing in it.
async fn started_with_pipes(
    executor: &capexec::capexec_capnp::executor::Client,
    handoff: StdioHandoff,
    reader: std::fs::File,
) {
    let mut command = Command::new("sh");
    command
        .args(["-c", "echo relayed"])
        .pass_stdio(handoff.clone());
    let process = command.spawn(executor).await.expect("start");
    assert!(!handoff.taken());
    let (stdout, _, status) = relayed(&read_until_closed(&process).await);
    assert_eq!(
        (stdout, status),
        (b"relayed\n".to_vec(), Some(ExitStatus::Code(0)))
    );
    assert_eq!(drained(reader).await, b"");
}

async fn descriptors_a_start_may_not_take_are_closed_and_it_has_pipes(ctx: Ctx) {
    let route = ctx.stdio_route.clone().expect("a route for descriptors");

    // A restricted executor's rules see programs and paths, not what a
    // descriptor reaches: it takes none.
    let restricted = client::restrict(&ctx.executor, &Policy::default());
    let (reader, writer) = pipe();
    let handoff = StdioHandoff::new(route.clone(), None, Some(writer), None);
    started_with_pipes(&restricted, handoff, reader).await;

    // A directory is no standard descriptor (a confined child could open
    // paths under it): none of the three is taken.
    let directory = std::fs::File::open("/").expect("open /");
    let (reader, writer) = pipe();
    let handoff = StdioHandoff::new(route, Some(directory.into()), Some(writer), None);
    started_with_pipes(&ctx.executor, handoff, reader).await;
}

/// A sandboxed child gets no socket of ours: through it, it could reach
/// (or be sent) what its sandbox denies it. A pipe it gets.
async fn a_sandboxed_start_takes_pipes_but_no_socket(ctx: Ctx) {
    let route = ctx.stdio_route.clone().expect("a route for descriptors");
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("socketpair");
    let handoff = StdioHandoff::new(route.clone(), None, Some(theirs.into()), None);
    let mut command = sh("echo relayed");
    command
        .sandbox(Sandbox::default())
        .pass_stdio(handoff.clone());
    let process = common::spawn(&ctx, &command).await;
    assert!(!handoff.taken());
    let (stdout, _, status) = relayed(&read_until_closed(&process).await);
    assert_eq!(
        (stdout, status),
        (b"relayed\n".to_vec(), Some(ExitStatus::Code(0)))
    );
    let ours = std::fs::File::from(OwnedFd::from(ours));
    assert_eq!(drained(ours).await, b"", "closed by the server");

    let (reader, writer) = pipe();
    let handoff = StdioHandoff::new(route, None, Some(writer), None);
    let mut command = sh("echo handed");
    command
        .sandbox(Sandbox::default())
        .pass_stdio(handoff.clone());
    let process = common::spawn(&ctx, &command).await;
    assert!(handoff.taken());
    read_until_closed(&process).await;
    assert_eq!(drained(reader).await, b"handed\n");
}

/// Descriptors no start took are closed when the connection ends, even
/// while a process it started is held on (detachable, for its grace).
async fn descriptors_no_start_took_are_closed_with_the_connection(ctx: Ctx) {
    let connection = ctx.connect_again().await.expect("a second connection");
    let route = connection.stdio_route().expect("a Unix socket's route");
    let (reader, writer) = pipe();
    route.hand_over(vec![writer]);
    // Any call carries them; nothing takes them.
    client::info(&connection.executor()).await.expect("info");
    let process = sh("sleep 60")
        .spawn(&connection.executor())
        .await
        .expect("start");
    process
        .detachable(std::time::Duration::from_secs(60))
        .await
        .expect("detachable");
    drop(process);
    drop(connection);
    // Its reader sees the end once the server has closed its copy; the
    // parked process holds the connection's quota, not its descriptors.
    let ended = tokio::time::timeout(std::time::Duration::from_secs(20), drained(reader)).await;
    assert_eq!(ended.expect("closed when the connection ended"), b"");
}

/// A start that names descriptors its client never sent (forged numbers,
/// over any transport, one at the end of the number range) takes none
/// and runs with pipes, its output relayed.
async fn a_start_naming_descriptors_never_sent_has_pipes(ctx: Ctx) {
    for first in [0, 3, u64::MAX] {
        let mut spec = capexec::model::StartSpec::new(["sh", "-c", "echo piped"]);
        spec.passed_stdio = Some(capexec::model::PassedStdio {
            first,
            stdin: true,
            stdout: true,
            stderr: true,
        });
        let mut request = ctx.executor.start_request();
        capexec::wire::start_spec_to_wire(&spec, request.get().init_params());
        let response = request.send().promise.await.expect("start");
        let answer = response.get().expect("answer");
        assert!(!answer.get_stdio_passed(), "first {first}");
        let process =
            capexec::client::RemoteProcess::from_capability(answer.get_process().expect("process"));
        let (stdout, _, status) = relayed(&read_until_closed(&process).await);
        assert_eq!(
            (stdout, status),
            (b"piped\n".to_vec(), Some(ExitStatus::Code(0))),
            "first {first}"
        );
    }
}

backend_tests!(on [in_process, unix]:
    a_start_on_this_machine_uses_the_descriptors_it_is_handed,
    descriptors_a_start_may_not_take_are_closed_and_it_has_pipes,
    a_sandboxed_start_takes_pipes_but_no_socket,
    a_start_naming_descriptors_never_sent_has_pipes,
);
backend_tests!(on [tcp]: a_start_naming_descriptors_never_sent_has_pipes);
/// Only a Unix socket's connection can end with descriptors in it.
#[test]
fn descriptors_no_start_took_are_closed_with_their_unix_connection() {
    common::run(
        Backend::Unix,
        descriptors_no_start_took_are_closed_with_the_connection,
    );
}
backend_tests!(on [chained]:
    a_start_on_this_machine_uses_the_descriptors_it_is_handed,
    a_start_naming_descriptors_never_sent_has_pipes,
);
