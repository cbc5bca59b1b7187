//! Our own stdin and stdout/stderr, driven by dedicated threads so that a
//! slow terminal or pipe never blocks the RPC thread, and written without
//! std's line buffering.

use std::fs::File;
use std::io::{self, Read, Write};
use std::mem::ManuallyDrop;
use std::os::fd::FromRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

const READ_CHUNK: usize = 64 * 1024;

enum Message {
    Write { fd: i32, data: Bytes },
    Flush(oneshot::Sender<()>),
}

/// Writes child output to our stdout and stderr in arrival order.
pub struct OutputWriter {
    messages: mpsc::Sender<Message>,
    stdout_broken: Arc<AtomicBool>,
}

impl OutputWriter {
    pub fn start() -> io::Result<OutputWriter> {
        let (messages, mut queue) = mpsc::channel::<Message>(4);
        let stdout_broken = Arc::new(AtomicBool::new(false));
        let broken = Arc::clone(&stdout_broken);
        std::thread::Builder::new()
            .name("capexec-output".into())
            .spawn(move || {
                while let Some(message) = queue.blocking_recv() {
                    match message {
                        Message::Write { fd, data } => {
                            if fd == 1 && broken.load(Ordering::Relaxed) {
                                continue;
                            }
                            if let Err(error) = write_fd(fd, &data)
                                && fd == 1
                                && error.kind() == io::ErrorKind::BrokenPipe
                            {
                                broken.store(true, Ordering::Relaxed);
                            }
                        }
                        Message::Flush(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            })?;
        Ok(OutputWriter {
            messages,
            stdout_broken,
        })
    }

    pub async fn stdout(&self, data: Bytes) {
        let _ = self.messages.send(Message::Write { fd: 1, data }).await;
    }

    pub async fn stderr(&self, data: Bytes) {
        let _ = self.messages.send(Message::Write { fd: 2, data }).await;
    }

    /// Whether our stdout reader has gone away (EPIPE).
    pub fn stdout_broken(&self) -> bool {
        self.stdout_broken.load(Ordering::Relaxed)
    }

    /// Waits until everything queued so far is written.
    pub async fn flush(&self) {
        let (done, wait) = oneshot::channel();
        if self.messages.send(Message::Flush(done)).await.is_ok() {
            let _ = wait.await;
        }
    }
}

fn write_fd(fd: i32, data: &[u8]) -> io::Result<()> {
    // SAFETY: fd 1 and 2 stay open for the life of the process; ManuallyDrop
    // keeps this temporary File from closing them.
    let mut file = ManuallyDrop::new(unsafe { File::from_raw_fd(fd) });
    file.write_all(data)
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
