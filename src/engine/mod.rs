//! The process engine: spawning, the retained output log, sequence numbers,
//! events, stdin write ids, signals, process groups and reaping.
//!
//! Plain tokio code that knows nothing of Cap'n Proto; everything here is
//! `Send + Sync`. The RPC layer is a thin skin over [`Engine`] and
//! [`ProcessOwner`].

mod kill;
pub mod log;
mod output;
pub mod process;
pub mod reaper;
mod spawn;
pub mod spec;
mod stdin;
mod terminal;

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::net::unix::pipe;
use tokio::sync::mpsc;

pub use self::log::{Batch, LogLimits};
pub use self::output::CHUNK_SIZE;
pub use self::process::{
    CloseTicket, MAX_WRITE_BYTES, Process, ProcessLimits, ProcessOwner, ProcessSnapshot, ReadError,
    ReadOutcome, ResizeError, WriteError, WriteTicket,
};
pub use self::reaper::{become_subreaper, is_subreaper};
pub use self::spec::{EnvSpec, StartSpec};
pub use self::stdin::REMEMBERED_WRITE_IDS;

use self::output::OutputSource;
use self::process::{Shared, SharedParts};
use self::reaper::ExitWait;
use self::spawn::{ChildStdio, SpawnedChild};
use self::stdin::StdinState;
use self::terminal::{Terminal, TerminalWriter};
use crate::model::{OutputStream, StartError, StartErrorKind};

/// Starts processes and keeps track of the live ones.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<EngineInner>,
}

struct EngineInner {
    limits: ProcessLimits,
    live: Mutex<HashMap<u64, Weak<Shared>>>,
    next_id: AtomicU64,
}

impl EngineInner {
    fn live(&self) -> MutexGuard<'_, HashMap<u64, Weak<Shared>>> {
        self.live
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}

impl Default for Engine {
    fn default() -> Self {
        Engine::new(ProcessLimits::default())
    }
}

impl Engine {
    pub fn new(limits: ProcessLimits) -> Engine {
        Engine {
            inner: Arc::new(EngineInner {
                limits,
                live: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
            }),
        }
    }

    pub fn limits(&self) -> ProcessLimits {
        self.inner.limits
    }

    /// Spawns a process. Must be called within a tokio runtime, which then
    /// runs the process's tasks.
    pub fn start(&self, spec: &StartSpec) -> Result<ProcessOwner, StartError> {
        if spec.tty {
            self.start_on_terminal(spec)
        } else {
            self.start_on_pipes(spec)
        }
    }

    fn start_on_pipes(&self, spec: &StartSpec) -> Result<ProcessOwner, StartError> {
        let stdio = ChildStdio::Pipes {
            pipe_stdin: spec.pipe_stdin,
        };
        let SpawnedChild {
            pid,
            stdin,
            stdout,
            stderr,
            exit,
        } = spawn::spawn(spec, stdio)?;
        let attach = || -> std::io::Result<_> {
            let stdout = OutputSource::pipe(OutputStream::Stdout, required(stdout)?)?;
            let stderr = OutputSource::pipe(OutputStream::Stderr, required(stderr)?)?;
            let stdin = stdin.map(pipe::Sender::from_owned_fd).transpose()?;
            Ok((stdout, stderr, stdin))
        };
        match attach() {
            Ok((stdout, stderr, stdin)) => Ok(self.launch(Launch {
                spec,
                pid,
                sources: [Some(stdout), Some(stderr)],
                stdin: stdin.map(|sink| Box::new(sink) as StdinSink),
                terminal: None,
                exit,
            })),
            Err(error) => {
                abandon(pid, exit);
                Err(attach_failed(pid, &error))
            }
        }
    }

    fn start_on_terminal(&self, spec: &StartSpec) -> Result<ProcessOwner, StartError> {
        spec.validate()?;
        let (terminal, slave, slave_path) = Terminal::open(spec.pty_size).map_err(|error| {
            StartError::new(
                StartErrorKind::SpawnFailed,
                format!("cannot open a pseudo-terminal: {error}"),
            )
        })?;
        let child = spawn::spawn(spec, ChildStdio::Terminal(slave_path))?;
        drop(slave);
        let io = terminal.io();
        Ok(self.launch(Launch {
            spec,
            pid: child.pid,
            sources: [Some(OutputSource::terminal(Arc::clone(&io))), None],
            stdin: Some(Box::new(TerminalWriter(io))),
            terminal: Some(terminal),
            exit: child.exit,
        }))
    }

    /// Takes charge of a spawned child: shared state, stdin writer, pump.
    fn launch(&self, launch: Launch<'_>) -> ProcessOwner {
        let Launch {
            spec,
            pid,
            sources,
            stdin,
            terminal,
            exit,
        } = launch;
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let span = tracing::info_span!(
            "process",
            id,
            argv0 = %spec.argv[0].to_string_lossy(),
            pid
        );
        tracing::info!(parent: &span, tty = spec.tty, flow = ?spec.flow, "process started");

        let (stdin_ops, stdin_state, writer) = match stdin {
            Some(sink) => {
                let (ops, queue) = mpsc::unbounded_channel();
                (Some(ops), StdinState::Open, Some((sink, queue)))
            }
            None => (None, StdinState::NotPiped, None),
        };
        let engine = Arc::downgrade(&self.inner);
        let shared = Shared::new(SharedParts {
            pid,
            tty: spec.tty,
            flow: spec.flow,
            limits: self.inner.limits,
            stdin_ops,
            stdin_state,
            terminal,
            span,
            on_drop: Box::new(move || {
                if let Some(engine) = engine.upgrade() {
                    engine.live().remove(&id);
                }
            }),
        });
        self.inner.live().insert(id, Arc::downgrade(&shared));

        if let Some((sink, queue)) = writer {
            let weak = Arc::downgrade(&shared);
            tokio::spawn(stdin::run_writer(
                sink,
                queue,
                shared.exited.clone(),
                move || {
                    if let Some(shared) = weak.upgrade() {
                        shared.mark_stdin_closed_by_child();
                    }
                },
            ));
        }
        tokio::spawn(output::pump(Arc::clone(&shared), sources, exit));
        ProcessOwner::new(shared)
    }

    /// Processes whose state is still held (running, or finished but not yet
    /// released by every handle).
    pub fn live_count(&self) -> usize {
        self.inner
            .live()
            .values()
            .filter(|weak| weak.strong_count() > 0)
            .count()
    }

    /// Terminates every live process (SIGTERM, SIGKILL after the grace) and
    /// waits until all have exited.
    pub async fn shutdown(&self) {
        let live: Vec<Process> = self
            .inner
            .live()
            .values()
            .filter_map(Weak::upgrade)
            .map(|shared| Process { shared })
            .collect();
        for process in &live {
            process.terminate();
        }
        let patience = self.inner.limits.kill_grace + Duration::from_secs(2);
        let all_exited = futures::future::join_all(live.iter().map(Process::wait_exited));
        if tokio::time::timeout(patience, all_exited).await.is_err() {
            tracing::warn!("some processes did not exit during shutdown");
        }
    }
}

type StdinSink = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

struct Launch<'a> {
    spec: &'a StartSpec,
    pid: i32,
    sources: [Option<OutputSource>; 2],
    stdin: Option<StdinSink>,
    terminal: Option<Terminal>,
    exit: ExitWait,
}

fn attach_failed(pid: i32, error: &std::io::Error) -> StartError {
    StartError::new(
        StartErrorKind::SpawnFailed,
        format!("cannot attach to the new process {pid}: {error}"),
    )
}

fn required(fd: Option<OwnedFd>) -> std::io::Result<OwnedFd> {
    fd.ok_or_else(|| std::io::Error::other("the child has no pipe for this stream"))
}

/// Kills a child we could not take charge of, and reaps it.
fn abandon(pid: i32, exit: ExitWait) {
    let _ = kill::signal_group(pid, libc::SIGKILL);
    tokio::spawn(exit.wait());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn engine_handles_are_send_and_sync() {
        send_sync::<Engine>();
        send_sync::<Process>();
        send_sync::<ProcessOwner>();
        send_sync::<WriteTicket>();
        send_sync::<CloseTicket>();
    }
}
