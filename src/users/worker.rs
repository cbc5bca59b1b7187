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
use std::path::{Path, PathBuf};
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

/// The capexec binary a front or worker runs, and the name it goes by
/// (its `argv[0]`: where its own upgrade looks for a new binary).
#[derive(Clone, Debug)]
pub struct Program {
    run: PathBuf,
    name: PathBuf,
}

impl Program {
    /// This process's own binary, whatever is at `name` now (a package
    /// manager may have renamed a new one into place, or an upgrade that
    /// could not execute it come back to this one): a monitor's front and
    /// workers speak its protocol.
    pub fn own(name: PathBuf) -> Program {
        Program {
            run: PathBuf::from("/proc/self/exe"),
            name,
        }
    }

    /// The binary at `path`.
    pub fn at(path: &Path) -> Program {
        Program {
            run: path.to_path_buf(),
            name: path.to_path_buf(),
        }
    }
}

/// Starts `program serve --worker FD` as `account`, serving on `listener`
/// (a listening Unix socket; the worker gets its own descriptor of it).
/// The worker is killed when the process that started it dies, as a
/// server's processes die with the server. It serves `Admin` on `admin`
/// (`--worker-admin`). With a `cgroup` delegated to the user, it starts
/// in it and makes its processes' cgroups there (`--cgroup-parent`).
pub fn spawn_worker(
    account: &Account,
    program: &Program,
    listener: &impl AsFd,
    admin: &impl AsFd,
    cgroup: Option<&crate::sandbox::DelegatedGroup>,
) -> Result<Child, WorkerError> {
    let socket = listener.as_fd().as_raw_fd();
    let admin = admin.as_fd().as_raw_fd();
    let mut args = vec![
        OsString::from("serve"),
        "--worker".into(),
        socket.to_string().into(),
        "--worker-admin".into(),
        admin.to_string().into(),
    ];
    if let Some(group) = cgroup {
        args.extend(["--cgroup-parent".into(), group.path.clone().into()]);
    }
    spawn_as(
        account,
        program,
        &args,
        &[socket, admin],
        libc::SIGKILL,
        cgroup.map(|group| &group.worker_procs),
    )
}

/// Starts `program ARGS` as `account`: its ids and groups, the environment
/// a login of it finds (`HOME`, `USER`, `LOGNAME`, `SHELL`, a login's
/// `PATH`), in its home directory (`/` if that is missing), with stdin and
/// stdout on /dev/null, stderr on a pipe whose lines a thread of this
/// process copies to its own stderr (see `relay_log`; the child's
/// `stderr` is that pipe's read end, for [`relay_stderr`]), and of the
/// server's other descriptors only `keep` (at their numbers). It gets
/// `death_signal` when the process that started it dies. Given the
/// `cgroup.procs` of a cgroup (open for writing), it joins that cgroup
/// while it is still root.
pub fn spawn_as(
    account: &Account,
    program: &Program,
    args: &[OsString],
    keep: &[RawFd],
    death_signal: libc::c_int,
    cgroup_procs: Option<&std::os::fd::OwnedFd>,
) -> Result<Child, WorkerError> {
    let cgroup_procs = cgroup_procs.map(|procs| procs.as_raw_fd());
    if !nix::unistd::getuid().is_root() || !nix::unistd::geteuid().is_root() {
        return Err(WorkerError::NotRoot);
    }
    let mut command = Command::new(&program.run);
    command
        .arg0(&program.name)
        .args(args)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        // Not the server's own stderr: that may be root's terminal, where
        // a process of the user's (or a front taken over) could push
        // input (TIOCSTI) or escape sequences.
        .stderr(Stdio::piped());
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
            // "0": the writer itself. Before the ids change: the cgroup's
            // ancestors are root's.
            if let Some(procs) = cgroup_procs {
                let written = libc::write(procs, b"0".as_ptr().cast(), 1);
                if written != 1 {
                    return Err(std::io::Error::last_os_error());
                }
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
            // The signals a server handles wait, blocked, until it handles
            // them (`capexec serve` lets them in then): the monitor passes
            // SIGTERM on as soon as it comes, which could otherwise end
            // the new process by the default action, as killed.
            super::monitor::mask_monitor_signals(libc::SIG_BLOCK);
            Ok(())
        });
    }
    command.spawn().map_err(WorkerError::Io)
}

/// How a started process's log is labelled: `NAME (uid UID)`.
pub fn log_label(account: &Account) -> String {
    format!("{} (uid {})", account.name, account.uid)
}

/// Copies the log of `child` (started by [`spawn_as`]) to this process's
/// stderr on a thread of its own, and returns a second descriptor of the
/// pipe's read end, which an upgrade hands over so that the new binary
/// relays it on ([`relay_from`]).
pub fn relay_stderr(child: &mut Child, label: String) -> Option<std::os::fd::OwnedFd> {
    let log = std::os::fd::OwnedFd::from(child.stderr.take()?);
    let kept = log.try_clone().ok();
    relay_from(log, label);
    kept
}

/// Copies the log at `log` (a pipe's read end) to this process's stderr,
/// each line after `label`, on a thread of its own.
pub fn relay_from(log: std::os::fd::OwnedFd, label: String) {
    let relay = std::thread::Builder::new()
        .name("capexec-log-relay".to_string())
        .spawn(move || {
            // The server's signals go to its main thread, whose handling
            // (and whose blocking of them before an upgrade's exec) then
            // covers the whole process.
            super::monitor::mask_monitor_signals(libc::SIG_BLOCK);
            relay_log(std::fs::File::from(log), &label, &mut std::io::stderr())
        });
    if let Err(error) = relay {
        // Its log is lost, not its service: the pipe closes and the
        // process's writes to stderr fail from then on.
        tracing::warn!(%error, "cannot relay a process's log");
    }
}

/// The longest line [`relay_log`] copies whole; longer ones are cut in
/// pieces of this size.
const LOG_LINE_BYTES: usize = 8192;

/// Copies the lines of `log` (a process's stderr) to `to` until it ends,
/// each after `label: `, with every control character but a tab shown as
/// `\u{..}`, so no byte of theirs acts on a terminal `to` may be.
pub fn relay_log(log: impl std::io::Read, label: &str, to: &mut impl std::io::Write) {
    use std::io::BufRead;
    let mut reader = std::io::BufReader::with_capacity(LOG_LINE_BYTES, log);
    let mut line = Vec::with_capacity(LOG_LINE_BYTES);
    loop {
        line.clear();
        match std::io::Read::take(&mut reader, LOG_LINE_BYTES as u64).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(line.strip_suffix(b"\n").unwrap_or(&line));
        let shown: String = text
            .chars()
            .map(|c| match c {
                '\t' => "\t".to_string(),
                c if c.is_control() => c.escape_unicode().to_string(),
                c => c.to_string(),
            })
            .collect();
        if writeln!(to, "{label}: {shown}").is_err() {
            // Nowhere to write: keep draining, so the process never
            // blocks on its log.
            continue;
        }
    }
}

fn check(result: libc::c_int) -> std::io::Result<()> {
    if result == -1 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::relay_log;

    #[test]
    fn a_relayed_log_is_labelled_and_cannot_act_on_a_terminal() {
        let log: &[u8] = b"plain line\n\x1b[2J\x1b]0;title\x07 and a\ttab\r\nno newline at the end";
        let mut out = Vec::new();
        relay_log(log, "alice (uid 1001)", &mut out);
        assert_eq!(
            String::from_utf8(out).expect("text"),
            "alice (uid 1001): plain line\n\
             alice (uid 1001): \\u{1b}[2J\\u{1b}]0;title\\u{7} and a\ttab\\u{d}\n\
             alice (uid 1001): no newline at the end\n"
        );
    }

    #[test]
    fn a_long_line_is_cut_not_held() {
        let log = vec![b'x'; super::LOG_LINE_BYTES * 2 + 10];
        let mut out = Vec::new();
        relay_log(log.as_slice(), "u", &mut out);
        let lines: Vec<usize> = String::from_utf8(out)
            .expect("text")
            .lines()
            .map(|line| line.len() - "u: ".len())
            .collect();
        assert_eq!(lines, [super::LOG_LINE_BYTES, super::LOG_LINE_BYTES, 10]);
    }
}
