//! Handing every process to the next binary in the same process
//! (`capexec serve` re-executing itself for an upgrade), and taking them
//! over on the other side.
//!
//! The children stay ours across execve(2): same pid, still our children.
//! What lives only in memory is written down first: the retained log with
//! its sequence numbers, stdin's queue and write ids, the exit the reaper
//! delivered and the pump has not logged. The descriptors (pidfd, pipes,
//! terminal master, session members) are kept open at their numbers.
//!
//! To have one consistent picture, the engine is *frozen* first: the
//! reaper stops reaping (an exit after that is read by the next binary),
//! every output pump stops between two reads and every stdin writer
//! between two write(2)s, each handing over what it held. Nothing is read
//! from a child or written to it after that, so nothing is lost or
//! repeated.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::engine::io_thread::IoThread;
use crate::engine::log::{LogState, OutputLog};
use crate::engine::output::OutputSource;
use crate::engine::shared::{Cause, Child, Shared, Termination};
use crate::engine::stdin::{FrozenWriter, StdinOp, StdinState, WriteFailure};
use crate::engine::terminal::{Terminal, TerminalWriter};
use crate::engine::{Engine, ProcessOwner, StdinSink, pipe_capacity, pipe_holders, reaper};
use crate::model::{Confinement, ExitStatus, Flow, OutputStream, ResourceUsage};

/// Where a process's pump and stdin writer leave what they hold when the
/// engine freezes.
pub(crate) struct HandoverSlot {
    /// The engine's: fired once, by [`Engine::freeze`].
    pub freeze: CancellationToken,
    pub pump: Mutex<Option<FrozenPump>>,
    pub writer: Mutex<Option<FrozenWriter<StdinSink>>>,
    /// The pump stopped: frozen, or done for good.
    pub pump_stopped: CancellationToken,
    /// The stdin writer stopped (or there never was one).
    pub writer_stopped: CancellationToken,
    /// The child's stdin as the writer writes it (a pipe's write end, or
    /// the terminal's master), open while the writer holds it.
    pub stdin_fd: Option<RawFd>,
    /// When the start's timeout ends it.
    pub deadline: Option<Instant>,
    /// The thread the pump and the writer run on, which the exec must see
    /// end (`io_thread.rs`).
    pub io_thread: Arc<IoThread>,
    /// The inodes of its pipes (`pipe_holders.rs`), known once its I/O
    /// starts.
    pub pipes: std::sync::OnceLock<Vec<u64>>,
}

impl HandoverSlot {
    pub fn new(
        freeze: CancellationToken,
        stdin_fd: Option<RawFd>,
        deadline: Option<Instant>,
    ) -> Self {
        let writer_stopped = CancellationToken::new();
        if stdin_fd.is_none() {
            writer_stopped.cancel();
        }
        HandoverSlot {
            freeze,
            pump: Mutex::new(None),
            writer: Mutex::new(None),
            pump_stopped: CancellationToken::new(),
            writer_stopped,
            stdin_fd,
            deadline,
            io_thread: Arc::default(),
            pipes: std::sync::OnceLock::new(),
        }
    }

    pub fn deposit_pump(&self, frozen: FrozenPump) {
        *self.pump.lock().unwrap_or_else(|p| p.into_inner()) = Some(frozen);
    }

    pub fn deposit_writer(&self, frozen: FrozenWriter<StdinSink>) {
        *self.writer.lock().unwrap_or_else(|p| p.into_inner()) = Some(frozen);
    }
}

/// What a frozen pump held: its open sources, and an exit it had seen but
/// not logged yet (the output before it still unread).
pub(crate) struct FrozenPump {
    pub sources: [Option<OutputSource>; 2],
    pub pending_exit: Option<ExitStatus>,
}

/// How a pump taken over starts.
#[derive(Clone, Copy, Default)]
pub(crate) struct PumpStart {
    /// The child's exit was recorded before the hand-over.
    pub exited: bool,
    /// ...and its event is still to be logged, with this status.
    pub pending_exit: Option<ExitStatus>,
}

/// One process as handed over. Descriptors are named by number: they are
/// open, without close-on-exec, in the next binary.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct ProcessState {
    /// The engine's id of it in the binary before.
    pub id: u64,
    pid: i32,
    pidfd: RawFd,
    session: bool,
    members: Vec<RawFd>,
    reaped: bool,
    tty: bool,
    flow: Flow,
    confinement: Confinement,
    argv0: String,
    running_for_ms: u64,
    child: ChildState,
    /// A termination started (`Some(false)`) or ended (`Some(true)`), and
    /// why.
    termination: Option<(Cause, bool)>,
    /// stdout and stderr as pipes, or the terminal (index 0).
    sources: [Option<RawFd>; 2],
    terminal: Option<RawFd>,
    output_closed: [bool; 2],
    stdin: StdinState,
    stdin_fd: Option<RawFd>,
    stdin_ops: Vec<OpState>,
    write_ids: Vec<(String, Option<Result<(), WriteFailure>>)>,
    log: LogState,
    timeout_left_ms: Option<u64>,
    /// Its cgroup, in the root the server hands over too.
    leaf: Option<crate::sandbox::LeafState>,
}

#[derive(serde::Serialize, serde::Deserialize)]
enum ChildState {
    Running,
    Exited {
        after_ms: u64,
        usage: Option<ResourceUsage>,
        pending_exit: Option<ExitStatus>,
    },
}

#[derive(serde::Serialize, serde::Deserialize)]
enum OpState {
    /// Bytes `offset..offset + len` of the blob, with the write's id.
    Write {
        id: String,
        offset: u64,
        len: u64,
    },
    Close {
        eof: Option<u8>,
    },
}

/// Everything the engine hands over: its processes, the bytes they name
/// (`blob`), and the descriptors that must stay open across the exec.
pub struct Handover {
    pub processes: Vec<ProcessState>,
    pub blob: Vec<u8>,
    pub descriptors: Vec<RawFd>,
}

/// How long a freeze may wait for pumps and writers to stop (they stop at
/// their next turn; this only bounds a bug).
const FREEZE_PATIENCE: Duration = Duration::from_secs(5);

impl ProcessState {
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The descriptors it names, open in this binary once handed over.
    pub fn descriptors(&self) -> usize {
        1 + self.members.len()
            + self.sources.iter().flatten().count()
            + usize::from(self.terminal.is_some())
            + usize::from(self.stdin_fd.is_some())
    }
}

/// How long a process's I/O thread must be seen asleep on a lock, asked
/// again and again, for its process to count as holding its pipe locked.
pub const LOCK_HELD_FOR: Duration = Duration::from_millis(200);

/// A process whose pipe I/O waits on a lock its own tree (or whoever it
/// gave the pipe to) holds.
pub struct HoldingItsPipeLocked {
    pub id: u64,
    pub pid: i32,
    pub argv0: String,
}

impl std::fmt::Display for HoldingItsPipeLocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "process {} (pid {}, `{}`)",
            self.id, self.pid, self.argv0
        )
    }
}

impl Engine {
    /// The processes an exec would wait for: each one's I/O thread sleeps
    /// on the lock of one of its pipes, which something it started holds
    /// (a splice into or out of it that waits), and execve(2) waits for
    /// every thread to end. Asks each thread again for 200 ms (a thread
    /// also sleeps so for a moment on the disk); returns at once when none
    /// sleeps so, as it is almost always.
    pub async fn holding_their_pipes_locked(&self) -> Vec<HoldingItsPipeLocked> {
        let live: Vec<Arc<Shared>> = self
            .inner
            .live()
            .values()
            .filter_map(std::sync::Weak::upgrade)
            .collect();
        let asleep = |shared: &Arc<Shared>| shared.handover.io_thread.asleep_on_a_lock();
        let mut held: Vec<Arc<Shared>> = live.into_iter().filter(asleep).collect();
        let until = Instant::now() + LOCK_HELD_FOR;
        while !held.is_empty() && Instant::now() < until {
            tokio::time::sleep(LOCK_HELD_FOR / 8).await;
            held.retain(asleep);
        }
        held.iter()
            .map(|shared| HoldingItsPipeLocked {
                id: shared.id,
                pid: shared.pid(),
                argv0: shared.argv0.clone(),
            })
            .collect()
    }

    /// Starts nothing more and freezes every process: the reaper pauses,
    /// and each output pump and stdin writer stops between two calls,
    /// leaving what it holds in its slot. From here on this binary reads,
    /// writes and closes no child's pipe (its lock may be held, by
    /// whatever the process gave it to, for as long as that likes, and
    /// execve waits for every thread) and reaps nothing: a process let go
    /// now is only signalled, and the next binary ends it. Then
    /// [`Self::write_down`] writes them down for the exec.
    pub async fn freeze(&self) {
        let live: Vec<Arc<Shared>> = {
            let live = self.inner.live();
            self.inner
                .closing
                .store(true, std::sync::atomic::Ordering::Release);
            live.values().filter_map(std::sync::Weak::upgrade).collect()
        };
        // One let go whose tree has ended and whose output is closed (the
        // new binary's check, just now) has nothing to hand over: it is
        // only not dropped yet.
        let live: Vec<Arc<Shared>> = live
            .into_iter()
            .filter(|shared| {
                let done = shared.is_released()
                    && shared.tree_ended.is_cancelled()
                    && shared.handover.writer_stopped.is_cancelled();
                !(done && shared.lock().log.is_closed())
            })
            .collect();
        reaper::pause_for_handover();
        self.inner.freeze.cancel();
        if !all_stopped(&live).await {
            // What did not stop is inside a call on a pipe whose lock is
            // held (`io_thread.rs`; an upgrade is refused while one is,
            // so it began since), and the exec would wait for that thread
            // for as long: the process ends, which frees the lock if its
            // tree holds it (it is handed over as a process that was
            // killed).
            for shared in live.iter().filter(|shared| !stopped(shared)) {
                tracing::warn!(
                    id = shared.id,
                    "a process holds its pipes locked; killing it before the hand-over"
                );
                shared.kill_tree_now();
            }
            if !all_stopped(&live).await {
                // Something outside the tree holds the lock: whatever
                // holds those pipes ends, rather than the exec wait for
                // as long as it likes.
                let pipes: Vec<u64> = live
                    .iter()
                    .filter(|shared| !stopped(shared))
                    .flat_map(|shared| shared.handover.pipes.get().cloned().unwrap_or_default())
                    .collect();
                let killed = pipe_holders::kill_holders(&pipes);
                tracing::error!(
                    ?killed,
                    "processes outside their trees held pipes locked; killed every holder of those pipes before the hand-over"
                );
                if !all_stopped(&live).await {
                    tracing::error!("some processes did not stop for the hand-over in time");
                }
            }
        }
        *self.inner.frozen.lock().unwrap_or_else(|p| p.into_inner()) = live;
    }

    /// Every process [`Self::freeze`] froze, written down for the next
    /// binary, which takes each one over as it was (and ends those nobody
    /// can reach after the exec, as on any lost connection). After this
    /// the engine is good only for an exec.
    pub fn write_down(&self) -> Handover {
        let frozen =
            std::mem::take(&mut *self.inner.frozen.lock().unwrap_or_else(|p| p.into_inner()));
        let mut handover = Handover {
            processes: Vec::new(),
            blob: Vec::new(),
            descriptors: Vec::new(),
        };
        for shared in &frozen {
            let state = write_down(shared, &mut handover);
            handover.processes.push(state);
        }
        // Held until the exec, which closes nothing of theirs: their
        // descriptors are what was written down.
        std::mem::forget(frozen);
        handover
    }

    /// Takes over the processes the binary before handed over: each one as
    /// it was (its log and sequence numbers, its stdin and write ids, its
    /// descriptors), with the id it had there. Must run inside the runtime
    /// that will run them, before the reaper thread starts
    /// (`become_subreaper`), once, with the descriptors the states name
    /// open and owned by nobody else.
    pub fn take_over(&self, processes: Vec<ProcessState>, blob: Bytes) -> Vec<(u64, ProcessOwner)> {
        processes
            .into_iter()
            .filter_map(|state| {
                let (id, pid) = (state.id, state.pid);
                match self.adopt(state, &blob) {
                    Ok(owner) => Some((id, owner)),
                    Err(error) => {
                        // Nobody could ever reach it: it ends, as it would
                        // with a server that died (its group; its cgroup's
                        // sentinel sees to the rest at the end).
                        tracing::error!(id, pid, %error, "cannot take over a handed-over process; killing it");
                        // SAFETY: kill(2) of our own child's group and of
                        // the child.
                        unsafe {
                            libc::kill(-pid, libc::SIGKILL);
                            libc::kill(pid, libc::SIGKILL);
                        }
                        None
                    }
                }
            })
            .collect()
    }

    fn adopt(&self, state: ProcessState, blob: &Bytes) -> Result<ProcessOwner, String> {
        // SAFETY: the binary before kept these open for us and nothing
        // else here owns them (see `take_over`).
        let own = |fd: RawFd| {
            // Closed at the next exec unless that one hands it over again.
            // SAFETY: F_SETFD, then ownership, of a descriptor kept open
            // for us.
            let fd = unsafe {
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                OwnedFd::from_raw_fd(fd)
            };
            // Above the slots the spawner's table starts from, where the
            // binary before (one without the placeholders) had it below:
            // the slot would be freed when the process ends, for a
            // client's descriptor to take. The server's own pidfds, pipes
            // and terminal, whose close cannot sleep.
            crate::sys::low_slots::raise(fd)
        };
        let log = OutputLog::import(self.inner.limits.log, state.log, blob)
            .ok_or("its log names bytes the hand-over does not hold")?;
        let (exited, pending_exit, after, usage) = match state.child {
            ChildState::Running => (false, None, None, None),
            ChildState::Exited {
                after_ms,
                usage,
                pending_exit,
            } => (
                true,
                pending_exit,
                Some(Duration::from_millis(after_ms)),
                usage,
            ),
        };
        let ended = state.reaped.then(|| reaper::Ended {
            status: pending_exit
                .or_else(|| log.exit().map(|exit| exit.status))
                .unwrap_or(ExitStatus::Code(0)),
            usage,
        });
        let leader = reaper::adopt(
            state.pid,
            own(state.pidfd),
            state.session,
            state.members.into_iter().map(own).collect(),
            ended,
        );
        if let Some(leaf) = state.leaf {
            leader
                .tree()
                .attach_leaf(crate::sandbox::Leaf::taken_over(leaf));
        }
        let terminal = match state.terminal {
            Some(fd) => Some(Terminal::adopt(own(fd)).map_err(|e| e.to_string())?),
            None => None,
        };
        let sources = match &terminal {
            Some(terminal) => [
                state.sources[0].map(|_| OutputSource::terminal(terminal.io())),
                None,
            ],
            None => {
                let pipe = |stream, fd: Option<RawFd>| {
                    fd.map(|fd| OutputSource::pipe(stream, own(fd)))
                        .transpose()
                        .map_err(|e| e.to_string())
                };
                [
                    pipe(OutputStream::Stdout, state.sources[0])?,
                    pipe(OutputStream::Stderr, state.sources[1])?,
                ]
            }
        };
        let stdin: Option<(StdinSink, RawFd)> = match (state.stdin_fd, &terminal) {
            (Some(_), Some(terminal)) => {
                let io = terminal.io();
                let fd = io.get_ref().as_raw_fd();
                Some((Box::new(TerminalWriter(io)), fd))
            }
            (Some(fd), None) => {
                // The number it has now (`own` may have moved it).
                let owned = own(fd);
                let fd = owned.as_raw_fd();
                let sender = pipe::Sender::from_owned_fd(owned).map_err(|e| e.to_string())?;
                Some((Box::new(pipe_capacity::GrowingSender::new(sender)), fd))
            }
            (None, _) => None,
        };
        let stdin_state = state.stdin;
        let deadline = state
            .timeout_left_ms
            .map(|ms| Instant::now() + Duration::from_millis(ms));
        let mut queue = Vec::new();
        for op in state.stdin_ops {
            queue.push(match op {
                OpState::Write { id, offset, len } => {
                    let start = usize::try_from(offset).map_err(|e| e.to_string())?;
                    let end = start
                        .checked_add(usize::try_from(len).map_err(|e| e.to_string())?)
                        .filter(|&end| end <= blob.len())
                        .ok_or("a stdin write names bytes the hand-over does not hold")?;
                    (Some(id), Bytes::copy_from_slice(&blob[start..end]), None)
                }
                OpState::Close { eof } => (None, Bytes::new(), Some(eof)),
            });
        }
        let launch = crate::engine::Adopted {
            leader,
            tty: state.tty,
            flow: state.flow,
            confinement: state.confinement,
            argv0: state.argv0,
            running_for: Duration::from_millis(state.running_for_ms),
            sources,
            stdin,
            stdin_state,
            terminal,
            deadline,
        };
        let start = PumpStart {
            exited,
            pending_exit,
        };
        let termination = state.termination.map(|(cause, ended)| {
            if ended {
                Termination::Ended(cause)
            } else {
                Termination::Started(cause)
            }
        });
        self.launch_adopted(
            launch,
            AdoptedState {
                log,
                exited_after: after.map(|after| (after, usage)),
                start,
                termination,
                output_closed: state.output_closed,
                queue,
                write_ids: state.write_ids,
            },
        )
    }
}

/// What of an adopted process's state goes into its `Shared`.
pub(crate) struct AdoptedState {
    pub log: OutputLog,
    pub exited_after: Option<(Duration, Option<ResourceUsage>)>,
    pub start: PumpStart,
    pub termination: Option<Termination>,
    pub output_closed: [bool; 2],
    /// Queued stdin: writes (id, bytes) and closes (the EOF character).
    pub queue: Vec<(Option<String>, Bytes, Option<Option<u8>>)>,
    pub write_ids: Vec<(String, Option<Result<(), WriteFailure>>)>,
}

/// Whether the pump and the stdin writer of `shared` have stopped.
fn stopped(shared: &Shared) -> bool {
    shared.handover.pump_stopped.is_cancelled() && shared.handover.writer_stopped.is_cancelled()
}

/// Waits, at most [`FREEZE_PATIENCE`], for every pump and stdin writer of
/// `processes` to stop; says whether they did.
async fn all_stopped(processes: &[Arc<Shared>]) -> bool {
    let stopped = futures::future::join_all(processes.iter().map(|shared| {
        let slot = Arc::clone(&shared.handover);
        async move {
            slot.pump_stopped.cancelled().await;
            slot.writer_stopped.cancelled().await;
        }
    }));
    tokio::time::timeout(FREEZE_PATIENCE, stopped).await.is_ok()
}

/// Writes one frozen process down, its bytes into the blob and its
/// descriptors into the list kept open.
fn write_down(shared: &Arc<Shared>, handover: &mut Handover) -> ProcessState {
    let slot = &shared.handover;
    // Read in place: the descriptors stay open, held by the slot, until
    // the exec.
    let pump = slot.pump.lock().unwrap_or_else(|p| p.into_inner());
    let mut writer = slot.writer.lock().unwrap_or_else(|p| p.into_inner());
    let tree = shared.leader().tree().handover_parts();
    let keep = &mut handover.descriptors;
    keep.push(tree.pidfd);
    keep.extend(&tree.members);
    let mut sources = [None, None];
    let mut pending_exit = None;
    if let Some(pump) = pump.as_ref() {
        pending_exit = pump.pending_exit;
        for (i, source) in pump.sources.iter().enumerate() {
            if let Some(source) = source {
                let fd = source.raw_fd();
                sources[i] = Some(fd);
                keep.push(fd);
            }
        }
    }
    let terminal = shared
        .terminal
        .as_ref()
        .map(|t| t.io().get_ref().as_raw_fd());
    keep.extend(terminal);
    let mut stdin_ops = Vec::new();
    let mut stdin_fd = None;
    if let Some(FrozenWriter { current, ops, .. }) = writer.as_mut() {
        stdin_fd = slot.stdin_fd;
        keep.extend(stdin_fd);
        let write = |op: StdinOp, from: usize, blob: &mut Vec<u8>| match op {
            StdinOp::Write { data, id, .. } => {
                let offset = blob.len() as u64;
                blob.extend_from_slice(&data[from.min(data.len())..]);
                OpState::Write {
                    id,
                    offset,
                    len: blob.len() as u64 - offset,
                }
            }
            StdinOp::Close { eof, .. } => OpState::Close {
                eof: eof.and_then(|eof| eof.first().copied()),
            },
        };
        if let Some((op, at)) = current.take() {
            stdin_ops.push(write(op, at, &mut handover.blob));
        }
        while let Ok(op) = ops.try_recv() {
            stdin_ops.push(write(op, 0, &mut handover.blob));
        }
    }
    let state = shared.lock();
    let child = match state.life.child {
        Child::Running => ChildState::Running,
        Child::Exited { after, usage } => ChildState::Exited {
            after_ms: after.as_millis() as u64,
            usage,
            pending_exit,
        },
    };
    let termination = match state.life.termination {
        Termination::NotStarted => None,
        Termination::Started(cause) => Some((cause, false)),
        Termination::Ended(cause) => Some((cause, true)),
    };
    let write_ids = state.write_ids.entries().collect();
    ProcessState {
        id: shared.id,
        pid: tree.pid,
        pidfd: tree.pidfd,
        session: tree.session,
        members: tree.members,
        reaped: tree.reaped,
        tty: shared.tty,
        flow: shared.flow,
        confinement: shared.confinement.clone(),
        argv0: shared.argv0.clone(),
        running_for_ms: shared.started.elapsed().as_millis() as u64,
        child,
        termination,
        sources,
        terminal,
        output_closed: [0, 1].map(|i| shared.output_closed[i].is_cancelled()),
        stdin: state.stdin,
        stdin_fd,
        stdin_ops,
        write_ids,
        leaf: shared
            .leader()
            .tree()
            .leaf()
            .map(crate::sandbox::Leaf::handover_state),
        log: state.log.export(&mut handover.blob),
        timeout_left_ms: slot.deadline.map(|deadline| {
            deadline
                .saturating_duration_since(Instant::now())
                .as_millis() as u64
        }),
    }
}

/// A stdin queue put together again (see [`requeue`]).
pub(crate) struct Requeued {
    pub ops: mpsc::UnboundedSender<StdinOp>,
    pub queue: mpsc::UnboundedReceiver<StdinOp>,
    /// The outcome each queued write's id now watches.
    pub pending: Vec<(String, crate::engine::stdin::Outcome)>,
    /// The bytes queued.
    pub bytes: usize,
}

/// A fresh stdin queue holding `queue` in order.
pub(crate) fn requeue(queue: Vec<(Option<String>, Bytes, Option<Option<u8>>)>) -> Requeued {
    let (ops, receiver) = mpsc::unbounded_channel();
    let mut pending = Vec::new();
    let mut bytes = 0;
    for (id, data, close) in queue {
        match close {
            Some(eof) => {
                let (done, _) = tokio::sync::oneshot::channel();
                let _ = ops.send(StdinOp::Close {
                    eof: eof.map(|eof| Bytes::copy_from_slice(&[eof])),
                    done,
                });
            }
            None => {
                let (done, outcome) = watch::channel(None);
                let id = id.unwrap_or_default();
                bytes += data.len();
                pending.push((id.clone(), outcome));
                let _ = ops.send(StdinOp::Write { data, id, done });
            }
        }
    }
    Requeued {
        ops,
        queue: receiver,
        pending,
        bytes,
    }
}
