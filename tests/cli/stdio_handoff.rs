//! `capexec run` on this machine (embedded, or over a Unix socket) hands
//! the command its own pipes and sockets, and a regular file as stdin: the
//! command reads and writes them itself, as a local child would. A file as
//! stdout, a terminal, `--relay-stdio` and TCP keep the relay, with the
//! same bytes.

use crate::common;

use std::os::fd::AsFd;
use std::process::{Command, Stdio};

use common::cli::{Served, capexec, finish, text, wait};
use common::data::{Pattern, TempDir};

/// The inode of the pipe behind `fd`.
fn inode(fd: impl AsFd) -> u64 {
    nix::sys::stat::fstat(fd).expect("fstat").st_ino
}

/// Runs `command` with its stdout a pipe and returns what it printed and
/// the inode of that pipe.
fn printed_through_our_pipe(mut command: Command) -> (String, u64) {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run capexec");
    let stdout = child.stdout.take().expect("stdout");
    let ours = inode(&stdout);
    let mut printed = String::new();
    std::io::Read::read_to_string(&mut { stdout }, &mut printed).expect("read");
    assert_eq!(wait(&mut child), 0);
    (printed, ours)
}

/// `readlink` of the command's stdout, and of its stdin.
const WHERE: &[&str] = &["--", "sh", "-c", "readlink /proc/self/fd/1 /proc/self/fd/0"];

fn args<'a>(first: &[&'a str]) -> Vec<&'a str> {
    let mut args = first.to_vec();
    args.extend_from_slice(WHERE);
    args
}

#[test]
fn a_command_here_writes_into_our_pipe_itself() {
    let served = Served::start();
    let handed: [Command; 2] = [
        capexec(&args(&["run"])),
        served.run(&args(&["--connect", &served.unix])),
    ];
    for command in handed {
        let (printed, ours) = printed_through_our_pipe(command);
        let stdout = printed.lines().next().unwrap_or_default();
        assert_eq!(stdout, format!("pipe:[{ours}]"), "{printed}");
    }
    let token = served.token_arg();
    let relayed: [Command; 3] = [
        capexec(&args(&["run", "--relay-stdio"])),
        served.run(&args(&["--connect", &served.unix, "--relay-stdio"])),
        served.run(&args(&["--connect", &served.tcp, "--token-file", &token])),
    ];
    for command in relayed {
        let (printed, ours) = printed_through_our_pipe(command);
        let stdout = printed.lines().next().unwrap_or_default();
        assert!(stdout.starts_with("pipe:["), "{printed}");
        assert_ne!(stdout, format!("pipe:[{ours}]"), "a pipe of the server's");
    }
}

/// A regular file is handed as stdin; as stdout it is relayed, so that a
/// full disk still ends the run with capexec's own line (`output.rs`).
#[test]
fn a_file_is_handed_as_stdin_and_relayed_as_stdout() {
    let dir = TempDir::new("handoff-files");
    let input = dir.path().join("input");
    std::fs::write(&input, b"from a file\n").expect("write");
    let output = dir.path().join("output");
    let mut command = capexec(&args(&["run"]));
    command
        .stdin(std::fs::File::open(&input).expect("open"))
        .stdout(std::fs::File::create(&output).expect("create"))
        .stderr(Stdio::inherit());
    let mut child = command.spawn().expect("run capexec");
    assert_eq!(wait(&mut child), 0);
    let printed = std::fs::read_to_string(&output).expect("read");
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(lines.len(), 2, "{printed}");
    assert!(lines[0].starts_with("pipe:["), "{printed}");
    assert_eq!(lines[1], input.display().to_string());
}

/// The same bytes whichever way they go: handed, relayed by choice,
/// relayed over TCP.
#[test]
fn stdin_stdout_and_stderr_are_exact_handed_or_relayed() {
    let served = Served::start();
    let token = served.token_arg();
    let data = Pattern::bytes(5, 4 << 20);
    let ways: [&[&str]; 4] = [
        &["--connect", &served.unix],
        &["--connect", &served.unix, "--relay-stdio"],
        &["--relay-stdio"],
        &["--connect", &served.tcp, "--token-file", &token],
    ];
    for way in ways {
        let mut arguments = way.to_vec();
        arguments.extend_from_slice(&["--", "sh", "-c", "cat; printf 'e\\0rr' >&2; exit 4"]);
        let done = finish(served.run(&arguments), Some(data.clone()));
        assert_eq!(done.code, 4, "{way:?}: {}", text(&done.stderr));
        assert!(done.stdout == data, "{way:?}: stdout altered");
        assert_eq!(done.stderr, b"e\0rr", "{way:?}");
    }
}

/// A peer that sends descriptors no start asks for costs the server at
/// most a connection's window of them (the oldest are closed, and its
/// reads wait while too many wait to close), and nothing once its
/// connection ends.
#[test]
fn a_peer_flooding_descriptors_costs_the_server_a_window_then_nothing() {
    use common::procfs::open_fds;
    let served = Served::start();
    let server = served.child.id();
    let address: capexec::net::Address = served.unix.parse().expect("address");
    let before = open_fds(server);
    common::run_on_runtime(async move {
        let connection = capexec::net::connect(&address, None)
            .await
            .expect("connect");
        let executor = connection.executor();
        let route = connection.stdio_route().expect("a Unix socket's route");
        for _ in 0..20 {
            let null = std::fs::File::open("/dev/null").expect("open");
            let batch = (0..10)
                .map(|_| null.try_clone().expect("dup").into())
                .collect();
            route.hand_over(batch);
            // Each call carries what waits, at most 16 descriptors.
            capexec::client::info(&executor).await.expect("info");
        }
        // What the connection keeps, what waits for its closing thread
        // (reads wait beyond it), its socket and what the calls may hold
        // a moment.
        let window = capexec::rpc::MAX_KEPT_DESCRIPTORS + capexec::rpc::MAX_WAITING_TO_CLOSE;
        let during = open_fds(server);
        assert!(during <= before + window + 4, "{before} -> {during}");
        drop(executor);
        drop(connection);
        common::eventually_async("the server's descriptors are given back", async || {
            open_fds(server) <= before
        })
        .await;
    });
}

/// The capacity of the pipe behind `fd` (F_GETPIPE_SZ).
fn pipe_capacity(fd: impl AsFd) -> i32 {
    nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETPIPE_SZ).expect("F_GETPIPE_SZ")
}

/// A relayed stdin fed in bulk grows its pipe to 1 MiB once a read finds
/// it full, as the server grows its children's pipes, so the producer runs
/// further ahead and each chunk sent is bigger; one fed a few bytes keeps
/// the size it had. Every byte arrives either way.
#[test]
fn a_relayed_stdin_pipe_grows_when_fed_in_bulk_and_only_then() {
    use std::io::Write;
    for (bytes, grows) in [(8usize << 20, true), (10, false)] {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe");
        let ours = read.try_clone().expect("a read end to ask about the pipe");
        let before = pipe_capacity(&ours);
        let child = capexec(&["run", "--relay-stdio", "--", "wc", "-c"])
            .stdin(Stdio::from(read))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("run capexec");
        let mut writer = std::fs::File::from(write);
        writer.write_all(&vec![b'x'; bytes]).expect("write");
        if grows {
            common::eventually("the pipe to grow", || pipe_capacity(&ours) == 1 << 20);
        }
        drop(writer);
        let output = child.wait_with_output().expect("wait");
        assert!(output.status.success(), "{:?}", output.status);
        assert_eq!(text(&output.stdout).trim(), bytes.to_string());
        if !grows {
            assert_eq!(pipe_capacity(&ours), before);
        }
    }
}
