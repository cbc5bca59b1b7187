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
//! One file per concern: the parent's side of a start (this file), where
//! the program is and what a failure means (`program.rs`), the child's
//! standard descriptors (`stdio.rs`), the clone and the signal mask around
//! it (`clone.rs`), the child between clone and exec (`child.rs`) and the
//! confinement it applies to itself (`confine.rs`). The `unsafe` of a start
//! lives in the last three.

mod child;
mod clone;
mod confine;
mod program;
mod stdio;

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::OwnedFd;
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
pub(crate) use self::stdio::ChildStdio;
pub use self::stdio::GivenStdio;
use self::stdio::StdioPlan;
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
    .map_err(|error| classify(spec, &error))?;
    Ok(SpawnedChild {
        leader,
        stdin: plan.parent_stdin.take(),
        stdout: plan.parent_stdout.take(),
        stderr: plan.parent_stderr.take(),
        child_ends: std::mem::take(&mut plan.child_ends),
    })
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

pub(super) fn c_string(text: &OsStr) -> io::Result<CString> {
    CString::new(text.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL byte in argument"))
}
