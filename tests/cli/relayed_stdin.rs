//! A stdin `capexec run` relays (over TCP, or with `--relay-stdio`): a
//! pipe is read as it becomes readable without being made non-blocking
//! for whoever shares it, and anything else (a regular file, a socket) is
//! read by a thread of its own. Every byte arrives, in order, either way.

use crate::common;

use std::io::Write;
use std::os::fd::AsFd;
use std::process::{Command, Stdio};

use common::cli::{Served, Watched, text};
use common::data::{Pattern, TempDir};

/// `capexec run` relaying its stdin: embedded with `--relay-stdio`, and
/// over TCP (which always relays), each followed by `--`.
fn relaying(served: &Served) -> Vec<(&'static str, Vec<String>)> {
    let token = served.token_arg();
    vec![
        ("embedded", vec!["--relay-stdio".into(), "--".into()]),
        (
            "tcp",
            vec![
                "--connect".into(),
                served.tcp.clone(),
                "--token-file".into(),
                token,
                "--".into(),
            ],
        ),
    ]
}

/// The names of the threads of process `pid`.
fn thread_names(pid: u32) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("comm")).ok())
        .map(|name| name.trim_end().to_string())
        .collect()
}

/// The thread that reads a stdin epoll cannot wait for.
const STDIN_THREAD: &str = "capexec-stdin";

fn run(served: &Served, way: &[String], command: &[&str]) -> Command {
    let mut arguments: Vec<&str> = way.iter().map(String::as_str).collect();
    arguments.extend_from_slice(command);
    served.run(&arguments)
}

/// A line written to the pipe reaches the command at once, with stdin
/// still open, and the next one after it: the relay waits for the pipe
/// to become readable again after each, on the RPC thread (no thread of
/// its own).
#[test]
fn each_line_on_a_relayed_pipe_reaches_the_command_while_it_stays_open() {
    let served = Served::start();
    for (name, way) in relaying(&served) {
        let mut running = Watched::spawn(run(&served, &way, &["cat"]));
        let mut stdin = running.stdin.take().expect("stdin");
        let mut expected = String::new();
        for line in ["first line\n", "second\n", "third\n"] {
            stdin.write_all(line.as_bytes()).expect("write");
            expected.push_str(line);
            running.wait_for_stdout(&expected);
        }
        let threads = thread_names(running.child.id());
        assert!(
            !threads.iter().any(|thread| thread == STDIN_THREAD),
            "{name}: {threads:?}"
        );
        drop(stdin);
        let done = running.finish();
        assert_eq!(done.code, 0, "{name}: {}", text(&done.stderr));
        assert_eq!(text(&done.stdout), expected, "{name}");
    }
}

/// Whether the open file description behind `fd` is non-blocking.
fn non_blocking(fd: impl AsFd) -> bool {
    let flags = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFL).expect("F_GETFL");
    nix::fcntl::OFlag::from_bits_truncate(flags).contains(nix::fcntl::OFlag::O_NONBLOCK)
}

/// The pipe is shared with the process that gave it (a shell's next
/// command may read it after capexec): capexec reads it without waiting
/// but never switches it to O_NONBLOCK, and takes 8 MiB through it.
#[test]
fn a_relayed_pipe_is_read_without_being_made_non_blocking() {
    let served = Served::start();
    let data = Pattern::bytes(11, 8 << 20);
    for (name, way) in relaying(&served) {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe");
        let shared = read.try_clone().expect("our copy of the read end");
        let child = run(&served, &way, &["wc", "-c"])
            .stdin(Stdio::from(read))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run capexec");
        let mut writer = std::fs::File::from(write);
        writer.write_all(&data).expect("write");
        assert!(
            !non_blocking(&shared),
            "{name}: made non-blocking while read"
        );
        drop(writer);
        let output = child.wait_with_output().expect("wait");
        assert!(output.status.success(), "{name}: {}", text(&output.stderr));
        assert_eq!(
            text(&output.stdout).trim(),
            data.len().to_string(),
            "{name}"
        );
        assert!(!non_blocking(&shared), "{name}: left non-blocking");
    }
}

/// A regular file and a socket as stdin are relayed by a thread of their
/// own (epoll takes no regular file), byte for byte.
#[test]
fn a_file_or_a_socket_as_stdin_is_relayed_whole() {
    let served = Served::start();
    let data = Pattern::bytes(12, 5 << 20);
    let dir = TempDir::new("relayed-stdin");
    let path = dir.path().join("input");
    std::fs::write(&path, &data).expect("write the input");
    for (name, way) in relaying(&served) {
        let from_file = run(&served, &way, &["cat"])
            .stdin(std::fs::File::open(&path).expect("open"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .expect("run capexec");
        assert!(
            from_file.status.success(),
            "{name}: {}",
            text(&from_file.stderr)
        );
        assert!(from_file.stdout == data, "{name}: a file's bytes altered");

        let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        let child = run(&served, &way, &["cat"])
            .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run capexec");
        common::eventually("the stdin thread to start", || {
            thread_names(child.id())
                .iter()
                .any(|thread| thread == STDIN_THREAD)
        });
        let feeder = {
            let data = data.clone();
            std::thread::spawn(move || {
                let mut ours = ours;
                ours.write_all(&data).expect("write the socket");
                ours.shutdown(std::net::Shutdown::Write).expect("shutdown");
            })
        };
        let from_socket = child.wait_with_output().expect("wait");
        feeder.join().expect("feeder");
        assert!(
            from_socket.status.success(),
            "{name}: {}",
            text(&from_socket.stderr)
        );
        assert!(
            from_socket.stdout == data,
            "{name}: a socket's bytes altered"
        );
    }
}
