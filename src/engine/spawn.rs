//! Starting a child that starts clean: its own session, every signal at its
//! default disposition, an empty signal mask and nothing open above fd 2.
//!
//! The child is created with clone(2) the way posix_spawn(3) creates one
//! (CLONE_VM | CLONE_VFORK: no copy of the server's memory, so the cost does
//! not grow with the server's size), plus CLONE_PIDFD for a handle that names
//! exactly this child. Between clone and exec the child runs only system
//! calls on memory prepared beforehand; unlike glibc's posix_spawn it resets
//! every signal, the C library's reserved ones included.

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, Ordering};

use crate::engine::reaper::{self, Leader};
use crate::engine::{descriptors, os};
use crate::model::{Refusal, RefusalKind, StartSpec, excerpt, io_message};

/// Where `execvp` looks when the environment has no PATH.
const DEFAULT_PATH: &str = "/bin:/usr/bin";
const SHELL: &str = "/bin/sh";
/// Stack of the child between clone and exec; it only makes system calls.
const CHILD_STACK_BYTES: usize = 64 * 1024;

/// Standard descriptors a child gets as they are, instead of pipes: a
/// client's own, which it sent to a server on its machine, so that the
/// child writes into the client's pipe (or file, or socket) itself. The
/// server closes its copies once the child has them.
#[derive(Debug, Default)]
pub struct GivenStdio {
    pub stdin: Option<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
}

impl GivenStdio {
    /// Whether `fd` may be a child's standard descriptor: a pipe, socket,
    /// regular file or character device (`confined`: a pipe or regular
    /// file only, since through a socket a sandboxed child could reach, or
    /// be sent, what its sandbox denies it); never a directory (a handle a
    /// sandboxed child could open paths under) or an `O_PATH` descriptor.
    /// Asks only what the kernel has cached (`AT_STATX_DONT_SYNC`): a
    /// file on a FUSE mount that stops answering must not stop the server.
    pub fn may_be_stdio(fd: &OwnedFd, confined: bool) -> bool {
        use rustix::fs::{AtFlags, StatxFlags};
        use std::os::fd::AsRawFd;
        // SAFETY: fcntl(F_GETFL) on a descriptor we own.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
        if flags < 0 || flags & libc::O_PATH != 0 {
            return false;
        }
        let Ok(stat) = rustix::fs::statx(
            fd,
            c"",
            AtFlags::EMPTY_PATH | AtFlags::STATX_DONT_SYNC,
            StatxFlags::TYPE,
        ) else {
            return false;
        };
        let kind = u32::from(stat.stx_mode) & libc::S_IFMT;
        match kind {
            libc::S_IFIFO | libc::S_IFREG => true,
            libc::S_IFSOCK | libc::S_IFCHR => !confined,
            _ => false,
        }
    }

    /// Whether every one of them [may be](Self::may_be_stdio) a standard
    /// descriptor.
    pub fn may_all_be_stdio(&self, confined: bool) -> bool {
        [&self.stdin, &self.stdout, &self.stderr]
            .into_iter()
            .flatten()
            .all(|fd| GivenStdio::may_be_stdio(fd, confined))
    }

    fn take_all(&mut self) -> Vec<OwnedFd> {
        [self.stdin.take(), self.stdout.take(), self.stderr.take()]
            .into_iter()
            .flatten()
            .collect()
    }
}

impl Drop for GivenStdio {
    fn drop(&mut self) {
        descriptors::close_in_background(self.take_all());
    }
}

/// The standard descriptors a child gets.
pub(crate) enum ChildStdio {
    /// What `given` has; for the rest, stdin piped or /dev/null, stdout
    /// and stderr piped.
    Pipes { pipe_stdin: bool, given: GivenStdio },
    /// All three on this terminal, opened by the child after it became a
    /// session leader, which makes it the controlling terminal.
    Terminal(PathBuf),
}

pub(crate) struct SpawnedChild {
    pub leader: Leader,
    pub stdin: Option<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
}

/// Spawns `spec` after checking what can be checked first (the spec, the
/// working directory, the program); what the child gets besides its spec is
/// `setup` (see [`ChildSetup`]).
pub(crate) fn spawn(
    spec: &StartSpec,
    stdio: ChildStdio,
    setup: &ChildSetup,
    confine: &crate::sandbox::Plan,
) -> Result<SpawnedChild, Refusal> {
    spec.validate()?;
    let Resolved { cwd, env, program } = resolve(spec)?;
    if let Some(cwd) = &cwd {
        check_cwd(cwd)?;
    }
    confine.check_program(&spec.argv[0], &program)?;

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

    let session = matches!(stdio, ChildStdio::Terminal(_));
    let mut plan = StdioPlan::new(stdio).map_err(|error| spawn_failed(spec, &error))?;
    let confinement = Confinement::of(confine);
    let leader = reaper::spawn_leader(session, || {
        let extras = Extras {
            parent: if setup.die_with_parent {
                // SAFETY: getpid has no preconditions.
                unsafe { libc::getpid() }
            } else {
                0
            },
            descriptor_limit: setup.descriptor_limit.map(|(soft, hard)| libc::rlimit64 {
                rlim_cur: soft,
                rlim_max: hard,
            }),
            confinement: &confinement,
        };
        match launch(
            &program,
            &argv,
            &envp,
            cwd.as_deref(),
            &plan.actions,
            &extras,
        ) {
            // execvp's rule: a file the kernel cannot execute is a script.
            Err(error) if error.raw_os_error() == Some(libc::ENOEXEC) => {
                let mut shell_argv = vec![arg0.as_os_str(), program.as_os_str()];
                shell_argv.extend(argv[1..].iter().copied());
                launch(
                    Path::new(SHELL),
                    &shell_argv,
                    &envp,
                    cwd.as_deref(),
                    &plan.actions,
                    &extras,
                )
            }
            other => other,
        }
    })
    .map_err(|error| classify(spec, &error))?;
    Ok(SpawnedChild {
        leader,
        stdin: plan.parent_stdin.take(),
        stdout: plan.parent_stdout.take(),
        stderr: plan.parent_stderr.take(),
    })
}

/// What a spec resolves to on this host.
struct Resolved {
    /// Absolute, so that resolving the program here and the child's chdir
    /// agree about relative paths.
    cwd: Option<PathBuf>,
    env: Vec<(OsString, OsString)>,
    program: PathBuf,
}

fn resolve(spec: &StartSpec) -> Result<Resolved, Refusal> {
    let cwd = match spec.effective_cwd() {
        Some(cwd) => {
            Some(std::path::absolute(cwd).map_err(|error| bad_cwd(cwd, &io_message(&error)))?)
        }
        None => None,
    };
    let env = child_env(spec);
    let path_var = env
        .iter()
        .find(|(name, _)| name == "PATH")
        .map(|(_, value)| value.as_os_str());
    let program = resolve_program(&spec.argv[0], path_var, cwd.as_deref())
        .map_err(|error| classify(spec, &error))?;
    Ok(Resolved { cwd, env, program })
}

/// The file `spec` would execute: its program resolved as the spawn
/// resolves it (the child's PATH, relative to its working directory).
pub(crate) fn program_path(spec: &StartSpec) -> Result<PathBuf, Refusal> {
    resolve(spec).map(|resolved| resolved.program)
}

/// The child's complete environment: the server's (or none), without the
/// spec's `unset`, with its `set` applied in order.
pub(crate) fn child_env(spec: &StartSpec) -> Vec<(OsString, OsString)> {
    let mut env: HashMap<OsString, OsString> = if spec.env.clear {
        HashMap::new()
    } else {
        std::env::vars_os().collect()
    };
    for name in &spec.env.unset {
        env.remove(name);
    }
    if spec.tty
        && let Some(term) = &spec.term
        && !spec.env.set.iter().any(|(name, _)| name == "TERM")
    {
        env.insert("TERM".into(), term.clone());
    }
    for (name, value) in &spec.env.set {
        env.insert(name.clone(), value.clone());
    }
    env.into_iter().collect()
}

/// A program name looked up on this process's own PATH, as `execvp` would.
pub(crate) fn program_on_own_path(name: &OsStr) -> io::Result<PathBuf> {
    let path_var = std::env::var_os("PATH");
    resolve_program(name, path_var.as_deref(), None)
}

fn bad_cwd(cwd: &Path, why: &str) -> Refusal {
    Refusal::new(
        RefusalKind::BadCwd,
        format!(
            "working directory {}: {why}",
            excerpt(&cwd.display().to_string())
        ),
    )
}

fn check_cwd(cwd: &Path) -> Result<(), Refusal> {
    match std::fs::metadata(cwd) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(Refusal::new(
            RefusalKind::BadCwd,
            format!(
                "working directory {} is not a directory",
                excerpt(&cwd.display().to_string())
            ),
        )),
        Err(error) => Err(bad_cwd(cwd, &io_message(&error))),
    }
}

/// `execvp`'s search: a name with a slash is used as it is (relative to the
/// child's working directory); otherwise the first executable file of that
/// name along PATH. EACCES if only non-executable candidates exist, ENOENT
/// if none.
fn resolve_program(
    program: &OsStr,
    path_var: Option<&OsStr>,
    cwd: Option<&Path>,
) -> io::Result<PathBuf> {
    let in_cwd = |path: &Path| match cwd {
        Some(cwd) if path.is_relative() => cwd.join(path),
        _ => path.to_path_buf(),
    };
    if program.as_bytes().contains(&b'/') {
        return Ok(in_cwd(Path::new(program)));
    }
    let path_var = path_var.unwrap_or(OsStr::new(DEFAULT_PATH));
    let mut denied = false;
    for dir in path_var.as_bytes().split(|&b| b == b':') {
        let dir = if dir.is_empty() {
            Path::new(".")
        } else {
            Path::new(OsStr::from_bytes(dir))
        };
        let candidate = in_cwd(dir).join(program);
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

fn classify(spec: &StartSpec, error: &io::Error) -> Refusal {
    if let Some(failure) = error
        .get_ref()
        .and_then(|e| e.downcast_ref::<SetupFailure>())
    {
        return match failure.step {
            Step::Chdir => Refusal::new(
                RefusalKind::BadCwd,
                format!(
                    "working directory {}: {}",
                    spec.effective_cwd()
                        .map(|cwd| excerpt(&cwd.display().to_string()).into_owned())
                        .unwrap_or_default(),
                    io_message(&failure.error)
                ),
            ),
            Step::Cgroup => Refusal::new(
                RefusalKind::SpawnFailed,
                format!(
                    "cannot move {} into its cgroup: {}",
                    excerpt(&spec.argv[0].to_string_lossy()),
                    io_message(&failure.error)
                ),
            ),
            Step::Confine => Refusal::new(
                RefusalKind::SpawnFailed,
                format!(
                    "cannot confine {} (mounts, user, capabilities, no_new_privs, Landlock, \
                     seccomp): {}",
                    excerpt(&spec.argv[0].to_string_lossy()),
                    io_message(&failure.error)
                ),
            ),
            Step::Setup if descriptors::is_exhaustion(&failure.error) => descriptors::exhausted(
                &format!("set up {}", excerpt(&spec.argv[0].to_string_lossy())),
                &failure.error,
            ),
            Step::Setup => Refusal::new(
                RefusalKind::SpawnFailed,
                format!(
                    "cannot set up {} (session or standard descriptors): {}",
                    excerpt(&spec.argv[0].to_string_lossy()),
                    io_message(&failure.error)
                ),
            ),
        };
    }
    let program = spec.argv[0].to_string_lossy();
    let program = excerpt(&program);
    match error.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ENOTDIR) => Refusal::new(
            RefusalKind::ProgramNotFound,
            format!("program not found: {program}"),
        ),
        Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EISDIR) => {
            // The kernel says "Permission denied" for a directory too.
            let directory = program_path(spec).is_ok_and(|path| path.is_dir());
            let why = if directory {
                "it is a directory".to_string()
            } else {
                io_message(error)
            };
            Refusal::new(
                RefusalKind::PermissionDenied,
                format!("cannot execute {program}: {why}"),
            )
        }
        Some(libc::ENOEXEC) => Refusal::new(
            RefusalKind::PermissionDenied,
            format!("cannot execute {program}: not an executable format"),
        ),
        _ => spawn_failed(spec, error),
    }
}

fn spawn_failed(spec: &StartSpec, error: &io::Error) -> Refusal {
    let doing = format!("start {}", excerpt(&spec.argv[0].to_string_lossy()));
    if descriptors::is_exhaustion(error) {
        return descriptors::exhausted(&doing, error);
    }
    Refusal::new(
        RefusalKind::SpawnFailed,
        format!("cannot {doing}: {}", io_message(error)),
    )
}

fn c_string(text: &OsStr) -> io::Result<CString> {
    CString::new(text.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL byte in argument"))
}

/// A close-on-exec pipe whose ends are above the standard descriptors, so
/// that setting up 0, 1 and 2 in the child cannot clobber one of them.
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    os::cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: the kernel just returned these descriptors to us alone.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((above_stdio(read)?, above_stdio(write)?))
}

fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: duplicates a descriptor we own to one numbered 3 or higher.
    let high = os::cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) })?;
    // SAFETY: fcntl just returned this descriptor to us alone.
    Ok(unsafe { OwnedFd::from_raw_fd(high as RawFd) })
}

/// One step of setting up the child's standard descriptors.
enum StdioAction {
    /// Make `to` a copy of `from`.
    Dup { from: RawFd, to: RawFd },
    /// Open `path` as `to`.
    Open {
        path: CString,
        flags: libc::c_int,
        to: RawFd,
    },
}

/// The child's descriptors, and the parent's ends of its pipes.
struct StdioPlan {
    actions: Vec<StdioAction>,
    parent_stdin: Option<OwnedFd>,
    parent_stdout: Option<OwnedFd>,
    parent_stderr: Option<OwnedFd>,
    /// The child's ends; closed in the parent once the plan is dropped.
    _child_ends: Vec<OwnedFd>,
    /// Given descriptors (a client's): closed off this thread once the
    /// plan is dropped (see [`descriptors::close_in_background`]).
    given: Vec<OwnedFd>,
}

impl Drop for StdioPlan {
    fn drop(&mut self) {
        descriptors::close_in_background(std::mem::take(&mut self.given));
    }
}

impl StdioPlan {
    fn new(stdio: ChildStdio) -> io::Result<StdioPlan> {
        use std::os::fd::AsRawFd;
        let mut plan = StdioPlan {
            actions: Vec::new(),
            parent_stdin: None,
            parent_stdout: None,
            parent_stderr: None,
            _child_ends: Vec::new(),
            given: Vec::new(),
        };
        match stdio {
            ChildStdio::Pipes {
                pipe_stdin,
                mut given,
            } => {
                if let Some(stdin) = given.stdin.take() {
                    plan.give(stdin, 0)?;
                } else if pipe_stdin {
                    let (read, write) = pipe()?;
                    plan.actions.push(StdioAction::Dup {
                        from: read.as_raw_fd(),
                        to: 0,
                    });
                    plan.parent_stdin = Some(write);
                    plan._child_ends.push(read);
                } else {
                    plan.actions.push(StdioAction::Open {
                        path: c_string(OsStr::new("/dev/null"))?,
                        flags: libc::O_RDONLY,
                        to: 0,
                    });
                }
                match given.stdout.take() {
                    Some(stdout) => plan.give(stdout, 1)?,
                    None => plan.parent_stdout = Some(plan.output_pipe(1)?),
                }
                match given.stderr.take() {
                    Some(stderr) => plan.give(stderr, 2)?,
                    None => plan.parent_stderr = Some(plan.output_pipe(2)?),
                }
            }
            ChildStdio::Terminal(slave) => {
                // Without O_NOCTTY: it becomes the controlling terminal of
                // the session the child has just created.
                plan.actions.push(StdioAction::Open {
                    path: c_string(slave.as_os_str())?,
                    flags: libc::O_RDWR,
                    to: 0,
                });
                plan.actions.push(StdioAction::Dup { from: 0, to: 1 });
                plan.actions.push(StdioAction::Dup { from: 0, to: 2 });
            }
        }
        Ok(plan)
    }

    /// A pipe whose write end is the child's `to`; returns the read end.
    fn output_pipe(&mut self, to: RawFd) -> io::Result<OwnedFd> {
        use std::os::fd::AsRawFd;
        let (read, write) = pipe()?;
        self.actions.push(StdioAction::Dup {
            from: write.as_raw_fd(),
            to,
        });
        self._child_ends.push(write);
        Ok(read)
    }

    /// `fd` as the child's `to`, kept above the standard descriptors so
    /// that no earlier step of the plan overwrites it.
    fn give(&mut self, fd: OwnedFd, to: RawFd) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let fd = above_stdio(fd)?;
        self.actions.push(StdioAction::Dup {
            from: fd.as_raw_fd(),
            to,
        });
        self.given.push(fd);
        Ok(())
    }
}

/// The child's steps before exec that can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// New session, signals, standard descriptors.
    Setup,
    Chdir,
    /// Joining its cgroup.
    Cgroup,
    /// Capabilities, no_new_privs, Landlock, seccomp.
    Confine,
}

/// A failure of the child before its exec.
#[derive(Debug)]
struct SetupFailure {
    step: Step,
    error: io::Error,
}

impl std::fmt::Display for SetupFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.step, self.error)
    }
}

impl std::error::Error for SetupFailure {}

const FAILED_IN_SETUP: i32 = 1;
const FAILED_IN_CHDIR: i32 = 2;
const FAILED_IN_EXEC: i32 = 3;
const FAILED_IN_CGROUP: i32 = 4;
const FAILED_IN_CONFINE: i32 = 5;

/// Everything the child needs, prepared before the clone.
struct ChildPlan<'a> {
    /// The leaf's `cgroup.procs`, when the child was not cloned into it.
    join_procs: Option<RawFd>,
    program: &'a CString,
    argv: &'a [*const libc::c_char],
    envp: &'a [*const libc::c_char],
    cwd: Option<&'a CString>,
    stdio: &'a [StdioAction],
    max_signal: libc::c_int,
    /// Descriptors to close when close_range(2) is unavailable.
    open_fds: Option<&'a [RawFd]>,
    extras: &'a Extras<'a>,
    /// The errno of the step that failed, and which step; shared with the
    /// parent (CLONE_VM).
    error: AtomicI32,
    step: AtomicI32,
}

/// How every child of an engine is set up beyond its spec.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChildSetup {
    /// Kill the child (SIGKILL) if the thread that spawned it, normally the
    /// whole server, dies first (PR_SET_PDEATHSIG): for a server, whose
    /// processes must not outlive it even when killed with SIGKILL. Set it
    /// only where starts come from a thread that lives as long as the
    /// engine; the kernel drops it for set-user-ID programs, and what a
    /// child starts itself is orphaned, not killed.
    pub die_with_parent: bool,
    /// The descriptor limit (soft, hard) the child starts with, when the
    /// engine's own was raised: children get what the system gave us.
    pub descriptor_limit: Option<(u64, u64)>,
}

/// [`ChildSetup`] as the child applies it.
struct Extras<'a> {
    /// Our pid if the child must die with us, else 0.
    parent: libc::pid_t,
    descriptor_limit: Option<libc::rlimit64>,
    confinement: &'a Confinement,
}

/// The kernel's capability header and sets (capset(2), version 3).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// A seccomp program as seccomp(2) takes it.
#[repr(C)]
struct SockFprog {
    len: libc::c_ushort,
    filter: *const seccompiler::sock_filter,
}

/// A [`crate::sandbox::Plan`] as the child applies it: raw descriptors
/// and pointers into the plan, which outlives the spawn.
struct Confinement {
    /// The leaf's cgroup2 directory.
    cgroup: Option<RawFd>,
    /// Whether to clone the child into it (else it writes `cgroup.procs`).
    clone_into_cgroup: bool,
    /// The `cgroup.procs` of the leaf's v1 mirrors.
    cgroup_procs: Vec<RawFd>,
    /// Make a cgroup namespace once in them.
    cgroup_namespace: bool,
    /// Detached trees to move onto their paths (a path, a mount), in a
    /// mount namespace of the child's own.
    mounts: Vec<(*const libc::c_char, RawFd)>,
    /// The working directory to enter again once they are in place.
    mounted_cwd: Option<*const libc::c_char>,
    /// The uid and gid to take instead of root's.
    user: Option<u32>,
    drop_capabilities: bool,
    last_capability: libc::c_int,
    bounding_set: u64,
    clear_ambient: bool,
    no_new_privs: bool,
    ruleset: Option<RawFd>,
    seccomp: Option<SockFprog>,
}

impl Confinement {
    fn of(plan: &crate::sandbox::Plan) -> Confinement {
        use std::os::fd::AsRawFd;
        Confinement {
            cgroup: plan.cgroup.as_ref().map(AsRawFd::as_raw_fd),
            clone_into_cgroup: plan.clone_into_cgroup,
            cgroup_procs: plan.cgroup_procs.iter().map(AsRawFd::as_raw_fd).collect(),
            cgroup_namespace: plan.cgroup_namespace,
            mounts: plan
                .mounts
                .iter()
                .map(|(path, tree)| (path.as_ptr(), tree.as_raw_fd()))
                .collect(),
            mounted_cwd: plan.mounted_cwd.as_ref().map(|cwd| cwd.as_ptr()),
            user: plan.user,
            drop_capabilities: plan.drop_capabilities,
            last_capability: plan.last_capability,
            bounding_set: plan.bounding_set,
            clear_ambient: plan.clear_ambient,
            no_new_privs: plan.no_new_privs,
            ruleset: plan.ruleset.as_deref().map(AsRawFd::as_raw_fd),
            seccomp: plan.seccomp.as_ref().map(|program| SockFprog {
                len: program.len() as libc::c_ushort,
                filter: program.as_ptr(),
            }),
        }
    }

    /// Moves the prepared trees into place in a mount namespace of the
    /// child's own (slave to ours: what is mounted here later shows
    /// there): raw system calls only. Returns the failed call's -errno.
    ///
    /// # Safety
    /// Only in the child between clone and exec.
    unsafe fn mount_trees(&self) -> Result<(), libc::c_long> {
        const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;
        if self.mounts.is_empty() {
            return Ok(());
        }
        // SAFETY: raw system calls on values prepared by the parent.
        unsafe {
            let result = raw(libc::syscall(libc::SYS_unshare, libc::CLONE_NEWNS));
            if result < 0 {
                return Err(result);
            }
            let result = raw(libc::syscall(
                libc::SYS_mount,
                c"none".as_ptr(),
                c"/".as_ptr(),
                std::ptr::null::<libc::c_char>(),
                libc::MS_REC | libc::MS_SLAVE,
                std::ptr::null::<libc::c_void>(),
            ));
            if result < 0 {
                return Err(result);
            }
            for &(path, tree) in &self.mounts {
                let result = raw(libc::syscall(
                    libc::SYS_move_mount,
                    tree,
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    path,
                    MOVE_MOUNT_F_EMPTY_PATH,
                ));
                if result < 0 {
                    return Err(result);
                }
            }
            // The directory it was in is the one beneath the trees.
            if let Some(cwd) = self.mounted_cwd {
                let result = raw(libc::syscall(libc::SYS_chdir, cwd));
                if result < 0 {
                    return Err(result);
                }
            }
        }
        Ok(())
    }

    /// Applies the confinement to the calling (child) process: raw system
    /// calls only. Returns the failed call's -errno.
    ///
    /// # Safety
    /// Only in the child between clone and exec.
    unsafe fn apply(&self) -> Result<(), libc::c_long> {
        // SAFETY: raw system calls on values prepared by the parent.
        unsafe {
            if self.drop_capabilities {
                // Only what the bounding set holds: a drop is a call each
                // (and a new set of credentials).
                for capability in 0..=self.last_capability.min(63) {
                    if self.bounding_set & (1u64 << capability) == 0 {
                        continue;
                    }
                    // EINVAL for numbers this kernel does not know.
                    raw(libc::syscall(
                        libc::SYS_prctl,
                        libc::PR_CAPBSET_DROP,
                        capability,
                        0,
                        0,
                        0,
                    ));
                }
                if self.clear_ambient {
                    raw(libc::syscall(
                        libc::SYS_prctl,
                        libc::PR_CAP_AMBIENT,
                        libc::PR_CAP_AMBIENT_CLEAR_ALL,
                        0,
                        0,
                        0,
                    ));
                }
                // Groups first (that needs CAP_SETGID), the uid last: it
                // takes the remaining capabilities with it.
                if let Some(id) = self.user {
                    let result = raw(libc::syscall(
                        libc::SYS_setgroups,
                        0usize,
                        std::ptr::null::<libc::gid_t>(),
                    ));
                    if result < 0 {
                        return Err(result);
                    }
                    let result = raw(libc::syscall(libc::SYS_setresgid, id, id, id));
                    if result < 0 {
                        return Err(result);
                    }
                    let result = raw(libc::syscall(libc::SYS_setresuid, id, id, id));
                    if result < 0 {
                        return Err(result);
                    }
                }
                let header = CapHeader {
                    version: LINUX_CAPABILITY_VERSION_3,
                    pid: 0,
                };
                let none = [CapData {
                    effective: 0,
                    permitted: 0,
                    inheritable: 0,
                }; 2];
                let result = raw(libc::syscall(
                    libc::SYS_capset,
                    &header as *const CapHeader,
                    none.as_ptr(),
                ));
                if result < 0 {
                    return Err(result);
                }
            }
            if self.no_new_privs {
                let result = raw(libc::syscall(
                    libc::SYS_prctl,
                    libc::PR_SET_NO_NEW_PRIVS,
                    1,
                    0,
                    0,
                    0,
                ));
                if result < 0 {
                    return Err(result);
                }
            }
            if let Some(ruleset) = self.ruleset {
                let result = raw(libc::syscall(
                    libc::SYS_landlock_restrict_self,
                    ruleset,
                    0u32,
                ));
                if result < 0 {
                    return Err(result);
                }
            }
            if let Some(program) = &self.seccomp {
                // Last: the filter allows everything that follows.
                let result = raw(libc::syscall(
                    libc::SYS_seccomp,
                    libc::SECCOMP_SET_MODE_FILTER,
                    0u32,
                    program as *const SockFprog,
                ));
                if result < 0 {
                    return Err(result);
                }
            }
        }
        Ok(())
    }
}

fn launch(
    program: &Path,
    argv: &[&OsStr],
    envp: &[OsString],
    cwd: Option<&Path>,
    stdio: &[StdioAction],
    extras: &Extras<'_>,
) -> io::Result<(i32, OwnedFd)> {
    let program = c_string(program.as_os_str())?;
    let argv: Vec<CString> = argv
        .iter()
        .map(|a| c_string(a))
        .collect::<io::Result<_>>()?;
    let envp: Vec<CString> = envp
        .iter()
        .map(|e| c_string(e))
        .collect::<io::Result<_>>()?;
    let cwd = cwd.map(|cwd| c_string(cwd.as_os_str())).transpose()?;
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut envp_ptrs: Vec<*const libc::c_char> = envp.iter().map(|e| e.as_ptr()).collect();
    envp_ptrs.push(std::ptr::null());
    let open_fds = (!close_range_works()).then(list_open_fds);
    let mut plan = ChildPlan {
        join_procs: None,
        program: &program,
        argv: &argv_ptrs,
        envp: &envp_ptrs,
        cwd: cwd.as_ref(),
        stdio,
        max_signal: libc::SIGRTMAX(),
        open_fds: open_fds.as_deref(),
        extras,
        error: AtomicI32::new(0),
        step: AtomicI32::new(0),
    };
    let mut stack = vec![0u8; CHILD_STACK_BYTES];
    // The stack grows down from its 16-byte aligned top.
    let top = (stack.as_mut_ptr() as usize + CHILD_STACK_BYTES) & !15;

    let dumpable = extras.confinement.user.map(|_| dumpable_before_children());
    // Signals stay blocked until the child has reset every handler: a
    // handler of ours must never run in the child, which shares our memory.
    let mut pidfd: libc::c_int = -1;
    let saved = block_all_signals();
    let arg = &plan as *const ChildPlan<'_> as *mut libc::c_void;
    let mut cloned = None;
    if let Some(cgroup) = extras.confinement.cgroup
        && extras.confinement.clone_into_cgroup
    {
        // SAFETY: as for clone below; the child is born in its cgroup.
        let result = unsafe { clone_into_cgroup(cgroup, &mut stack, arg, &mut pidfd) };
        match result {
            Ok(pid) => cloned = Some(pid),
            Err(error) if cannot_clone_into_cgroup(&error) => {}
            Err(error) => {
                restore_signals(saved);
                return Err(error);
            }
        }
    }
    let pid = match cloned {
        Some(pid) => {
            restore_signals(saved);
            pid
        }
        None => {
            // Without clone3's CLONE_INTO_CGROUP the child joins its cgroup
            // by writing its `cgroup.procs`, first thing.
            let procs = match extras.confinement.cgroup {
                Some(cgroup) => match open_procs(cgroup) {
                    Ok(procs) => Some(procs),
                    Err(error) => {
                        restore_signals(saved);
                        return Err(io::Error::other(SetupFailure {
                            step: Step::Cgroup,
                            error,
                        }));
                    }
                },
                None => None,
            };
            plan.join_procs = procs.as_ref().map(std::os::fd::AsRawFd::as_raw_fd);
            let arg = &plan as *const ChildPlan<'_> as *mut libc::c_void;
            // SAFETY: the child runs `child_main` on `stack`, touching only
            // `plan` and making system calls; CLONE_VFORK suspends us until
            // it has exec'd or exited, so everything it uses outlives it.
            unsafe {
                let pid = libc::clone(
                    child_main,
                    top as *mut libc::c_void,
                    libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD,
                    arg,
                    &mut pidfd as *mut libc::c_int,
                );
                let clone_error = io::Error::last_os_error();
                restore_signals(saved);
                if pid < 0 {
                    return Err(clone_error);
                }
                pid
            }
        }
    };
    drop(stack);
    if let Some(dumpable) = dumpable {
        // SAFETY: prctl(PR_SET_DUMPABLE) on this process.
        unsafe { libc::prctl(libc::PR_SET_DUMPABLE, dumpable, 0, 0, 0) };
    }
    // SAFETY: CLONE_PIDFD stored a new descriptor for the child in `pidfd`.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let failed = plan.error.load(Ordering::Acquire);
    if failed != 0 {
        // The child has exited; reap it before reporting why.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waits on our own pidfd into `info`.
        unsafe {
            use std::os::fd::AsRawFd;
            libc::waitid(
                3, // P_PIDFD
                pidfd.as_raw_fd() as libc::id_t,
                &mut info,
                libc::WEXITED | libc::__WALL,
            );
        }
        let error = io::Error::from_raw_os_error(failed);
        return Err(match plan.step.load(Ordering::Acquire) {
            FAILED_IN_EXEC => error,
            FAILED_IN_CHDIR => io::Error::other(SetupFailure {
                step: Step::Chdir,
                error,
            }),
            FAILED_IN_CGROUP => io::Error::other(SetupFailure {
                step: Step::Cgroup,
                error,
            }),
            FAILED_IN_CONFINE => io::Error::other(SetupFailure {
                step: Step::Confine,
                error,
            }),
            _ => io::Error::other(SetupFailure {
                step: Step::Setup,
                error,
            }),
        });
    }
    Ok((pid, pidfd))
}

/// Runs in the child between clone and exec. It shares the parent's memory
/// and thread-local storage, so it must not allocate, lock, unwind or use
/// C library wrappers with side effects (cancellation points): raw system
/// calls only.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's `ChildPlan`, alive while the parent is
    // suspended by CLONE_VFORK; everything below is a raw system call.
    unsafe {
        let plan = &*(arg as *const ChildPlan<'_>);
        let fail = |plan: &ChildPlan<'_>, step: i32, result: libc::c_long| -> ! {
            // Raw system calls return -errno.
            plan.error.store((-result as i32).max(1), Ordering::Release);
            plan.step.store(step, Ordering::Release);
            libc::syscall(libc::SYS_exit_group, 127);
            unreachable_child()
        };
        // Every disposition to default, including the signals the C library
        // reserves. All zeros is SIG_DFL, no flags and an empty mask in the
        // kernel's struct sigaction on every architecture.
        let default = [0u64; 4];
        for signal in 1..=plan.max_signal {
            if signal != libc::SIGKILL && signal != libc::SIGSTOP {
                raw(libc::syscall(
                    libc::SYS_rt_sigaction,
                    signal,
                    default.as_ptr(),
                    std::ptr::null_mut::<u64>(),
                    KERNEL_SIGSET_BYTES,
                ));
            }
        }
        // Into its cgroup first (unless born in it): nothing it starts is
        // ever outside it.
        for &procs in plan
            .join_procs
            .iter()
            .chain(&plan.extras.confinement.cgroup_procs)
        {
            let result = raw(libc::syscall(libc::SYS_write, procs, c"0".as_ptr(), 1usize));
            if result < 0 {
                fail(plan, FAILED_IN_CGROUP, result);
            }
        }
        // Rooted at its leaf, where the kernel keeps it (and what it
        // starts): it can name no cgroup outside to move into.
        if plan.extras.confinement.cgroup_namespace {
            let result = raw(libc::syscall(libc::SYS_unshare, libc::CLONE_NEWCGROUP));
            if result < 0 {
                fail(plan, FAILED_IN_CGROUP, result);
            }
        }
        let result = raw(libc::syscall(libc::SYS_setsid));
        if result < 0 {
            fail(plan, FAILED_IN_SETUP, result);
        }
        if let Some(limit) = &plan.extras.descriptor_limit {
            let result = raw(libc::syscall(
                libc::SYS_prlimit64,
                0,
                libc::RLIMIT_NOFILE,
                limit as *const libc::rlimit64,
                std::ptr::null_mut::<libc::rlimit64>(),
            ));
            if result < 0 {
                fail(plan, FAILED_IN_SETUP, result);
            }
        }
        let parent = plan.extras.parent;
        if parent != 0 {
            let result = raw(libc::syscall(
                libc::SYS_prctl,
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL,
                0,
                0,
                0,
            ));
            if result < 0 {
                fail(plan, FAILED_IN_SETUP, result);
            }
            // The parent may have died before the request took effect.
            if raw(libc::syscall(libc::SYS_getppid)) != libc::c_long::from(parent) {
                fail(plan, FAILED_IN_SETUP, -libc::c_long::from(libc::ESRCH));
            }
        }
        for action in plan.stdio {
            match action {
                StdioAction::Open { path, flags, to } => {
                    let fd = raw(libc::syscall(
                        libc::SYS_openat,
                        libc::AT_FDCWD,
                        path.as_ptr(),
                        *flags,
                        0,
                    ));
                    if fd < 0 {
                        fail(plan, FAILED_IN_SETUP, fd);
                    }
                    if fd != libc::c_long::from(*to) {
                        let result = raw(libc::syscall(libc::SYS_dup3, fd, *to, 0));
                        if result < 0 {
                            fail(plan, FAILED_IN_SETUP, result);
                        }
                        raw(libc::syscall(libc::SYS_close, fd));
                    }
                }
                StdioAction::Dup { from, to } if from == to => {
                    // A dup onto itself keeps close-on-exec; clear it.
                    raw(libc::syscall(libc::SYS_fcntl, *to, libc::F_SETFD, 0));
                }
                StdioAction::Dup { from, to } => {
                    let result = raw(libc::syscall(libc::SYS_dup3, *from, *to, 0));
                    if result < 0 {
                        fail(plan, FAILED_IN_SETUP, result);
                    }
                }
            }
        }
        // Before the working directory is entered: it may be one of them.
        if let Err(result) = plan.extras.confinement.mount_trees() {
            fail(plan, FAILED_IN_CONFINE, result);
        }
        if let Some(cwd) = plan.cwd {
            let result = raw(libc::syscall(libc::SYS_chdir, cwd.as_ptr()));
            if result < 0 {
                fail(plan, FAILED_IN_CHDIR, result);
            }
        }
        // After the terminal is open and the directory changed (Landlock
        // rules apply to what is opened from now on), before the
        // descriptors close (the ruleset's among them).
        if let Err(result) = plan.extras.confinement.apply() {
            fail(plan, FAILED_IN_CONFINE, result);
        }
        match plan.open_fds {
            None => {
                raw(libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32));
            }
            Some(fds) => {
                for &fd in fds {
                    if fd > 2 {
                        raw(libc::syscall(libc::SYS_close, fd));
                    }
                }
            }
        }
        let empty = 0u64;
        raw(libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &empty as *const u64,
            std::ptr::null_mut::<u64>(),
            KERNEL_SIGSET_BYTES,
        ));
        let result = raw(libc::syscall(
            libc::SYS_execve,
            plan.program.as_ptr(),
            plan.argv.as_ptr(),
            plan.envp.as_ptr(),
        ));
        fail(plan, FAILED_IN_EXEC, result)
    }
}

/// This process's dumpable flag before any child changed it. A child that
/// changes its uid before its exec changes the flag of the memory it
/// still shares with us (the kernel resets it as for a set-user-ID
/// program), so the parent puts it back once the child is gone from it.
fn dumpable_before_children() -> libc::c_int {
    static DUMPABLE: OnceLock<libc::c_int> = OnceLock::new();
    // SAFETY: prctl(PR_GET_DUMPABLE) only reads the flag.
    *DUMPABLE.get_or_init(|| unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) }.max(0))
}

/// Size of the kernel's signal set (64 signals); glibc's `sigset_t` is
/// larger. MIPS has 128 signals and is not supported.
const KERNEL_SIGSET_BYTES: usize = 8;
#[cfg(any(target_arch = "mips", target_arch = "mips64"))]
compile_error!("capexec's spawn assumes a 64-signal kernel sigset");

/// A raw system call's result as the kernel gives it: -errno on failure.
/// (libc::syscall returns -1 and sets errno; errno lives in the parent's
/// thread-local storage here, which is shared, so read it at once.)
unsafe fn raw(result: libc::c_long) -> libc::c_long {
    if result == -1 {
        // SAFETY: errno of the calling thread, read right after the call.
        -libc::c_long::from(unsafe { *libc::__errno_location() })
    } else {
        result
    }
}

fn unreachable_child() -> ! {
    loop {
        // exit_group does not return; this only satisfies the type.
        std::hint::spin_loop();
    }
}

/// Blocks every signal of the calling thread (the C library's reserved ones
/// included, which `pthread_sigmask` skips); returns the previous mask.
fn block_all_signals() -> u64 {
    let all = u64::MAX;
    let mut previous = 0u64;
    // SAFETY: rt_sigprocmask on this thread with kernel-sized sets.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &all as *const u64,
            &mut previous as *mut u64,
            KERNEL_SIGSET_BYTES,
        );
    }
    previous
}

fn restore_signals(previous: u64) {
    // SAFETY: as above.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &previous as *const u64,
            std::ptr::null_mut::<u64>(),
            KERNEL_SIGSET_BYTES,
        );
    }
}

/// The `cgroup.procs` of the cgroup2 directory `cgroup`, for writing.
fn open_procs(cgroup: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: openat(2) relative to a directory we hold, with a
    // NUL-terminated name.
    let fd = os::cvt(unsafe {
        libc::openat(
            cgroup,
            c"cgroup.procs".as_ptr(),
            libc::O_WRONLY | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: the kernel just returned this descriptor to us alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Whether clone3 failed only because this kernel cannot clone into a
/// cgroup (no clone3, or no CLONE_INTO_CGROUP): the child joins by
/// `cgroup.procs` then, and later starts do not try again.
fn cannot_clone_into_cgroup(error: &io::Error) -> bool {
    let unsupported = matches!(error.raw_os_error(), Some(libc::ENOSYS) | Some(libc::E2BIG));
    if unsupported {
        CLONE3_UNSUPPORTED.store(true, Ordering::Relaxed);
    }
    unsupported || error.raw_os_error() == Some(libc::EINVAL)
}

static CLONE3_UNSUPPORTED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// clone3's arguments (`struct clone_args`, up to `cgroup`: Linux 5.7).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Clones the child as [`launch`] does (`CLONE_VM | CLONE_VFORK`, a pidfd
/// in `pidfd`), running `child_main(arg)` on `stack`, born in the cgroup2
/// directory `cgroup`: joining a cgroup by `cgroup.procs` takes the
/// kernel's cgroup-wide write lock, whose first taking after a quiet while
/// waits out an RCU grace period (milliseconds); being cloned into one
/// takes only its read side. The pid, or why not.
///
/// # Safety
/// As for `clone(2)` with `child_main`: the child touches only `arg`'s
/// plan and makes system calls, while the caller is suspended; signals
/// are blocked.
#[cfg(target_arch = "x86_64")]
unsafe fn clone_into_cgroup(
    cgroup: RawFd,
    stack: &mut [u8],
    arg: *mut libc::c_void,
    pidfd: &mut libc::c_int,
) -> io::Result<i32> {
    if CLONE3_UNSUPPORTED.load(Ordering::Relaxed) {
        return Err(io::Error::from_raw_os_error(libc::ENOSYS));
    }
    let args = CloneArgs {
        flags: (libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD) as u64 | CLONE_INTO_CGROUP,
        pidfd: pidfd as *mut libc::c_int as u64,
        exit_signal: libc::SIGCHLD as u64,
        stack: stack.as_mut_ptr() as u64,
        stack_size: stack.len() as u64,
        cgroup: cgroup as u64,
        ..CloneArgs::default()
    };
    let entry: extern "C" fn(*mut libc::c_void) -> libc::c_int = child_main;
    let result: libc::c_long;
    // SAFETY: clone3 returns in both processes. The parent (rax: the pid
    // or -errno) goes on as after any system call. The child (rax 0) is
    // on the top of `stack` (the kernel sets its stack pointer there),
    // calls `child_main(arg)` from it and exits with its result; it never
    // comes back into this function's frame, which is the parent's.
    // r12 and r13 hold the entry and its argument across the call (the
    // kernel keeps them in both processes).
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "xor ebp, ebp",
            "and rsp, -16",
            "mov rdi, r13",
            "call r12",
            "mov edi, eax",
            "mov eax, {exit_group}",
            "syscall",
            "ud2",
            "2:",
            exit_group = const libc::SYS_exit_group,
            inlateout("rax") libc::SYS_clone3 => result,
            in("rdi") &args as *const CloneArgs,
            in("rsi") std::mem::size_of::<CloneArgs>(),
            in("r12") entry,
            in("r13") arg,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    if result < 0 {
        return Err(io::Error::from_raw_os_error(-result as i32));
    }
    Ok(result as i32)
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn clone_into_cgroup(
    _cgroup: RawFd,
    _stack: &mut [u8],
    _arg: *mut libc::c_void,
    _pidfd: &mut libc::c_int,
) -> io::Result<i32> {
    // Joined by `cgroup.procs`: no clone3 entry for this processor yet.
    Err(io::Error::from_raw_os_error(libc::ENOSYS))
}

fn close_range_works() -> bool {
    static WORKS: OnceLock<bool> = OnceLock::new();
    *WORKS.get_or_init(|| {
        // An empty range far above any open descriptor changes nothing but
        // tells whether the kernel knows the call.
        let probe = i32::MAX as u32;
        // SAFETY: close_range on an empty range has no effect.
        unsafe { libc::syscall(libc::SYS_close_range, probe, probe, 0u32) == 0 }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_programs_resolve_against_the_working_directory() {
        let cwd = Path::new("/usr");
        assert_eq!(
            resolve_program(OsStr::new("./bin/env"), None, Some(cwd)).expect("found"),
            Path::new("/usr/./bin/env")
        );
        assert_eq!(
            resolve_program(OsStr::new("env"), Some(OsStr::new("bin")), Some(cwd)).expect("found"),
            Path::new("/usr/bin/env")
        );
        let missing = resolve_program(
            OsStr::new("capexec-none"),
            Some(OsStr::new("/usr/bin")),
            None,
        );
        assert_eq!(
            missing.expect_err("missing").raw_os_error(),
            Some(libc::ENOENT)
        );
    }

    #[test]
    fn a_terminal_gets_its_type_unless_the_start_sets_term() {
        let mut spec = StartSpec::new(["sh"]);
        spec.env.clear = true;
        spec.term = Some("xterm-kitty".into());
        assert!(child_env(&spec).is_empty(), "no terminal, no TERM");
        spec.tty = true;
        assert_eq!(
            child_env(&spec),
            vec![("TERM".into(), "xterm-kitty".into())]
        );
        spec.env.set = vec![("TERM".into(), "dumb".into())];
        assert_eq!(child_env(&spec), vec![("TERM".into(), "dumb".into())]);
        for bad in ["", "../../x", "a b", "x=y"] {
            spec.term = Some(bad.into());
            assert!(spec.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn environment_is_built_by_clear_unset_then_set() {
        let mut spec = StartSpec::new(["env"]);
        spec.env.clear = true;
        spec.env.set = vec![
            ("A".into(), "1".into()),
            ("B".into(), "2".into()),
            ("A".into(), "3".into()),
        ];
        spec.env.unset = vec!["B".into()];
        let mut env = child_env(&spec);
        env.sort();
        assert_eq!(
            env,
            vec![("A".into(), "3".into()), ("B".into(), "2".into())]
        );

        let mut inherit = StartSpec::new(["env"]);
        inherit.env.unset = vec!["PATH".into()];
        assert!(child_env(&inherit).iter().all(|(name, _)| name != "PATH"));
    }
}
