//! A command that keeps one of its own pipes locked: a process splices a
//! socket that never sends into it, and the kernel keeps a pipe's lock
//! through a splice into it while the splice waits. Every other call on
//! that pipe (read, write, FIONREAD, close; O_NONBLOCK or not) then
//! sleeps uninterruptibly until that process ends.

use std::path::Path;
use std::process::Child;

/// Python that forks the holder: it closes `others` and splices a silent
/// socket into the descriptor `target`; the parent waits until it sleeps
/// there, then writes its pid to the file `ready`.
const FORK_THE_HOLDER: &str = r#"
def hold(target, ready, splice, others=()):
    import os, socket, time
    quiet, peer = socket.socketpair()
    child = os.fork()
    if child == 0:
        for fd in others:
            os.close(fd)
        os.splice(quiet.fileno(), target, 65536)
        os._exit(0)
    while True:
        with open(f"/proc/{child}/syscall") as f:
            call = f.read().split()[0]
        with open(f"/proc/{child}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        if call == splice and state == "S":
            break
        time.sleep(0.001)
    with open(ready + ".new", "w") as f:
        f.write(f"{child}\n")
    os.rename(ready + ".new", ready)
    return peer

def locked_pipe(ready, splice):
    """A second open file of a pipe's write end, whose holder (named in
    `ready`) keeps the pipe locked; its close is the pipe's last."""
    import os
    r, w = os.pipe()
    # Opened before the lock is held (an open of a pipe takes it).
    sent = os.open(f"/proc/self/fd/{w}", os.O_WRONLY)
    quiet = hold(w, ready, splice, others=[sent])
    with open(ready) as f:
        holder = f.read().strip()
    return sent, holder, (r, w, quiet)
"#;

/// A command that holds its own pipe at descriptor `argv[1]` locked
/// (stdout as it is; stdin reopened for writing) through a descendant.
/// Holding stdout, the command then exits, so the server looks at what
/// its output pipe still holds; holding stdin, it stays, and what the
/// server writes waits on the lock.
const HOLD_OWN_PIPE: &str = r#"
import os, sys
fd, ready, splice = int(sys.argv[1]), sys.argv[2], sys.argv[3]
target = os.open("/proc/self/fd/0", os.O_WRONLY) if fd == 0 else fd
peer = hold(target, ready, splice)
if fd == 0:
    os.wait()
"#;

/// Holds, from outside every tree a server made, a pipe a command sends
/// it: listens on the Unix socket `argv[1]`, takes one descriptor, and
/// holds it locked until killed.
const HOLD_A_PIPE_SENT: &str = r#"
import os, socket, sys
listening, ready, splice = sys.argv[1], sys.argv[2], sys.argv[3]
server = socket.socket(socket.AF_UNIX)
server.bind(listening)
server.listen(1)
peer, _ = server.accept()
_, fds, _, _ = socket.recv_fds(peer, 1, 1)
quiet = hold(fds[0], ready, splice)
os.close(fds[0])
peer.send(b"k")
os.wait()
"#;

/// A client of the server at the Unix socket `argv[1]` that sends it a
/// pipe it holds locked: a second open file of the pipe's write end goes
/// with four bytes (no frame yet), after `argv[4]` descriptors of
/// /dev/null in the same message (with 40, more than a server's read had
/// room for: the kernel closed the rest on the reading thread), and a
/// child of its own
/// splices a silent socket into the pipe. Says so in `argv[2]` with the
/// splicing child's pid, and keeps its connection.
const SEND_A_LOCKED_PIPE: &str = r#"
import array, os, socket, sys, time
listening, ready, splice, before = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
urgent = sys.argv[5] == "urgent"
r, w = os.pipe()
# Opened before the lock is held (an open of a pipe takes it), and not
# kept by the holder: the server's close of it is its last, which takes
# the lock.
sent = os.open(f"/proc/self/fd/{w}", os.O_WRONLY)
quiet = hold(w, ready + ".held", splice, others=[sent])
server = socket.socket(socket.AF_UNIX)
server.connect(listening)
nulls = [os.open("/dev/null", os.O_RDONLY) for _ in range(before)]
fds = array.array("i", nulls + [sent])
if urgent:
    # One urgent byte (MSG_OOB) carries them, kept apart from the stream.
    server.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)], socket.MSG_OOB)
    server.sendall(b"\0\0\0")
else:
    server.sendmsg([b"\0\0\0\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
# Said before the close here: a server that closes its copy at once
# (restricted) may close first, and then this close is the last, asleep
# on the lock until the test kills the holder.
os.rename(ready + ".held", ready)
os.close(sent)
time.sleep(600)
"#;

/// A client of the server at the Unix socket `argv[1]` that sends it
/// `argv[4]` pipes it holds locked, one after the other, then `argv[5]`
/// messages of `argv[6]` descriptors of /dev/null each, with the bytes of a frame
/// that never completes. Each pipe's holder is a child of its own, which
/// splices a silent socket into the pipe's write end; the client sends
/// a second open file of that end and closes it, so that the server's
/// close is its last (and takes the lock). Writes the holders' pids to
/// `argv[2]` once all is sent, then `argv[2]`.ended once the server has
/// ended the connection.
const SEND_LOCKED_PIPES: &str = r#"
import os, socket, sys, time
listening, ready, splice = sys.argv[1], sys.argv[2], sys.argv[3]
locked, nulls, per_message = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
server = socket.socket(socket.AF_UNIX)
server.connect(listening)
# A frame of one segment of 1000 words: the server waits for its bytes.
header = b"\0\0\0\0\xe8\x03\0\0"
holders, quiet = [], []
for index in range(locked):
    sent, holder, kept = locked_pipe(ready + f".{index}", splice)
    holders.append(holder)
    quiet.append(kept)
    socket.send_fds(server, [header if index == 0 else b"\0"], [sent])
    os.close(sent)
try:
    for _ in range(nulls):
        batch = [os.open("/dev/null", os.O_RDONLY) for _ in range(per_message)]
        try:
            socket.send_fds(server, [b"\0"], batch)
        finally:
            for null in batch:
                os.close(null)
except OSError:
    pass
with open(ready + ".new", "w") as f:
    f.write(" ".join(holders) + "\n")
os.rename(ready + ".new", ready)
try:
    server.recv(1)
except OSError:
    pass
open(ready + ".ended", "w").close()
time.sleep(600)
"#;

/// `argv[4]` clients of the server at the Unix socket `argv[1]`, each on
/// a connection of its own, that send it a pipe they hold locked and
/// leave: each connection's end has the server close that pipe (its last
/// close, which takes the lock). Writes the holders' pids to `argv[2]`.
const LEAVE_LOCKED_PIPES: &str = r#"
import os, socket, sys, time
listening, ready, splice, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
holders, quiet = [], []
for index in range(count):
    sent, holder, kept = locked_pipe(ready + f".{index}", splice)
    holders.append(holder)
    quiet.append(kept)
    server = socket.socket(socket.AF_UNIX)
    server.connect(listening)
    socket.send_fds(server, [b"\0\0\0\0"], [sent])
    os.close(sent)
    server.close()
with open(ready + ".new", "w") as f:
    f.write(" ".join(holders) + "\n")
os.rename(ready + ".new", ready)
time.sleep(600)
"#;

/// Starts `count` clients of the server listening at `socket` that each
/// send it a pipe they hold locked and leave (see
/// [`LEAVE_LOCKED_PIPES`]); `ready` names the holders once all left.
pub fn clients_leaving_locked_pipes(socket: &Path, ready: &Path, count: usize) -> Child {
    spawn_python(LEAVE_LOCKED_PIPES, socket, ready, &[count.to_string()])
}

/// A service at the Unix socket `argv[1]` that, to whatever connects,
/// sends a pipe it holds locked with a byte ("x"), then "hello" plainly.
/// Writes `sent` or `refused` (the kernel failed the send: EPERM) to
/// `argv[2]`, with the holder's pid.
const SERVE_A_LOCKED_PIPE: &str = r#"
import os, socket, sys, time
listening, ready, splice = sys.argv[1], sys.argv[2], sys.argv[3]
server = socket.socket(socket.AF_UNIX)
# The path appears at bind, and a connect refused until listen: it is
# named only once it listens.
server.bind(listening + ".new")
server.listen(1)
os.rename(listening + ".new", listening)
peer, _ = server.accept()
sent, holder, kept = locked_pipe(ready + ".held", splice)
try:
    socket.send_fds(peer, [b"x"], [sent])
    outcome = "sent"
except PermissionError:
    outcome = "refused"
# Not closed: its close here would be the last, and wait on the lock.
peer.sendall(b"hello")
with open(ready + ".new", "w") as f:
    f.write(f"{outcome} {holder}\n")
os.rename(ready + ".new", ready)
time.sleep(600)
"#;

/// Starts a service listening at `socket` that sends whoever connects a
/// pipe it holds locked (see [`SERVE_A_LOCKED_PIPE`]); `ready` says
/// whether the send went through, and names the holder.
pub fn service_sending_a_locked_pipe(socket: &Path, ready: &Path) -> Child {
    spawn_python(SERVE_A_LOCKED_PIPE, socket, ready, &[])
}

/// Starts a client of the server listening at `socket` that sends it
/// `locked` pipes it holds locked, then `nulls` other descriptors, one
/// per message (see
/// [`SEND_LOCKED_PIPES`]); `ready` names the holders once all is sent,
/// and `ready`.ended appears once the server ended the connection.
pub fn client_sending_locked_pipes(
    socket: &Path,
    ready: &Path,
    locked: usize,
    nulls: usize,
) -> Child {
    client_flooding_behind_locked_pipes(socket, ready, locked, nulls, 1)
}

/// The same, with `per_message` descriptors in each of the `messages`.
pub fn client_flooding_behind_locked_pipes(
    socket: &Path,
    ready: &Path,
    locked: usize,
    messages: usize,
    per_message: usize,
) -> Child {
    spawn_python(
        SEND_LOCKED_PIPES,
        socket,
        ready,
        &[
            locked.to_string(),
            messages.to_string(),
            per_message.to_string(),
        ],
    )
}

/// The pids a file `ready` names, once it does.
pub fn holder_pids(ready: &Path) -> Option<Vec<i32>> {
    let pids = std::fs::read_to_string(ready).ok()?;
    pids.split_whitespace()
        .map(|pid| pid.parse().ok())
        .collect()
}

/// Starts a client of the server listening at `socket` that sends it a
/// pipe it holds locked after `before` other descriptors (see
/// [`SEND_A_LOCKED_PIPE`]); `ready` names the holder once it is sent.
pub fn client_sending_a_locked_pipe(socket: &Path, ready: &Path, before: usize) -> Child {
    spawn_python(
        SEND_A_LOCKED_PIPE,
        socket,
        ready,
        &[before.to_string(), "plain".to_string()],
    )
}

/// The same, the descriptors carried by an urgent byte (MSG_OOB).
pub fn client_sending_a_locked_pipe_urgently(socket: &Path, ready: &Path) -> Child {
    spawn_python(
        SEND_A_LOCKED_PIPE,
        socket,
        ready,
        &["0".to_string(), "urgent".to_string()],
    )
}

/// `script` with the Unix socket `socket`, the file `ready`, the number
/// of splice(2) and `more`, as a child of the test.
fn spawn_python(script: &str, socket: &Path, ready: &Path, more: &[String]) -> Child {
    let argv = python(
        script,
        &[
            socket.display().to_string(),
            ready.display().to_string(),
            libc::SYS_splice.to_string(),
        ]
        .into_iter()
        .chain(more.iter().cloned())
        .collect::<Vec<_>>(),
    );
    std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .spawn()
        .expect("start python")
}

/// What a command runs to send its stdout to [`HOLD_A_PIPE_SENT`]
/// listening at `argv[1]`; it exits once the holder took the pipe, or
/// with `argv[2]`, writes its pid there and stays.
const SEND_STDOUT: &str = r#"
import os, socket, sys, time
peer = socket.socket(socket.AF_UNIX)
while True:
    try:
        peer.connect(sys.argv[1])
        break
    except (FileNotFoundError, ConnectionRefusedError):
        time.sleep(0.01)
socket.send_fds(peer, [b"x"], [1])
peer.recv(1)
if len(sys.argv) > 2:
    with open(sys.argv[2] + ".new", "w") as f:
        f.write(f"{os.getpid()}\n")
    os.rename(sys.argv[2] + ".new", sys.argv[2])
    time.sleep(600)
"#;

fn python(script: &str, args: &[String]) -> Vec<String> {
    let mut argv = vec![
        "/usr/bin/python3".to_string(),
        "-c".to_string(),
        format!("{FORK_THE_HOLDER}{script}"),
    ];
    argv.extend_from_slice(args);
    argv
}

/// The command line of a command that holds its own pipe `fd` locked,
/// saying so in `ready` once it does.
pub fn holder_argv(fd: i32, ready: &Path) -> Vec<String> {
    python(
        HOLD_OWN_PIPE,
        &[
            fd.to_string(),
            ready.display().to_string(),
            libc::SYS_splice.to_string(),
        ],
    )
}

/// Starts, as a child of the test (outside every tree and cgroup of a
/// server), a holder of the pipe a command running [`sender_argv`] with
/// the same `socket` sends it; `ready` says when it holds it locked.
pub fn outside_holder(socket: &Path, ready: &Path) -> Child {
    spawn_python(HOLD_A_PIPE_SENT, socket, ready, &[])
}

/// The command line of a command that sends its stdout to the holder at
/// `socket` and exits, or with `stays`, writes its pid there and stays.
pub fn sender_argv(socket: &Path, stays: Option<&Path>) -> Vec<String> {
    let mut argv = vec![
        "/usr/bin/python3".to_string(),
        "-c".to_string(),
        SEND_STDOUT.to_string(),
        socket.display().to_string(),
    ];
    argv.extend(stays.map(|pid| pid.display().to_string()));
    argv
}

/// The pid a file `ready` names, once it does.
pub fn holder_pid(ready: &Path) -> Option<i32> {
    std::fs::read_to_string(ready)
        .ok()
        .and_then(|pid| pid.trim().parse().ok())
}

/// SIGKILL to a process when dropped by a failing test, or always when
/// made with [`KillOnDrop::always`].
pub struct KillOnDrop {
    pub pid: i32,
    always: bool,
}

impl KillOnDrop {
    pub fn when_failing(pid: i32) -> KillOnDrop {
        KillOnDrop { pid, always: false }
    }

    pub fn always(pid: i32) -> KillOnDrop {
        KillOnDrop { pid, always: true }
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if self.always || std::thread::panicking() {
            // SAFETY: kill(2) of a process this test's command made, still
            // there: only a test that passed saw it end.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
    }
}

/// A child of the test, killed and waited for when dropped.
pub struct ChildKilledOnDrop(pub Child);

impl Drop for ChildKilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The states of the server `server`'s threads that do a process's pipe
/// I/O (`engine/io_thread.rs`).
pub fn io_thread_states(server: u32) -> Vec<char> {
    thread_states(server)
        .into_iter()
        .filter(|(name, _)| name == "capexec-io")
        .map(|(_, state)| state)
        .collect()
}

/// The names of the server `server`'s threads that sleep uninterruptibly
/// (state `D`: on a pipe's lock, or for a moment on the disk), sorted.
pub fn threads_asleep(server: u32) -> Vec<String> {
    let mut asleep: Vec<String> = thread_states(server)
        .into_iter()
        .filter(|&(_, state)| state == 'D')
        .map(|(name, _)| name)
        .collect();
    asleep.sort();
    asleep
}

/// The names of the threads of process `pid`.
pub fn thread_names(pid: u32) -> Vec<String> {
    thread_states(pid)
        .into_iter()
        .map(|(name, _)| name)
        .collect()
}

/// Each thread of process `pid`: its name and its state.
fn thread_states(pid: u32) -> Vec<(String, char)> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| {
            let name = std::fs::read_to_string(task.path().join("comm")).ok()?;
            let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
            let state = stat.get(stat.rfind(')')? + 2..)?.chars().next()?;
            Some((name.trim_end().to_string(), state))
        })
        .collect()
}
