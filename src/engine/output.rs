//! The output pump: one task per process that drains the child's output
//! descriptors into the retained log, observes the exit, and emits `closed`
//! once the child has exited and every output stream has reached EOF.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;
use tokio::time::Instant;

use crate::engine::handover::{FrozenPump, PumpStart};
use crate::engine::reaper::Leader;
use crate::engine::shared::Shared;
use crate::engine::{os, pipe_capacity};
use crate::model::{ExitStatus, OutputStream};
use crate::segment::SegmentBuffer;

/// Largest chunk read at once: one pipe buffer, small enough that every
/// event stays far below Cap'n Proto's message limit.
pub const CHUNK_SIZE: usize = 64 * 1024;

/// How long the output of a released, exited process may stay open (held
/// by a descendant that escaped the process group) before it is abandoned.
const ABANDON_OUTPUT_AFTER: Duration = Duration::from_secs(5);

/// A readable output descriptor of the child.
pub(crate) struct OutputSource {
    stream: OutputStream,
    reader: Reader,
    /// The pipe was grown (see `pipe_capacity`), or cannot be.
    grown: bool,
}

enum Reader {
    Pipe(pipe::Receiver),
    /// A pty master: the kernel reports EIO once every slave is closed.
    Terminal(Arc<AsyncFd<OwnedFd>>),
}

impl OutputSource {
    pub fn pipe(stream: OutputStream, fd: OwnedFd) -> io::Result<OutputSource> {
        Ok(OutputSource {
            stream,
            reader: Reader::Pipe(pipe::Receiver::from_owned_fd(fd)?),
            grown: false,
        })
    }

    pub fn terminal(master: Arc<AsyncFd<OwnedFd>>) -> OutputSource {
        OutputSource {
            stream: OutputStream::Pty,
            reader: Reader::Terminal(master),
            // A terminal's buffer cannot be resized.
            grown: true,
        }
    }

    /// The descriptor read, for a hand-over (`handover.rs`).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        match &self.reader {
            Reader::Pipe(pipe) => pipe.as_raw_fd(),
            Reader::Terminal(master) => master.get_ref().as_raw_fd(),
        }
    }

    fn is_terminal(&self) -> bool {
        matches!(self.reader, Reader::Terminal(_))
    }

    async fn readable(&self) -> io::Result<()> {
        match &self.reader {
            Reader::Pipe(pipe) => pipe.readable().await,
            // Dropping the guard keeps the readiness; try_read clears it on
            // EAGAIN.
            Reader::Terminal(master) => master.readable().await.map(drop),
        }
    }

    /// Appends what is available, at most `max` bytes, to `buf` without
    /// blocking; `Ok(0)` means EOF.
    fn try_read_into(&self, buf: &mut SegmentBuffer, max: usize) -> io::Result<usize> {
        match &self.reader {
            Reader::Pipe(pipe) => pipe.try_read_buf(&mut (&mut *buf).limit(max)),
            Reader::Terminal(master) => {
                let spare = buf.spare_capacity_mut();
                let want = spare.len().min(max);
                let result = master.try_io(Interest::READABLE, |fd| {
                    os::read(fd.as_raw_fd(), &mut spare[..want])
                });
                match result {
                    Ok(n) => {
                        // SAFETY: the kernel initialised the first n bytes.
                        unsafe { buf.set_len(buf.len() + n) };
                        Ok(n)
                    }
                    // The slave side is closed for good.
                    Err(error) if error.raw_os_error() == Some(libc::EIO) => Ok(0),
                    Err(error) => Err(error),
                }
            }
        }
    }

    /// Bytes the kernel holds for this descriptor right now.
    fn pending_bytes(&self) -> usize {
        let fd = match &self.reader {
            Reader::Pipe(pipe) => pipe.as_raw_fd(),
            Reader::Terminal(master) => master.get_ref().as_raw_fd(),
        };
        let mut pending: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int into `pending`.
        if unsafe { libc::ioctl(fd, libc::FIONREAD, &mut pending) } < 0 {
            return 0;
        }
        pending.max(0) as usize
    }
}

/// Output is read straight into a buffer laid out as a Cap'n Proto
/// segment (`segment.rs`), which a chunk of this size or more keeps (cut
/// to its size), so that the message that sends it takes it as it is,
/// with neither a zeroed segment of its own nor a copy. A smaller chunk
/// would be copied into its message anyway: it is copied out, and the
/// buffer read into again.
const LAID_OUT_MIN: usize = crate::segment::LISTED_MIN;

/// Reads one chunk from `slot`: whatever is available now, up to
/// [`CHUNK_SIZE`], coalescing the small writes of a fast producer into one
/// chunk without waiting for more. Clears the slot at EOF or on error.
/// Returns the number of bytes read.
fn drain_once(shared: &Shared, slot: &mut Option<OutputSource>, buf: &mut SegmentBuffer) -> usize {
    let Some(source) = slot.as_mut() else {
        return 0;
    };
    let mut ended = false;
    while buf.len() < CHUNK_SIZE {
        match source.try_read_into(buf, CHUNK_SIZE - buf.len()) {
            Ok(0) => {
                ended = true;
                break;
            }
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
            Err(error) => {
                tracing::warn!(%error, stream = ?source.stream, "reading child output failed");
                ended = true;
                break;
            }
        }
    }
    let read = buf.len();
    if read >= pipe_capacity::DEFAULT_CAPACITY
        && !source.grown
        && let Reader::Pipe(pipe) = &source.reader
    {
        // A full pipe: the child produces in bulk.
        source.grown = true;
        pipe_capacity::grow(pipe.as_raw_fd());
    }
    if read > 0 {
        crate::metrics::bytes_out(read);
        let chunk = if read >= LAID_OUT_MIN {
            std::mem::replace(buf, SegmentBuffer::with_capacity(CHUNK_SIZE)).freeze_to_bytes()
        } else {
            let chunk = Bytes::copy_from_slice(buf.as_slice());
            buf.clear();
            chunk
        };
        shared.append_output(source.stream, chunk);
    }
    if ended {
        *slot = None;
    }
    read
}

/// After `readable` said `result`: reads one chunk from `slot`, or drops
/// it if it failed. Returns the number of bytes read.
fn take(
    shared: &Shared,
    slot: &mut Option<OutputSource>,
    result: io::Result<()>,
    buf: &mut SegmentBuffer,
) -> usize {
    if result.is_err() {
        *slot = None;
        return 0;
    }
    drain_once(shared, slot, buf)
}

async fn readable(slot: &Option<OutputSource>) -> io::Result<()> {
    match slot {
        Some(source) => source.readable().await,
        None => std::future::pending().await,
    }
}

/// An exit whose event waits until the output the child wrote before it
/// exited has been read, so that the exit event follows that output. Only
/// the bytes pending at the exit count: descendants that keep writing cannot
/// hold the exit event back, and in lossless mode the draining still
/// respects the window.
struct PendingExit {
    status: ExitStatus,
    /// Bytes still to read per source; `None` while a terminal settles.
    unread: Option<[usize; 2]>,
    /// A terminal passes the child's last writes to its master
    /// asynchronously; until this deadline (or EOF) the count is not known.
    settle_until: Instant,
}

/// How long a terminal's last output may take to reach its master.
const TERMINAL_SETTLE: Duration = Duration::from_millis(50);

/// Runs the pump of `shared` (see [`run_pump`]) and says when it stopped.
pub(crate) async fn pump(
    shared: Arc<Shared>,
    sources: [Option<OutputSource>; 2],
    leader: Arc<Leader>,
    start: PumpStart,
) {
    let slot = Arc::clone(&shared.handover);
    if let Some(frozen) = run_pump(shared, sources, leader, start).await {
        slot.deposit_pump(frozen);
    }
    slot.pump_stopped.cancel();
}

/// Drains the output until the child has exited and every stream ended;
/// returns what it holds instead when the engine freezes for a hand-over.
async fn run_pump(
    shared: Arc<Shared>,
    mut sources: [Option<OutputSource>; 2],
    leader: Arc<Leader>,
    start: PumpStart,
) -> Option<FrozenPump> {
    let mut buf = SegmentBuffer::with_capacity(CHUNK_SIZE);
    let exit = leader.exited();
    tokio::pin!(exit);
    let mut exited = start.exited;
    let terminal = sources.iter().flatten().any(OutputSource::is_terminal);
    let mut pending_exit: Option<PendingExit> = start.pending_exit.map(|status| PendingExit {
        status,
        unread: (!terminal).then(|| unread_now(&sources)),
        settle_until: Instant::now() + TERMINAL_SETTLE,
    });
    let mut exit_logged = start.exited && start.pending_exit.is_none();
    let freeze = shared.handover.freeze.clone();
    let mut changes = shared.watch_changes();
    let mut abandon_at: Option<Instant> = None;
    // Made once, not per chunk: each made anew would register with its
    // token and leave it again on every turn of the loop.
    let (stdout_closed, stderr_closed) = (
        shared.output_closed[0].cancelled(),
        shared.output_closed[1].cancelled(),
    );
    tokio::pin!(stdout_closed, stderr_closed);
    loop {
        // Once frozen, no call on a pipe: its lock may be held by whatever
        // the child gave it to, and the exec would wait on this thread.
        if freeze.is_cancelled() {
            let pending = pending_exit.map(|pending| pending.status);
            return Some(frozen(&shared, sources, pending, exited, &mut exit));
        }
        if let Some(pending) = &mut pending_exit {
            if pending.unread.is_none()
                && (sources.iter().all(Option::is_none) || Instant::now() >= pending.settle_until)
            {
                // A read pushes what the terminal layer still holds to the
                // master, where the count below sees it.
                for slot in sources.iter_mut() {
                    if slot.as_ref().is_some_and(OutputSource::is_terminal) {
                        drain_once(&shared, slot, &mut buf);
                    }
                }
                pending.unread = Some(unread_now(&sources));
            }
            if pending
                .unread
                .is_some_and(|unread| unread.iter().all(|&n| n == 0))
            {
                shared.log_exit_event(pending.status);
                pending_exit = None;
                exit_logged = true;
            }
        }
        if exit_logged && sources.iter().all(Option::is_none) {
            if !shared.lock().log.is_closed() {
                shared.log_closed_event();
            }
            return None;
        }
        changes.borrow_and_update();
        let paused = shared.output_paused();
        let released = shared.is_released();
        if released && exited && abandon_at.is_none() {
            abandon_at = Some(Instant::now() + ABANDON_OUTPUT_AFTER);
        }
        let settling = pending_exit
            .as_ref()
            .filter(|pending| pending.unread.is_none())
            .map(|pending| pending.settle_until);
        let mut read = [0usize; 2];
        tokio::select! {
            _ = freeze.cancelled() => {}
            result = readable(&sources[0]), if sources[0].is_some() && !paused => {
                if !freeze.is_cancelled() {
                    read[0] = take(&shared, &mut sources[0], result, &mut buf);
                }
            }
            result = readable(&sources[1]), if sources[1].is_some() && !paused => {
                if !freeze.is_cancelled() {
                    read[1] = take(&shared, &mut sources[1], result, &mut buf);
                }
            }
            ended = &mut exit, if !exited => {
                exited = true;
                shared.record_child_exited(ended.usage);
                if freeze.is_cancelled() {
                    // Not counted: the next binary counts what is unread.
                    return Some(FrozenPump { sources, pending_exit: Some(ended.status) });
                }
                let terminal = sources.iter().flatten().any(OutputSource::is_terminal);
                pending_exit = Some(PendingExit {
                    status: ended.status,
                    unread: (!terminal).then(|| unread_now(&sources)),
                    settle_until: Instant::now() + TERMINAL_SETTLE,
                });
            }
            _ = tokio::time::sleep_until(settling.unwrap_or_else(Instant::now)), if settling.is_some() => {}
            // The owner's reader went away: as in a local pipeline, the
            // pipe's read end closes and the child's next write to it
            // gets SIGPIPE.
            _ = &mut stdout_closed, if sources[0].is_some() => if !freeze.is_cancelled() { sources[0] = None },
            _ = &mut stderr_closed, if sources[1].is_some() => if !freeze.is_cancelled() { sources[1] = None },
            _ = changes.changed(), if paused => {}
            _ = shared.owner_released.cancelled(), if !released => {}
            _ = tokio::time::sleep_until(abandon_at.unwrap_or_else(Instant::now)), if abandon_at.is_some() => {
                if !freeze.is_cancelled() {
                    tracing::debug!("abandoning output still held open after release");
                    sources = [None, None];
                }
            }
        }
        if read.iter().any(|&n| n > 0 && n < CHUNK_SIZE) {
            // A partial chunk means the producer writes in small pieces.
            // Let the consumers of what was just read run first; meanwhile
            // more output gathers in the pipe and the next read is fuller.
            tokio::task::yield_now().await;
        }
        if let Some(PendingExit {
            unread: Some(unread),
            ..
        }) = &mut pending_exit
        {
            for i in 0..2 {
                unread[i] = if sources[i].is_none() {
                    0
                } else {
                    unread[i].saturating_sub(read[i])
                };
            }
        }
    }
}

/// What the pump hands over when the engine freezes: its sources, and the
/// exit it had seen and not logged, or that the reaper delivered just
/// before it paused (this image is the only one that knows).
fn frozen<F: std::future::Future<Output = crate::engine::reaper::Ended>>(
    shared: &Arc<Shared>,
    sources: [Option<OutputSource>; 2],
    mut pending_exit: Option<ExitStatus>,
    exited: bool,
    exit: &mut std::pin::Pin<&mut F>,
) -> FrozenPump {
    if !exited && let Some(ended) = futures::FutureExt::now_or_never(exit) {
        shared.record_child_exited(ended.usage);
        pending_exit = Some(ended.status);
    }
    FrozenPump {
        sources,
        pending_exit,
    }
}

fn unread_now(sources: &[Option<OutputSource>; 2]) -> [usize; 2] {
    [0, 1].map(|i| sources[i].as_ref().map_or(0, OutputSource::pending_bytes))
}
