//! The state of one process shared by its handles, its output pump and its
//! stdin writer; its lifecycle ([`Life`]); and the termination of its tree.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::engine::handover::{AdoptedState, HandoverSlot};
use crate::engine::log::{LogLimits, OutputLog};
use crate::engine::reaper::{self, Leader};
use crate::engine::stdin::{StdinEvents, StdinOp, StdinState, WriteFailure, WriteIds};
use crate::engine::terminal::Terminal;
use crate::model::{Exit, ExitStatus, Flow, OutputStream, ResourceUsage};

/// Largest accepted stdin write.
pub const MAX_WRITE_BYTES: usize = 4 << 20;

/// Most stdin bytes queued for one process at once: writes beyond wait for
/// nothing and are refused, so a client cannot pile up memory behind a
/// child that does not read.
pub const MAX_QUEUED_STDIN_BYTES: usize = 16 << 20;

/// Most stdin writes queued at once (every one keeps its write id until it
/// is done; see `stdin::WriteIds`).
pub const MAX_QUEUED_STDIN_WRITES: usize = crate::engine::stdin::REMEMBERED_WRITE_IDS;

/// How often to look whether what an exited child left running has ended,
/// while something waits for it (a restricted executor's process count).
const LEFTOVER_POLL: Duration = Duration::from_millis(500);

/// How long the child may take to die after SIGKILL before its zombie is
/// left for the drop of its handle to collect.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Tunables shared by every process of an engine.
#[derive(Clone, Copy, Debug)]
pub struct ProcessLimits {
    pub log: LogLimits,
    /// SIGTERM-to-SIGKILL grace of `terminate` and of release.
    pub kill_grace: Duration,
    /// Most processes held at once (running, or finished and not yet
    /// released); `None`: no limit.
    pub max_processes: Option<usize>,
    /// How children are set up beyond their spec.
    pub child: crate::engine::ChildSetup,
}

impl Default for ProcessLimits {
    fn default() -> Self {
        ProcessLimits {
            log: LogLimits::default(),
            kill_grace: Duration::from_secs(2),
            max_processes: None,
            child: crate::engine::ChildSetup::default(),
        }
    }
}

/// Where one process is in its life. The moments come in this order (see
/// docs/INTERNALS.md, "Life of one process"): spawned; the child exits
/// (the reaper says so); its exit event is logged once the output it wrote
/// before is read, and `closed` once every output stream ended (both in the
/// log); the owner releases it; the tree's termination starts and ends.
/// Release and termination may come at any point after the spawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Life {
    pub(crate) child: Child,
    pub(crate) termination: Termination,
}

/// The child itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Child {
    Running,
    /// The reaper reported its exit (it may stay a zombie until the tree is
    /// terminated): this long after the spawn, having used this much.
    Exited {
        after: Duration,
        usage: Option<ResourceUsage>,
    },
}

/// The termination of the whole tree (SIGTERM, then SIGKILL and the reap).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Termination {
    NotStarted,
    Started(Cause),
    /// The tree was killed and the child reaped: nothing is held for it any
    /// more.
    Ended(Cause),
}

/// Why the tree was terminated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) enum Cause {
    /// `terminate`, the owner's release, or the engine's shutdown once
    /// the child had exited.
    Asked,
    /// The start's timeout expired before the child exited.
    Timeout,
    /// The engine's shutdown (the server's operator stopped it) before
    /// the child exited.
    Shutdown,
}

impl Life {
    pub(crate) fn child_exited(&self) -> bool {
        matches!(self.child, Child::Exited { .. })
    }

    pub(crate) fn tree_ended(&self) -> bool {
        matches!(self.termination, Termination::Ended(_))
    }

    pub(crate) fn timed_out(&self) -> bool {
        matches!(
            self.termination,
            Termination::Started(Cause::Timeout) | Termination::Ended(Cause::Timeout)
        )
    }

    /// The engine's shutdown terminated the child (see [`Cause::Shutdown`]).
    pub(crate) fn shut_down(&self) -> bool {
        matches!(
            self.termination,
            Termination::Started(Cause::Shutdown) | Termination::Ended(Cause::Shutdown)
        )
    }
}

pub(crate) struct State {
    pub(crate) log: OutputLog,
    pub(crate) stdin: StdinState,
    pub(crate) stdin_queued: usize,
    pub(crate) stdin_queued_writes: usize,
    pub(crate) write_ids: WriteIds,
    pub(crate) life: Life,
    /// Held while the tree runs (see `Process::hold_while_running`).
    pub(crate) while_running: Vec<Box<dyn std::any::Any + Send>>,
}

pub(crate) struct Shared {
    /// The engine's id of it.
    pub(crate) id: u64,
    pub(crate) argv0: String,
    pub(crate) tty: bool,
    pub(crate) flow: Flow,
    /// What confines it and how its tree is followed.
    pub(crate) confinement: crate::model::Confinement,
    limits: ProcessLimits,
    pub(crate) started: Instant,
    leader: Arc<Leader>,
    state: Mutex<State>,
    changes: watch::Sender<u64>,
    pub(crate) stdin_ops: Option<mpsc::UnboundedSender<StdinOp>>,
    /// Fired when the child exits (`Child::Exited`): the stdin writer stops.
    pub(crate) child_exited: CancellationToken,
    /// Fired when the owner releases the process.
    pub(crate) owner_released: CancellationToken,
    /// Fired when the tree's termination ends (`Termination::Ended`).
    pub(crate) tree_ended: CancellationToken,
    /// Fired when the owner stops reading stdout (0) or stderr (1): the
    /// output pump closes its end of that pipe (`Process::close_output`).
    pub(crate) output_closed: [CancellationToken; 2],
    pub(crate) terminal: Option<Terminal>,
    runtime: tokio::runtime::Handle,
    pub(crate) span: tracing::Span,
    on_drop: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// What its pump and writer leave for a hand-over (`handover.rs`).
    pub(crate) handover: Arc<HandoverSlot>,
}

pub(crate) struct SharedParts {
    pub id: u64,
    pub argv0: String,
    pub handover: Arc<HandoverSlot>,
    /// How long it ran before (in the binary before), zero for a start.
    pub running_for: Duration,
    pub leader: Arc<Leader>,
    pub tty: bool,
    pub flow: Flow,
    pub confinement: crate::model::Confinement,
    pub limits: ProcessLimits,
    pub stdin_ops: Option<mpsc::UnboundedSender<StdinOp>>,
    pub stdin_state: StdinState,
    pub terminal: Option<Terminal>,
    pub span: tracing::Span,
    pub on_drop: Box<dyn FnOnce() + Send>,
}

impl Shared {
    pub(crate) fn new(parts: SharedParts) -> Arc<Shared> {
        let (changes, _) = watch::channel(0);
        let now = Instant::now();
        Arc::new(Shared {
            id: parts.id,
            argv0: parts.argv0,
            handover: parts.handover,
            tty: parts.tty,
            flow: parts.flow,
            confinement: parts.confinement,
            limits: parts.limits,
            started: now.checked_sub(parts.running_for).unwrap_or(now),
            leader: parts.leader,
            state: Mutex::new(State {
                log: OutputLog::new(parts.limits.log, parts.flow == Flow::Lossless),
                stdin: parts.stdin_state,
                stdin_queued: 0,
                stdin_queued_writes: 0,
                write_ids: WriteIds::default(),
                life: Life {
                    child: Child::Running,
                    termination: Termination::NotStarted,
                },
                while_running: Vec::new(),
            }),
            changes,
            stdin_ops: parts.stdin_ops,
            child_exited: CancellationToken::new(),
            owner_released: CancellationToken::new(),
            tree_ended: CancellationToken::new(),
            output_closed: [CancellationToken::new(), CancellationToken::new()],
            terminal: parts.terminal,
            runtime: tokio::runtime::Handle::current(),
            span: parts.span,
            on_drop: Mutex::new(Some(parts.on_drop)),
        })
    }

    pub(crate) fn pid(&self) -> i32 {
        self.leader.pid()
    }

    pub(crate) fn leader(&self) -> &Leader {
        &self.leader
    }

    /// SIGKILL to the whole tree now, without the termination's grace (a
    /// released process still running when the processes are handed over).
    pub(crate) fn kill_tree_now(&self) {
        self.kill_tree(libc::SIGKILL);
    }

    /// Puts back what a process handed over by the binary before had
    /// (`handover.rs`): its log, its life, its stdin's queue and write ids
    /// (`pending`: the outcome each requeued write's id watches).
    pub(crate) fn restore(
        &self,
        adopted: AdoptedState,
        pending: Vec<(String, crate::engine::stdin::Outcome)>,
        queued_bytes: usize,
    ) {
        let mut pending: std::collections::HashMap<_, _> = pending.into_iter().collect();
        let exited = adopted.exited_after.is_some();
        let ended = matches!(adopted.termination, Some(Termination::Ended(_)));
        {
            let mut state = self.lock();
            state.log = adopted.log;
            if let Some((after, usage)) = adopted.exited_after {
                state.life.child = Child::Exited { after, usage };
            }
            if let Some(termination) = adopted.termination {
                state.life.termination = termination;
            }
            state.stdin_queued = queued_bytes;
            state.stdin_queued_writes = pending.len();
            for (id, outcome) in adopted.write_ids {
                let outcome = match outcome {
                    Some(result) => watch::channel(Some(result)).1,
                    // Queued, so requeued: it watches that write.
                    None => pending
                        .remove(&id)
                        .unwrap_or_else(|| watch::channel(Some(Err(WriteFailure::Closed))).1),
                };
                state.write_ids.insert(&id, outcome);
            }
        }
        if exited {
            self.child_exited.cancel();
        }
        if ended {
            self.tree_ended.cancel();
        }
        for (closed, token) in adopted.output_closed.iter().zip(&self.output_closed) {
            if *closed {
                token.cancel();
            }
        }
    }

    /// Goes on with a termination the binary before had started: SIGTERM
    /// again (what it sent died with nothing), then as any termination.
    pub(crate) fn restart_termination(self: &Arc<Self>) {
        self.kill_tree(libc::SIGTERM);
        let shared = Arc::clone(self);
        self.runtime
            .spawn(async move { shared.finish_termination().await });
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    pub(crate) fn notify(&self) {
        self.changes
            .send_modify(|version| *version = version.wrapping_add(1));
    }

    pub(crate) fn watch_changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    pub(crate) fn is_released(&self) -> bool {
        self.owner_released.is_cancelled()
    }

    /// Lossless mode holds the child back while the owner is a window behind.
    /// A released process has no owner to wait for.
    pub(crate) fn output_paused(&self) -> bool {
        if self.flow != Flow::Lossless || self.is_released() {
            return false;
        }
        let state = self.lock();
        state.log.unconsumed_bytes() >= (self.limits.log.max_bytes / 2) as u64
            || state.log.unconsumed_chunks() >= (self.limits.log.max_chunks / 2) as u64
    }

    pub(crate) fn append_output(&self, stream: OutputStream, data: Bytes) {
        self.lock().log.push_output(stream, data);
        self.notify();
    }

    /// The reaper says the child has exited: stdin closes, signals become
    /// no-ops. (Its exit event comes later: [`Self::log_exit_event`].)
    pub(crate) fn record_child_exited(self: &Arc<Self>, usage: Option<ResourceUsage>) {
        let holding = {
            let mut state = self.lock();
            state.life.child = Child::Exited {
                after: self.started.elapsed(),
                usage,
            };
            if state.stdin == StdinState::Open {
                state.stdin = StdinState::Exited;
            }
            !state.while_running.is_empty()
        };
        if holding {
            // Before the exit event: whoever saw the process end can start
            // the next one in its place.
            self.give_back_when_tree_ends();
        }
        self.child_exited.cancel();
        self.notify();
    }

    /// Whether processes the exited child started are still running: what
    /// its termination reaches (its process group, or for a terminal its
    /// session) has members besides the child. A process that left them
    /// (setsid, setpgid) is not seen, nor reached.
    ///
    /// A /proc scan (about a millisecond): done inline only where something
    /// waits for the answer.
    pub(crate) fn tree_outlives_child(&self) -> bool {
        if let Some(leaf) = self.leader.tree().leaf() {
            // The exited child is a zombie, which no cgroup counts.
            return leaf.populated();
        }
        crate::engine::kill::others_led_by(self.pid(), self.terminal.is_some())
    }

    /// [`Self::tree_outlives_child`] on a blocking thread, for tasks.
    pub(crate) async fn tree_outlives_child_off_thread(self: &Arc<Self>) -> bool {
        let shared = Arc::clone(self);
        tokio::task::spawn_blocking(move || shared.tree_outlives_child())
            .await
            .unwrap_or(true)
    }

    /// Drops what is held while the tree runs (after the child's exit) once
    /// nothing of the tree is left: now if the child left nothing running,
    /// else when what it left ends by itself (looked at every half second)
    /// or is terminated.
    pub(crate) fn give_back_when_tree_ends(self: &Arc<Self>) {
        if !self.tree_outlives_child() {
            let held = std::mem::take(&mut self.lock().while_running);
            drop(held);
            return;
        }
        let shared = Arc::downgrade(self);
        if self.leader.tree().leaf().is_some() {
            // The kernel says when the cgroup empties.
            let leader = Arc::clone(&self.leader);
            let tree_ended = self.tree_ended.clone();
            self.runtime.spawn(async move {
                if let Some(leaf) = leader.tree().leaf() {
                    tokio::select! {
                        _ = tree_ended.cancelled() => return,
                        _ = leaf.emptied() => {}
                    }
                }
                if let Some(strong) = shared.upgrade() {
                    let held = std::mem::take(&mut strong.lock().while_running);
                    drop(held);
                    strong.notify();
                }
            });
            return;
        }
        self.runtime.spawn(async move {
            loop {
                let Some(tree_ended) = shared.upgrade().map(|s| s.tree_ended.clone()) else {
                    return;
                };
                tokio::select! {
                    _ = tree_ended.cancelled() => return,
                    _ = tokio::time::sleep(LEFTOVER_POLL) => {}
                }
                let Some(strong) = shared.upgrade() else {
                    return;
                };
                if !strong.tree_outlives_child_off_thread().await {
                    let held = std::mem::take(&mut strong.lock().while_running);
                    drop(held);
                    return;
                }
            }
        });
    }

    pub(crate) fn has_exited(&self) -> bool {
        self.lock().life.child_exited()
    }

    /// Whether the child is gone even if its exit is not recorded yet: a
    /// write that finds stdin closed says `exited` when that is the reason.
    pub(crate) fn child_gone(&self, state: &State) -> bool {
        state.life.child_exited() || self.leader.has_exited_now()
    }

    /// How long the process ran: until its child exited, or until now.
    pub(crate) fn uptime(&self, life: &Life) -> Duration {
        match life.child {
            Child::Exited { after, .. } => after,
            Child::Running => self.started.elapsed(),
        }
    }

    /// Logs the exit event (once the output the child wrote before it
    /// exited has been read), saying all that is known of the exit.
    pub(crate) fn log_exit_event(&self, status: ExitStatus) {
        let uptime = {
            let mut state = self.lock();
            let usage = match state.life.child {
                Child::Exited { usage, .. } => usage,
                Child::Running => None,
            };
            let exit = Exit {
                status,
                timed_out: state.life.timed_out(),
                usage,
                killed_by_memory_limit: self.killed_by_memory_limit(status),
                server_shutdown: state.life.shut_down(),
            };
            state.log.push_exit(exit);
            self.uptime(&state.life)
        };
        crate::metrics::exit(status);
        self.notify();
        tracing::info!(parent: &self.span, %status, duration_ms = uptime.as_millis() as u64, "process exited");
    }

    /// Whether the tree's memory limit ended the child: the kernel killed
    /// a process of its cgroup for it, and the child died of SIGKILL (or
    /// exited as a shell does whose command died so).
    fn killed_by_memory_limit(&self, status: ExitStatus) -> bool {
        let Some(leaf) = self.leader.tree().leaf() else {
            return false;
        };
        let killed = match status {
            ExitStatus::Killed { number, .. } => number == libc::SIGKILL,
            ExitStatus::Code(code) => code == 128 + libc::SIGKILL,
        };
        killed && leaf.memory_limit_kills() > 0
    }

    /// Whether processes of the tree are running: the child, or after its
    /// exit what it left in its cgroup, or without one in what its
    /// termination reaches (see [`Self::tree_outlives_child`]).
    pub(crate) fn tree_running(&self) -> bool {
        !self.has_exited() || self.tree_outlives_child()
    }

    /// Logs `closed`: every output stream has ended after the exit.
    pub(crate) fn log_closed_event(&self) {
        self.lock().log.push_closed();
        self.notify();
        tracing::debug!(parent: &self.span, "process closed");
    }

    /// Signals the whole tree: the process group, and for a terminal the
    /// whole session (job control moves jobs into groups of their own).
    /// Never reaches an unrelated process that reused a freed number (see
    /// `reaper.rs`).
    fn kill_tree(&self, signal: i32) {
        let lock = reaper::lock();
        self.leader.tree().signal(&lock, signal);
    }

    /// `signal()`: the process group of a pipe process; a terminal's
    /// foreground job (its shell, when nothing else runs).
    pub(crate) fn signal_foreground(&self, signal: i32) {
        match &self.terminal {
            None => self.kill_tree(signal),
            Some(terminal) => {
                // The terminal itself names its foreground group exactly.
                if terminal.signal_foreground(signal).is_ok() {
                    return;
                }
                let pgid = terminal.foreground_group().unwrap_or_else(|| self.pid());
                let lock = reaper::lock();
                self.leader.tree().signal_session_group(&lock, pgid, signal);
            }
        }
    }

    /// SIGTERM to the tree now; then, once the child has exited and its
    /// output is closed (or the grace is over), SIGKILL to whatever is left
    /// and the child is reaped.
    pub(crate) fn start_termination(self: &Arc<Self>) {
        self.terminate_if(|_| Some(Cause::Asked));
    }

    /// The engine shuts down: terminates the process's tree, its exit then
    /// saying so unless the child had exited already.
    pub(crate) fn shut_down(self: &Arc<Self>) {
        self.terminate_if(|life| {
            Some(if life.child_exited() {
                Cause::Asked
            } else {
                Cause::Shutdown
            })
        });
    }

    /// The start's timeout expired: terminates the process for it (so that
    /// its exit says it timed out), unless it has exited or is being
    /// terminated already.
    pub(crate) fn time_out(self: &Arc<Self>) {
        self.terminate_if(|life| (!life.child_exited()).then_some(Cause::Timeout));
    }

    /// Starts the termination for the cause `decide` names, asked under the
    /// state lock, if none has started and it names one.
    fn terminate_if(self: &Arc<Self>, decide: impl FnOnce(&Life) -> Option<Cause>) {
        {
            let mut state = self.lock();
            if state.life.termination != Termination::NotStarted {
                return;
            }
            let Some(cause) = decide(&state.life) else {
                return;
            };
            state.life.termination = Termination::Started(cause);
        }
        self.kill_tree(libc::SIGTERM);
        let shared = Arc::clone(self);
        self.runtime
            .spawn(async move { shared.finish_termination().await });
    }

    async fn finish_termination(&self) {
        let deadline = Instant::now() + self.limits.kill_grace;
        // Nothing holding the output open after the exit means nothing of
        // the tree is left, as a rule; otherwise the grace runs out.
        self.wait_until(deadline, |state| {
            state.life.child_exited() && state.log.is_closed()
        })
        .await;
        self.kill_tree(libc::SIGKILL);
        let dead = self
            .wait_until(Instant::now() + KILL_WAIT, |state| {
                state.life.child_exited()
            })
            .await;
        if dead {
            self.leader.reap();
            tracing::debug!(parent: &self.span, "process tree terminated");
        }
        if let Some(leaf) = self.leader.tree().leaf() {
            // Running until its cgroup is empty.
            let _ = tokio::time::timeout(KILL_WAIT, leaf.emptied()).await;
        }
        let held = {
            let mut state = self.lock();
            if let Termination::Started(cause) = state.life.termination {
                state.life.termination = Termination::Ended(cause);
            }
            std::mem::take(&mut state.while_running)
        };
        drop(held);
        self.tree_ended.cancel();
    }

    /// Waits until `done` holds or `deadline` passes; says which.
    async fn wait_until(&self, deadline: Instant, done: impl Fn(&State) -> bool) -> bool {
        let mut changes = self.watch_changes();
        loop {
            changes.borrow_and_update();
            if done(&self.lock()) {
                return true;
            }
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return false },
                _ = tokio::time::sleep_until(deadline) => return done(&self.lock()),
            }
        }
    }

    pub(crate) fn release(self: &Arc<Self>) {
        if self.owner_released.is_cancelled() {
            return;
        }
        self.owner_released.cancel();
        self.notify();
        tracing::debug!(parent: &self.span, "process released");
        self.start_termination();
    }

    pub(crate) fn stdin_events(self: &Arc<Self>) -> impl StdinEvents {
        WriterEvents(Arc::downgrade(self))
    }
}

struct WriterEvents(std::sync::Weak<Shared>);

impl StdinEvents for WriterEvents {
    fn dequeued(&self, bytes: usize) {
        if let Some(shared) = self.0.upgrade() {
            let mut state = shared.lock();
            state.stdin_queued = state.stdin_queued.saturating_sub(bytes);
            state.stdin_queued_writes = state.stdin_queued_writes.saturating_sub(1);
        }
    }

    fn child_closed(&self) {
        if let Some(shared) = self.0.upgrade() {
            let mut state = shared.lock();
            if state.stdin == StdinState::Open {
                state.stdin = StdinState::ClosedByChild;
            }
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let on_drop = self
            .on_drop
            .get_mut()
            .unwrap_or_else(|poison| poison.into_inner())
            .take();
        if let Some(on_drop) = on_drop {
            on_drop();
        }
    }
}
