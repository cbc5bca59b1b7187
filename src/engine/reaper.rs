//! Knowing how each child ended, never leaving zombies behind, and never
//! signalling a process group or session number after it was freed and
//! possibly reused by an unrelated process.
//!
//! Two modes, chosen once per process:
//!
//! - **Per child** (the library default). The exit status is read through
//!   the child's pidfd *without* reaping it: the zombie keeps the child's pid,
//!   group and session numbers reserved until capexec has terminated what is
//!   left of its tree and reaps it.
//! - **Subreaper** ([`become_subreaper`], used by the `capexec` binary). The
//!   process becomes the reaper of orphaned descendants, so grandchildren are
//!   reaped here rather than piling up as zombies under an init that does not
//!   reap. One thread, woken by SIGCHLD, reaps every child. Once a group's
//!   leader is gone, the last member of the group to die is necessarily a
//!   child of ours (its parent died before it, so it was reparented to us);
//!   the thread reaps it while holding [`TreeLock`] and, in the same critical
//!   section, marks every group whose number that freed. Signalling a tree
//!   takes the same lock and skips marked groups, so a freed number is never
//!   signalled. That thread reaps every ordinary child of the process: a
//!   program that enables this mode must not wait for children of its own.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;

use crate::engine::kill;
use crate::model::{ExitStatus, Signal};

/// `idtype_t` value of waitid(2) for a pidfd (Linux 5.4).
const P_PIDFD: libc::idtype_t = 3;

/// Everything that reaps children or signals trees happens under this lock.
static TREES: Mutex<Trees> = Mutex::new(Trees {
    subreaper: false,
    leaders: None,
    groups: Vec::new(),
});

struct Trees {
    subreaper: bool,
    /// Subreaper mode: where to send each started child's exit status.
    leaders: Option<HashMap<i32, Registered>>,
    /// Groups whose leader has been reaped but whose number may still be
    /// held by other members.
    groups: Vec<Weak<Tree>>,
}

/// A started child the reaper thread will reap: where its status goes, and
/// its tree.
type Registered = (oneshot::Sender<ExitStatus>, Weak<Tree>);

/// The lock under which a tree may be signalled: while it is held, the
/// reaper thread cannot free a number.
pub(crate) struct TreeLock {
    _held: MutexGuard<'static, Trees>,
}

fn trees() -> MutexGuard<'static, Trees> {
    TREES.lock().unwrap_or_else(|poison| poison.into_inner())
}

static SUBREAPER: OnceLock<()> = OnceLock::new();

/// Makes this process the reaper of its orphaned descendants and starts the
/// thread that reaps every child. Call it before starting anything; calling
/// it again is a no-op.
pub fn become_subreaper() -> io::Result<()> {
    if SUBREAPER.get().is_some() {
        return Ok(());
    }
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes an integer flag only.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut result = Ok(());
    SUBREAPER.get_or_init(|| {
        {
            let mut trees = trees();
            trees.subreaper = true;
            trees.leaders = Some(HashMap::new());
        }
        result = start_reaper_thread();
    });
    result
}

/// Whether [`become_subreaper`] is in effect.
pub fn is_subreaper() -> bool {
    SUBREAPER.get().is_some()
}

fn start_reaper_thread() -> io::Result<()> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two new descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let (wake_read, wake_write) = (fds[0], fds[1]);
    // SAFETY: the handler only calls write(2), which is async-signal-safe,
    // on a descriptor that stays open for the life of the process.
    unsafe {
        signal_hook_registry::register(libc::SIGCHLD, move || {
            libc::write(wake_write, [1u8].as_ptr().cast(), 1);
        })
    }
    .map_err(|error| io::Error::other(format!("cannot handle SIGCHLD: {error}")))?;
    std::thread::Builder::new()
        .name("capexec-reaper".into())
        .stack_size(128 * 1024)
        .spawn(move || reap_forever(wake_read))?;
    Ok(())
}

fn reap_forever(wake: libc::c_int) {
    let mut pollfd = libc::pollfd {
        fd: wake,
        events: libc::POLLIN,
        revents: 0,
    };
    let mut sink = [0u8; 64];
    loop {
        while reap_one() {}
        // SAFETY: poll and read on our own pipe.
        unsafe {
            libc::poll(&mut pollfd, 1, -1);
            while libc::read(wake, sink.as_mut_ptr().cast(), sink.len()) > 0 {}
        }
    }
}

/// Reaps one exited child, if any, and records what that freed.
fn reap_one() -> bool {
    let mut trees = trees();
    let mut info = zeroed_siginfo();
    // SAFETY: waitid writes into `info`, which lives across the call.
    let rc = unsafe { libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOHANG) };
    let pid = child_pid(&info);
    if rc != 0 || pid == 0 {
        return false;
    }
    if let Some((sender, tree)) = trees.leaders.as_mut().and_then(|l| l.remove(&pid)) {
        if let Some(tree) = tree.upgrade() {
            tree.leader_reaped.store(true, Ordering::Release);
        }
        let _ = sender.send(decode(&info));
    }
    // A group's number is freed when its last member is reaped, and that
    // only happens here: find out which groups are gone now.
    trees.groups.retain(|group| match group.upgrade() {
        Some(tree) if tree.leader_reaped.load(Ordering::Acquire) => {
            if tree.is_empty() {
                tree.gone.store(true, Ordering::Release);
                false
            } else {
                true
            }
        }
        Some(_) => true,
        None => false,
    });
    true
}

/// The numbers of one started child: its pid is the id of its process group
/// and session.
pub(crate) struct Tree {
    pid: i32,
    /// Job control (terminals) moves members into other groups of the
    /// session: the session is what must be empty and what gets signalled.
    session: bool,
    leader_reaped: AtomicBool,
    /// The numbers are free: never signal them again.
    gone: AtomicBool,
}

impl Tree {
    fn is_empty(&self) -> bool {
        let held = kill::group_has_members(self.pid)
            || (self.session && kill::session_has_members(self.pid));
        !held
    }

    /// Sends `signal` to the whole tree unless its numbers are gone.
    pub fn signal(&self, _lock: &TreeLock, signal: i32) {
        if self.gone.load(Ordering::Acquire) {
            return;
        }
        if self.session {
            kill::signal_session(self.pid, signal);
        }
        if let Err(error) = kill::signal_group(self.pid, signal) {
            tracing::warn!(%error, signal, pid = self.pid, "cannot signal the process group");
        }
    }

    /// Sends `signal` to one group of the tree (a terminal's foreground job)
    /// unless the tree's numbers are gone.
    pub fn signal_group(&self, _lock: &TreeLock, pgid: i32, signal: i32) -> io::Result<()> {
        if self.gone.load(Ordering::Acquire) {
            return Ok(());
        }
        kill::signal_group(pgid, signal).map(drop)
    }
}

/// Takes the lock under which trees are signalled.
pub(crate) fn lock() -> TreeLock {
    TreeLock { _held: trees() }
}

/// A started child and its tree.
pub(crate) struct Leader {
    pid: i32,
    tree: Arc<Tree>,
    exit: Exit,
}

enum Exit {
    /// Per-child mode: read through the pidfd, reaped by [`Leader::reap`].
    Held {
        pidfd: AsyncFd<OwnedFd>,
        reaped: AtomicBool,
    },
    /// Subreaper mode: the reaper thread sends the status.
    Sent(Mutex<Option<oneshot::Receiver<ExitStatus>>>),
}

/// Runs `spawn` (which creates the child and returns its pid and pidfd) so
/// that the child's exit cannot be missed.
pub(crate) fn spawn_leader(
    session: bool,
    spawn: impl FnOnce() -> io::Result<(i32, OwnedFd)>,
) -> io::Result<Leader> {
    let mut trees = trees();
    let (pid, pidfd) = spawn()?;
    let tree = Arc::new(Tree {
        pid,
        session,
        leader_reaped: AtomicBool::new(false),
        gone: AtomicBool::new(false),
    });
    let exit = if trees.subreaper {
        // Registered before the lock is released, so the reaper thread
        // (which reaps under the lock) cannot miss it.
        let (sender, receiver) = oneshot::channel();
        if let Some(leaders) = trees.leaders.as_mut() {
            leaders.insert(pid, (sender, Arc::downgrade(&tree)));
        }
        trees.groups.push(Arc::downgrade(&tree));
        drop(pidfd);
        Exit::Sent(Mutex::new(Some(receiver)))
    } else {
        drop(trees);
        Exit::Held {
            pidfd: register(pidfd, Interest::READABLE)?,
            reaped: AtomicBool::new(false),
        }
    };
    Ok(Leader { pid, tree, exit })
}

impl Leader {
    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    /// Waits for the exit and returns its status.
    pub async fn exited(&self) -> ExitStatus {
        match &self.exit {
            Exit::Held { pidfd, .. } => wait_held(pidfd).await,
            Exit::Sent(receiver) => {
                let receiver = receiver
                    .lock()
                    .unwrap_or_else(|poison| poison.into_inner())
                    .take();
                match receiver {
                    Some(receiver) => receiver.await.unwrap_or(LOST_STATUS),
                    None => LOST_STATUS,
                }
            }
        }
    }

    /// Frees the child's numbers once its tree is terminated. In per-child
    /// mode this reaps the zombie; in subreaper mode the reaper thread has
    /// done that and frees the numbers when the group empties.
    pub fn reap(&self) {
        if let Exit::Held { pidfd, reaped } = &self.exit {
            let _lock = lock();
            if !reaped.swap(true, Ordering::AcqRel) {
                let _ = wait(pidfd.get_ref(), 0);
                self.tree.gone.store(true, Ordering::Release);
            }
        }
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        // Dropped without a termination (the runtime went away): nothing of
        // the tree may survive it.
        let lock = lock();
        self.tree.signal(&lock, libc::SIGKILL);
        drop(lock);
        self.reap();
    }
}

async fn wait_held(pidfd: &AsyncFd<OwnedFd>) -> ExitStatus {
    loop {
        let mut guard = match pidfd.readable().await {
            Ok(guard) => guard,
            Err(error) => {
                tracing::error!(%error, "waiting on a pidfd failed");
                return LOST_STATUS;
            }
        };
        match wait(pidfd.get_ref(), libc::WNOHANG | libc::WNOWAIT) {
            Ok(Some(status)) => return status,
            Ok(None) => guard.clear_ready(),
            Err(error) => {
                tracing::error!(%error, "waitid on a pidfd failed");
                return LOST_STATUS;
            }
        }
    }
}

fn wait(pidfd: &OwnedFd, flags: libc::c_int) -> io::Result<Option<ExitStatus>> {
    loop {
        let mut info = zeroed_siginfo();
        // SAFETY: waitid writes into `info`, which lives across the call.
        let rc = unsafe {
            libc::waitid(
                P_PIDFD,
                pidfd.as_raw_fd() as libc::id_t,
                &mut info,
                libc::WEXITED | flags,
            )
        };
        if rc == 0 {
            return Ok((child_pid(&info) != 0).then(|| decode(&info)));
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// Reported when waiting itself fails, which only happens when the process
/// is being torn down.
const LOST_STATUS: ExitStatus = ExitStatus::Killed {
    signal: Some(Signal::Kill),
    number: libc::SIGKILL,
    core_dumped: false,
};

/// Registers an owned descriptor with the tokio reactor.
pub(crate) fn register(fd: OwnedFd, interest: Interest) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd keeps its descriptor open and unchanged for as long
    // as the AsyncFd owns it.
    unsafe { AsyncFd::register_with_interest(fd, interest) }.map_err(|e| e.into_parts().1)
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
