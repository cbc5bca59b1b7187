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

/// Starts `command` reading `stdin`, its stdout and stderr piped.
fn spawn_reading(mut command: Command, stdin: impl Into<Stdio>) -> std::process::Child {
    command
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run capexec")
}

/// Waits for a `capexec run … -- wc -c` and checks it succeeded and
/// counted `bytes`.
fn counted(child: std::process::Child, bytes: usize, name: &str) {
    let output = child.wait_with_output().expect("wait");
    assert!(output.status.success(), "{name}: {}", text(&output.stderr));
    assert_eq!(text(&output.stdout).trim(), bytes.to_string(), "{name}");
}

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
        let child = spawn_reading(run(&served, &way, &["wc", "-c"]), Stdio::from(read));
        let mut writer = std::fs::File::from(write);
        writer.write_all(&data).expect("write");
        assert!(
            !non_blocking(&shared),
            "{name}: made non-blocking while read"
        );
        drop(writer);
        counted(child, data.len(), name);
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
        let from_file = spawn_reading(
            run(&served, &way, &["cat"]),
            std::fs::File::open(&path).expect("open"),
        )
        .wait_with_output()
        .expect("wait");
        assert!(
            from_file.status.success(),
            "{name}: {}",
            text(&from_file.stderr)
        );
        assert!(from_file.stdout == data, "{name}: a file's bytes altered");

        let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        let child = spawn_reading(
            run(&served, &way, &["cat"]),
            Stdio::from(std::os::fd::OwnedFd::from(theirs)),
        );
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

/// A named FIFO refuses reads without waiting (preadv2 with RWF_NOWAIT
/// fails with EOPNOTSUPP): the stdin thread takes it over, and every byte
/// arrives.
#[test]
fn a_named_fifo_as_stdin_is_read_by_the_thread_whole() {
    let served = Served::start();
    let data = Pattern::bytes(13, 3 << 20);
    let dir = TempDir::new("fifo-stdin");
    for (name, way) in relaying(&served) {
        let fifo = dir.path().join(format!("fifo-{name}"));
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        let writer = {
            let (fifo, data) = (fifo.clone(), data.clone());
            // Opening a FIFO waits for its reader: capexec, below.
            std::thread::spawn(move || {
                let mut fifo = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&fifo)
                    .expect("open the FIFO for writing");
                fifo.write_all(&data).expect("write the FIFO");
            })
        };
        let output = spawn_reading(
            run(&served, &way, &["cat"]),
            std::fs::File::open(&fifo).expect("open the FIFO"),
        )
        .wait_with_output()
        .expect("wait");
        writer.join().expect("writer");
        assert!(output.status.success(), "{name}: {}", text(&output.stderr));
        assert!(output.stdout == data, "{name}: a FIFO's bytes altered");
    }
}

/// A pipe in packet mode (`pipe2(O_DIRECT)`) gives each write as a packet
/// of its own, and a read with too little room for one loses the rest of
/// it: stdin is never read into less room than a whole packet.
#[test]
fn a_pipe_in_packet_mode_loses_no_byte() {
    let served = Served::start();
    let data = Pattern::bytes(14, 10_000_000);
    for (name, way) in relaying(&served) {
        let (read, write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_DIRECT)
                .expect("a pipe in packet mode");
        let child = spawn_reading(run(&served, &way, &["wc", "-c"]), Stdio::from(read));
        let mut writer = std::fs::File::from(write);
        for packet in data.chunks(5000) {
            writer.write_all(packet).expect("write a packet");
        }
        drop(writer);
        counted(child, data.len(), name);
    }
}

/// Bytes that a read of the pipe behind `fd` would return now.
fn waiting(fd: impl AsFd) -> usize {
    let mut waiting: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int into `waiting`.
    let asked = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&fd.as_fd()),
            libc::FIONREAD,
            &mut waiting,
        )
    };
    assert_eq!(asked, 0, "FIONREAD");
    usize::try_from(waiting).expect("a count")
}

/// How often the main thread of process `pid` has gone to sleep (its
/// voluntary context switches): for `capexec run`, the RPC thread, which
/// sleeps in epoll_wait.
fn sleeps(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|count| count.trim().parse().ok())
        .expect("voluntary_ctxt_switches")
}

/// A pipe whose writer left while bytes were still in it, and that is
/// opened for writing again before they are read (`exec 3<>/dev/stdin`),
/// neither ends stdin early nor keeps `capexec run` from following the
/// command: it ends with the command, the new writer still open.
#[test]
fn a_pipe_opened_again_after_its_writer_left_does_not_hold_the_run() {
    use std::os::fd::AsRawFd;
    let served = Served::start();
    let dir = TempDir::new("reopened-stdin");
    for (name, way) in relaying(&served) {
        let go = dir.path().join(format!("go-{name}"));
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe");
        let ours = read.try_clone().expect("our copy of the read end");
        // The command reads nothing until told how much, then exactly
        // that, and ends.
        let script = format!(
            "while [ ! -s {go} ]; do sleep 0.01; done; head -c \"$(cat {go})\" | wc -c",
            go = go.display()
        );
        let mut child = spawn_reading(
            run(&served, &way, &["sh", "-c", &script]),
            Stdio::from(read),
        );
        // Fill everything between here and the command, until capexec
        // stops reading and the pipe stays full.
        nix::fcntl::fcntl(
            &write,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .expect("O_NONBLOCK on our write end");
        let mut writer = std::fs::File::from(write);
        let block = vec![b'x'; 64 * 1024];
        let mut total = 0usize;
        common::eventually("capexec to stop reading a full pipe", || {
            let mut wrote = 0;
            loop {
                match writer.write(&block) {
                    Ok(n) => wrote += n,
                    Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(error) => panic!("{name}: write: {error}"),
                }
            }
            total += wrote;
            let capacity =
                nix::fcntl::fcntl(&ours, nix::fcntl::FcntlArg::F_GETPIPE_SZ).expect("F_GETPIPE_SZ");
            let capacity = usize::try_from(capacity).expect("a size");
            // More than the pipe holds: capexec is reading it.
            wrote == 0 && waiting(&ours) == capacity && total > capacity
        });
        // The last writer leaves with the pipe full, and once capexec has
        // seen it go (it wakes, and sleeps again), a new one comes.
        let pid = child.id();
        let before = sleeps(pid);
        drop(writer);
        common::eventually("capexec to see the writer go", || sleeps(pid) > before);
        let again = std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/proc/self/fd/{}", ours.as_raw_fd()))
            .expect("open the pipe for writing again");
        std::fs::write(dir.path().join("count"), total.to_string()).expect("write the count");
        std::fs::rename(dir.path().join("count"), &go).expect("tell the command");
        let code = common::cli::wait(&mut child);
        let mut stdout = String::new();
        std::io::Read::read_to_string(&mut child.stdout.take().expect("stdout"), &mut stdout)
            .expect("read");
        assert_eq!(
            (code, stdout.trim()),
            (0, total.to_string().as_str()),
            "{name}"
        );
        drop(again);
    }
}
