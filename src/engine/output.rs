//! The output pump: one task per process that drains the child's output
//! descriptors into the retained log, observes the exit, and emits `closed`
//! once the child has exited and every output stream has reached EOF.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;
use tokio::time::Instant;

use crate::engine::process::Shared;
use crate::engine::reaper::ExitWait;
use crate::model::OutputStream;

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
        })
    }

    pub fn terminal(master: Arc<AsyncFd<OwnedFd>>) -> OutputSource {
        OutputSource {
            stream: OutputStream::Pty,
            reader: Reader::Terminal(master),
        }
    }

    async fn readable(&self) -> io::Result<()> {
        match &self.reader {
            Reader::Pipe(pipe) => pipe.readable().await,
            // Dropping the guard keeps the readiness; try_read clears it on
            // EAGAIN.
            Reader::Terminal(master) => master.readable().await.map(drop),
        }
    }

    /// Reads what is available without blocking; `Ok(0)` means EOF.
    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match &self.reader {
            Reader::Pipe(pipe) => pipe.try_read(buf),
            Reader::Terminal(master) => {
                let result = master.try_io(Interest::READABLE, |fd| {
                    // SAFETY: reads into `buf`, which outlives the call.
                    let n =
                        unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                    if n < 0 {
                        Err(io::Error::last_os_error())
                    } else {
                        Ok(n as usize)
                    }
                });
                match result {
                    Err(error) if error.raw_os_error() == Some(libc::EIO) => Ok(0),
                    other => other,
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

/// Reads one chunk from `slot`; clears the slot at EOF or on error.
fn drain_once(shared: &Shared, slot: &mut Option<OutputSource>, buf: &mut [u8]) {
    let Some(source) = slot.as_ref() else { return };
    match source.try_read(buf) {
        Ok(0) => *slot = None,
        Ok(n) => shared.append_output(source.stream, Bytes::copy_from_slice(&buf[..n])),
        Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
        Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
        Err(error) => {
            tracing::warn!(%error, stream = ?source.stream, "reading child output failed");
            *slot = None;
        }
    }
}

/// Takes in what the child wrote before it exited, so that its exit event
/// follows its output. Bounded by what was pending at the exit: descendants
/// that keep writing cannot delay the exit event.
fn drain_pending(shared: &Shared, slot: &mut Option<OutputSource>, buf: &mut [u8]) {
    let Some(source) = slot.as_ref() else { return };
    let mut remaining = source.pending_bytes();
    while remaining > 0 {
        let Some(source) = slot.as_ref() else { return };
        let want = remaining.min(buf.len());
        match source.try_read(&mut buf[..want]) {
            Ok(0) => {
                *slot = None;
                return;
            }
            Ok(n) => {
                shared.append_output(source.stream, Bytes::copy_from_slice(&buf[..n]));
                remaining = remaining.saturating_sub(n);
            }
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

async fn readable(slot: &Option<OutputSource>) -> io::Result<()> {
    match slot {
        Some(source) => source.readable().await,
        None => std::future::pending().await,
    }
}

pub(crate) async fn pump(
    shared: Arc<Shared>,
    mut sources: [Option<OutputSource>; 2],
    exit: ExitWait,
) {
    let mut buf = vec![0u8; CHUNK_SIZE];
    let exit = exit.wait();
    tokio::pin!(exit);
    let mut exited = false;
    let mut changes = shared.watch_changes();
    let mut abandon_at: Option<Instant> = None;
    loop {
        if exited && sources.iter().all(Option::is_none) {
            shared.record_closed();
            return;
        }
        changes.borrow_and_update();
        let paused = shared.output_paused();
        let released = shared.is_released();
        if released && exited && abandon_at.is_none() {
            abandon_at = Some(Instant::now() + ABANDON_OUTPUT_AFTER);
        }
        tokio::select! {
            result = readable(&sources[0]), if sources[0].is_some() && !paused => {
                if result.is_err() { sources[0] = None } else { drain_once(&shared, &mut sources[0], &mut buf) }
            }
            result = readable(&sources[1]), if sources[1].is_some() && !paused => {
                if result.is_err() { sources[1] = None } else { drain_once(&shared, &mut sources[1], &mut buf) }
            }
            status = &mut exit, if !exited => {
                for slot in sources.iter_mut() {
                    drain_pending(&shared, slot, &mut buf);
                }
                shared.record_exit(status);
                exited = true;
            }
            _ = changes.changed(), if paused => {}
            _ = shared.released.cancelled(), if !released => {}
            _ = tokio::time::sleep_until(abandon_at.unwrap_or_else(Instant::now)), if abandon_at.is_some() => {
                tracing::debug!("abandoning output still held open after release");
                sources = [None, None];
            }
        }
    }
}
