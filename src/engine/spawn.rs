//! Forking and executing a child that starts clean: its own session, default
//! signal dispositions, an empty signal mask and no inherited descriptors.

use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::engine::reaper::{self, ExitWait};
use crate::engine::spec::StartSpec;
use crate::model::{StartError, StartErrorKind};

/// The standard descriptors a child gets.
pub(crate) enum ChildStdio {
    /// stdin piped or /dev/null; stdout and stderr piped.
    Pipes { pipe_stdin: bool },
    /// All three on this terminal device, which becomes the controlling
    /// terminal of the child's new session.
    Terminal(OwnedFd),
}

pub(crate) struct SpawnedChild {
    pub pid: i32,
    pub stdin: Option<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
    pub exit: ExitWait,
}

/// Checks what can be checked before forking, then spawns.
pub(crate) fn spawn(spec: &StartSpec, stdio: ChildStdio) -> Result<SpawnedChild, StartError> {
    spec.validate()?;
    if let Some(cwd) = spec.effective_cwd() {
        match std::fs::metadata(cwd) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(StartError::new(
                    StartErrorKind::BadCwd,
                    format!("working directory {} is not a directory", cwd.display()),
                ));
            }
            Err(error) => {
                return Err(StartError::new(
                    StartErrorKind::BadCwd,
                    format!("working directory {}: {}", cwd.display(), plain(&error)),
                ));
            }
        }
    }

    let mut command = Command::new(&spec.argv[0]);
    command.args(&spec.argv[1..]);
    if let Some(arg0) = &spec.arg0 {
        command.arg0(arg0);
    }
    command.env_clear().envs(spec.child_env());
    if let Some(cwd) = spec.effective_cwd() {
        command.current_dir(cwd);
    }
    let controlling_terminal = match stdio {
        ChildStdio::Pipes { pipe_stdin } => {
            command
                .stdin(if pipe_stdin {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            false
        }
        ChildStdio::Terminal(tty) => {
            let clone = |fd: &OwnedFd| fd.try_clone().map_err(|e| spawn_failed(spec, &e));
            command.stdin(clone(&tty)?).stdout(clone(&tty)?).stderr(tty);
            true
        }
    };
    let mut setup = ChildSetup::prepare(controlling_terminal);
    // SAFETY: the closure only makes async-signal-safe system calls and
    // touches memory prepared before the fork.
    unsafe {
        command.pre_exec(move || setup.run());
    }

    let (mut child, exit) = reaper::spawn_child(|| command.spawn(), |child| child.id() as i32)
        .map_err(|error| classify_spawn_error(spec, &error))?;
    Ok(SpawnedChild {
        pid: child.id() as i32,
        stdin: child.stdin.take().map(OwnedFd::from),
        stdout: child.stdout.take().map(OwnedFd::from),
        stderr: child.stderr.take().map(OwnedFd::from),
        exit,
    })
}

fn classify_spawn_error(spec: &StartSpec, error: &io::Error) -> StartError {
    let program = spec.argv[0].to_string_lossy();
    match error.raw_os_error() {
        Some(libc::ENOENT) => StartError::new(
            StartErrorKind::ProgramNotFound,
            format!("program not found: {program}"),
        ),
        Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EISDIR) => StartError::new(
            StartErrorKind::PermissionDenied,
            format!("cannot execute {program}: {}", plain(error)),
        ),
        Some(libc::ENOEXEC) => StartError::new(
            StartErrorKind::PermissionDenied,
            format!("cannot execute {program}: not an executable format"),
        ),
        Some(libc::ENOTDIR) => StartError::new(
            StartErrorKind::ProgramNotFound,
            format!("program not found: {program} (a path component is not a directory)"),
        ),
        _ => spawn_failed(spec, error),
    }
}

fn spawn_failed(spec: &StartSpec, error: &io::Error) -> StartError {
    StartError::new(
        StartErrorKind::SpawnFailed,
        format!(
            "cannot start {}: {}",
            spec.argv[0].to_string_lossy(),
            plain(error)
        ),
    )
}

/// An OS error's text without Rust's " (os error N)" suffix.
fn plain(error: &io::Error) -> String {
    let text = error.to_string();
    match text.find(" (os error ") {
        Some(index) => text[..index].to_string(),
        None => text,
    }
}

/// What runs in the child between fork and exec. Everything it needs is
/// computed before the fork, because after it only async-signal-safe calls
/// are allowed.
struct ChildSetup {
    controlling_terminal: bool,
    max_signal: i32,
    /// Descriptors to mark close-on-exec when close_range(2) is unavailable.
    open_fds: Option<Vec<RawFd>>,
}

impl ChildSetup {
    fn prepare(controlling_terminal: bool) -> ChildSetup {
        ChildSetup {
            controlling_terminal,
            max_signal: libc::SIGRTMAX(),
            open_fds: if close_range_cloexec_works() {
                None
            } else {
                Some(list_open_fds())
            },
        }
    }

    fn run(&mut self) -> io::Result<()> {
        // SAFETY (whole function): only async-signal-safe calls, on memory
        // that was allocated before the fork.
        unsafe {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            if self.controlling_terminal && libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            // Ignored signals stay ignored across exec (nohup, background
            // jobs); reset every disposition, not just the handled ones. The
            // raw system call also reaches the signals the C library keeps
            // for itself. All zeros is SIG_DFL, no flags, empty mask in the
            // kernel's layout on every architecture.
            let default = [0u64; 4];
            for signal in 1..=self.max_signal {
                if signal != libc::SIGKILL && signal != libc::SIGSTOP {
                    libc::syscall(
                        libc::SYS_rt_sigaction,
                        signal,
                        default.as_ptr(),
                        std::ptr::null_mut::<u64>(),
                        8usize,
                    );
                }
            }
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());

            // Close-on-exec rather than close: std reports exec failures
            // through a descriptor that must survive until the exec.
            match &self.open_fds {
                None => {
                    libc::syscall(
                        libc::SYS_close_range,
                        3u32,
                        u32::MAX,
                        libc::CLOSE_RANGE_CLOEXEC,
                    );
                }
                Some(fds) => {
                    for &fd in fds {
                        if fd > 2 {
                            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

fn close_range_cloexec_works() -> bool {
    static WORKS: OnceLock<bool> = OnceLock::new();
    *WORKS.get_or_init(|| {
        // An empty range far above any open descriptor changes nothing but
        // tells whether the kernel knows the call and the flag.
        let probe = i32::MAX as u32;
        // SAFETY: close_range on an empty range has no effect.
        unsafe {
            libc::syscall(
                libc::SYS_close_range,
                probe,
                probe,
                libc::CLOSE_RANGE_CLOEXEC,
            ) == 0
        }
    })
}

fn list_open_fds() -> Vec<RawFd> {
    std::fs::read_dir("/proc/self/fd")
        .map(|dir| {
            dir.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}
