//! Our own stdin and stdout/stderr, driven by dedicated threads so that a
//! slow terminal or pipe never blocks the RPC thread, and written without
//! std's line buffering.

use std::fs::File;
use std::io::{self, IoSlice, Read, Write};
use std::mem::ManuallyDrop;
use std::os::fd::FromRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

const READ_CHUNK: usize = 64 * 1024;

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
    stdout_broken: Arc<AtomicBool>,
}

impl OutputWriter {
    pub fn new() -> OutputWriter {
        OutputWriter {
            messages: None,
            stdout_broken: Arc::new(AtomicBool::new(false)),
        }
    }

    fn sender(&mut self) -> Option<&mpsc::Sender<Message>> {
        if self.messages.is_none() {
            grow_pipe(1);
            grow_pipe(2);
            let (messages, queue) = mpsc::channel::<Message>(4);
            let broken = Arc::clone(&self.stdout_broken);
            let started = std::thread::Builder::new()
                .name("capexec-output".into())
                .spawn(move || write_forever(queue, &broken));
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

    /// Whether our stdout reader has gone away (EPIPE).
    pub fn stdout_broken(&self) -> bool {
        self.stdout_broken.load(Ordering::Relaxed)
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
/// writev(2) so that many small chunks cost few system calls.
fn write_forever(mut queue: mpsc::Receiver<Message>, broken: &AtomicBool) {
    let mut pending: Vec<(i32, Bytes)> = Vec::new();
    let mut flushes = Vec::new();
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
            if fd == 1 && broken.load(Ordering::Relaxed) {
                start = end;
                continue;
            }
            if let Err(error) = write_all_vectored(fd, &pending[start..end])
                && fd == 1
                && error.kind() == io::ErrorKind::BrokenPipe
            {
                broken.store(true, Ordering::Relaxed);
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

/// Reads our stdin on a thread; `None` marks end-of-file.
pub fn read_stdin() -> mpsc::Receiver<Option<Bytes>> {
    let (chunks, receiver) = mpsc::channel(2);
    let spawned = std::thread::Builder::new()
        .name("capexec-stdin".into())
        .spawn(move || {
            // SAFETY: as in write_fd, for fd 0.
            let mut stdin = ManuallyDrop::new(unsafe { File::from_raw_fd(0) });
            let mut buf = vec![0u8; READ_CHUNK];
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) => {
                        let _ = chunks.blocking_send(None);
                        return;
                    }
                    Ok(n) => {
                        if chunks
                            .blocking_send(Some(Bytes::copy_from_slice(&buf[..n])))
                            .is_err()
                        {
                            return;
                        }
                    }
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                    Err(error) => {
                        tracing::warn!(%error, "reading stdin failed; closing the child's stdin");
                        let _ = chunks.blocking_send(None);
                        return;
                    }
                }
            }
        });
    if let Err(error) = spawned {
        tracing::error!(%error, "cannot start the stdin thread");
    }
    receiver
}
