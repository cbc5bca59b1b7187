//! Which of our own stdin, stdout and stderr a command on this machine
//! gets as they are (see `client::StdioHandoff`): then it reads and writes
//! them itself, at the speed of a local pipeline, and nothing is relayed.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use capexec::client::StdioHandoff;
use capexec::rpc::StdioRoute;

use crate::cli::stdio;

/// Ours to hand over `route` (the embedded executor's, or a Unix
/// socket's): pipes and sockets, and a regular file as stdin (stdin only
/// if the command reads ours). The others stay ours, relayed: a terminal,
/// so that the command sees a pipe or a pseudo-terminal whether or not it
/// runs here; a file or device as stdout or stderr, whose write errors (a
/// full disk) end the run with capexec's one line, as anywhere else; and
/// one that was closed when capexec started. A sandboxed command
/// (`confined`) gets no socket: through one it could reach, or be sent,
/// what its sandbox denies it (the server refuses it too). `None` when
/// there is nothing to hand.
pub fn ours(route: Option<StdioRoute>, stdin: bool, confined: bool) -> Option<StdioHandoff> {
    let route = route?;
    let (inputs, outputs): (&[Kind], &[Kind]) = if confined {
        (&[Kind::Pipe, Kind::File], &[Kind::Pipe])
    } else {
        (
            &[Kind::Pipe, Kind::Socket, Kind::File],
            &[Kind::Pipe, Kind::Socket],
        )
    };
    let stdin = stdin
        .then(|| handed(0, std::io::stdin().as_fd(), inputs))
        .flatten();
    let stdout = handed(1, std::io::stdout().as_fd(), outputs);
    let stderr = handed(2, std::io::stderr().as_fd(), outputs);
    if stdin.is_none() && stdout.is_none() && stderr.is_none() {
        return None;
    }
    Some(StdioHandoff::new(route, stdin, stdout, stderr))
}

#[derive(PartialEq, Eq)]
enum Kind {
    Pipe,
    Socket,
    File,
}

fn kind(fd: BorrowedFd<'_>) -> Option<Kind> {
    let mode = nix::sys::stat::fstat(fd).ok()?.st_mode & libc::S_IFMT;
    match mode {
        libc::S_IFIFO => Some(Kind::Pipe),
        libc::S_IFSOCK => Some(Kind::Socket),
        libc::S_IFREG => Some(Kind::File),
        _ => None,
    }
}

fn handed(number: i32, fd: BorrowedFd<'_>, kinds: &[Kind]) -> Option<OwnedFd> {
    if stdio::closed_at_start(number) || !kind(fd).is_some_and(|kind| kinds.contains(&kind)) {
        return None;
    }
    // A close-on-exec copy: ours stays open whatever the server does.
    fd.try_clone_to_owned().ok()
}
