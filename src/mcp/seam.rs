//! The seam between rmcp and capexec's capabilities.
//!
//! capnp-rpc is `!Send`: every capability (executor, process, directory)
//! lives on one thread, inside a tokio `LocalSet` (the "capability
//! thread"). rmcp's server handlers must be `Send` (its `local` feature
//! lifts that, but also removes its Streamable HTTP server for every user
//! of the crate), and rmcp runs them on a runtime of its own (the "MCP
//! thread"). Between them is this seam: a [`Seam`] is a `Send + Clone`
//! handle whose [`Seam::run`] sends a boxed job (a `Send` closure that,
//! once on the capability thread, makes a `!Send` future) over a bounded
//! channel and gets its result back over a oneshot. Only plain data
//! crosses: arguments in, serde values out.
//!
//! Bounds: at most [`QUEUED_JOBS`] jobs wait in the channel (a sender
//! waits for room, so rmcp's request tasks are held back, not queued
//! here without limit), and at most [`RUNNING_JOBS`] run at once on the
//! capability thread.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc, oneshot};

/// Jobs waiting for the capability thread.
pub const QUEUED_JOBS: usize = 64;

/// Jobs running at once on the capability thread (long-polls included).
pub const RUNNING_JOBS: usize = 256;

/// A `!Send` future of the capability thread.
pub type LocalFuture<T> = Pin<Box<dyn Future<Output = T>>>;

type Job<S> = Box<dyn FnOnce(Rc<S>) -> LocalFuture<()> + Send>;

/// The capability thread is gone (capexec is ending): nothing can be
/// answered any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeamClosed;

impl std::fmt::Display for SeamClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("capexec: mcp: the executor's side of the server has ended")
    }
}

impl std::error::Error for SeamClosed {}

/// The `Send` end: runs jobs on the capability thread, whose state is `S`.
pub struct Seam<S> {
    jobs: mpsc::Sender<Job<S>>,
}

impl<S> Clone for Seam<S> {
    fn clone(&self) -> Self {
        Seam {
            jobs: self.jobs.clone(),
        }
    }
}

/// The capability thread's end: [`Jobs::serve`] runs what the [`Seam`]s
/// send.
pub struct Jobs<S> {
    jobs: mpsc::Receiver<Job<S>>,
}

/// A seam and the job queue it feeds.
pub fn channel<S: 'static>() -> (Seam<S>, Jobs<S>) {
    let (sender, receiver) = mpsc::channel(QUEUED_JOBS);
    (Seam { jobs: sender }, Jobs { jobs: receiver })
}

impl<S: 'static> Seam<S> {
    /// Runs `job` on the capability thread and returns what its future
    /// gives. `job` is called there with the thread's state; the future it
    /// makes may hold capabilities. If the caller stops waiting (its
    /// request was dropped), the job still runs to its end: cancellation
    /// is said explicitly, with a token the job watches.
    pub async fn run<T, F>(&self, job: F) -> Result<T, SeamClosed>
    where
        T: Send + 'static,
        F: FnOnce(Rc<S>) -> LocalFuture<T> + Send + 'static,
    {
        let (answer, answered) = oneshot::channel();
        let boxed: Job<S> = Box::new(move |state| {
            let work = job(state);
            Box::pin(async move {
                // The asker may have gone; its answer goes nowhere.
                let _ = answer.send(work.await);
            })
        });
        self.jobs.send(boxed).await.map_err(|_| SeamClosed)?;
        answered.await.map_err(|_| SeamClosed)
    }
}

impl<S: 'static> Jobs<S> {
    /// Runs every job sent until every [`Seam`] is dropped, each as its own
    /// local task, at most [`RUNNING_JOBS`] at once. Must run inside a
    /// `LocalSet`.
    pub async fn serve(mut self, state: Rc<S>) {
        let running = Arc::new(Semaphore::new(RUNNING_JOBS));
        let mut tasks = tokio::task::JoinSet::new();
        loop {
            while tasks.try_join_next().is_some() {}
            let Ok(permit) = running.clone().acquire_owned().await else {
                break;
            };
            let Some(job) = self.jobs.recv().await else {
                break;
            };
            let work = job(state.clone());
            tasks.spawn_local(async move {
                work.await;
                drop(permit);
            });
        }
        while tasks.join_next().await.is_some() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_runs_on_the_local_thread_and_answers_another_thread() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let (seam, jobs) = channel::<std::cell::Cell<u32>>();
        let asker = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let first = seam
                    .run(|state| {
                        Box::pin(async move {
                            state.set(state.get() + 1);
                            state.get()
                        })
                    })
                    .await;
                let second = seam
                    .run(|state| Box::pin(async move { state.get() * 10 }))
                    .await;
                (first, second)
            })
        });
        let local = tokio::task::LocalSet::new();
        local.block_on(&runtime, jobs.serve(Rc::new(std::cell::Cell::new(0))));
        let answers = asker.join().expect("the asking thread");
        assert_eq!(answers, (Ok(1), Ok(10)));
    }

    #[test]
    fn a_seam_without_its_thread_says_so() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let (seam, jobs) = channel::<()>();
        drop(jobs);
        let answer = runtime.block_on(seam.run(|_| Box::pin(async { 1 })));
        assert_eq!(answer, Err(SeamClosed));
    }
}
