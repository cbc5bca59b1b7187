//! Each process's pipes are read and written on a thread of its own.
//!
//! Why not on the serving thread: a pipe's lock is held by whoever is
//! inside a read, write, splice or ioctl of it, and a child can keep it
//! held for as long as it likes (splicing from a socket that never sends
//! into its stdout keeps stdout's lock while it waits; splicing its stdin
//! into a socket nobody reads keeps stdin's). Every other operation on that
//! pipe then sleeps uninterruptibly on the lock, O_NONBLOCK, RWF_NOWAIT and
//! FIONREAD included; only poll(2) and epoll do not take it. On the thread
//! that serves every connection, one such command stopped the server. On
//! its own thread it stops only its own output and input, which is its
//! owner's doing; the owner can still signal and terminate it, and its
//! end releases the lock.
//!
//! What runs here is the process's output pump and stdin writer, unchanged
//! tokio code, on a runtime of the thread's own that has timers but no
//! reactor: the serving runtime's reactor still says when a pipe is ready
//! (epoll takes no pipe lock), and this thread makes the calls that take
//! the lock. So a process costs no descriptor more than it did
//! (`descriptors.rs`). The thread ends when the pump and the writer are
//! done, or when the serving runtime goes: it then drops them, and with
//! them the process's pipes, on itself.
//!
//! The thread can be asleep on a lock for as long as the child likes, and
//! execve(2) waits for every thread of the process to end: [`IoThread`]
//! says whether it is, so that an upgrade can refuse to begin rather than
//! wait for ever.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

/// Enough for the pump and the writer, which keep their buffers on the heap.
const STACK_SIZE: usize = 256 * 1024;

/// The thread doing one process's pipe I/O, while it runs.
#[derive(Default)]
pub(crate) struct IoThread {
    /// Its kernel thread id; 0 before it starts and after it ends.
    tid: AtomicI32,
}

impl IoThread {
    /// Whether it sleeps uninterruptibly now (state `D`): nothing it does
    /// sleeps so but waiting on a pipe's lock, or for a moment on the
    /// disk or memory, which a caller tells apart by asking again.
    pub fn asleep_on_a_lock(&self) -> bool {
        match self.tid.load(Ordering::Acquire) {
            0 => false,
            tid => crate::engine::proc_stat::own_thread_state(tid) == Some('D'),
        }
    }
}

/// Runs `work` (the process's pump and writer) to its end on a new
/// thread, or until the serving runtime goes (then `work` is dropped on
/// that thread, which drops what it holds of the process there: a process
/// nobody holds any more is killed, as before). Must be called within the
/// serving runtime. When the system refuses a thread or its runtime,
/// gives `work` back unpolled with the error.
pub(crate) fn spawn<F>(work: F, thread: Arc<IoThread>) -> Result<(), (io::Error, Pin<Box<F>>)>
where
    F: Future<Output = ()> + Send + 'static,
{
    // Made here, where a failure is the start's: a thread without one
    // could only drop the process's pump, and its end would never be
    // told.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return Err((error, Box::pin(work))),
    };
    let done = CancellationToken::new();
    let runtime_gone = CancellationToken::new();
    // On the heap: the work is a future of some KiB that block_on and
    // select would otherwise move through the thread's stack, touching
    // 60 KiB of it per process where 12 do. Both are handed through a
    // slot, so that a thread the system refuses gives them back rather
    // than drop them here (a runtime must not be dropped in another's
    // context).
    let given = Arc::new(Mutex::new(Some((Box::pin(work), runtime))));
    let taken = Arc::clone(&given);
    let (thread_done, gone) = (done.clone(), runtime_gone.clone());
    let spawned = std::thread::Builder::new()
        .name("capexec-io".into())
        .stack_size(STACK_SIZE)
        .spawn(move || {
            // SAFETY: gettid(2) has no preconditions.
            thread
                .tid
                .store(unsafe { libc::gettid() }, Ordering::Release);
            let given = taken.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some((work, runtime)) = given {
                runtime.block_on(async {
                    tokio::select! {
                        biased;
                        _ = gone.cancelled() => {}
                        _ = work => {}
                    }
                });
            }
            thread.tid.store(0, Ordering::Release);
            thread_done.cancel();
        });
    if let Err(error) = spawned {
        let given = given.lock().unwrap_or_else(|p| p.into_inner()).take();
        return match given {
            Some((work, runtime)) => {
                runtime.shutdown_background();
                Err((error, work))
            }
            None => Ok(()),
        };
    }
    // Dropped with the serving runtime, it says so to the thread; ends
    // with the thread otherwise.
    let guard = runtime_gone.drop_guard();
    tokio::spawn(async move {
        let _guard = guard;
        done.cancelled().await;
    });
    Ok(())
}

/// The child's ends of its pipes, open in the parent until the child has
/// them. Once the child runs it may hold their pipes' locks, which close(2)
/// takes, so they are closed on the process's thread ([`Self::close`]), or
/// on a blocking thread if dropped before it has them.
pub(crate) struct ChildEnds(Vec<std::os::fd::OwnedFd>);

impl ChildEnds {
    pub fn new(ends: Vec<std::os::fd::OwnedFd>) -> ChildEnds {
        ChildEnds(ends)
    }

    /// Closes them here: on the process's own thread.
    pub fn close(mut self) {
        drop(std::mem::take(&mut self.0));
    }
}

impl Drop for ChildEnds {
    fn drop(&mut self) {
        crate::sys::close_in_background(std::mem::take(&mut self.0));
    }
}
