//! Starting a child that starts clean: its own session, default signal
//! dispositions, an empty signal mask and no inherited descriptors.
//!
//! posix_spawn(3) does it: glibc implements it with vfork-style cloning, so
//! the cost does not grow with the server's memory, and every piece of set-up
//! (new session, signals, descriptors, working directory, controlling
//! terminal) is a spawn attribute or file action rather than code running
//! between fork and exec.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::engine::reaper::{self, ExitWait};
use crate::engine::spec::StartSpec;
use crate::model::{StartError, StartErrorKind};

/// Where `execvp` looks when the environment has no PATH.
const DEFAULT_PATH: &str = "/bin:/usr/bin";
const SHELL: &str = "/bin/sh";

/// The standard descriptors a child gets.
pub(crate) enum ChildStdio {
    /// stdin piped or /dev/null; stdout and stderr piped.
    Pipes { pipe_stdin: bool },
    /// All three on this terminal, opened by the child after it became a
    /// session leader, which makes it the controlling terminal.
    Terminal(PathBuf),
}

pub(crate) struct SpawnedChild {
    pub pid: i32,
    pub stdin: Option<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
    pub exit: ExitWait,
}

/// Checks what can be checked first, then spawns.
pub(crate) fn spawn(spec: &StartSpec, stdio: ChildStdio) -> Result<SpawnedChild, StartError> {
    spec.validate()?;
    let cwd = spec.effective_cwd();
    if let Some(cwd) = cwd {
        check_cwd(cwd)?;
    }
    let env = spec.child_env();
    let path_var = env
        .iter()
        .find(|(name, _)| name == "PATH")
        .map(|(_, value)| value.as_os_str());
    let program =
        resolve_program(&spec.argv[0], path_var, cwd).map_err(|error| classify(spec, &error))?;

    let arg0 = spec.arg0.as_ref().unwrap_or(&spec.argv[0]);
    let mut argv: Vec<&OsStr> = vec![arg0.as_os_str()];
    argv.extend(spec.argv[1..].iter().map(OsString::as_os_str));
    let envp: Vec<OsString> = env
        .iter()
        .map(|(name, value)| {
            let mut pair = name.clone();
            pair.push("=");
            pair.push(value);
            pair
        })
        .collect();

    let mut plan = StdioPlan::new(&stdio, cwd.map(PathBuf::as_path))
        .map_err(|error| spawn_failed(spec, &error))?;
    let launch = |program: &Path, argv: &[&OsStr]| {
        reaper::spawn_child(
            || posix_spawn(program, argv, &envp, &plan.actions),
            |&pid| pid,
        )
    };
    let spawned = match launch(&program, &argv) {
        // execvp's rule: a file the kernel cannot execute is a shell script.
        Err(error) if error.raw_os_error() == Some(libc::ENOEXEC) => {
            let mut shell_argv = vec![arg0.as_os_str(), program.as_os_str()];
            shell_argv.extend(argv[1..].iter().copied());
            launch(Path::new(SHELL), &shell_argv)
        }
        other => other,
    };
    let (pid, exit) = spawned.map_err(|error| classify(spec, &error))?;
    Ok(SpawnedChild {
        pid,
        stdin: plan.parent_stdin.take(),
        stdout: plan.parent_stdout.take(),
        stderr: plan.parent_stderr.take(),
        exit,
    })
}

fn check_cwd(cwd: &Path) -> Result<(), StartError> {
    match std::fs::metadata(cwd) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(StartError::new(
            StartErrorKind::BadCwd,
            format!("working directory {} is not a directory", cwd.display()),
        )),
        Err(error) => Err(StartError::new(
            StartErrorKind::BadCwd,
            format!("working directory {}: {}", cwd.display(), plain(&error)),
        )),
    }
}

/// `execvp`'s search: a name with a slash is used as it is; otherwise the
/// first executable file of that name along PATH. EACCES if only
/// non-executable candidates exist, ENOENT if none.
fn resolve_program(
    program: &OsStr,
    path_var: Option<&OsStr>,
    cwd: Option<&PathBuf>,
) -> io::Result<PathBuf> {
    if program.as_bytes().contains(&b'/') {
        let path = PathBuf::from(program);
        // The child resolves relative paths after its chdir; so do we.
        return Ok(match cwd {
            Some(cwd) if path.is_relative() => cwd.join(path),
            _ => path,
        });
    }
    let path_var = path_var.unwrap_or(OsStr::new(DEFAULT_PATH));
    let mut denied = false;
    for dir in path_var.as_bytes().split(|&b| b == b':') {
        let dir = if dir.is_empty() {
            Path::new(".")
        } else {
            Path::new(OsStr::from_bytes(dir))
        };
        let dir = match cwd {
            Some(cwd) if dir.is_relative() => cwd.join(dir),
            _ => dir.to_path_buf(),
        };
        let candidate = dir.join(program);
        match std::fs::metadata(&candidate) {
            Ok(meta) if meta.is_file() => {
                if executable(&candidate) {
                    return Ok(candidate);
                }
                denied = true;
            }
            Ok(_) => denied = true,
            Err(_) => {}
        }
    }
    Err(io::Error::from_raw_os_error(if denied {
        libc::EACCES
    } else {
        libc::ENOENT
    }))
}

fn executable(path: &Path) -> bool {
    let Ok(path) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access(2) reads a NUL-terminated path.
    unsafe { libc::access(path.as_ptr(), libc::X_OK) == 0 }
}

fn classify(spec: &StartSpec, error: &io::Error) -> StartError {
    let program = spec.argv[0].to_string_lossy();
    match error.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ENOTDIR) => StartError::new(
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

fn c_string(text: &OsStr) -> io::Result<CString> {
    CString::new(text.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL byte in argument"))
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned these descriptors to us alone.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The child's descriptors as file actions, and the parent's ends.
struct StdioPlan {
    actions: FileActions,
    parent_stdin: Option<OwnedFd>,
    parent_stdout: Option<OwnedFd>,
    parent_stderr: Option<OwnedFd>,
    /// The child's ends; closed in the parent once the plan is dropped.
    _child_ends: Vec<OwnedFd>,
}

impl StdioPlan {
    fn new(stdio: &ChildStdio, cwd: Option<&Path>) -> io::Result<StdioPlan> {
        let mut actions = FileActions::new()?;
        let mut plan = StdioPlan {
            actions: FileActions::empty(),
            parent_stdin: None,
            parent_stdout: None,
            parent_stderr: None,
            _child_ends: Vec::new(),
        };
        match stdio {
            ChildStdio::Pipes { pipe_stdin } => {
                if *pipe_stdin {
                    let (read, write) = pipe()?;
                    actions.dup2(read.as_raw_fd(), 0)?;
                    plan.parent_stdin = Some(write);
                    plan._child_ends.push(read);
                } else {
                    actions.open(0, Path::new("/dev/null"), libc::O_RDONLY)?;
                }
                let (read, write) = pipe()?;
                actions.dup2(write.as_raw_fd(), 1)?;
                plan.parent_stdout = Some(read);
                plan._child_ends.push(write);
                let (read, write) = pipe()?;
                actions.dup2(write.as_raw_fd(), 2)?;
                plan.parent_stderr = Some(read);
                plan._child_ends.push(write);
            }
            ChildStdio::Terminal(slave) => {
                // Opened after setsid and without O_NOCTTY: it becomes the
                // session's controlling terminal.
                actions.open(0, slave, libc::O_RDWR)?;
                actions.dup2(0, 1)?;
                actions.dup2(0, 2)?;
            }
        }
        actions.close_from(3)?;
        if let Some(cwd) = cwd {
            actions.chdir(cwd)?;
        }
        plan.actions = actions;
        Ok(plan)
    }
}

/// posix_spawn file actions, with the strings they point to kept alive.
struct FileActions {
    raw: Option<Box<libc::posix_spawn_file_actions_t>>,
    strings: Vec<CString>,
}

impl FileActions {
    fn empty() -> FileActions {
        FileActions {
            raw: None,
            strings: Vec::new(),
        }
    }

    fn new() -> io::Result<FileActions> {
        // SAFETY: zeroed storage is what posix_spawn_file_actions_init fills.
        let mut raw: Box<libc::posix_spawn_file_actions_t> =
            Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: initialises the storage above.
        check(unsafe { libc::posix_spawn_file_actions_init(&mut *raw) })?;
        Ok(FileActions {
            raw: Some(raw),
            strings: Vec::new(),
        })
    }

    fn raw(&mut self) -> io::Result<&mut libc::posix_spawn_file_actions_t> {
        self.raw
            .as_deref_mut()
            .ok_or_else(|| io::Error::other("file actions are not initialised"))
    }

    fn dup2(&mut self, from: RawFd, to: RawFd) -> io::Result<()> {
        // SAFETY: the actions are initialised; adddup2 only records the pair.
        check(unsafe { libc::posix_spawn_file_actions_adddup2(self.raw()?, from, to) })
    }

    fn open(&mut self, fd: RawFd, path: &Path, flags: libc::c_int) -> io::Result<()> {
        let path = c_string(path.as_os_str())?;
        // SAFETY: the actions are initialised and `path` is kept in
        // `self.strings` for as long as the actions live.
        check(unsafe {
            libc::posix_spawn_file_actions_addopen(self.raw()?, fd, path.as_ptr(), flags, 0)
        })?;
        self.strings.push(path);
        Ok(())
    }

    fn close_from(&mut self, fd: RawFd) -> io::Result<()> {
        // SAFETY: the actions are initialised.
        check(unsafe { libc::posix_spawn_file_actions_addclosefrom_np(self.raw()?, fd) })
    }

    fn chdir(&mut self, dir: &Path) -> io::Result<()> {
        let dir = c_string(dir.as_os_str())?;
        // SAFETY: as in `open`, `dir` lives as long as the actions.
        check(unsafe { libc::posix_spawn_file_actions_addchdir_np(self.raw()?, dir.as_ptr()) })?;
        self.strings.push(dir);
        Ok(())
    }
}

impl Drop for FileActions {
    fn drop(&mut self) {
        if let Some(raw) = self.raw.as_deref_mut() {
            // SAFETY: destroys what init created, once.
            unsafe { libc::posix_spawn_file_actions_destroy(raw) };
        }
    }
}

/// posix_spawn attributes: a new session, an empty signal mask, and every
/// signal at its default disposition (ignored ones stay ignored across exec
/// otherwise: nohup, background jobs). The exception is glibc's own: it
/// leaves the two real-time signals it reserves (32 and 33) ignored in every
/// posix_spawn child, as in children of `std::process`; programs cannot use
/// those through the C library anyway.
struct SpawnAttributes {
    raw: libc::posix_spawnattr_t,
}

impl SpawnAttributes {
    fn new() -> io::Result<SpawnAttributes> {
        // SAFETY: zeroed storage is what posix_spawnattr_init fills; the
        // signal sets are initialised before use.
        unsafe {
            let mut attributes = SpawnAttributes {
                raw: std::mem::zeroed(),
            };
            check(libc::posix_spawnattr_init(&mut attributes.raw))?;
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            check(libc::posix_spawnattr_setsigmask(
                &mut attributes.raw,
                &empty,
            ))?;
            check(libc::posix_spawnattr_setsigdefault(
                &mut attributes.raw,
                &all,
            ))?;
            let flags = libc::POSIX_SPAWN_SETSID
                | libc::POSIX_SPAWN_SETSIGMASK as libc::c_short
                | libc::POSIX_SPAWN_SETSIGDEF as libc::c_short;
            check(libc::posix_spawnattr_setflags(&mut attributes.raw, flags))?;
            Ok(attributes)
        }
    }
}

impl Drop for SpawnAttributes {
    fn drop(&mut self) {
        // SAFETY: destroys what init created, once.
        unsafe { libc::posix_spawnattr_destroy(&mut self.raw) };
    }
}

fn posix_spawn(
    program: &Path,
    argv: &[&OsStr],
    envp: &[OsString],
    actions: &FileActions,
) -> io::Result<i32> {
    let program = c_string(program.as_os_str())?;
    let argv: Vec<CString> = argv
        .iter()
        .map(|a| c_string(a))
        .collect::<io::Result<_>>()?;
    let envp: Vec<CString> = envp
        .iter()
        .map(|e| c_string(e))
        .collect::<io::Result<_>>()?;
    let mut argv_ptrs: Vec<*mut libc::c_char> =
        argv.iter().map(|a| a.as_ptr().cast_mut()).collect();
    argv_ptrs.push(std::ptr::null_mut());
    let mut envp_ptrs: Vec<*mut libc::c_char> =
        envp.iter().map(|e| e.as_ptr().cast_mut()).collect();
    envp_ptrs.push(std::ptr::null_mut());
    let attributes = SpawnAttributes::new()?;
    let raw_actions = actions
        .raw
        .as_deref()
        .ok_or_else(|| io::Error::other("file actions are not initialised"))?;
    let mut pid: libc::pid_t = 0;
    // SAFETY: every pointer refers to storage that outlives the call, and
    // the argv and envp arrays are NULL-terminated.
    let rc = unsafe {
        libc::posix_spawn(
            &mut pid,
            program.as_ptr(),
            raw_actions,
            &attributes.raw,
            argv_ptrs.as_ptr(),
            envp_ptrs.as_ptr(),
        )
    };
    check(rc)?;
    Ok(pid)
}
