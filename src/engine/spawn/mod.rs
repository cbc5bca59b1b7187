//! Starting a child that starts clean: its own session, every signal at its
//! default disposition, an empty signal mask and nothing open above fd 2.
//!
//! The child is created with clone(2) the way posix_spawn(3) creates one
//! (CLONE_VM | CLONE_VFORK: no copy of the server's memory, so the cost does
//! not grow with the server's size), plus CLONE_PIDFD for a handle that names
//! exactly this child. Between clone and exec the child runs only system
//! calls on memory prepared beforehand; unlike glibc's posix_spawn it resets
//! every signal, the C library's reserved ones included.
//!
//! The clone is made on a thread of its own whose descriptor table holds
//! only what the child being started needs (`spawner.rs`): a child holds
//! a copy of its parent's table until its exec, and must never hold the
//! last copy of a descriptor some client sent.
//!
//! One file per concern: the parent's side of a start (this file), where
//! the program is and what a failure means (`program.rs`), the child's
//! standard descriptors (`stdio.rs`), the thread that clones
//! (`spawner.rs`), the clone and the signal mask around it (`clone.rs`),
//! the child between clone and exec (`child.rs`) and the confinement it
//! applies to itself (`confine.rs`). The `unsafe` of a start lives in the
//! last four.

mod child;
mod clone;
mod confine;
mod program;
mod spawner;
mod stdio;

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use self::child::Extras;
use self::clone::launch;
use self::confine::Confinement;
use self::program::{Resolved, classify, resolve, spawn_failed};
// The child's environment, for the policy's tests.
#[cfg(test)]
pub(crate) use self::program::child_env;
pub(crate) use self::program::{program_on_own_path, program_path};
pub(crate) use self::spawner::prepare as prepare_spawner;
pub use self::spawner::{COPIES_BELOW as SPAWNER_COPIES_BELOW, forgo as forgo_spawner};
pub(crate) use self::stdio::ChildStdio;
pub use self::stdio::GivenStdio;
use self::stdio::{StdioAction, StdioPlan};
use crate::engine::reaper::{self, Leader};
use crate::model::{Refusal, StartSpec};

const SHELL: &str = "/bin/sh";

pub(crate) struct SpawnedChild {
    pub leader: Leader,
    pub stdin: Option<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
    /// The child's ends of its pipes, which the parent closes on the
    /// process's own thread (`io_thread.rs`).
    pub child_ends: Vec<OwnedFd>,
}

/// Spawns `spec`, validated by the engine already, after checking the
/// program first; what the child gets besides its spec is `setup` (see
/// [`ChildSetup`]).
pub(crate) fn spawn(
    spec: &StartSpec,
    stdio: ChildStdio,
    setup: &ChildSetup,
    confine: &crate::sandbox::Plan,
    cwd: &crate::engine::WorkingDir,
) -> Result<SpawnedChild, Refusal> {
    let Resolved { env, program } = resolve(spec)?;
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
    // A child that must die with the server and has no cgroup sentinel to
    // see to it is cloned here, where PR_SET_PDEATHSIG can follow this
    // thread (see `spawner.rs`). So is one given a file that may flush
    // when closed (one on a FUSE mount whose client does not answer, or
    // on NFS; a device we do not know): the spawner closes its copy, and
    // must never wait on a client (`StdioPlan::given_may_flush`).
    let die_with_this_thread = setup.die_with_parent && confine.cgroup.is_none();
    // Where this thread runs is read here: the job runs on the spawner.
    let spawner = if die_with_this_thread || plan.given_may_flush() {
        None
    } else {
        spawner::ready().map(|spawner| (spawner, spawner::Placement::of_this_thread()))
    };
    // What the spawner brings into its table (nothing for a start here).
    let needed: Vec<RawFd> = match spawner {
        Some(_) => std::iter::once(cwd.raw_fd())
            .chain(
                plan.actions
                    .iter()
                    .filter_map(StdioAction::parent_descriptor),
            )
            .chain(confinement.descriptors())
            .collect(),
        None => Vec::new(),
    };
    let leader = reaper::spawn_leader(session, || {
        launch_from(spawner, &needed, || {
            let extras = Extras {
                parent: if setup.die_with_parent && spawner.is_none() {
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
            match launch(&program, &argv, &envp, cwd.raw_fd(), &plan.actions, &extras) {
                // execvp's rule: a file the kernel cannot execute is a script.
                Err(error) if error.raw_os_error() == Some(libc::ENOEXEC) => {
                    let mut shell_argv = vec![arg0.as_os_str(), program.as_os_str()];
                    shell_argv.extend(argv[1..].iter().copied());
                    launch(
                        Path::new(SHELL),
                        &shell_argv,
                        &envp,
                        cwd.raw_fd(),
                        &plan.actions,
                        &extras,
                    )
                }
                other => other,
            }
        })
    })
    .map_err(|error| classify(spec, &error))?;
    Ok(SpawnedChild {
        leader,
        stdin: plan.parent_stdin.take(),
        stdout: plan.parent_stdout.take(),
        stderr: plan.parent_stderr.take(),
        child_ends: std::mem::take(&mut plan.child_ends),
    })
}

/// `launch` run on the spawner, where children are cloned from a table
/// holding only their own descriptors (`spawner.rs`), with `needed` there
/// (or, without it, on this thread); the child's pidfd comes back into
/// ours.
fn launch_from(
    spawner: Option<(&spawner::Spawner, spawner::Placement)>,
    needed: &[RawFd],
    launch: impl FnOnce() -> io::Result<(i32, OwnedFd)>,
) -> io::Result<(i32, OwnedFd)> {
    let job = |hand_back: &mut spawner::HandBack| -> io::Result<i32> {
        let (pid, pidfd) = launch()?;
        // The first descriptor a job gives always fits; were it refused,
        // none would come back, and the child is killed by its number
        // below.
        let _ = hand_back.give(pidfd);
        Ok(pid)
    };
    let ran = match spawner {
        // SAFETY: `launch` uses the plan's memory, which outlives the call,
        // and no descriptor but `needed`; it closes none of ours (the
        // procs file and the child's pidfd it opens are the spawner's).
        Some((spawner, placement)) => unsafe { spawner.in_private_table(placement, needed, job)? },
        None => spawner::on_this_thread(job),
    };
    let pid = ran.value?;
    match ran.handed_back {
        Ok(mut given) if given.len() == 1 => Ok((pid, given.remove(0))),
        other => {
            // Not reaped yet: only our pidfds or the reaper, under the lock
            // our caller holds, reap a child. So the number is still its.
            // SAFETY: kill(2) with a pid and a signal.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            reap(libc::P_PID, pid as libc::id_t);
            Err(other.err().unwrap_or_else(|| {
                io::Error::other("the spawner handed back no pidfd for the child")
            }))
        }
    }
}

/// Waits for the child `id` names to exit, and reaps it.
pub(super) fn reap(idtype: libc::idtype_t, id: libc::id_t) {
    // SAFETY: siginfo_t is plain data, valid all zeroes.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waits on our own child into `info`.
    unsafe { libc::waitid(idtype, id, &mut info, libc::WEXITED | libc::__WALL) };
}

/// How every child of an engine is set up beyond its spec.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChildSetup {
    /// Kill the child (SIGKILL) if the thread that spawned it, normally the
    /// whole server, dies first (PR_SET_PDEATHSIG): for a server, whose
    /// processes must not outlive it even when killed with SIGKILL. Set it
    /// only where starts come from a thread that lives as long as the
    /// engine; the kernel drops it for set-user-ID programs, and what a
    /// child starts itself is orphaned, not killed. A child cloned on the
    /// spawner (`spawner.rs`: only one in a cgroup leaf, whose sentinel
    /// kills its whole tree when the server dies) is not set so: an
    /// upgrade's exec ends that thread.
    pub die_with_parent: bool,
    /// The descriptor limit (soft, hard) the child starts with, when the
    /// engine's own was raised: children get what the system gave us.
    pub descriptor_limit: Option<(u64, u64)>,
}

pub(super) fn c_string(text: &OsStr) -> io::Result<CString> {
    CString::new(text.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL byte in argument"))
}
