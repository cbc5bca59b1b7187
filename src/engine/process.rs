//! One process: its shared state, the non-owning [`Process`] handle and the
//! owning [`ProcessOwner`] whose drop kills the process tree.

use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::engine::kill;
use crate::engine::log::{Batch, LogLimits, OutputLog};
use crate::engine::stdin::{StdinOp, StdinState, WriteFailure, WriteIds};
use crate::engine::terminal::Terminal;
use crate::model::{Event, ExitStatus, Flow, OutputStream, PtySize, Signal, WriteStatus};

/// Largest accepted stdin write.
pub const MAX_WRITE_BYTES: usize = 4 << 20;

/// Tunables shared by every process of an engine.
#[derive(Clone, Copy, Debug)]
pub struct ProcessLimits {
    pub log: LogLimits,
    /// SIGTERM-to-SIGKILL grace of `terminate` and of release.
    pub kill_grace: Duration,
}

impl Default for ProcessLimits {
    fn default() -> Self {
        ProcessLimits {
            log: LogLimits::default(),
            kill_grace: Duration::from_secs(2),
        }
    }
}

pub(crate) struct State {
    log: OutputLog,
    stdin: StdinState,
    write_ids: WriteIds,
    terminating: bool,
    /// The group is empty after the child was reaped: never signal it again,
    /// since its number may be reused.
    group_gone: bool,
    /// The child has been reaped. Its exit event may come a little later,
    /// after the output it wrote before exiting.
    reaped: bool,
    exited_after: Option<Duration>,
}

/// State shared by the handles, the output pump and the stdin writer.
pub(crate) struct Shared {
    pub(crate) pid: i32,
    tty: bool,
    flow: Flow,
    limits: ProcessLimits,
    started: Instant,
    state: Mutex<State>,
    changes: watch::Sender<u64>,
    stdin_ops: Option<mpsc::UnboundedSender<StdinOp>>,
    /// Fired when the child exits: the stdin writer stops.
    pub(crate) exited: CancellationToken,
    /// Fired when the owner releases the process.
    pub(crate) released: CancellationToken,
    terminal: Option<Terminal>,
    runtime: tokio::runtime::Handle,
    span: tracing::Span,
    on_drop: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

pub(crate) struct SharedParts {
    pub pid: i32,
    pub tty: bool,
    pub flow: Flow,
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
        Arc::new(Shared {
            pid: parts.pid,
            tty: parts.tty,
            flow: parts.flow,
            limits: parts.limits,
            started: Instant::now(),
            state: Mutex::new(State {
                log: OutputLog::new(parts.limits.log),
                stdin: parts.stdin_state,
                write_ids: WriteIds::default(),
                terminating: false,
                group_gone: false,
                reaped: false,
                exited_after: None,
            }),
            changes,
            stdin_ops: parts.stdin_ops,
            exited: CancellationToken::new(),
            released: CancellationToken::new(),
            terminal: parts.terminal,
            runtime: tokio::runtime::Handle::current(),
            span: parts.span,
            on_drop: Mutex::new(Some(parts.on_drop)),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    fn notify(&self) {
        self.changes
            .send_modify(|version| *version = version.wrapping_add(1));
    }

    pub(crate) fn watch_changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    pub(crate) fn is_released(&self) -> bool {
        self.released.is_cancelled()
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

    /// The child is gone: stdin closes, signals become no-ops.
    pub(crate) fn record_reaped(&self) {
        {
            let mut state = self.lock();
            state.reaped = true;
            state.exited_after = Some(self.started.elapsed());
            if state.stdin == StdinState::Open {
                state.stdin = StdinState::Exited;
            }
        }
        self.exited.cancel();
        self.notify();
    }

    pub(crate) fn is_reaped(&self) -> bool {
        self.lock().reaped
    }

    pub(crate) fn record_exit(&self, status: ExitStatus) {
        let uptime = {
            let mut state = self.lock();
            state.log.push_exit(status);
            state.exited_after.unwrap_or_else(|| self.started.elapsed())
        };
        self.notify();
        tracing::info!(parent: &self.span, %status, duration_ms = uptime.as_millis() as u64, "process exited");
    }

    pub(crate) fn record_closed(&self) {
        {
            let mut state = self.lock();
            state.log.push_closed();
            if !kill::group_exists(self.pid) {
                state.group_gone = true;
            }
        }
        self.notify();
        tracing::debug!(parent: &self.span, "process closed");
    }

    pub(crate) fn mark_stdin_closed_by_child(&self) {
        let mut state = self.lock();
        if state.stdin == StdinState::Open {
            state.stdin = StdinState::ClosedByChild;
        }
    }

    /// Signals the whole tree: the process group, and for a terminal the
    /// whole session (job control moves jobs into groups of their own).
    fn kill_tree(&self, signal: i32) {
        let mut state = self.lock();
        if state.group_gone {
            return;
        }
        if self.tty {
            kill::signal_session(self.pid, signal);
        }
        match kill::signal_group(self.pid, signal) {
            Ok(true) => {}
            Ok(false) => {
                if state.reaped {
                    state.group_gone = true;
                }
            }
            Err(error) => {
                tracing::warn!(parent: &self.span, %error, signal, "cannot signal the process group")
            }
        }
    }

    fn tree_alive(&self) -> bool {
        !self.lock().group_gone && kill::group_exists(self.pid)
    }

    /// SIGTERM now, SIGKILL after the grace to whatever is left.
    fn start_termination(self: &Arc<Self>) {
        {
            let mut state = self.lock();
            if state.terminating {
                return;
            }
            state.terminating = true;
        }
        self.kill_tree(libc::SIGTERM);
        let shared = Arc::clone(self);
        self.runtime
            .spawn(async move { shared.finish_termination().await });
    }

    async fn finish_termination(&self) {
        let deadline = Instant::now() + self.limits.kill_grace;
        let mut changes = self.watch_changes();
        while !self.lock().reaped {
            tokio::select! {
                _ = changes.changed() => {}
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        // Descendants may ignore SIGTERM or outlive the child.
        while Instant::now() < deadline {
            if !self.tree_alive() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.kill_tree(libc::SIGKILL);
    }

    pub(crate) fn release(self: &Arc<Self>) {
        if self.released.is_cancelled() {
            return;
        }
        self.released.cancel();
        self.notify();
        tracing::debug!(parent: &self.span, "process released");
        self.start_termination();
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

/// What `read` returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadOutcome {
    pub events: Vec<Event>,
    pub next_seq: u64,
    pub exit: Option<ExitStatus>,
    pub closed: bool,
}

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
    TooLarge { len: usize },
}

impl fmt::Display for WriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WriteError::EmptyWriteId => write!(f, "writeId must not be empty"),
            WriteError::TooLarge { len } => write!(
                f,
                "write of {len} bytes exceeds the limit of {MAX_WRITE_BYTES} bytes per call"
            ),
        }
    }
}

impl std::error::Error for WriteError {}

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

/// A write that is queued (or already decided).
pub struct WriteTicket(TicketState);

enum TicketState {
    Decided(WriteStatus),
    Queued {
        done: oneshot::Receiver<Result<(), WriteFailure>>,
        id: String,
        shared: Arc<Shared>,
    },
}

impl WriteTicket {
    pub async fn outcome(self) -> WriteStatus {
        match self.0 {
            TicketState::Decided(status) => status,
            TicketState::Queued { done, id, shared } => {
                let failure = match done.await {
                    Ok(Ok(())) => return WriteStatus::Accepted,
                    Ok(Err(failure)) => failure,
                    Err(_) => WriteFailure::Exited,
                };
                shared.lock().write_ids.forget(&id);
                match failure {
                    WriteFailure::Closed => WriteStatus::StdinClosed,
                    WriteFailure::Exited => WriteStatus::Exited,
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

/// A snapshot of a process and its retained log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessSnapshot {
    pub pid: u32,
    pub tty: bool,
    pub flow: Flow,
    pub stdin_open: bool,
    pub next_seq: u64,
    pub closed: bool,
    pub exit: Option<ExitStatus>,
    pub retained_bytes: u64,
    pub retained_chunks: u32,
    pub peak_retained_bytes: u64,
    pub evicted_through_seq: u64,
    pub unconsumed_bytes: u64,
    pub uptime: Duration,
}

/// A non-owning handle: it reads, writes and signals, but holding it does
/// not keep the process alive.
#[derive(Clone)]
pub struct Process {
    pub(crate) shared: Arc<Shared>,
}

impl Process {
    pub fn pid(&self) -> u32 {
        self.shared.pid as u32
    }

    pub fn is_tty(&self) -> bool {
        self.shared.tty
    }

    pub fn flow(&self) -> Flow {
        self.shared.flow
    }

    pub fn exit_status(&self) -> Option<ExitStatus> {
        self.shared.lock().log.exit_status()
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
                        exit: state.log.exit_status(),
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

    /// Lossless mode: the owner has consumed every event up to `seq`.
    pub fn consume_through(&self, seq: u64) {
        if self.shared.flow != Flow::Lossless {
            return;
        }
        let moved = {
            let mut state = self.shared.lock();
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
    /// outcome.
    pub fn submit_write(&self, data: Bytes, write_id: &str) -> Result<WriteTicket, WriteError> {
        if write_id.is_empty() {
            return Err(WriteError::EmptyWriteId);
        }
        if data.len() > MAX_WRITE_BYTES {
            return Err(WriteError::TooLarge { len: data.len() });
        }
        let mut state = self.shared.lock();
        if state.write_ids.contains(write_id) {
            return Ok(WriteTicket(TicketState::Decided(WriteStatus::Accepted)));
        }
        let refused = match state.stdin {
            _ if state.reaped => Some(WriteStatus::Exited),
            StdinState::Open => None,
            StdinState::Exited => Some(WriteStatus::Exited),
            StdinState::NotPiped | StdinState::ClosedByClient | StdinState::ClosedByChild => {
                Some(WriteStatus::StdinClosed)
            }
        };
        if let Some(status) = refused {
            return Ok(WriteTicket(TicketState::Decided(status)));
        }
        let (done, receiver) = oneshot::channel();
        let queued = self
            .shared
            .stdin_ops
            .as_ref()
            .is_some_and(|ops| ops.send(StdinOp::Write { data, done }).is_ok());
        if !queued {
            return Ok(WriteTicket(TicketState::Decided(WriteStatus::Exited)));
        }
        state.write_ids.insert(write_id);
        Ok(WriteTicket(TicketState::Queued {
            done: receiver,
            id: write_id.to_string(),
            shared: Arc::clone(&self.shared),
        }))
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
        if self.shared.is_reaped() {
            return Ok(());
        }
        let target = match &self.shared.terminal {
            Some(terminal) => terminal.foreground_group().unwrap_or(self.shared.pid),
            None => self.shared.pid,
        };
        tracing::debug!(parent: &self.shared.span, %signal, "signal");
        match kill::signal_group(target, signal.number()) {
            Ok(_) => Ok(()),
            Err(error) => Err(error),
        }
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

    /// Starts termination; false if the process had already exited.
    pub fn terminate(&self) -> bool {
        if self.shared.is_reaped() {
            return false;
        }
        self.shared.start_termination();
        true
    }

    pub fn snapshot(&self) -> ProcessSnapshot {
        let state = self.shared.lock();
        ProcessSnapshot {
            pid: self.shared.pid as u32,
            tty: self.shared.tty,
            flow: self.shared.flow,
            stdin_open: state.stdin == StdinState::Open,
            next_seq: state.log.next_seq(),
            closed: state.log.is_closed(),
            exit: state.log.exit_status(),
            retained_bytes: state.log.retained_bytes() as u64,
            retained_chunks: state.log.retained_chunks() as u32,
            peak_retained_bytes: state.log.peak_bytes() as u64,
            evicted_through_seq: state.log.evicted_through(),
            unconsumed_bytes: state.log.unconsumed_bytes(),
            uptime: state
                .exited_after
                .unwrap_or_else(|| self.shared.started.elapsed()),
        }
    }

    /// Waits until the process has closed.
    pub async fn wait_closed(&self) {
        self.wait_until(|process| process.is_closed()).await
    }

    /// Waits until the child has exited and been reaped.
    pub async fn wait_exited(&self) {
        self.wait_until(|process| process.shared.is_reaped()).await
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
