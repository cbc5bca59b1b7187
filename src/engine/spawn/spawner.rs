//! Where children are cloned from: a thread of the engine's own whose
//! descriptor table holds nothing but what the child being started needs.
//!
//! Why: a child between its clone and its exec holds a copy of every
//! descriptor of the table it was cloned from, until its exec closes them
//! (close-on-exec). Cloned from the server's table, that includes pipes
//! other clients sent, which the server's closing threads may let go of in
//! that window: the child's exec is then the pipe's last close, which
//! takes the pipe's lock, and a client that holds that lock holds up
//! another client's start for as long as it likes. (A file on a FUSE mount
//! whose server does not answer does the same without a race: every close
//! of a copy flushes it.) The spawner's table is made empty (`close_range`
//! with `CLOSE_RANGE_UNSHARE`, which copies only the first 64 slots of
//! what it closes, and closes those at once) and gets, for each start,
//! copies of that start's own descriptors under their own numbers
//! (`pidfd_getfd` on our own pidfd), closed again once the child has
//! exec'd. What the start makes there for the server (the child's pidfd)
//! comes back with the message that says the job is done.
//!
//! The spawner is made in the background when an engine is (`prepare`),
//! before a server takes in any client's descriptor (and `capexec serve`
//! keeps the first 64 slots, those the kernel copies, free of them for
//! good: `sys/low_slots.rs`); starts clone on their own thread until
//! it is ready. Starts are one at a time here, as
//! they already are under the reaper's lock. Where the kernel has neither
//! call (before Linux 5.9), or a filter denies one, starts run on the
//! caller's thread as before and the log says what that leaves.
//!
//! A child cloned here cannot be set to die with the server by
//! `PR_SET_PDEATHSIG`: that follows the thread that cloned it, and an
//! upgrade's exec ends this thread. A server's children have the cgroup
//! sentinel for that (`sandbox/sentinel.rs`), which kills their whole
//! tree; one without cgroup tracking clones on the serving thread
//! (`on_this_thread`), and the log says what that leaves.

use std::any::Any;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Mutex, OnceLock};

use crate::engine::os;

/// What a job hands back to the caller's table: descriptors it made in
/// the table it ran in, for the caller to own.
pub(super) struct HandBack {
    given: Vec<OwnedFd>,
}

/// The most one job hands back: all go in one message.
const MAX_HANDED_BACK: usize = 16;

impl HandBack {
    /// Gives `fd` to the caller; the caller gets them in the order given.
    pub(super) fn give(&mut self, fd: OwnedFd) -> io::Result<()> {
        if self.given.len() == MAX_HANDED_BACK {
            return Err(io::Error::other(format!(
                "a job hands back at most {MAX_HANDED_BACK} descriptors"
            )));
        }
        self.given.push(fd);
        Ok(())
    }
}

/// What a job returned, and the descriptors it handed back.
pub(super) struct Ran<T> {
    pub(super) value: T,
    /// In the order given; an error if one of them could not be taken in
    /// (the caller's table full): the rest are closed.
    pub(super) handed_back: io::Result<Vec<OwnedFd>>,
}

/// The spawner, once it is ready (see [`prepare`]); `None` until then,
/// or for good where the kernel cannot make one.
pub(super) fn ready() -> Option<&'static Spawner> {
    prepare();
    READY.get()
}

/// Starts making the spawner, on a thread of its own, unless it is made
/// or being made: nothing waits for it, and starts clone on their own
/// thread until it is ready. A server calls this before it takes in any
/// client's descriptor: the spawner's table starts as a copy of the first
/// 64 slots of the server's (the kernel copies at least that many before
/// it closes them), and a close there of what a client sent could sleep.
/// (`capexec serve` keeps those slots free of them for good:
/// `sys::low_slots`.)
pub(crate) fn prepare() {
    if READY.get().is_some() {
        return;
    }
    if STATE
        .compare_exchange(IDLE, STARTING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    if let Err(error) = Spawner::start() {
        gave_up(&error);
    }
}

/// The kernel copies at least this many slots of the table it unshares
/// (`NR_OPEN_DEFAULT`) before it closes those from 3 up: those
/// `sys::low_slots` keeps for the server's own.
pub const COPIES_BELOW: RawFd = crate::sys::low_slots::BELOW;

/// Gives the spawner up before it is started: this process's first 64
/// slots may hold what a client sent (`reason`), whose copy's close could
/// wait for good. Starts clone on their own thread, as the log says.
pub fn forgo(reason: &str) {
    if STATE
        .compare_exchange(IDLE, GAVE_UP, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        tracing::warn!(
            "children are cloned from the server's own descriptor table ({reason}): a \
             client holding the lock of a pipe it sent, or a file that does not answer \
             its flush, can hold up another client's start until the server restarts"
        );
    }
}

/// Not started, being started, or given up for good.
static STATE: AtomicU8 = AtomicU8::new(IDLE);
const IDLE: u8 = 0;
const STARTING: u8 = 1;
const GAVE_UP: u8 = 2;
static READY: OnceLock<Spawner> = OnceLock::new();

/// After a failed start: for good where the kernel lacks what the spawner
/// needs (or a filter denies it), else (out of descriptors, memory or
/// threads for now) again at a later start.
fn gave_up(error: &io::Error) {
    let for_good = matches!(
        error.raw_os_error(),
        Some(libc::ENOSYS | libc::EINVAL | libc::EPERM | libc::EACCES)
    );
    if for_good {
        gave_up_for_good(error);
    } else {
        tracing::debug!("the spawner did not start ({error}); trying again at a later start");
        STATE.store(IDLE, Ordering::Release);
    }
}

impl Spawner {
    /// Runs `job` on the spawner, with copies of `needed` (the caller's
    /// descriptors, which it keeps open until this returns) under the
    /// same numbers there. An error if the job could not run; a panic in
    /// `job` is resumed here.
    ///
    /// # Safety
    /// `job` runs on another thread, whatever it captures: it must touch
    /// nothing that is not safe to use from there, no thread-local of the
    /// caller's, and no descriptor of the caller's but `needed` (a number
    /// it closes would close whatever the spawner has under it); it must
    /// not take a lock the caller holds, nor call this again.
    pub(super) unsafe fn in_private_table<T>(
        &self,
        placement: Placement,
        needed: &[RawFd],
        job: impl FnOnce(&mut HandBack) -> T,
    ) -> io::Result<Ran<T>> {
        self.run(placement, needed, job)
    }
}

/// Where the caller of a start runs: the spawner runs the job on the
/// caller's CPU, and lets the child it clones run where the caller may
/// (see `place`).
///
/// Why: the caller waits while the job runs, so its CPU is the one that
/// is free; a spawner on another CPU had the child's exec queue beside
/// whatever ran there, and the caller woke up where it had slept, apart
/// from the spawner's cache (0.1 ms of a start, measured alternating with
/// the build that cloned on the serving thread). And the child's CPUs are
/// the server's as they are now, not as they were when the spawner
/// started (an operator's `taskset -p`, a cpuset changed since).
#[derive(Clone, Copy)]
pub(super) struct Placement {
    /// The caller's CPU, and the CPUs it may run on; `None` if the kernel
    /// did not say (then the spawner stays where it is).
    at: Option<(usize, libc::cpu_set_t)>,
}

impl Placement {
    /// Where the calling thread runs.
    pub(super) fn of_this_thread() -> Placement {
        // SAFETY: sched_getcpu has no preconditions.
        let cpu = usize::try_from(unsafe { libc::sched_getcpu() }).ok();
        // SAFETY: cpu_set_t is plain data, valid all zeroes;
        // sched_getaffinity fills it for this thread (an error where the
        // machine has more CPUs than it holds).
        let mask = unsafe {
            let mut mask: libc::cpu_set_t = std::mem::zeroed();
            let size = std::mem::size_of::<libc::cpu_set_t>();
            (libc::sched_getaffinity(0, size, &mut mask) == 0).then_some(mask)
        };
        Placement {
            at: cpu
                .filter(|&cpu| cpu < libc::CPU_SETSIZE as usize)
                .zip(mask),
        }
    }
}

/// On the spawner thread: moves it to the caller's CPU, if it is not
/// there, then lets it (and so the child it clones) run where the caller
/// may. Moving is by pinning it to that one CPU, which the kernel does at
/// once; the mask set after it does not move it again.
///
/// Which mask: one set on a thread stays with it and with every child it
/// clones, and a cpuset widened later widens them only within it. So
/// where the caller may run on every CPU its cpuset allows, the spawner
/// asks for every CPU, which the kernel cuts to the cpuset and which then
/// follows the cpuset as it changes, as a child of the serving thread
/// does; only where the caller was narrowed (an operator's `taskset`)
/// does it take the caller's CPUs, as a child of the caller would.
/// `allowed`: the CPUs it may run on since it last set them, if known.
fn place(placement: Placement, allowed: &mut Option<libc::cpu_set_t>) {
    let Some((cpu, caller)) = placement.at else {
        return;
    };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: sched_getcpu has no preconditions; cpu_set_t is plain data,
    // valid all zeroes or all ones; CPU_SET stays in bounds
    // (`of_this_thread`); sched_setaffinity and sched_getaffinity touch
    // this thread and the sets we own only.
    unsafe {
        if usize::try_from(libc::sched_getcpu()).ok() != Some(cpu) {
            let mut one: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut one);
            if libc::sched_setaffinity(0, size, &one) == 0 {
                *allowed = None;
            }
        }
        if allowed.is_some_and(|allowed| libc::CPU_EQUAL(&allowed, &caller)) {
            return;
        }
        let mut every: libc::cpu_set_t = std::mem::zeroed();
        std::ptr::write_bytes(&mut every, 0xFF, 1);
        let mut now: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_setaffinity(0, size, &every) == 0
            && libc::sched_getaffinity(0, size, &mut now) == 0
            && libc::CPU_EQUAL(&now, &caller)
        {
            *allowed = Some(now);
        } else if libc::sched_setaffinity(0, size, &caller) == 0 {
            *allowed = Some(caller);
        } else {
            // Maybe still pinned to one CPU, and the child with it.
            *allowed = None;
            if !PLACING_REFUSED.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "the spawner's CPUs cannot be set ({}): a child it clones may run on \
                     one CPU only",
                    io::Error::last_os_error()
                );
            }
        }
    }
}

/// Whether the log has said that the spawner's CPUs cannot be set.
static PLACING_REFUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Runs `job` here, in the caller's table: for a child that must die
/// with this thread (`PR_SET_PDEATHSIG` follows the thread that cloned
/// it, and the spawner dies in an upgrade's exec).
pub(super) fn on_this_thread<T>(job: impl FnOnce(&mut HandBack) -> T) -> Ran<T> {
    let mut hand_back = HandBack { given: Vec::new() };
    let value = job(&mut hand_back);
    Ran {
        value,
        handed_back: Ok(hand_back.given),
    }
}

/// The spawner thread and the caller's side of its line.
pub(super) struct Spawner {
    line: Mutex<Line>,
    /// The numbers under which the spawner keeps its pidfd of the process
    /// and its end of the socket, taken here (by that end and a copy of
    /// it), so that no descriptor a start needs ever has one of them.
    _reserved: [OwnedFd; 2],
}

struct Line {
    requests: Sender<Request>,
    replies: Receiver<Reply>,
    /// Where the caller says a job is waiting (`GO`), and the spawner
    /// that it is done, with the descriptors it handed back. The caller
    /// waits there rather than on `replies`: a socket's wake-up lets the
    /// scheduler run the caller where the spawner ran, which is about to
    /// sleep, instead of queueing it behind the child's exec on the CPU
    /// the caller last ran on (a futex's wake-up did: 0.3 ms of a start).
    socket: OwnedFd,
}

/// A job whose lifetime is erased: the caller waits for its reply, so it
/// outlives its run.
struct Job(*mut (dyn FnMut(&mut HandBack) + 'static));

// SAFETY: the job runs on the spawner while its caller waits for the
// reply and touches nothing of it; it is never used after that.
unsafe impl Send for Job {}

struct Request {
    job: Job,
    needed: Vec<RawFd>,
    /// Where the caller runs, where the job runs.
    placement: Placement,
}

struct Reply {
    /// How many descriptors the job handed back, or why it did not run.
    outcome: io::Result<usize>,
    panic: Option<Box<dyn Any + Send>>,
}

/// The byte of the message that says a job is done.
const DONE: u8 = b'd';
/// The byte of the message that says a job is waiting. The spawner waits
/// for it on the socket rather than on the channel's futex, as the caller
/// waits for `DONE` (a start measured 26 µs faster so); it moves itself to
/// the caller's CPU (`place`), where a wake-up seldom puts it.
const GO: u8 = b'g';

impl Spawner {
    /// Starts the thread, which makes itself ready (`READY`) or gives up.
    fn start() -> io::Result<()> {
        let (ours, theirs) = std::os::unix::net::UnixDatagram::pair()?;
        let (ours, theirs) = (OwnedFd::from(ours), OwnedFd::from(theirs));
        // Not a pidfd: what counts the process's pidfds counts children.
        let own = theirs.try_clone()?;
        let (requests, requested) = channel::<Request>();
        let (replied, replies) = channel::<Reply>();
        let numbers = (own.as_raw_fd(), theirs.as_raw_fd());
        let spawner = Spawner {
            line: Mutex::new(Line {
                requests,
                replies,
                socket: ours,
            }),
            _reserved: [own, theirs],
        };
        std::thread::Builder::new()
            .name("capexec-spawn".into())
            .spawn(move || {
                if let Err(error) = block_signals() {
                    gave_up(&error);
                    return;
                }
                if let Err(error) = empty_table(numbers.0, numbers.1) {
                    // For good: this thread's table is its own now, and its
                    // numbers are not the server's to close (the three the
                    // server keeps for it stay open there, once).
                    std::mem::forget(spawner);
                    gave_up_for_good(&error);
                    return;
                }
                if READY.set(spawner).is_err() {
                    return;
                }
                // A caller waits on the socket for each job: were this
                // thread to end with one in hand, it would wait for good.
                // Jobs' panics are caught; any other is a bug.
                let _abort = AbortOnUnwind;
                serve(numbers.0, numbers.1, &requested, &replied);
            })?;
        Ok(())
    }

    fn run<T>(
        &self,
        placement: Placement,
        needed: &[RawFd],
        job: impl FnOnce(&mut HandBack) -> T,
    ) -> io::Result<Ran<T>> {
        let mut job = Some(job);
        let mut result = None;
        let mut once = |hand_back: &mut HandBack| {
            if let Some(job) = job.take() {
                result = Some(job(hand_back));
            }
        };
        let erased: *mut (dyn FnMut(&mut HandBack) + '_) = &mut once;
        // SAFETY: only the lifetime changes; the spawner runs the job
        // before it replies, and we wait for the reply below.
        let erased: *mut (dyn FnMut(&mut HandBack) + 'static) =
            unsafe { std::mem::transmute(erased) };
        let line = self
            .line
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let request = Request {
            job: Job(erased),
            needed: needed.to_vec(),
            placement,
        };
        // The message first, the request after: should the message fail,
        // no request is left for a later message to run with its job gone.
        send_byte(line.socket.as_raw_fd(), GO)?;
        line.requests
            .send(request)
            .map_err(|_| io::Error::other("the spawner thread is gone"))?;
        let done = wait_done(&line.socket);
        // The reply goes before the message that says it is there. Should
        // there be none, the spawner is gone, and with it maybe the job,
        // whose `once` would be freed under it: nothing can go on then.
        let Ok(reply) = line.replies.try_recv() else {
            std::process::abort();
        };
        drop(line);
        let handed_back = reply.outcome.map(|sent| {
            let given = done?;
            if given.len() == sent {
                Ok(given)
            } else {
                Err(io::Error::other(format!(
                    "{} of the {sent} descriptors the spawner handed back came in",
                    given.len()
                )))
            }
        });
        if let Some(panic) = reply.panic {
            resume_unwind(panic);
        }
        let handed_back = handed_back?;
        let value = result.ok_or_else(|| io::Error::other("the spawner did not run the job"))?;
        Ok(Ran { value, handed_back })
    }
}

/// Waits on `socket` for the spawner's message that a job is done; the
/// descriptors that came with it, or why not all of them came in (the
/// kernel closed the rest).
fn wait_done(socket: &OwnedFd) -> io::Result<Vec<OwnedFd>> {
    loop {
        let mut byte = [MaybeUninit::<u8>::uninit(); 1];
        match crate::sys::receive_with_descriptors(socket.as_raw_fd(), &mut byte, 0) {
            Ok(got) if got.cut => {
                return Err(io::Error::other(
                    "a descriptor the spawner handed back did not come in (table full)",
                ));
            }
            Ok(got) => return Ok(got.descriptors),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            // The socket is ours alone: nothing else can fail here but the
            // spawner's message, which then cannot be waited for.
            Err(_) => std::process::abort(),
        }
    }
}

/// On the spawner thread: says a job is done, handing back `given`. The
/// caller waits for this message: if it cannot go, nothing can go on.
fn send_done(socket: RawFd, given: &[OwnedFd]) {
    let fds: Vec<RawFd> = given.iter().map(AsRawFd::as_raw_fd).collect();
    let sent = if fds.is_empty() {
        send_byte(socket, DONE)
    } else {
        crate::sys::send_with_byte(socket, &fds)
    };
    // Else without them: the caller sees they did not come.
    if sent.is_err() && send_byte(socket, DONE).is_err() {
        std::process::abort();
    }
}

/// Sends the one byte `byte` on `socket`, our own.
fn send_byte(socket: RawFd, byte: u8) -> io::Result<()> {
    loop {
        // SAFETY: send(2) of one byte we own on a socket we own.
        match os::cvt(unsafe { libc::send(socket, [byte].as_ptr().cast(), 1, 0) } as i64) {
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            sent => return sent.map(drop),
        }
    }
}

/// On the spawner thread: waits for the message that a job is waiting.
/// The socket is ours alone: nothing can fail here but the caller's
/// message, which then cannot be waited for.
fn wait_go(socket: RawFd) {
    loop {
        let mut byte = 0u8;
        // SAFETY: recv(2) of one byte into a byte we own.
        let got = unsafe { libc::recv(socket, (&raw mut byte).cast(), 1, 0) };
        match got {
            1 if byte == GO => return,
            -1 if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            _ => std::process::abort(),
        }
    }
}

fn gave_up_for_good(error: &io::Error) {
    STATE.store(GAVE_UP, Ordering::Release);
    tracing::warn!(
        "children are cloned from the server's own descriptor table ({error}): a client \
         holding the lock of a pipe it sent, or a file that does not answer its flush, \
         can hold up another client's start"
    );
}

/// Ends the process if dropped while unwinding.
struct AbortOnUnwind;

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        if std::thread::panicking() {
            std::process::abort();
        }
    }
}

/// On the spawner thread: blocks every signal for good. The process's
/// handlers name descriptors of the server's table (the reaper's wake-up
/// pipe), which are not in this thread's: they must run elsewhere.
fn block_signals() -> io::Result<()> {
    // SAFETY: sigfillset fills a sigset_t we own; pthread_sigmask changes
    // this thread's mask only.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        match libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut()) {
            0 => Ok(()),
            error => Err(io::Error::from_raw_os_error(error)),
        }
    }
}

/// On the spawner thread: leaves its table with only 0, 1 and 2, then
/// a pidfd of the process under the number `own` and the socket's
/// spawner end under its number in the server's table.
fn empty_table(own: RawFd, socket: RawFd) -> io::Result<()> {
    // Copies none of the descriptors from 64 up, and closes those below
    // at once (Linux 5.9): made before the server takes in a client's
    // descriptor (see `prepare`), so none of them is a client's.
    // SAFETY: close_range with CLOSE_RANGE_UNSHARE affects this thread's
    // table only, which it first makes its own.
    os::cvt(unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_UNSHARE,
        )
    })?;
    let pidfd = crate::engine::pidfd_open(std::process::id() as i32)?;
    renumber(std::os::fd::IntoRawFd::into_raw_fd(pidfd), own)?;
    let theirs = pidfd_getfd(own, socket)?;
    renumber(theirs, socket)
}

/// On the spawner thread: serves requests until the server ends.
fn serve(own: RawFd, socket: RawFd, requested: &Receiver<Request>, replied: &Sender<Reply>) {
    let mut allowed = None;
    loop {
        wait_go(socket);
        let Ok(Request {
            job,
            needed,
            placement,
        }) = requested.recv()
        else {
            return;
        };
        place(placement, &mut allowed);
        let mut reply = Reply {
            outcome: Ok(0),
            panic: None,
        };
        let mut pulled = Vec::with_capacity(needed.len());
        let mut pull = || -> io::Result<()> {
            for &fd in &needed {
                if fd == own || fd == socket {
                    return Err(io::Error::other(format!(
                        "descriptor {fd} is the spawner's own"
                    )));
                }
                if pulled.contains(&fd) {
                    continue;
                }
                renumber(pidfd_getfd(own, fd)?, fd)?;
                pulled.push(fd);
            }
            Ok(())
        };
        let mut hand_back = HandBack { given: Vec::new() };
        match pull() {
            Ok(()) => {
                // SAFETY: the caller waits for our reply (see `Job`).
                let job = unsafe { &mut *job.0 };
                let ran = catch_unwind(AssertUnwindSafe(|| job(&mut hand_back)));
                reply.outcome = Ok(hand_back.given.len());
                reply.panic = ran.err();
            }
            Err(error) => reply.outcome = Err(error),
        }
        // Never the last close of any: the caller holds each until our
        // reply.
        for fd in pulled {
            // SAFETY: a copy pulled into this thread's table above.
            unsafe { libc::close(fd) };
        }
        if replied.send(reply).is_err() {
            return;
        }
        send_done(socket, &hand_back.given);
        // Closing ours is never the last close of them: the message holds
        // them until the caller takes them in.
        drop(hand_back);
    }
}

/// A copy of the caller's descriptor `fd`, in this thread's table
/// (close-on-exec, under the lowest free number).
fn pidfd_getfd(own: RawFd, fd: RawFd) -> io::Result<RawFd> {
    // SAFETY: pidfd_getfd takes a pidfd, a number and flags, and returns
    // a new descriptor (Linux 5.6).
    os::cvt(unsafe { libc::syscall(libc::SYS_pidfd_getfd, own, fd, 0) }).map(|fd| fd as RawFd)
}

/// Moves the descriptor `from` of this thread's table to `to`
/// (close-on-exec); whatever was at `to` is closed.
fn renumber(from: RawFd, to: RawFd) -> io::Result<()> {
    if from == to {
        return Ok(());
    }
    // SAFETY: dup3 and close on this thread's own descriptors.
    let moved = os::cvt(unsafe { libc::dup3(from, to, libc::O_CLOEXEC) });
    // SAFETY: as above.
    unsafe { libc::close(from) };
    moved.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What each descriptor of this thread's table names (on the spawner:
    /// the spawner's table), by number.
    fn own_table() -> Vec<(RawFd, String)> {
        let mut fds: Vec<(RawFd, String)> = std::fs::read_dir("/proc/thread-self/fd")
            .expect("/proc/thread-self/fd")
            .filter_map(|entry| {
                let entry = entry.ok()?;
                let number = entry.file_name().to_str()?.parse().ok()?;
                let target = std::fs::read_link(entry.path()).ok()?;
                Some((number, target.to_string_lossy().into_owned()))
            })
            .collect();
        fds.sort();
        fds
    }

    /// What `fd` of this thread's table names.
    fn names(fd: &OwnedFd) -> String {
        std::fs::read_link(format!("/proc/thread-self/fd/{}", fd.as_raw_fd()))
            .expect("readlink")
            .to_string_lossy()
            .into_owned()
    }

    /// The spawner, waited for (it starts in the background).
    fn spawner() -> &'static Spawner {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            if let Some(spawner) = ready() {
                return spawner;
            }
            assert!(
                STATE.load(Ordering::Acquire) != GAVE_UP,
                "Linux 5.9 has close_range(CLOSE_RANGE_UNSHARE) and pidfd_getfd"
            );
            assert!(
                std::time::Instant::now() < deadline,
                "the spawner never got ready"
            );
            std::thread::yield_now();
        }
    }

    /// [`Spawner::in_private_table`] with jobs that touch only their own.
    fn in_private_table<T>(
        needed: &[RawFd],
        job: impl FnOnce(&mut HandBack) -> T,
    ) -> io::Result<Ran<T>> {
        // SAFETY: the tests' jobs use only what they make themselves.
        unsafe { spawner().in_private_table(Placement::of_this_thread(), needed, job) }
    }

    #[test]
    fn the_spawner_holds_what_a_start_needs_and_nothing_else_of_ours() {
        let (needed, _) = std::io::pipe().expect("pipe");
        let needed = OwnedFd::from(needed);
        let (other, _) = std::io::pipe().expect("pipe");
        let other = OwnedFd::from(other);
        let (needed_pipe, other_pipe) = (names(&needed), names(&other));
        let ran = in_private_table(&[needed.as_raw_fd()], |_| own_table()).expect("run");
        let table = ran.value;
        assert!(ran.handed_back.expect("nothing to take in").is_empty());
        // The one needed, under its own number; nothing else of ours.
        assert!(
            table.contains(&(needed.as_raw_fd(), needed_pipe.clone())),
            "{table:?}"
        );
        assert!(
            !table.iter().any(|(_, name)| *name == other_pipe),
            "{table:?}"
        );
        // 0, 1 and 2 at most, the two of its own, the one needed, and the
        // directory being listed.
        assert!(table.len() <= 7, "{table:?}");
        // Gone again once the job is done.
        let after = in_private_table(&[], |_| own_table()).expect("run").value;
        assert!(
            !after.iter().any(|(_, name)| *name == needed_pipe),
            "{after:?}"
        );
    }

    #[test]
    fn what_a_job_hands_back_arrives_in_the_caller_s_table_in_order() {
        let ran = in_private_table(&[], |hand_back| {
            let mut sent = Vec::new();
            for text in [b"first".as_slice(), b"second"] {
                let (read, mut write) = std::io::pipe().expect("pipe");
                std::io::Write::write_all(&mut write, text).expect("write");
                drop(write);
                hand_back.give(read.into()).expect("give");
                sent.push(text.len());
            }
            sent
        })
        .expect("run");
        assert_eq!(ran.value, [5, 6]);
        let read: Vec<Vec<u8>> = ran
            .handed_back
            .expect("taken in")
            .into_iter()
            .map(|fd| {
                let mut bytes = Vec::new();
                std::io::Read::read_to_end(&mut std::fs::File::from(fd), &mut bytes).expect("read");
                bytes
            })
            .collect();
        assert_eq!(read, [b"first".to_vec(), b"second".to_vec()]);
    }

    #[test]
    fn a_descriptor_that_is_not_open_is_an_error_and_the_spawner_goes_on() {
        // Far above any this process opens.
        let number = 900_000;
        let error = in_private_table(&[number], |_| ()).err().expect("not open");
        assert_eq!(error.raw_os_error(), Some(libc::EBADF), "{error}");
        in_private_table(&[], |_| ()).expect("the spawner serves on");
    }

    #[test]
    fn a_panic_in_a_job_reaches_the_caller_and_the_spawner_goes_on() {
        let panicked = std::panic::catch_unwind(|| {
            let _ = in_private_table(&[], |_| panic!("in the job"));
        });
        assert!(panicked.is_err());
        assert_eq!(in_private_table(&[], |_| 7).expect("run").value, 7);
    }

    /// This thread's CPUs, in the order `sched_getaffinity` names them.
    fn own_cpus() -> Vec<usize> {
        // SAFETY: cpu_set_t is plain data, valid all zeroes; CPU_ISSET
        // stays within CPU_SETSIZE.
        unsafe {
            let mut mask: libc::cpu_set_t = std::mem::zeroed();
            let size = std::mem::size_of::<libc::cpu_set_t>();
            assert_eq!(libc::sched_getaffinity(0, size, &mut mask), 0);
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&cpu| libc::CPU_ISSET(cpu, &mask))
                .collect()
        }
    }

    /// Runs this thread on `cpus` alone.
    fn run_on(cpus: &[usize]) {
        // SAFETY: as above; sched_setaffinity changes this thread only.
        unsafe {
            let mut mask: libc::cpu_set_t = std::mem::zeroed();
            for &cpu in cpus {
                libc::CPU_SET(cpu, &mut mask);
            }
            let size = std::mem::size_of::<libc::cpu_set_t>();
            assert_eq!(libc::sched_setaffinity(0, size, &mask), 0);
        }
    }

    #[test]
    fn a_job_runs_on_its_caller_s_cpu_with_its_caller_s_cpus() {
        let all = own_cpus();
        // On the last CPU alone: the spawner must move there.
        let last = *all.last().expect("a CPU");
        let caller = std::thread::spawn(move || {
            run_on(&[last]);
            let ran = in_private_table(&[], |_| {
                // SAFETY: sched_getcpu has no preconditions.
                (unsafe { libc::sched_getcpu() }, own_cpus())
            })
            .expect("run");
            ran.value
        });
        let (cpu, cpus) = caller.join().expect("caller");
        assert_eq!((usize::try_from(cpu).ok(), cpus), (Some(last), vec![last]));
        // From a caller on every CPU again, the job (and a child it
        // clones) may run on every one of them.
        let cpus = in_private_table(&[], |_| own_cpus()).expect("run").value;
        assert_eq!(cpus, all);
    }
}
