//! How much of tokio's blocking pool file system calls may take. Every
//! call of the file engine runs there (the calls block), and a call can
//! block for long on a slow or hung file system; so each connection may
//! run at most [`MAX_FILE_WORK_PER_CONNECTION`] at once and queue a bounded
//! number more, and the server at most [`MAX_FILE_WORK`] at once, well
//! below the pool's 512 threads: whatever one connection does, the others'
//! file calls (and everything else the pool serves) find threads. No call
//! ever waits on a peer on a pool thread: transfers hold no thread between
//! their chunks (`mod.rs`).

use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::model::{Refusal, RefusalKind};

/// Blocking file system calls one connection may run at once.
pub const MAX_FILE_WORK_PER_CONNECTION: usize = 16;

/// Blocking file system calls one connection may have waiting for one of
/// its places; past this, calls fail with `[capexec:limit]`.
pub const MAX_FILE_WORK_QUEUED_PER_CONNECTION: usize = 4096;

/// Blocking file system calls the whole server may run at once.
pub const MAX_FILE_WORK: usize = 256;

static SERVER: Semaphore = Semaphore::const_new(MAX_FILE_WORK);

/// One connection's share of the blocking pool, shared by every directory
/// reached from it.
#[derive(Clone)]
pub struct Work(Arc<Share>);

struct Share {
    running: Arc<Semaphore>,
    /// Places for calls waiting for one of `running`'s: a call holds one
    /// until it runs (or gives up).
    queued: Semaphore,
}

impl Default for Work {
    fn default() -> Self {
        Work(Arc::new(Share {
            running: Arc::new(Semaphore::new(MAX_FILE_WORK_PER_CONNECTION)),
            queued: Semaphore::new(MAX_FILE_WORK_QUEUED_PER_CONNECTION),
        }))
    }
}

impl Work {
    /// Runs `work` on the blocking pool once this connection and the
    /// server have room. Its places are held by the work itself, so a
    /// caller that stops waiting does not free them while it still runs.
    pub async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T, Refusal> + Send + 'static,
    ) -> Result<T, Refusal> {
        // Given back however the wait ends, by a caller that gives up too.
        let waiting = self.0.queued.try_acquire();
        let places = async {
            if waiting.is_err() {
                crate::metrics::limit_hit("file-work");
                return Err(Refusal::new(
                    RefusalKind::LimitReached,
                    format!(
                        "this connection already has {MAX_FILE_WORK_QUEUED_PER_CONNECTION} file \
                         system calls waiting for the {MAX_FILE_WORK_PER_CONNECTION} it may run \
                         at once"
                    ),
                ));
            }
            let own = Arc::clone(&self.0.running)
                .acquire_owned()
                .await
                .map_err(|_| closed())?;
            let server = SERVER.acquire().await.map_err(|_| closed())?;
            Ok((own, server))
        }
        .await;
        drop(waiting);
        let (own, server) = places?;
        tokio::task::spawn_blocking(move || {
            let _places = (own, server);
            work()
        })
        .await
        .unwrap_or_else(|error| {
            Err(Refusal::new(
                RefusalKind::Internal,
                format!("a file system call failed: {error}"),
            ))
        })
    }
}

fn closed() -> Refusal {
    Refusal::new(RefusalKind::Internal, "the file system call pool is closed")
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Work {
        /// Calls waiting for their places now.
        fn queued(&self) -> usize {
            MAX_FILE_WORK_QUEUED_PER_CONNECTION - self.0.queued.available_permits()
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_runs_16_waits_4096_and_is_refused_past_that() {
        let work = Work::default();
        let (release, held) = std::sync::mpsc::channel::<()>();
        let held = Arc::new(std::sync::Mutex::new(held));
        let (started, mut running) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        for _ in 0..MAX_FILE_WORK_PER_CONNECTION {
            let (work, held, started) = (work.clone(), Arc::clone(&held), started.clone());
            tasks.push(tokio::spawn(async move {
                work.run(move || {
                    let _ = started.send(());
                    let _ = held.lock().map(|held| held.recv());
                    Ok(())
                })
                .await
            }));
        }
        for _ in 0..MAX_FILE_WORK_PER_CONNECTION {
            running.recv().await.expect("running");
        }
        // These wait; one that gives up leaves no place behind.
        for _ in 0..MAX_FILE_WORK_QUEUED_PER_CONNECTION {
            let work = work.clone();
            tasks.push(tokio::spawn(async move { work.run(|| Ok(())).await }));
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while work.queued() < MAX_FILE_WORK_QUEUED_PER_CONNECTION {
            assert!(
                std::time::Instant::now() < deadline,
                "the waiters never queued"
            );
            tokio::task::yield_now().await;
        }
        let refusal = work.run(|| Ok(())).await.expect_err("past the queue");
        assert_eq!(refusal.kind, RefusalKind::LimitReached);
        // A waiter that gives up leaves its place: another may wait.
        let gave_up = tasks.pop().expect("a waiter");
        gave_up.abort();
        assert!(gave_up.await.is_err_and(|error| error.is_cancelled()));
        assert_eq!(work.queued(), MAX_FILE_WORK_QUEUED_PER_CONNECTION - 1);
        let again = work.clone();
        tasks.push(tokio::spawn(async move { again.run(|| Ok(())).await }));
        for _ in 0..MAX_FILE_WORK_PER_CONNECTION {
            release.send(()).expect("release");
        }
        for task in tasks {
            task.await.expect("task").expect("ran");
        }
        assert_eq!(work.queued(), 0);
    }
}
