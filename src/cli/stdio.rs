//! Our own stdout and stderr, written by a dedicated thread so that a slow
//! terminal or pipe never blocks the RPC thread, and without std's line
//! buffering (our stdin: `stdin_chunks.rs`).

use std::fs::File;
use std::io::{self, IoSlice, IsTerminal, Write};
use std::mem::ManuallyDrop;
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

/// Which of fds 0, 1 and 2 were closed when capexec started (Rust's
/// runtime has put /dev/null there since: see `main.rs`).
static CLOSED_AT_START: [AtomicBool; 3] = [
    AtomicBool::new(false),
    AtomicBool::new(false),
    AtomicBool::new(false),
];

/// Records that `fd` was closed when capexec started. Called before `main`.
pub fn note_closed_at_start(fd: i32) {
    if let Some(closed) = usize::try_from(fd)
        .ok()
        .and_then(|fd| CLOSED_AT_START.get(fd))
    {
        closed.store(true, Ordering::Relaxed);
    }
}

/// Whether the caller left `fd` closed: writing to it is an error, as it
/// would have been had the runtime not filled it with /dev/null.
pub fn closed_at_start(fd: i32) -> bool {
    usize::try_from(fd)
        .ok()
        .and_then(|fd| CLOSED_AT_START.get(fd))
        .is_some_and(|closed| closed.load(Ordering::Relaxed))
}

/// Writes `bytes` to our stdout as a command's answer (`capexec info`):
/// a failed write, or a stdout the caller closed, is an error.
pub fn write_answer(bytes: impl AsRef<[u8]>) -> io::Result<()> {
    if closed_at_start(1) {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    let mut stdout = io::stdout().lock();
    stdout.write_all(bytes.as_ref())?;
    stdout.flush()
}

/// Writes `bytes` (`what`, for the message) to our stdout as a command's
/// answer, and returns the exit status under [`unwritten`]'s rule: 0 when
/// it was written.
pub fn print_answer(bytes: impl AsRef<[u8]>, what: &str) -> i32 {
    match write_answer(bytes) {
        Ok(()) => 0,
        Err(error) => unwritten(&error, what),
    }
}

/// The one rule of every subcommand for output it could not write to its
/// stdout: a reader that went away (EPIPE: `capexec man | head`) ends
/// capexec silently with 141, as SIGPIPE ends a program in a local
/// pipeline; any other error (a full disk, a stdout the caller closed) is
/// one line naming what was not written, and 125. Returns the exit status.
pub fn unwritten(error: &io::Error, what: &str) -> i32 {
    if error.kind() == io::ErrorKind::BrokenPipe {
        tracing::debug!("cannot write {what}: our stdout's reader went away");
        return crate::cli::EXIT_STDOUT_CLOSED;
    }
    note(&format!(
        "cannot write {what}: {}",
        capexec::model::io_message(error)
    ));
    crate::cli::EXIT_CAPEXEC_FAILURE
}

/// Our stdout as an `AsyncWrite`, for an answer streamed as it arrives
/// (`capexec cp :FILE -`): a stdout the caller closed fails the first
/// write, and the first write error is kept, so the caller can apply
/// [`unwritten`]'s rule to it rather than to its own description of it.
pub struct StreamedAnswer {
    stdout: tokio::io::Stdout,
    failed: Option<io::Error>,
}

impl StreamedAnswer {
    pub fn new() -> StreamedAnswer {
        StreamedAnswer {
            stdout: tokio::io::stdout(),
            failed: None,
        }
    }

    /// The first write error, if a write failed.
    pub fn failed(&self) -> Option<&io::Error> {
        self.failed.as_ref()
    }

    fn kept<T>(&mut self, result: io::Result<T>) -> io::Result<T> {
        if let Err(error) = &result
            && self.failed.is_none()
        {
            self.failed = Some(match error.raw_os_error() {
                Some(errno) => io::Error::from_raw_os_error(errno),
                None => error.kind().into(),
            });
        }
        result
    }
}

impl tokio::io::AsyncWrite for StreamedAnswer {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bytes: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        if closed_at_start(1) {
            let closed = Err(io::Error::from_raw_os_error(libc::EBADF));
            return std::task::Poll::Ready(self.kept(closed));
        }
        let written = std::task::ready!(std::pin::Pin::new(&mut self.stdout).poll_write(cx, bytes));
        std::task::Poll::Ready(self.kept(written))
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let flushed = std::task::ready!(std::pin::Pin::new(&mut self.stdout).poll_flush(cx));
        std::task::Poll::Ready(self.kept(flushed))
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let shut = std::task::ready!(std::pin::Pin::new(&mut self.stdout).poll_shutdown(cx));
        std::task::Poll::Ready(self.kept(shut))
    }
}

enum Message {
    /// Consecutive pieces of output, each for fd 1 or 2, in order.
    Write(Vec<(i32, Bytes)>),
    Flush(oneshot::Sender<()>),
}

/// Writes child output to our stdout and stderr in arrival order, on a
/// thread started with the first output (a command without output costs no
/// thread).
pub struct OutputWriter {
    messages: Option<mpsc::Sender<Message>>,
    state: Arc<WriterState>,
}

/// What the writer thread tells the relay.
#[derive(Default)]
struct WriterState {
    /// A reader of ours went away (EPIPE).
    broken: AtomicBool,
    /// The first other write error: output was lost.
    failed: Mutex<Option<io::Error>>,
}

/// The last byte written to stdout ended a line (or nothing was written),
/// so a note printed now on the same terminal starts on a fresh line.
static STDOUT_AT_LINE_START: AtomicBool = AtomicBool::new(true);

/// Prints `capexec: TEXT` on stderr as one line of its own: on a fresh
/// line if the command's output on the same terminal stopped mid-line (a
/// shell prompt), with the line ending the terminal's mode needs.
pub fn note(text: &str) {
    let fresh = !STDOUT_AT_LINE_START.load(Ordering::Relaxed)
        && io::stdout().is_terminal()
        && io::stderr().is_terminal();
    let end = crate::cli::local_terminal::line_end();
    let start = if fresh { end } else { "" };
    let _ = write!(io::stderr().lock(), "{start}capexec: {text}{end}");
    if fresh {
        STDOUT_AT_LINE_START.store(true, Ordering::Relaxed);
    }
}

impl OutputWriter {
    pub fn new() -> OutputWriter {
        OutputWriter {
            messages: None,
            state: Arc::new(WriterState::default()),
        }
    }

    fn sender(&mut self) -> Option<&mpsc::Sender<Message>> {
        if self.messages.is_none() {
            grow_pipe(1);
            grow_pipe(2);
            let (messages, queue) = mpsc::channel::<Message>(4);
            let state = Arc::clone(&self.state);
            let started = std::thread::Builder::new()
                .name("capexec-output".into())
                .spawn(move || write_forever(queue, &state));
            match started {
                Ok(_) => self.messages = Some(messages),
                Err(error) => tracing::error!(%error, "cannot start the output thread"),
            }
        }
        self.messages.as_ref()
    }

    /// Queues pieces of output for fd 1 or 2; waits only when the writer is
    /// several batches behind.
    pub async fn write(&mut self, pieces: Vec<(i32, Bytes)>) {
        if pieces.is_empty() {
            return;
        }
        if let Some(messages) = self.sender() {
            let _ = messages.send(Message::Write(pieces)).await;
        }
    }

    /// Whether our stdout's (or stderr's) reader has gone away (EPIPE).
    pub fn stdout_broken(&self) -> bool {
        self.state.broken.load(Ordering::Relaxed)
    }

    /// The first write error other than a reader going away: output that
    /// could not be written (a full disk, a closed descriptor).
    pub fn failure(&self) -> Option<String> {
        let failed = self.state.failed.lock().unwrap_or_else(|p| p.into_inner());
        failed.as_ref().map(capexec::model::io_message)
    }

    /// Waits until everything queued so far is written.
    pub async fn flush(&self) {
        let Some(messages) = &self.messages else {
            return;
        };
        let (done, wait) = oneshot::channel();
        if messages.send(Message::Flush(done)).await.is_ok() {
            let _ = wait.await;
        }
    }
}

/// Writes everything queued, merging runs for the same descriptor into one
/// writev(2) so that many small chunks cost few system calls. After an
/// error on a descriptor, what is queued for it is dropped: the relay ends
/// the run.
fn write_forever(mut queue: mpsc::Receiver<Message>, state: &WriterState) {
    let mut pending: Vec<(i32, Bytes)> = Vec::new();
    let mut flushes = Vec::new();
    let mut dead = [false; 3];
    while let Some(message) = queue.blocking_recv() {
        let mut next = Some(message);
        while let Some(message) = next.take() {
            match message {
                Message::Write(pieces) => pending.extend(pieces),
                Message::Flush(done) => flushes.push(done),
            }
            next = queue.try_recv().ok();
        }
        let mut start = 0;
        while start < pending.len() {
            let fd = pending[start].0;
            let end = pending[start..]
                .iter()
                .position(|(piece_fd, _)| *piece_fd != fd)
                .map_or(pending.len(), |offset| start + offset);
            let slot = usize::try_from(fd).unwrap_or(0).min(2);
            if !dead[slot] {
                let written = if closed_at_start(fd) {
                    Err(io::Error::from_raw_os_error(libc::EBADF))
                } else {
                    write_all_vectored(fd, &pending[start..end])
                };
                match written {
                    Ok(()) if fd == 1 => {
                        let last = pending[start..end]
                            .iter()
                            .rev()
                            .find_map(|(_, data)| data.last());
                        if let Some(&last) = last {
                            STDOUT_AT_LINE_START.store(last == b'\n', Ordering::Relaxed);
                        }
                    }
                    Ok(()) => {}
                    Err(error) => {
                        dead[slot] = true;
                        if error.kind() == io::ErrorKind::BrokenPipe {
                            state.broken.store(true, Ordering::Relaxed);
                        } else {
                            let mut failed = state.failed.lock().unwrap_or_else(|p| p.into_inner());
                            failed.get_or_insert(error);
                        }
                    }
                }
            }
            start = end;
        }
        pending.clear();
        for done in flushes.drain(..) {
            let _ = done.send(());
        }
    }
}

/// If `fd` is a pipe, asks for a 1 MiB buffer: the writer thread then blocks
/// (and switches context) far less often when our reader is a little slower
/// than the stream. Not a pipe, or not allowed: nothing changes.
fn grow_pipe(fd: i32) {
    // SAFETY: F_SETPIPE_SZ only resizes a pipe's buffer; on anything else
    // it fails harmlessly.
    unsafe { libc::fcntl(fd, libc::F_SETPIPE_SZ, 1 << 20) };
}

fn write_all_vectored(fd: i32, pieces: &[(i32, Bytes)]) -> io::Result<()> {
    // SAFETY: fd 1 and 2 stay open for the life of the process; ManuallyDrop
    // keeps this temporary File from closing them.
    let mut file = ManuallyDrop::new(unsafe { File::from_raw_fd(fd) });
    let mut slices: Vec<IoSlice<'_>> = pieces.iter().map(|(_, data)| IoSlice::new(data)).collect();
    let mut slices = &mut slices[..];
    IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        match file.write_vectored(slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut slices, n),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}
