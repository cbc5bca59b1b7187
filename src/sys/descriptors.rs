//! Closing descriptors off the thread that serves connections, on
//! threads of their own.
//!
//! A close can sleep for as long as someone else likes: the last close of
//! a pipe takes the pipe's lock, which whoever else holds the pipe keeps
//! through a splice from a silent socket, uninterruptibly; closing a file
//! on a FUSE mount waits for its daemon. So no such close runs on the
//! serving thread, nor on tokio's blocking pool (file calls use it, and a
//! peer that sends pipes it holds locked would fill it), nor ahead of
//! another peer's closes:
//!
//! - Each owner ([`Closes`]: a connection's received descriptors; each
//!   call of [`close_in_background`] is one of its own) has its batches
//!   closed in the order given, by one thread at a time. A close that
//!   sleeps holds up only what its owner gave after it, and the owner
//!   can see how much waits ([`Closes::waiting`]).
//! - At most [`MAX_CLOSING_THREADS`] threads close at once (each that
//!   sleeps holds a task of whoever holds the lock); owners beyond wait
//!   their turn. Descriptors waiting to close are counted server-wide
//!   too ([`waiting_to_close`]).
//! - An upgrade ([`keep_closes_for_the_next_binary`]) keeps what has not
//!   been closed yet for the next binary: execve waits for every thread,
//!   so this binary starts no close from then on (each descriptor is
//!   closed on its own, the upgrade looked at before each). A close in
//!   progress that does not end ([`no_close_in_progress`]) refuses the
//!   upgrade, which gives back what was kept ([`close_what_was_kept`]).

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Most threads closing at once. A close is quick but for one that
/// sleeps, and each that sleeps takes a task of whoever holds its lock
/// (a splice that waits): the server's threads for it are bounded here,
/// apart from the pool file calls use.
pub const MAX_CLOSING_THREADS: usize = 256;

/// How long one close goes on before it counts as asleep (on a lock
/// someone else holds) rather than slow.
pub const ASLEEP_AFTER: Duration = Duration::from_millis(200);

/// Most owners in line for a thread while every thread sleeps before the
/// server takes no new connection ([`closes_backed_up`]).
pub const MAX_OWNERS_IN_LINE: usize = 256;

/// Set by an upgrade: what is to be closed from then on is kept for the
/// next binary instead ([`keep_closes_for_the_next_binary`]).
static FOR_THE_NEXT_BINARY: Mutex<Option<Vec<OwnedFd>>> = Mutex::new(None);

/// Descriptors given to close and not closed yet, over every owner.
static WAITING: AtomicUsize = AtomicUsize::new(0);

/// The closing threads, and the owners waiting for one.
static POOL: Mutex<Pool> = Mutex::new(Pool {
    threads: 0,
    next_thread: 0,
    owners: VecDeque::new(),
    closing: Vec::new(),
});

struct Pool {
    threads: usize,
    next_thread: u64,
    /// Owners with batches to close and no thread yet, oldest first.
    owners: VecDeque<Arc<Owner>>,
    /// Each thread inside a close: its number, its tid and since when.
    closing: Vec<(u64, i32, Instant)>,
}

impl Pool {
    /// Whether every closing thread is inside a close that has gone on
    /// for [`ASLEEP_AFTER`]: none will serve an owner in line until a
    /// lock's holder lets go. (Owners wait in line only once there are
    /// [`MAX_CLOSING_THREADS`], or the system refused more: then with
    /// fewer, or none.)
    fn every_thread_asleep(&self) -> bool {
        self.closing.len() >= self.threads
            && self
                .closing
                .iter()
                .all(|(_, _, since)| since.elapsed() >= ASLEEP_AFTER)
    }
}

#[derive(Default)]
struct Owner {
    queue: Mutex<Queue>,
}

/// What an owner gives to close.
enum Job {
    Close(Vec<OwnedFd>),
    /// A Unix socket whose peer can send no more: what it sent and
    /// nobody read is read out, its descriptors closed, then the socket.
    ReadOutAndClose(OwnedFd),
}

impl Job {
    /// The descriptors it counts as, waiting.
    fn counted(&self) -> usize {
        match self {
            Job::Close(fds) => fds.len(),
            Job::ReadOutAndClose(_) => 1,
        }
    }

    fn into_fds(self) -> Vec<OwnedFd> {
        match self {
            Job::Close(fds) => fds,
            Job::ReadOutAndClose(socket) => vec![socket],
        }
    }
}

#[derive(Default)]
struct Queue {
    batches: VecDeque<Job>,
    /// Descriptors in `batches` and in the batch being closed.
    waiting: usize,
    /// A thread closes them, or the owner waits for one in `Pool::owners`.
    served: bool,
    /// Since when the close in progress has been going on, if one is.
    closing_since: Option<Instant>,
    /// Woken when one of them is closed.
    waker: Option<std::task::Waker>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// An owner of closes: what it is given is closed in order, by one thread
/// at a time, off the calling thread. Clones share the owner.
#[derive(Clone, Default)]
pub struct Closes(Arc<Owner>);

impl Closes {
    /// Closes `fds` after what this owner was given before.
    pub fn close(&self, fds: Vec<OwnedFd>) {
        if fds.is_empty() {
            return;
        }
        if let Some(fds) = unless_upgrading(fds) {
            self.give(Job::Close(fds));
        }
    }

    /// After what this owner was given before, reads out what the Unix
    /// `socket` (a copy of a connection's, shut for reading) holds,
    /// closing the descriptors that came with it one at a time, then
    /// closes it. The copy keeps the connection's socket from being
    /// closed (and releasing them) wherever the original is: this is its
    /// last close.
    pub fn read_out_and_close(&self, socket: OwnedFd) {
        if let Some(mut socket) = unless_upgrading(vec![socket])
            && let Some(socket) = socket.pop()
        {
            self.give(Job::ReadOutAndClose(socket));
        }
    }

    fn give(&self, job: Job) {
        let mut queue = lock(&self.0.queue);
        queue.waiting += job.counted();
        WAITING.fetch_add(job.counted(), Ordering::Relaxed);
        queue.batches.push_back(job);
        if std::mem::replace(&mut queue.served, true) {
            drop(queue);
            // It waits in line; with no thread left (the system refused
            // them), try one again.
            retry_a_thread();
            return;
        }
        drop(queue);
        serve(Arc::clone(&self.0));
    }

    /// How many of the descriptors given are not closed yet.
    pub fn waiting(&self) -> usize {
        lock(&self.0.queue).waiting
    }

    /// Whether this owner's closes are stuck: the close in progress has
    /// gone on for [`ASLEEP_AFTER`] (asleep on a lock someone else
    /// holds, most likely), or it waits in line for a thread while every
    /// thread there may be is inside such a close (then nothing of its
    /// own closes either, for as long as the holders like).
    pub fn asleep(&self) -> bool {
        let since = lock(&self.0.queue).closing_since;
        if let Some(since) = since {
            return since.elapsed() >= ASLEEP_AFTER;
        }
        let pool = lock(&POOL);
        pool.every_thread_asleep() && pool.owners.iter().any(|owner| Arc::ptr_eq(owner, &self.0))
    }

    /// Wakes `waker` once one of the descriptors given is closed.
    pub fn wake_when_one_closes(&self, waker: &std::task::Waker) {
        lock(&self.0.queue).waker = Some(waker.clone());
    }
}

/// Closes `fds` off the calling thread (as an owner of their own).
pub fn close_in_background(fds: Vec<OwnedFd>) {
    Closes::default().close(fds);
}

/// How many descriptors given to close are not closed yet, server-wide.
pub fn waiting_to_close() -> usize {
    WAITING.load(Ordering::Relaxed)
}

/// Whether at least [`MAX_OWNERS_IN_LINE`] owners wait for a closing
/// thread: every thread there may be is busy (honest closes take
/// microseconds, so most likely asleep on locks a client holds, or kept
/// just short of [`ASLEEP_AFTER`] one after another), and each owner in
/// line holds a descriptor at least, so the server takes no new Unix
/// connection, whose refusal or end would add one, until the line
/// shortens. The server's descriptor budget counts the line
/// (`engine::descriptors::RECEIVED_DESCRIPTORS`). With no thread at all
/// (the system refused them), one is tried again here.
pub fn closes_backed_up() -> bool {
    let (backed_up, no_thread) = {
        let pool = lock(&POOL);
        (
            pool.owners.len() >= MAX_OWNERS_IN_LINE,
            pool.threads == 0 && !pool.owners.is_empty(),
        )
    };
    if no_thread {
        retry_a_thread();
    }
    backed_up
}

/// How many closing threads there are now.
pub fn closing_threads() -> usize {
    lock(&POOL).threads
}

/// The tids of the threads inside one close for at least `at_least`.
pub fn closing_for(at_least: Duration) -> Vec<i32> {
    lock(&POOL)
        .closing
        .iter()
        .filter(|(_, _, since)| since.elapsed() >= at_least)
        .map(|&(_, tid, _)| tid)
        .collect()
}

/// `fds`, unless an upgrade keeps them for the next binary.
fn unless_upgrading(fds: Vec<OwnedFd>) -> Option<Vec<OwnedFd>> {
    match lock(&FOR_THE_NEXT_BINARY).as_mut() {
        Some(kept) => {
            kept.extend(fds);
            None
        }
        None => Some(fds),
    }
}

/// Starts a thread for the owners in line if none is running (every
/// spawn so far was refused).
fn retry_a_thread() {
    let next = {
        let mut pool = lock(&POOL);
        if pool.threads > 0 {
            return;
        }
        pool.owners.pop_front()
    };
    if let Some(owner) = next {
        serve(owner);
    }
}

/// Gives `owner` a thread, or a place in line for one.
fn serve(owner: Arc<Owner>) {
    let mut pool = lock(&POOL);
    if pool.threads >= MAX_CLOSING_THREADS {
        pool.owners.push_back(owner);
        return;
    }
    pool.threads += 1;
    let number = pool.next_thread;
    pool.next_thread += 1;
    drop(pool);
    let first = Arc::clone(&owner);
    let spawned = std::thread::Builder::new()
        .name("capexec-close".into())
        .stack_size(64 * 1024)
        .spawn(move || closing_thread(number, first));
    if let Err(error) = spawned {
        // The next thread that ends a close serves it; closing here
        // could put the caller (the serving thread) to sleep.
        tracing::warn!(%error, "no thread to close descriptors on: they wait for one");
        let mut pool = lock(&POOL);
        pool.threads -= 1;
        pool.owners.push_back(owner);
    }
}

fn closing_thread(number: u64, first: Arc<Owner>) {
    // SAFETY: gettid(2) has no arguments and cannot fail.
    let tid = unsafe { libc::gettid() };
    let mut owner = first;
    loop {
        close_all_of(&owner, number, tid);
        let mut pool = lock(&POOL);
        match pool.owners.pop_front() {
            Some(next) => owner = next,
            None => {
                pool.threads -= 1;
                return;
            }
        }
    }
}

/// Closes `owner`'s batches until none is left.
fn close_all_of(owner: &Owner, number: u64, tid: i32) {
    loop {
        let batch = {
            let mut queue = lock(&owner.queue);
            match queue.batches.pop_front() {
                Some(batch) => batch,
                None => {
                    queue.served = false;
                    return;
                }
            }
        };
        let counted = batch.counted();
        match batch {
            Job::Close(fds) => fds
                .into_iter()
                .for_each(|fd| close_one(fd, owner, number, tid)),
            Job::ReadOutAndClose(socket) => {
                read_out(&socket, owner, number, tid);
                close_one(socket, owner, number, tid);
            }
        }
        let waker = {
            let mut queue = lock(&owner.queue);
            queue.waiting -= counted;
            queue.waker.take()
        };
        WAITING.fetch_sub(counted, Ordering::Relaxed);
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// Closes `fd` unless an upgrade keeps it since, marked as inside a
/// close while it is.
fn close_one(fd: OwnedFd, owner: &Owner, number: u64, tid: i32) {
    let now = Instant::now();
    // Listed as inside a close under the same lock as the look at the
    // upgrade: an upgrade that keeps closes from now on then sees it in
    // progress (`no_close_in_progress`), or this close sees the upgrade.
    let fd = {
        let mut kept = lock(&FOR_THE_NEXT_BINARY);
        match kept.as_mut() {
            Some(kept) => {
                kept.push(fd);
                None
            }
            None => {
                lock(&POOL).closing.push((number, tid, now));
                Some(fd)
            }
        }
    };
    if let Some(fd) = fd {
        in_progress(owner, number, now, || super::low_slots::close(fd));
    }
}

/// Runs `close` (listed as inside a close already) with the owner's
/// close in progress marked, then unlists it.
fn in_progress<T>(owner: &Owner, number: u64, since: Instant, close: impl FnOnce() -> T) -> T {
    lock(&owner.queue).closing_since = Some(since);
    let done = close();
    lock(&POOL).closing.retain(|&(thread, ..)| thread != number);
    lock(&owner.queue).closing_since = None;
    done
}

/// Reads out what `socket` holds, one message at a time with room for
/// one descriptor: the kernel closes the others of a message here (this
/// thread may sleep), so a read-out holds at most one of them in the
/// table, which the server's budget counts on
/// (`engine::descriptors::RECEIVED_DESCRIPTORS`). Each read is a close
/// as an upgrade sees it; once an upgrade keeps closes, the read-out
/// stops (the socket, with what is left in it, is kept).
fn read_out(socket: &OwnedFd, owner: &Owner, number: u64, tid: i32) {
    use std::os::fd::AsRawFd;
    let mut scratch = vec![std::mem::MaybeUninit::<u8>::uninit(); 64 * 1024];
    loop {
        let now = Instant::now();
        {
            let kept = lock(&FOR_THE_NEXT_BINARY);
            if kept.is_some() {
                return;
            }
            lock(&POOL).closing.push((number, tid, now));
        }
        let read = in_progress(owner, number, now, || {
            super::scm::receive_one_descriptor(socket.as_raw_fd(), &mut scratch, libc::MSG_DONTWAIT)
        });
        let Ok(read) = read else { return };
        for fd in read.descriptors {
            close_one(fd, owner, number, tid);
        }
        if read.bytes == 0 {
            return;
        }
    }
}

/// From now on, what is given to close is kept, for the next binary to
/// close, and so is what waits for a thread. An upgrade sets it before
/// it closes the connections: a descriptor a client sent may be a pipe
/// whose lock the client holds, its close then waits for as long as the
/// client likes, and execve waits for the thread that waits.
pub fn keep_closes_for_the_next_binary() {
    let mut kept = lock(&FOR_THE_NEXT_BINARY);
    let kept = kept.get_or_insert_with(Vec::new);
    let owners = std::mem::take(&mut lock(&POOL).owners);
    for owner in owners {
        let mut queue = lock(&owner.queue);
        for batch in std::mem::take(&mut queue.batches) {
            WAITING.fetch_sub(batch.counted(), Ordering::Relaxed);
            queue.waiting -= batch.counted();
            kept.extend(batch.into_fds());
        }
        queue.served = false;
    }
}

/// Undoes [`keep_closes_for_the_next_binary`] (the upgrade did not go
/// ahead): what was kept is closed here after all.
pub fn close_what_was_kept() {
    let kept = lock(&FOR_THE_NEXT_BINARY).take().unwrap_or_default();
    close_in_background(kept);
}

/// Whether no thread is inside a close.
pub fn no_close_in_progress() -> bool {
    lock(&POOL).closing.is_empty()
}

/// What was kept since [`keep_closes_for_the_next_binary`], taken.
pub fn kept_for_the_next_binary() -> Vec<OwnedFd> {
    lock(&FOR_THE_NEXT_BINARY)
        .as_mut()
        .map(std::mem::take)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipe() -> (OwnedFd, OwnedFd) {
        let (read, write) = std::io::pipe().expect("pipe");
        (read.into(), write.into())
    }

    /// Whether the write end's reader is gone (EPIPE on a write).
    fn reader_closed(write: &OwnedFd) -> bool {
        let mut probe = std::fs::File::from(write.try_clone().expect("dup"));
        std::io::Write::write(&mut probe, b"x")
            .is_err_and(|error| error.kind() == std::io::ErrorKind::BrokenPipe)
    }

    fn eventually(what: &str, mut done: impl FnMut() -> bool) {
        let until = Instant::now() + Duration::from_secs(30);
        while !done() {
            assert!(Instant::now() < until, "{what} never happened");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A second open file of a pipe, whose close is that file's last, and
    /// a thread that keeps the pipe locked (splicing a silent socket into
    /// it, asleep there once this returns) until the returned socket is
    /// dropped.
    fn locked_pipe() -> (
        OwnedFd,
        std::os::unix::net::UnixStream,
        std::thread::JoinHandle<()>,
    ) {
        use std::os::fd::AsRawFd;
        let (read, write) = pipe();
        // Opened before the lock is held (an open of a pipe takes it).
        let second: OwnedFd = std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/proc/self/fd/{}", write.as_raw_fd()))
            .expect("reopen")
            .into();
        let (quiet, peer) = std::os::unix::net::UnixStream::pair().expect("pair");
        let (told, tid) = std::sync::mpsc::channel();
        let holder = std::thread::spawn(move || {
            // SAFETY: gettid(2) has no arguments and cannot fail.
            let _ = told.send(unsafe { libc::gettid() });
            // SAFETY: both descriptors are open for the call.
            unsafe {
                libc::splice(
                    quiet.as_raw_fd(),
                    std::ptr::null_mut(),
                    write.as_raw_fd(),
                    std::ptr::null_mut(),
                    65536,
                    0,
                );
            }
            drop((read, write, quiet));
        });
        let tid = tid.recv().expect("the holder's tid");
        let task = format!("/proc/self/task/{tid}");
        eventually("the holder sleeps in its splice", || {
            let call = std::fs::read_to_string(format!("{task}/syscall")).unwrap_or_default();
            let stat = std::fs::read_to_string(format!("{task}/stat")).unwrap_or_default();
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().next());
            call.split_whitespace().next() == Some(&libc::SYS_splice.to_string())
                && state == Some("S")
        });
        (second, peer, holder)
    }

    /// With every closing thread asleep on a lock, an owner that waits in
    /// line for one counts as asleep too: nothing of its closes either;
    /// and once the line is long, the closes count as backed up.
    #[test]
    fn an_owner_in_line_behind_threads_that_all_sleep_is_asleep() {
        let mut held = Vec::new();
        for _ in 0..MAX_CLOSING_THREADS {
            let (second, peer, holder) = locked_pipe();
            held.push((peer, holder));
            close_in_background(vec![second]);
        }
        let (read, write) = pipe();
        let in_line = Closes::default();
        in_line.close(vec![read]);
        eventually("the owner in line counts as asleep", || in_line.asleep());
        assert!(!reader_closed(&write));
        assert!(!closes_backed_up(), "one in line");
        let behind: Vec<OwnedFd> = (1..MAX_OWNERS_IN_LINE)
            .map(|_| {
                let (read, write) = pipe();
                close_in_background(vec![read]);
                write
            })
            .collect();
        assert!(closes_backed_up());
        for (peer, holder) in held {
            drop(peer);
            holder.join().expect("holder");
        }
        eventually("the owner in line is served", || in_line.waiting() == 0);
        assert!(!in_line.asleep());
        assert!(reader_closed(&write));
        eventually("the line is served", || behind.iter().all(reader_closed));
        assert!(!closes_backed_up());
    }

    #[test]
    fn an_owner_s_batches_are_closed_and_counted() {
        let closes = Closes::default();
        let (read, write) = pipe();
        let (read2, write2) = pipe();
        closes.close(vec![read]);
        closes.close(vec![read2]);
        eventually("both closed", || closes.waiting() == 0);
        assert!(reader_closed(&write));
        assert!(reader_closed(&write2));
        close_in_background(Vec::new());
    }
}
