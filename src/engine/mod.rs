//! The process engine: spawning, the retained output log, sequence numbers,
//! events, stdin write ids, signals, process groups and reaping.
//!
//! Plain tokio code that knows nothing of Cap'n Proto; everything here is
//! `Send + Sync`. The RPC layer is a thin skin over [`Engine`] and
//! [`ProcessOwner`].

pub mod descriptors;
mod handle;
mod handover;
mod io_thread;
mod kill;
mod log;
pub(crate) mod os;
mod output;
pub mod pipe_capacity;
mod pipe_holders;
pub mod proc_stat;
mod reaper;
mod shared;
mod spawn;
mod stdin;
pub mod tasks;
mod terminal;
mod working_dir;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::net::unix::pipe;
use tokio::sync::mpsc;

pub use self::descriptors::close_in_background;
pub use self::handle::{
    CloseOutputError, CloseTicket, MAX_WRITE_ID_BYTES, Process, ProcessOwner, ReadError,
    ResizeError, WriteError, WriteTicket,
};
pub use self::handover::{Handover, HoldingItsPipeLocked, LOCK_HELD_FOR, ProcessState};
pub(crate) use self::kill::{pidfd_open, signal_process};
pub use self::log::{Batch, LogLimits};
pub use self::output::CHUNK_SIZE;
pub use self::reaper::{become_subreaper, is_subreaper, keep_session_members_at_most};
pub use self::shared::{
    MAX_QUEUED_STDIN_BYTES, MAX_QUEUED_STDIN_WRITES, MAX_WRITE_BYTES, ProcessLimits,
};
pub use self::spawn::{ChildSetup, GivenStdio};
pub use self::spawn::{SPAWNER_COPIES_BELOW, forgo_spawner};
// What the restriction policy (`crate::policy`) checks a start's program by.
#[cfg(test)]
pub(crate) use self::spawn::child_env;
pub(crate) use self::spawn::{program_on_own_path, program_path};
pub use self::stdin::REMEMBERED_WRITE_IDS;
pub use self::working_dir::WorkingDir;

use self::handover::{AdoptedState, HandoverSlot, PumpStart};
use self::io_thread::ChildEnds;
use self::output::OutputSource;
use self::reaper::Leader;
use self::shared::{Shared, SharedParts};
use self::spawn::{ChildStdio, SpawnedChild};
use self::stdin::StdinState;
use self::terminal::{Terminal, TerminalWriter};
use crate::model::{OutputStream, Refusal, RefusalKind, StartSpec};
use crate::sys::HostConfig;

/// Starts processes and keeps track of the live ones, on a kernel with
/// what its [`HostConfig`] leaves of it.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<EngineInner>,
}

struct EngineInner {
    limits: ProcessLimits,
    host: HostConfig,
    live: Mutex<HashMap<u64, Weak<Shared>>>,
    next_id: AtomicU64,
    closing: AtomicBool,
    /// Fired when the processes are handed to the next binary
    /// (`handover.rs`): their pumps and stdin writers stop.
    freeze: tokio_util::sync::CancellationToken,
    /// Every process as the freeze found it, held to the exec.
    frozen: Mutex<Vec<Arc<Shared>>>,
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
    /// An engine with `limits`, on the kernel as it is.
    pub fn new(limits: ProcessLimits) -> Engine {
        Engine::with_host(limits, HostConfig::default())
    }

    /// An engine with `limits` that takes the kernel to have what `host`
    /// leaves of it: its starts, its directories and its server's peer
    /// checks ask `host` (`capexec serve --hide-kernel-feature`, and tests
    /// of what happens without a feature).
    pub fn with_host(limits: ProcessLimits, host: HostConfig) -> Engine {
        // The thread children are cloned on starts being made now, before
        // a server built on this engine takes in a client's descriptor
        // (see `spawn/spawner.rs`).
        spawn::prepare_spawner();
        Engine {
            inner: Arc::new(EngineInner {
                limits,
                host,
                live: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
                closing: AtomicBool::new(false),
                frozen: Mutex::new(Vec::new()),
                freeze: tokio_util::sync::CancellationToken::new(),
            }),
        }
    }

    pub fn limits(&self) -> ProcessLimits {
        self.inner.limits
    }

    /// What this engine takes the kernel to support.
    pub fn host(&self) -> &HostConfig {
        &self.inner.host
    }

    /// Spawns a process. Must be called within a tokio runtime, which then
    /// runs the process's tasks.
    pub fn start(&self, spec: &StartSpec) -> Result<ProcessOwner, Refusal> {
        self.start_with(spec, GivenStdio::default())
    }

    /// Spawns a process whose standard descriptors are `given` where it
    /// has them, pipes where not (ignored, and closed, for a terminal).
    pub fn start_with(&self, spec: &StartSpec, given: GivenStdio) -> Result<ProcessOwner, Refusal> {
        self.start_in(spec, given, None)
    }

    /// [`Engine::start_with`] in `cwd` when it was opened already (by the
    /// check of a policy's cwdRoots), else in the directory the spec
    /// names, opened now: either way opened once, and the directory the
    /// child enters and its sandbox names is that one.
    pub fn start_in(
        &self,
        spec: &StartSpec,
        given: GivenStdio,
        cwd: Option<WorkingDir>,
    ) -> Result<ProcessOwner, Refusal> {
        let started = self.start_uncounted(spec, given, cwd);
        crate::metrics::start(started.as_ref().map(drop).map_err(|refusal| refusal.kind));
        started
    }

    fn start_uncounted(
        &self,
        spec: &StartSpec,
        given: GivenStdio,
        cwd: Option<WorkingDir>,
    ) -> Result<ProcessOwner, Refusal> {
        if self.inner.closing.load(Ordering::Acquire) {
            return Err(shutting_down());
        }
        if let Some(max) = self.inner.limits.max_processes
            && self.inner.live().len() >= max
        {
            return Err(Refusal::new(
                RefusalKind::LimitReached,
                format!("the executor already holds its maximum of {max} processes"),
            ));
        }
        spec.validate()?;
        let cwd = match cwd {
            Some(cwd) => cwd,
            None => WorkingDir::of_spec(spec)?,
        };
        if spec.tty {
            self.start_on_terminal(spec, &cwd)
        } else {
            self.start_on_pipes(spec, given, &cwd)
        }
    }

    fn start_on_pipes(
        &self,
        spec: &StartSpec,
        given: GivenStdio,
        cwd: &WorkingDir,
    ) -> Result<ProcessOwner, Refusal> {
        let stdio = ChildStdio::Pipes {
            pipe_stdin: spec.pipe_stdin,
            given,
        };
        let confined = confine(&self.inner.host, spec, cwd)?;
        let SpawnedChild {
            leader,
            stdin,
            stdout,
            stderr,
            child_ends,
        } = spawn::spawn(spec, stdio, &self.inner.limits.child, &confined.plan, cwd)?;
        let child_ends = ChildEnds::new(child_ends);
        let confinement = attach(&leader, confined);
        // The Leader owns the child: if anything fails from here on, its
        // drop kills and reaps it.
        // No pipe where the child got a given descriptor: nothing to read.
        let attach = || -> std::io::Result<_> {
            let stdout = stdout
                .map(|fd| OutputSource::pipe(OutputStream::Stdout, fd))
                .transpose()?;
            let stderr = stderr
                .map(|fd| OutputSource::pipe(OutputStream::Stderr, fd))
                .transpose()?;
            let stdin = stdin.map(pipe::Sender::from_owned_fd).transpose()?;
            Ok((stdout, stderr, stdin))
        };
        let (stdout, stderr, stdin) =
            attach().map_err(|error| attach_failed(leader.pid(), &error))?;
        let stdin = stdin.map(|sink| {
            use std::os::fd::AsRawFd;
            let fd = sink.as_raw_fd();
            (
                Box::new(pipe_capacity::GrowingSender::new(sink)) as StdinSink,
                fd,
            )
        });
        self.launch(Launch {
            spec,
            leader,
            confinement,
            sources: [stdout, stderr],
            stdin,
            terminal: None,
            child_ends,
        })
    }

    fn start_on_terminal(
        &self,
        spec: &StartSpec,
        cwd: &WorkingDir,
    ) -> Result<ProcessOwner, Refusal> {
        let (terminal, slave, slave_path) = Terminal::open(spec.pty_size).map_err(|error| {
            if descriptors::is_exhaustion(&error) {
                return descriptors::exhausted("open a pseudo-terminal", &error);
            }
            Refusal::new(
                RefusalKind::SpawnFailed,
                format!("cannot open a pseudo-terminal: {error}"),
            )
        })?;
        let confined = confine(&self.inner.host, spec, cwd)?;
        if let Some(id) = confined.plan.user {
            // Its own terminal, which it may open again by name.
            rustix::fs::fchown(&slave, Some(rustix::fs::Uid::from_raw(id)), None).map_err(
                |error| {
                    Refusal::new(
                        RefusalKind::SpawnFailed,
                        format!("cannot give the sandbox its terminal: {error}"),
                    )
                },
            )?;
        }
        let child = spawn::spawn(
            spec,
            ChildStdio::Terminal(slave_path),
            &self.inner.limits.child,
            &confined.plan,
            cwd,
        )?;
        drop(slave);
        let leader = child.leader;
        let confinement = attach(&leader, confined);
        let io = terminal.io();
        let fd = {
            use std::os::fd::AsRawFd;
            io.get_ref().as_raw_fd()
        };
        self.launch(Launch {
            spec,
            leader,
            confinement,
            sources: [Some(OutputSource::terminal(Arc::clone(&io))), None],
            stdin: Some((Box::new(TerminalWriter(io)), fd)),
            terminal: Some(terminal),
            child_ends: ChildEnds::new(child.child_ends),
        })
    }

    /// Takes charge of a spawned child: shared state, stdin writer, pump.
    fn launch(&self, launch: Launch<'_>) -> Result<ProcessOwner, Refusal> {
        let Launch {
            spec,
            leader,
            confinement,
            sources,
            stdin,
            terminal,
            child_ends,
        } = launch;
        let pid = leader.pid();
        // Checked and registered under one lock that shutdown also takes:
        // a process is either refused or seen by shutdown, never missed.
        let mut live = self.inner.live();
        if self.inner.closing.load(Ordering::Acquire) {
            drop(live);
            // The leader's drop kills and reaps the child.
            return Err(shutting_down());
        }
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let span = tracing::info_span!(
            "process",
            id,
            argv0 = %spec.argv[0].to_string_lossy(),
            pid
        );
        tracing::info!(parent: &span, tty = spec.tty, flow = ?spec.flow, "process started");

        let (stdin_ops, stdin_state, writer) = match stdin {
            Some((sink, fd)) => {
                let (ops, queue) = mpsc::unbounded_channel();
                (Some(ops), StdinState::Open, Some((sink, queue, fd)))
            }
            None => (None, StdinState::NotPiped, None),
        };
        let deadline = spec
            .timeout
            .map(|timeout| tokio::time::Instant::now() + timeout);
        let leader = Arc::new(leader);
        let shared = Shared::new(SharedParts {
            id,
            argv0: spec.argv[0].to_string_lossy().into_owned(),
            leader: Arc::clone(&leader),
            tty: spec.tty,
            flow: spec.flow,
            confinement,
            limits: self.inner.limits,
            stdin_ops,
            stdin_state,
            terminal,
            span,
            on_drop: self.forget_on_drop(id),
            handover: Arc::new(HandoverSlot::new(
                self.inner.freeze.clone(),
                writer.as_ref().map(|(_, _, fd)| *fd),
                deadline,
            )),
            running_for: Duration::ZERO,
        });
        live.insert(id, Arc::downgrade(&shared));
        drop(live);

        let writer = writer.map(|(sink, queue, _)| (sink, queue));
        let started = run_io(
            &shared,
            sources,
            writer,
            leader,
            PumpStart::default(),
            child_ends,
        );
        if let Err(error) = started {
            // Dropping `shared` forgets the process and its leader kills
            // and reaps the child.
            return Err(no_io_thread(pid, &error));
        }
        if let (Some(timeout), Some(deadline)) = (spec.timeout, deadline) {
            tokio::spawn(expire_at(Arc::downgrade(&shared), deadline, timeout));
        }
        Ok(ProcessOwner::new(shared))
    }

    /// What a process's `Shared` does when it goes: the engine forgets it.
    fn forget_on_drop(&self, id: u64) -> Box<dyn FnOnce() + Send> {
        let engine = Arc::downgrade(&self.inner);
        Box::new(move || {
            if let Some(engine) = engine.upgrade() {
                engine.live().remove(&id);
            }
        })
    }

    /// Takes charge of a process the binary before handed over
    /// (`handover.rs`), under a new id: shared state as it was, its stdin
    /// queue, its pump, its timeout, its termination if one had started.
    pub(crate) fn launch_adopted(
        &self,
        adopted: Adopted,
        mut state: AdoptedState,
    ) -> Result<ProcessOwner, String> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let leader = Arc::new(adopted.leader);
        let pid = leader.pid();
        let span = tracing::info_span!("process", id, argv0 = %adopted.argv0, pid);
        tracing::info!(parent: &span, "process taken over from the binary before");
        let handover::Requeued {
            ops,
            queue,
            pending,
            bytes: queued_bytes,
        } = handover::requeue(std::mem::take(&mut state.queue));
        let stdin_fd = adopted.stdin.as_ref().map(|(_, fd)| *fd);
        let start = state.start;
        let shared = Shared::new(SharedParts {
            id,
            argv0: adopted.argv0,
            leader: Arc::clone(&leader),
            tty: adopted.tty,
            flow: adopted.flow,
            confinement: adopted.confinement,
            limits: self.inner.limits,
            stdin_ops: adopted.stdin.as_ref().map(|_| ops),
            stdin_state: adopted.stdin_state,
            terminal: adopted.terminal,
            span,
            on_drop: self.forget_on_drop(id),
            handover: Arc::new(HandoverSlot::new(
                self.inner.freeze.clone(),
                stdin_fd,
                adopted.deadline,
            )),
            running_for: adopted.running_for,
        });
        shared.restore(state, pending, queued_bytes);
        self.inner.live().insert(id, Arc::downgrade(&shared));
        let writer = adopted.stdin.map(|(sink, _)| (sink, queue));
        run_io(
            &shared,
            adopted.sources,
            writer,
            leader,
            start,
            ChildEnds::new(Vec::new()),
        )
        .map_err(|error| format!("cannot start its I/O thread: {error}"))?;
        if let Some(deadline) = adopted.deadline {
            let timeout = deadline.saturating_duration_since(tokio::time::Instant::now());
            tokio::spawn(expire_at(Arc::downgrade(&shared), deadline, timeout));
        }
        if matches!(
            shared.lock().life.termination,
            shared::Termination::Started(_)
        ) {
            shared.restart_termination();
        }
        Ok(ProcessOwner::new(shared))
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

    /// Refuses new processes from now on, terminates every live one (SIGTERM,
    /// SIGKILL after the grace, then reaped; finished ones lose what is left
    /// of their trees) and waits until that is done.
    pub async fn shutdown(&self) {
        let live: Vec<Arc<Shared>> = {
            let live = self.inner.live();
            self.inner.closing.store(true, Ordering::Release);
            live.values().filter_map(Weak::upgrade).collect()
        };
        for shared in &live {
            shared.shut_down();
        }
        let patience = self.inner.limits.kill_grace + Duration::from_secs(3);
        let all_done = futures::future::join_all(live.iter().map(|s| s.tree_ended.cancelled()));
        if tokio::time::timeout(patience, all_done).await.is_err() {
            tracing::warn!("some processes were still being terminated at shutdown");
        }
    }
}

pub(crate) type StdinSink = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

struct Launch<'a> {
    spec: &'a StartSpec,
    leader: Leader,
    confinement: crate::model::Confinement,
    sources: [Option<OutputSource>; 2],
    /// The sink and the descriptor it writes to.
    stdin: Option<(StdinSink, std::os::fd::RawFd)>,
    terminal: Option<Terminal>,
    child_ends: ChildEnds,
}

/// A process handed over by the binary before, put together again.
pub(crate) struct Adopted {
    pub leader: Leader,
    pub tty: bool,
    pub flow: crate::model::Flow,
    pub confinement: crate::model::Confinement,
    pub argv0: String,
    pub running_for: Duration,
    pub sources: [Option<OutputSource>; 2],
    pub stdin: Option<(StdinSink, std::os::fd::RawFd)>,
    pub stdin_state: StdinState,
    pub terminal: Option<Terminal>,
    pub deadline: Option<tokio::time::Instant>,
}

/// Runs the output pump and the stdin writer of `shared` on the process's
/// own thread (`io_thread.rs`), which first closes the child's ends of its
/// pipes; what they hold when the engine freezes goes to the hand-over
/// slot. If the system refuses the thread, the tree is killed before what
/// holds its pipes is dropped here.
fn run_io(
    shared: &Arc<Shared>,
    sources: [Option<OutputSource>; 2],
    writer: Option<(StdinSink, mpsc::UnboundedReceiver<stdin::StdinOp>)>,
    leader: Arc<Leader>,
    start: PumpStart,
    child_ends: ChildEnds,
) -> std::io::Result<()> {
    let slot = Arc::clone(&shared.handover);
    let stop = shared.child_exited.clone();
    let events = shared.stdin_events();
    let writer = async move {
        let Some((sink, queue)) = writer else { return };
        let frozen = stdin::run_writer(sink, queue, stop, slot.freeze.clone(), events).await;
        if let Some(frozen) = frozen {
            slot.deposit_writer(frozen);
        }
        slot.writer_stopped.cancel();
    };
    let pipes = sources
        .iter()
        .flatten()
        .map(OutputSource::raw_fd)
        .chain(shared.handover.stdin_fd)
        .filter_map(pipe_holders::pipe_inode);
    let _ = shared.handover.pipes.set(pipes.collect());
    let pump = output::pump(Arc::clone(shared), sources, leader, start);
    let thread = Arc::clone(&shared.handover.io_thread);
    io_thread::spawn(
        async move {
            child_ends.close();
            futures::join!(pump, writer);
        },
        thread,
    )
    .map_err(|(error, work)| {
        shared.kill_tree_now();
        drop(work);
        error
    })
}

/// The start failure for a system that refuses the process its thread (or
/// the thread its runtime).
fn no_io_thread(pid: i32, error: &std::io::Error) -> Refusal {
    Refusal::new(
        RefusalKind::LimitReached,
        format!(
            "cannot start a thread for the I/O of process {pid}: {error}; release processes and try again"
        ),
    )
}

/// Terminates the process if it has not exited by `deadline` (its spawn
/// plus `timeout`), marking it timed out so its exit status can say so; a
/// child that exited in time but left processes running has them ended at
/// the deadline. Holds the process only weakly: a released process needs
/// no timeout.
async fn expire_at(
    shared: Weak<Shared>,
    deadline: tokio::time::Instant,
    timeout: std::time::Duration,
) {
    let Some(exited) = shared.upgrade().map(|shared| shared.child_exited.clone()) else {
        return;
    };
    let exited_in_time = tokio::select! {
        _ = exited.cancelled() => true,
        _ = tokio::time::sleep_until(deadline) => false,
    };
    if exited_in_time {
        let Some(strong) = shared.upgrade() else {
            return;
        };
        if !strong.tree_outlives_child_off_thread().await {
            return;
        }
        let tree_ended = strong.tree_ended.clone();
        drop(strong);
        tokio::select! {
            _ = tree_ended.cancelled() => return,
            _ = tokio::time::sleep_until(deadline) => {}
        }
    }
    if let Some(shared) = shared.upgrade() {
        tracing::info!(
            parent: &shared.span,
            timeout_ms = timeout.as_millis() as u64,
            child_exited = exited_in_time,
            "timeout expired"
        );
        if exited_in_time {
            // What the child left running; its exit status stays its own.
            shared.start_termination();
        } else {
            shared.time_out();
        }
    }
}

/// The confinement of `spec` (its sandbox, its limits, its cgroup) on
/// `host`, prepared before the spawn.
fn confine(
    host: &HostConfig,
    spec: &StartSpec,
    cwd: &WorkingDir,
) -> Result<crate::sandbox::Prepared, Refusal> {
    // The path is read only for a sandbox, whose roots name it.
    let sandbox = match &spec.sandbox {
        Some(sandbox) => Some(crate::sandbox::SandboxIn {
            sandbox,
            cwd: cwd.path()?,
        }),
        None => None,
    };
    crate::sandbox::prepare(host, sandbox, &spec.limits, cwd.identity())
}

/// Gives the spawned child's tree its cgroup; what was enforced.
fn attach(leader: &Leader, prepared: crate::sandbox::Prepared) -> crate::model::Confinement {
    if let Some(leaf) = prepared.leaf {
        leader.tree().attach_leaf(leaf);
    }
    prepared.confinement
}

fn shutting_down() -> Refusal {
    Refusal::new(
        RefusalKind::Unavailable,
        "the executor is shutting down and starts nothing new",
    )
}

fn attach_failed(pid: i32, error: &std::io::Error) -> Refusal {
    if descriptors::is_exhaustion(error) {
        return descriptors::exhausted(&format!("attach to the new process {pid}"), error);
    }
    Refusal::new(
        RefusalKind::SpawnFailed,
        format!("cannot attach to the new process {pid}: {error}"),
    )
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

    /// A process whose runtime went away is killed when it is let go, even
    /// one that ignores SIGTERM: its I/O thread drops what it holds of the
    /// process when the runtime goes.
    #[test]
    fn a_process_outliving_its_runtime_is_killed_when_let_go() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let engine = Engine::default();
        let spec = StartSpec::new(["/bin/sh", "-c", "trap '' TERM; exec sleep 1000"]);
        let owner = runtime
            .block_on(async { engine.start(&spec) })
            .expect("started");
        let pid = owner.handle().pid();
        drop(runtime);
        drop(owner);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        // Gone, or a zombie nobody waits for (the test is not a subreaper).
        let alive = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit(')')
                    .next()
                    .and_then(|rest| rest.split_whitespace().next())
                    != Some("Z")
            })
        };
        while alive() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!alive(), "process {pid} outlived its runtime and its owner");
    }
}
