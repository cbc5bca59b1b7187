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
//! - At most [`MAX_CLOSING_THREADS`] threads close at once; owners beyond
//!   wait their turn. Descriptors waiting to close are counted server-wide
//!   too ([`waiting_to_close`]).
//! - An upgrade ([`keep_closes_for_the_next_binary`]) keeps what has not
//!   been closed yet for the next binary: execve waits for every thread,
//!   so this binary starts no close from then on. A close that sleeps
//!   already is reported ([`closing_for`]) and refuses the upgrade.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Most threads closing at once. Kept within the tasks a server keeps for
/// itself (`engine::tasks::SERVER_OWN_TASKS`).
pub const MAX_CLOSING_THREADS: usize = 16;

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

#[derive(Default)]
struct Owner {
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    batches: VecDeque<Vec<OwnedFd>>,
    /// Descriptors in `batches` and in the batch being closed.
    waiting: usize,
    /// A thread closes them, or the owner waits for one in `Pool::owners`.
    served: bool,
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
        let Some(fds) = unless_upgrading(fds) else {
            return;
        };
        let mut queue = lock(&self.0.queue);
        queue.waiting += fds.len();
        WAITING.fetch_add(fds.len(), Ordering::Relaxed);
        queue.batches.push_back(fds);
        if std::mem::replace(&mut queue.served, true) {
            return;
        }
        drop(queue);
        serve(Arc::clone(&self.0));
    }

    /// How many of the descriptors given are not closed yet.
    pub fn waiting(&self) -> usize {
        lock(&self.0.queue).waiting
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
        let count = batch.len();
        if let Some(batch) = unless_upgrading(batch) {
            lock(&POOL).closing.push((number, tid, Instant::now()));
            drop(batch);
            lock(&POOL).closing.retain(|&(thread, ..)| thread != number);
        }
        lock(&owner.queue).waiting -= count;
        WAITING.fetch_sub(count, Ordering::Relaxed);
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
            WAITING.fetch_sub(batch.len(), Ordering::Relaxed);
            queue.waiting -= batch.len();
            kept.extend(batch);
        }
        queue.served = false;
    }
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
