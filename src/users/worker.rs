//! A user's worker: `capexec serve --worker FD` started with the user's
//! credentials, serving on a listening Unix socket that the privileged
//! part bound where only the server reaches it, and that the server
//! forwards the user's logins to (a chain hop).
//!
//! Made by the privileged part of a server that maps logins to users (see
//! docs/design/logins-as-users.md); everything the worker does, the kernel
//! checks against the user's ids and groups, since they are the worker
//! process's own (real, effective and saved, and the supplementary groups
//! of the group database).

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::users::account::Account;

/// Variables a worker keeps from the server's environment: the locale, the
/// time zone and what its log shows. The rest is a login's own.
const KEPT_VARIABLES: &[&str] = &["LANG", "LANGUAGE", "TZ", "RUST_LOG"];

/// A login's PATH, as `login(1)` sets it for an ordinary user
/// (`ENV_PATH` of login.defs).
const LOGIN_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

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

/// Starts `program serve --worker FD` as `account`, serving on `listener`
/// (a listening Unix socket; the worker gets its own descriptor of it).
/// The worker is killed when the process that started it dies, as a
/// server's processes die with the server. It serves `Admin` on `admin`
/// (`--worker-admin`).
pub fn spawn_worker(
    account: &Account,
    program: &Path,
    listener: &impl AsFd,
    admin: &impl AsFd,
) -> Result<Child, WorkerError> {
    let socket = listener.as_fd().as_raw_fd();
    let admin = admin.as_fd().as_raw_fd();
    let args = [
        OsString::from("serve"),
        "--worker".into(),
        socket.to_string().into(),
        "--worker-admin".into(),
        admin.to_string().into(),
    ];
    spawn_as(account, program, &args, &[socket, admin], libc::SIGKILL)
}

/// Starts `program ARGS` as `account`: its ids and groups, the environment
/// a login of it finds (`HOME`, `USER`, `LOGNAME`, `SHELL`, a login's
/// `PATH`), in its home directory (`/` if that is missing), with stdin and
/// stdout on /dev/null, the server's stderr, and of the server's other
/// descriptors only `keep` (at their numbers). It gets `death_signal` when
/// the process that started it dies.
pub fn spawn_as(
    account: &Account,
    program: &Path,
    args: &[OsString],
    keep: &[RawFd],
    death_signal: libc::c_int,
) -> Result<Child, WorkerError> {
    if !nix::unistd::getuid().is_root() || !nix::unistd::geteuid().is_root() {
        return Err(WorkerError::NotRoot);
    }
    let mut command = Command::new(program);
    command
        .args(args)
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
    // The ranges to close on exec: everything from 3 but `keep`, worked
    // out before the fork (no allocation after it).
    let mut kept: Vec<RawFd> = keep.iter().copied().filter(|&fd| fd > 2).collect();
    kept.sort_unstable();
    kept.dedup();
    let mut closed = Vec::with_capacity(kept.len() + 1);
    let mut first = 3;
    for &fd in &kept {
        if first < fd {
            closed.push((first, fd - 1));
        }
        first = fd + 1;
    }
    closed.push((first, i32::MAX));
    // SAFETY: between fork and exec only async-signal-safe calls, on values
    // prepared before the fork (no allocation).
    unsafe {
        command.pre_exec(move || {
            // The kept descriptors open across exec, at the numbers they
            // have here (a dup2 to fixed numbers could land on std's own
            // exec-error pipe); everything else of the server's closed on
            // exec (std's pipe is so already).
            for &fd in &kept {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                check(libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC))?;
            }
            for &(first, last) in &closed {
                check(libc::syscall(
                    libc::SYS_close_range,
                    first as u32,
                    last as u32,
                    libc::CLOSE_RANGE_CLOEXEC,
                ) as libc::c_int)?;
            }
            // Groups first, then the group, then the user: after setresuid
            // nothing could change the others.
            nix::unistd::setgroups(&groups)?;
            nix::unistd::setresgid(gid, gid, gid)?;
            nix::unistd::setresuid(uid, uid, uid)?;
            // After the switch: a change of credentials clears it.
            check(libc::prctl(libc::PR_SET_PDEATHSIG, death_signal, 0, 0, 0))?;
            if libc::getppid() as u32 != parent {
                // The server died before the line above.
                libc::_exit(1);
            }
            Ok(())
        });
    }
    command.spawn().map_err(WorkerError::Io)
}

fn check(result: libc::c_int) -> std::io::Result<()> {
    if result == -1 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}
