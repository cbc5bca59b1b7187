//! A user's worker: `capexec serve --worker FD` started with the user's
//! credentials, serving the user's logins on one end of a socketpair.
//!
//! Made by the privileged part of a server that maps logins to users (see
//! docs/design/logins-as-users.md); everything the worker does, the kernel
//! checks against the user's ids and groups, since they are the worker
//! process's own (real, effective and saved, and the supplementary groups
//! of the group database).

use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::users::account::Account;

/// The descriptor the worker finds its end of the socketpair on.
pub const WORKER_FD: i32 = 3;

/// Variables a worker keeps from the server's environment: the locale, the
/// time zone and what its log shows. The rest is a login's own.
const KEPT_VARIABLES: &[&str] = &["LANG", "LANGUAGE", "TZ", "RUST_LOG"];

/// A login's PATH, as `login(1)` sets it for an ordinary user
/// (`ENV_PATH` of login.defs).
const LOGIN_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// A running worker and the server's end of its socketpair.
pub struct Worker {
    pub child: Child,
    /// A Cap'n Proto connection to the worker's executor, logged in.
    pub socket: UnixStream,
}

/// Why a worker could not be started.
#[derive(Debug)]
pub enum WorkerError {
    /// Only root can start a process as another user.
    NotRoot,
    Io(std::io::Error),
}

impl std::fmt::Display for WorkerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkerError::NotRoot => f.write_str(
                "starting a worker as another user needs root (real and effective uid 0)",
            ),
            WorkerError::Io(error) => write!(
                f,
                "cannot start the worker: {}",
                crate::model::io_message(error)
            ),
        }
    }
}

impl std::error::Error for WorkerError {}

/// Starts `program serve --worker 3` as `account`: its ids and groups, the
/// environment a login of it finds (`HOME`, `USER`, `LOGNAME`, `SHELL`, a
/// login's `PATH`), in its home directory (`/` if that is missing), with
/// no descriptor of the server's but stderr. The worker dies with the
/// process that started it (SIGKILL on its death), as a server's processes
/// die with the server.
pub fn spawn_worker(account: &Account, program: &Path) -> Result<Worker, WorkerError> {
    if !nix::unistd::getuid().is_root() || !nix::unistd::geteuid().is_root() {
        return Err(WorkerError::NotRoot);
    }
    let (ours, theirs) = UnixStream::pair().map_err(WorkerError::Io)?;
    let theirs = OwnedFd::from(theirs);
    let mut command = Command::new(program);
    command
        .args(["serve", "--worker"])
        .arg(WORKER_FD.to_string())
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    for (name, value) in account.login_environment() {
        command.env(name, value);
    }
    command.env("PATH", LOGIN_PATH);
    for name in KEPT_VARIABLES {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    let home_exists = account.home.is_dir();
    command.current_dir(if home_exists {
        account.home.as_os_str().to_owned()
    } else {
        OsString::from("/")
    });
    let parent = std::process::id();
    let (uid, gid, groups) = (account.uid, account.gid, account.groups.clone());
    let socket = theirs.as_raw_fd();
    // SAFETY: between fork and exec only async-signal-safe calls, on values
    // prepared before the fork (no allocation).
    unsafe {
        command.pre_exec(move || {
            // The socket at WORKER_FD, open across exec.
            if socket == WORKER_FD {
                let flags = libc::fcntl(socket, libc::F_GETFD);
                check(libc::fcntl(
                    socket,
                    libc::F_SETFD,
                    flags & !libc::FD_CLOEXEC,
                ))?;
            } else {
                check(libc::dup2(socket, WORKER_FD))?;
            }
            // Nothing else of the server's crosses exec (std's own
            // exec-error pipe is close-on-exec already).
            check(libc::syscall(
                libc::SYS_close_range,
                WORKER_FD + 1,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            ) as libc::c_int)?;
            // Groups first, then the group, then the user: after setresuid
            // nothing could change the others.
            nix::unistd::setgroups(&groups)?;
            nix::unistd::setresgid(gid, gid, gid)?;
            nix::unistd::setresuid(uid, uid, uid)?;
            // After the switch: a change of credentials clears it.
            check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0))?;
            if libc::getppid() as u32 != parent {
                // The server died before the line above.
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let child = command.spawn().map_err(WorkerError::Io)?;
    drop(theirs);
    Ok(Worker {
        child,
        socket: ours,
    })
}

fn check(result: libc::c_int) -> std::io::Result<()> {
    if result == -1 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}
