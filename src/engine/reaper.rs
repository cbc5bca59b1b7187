//! Learning how each spawned child ended, without leaving zombies.
//!
//! Two modes, chosen once per process:
//! - per child (the default for a library): each child is waited for through
//!   its pidfd, touching no other child of the host program;
//! - subreaper ([`become_subreaper`], used by the `capexec` binary): the
//!   process becomes the reaper of every orphaned descendant, so grandchildren
//!   killed with their group are reaped here instead of piling up as zombies
//!   under an init that does not reap (common in containers). One thread owns
//!   `waitid` for the whole process; it must be the only code waiting for
//!   children.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;

use crate::model::{ExitStatus, Signal};

/// `idtype_t` value of waitid(2) for a pidfd (Linux 5.4).
const P_PIDFD: libc::idtype_t = 3;

static SUBREAPER: OnceLock<Subreaper> = OnceLock::new();

struct Subreaper {
    waiters: Mutex<Waiters>,
    spawned: Condvar,
}

#[derive(Default)]
struct Waiters {
    by_pid: HashMap<i32, oneshot::Sender<ExitStatus>>,
    spawn_count: u64,
}

impl Subreaper {
    fn lock(&self) -> MutexGuard<'_, Waiters> {
        self.waiters
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}

/// Makes this process the reaper of its orphaned descendants and starts the
/// thread that reaps every child. Call it before spawning anything; calling
/// it again is a no-op.
pub fn become_subreaper() -> io::Result<()> {
    if SUBREAPER.get().is_some() {
        return Ok(());
    }
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes an integer flag only.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut started = false;
    let reaper = SUBREAPER.get_or_init(|| {
        started = true;
        Subreaper {
            waiters: Mutex::new(Waiters::default()),
            spawned: Condvar::new(),
        }
    });
    if started {
        std::thread::Builder::new()
            .name("capexec-reaper".into())
            .spawn(move || reap_forever(reaper))?;
    }
    Ok(())
}

/// Whether [`become_subreaper`] is in effect.
pub fn is_subreaper() -> bool {
    SUBREAPER.get().is_some()
}

/// How to learn the exit status of one spawned child.
pub(crate) enum ExitWait {
    Channel(oneshot::Receiver<ExitStatus>),
    Pidfd(AsyncFd<OwnedFd>),
}

impl ExitWait {
    pub(crate) async fn wait(self) -> ExitStatus {
        match self {
            ExitWait::Channel(receiver) => receiver.await.unwrap_or(LOST_STATUS),
            ExitWait::Pidfd(fd) => wait_pidfd(fd).await,
        }
    }
}

/// Reported if the reaper vanished, which only happens when the process is
/// being torn down.
const LOST_STATUS: ExitStatus = ExitStatus::Killed {
    signal: Some(Signal::Kill),
    number: libc::SIGKILL,
    core_dumped: false,
};

/// Runs `spawn` (which forks) so that the new child's exit cannot be missed.
pub(crate) fn spawn_child<T>(
    spawn: impl FnOnce() -> io::Result<T>,
    pid_of: impl Fn(&T) -> i32,
) -> io::Result<(T, ExitWait)> {
    if let Some(reaper) = SUBREAPER.get() {
        // Holding the lock across the fork makes the reaper thread, which
        // looks children up under the same lock, see the registration of any
        // child it finds waitable. It also keeps it away from a child whose
        // exec failed until std has reaped that child itself.
        let mut waiters = reaper.lock();
        let child = spawn()?;
        let pid = pid_of(&child);
        let (sender, receiver) = oneshot::channel();
        waiters.by_pid.insert(pid, sender);
        waiters.spawn_count += 1;
        drop(waiters);
        reaper.spawned.notify_all();
        return Ok((child, ExitWait::Channel(receiver)));
    }
    let child = spawn()?;
    let pid = pid_of(&child);
    Ok((child, per_child_wait(pid)))
}

fn per_child_wait(pid: i32) -> ExitWait {
    match pidfd_open(pid).and_then(|fd| register(fd, Interest::READABLE)) {
        Ok(fd) => ExitWait::Pidfd(fd),
        Err(error) => {
            tracing::debug!(%error, "pidfd unavailable; waiting on a thread");
            let (sender, receiver) = oneshot::channel();
            let spawned = std::thread::Builder::new()
                .name("capexec-wait".into())
                .stack_size(64 * 1024)
                .spawn(move || {
                    if let Some(status) = wait_blocking(pid) {
                        let _ = sender.send(status);
                    }
                });
            if let Err(error) = spawned {
                tracing::error!(%error, pid, "cannot start a wait thread");
            }
            ExitWait::Channel(receiver)
        }
    }
}

/// Registers an owned descriptor with the tokio reactor.
pub(crate) fn register(fd: OwnedFd, interest: Interest) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd keeps its descriptor open and unchanged for as long
    // as the AsyncFd owns it.
    unsafe { AsyncFd::register_with_interest(fd, interest) }.map_err(|e| e.into_parts().1)
}

fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

async fn wait_pidfd(fd: AsyncFd<OwnedFd>) -> ExitStatus {
    loop {
        let mut guard = match fd.readable().await {
            Ok(guard) => guard,
            Err(error) => {
                tracing::error!(%error, "pidfd wait failed");
                return LOST_STATUS;
            }
        };
        let mut info = zeroed_siginfo();
        // SAFETY: waitid writes into `info`, which lives across the call.
        let rc = unsafe {
            libc::waitid(
                P_PIDFD,
                fd.get_ref().as_raw_fd() as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG,
            )
        };
        if rc == 0 && child_pid(&info) != 0 {
            return decode(&info);
        }
        if rc != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            tracing::error!(error = %io::Error::last_os_error(), "waitid on pidfd failed");
            return LOST_STATUS;
        }
        guard.clear_ready();
    }
}

fn wait_blocking(pid: i32) -> Option<ExitStatus> {
    loop {
        let mut info = zeroed_siginfo();
        // SAFETY: waitid writes into `info`, which lives across the call.
        let rc = unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED) };
        if rc == 0 {
            return Some(decode(&info));
        }
        if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return None;
        }
    }
}

fn reap_forever(reaper: &Subreaper) {
    loop {
        // Read before waiting: a spawn that lands between a "no children"
        // answer and the sleep below then still wakes this thread.
        let seen = reaper.lock().spawn_count;
        // Peek first: a child whose exec failed belongs to std, which reaps
        // it while its spawn still holds the waiters lock.
        let mut info = zeroed_siginfo();
        // SAFETY: waitid writes into `info`, which lives across the call.
        let rc = unsafe { libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if rc != 0 {
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::ECHILD) => {
                    // No children means no descendants either (orphans are
                    // reparented to us), so only a new spawn can change that.
                    let waiters = reaper.lock();
                    let _unused = reaper
                        .spawned
                        .wait_timeout_while(waiters, Duration::from_secs(1), |w| {
                            w.spawn_count == seen
                        })
                        .unwrap_or_else(|poison| poison.into_inner());
                    continue;
                }
                _ => {
                    tracing::error!(error = %io::Error::last_os_error(), "waitid failed");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            }
        }
        let pid = child_pid(&info);
        let mut waiters = reaper.lock();
        let mut reaped = zeroed_siginfo();
        // SAFETY: waitid writes into `reaped`, which lives across the call.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut reaped,
                libc::WEXITED | libc::WNOHANG,
            )
        };
        if rc == 0
            && child_pid(&reaped) == pid
            && let Some(sender) = waiters.by_pid.remove(&pid)
        {
            let _ = sender.send(decode(&reaped));
        }
        // Otherwise an orphaned descendant: reaping it was the point.
    }
}

fn zeroed_siginfo() -> libc::siginfo_t {
    // SAFETY: siginfo_t is plain old data; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

fn child_pid(info: &libc::siginfo_t) -> i32 {
    // SAFETY: waitid filled `info` for a SIGCHLD, so the pid field is valid.
    unsafe { info.si_pid() }
}

fn decode(info: &libc::siginfo_t) -> ExitStatus {
    // SAFETY: as above, the status field is valid for SIGCHLD info.
    let status = unsafe { info.si_status() };
    match info.si_code {
        libc::CLD_EXITED => ExitStatus::Code(status),
        code => ExitStatus::Killed {
            signal: Signal::from_number(status),
            number: status,
            core_dumped: code == libc::CLD_DUMPED,
        },
    }
}
