//! Knowing how each child ended, never leaving zombies behind, and
//! signalling a child's whole tree without ever reaching an unrelated process
//! that reused one of its numbers.
//!
//! Signalling: the child's process group is signalled through the child's
//! pidfd (`PIDFD_SIGNAL_PROCESS_GROUP`, Linux 6.9), which names the group's
//! kernel object rather than its number, so it stays exact after the child is
//! reaped. A terminal session's other groups (job control) are reached
//! through pidfds of its members, taken while the session's number was
//! provably the child's (before the child was reaped).
//!
//! Reaping, in one of two modes chosen once per process:
//!
//! - **Per child** (the library default): the exit status is read through the
//!   child's pidfd without reaping; the zombie is reaped once the tree has
//!   been terminated.
//! - **Subreaper** ([`become_subreaper`], used by the `capexec` binary): the
//!   process becomes the reaper of orphaned descendants, so grandchildren are
//!   reaped here instead of piling up as zombies under an init that does not
//!   reap (common in containers). One thread, woken by SIGCHLD, reaps every
//!   child; a program that enables this mode must not wait for children of
//!   its own.
//!
//! On kernels without pidfd group signals, groups are signalled by number and
//! a group is marked gone when the reap that frees its number happens here
//! (best effort: a group can also empty by members leaving it).

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;

use crate::engine::{kill, os};
use crate::model::{ExitStatus, ResourceUsage, Signal};

/// `idtype_t` value of waitid(2) for a pidfd (Linux 5.4).
const P_PIDFD: libc::idtype_t = 3;

/// Reaping and tree signalling happen under this lock.
static TREES: Mutex<Trees> = Mutex::new(Trees {
    subreaper: false,
    leaders: None,
    by_number: Vec::new(),
});

/// Set once anything was started: the reaping mode can no longer change.
static STARTED_ANY: AtomicBool = AtomicBool::new(false);

/// Set (under the lock) while the processes are handed to the next
/// binary: the reaper thread leaves every exit for the next binary to
/// read, so none is read here and lost with this image.
static PAUSED: AtomicBool = AtomicBool::new(false);

struct Trees {
    subreaper: bool,
    /// Subreaper mode: the children the reaper thread reaps for us.
    leaders: Option<HashMap<i32, Registered>>,
    /// Trees signalled by number (no pidfd group signals) whose child was
    /// reaped: checked for emptiness after every reap.
    by_number: Vec<Weak<Tree>>,
}

/// Where a started child's exit status goes, and its tree.
type Registered = (oneshot::Sender<Ended>, Weak<Tree>);

/// How a child ended and what its tree used.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ended {
    pub status: ExitStatus,
    /// `None` when waiting itself failed.
    pub usage: Option<ResourceUsage>,
}

fn trees() -> MutexGuard<'static, Trees> {
    TREES.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// The lock under which a tree may be signalled.
pub(crate) struct TreeLock {
    _held: MutexGuard<'static, Trees>,
}

pub(crate) fn lock() -> TreeLock {
    TreeLock { _held: trees() }
}

static SUBREAPER: OnceLock<()> = OnceLock::new();

/// Makes this process the reaper of its orphaned descendants and starts the
/// thread that reaps every child. It must come before the first start;
/// calling it again is a no-op.
pub fn become_subreaper() -> io::Result<()> {
    if SUBREAPER.get().is_some() {
        return Ok(());
    }
    if STARTED_ANY.load(Ordering::Acquire) && trees().leaders.is_none() {
        return Err(io::Error::other(
            "become_subreaper must be called before any process is started",
        ));
    }
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes an integer flag only.
    os::cvt(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) })?;
    let mut result = Ok(());
    SUBREAPER.get_or_init(|| {
        {
            let mut trees = trees();
            trees.subreaper = true;
            // Children handed over (`adopt`) are registered already.
            trees.leaders.get_or_insert_with(HashMap::new);
        }
        result = start_reaper_thread();
    });
    result
}

/// Whether [`become_subreaper`] is in effect.
pub fn is_subreaper() -> bool {
    SUBREAPER.get().is_some()
}

/// Stops reaping for good: the exits of children from now on are left to
/// the binary this one hands its processes to (see `engine::handover`).
/// An exit reaped before is already on its way to its pump.
pub(crate) fn pause_for_handover() {
    let _trees = trees();
    PAUSED.store(true, Ordering::Release);
}

/// A child handed over by the binary before this one (same process, so
/// still our child): the subreaper mode's reaper thread reports its exit,
/// or `ended` when the binary before had reaped it already. Must be called
/// before [`become_subreaper`] starts that thread, or a child that exited
/// meanwhile would be reaped as nobody's.
pub(crate) fn adopt(
    pid: i32,
    pidfd: OwnedFd,
    session: bool,
    members: Vec<OwnedFd>,
    ended: Option<Ended>,
) -> Leader {
    STARTED_ANY.store(true, Ordering::Release);
    let mut trees = trees();
    if trees.leaders.is_none() {
        trees.subreaper = true;
        trees.leaders = Some(HashMap::new());
    }
    let tree = Arc::new(Tree {
        pid,
        pidfd,
        session,
        leader_reaped: AtomicBool::new(ended.is_some()),
        gone: AtomicBool::new(false),
        members: Mutex::new(members.into_iter().map(Member::kept).collect()),
        leaf: OnceLock::new(),
    });
    let (sender, receiver) = oneshot::channel();
    match ended {
        Some(ended) => {
            let _ = sender.send(ended);
        }
        None => {
            if let Some(leaders) = trees.leaders.as_mut() {
                leaders.insert(pid, (sender, Arc::downgrade(&tree)));
            }
            if !kill::pidfd_group_signals() {
                trees.by_number.push(Arc::downgrade(&tree));
            }
        }
    }
    Leader {
        tree,
        exit: Exit::Sent(Mutex::new(Some(receiver))),
    }
}

fn start_reaper_thread() -> io::Result<()> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two new descriptors into `fds`.
    os::cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) })?;
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

/// Reaps one exited child, if any, recording what that changes.
fn reap_one() -> bool {
    let mut trees = trees();
    if PAUSED.load(Ordering::Acquire) {
        return false;
    }
    // Peek first: a terminal child's session is captured while its number
    // is still held by the zombie.
    let Some(pid) = waitable(libc::P_ALL, 0) else {
        return false;
    };
    let registered = trees.leaders.as_mut().and_then(|l| l.remove(&pid));
    let tree = registered.as_ref().and_then(|(_, tree)| tree.upgrade());
    if let Some(tree) = &tree {
        tree.capture_session();
    }
    let mut info = zeroed_siginfo();
    let mut usage = zeroed_rusage();
    let rc = waitid_with_usage(
        libc::P_PID,
        pid as libc::id_t,
        &mut info,
        libc::WEXITED | libc::WNOHANG,
        &mut usage,
    );
    if let Some(tree) = &tree {
        tree.leader_reaped.store(true, Ordering::Release);
    }
    if let Some((sender, _)) = registered
        && rc == 0
        && child_pid(&info) == pid
    {
        let _ = sender.send(Ended {
            status: decode(&info),
            usage: Some(usage_from(&usage)),
        });
    }
    trees.by_number.retain(|tree| match tree.upgrade() {
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

/// The pid of a waitable (exited, not yet reaped) child, leaving it so.
fn waitable(idtype: libc::idtype_t, id: libc::id_t) -> Option<i32> {
    let mut info = zeroed_siginfo();
    // SAFETY: waitid writes into `info`, which lives across the call.
    let rc = unsafe {
        libc::waitid(
            idtype,
            id,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    let pid = child_pid(&info);
    (rc == 0 && pid != 0).then_some(pid)
}

/// A started child's process tree: its group, and for a terminal its
/// session.
/// Default of [`keep_session_members_at_most`].
const DEFAULT_MAX_MEMBERS_KEPT: usize = 1024;

/// Pidfds of sessions' members kept after their leaders were reaped,
/// over the server, and most kept: each is a descriptor the server's
/// budget must carry (`engine::descriptors::DescriptorBudget::members`),
/// and a session can have as many members as its owner can start.
static MEMBERS_KEPT: AtomicUsize = AtomicUsize::new(0);
static MAX_MEMBERS_KEPT: AtomicUsize = AtomicUsize::new(DEFAULT_MAX_MEMBERS_KEPT);

/// Sets how many members of terminal sessions whose leader has ended the
/// server keeps track of (a pidfd each); a session's members beyond are
/// killed when its leader is reaped.
pub fn keep_session_members_at_most(most: usize) {
    MAX_MEMBERS_KEPT.store(most, Ordering::Relaxed);
}

/// A session member's pidfd, counted while kept.
struct Member(OwnedFd);

impl Member {
    /// Kept if the server has room for one more, else given back.
    fn keep(pidfd: OwnedFd) -> Result<Member, OwnedFd> {
        let most = MAX_MEMBERS_KEPT.load(Ordering::Relaxed);
        match MEMBERS_KEPT.fetch_update(Ordering::AcqRel, Ordering::Acquire, |kept| {
            (kept < most).then_some(kept + 1)
        }) {
            Ok(_) => Ok(Member(pidfd)),
            Err(_) => Err(pidfd),
        }
    }

    /// Kept whatever the count (handed over by the binary before).
    fn kept(pidfd: OwnedFd) -> Member {
        MEMBERS_KEPT.fetch_add(1, Ordering::AcqRel);
        Member(pidfd)
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        MEMBERS_KEPT.fetch_sub(1, Ordering::AcqRel);
    }
}

pub(crate) struct Tree {
    pid: i32,
    pidfd: OwnedFd,
    session: bool,
    /// The child has been reaped: its numbers are no longer held by it.
    leader_reaped: AtomicBool,
    /// Signalling by number only: the group's number is free.
    gone: AtomicBool,
    /// Terminal sessions: the members when the child was reaped.
    members: Mutex<Vec<Member>>,
    /// The cgroup of the tree, where there is one: nothing leaves it.
    leaf: OnceLock<crate::sandbox::Leaf>,
}

impl Tree {
    fn is_empty(&self) -> bool {
        if let Some(leaf) = self.leaf() {
            return !leaf.populated();
        }
        let held = kill::group_has_members(self.pid)
            || (self.session && kill::session_has_members(self.pid));
        !held
    }

    /// Keeps a pidfd of each member of the session its leader leaves (the
    /// session's number is free once the leader is reaped), as many as
    /// the server keeps ([`keep_session_members_at_most`]); the rest are
    /// killed now, said in the log: a member the server cannot name later
    /// would outlive the process's release.
    fn capture_session(&self) {
        if !self.session {
            return;
        }
        let mut kept = Vec::new();
        let mut killed = 0usize;
        kill::for_each_session_member(self.pid, None, |member| match Member::keep(member) {
            Ok(member) => kept.push(member),
            Err(member) => {
                kill::signal_process(&member, libc::SIGKILL);
                killed += 1;
            }
        });
        if killed > 0 {
            tracing::warn!(
                pid = self.pid,
                killed,
                "a terminal session's leader ended leaving more processes than the server keeps \
                 track of ({} over the server, from the descriptor limit): the rest were killed",
                MAX_MEMBERS_KEPT.load(Ordering::Relaxed)
            );
        }
        *self.members.lock().unwrap_or_else(|p| p.into_inner()) = kept;
    }

    /// Gives the tree its cgroup (once, right after the spawn).
    pub fn attach_leaf(&self, leaf: crate::sandbox::Leaf) {
        let _ = self.leaf.set(leaf);
    }

    /// The tree's cgroup, if it has one.
    pub fn leaf(&self) -> Option<&crate::sandbox::Leaf> {
        self.leaf.get()
    }

    /// Sends `signal` to every process of the tree.
    pub fn signal(&self, _lock: &TreeLock, signal: i32) {
        if let Some(leaf) = self.leaf() {
            // Everything in the cgroup, wherever it moved (setsid, double
            // forks); SIGKILL at once through the kernel.
            if signal == libc::SIGKILL {
                leaf.kill();
            } else {
                leaf.signal_members(signal);
            }
        }
        let by_pidfd = kill::pidfd_group_signals();
        if self.session {
            let signal_member = |member: &OwnedFd| {
                kill::signal_process(member, signal);
                if by_pidfd {
                    // A job leader's group: its members, even later ones.
                    let _ = kill::signal_group_by_pidfd(member, signal);
                }
            };
            if self.leader_reaped.load(Ordering::Acquire) {
                let members = self.members.lock().unwrap_or_else(|p| p.into_inner());
                members.iter().for_each(|member| signal_member(&member.0));
            } else {
                // The child (alive or a zombie) still holds the session.
                kill::for_each_session_member(self.pid, None, |member| signal_member(&member));
            }
        }
        let result = if by_pidfd {
            kill::signal_group_by_pidfd(&self.pidfd, signal)
        } else if self.gone.load(Ordering::Acquire) {
            Ok(())
        } else {
            kill::signal_group(self.pid, signal).map(drop)
        };
        if let Err(error) = result {
            tracing::warn!(%error, signal, pid = self.pid, "cannot signal the process group");
        }
    }
}

/// What of a tree the next binary needs (see `engine::handover`): its
/// descriptors stay open across the exec.
pub(crate) struct TreeParts {
    pub pid: i32,
    pub pidfd: std::os::fd::RawFd,
    pub session: bool,
    pub reaped: bool,
    pub members: Vec<std::os::fd::RawFd>,
}

impl Tree {
    pub fn handover_parts(&self) -> TreeParts {
        TreeParts {
            pid: self.pid,
            pidfd: self.pidfd.as_raw_fd(),
            session: self.session,
            reaped: self.leader_reaped.load(Ordering::Acquire),
            members: self
                .members
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .map(|member| member.0.as_raw_fd())
                .collect(),
        }
    }

    /// Sends `signal` to the processes of the session's group `pgid` (a
    /// terminal's foreground job), if the session is still the child's.
    pub fn signal_session_group(&self, _lock: &TreeLock, pgid: i32, signal: i32) {
        if self.leader_reaped.load(Ordering::Acquire) {
            return;
        }
        kill::for_each_session_member(self.pid, Some(pgid), |member| {
            kill::signal_process(&member, signal);
        });
    }
}

/// A started child and its tree.
pub(crate) struct Leader {
    tree: Arc<Tree>,
    exit: Exit,
}

enum Exit {
    /// Per-child mode: read through the pidfd, reaped by [`Leader::reap`].
    Held {
        pidfd: AsyncFd<OwnedFd>,
        reaped: AtomicBool,
    },
    /// Subreaper mode: the reaper thread reaps and sends the status.
    Sent(Mutex<Option<oneshot::Receiver<Ended>>>),
}

/// Runs `spawn` (which creates the child and returns its pid and pidfd) so
/// that the child's exit cannot be missed.
pub(crate) fn spawn_leader(
    session: bool,
    spawn: impl FnOnce() -> io::Result<(i32, OwnedFd)>,
) -> io::Result<Leader> {
    STARTED_ANY.store(true, Ordering::Release);
    // Only the reaper thread could reap the child before it is registered,
    // and it reaps under this lock.
    let mut held = SUBREAPER.get().map(|_| trees());
    let (pid, pidfd) = spawn()?;
    let waiter = if held.is_some() {
        None
    } else {
        match pidfd
            .try_clone()
            .and_then(|fd| register(fd, Interest::READABLE))
        {
            Ok(waiter) => Some(waiter),
            Err(error) => {
                kill::signal_process(&pidfd, libc::SIGKILL);
                let _ = wait(&pidfd, 0);
                return Err(error);
            }
        }
    };
    let tree = Arc::new(Tree {
        pid,
        pidfd,
        session,
        leader_reaped: AtomicBool::new(false),
        gone: AtomicBool::new(false),
        members: Mutex::new(Vec::new()),
        leaf: OnceLock::new(),
    });
    let exit = match (held.as_mut(), waiter) {
        (Some(trees), _) => {
            let (sender, receiver) = oneshot::channel();
            if let Some(leaders) = trees.leaders.as_mut() {
                leaders.insert(pid, (sender, Arc::downgrade(&tree)));
            }
            if !kill::pidfd_group_signals() {
                trees.by_number.push(Arc::downgrade(&tree));
            }
            Exit::Sent(Mutex::new(Some(receiver)))
        }
        (None, Some(pidfd)) => Exit::Held {
            pidfd,
            reaped: AtomicBool::new(false),
        },
        (None, None) => unreachable!("per-child mode always has a waiter"),
    };
    Ok(Leader { tree, exit })
}

impl Leader {
    pub fn pid(&self) -> i32 {
        self.tree.pid
    }

    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    /// Whether the child has exited, as the kernel knows it now (its pidfd
    /// is readable from the exit on, reaped or not): ahead of the exit's
    /// bookkeeping, which follows asynchronously.
    pub fn has_exited_now(&self) -> bool {
        let mut pollfd = libc::pollfd {
            fd: self.tree.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one descriptor we own, without waiting.
        let ready = unsafe { libc::poll(&mut pollfd, 1, 0) };
        ready > 0 && pollfd.revents & libc::POLLIN != 0
    }

    /// Waits for the exit and returns its status and usage.
    pub async fn exited(&self) -> Ended {
        match &self.exit {
            Exit::Held { pidfd, .. } => wait_held(pidfd).await,
            Exit::Sent(receiver) => {
                let receiver = receiver
                    .lock()
                    .unwrap_or_else(|poison| poison.into_inner())
                    .take();
                match receiver {
                    Some(receiver) => receiver.await.unwrap_or(LOST),
                    None => LOST,
                }
            }
        }
    }

    /// Reaps the exited child once its tree is terminated (per-child mode;
    /// the subreaper thread does it by itself). Never blocks.
    pub fn reap(&self) -> bool {
        let Exit::Held { pidfd, reaped } = &self.exit else {
            return true;
        };
        let _lock = lock();
        if reaped.load(Ordering::Acquire) {
            return true;
        }
        if waitable_pidfd(pidfd.get_ref()) {
            self.tree.capture_session();
            let _ = wait(pidfd.get_ref(), libc::WNOHANG);
            self.tree.leader_reaped.store(true, Ordering::Release);
            reaped.store(true, Ordering::Release);
            return true;
        }
        false
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        // Dropped without a finished termination (the runtime went away):
        // nothing of the tree may survive it, and no zombie either.
        let lock = lock();
        self.tree.signal(&lock, libc::SIGKILL);
        drop(lock);
        if !self.reap()
            && let Exit::Held { pidfd, .. } = &self.exit
            && let Ok(pidfd) = pidfd.get_ref().try_clone()
        {
            // Dying takes a moment: reap it off this thread.
            let _ = std::thread::Builder::new()
                .name("capexec-reap".into())
                .stack_size(32 * 1024)
                .spawn(move || {
                    let _ = wait(&pidfd, 0);
                });
        }
    }
}

fn waitable_pidfd(pidfd: &OwnedFd) -> bool {
    waitable(P_PIDFD, pidfd.as_raw_fd() as libc::id_t).is_some()
}

async fn wait_held(pidfd: &AsyncFd<OwnedFd>) -> Ended {
    loop {
        let mut guard = match pidfd.readable().await {
            Ok(guard) => guard,
            Err(error) => {
                tracing::error!(%error, "waiting on a pidfd failed");
                return LOST;
            }
        };
        match wait(pidfd.get_ref(), libc::WNOHANG | libc::WNOWAIT) {
            Ok(Some(status)) => return status,
            Ok(None) => guard.clear_ready(),
            Err(error) => {
                tracing::error!(%error, "waitid on a pidfd failed");
                return LOST;
            }
        }
    }
}

fn wait(pidfd: &OwnedFd, flags: libc::c_int) -> io::Result<Option<Ended>> {
    loop {
        let mut info = zeroed_siginfo();
        let mut usage = zeroed_rusage();
        let rc = waitid_with_usage(
            P_PIDFD,
            pidfd.as_raw_fd() as libc::id_t,
            &mut info,
            libc::WEXITED | flags,
            &mut usage,
        );
        if rc == 0 {
            return Ok((child_pid(&info) != 0).then(|| Ended {
                status: decode(&info),
                usage: Some(usage_from(&usage)),
            }));
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// Reported when waiting itself fails, which only happens when the process
/// is being torn down.
const LOST: Ended = Ended {
    status: ExitStatus::Killed {
        signal: Some(Signal::Kill),
        number: libc::SIGKILL,
        core_dumped: false,
    },
    usage: None,
};

/// waitid(2) as the kernel offers it, with the fifth argument glibc's
/// wrapper leaves out: the resource usage of the child and of the
/// descendants it waited for (filled with `WNOWAIT` too, since Linux 2.6.x).
fn waitid_with_usage(
    idtype: libc::idtype_t,
    id: libc::id_t,
    info: &mut libc::siginfo_t,
    options: libc::c_int,
    usage: &mut libc::rusage,
) -> libc::c_int {
    // SAFETY: the kernel writes into `info` and `usage`, which live across
    // the call; the other arguments are plain integers.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_waitid,
            idtype,
            id,
            info as *mut libc::siginfo_t,
            options,
            usage as *mut libc::rusage,
        )
    };
    rc as libc::c_int
}

fn zeroed_rusage() -> libc::rusage {
    // SAFETY: rusage is plain old data; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

fn usage_from(usage: &libc::rusage) -> ResourceUsage {
    let time = |t: libc::timeval| {
        std::time::Duration::from_secs(t.tv_sec.max(0) as u64)
            + std::time::Duration::from_micros(t.tv_usec.clamp(0, 999_999) as u64)
    };
    ResourceUsage {
        user_cpu: time(usage.ru_utime),
        system_cpu: time(usage.ru_stime),
        // Linux counts it in KiB.
        peak_rss_bytes: (usage.ru_maxrss.max(0) as u64).saturating_mul(1024),
    }
}

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
