//! The handles on a process: [`Process`] (reads, writes, signals; does not
//! keep the process alive) and [`ProcessOwner`] (its drop terminates the
//! tree).

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::engine::log::{Batch, OutputLog};
use crate::engine::shared::{
    MAX_QUEUED_STDIN_BYTES, MAX_QUEUED_STDIN_WRITES, MAX_WRITE_BYTES, Shared,
};
use crate::engine::stdin::{Outcome, StdinOp, StdinState, WriteFailure};
use crate::model::{
    Exit, Flow, OutputStream, ProcessSnapshot, PtySize, ReadOutcome, Refusal, RefusalKind, Signal,
    WriteStatus,
};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadError {
    AfterSeqAhead {
        after_seq: u64,
        newest: u64,
    },
    /// The process state is being torn down.
    Gone,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::AfterSeqAhead { after_seq, newest } => write!(
                f,
                "afterSeq {after_seq} is past the newest event of the process ({newest})"
            ),
            ReadError::Gone => write!(f, "the process is gone"),
        }
    }
}

impl std::error::Error for ReadError {}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteError {
    EmptyWriteId,
    /// Over [`MAX_WRITE_ID_BYTES`]: the last 4096 ids of each process are
    /// remembered whole, so their size is bounded.
    LongWriteId {
        len: usize,
    },
    TooLarge {
        len: usize,
    },
    /// Earlier writes the child has not taken yet already fill the queue.
    QueueFull {
        queued: usize,
    },
}

/// The longest `writeId` a caller may choose (the schema's `Process.write`).
pub const MAX_WRITE_ID_BYTES: usize = 256;

impl fmt::Display for WriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WriteError::EmptyWriteId => write!(f, "writeId must not be empty"),
            WriteError::LongWriteId { len } => write!(
                f,
                "writeId of {len} bytes exceeds the limit of {MAX_WRITE_ID_BYTES} bytes"
            ),
            WriteError::TooLarge { len } => write!(
                f,
                "write of {len} bytes exceeds the limit of {MAX_WRITE_BYTES} bytes per call"
            ),
            WriteError::QueueFull { queued } => write!(
                f,
                "stdin queue full: {queued} bytes are waiting for the child to read them \
                 (limits: {MAX_QUEUED_STDIN_BYTES} bytes, {MAX_QUEUED_STDIN_WRITES} writes); \
                 wait for earlier writes"
            ),
        }
    }
}

impl std::error::Error for WriteError {}

/// Why an output stream cannot be closed on its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CloseOutputError {
    /// A terminal carries both streams.
    Terminal,
}

impl fmt::Display for CloseOutputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CloseOutputError::Terminal => write!(
                f,
                "a tty process has one terminal for both streams: one of them cannot be closed \
                 alone (send a signal instead)"
            ),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResizeError {
    NotATerminal,
    Empty(PtySize),
    Failed(String),
}

impl fmt::Display for ResizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResizeError::NotATerminal => {
                write!(f, "resize needs a tty process; this one runs on pipes")
            }
            ResizeError::Empty(size) => write!(
                f,
                "terminal size {}x{} is empty; rows and cols must be at least 1",
                size.rows, size.cols
            ),
            ResizeError::Failed(error) => write!(f, "cannot resize the terminal: {error}"),
        }
    }
}

impl std::error::Error for ResizeError {}

impl From<ReadError> for Refusal {
    fn from(error: ReadError) -> Refusal {
        let kind = match error {
            ReadError::AfterSeqAhead { .. } => RefusalKind::InvalidArgument,
            ReadError::Gone => RefusalKind::Unavailable,
        };
        Refusal::new(kind, error.to_string())
    }
}

impl From<WriteError> for Refusal {
    fn from(error: WriteError) -> Refusal {
        let kind = match error {
            WriteError::EmptyWriteId
            | WriteError::LongWriteId { .. }
            | WriteError::TooLarge { .. } => RefusalKind::InvalidArgument,
            WriteError::QueueFull { .. } => RefusalKind::LimitReached,
        };
        Refusal::new(kind, error.to_string())
    }
}

impl From<CloseOutputError> for Refusal {
    fn from(error: CloseOutputError) -> Refusal {
        Refusal::new(RefusalKind::InvalidArgument, error.to_string())
    }
}

impl From<ResizeError> for Refusal {
    fn from(error: ResizeError) -> Refusal {
        let kind = match error {
            ResizeError::NotATerminal | ResizeError::Empty(_) => RefusalKind::InvalidArgument,
            ResizeError::Failed(_) => RefusalKind::Internal,
        };
        Refusal::new(kind, error.to_string())
    }
}

/// A write that is queued (or already decided).
pub struct WriteTicket(TicketState);

enum TicketState {
    Decided(WriteStatus),
    /// The first write with this id, or a retry of one: both report the
    /// outcome of the same queued write.
    Waiting {
        outcome: Outcome,
        id: String,
        shared: Arc<Shared>,
    },
}

impl WriteTicket {
    pub async fn outcome(self) -> WriteStatus {
        match self.0 {
            TicketState::Decided(status) => status,
            TicketState::Waiting {
                mut outcome,
                id,
                shared,
            } => {
                let result = match outcome.wait_for(Option::is_some).await {
                    Ok(value) => value.unwrap_or(Err(WriteFailure::Exited)),
                    Err(_) => Err(WriteFailure::Exited),
                };
                let failure = match result {
                    Ok(()) => return WriteStatus::Accepted,
                    Err(failure) => failure,
                };
                // Never written: a later retry must write it.
                let mut state = shared.lock();
                state.write_ids.forget(&id);
                match failure {
                    WriteFailure::Closed if !shared.child_gone(&state) => WriteStatus::StdinClosed,
                    WriteFailure::Closed | WriteFailure::Exited => WriteStatus::Exited,
                }
            }
        }
    }
}

/// A queued closeStdin.
pub struct CloseTicket(Option<oneshot::Receiver<()>>);

impl CloseTicket {
    pub async fn done(self) {
        if let Some(done) = self.0 {
            let _ = done.await;
        }
    }
}

/// A non-owning handle: it reads, writes and signals, but holding it does
/// not keep the process alive.
#[derive(Clone)]
pub struct Process {
    pub(crate) shared: Arc<Shared>,
}

impl Process {
    /// The engine's id of the process (what a hand-over names it by).
    pub fn engine_id(&self) -> u64 {
        self.shared.id
    }

    pub fn pid(&self) -> u32 {
        self.shared.pid() as u32
    }

    pub fn is_tty(&self) -> bool {
        self.shared.tty
    }

    pub fn flow(&self) -> Flow {
        self.shared.flow
    }

    /// How the process ended, once its exit event is logged.
    pub fn exit(&self) -> Option<Exit> {
        self.shared.lock().log.exit()
    }

    pub fn is_closed(&self) -> bool {
        self.shared.lock().log.is_closed()
    }

    /// Events after `after_seq`, waiting up to `wait` for the first one.
    /// In lossless mode this also consumes everything up to `after_seq`.
    pub async fn read(
        &self,
        after_seq: u64,
        max_bytes: usize,
        wait: Duration,
    ) -> Result<ReadOutcome, ReadError> {
        check_after_seq(&self.shared.lock().log, after_seq)?;
        self.consume_through(after_seq);
        self.watch(after_seq, max_bytes, wait).await
    }

    /// [`Process::read`] for someone other than the owner (an observer): it
    /// consumes nothing, so in lossless mode the owner loses nothing to it.
    pub async fn watch(
        &self,
        after_seq: u64,
        max_bytes: usize,
        wait: Duration,
    ) -> Result<ReadOutcome, ReadError> {
        check_after_seq(&self.shared.lock().log, after_seq)?;
        self.collect(after_seq, max_bytes, Some(Instant::now() + wait))
            .await
    }

    /// The next events after `after_seq`, waiting as long as it takes. An
    /// empty batch means the process closed and nothing follows `after_seq`.
    pub async fn next_batch(&self, after_seq: u64, max_bytes: usize) -> Result<Batch, ReadError> {
        let outcome = self.collect(after_seq, max_bytes, None).await?;
        Ok(Batch {
            events: outcome.events,
            next_seq: outcome.next_seq,
        })
    }

    /// Events after `after_seq` as soon as there are any, the process has
    /// closed, or `deadline` passes.
    async fn collect(
        &self,
        after_seq: u64,
        max_bytes: usize,
        deadline: Option<Instant>,
    ) -> Result<ReadOutcome, ReadError> {
        let mut changes = self.shared.watch_changes();
        loop {
            changes.borrow_and_update();
            {
                let state = self.shared.lock();
                check_after_seq(&state.log, after_seq)?;
                let batch = state.log.collect(after_seq, max_bytes);
                let expired = deadline.is_some_and(|deadline| Instant::now() >= deadline);
                if !batch.events.is_empty() || state.log.is_closed() || expired {
                    return Ok(ReadOutcome {
                        events: batch.events,
                        next_seq: batch.next_seq,
                        exit: state.log.exit(),
                        closed: state.log.is_closed(),
                    });
                }
            }
            let deadline = deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400));
            tokio::select! {
                changed = changes.changed() => if changed.is_err() {
                    return Err(ReadError::Gone);
                },
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// Lossless mode: the owner holds every event up to `seq` (a read with
    /// that `afterSeq`, an acknowledged push), so it may be evicted.
    pub fn consume_through(&self, seq: u64) {
        self.advance_owner(seq, true);
    }

    /// Lossless mode: every event up to `seq` is on its way to the owner
    /// (a push not acknowledged yet). It counts as consumed, so the child
    /// may go on, but it stays retained in case the push is lost.
    pub fn deliver_through(&self, seq: u64) {
        self.advance_owner(seq, false);
    }

    fn advance_owner(&self, seq: u64, acknowledged: bool) {
        if self.shared.flow != Flow::Lossless {
            return;
        }
        let moved = {
            let mut state = self.shared.lock();
            if acknowledged {
                state.log.acknowledge_through(seq);
            }
            let before = state.log.unconsumed_bytes();
            let chunks_before = state.log.unconsumed_chunks();
            state.log.consume_through(seq);
            state.log.unconsumed_bytes() != before || state.log.unconsumed_chunks() != chunks_before
        };
        if moved {
            self.shared.notify();
        }
    }

    /// Queues `data` for the child's stdin. Queueing happens now, so calls
    /// are applied in the order they are made; await the ticket for the
    /// outcome. A retry with an id still remembered reports the outcome of
    /// the first write with it (waiting for it if needed) and writes nothing.
    pub fn submit_write(&self, data: Bytes, write_id: &str) -> Result<WriteTicket, WriteError> {
        // The prefix a capability adds to its holder's ids (see
        // rpc/process.rs) on top of the holder's own bound.
        const CAPABILITY_PREFIX_BYTES: usize = 24;
        if write_id.len() > MAX_WRITE_ID_BYTES + CAPABILITY_PREFIX_BYTES {
            return Err(WriteError::LongWriteId {
                len: write_id.len(),
            });
        }
        if write_id.is_empty() {
            return Err(WriteError::EmptyWriteId);
        }
        if data.len() > MAX_WRITE_BYTES {
            return Err(WriteError::TooLarge { len: data.len() });
        }
        let waiting = |outcome| {
            Ok(WriteTicket(TicketState::Waiting {
                outcome,
                id: write_id.to_string(),
                shared: Arc::clone(&self.shared),
            }))
        };
        let mut state = self.shared.lock();
        if let Some(outcome) = state.write_ids.get(write_id) {
            return waiting(outcome);
        }
        let refused = match state.stdin {
            _ if state.life.child_exited() => Some(WriteStatus::Exited),
            StdinState::Open => None,
            StdinState::Exited => Some(WriteStatus::Exited),
            // Exit takes precedence, also before it is recorded (a dying
            // child's stdin closes first).
            _ if self.shared.child_gone(&state) => Some(WriteStatus::Exited),
            StdinState::NotPiped | StdinState::ClosedByClient | StdinState::ClosedByChild => {
                Some(WriteStatus::StdinClosed)
            }
        };
        if let Some(status) = refused {
            return Ok(WriteTicket(TicketState::Decided(status)));
        }
        if state.stdin_queued + data.len() > MAX_QUEUED_STDIN_BYTES
            || state.stdin_queued_writes >= MAX_QUEUED_STDIN_WRITES
        {
            return Err(WriteError::QueueFull {
                queued: state.stdin_queued,
            });
        }
        let (done, outcome) = watch::channel(None);
        let len = data.len();
        let queued = self.shared.stdin_ops.as_ref().is_some_and(|ops| {
            ops.send(StdinOp::Write {
                data,
                id: write_id.to_string(),
                done,
            })
            .is_ok()
        });
        if !queued {
            return Ok(WriteTicket(TicketState::Decided(WriteStatus::Exited)));
        }
        state.stdin_queued += len;
        state.stdin_queued_writes += 1;
        state.write_ids.insert(write_id, outcome.clone());
        waiting(outcome)
    }

    /// Queues end-of-file for the child's stdin after every earlier write.
    pub fn submit_close_stdin(&self) -> CloseTicket {
        let mut state = self.shared.lock();
        if state.stdin != StdinState::Open {
            return CloseTicket(None);
        }
        state.stdin = StdinState::ClosedByClient;
        let (done, receiver) = oneshot::channel();
        let eof = self
            .shared
            .terminal
            .as_ref()
            .map(|terminal| Bytes::copy_from_slice(&[terminal.eof_char()]));
        match &self.shared.stdin_ops {
            Some(ops) if ops.send(StdinOp::Close { eof, done }).is_ok() => {
                CloseTicket(Some(receiver))
            }
            _ => CloseTicket(None),
        }
    }

    /// Sends `signal` to the process group (a terminal's foreground group).
    /// Nothing happens once the process has exited.
    pub fn signal(&self, signal: Signal) -> std::io::Result<()> {
        if self.shared.has_exited() {
            return Ok(());
        }
        tracing::debug!(parent: &self.shared.span, %signal, "signal");
        self.shared.signal_foreground(signal.number());
        Ok(())
    }

    /// Stops reading `stream` for good, as a reader that goes away in a
    /// local pipeline: the pump closes its end of the pipe, so the child's
    /// next write to it gets SIGPIPE (see the schema's
    /// `Process.closeOutput`). A no-op once the stream has ended, or when
    /// the child was handed its stdio.
    pub fn close_output(&self, stream: OutputStream) -> Result<(), CloseOutputError> {
        if self.shared.tty {
            return Err(CloseOutputError::Terminal);
        }
        let index = match stream {
            OutputStream::Stdout => 0,
            OutputStream::Stderr => 1,
            OutputStream::Pty => return Err(CloseOutputError::Terminal),
        };
        tracing::debug!(parent: &self.shared.span, ?stream, "output closed by the owner");
        self.shared.output_closed[index].cancel();
        Ok(())
    }

    /// Changes the terminal size of a tty process.
    pub fn resize(&self, size: PtySize) -> Result<(), ResizeError> {
        if size.rows == 0 || size.cols == 0 {
            return Err(ResizeError::Empty(size));
        }
        let Some(terminal) = &self.shared.terminal else {
            return Err(ResizeError::NotATerminal);
        };
        terminal
            .resize(size)
            .map_err(|error| ResizeError::Failed(error.to_string()))
    }

    /// Starts termination of the tree; false if nothing of it runs: the
    /// child has exited and left nothing running in its cgroup (tracked by
    /// one) or its process group (a terminal: its session).
    pub fn terminate(&self) -> bool {
        if !self.shared.tree_running() {
            return false;
        }
        self.shared.start_termination();
        true
    }

    /// Keeps `value` while the process runs, for what counts running
    /// processes: until the child exits if it leaves nothing of its process
    /// group (a terminal: its session) running, else until what it left
    /// ends by itself or is terminated (by the release or the timeout).
    /// Dropped at once if that has already happened.
    pub fn hold_while_running(&self, value: impl std::any::Any + Send) {
        let exited = {
            let mut state = self.shared.lock();
            if state.life.tree_ended() {
                return;
            }
            state.while_running.push(Box::new(value));
            state.life.child_exited()
        };
        if exited {
            // Missed the exit's own look at the tree.
            self.shared.give_back_when_tree_ends();
        }
    }

    pub fn snapshot(&self) -> ProcessSnapshot {
        let mut snapshot = self.snapshot_of_state();
        // Outside the state lock: without a cgroup it is a /proc scan.
        snapshot.tree_running = self.shared.tree_running();
        snapshot
    }

    fn snapshot_of_state(&self) -> ProcessSnapshot {
        let state = self.shared.lock();
        ProcessSnapshot {
            pid: self.shared.pid() as u32,
            tty: self.shared.tty,
            flow: self.shared.flow,
            stdin_open: state.stdin == StdinState::Open,
            next_seq: state.log.next_seq(),
            closed: state.log.is_closed(),
            exit: state.log.exit(),
            retained_bytes: state.log.retained_bytes() as u64,
            retained_chunks: state.log.retained_chunks() as u32,
            peak_retained_bytes: state.log.peak_bytes() as u64,
            evicted_through_seq: state.log.evicted_through(),
            unconsumed_bytes: state.log.unconsumed_bytes(),
            uptime: self.shared.uptime(&state.life),
            timed_out: state.life.timed_out(),
            confinement: self.shared.confinement.clone(),
            tree_running: false,
        }
    }

    /// Waits until the process has closed.
    pub async fn wait_closed(&self) {
        self.wait_until(|process| process.is_closed()).await
    }

    /// Waits until the child's exit is logged ([`Self::exit`] says how it
    /// ended), which is after the output it wrote before it exited.
    pub async fn wait_exited(&self) {
        self.wait_until(|process| process.exit().is_some()).await
    }

    async fn wait_until(&self, done: impl Fn(&Process) -> bool) {
        let mut changes = self.shared.watch_changes();
        loop {
            changes.borrow_and_update();
            if done(self) || changes.changed().await.is_err() {
                return;
            }
        }
    }
}

impl Process {
    /// Refuses a cursor past the newest event (reads and subscriptions).
    pub fn check_after_seq(&self, after_seq: u64) -> Result<(), ReadError> {
        check_after_seq(&self.shared.lock().log, after_seq)
    }
}

fn check_after_seq(log: &OutputLog, after_seq: u64) -> Result<(), ReadError> {
    let newest = log.next_seq() - 1;
    if after_seq > newest {
        return Err(ReadError::AfterSeqAhead { after_seq, newest });
    }
    Ok(())
}

/// The owning handle: dropping it terminates the process tree (SIGTERM,
/// SIGKILL after the grace) and lets the engine forget the process once
/// every other handle is gone.
pub struct ProcessOwner {
    process: Process,
}

impl ProcessOwner {
    pub(crate) fn new(shared: Arc<Shared>) -> ProcessOwner {
        ProcessOwner {
            process: Process { shared },
        }
    }

    /// A handle that does not keep the process alive.
    pub fn handle(&self) -> Process {
        self.process.clone()
    }
}

impl Deref for ProcessOwner {
    type Target = Process;

    fn deref(&self) -> &Process {
        &self.process
    }
}

impl Drop for ProcessOwner {
    fn drop(&mut self) {
        self.process.shared.release();
    }
}
