//! The child's stdin: an ordered queue of writes fed into the pipe (or pty) by
//! one task, and the memory of accepted write ids that makes retries safe.

use std::collections::{HashSet, VecDeque};
use std::io;

use bytes::Bytes;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// How many accepted write ids each process remembers.
pub const REMEMBERED_WRITE_IDS: usize = 4096;

/// Why stdin no longer takes writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StdinState {
    Open,
    /// Never opened: started without `pipeStdin`.
    NotPiped,
    ClosedByClient,
    /// The child closed its end (EPIPE) or the pipe failed.
    ClosedByChild,
    Exited,
}

/// Failure of a queued write, as the writer task reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WriteFailure {
    Closed,
    Exited,
}

pub(crate) enum StdinOp {
    Write {
        data: Bytes,
        done: oneshot::Sender<Result<(), WriteFailure>>,
    },
    /// End-of-file after every earlier write. `eof` is written first when
    /// set (a terminal's EOF character); otherwise the pipe is closed.
    Close {
        eof: Option<Bytes>,
        done: oneshot::Sender<()>,
    },
}

/// The last [`REMEMBERED_WRITE_IDS`] accepted ids, oldest forgotten first.
#[derive(Default)]
pub(crate) struct WriteIds {
    order: VecDeque<String>,
    known: HashSet<String>,
}

impl WriteIds {
    pub fn contains(&self, id: &str) -> bool {
        self.known.contains(id)
    }

    pub fn insert(&mut self, id: &str) {
        if self.known.insert(id.to_string()) {
            self.order.push_back(id.to_string());
            if self.order.len() > REMEMBERED_WRITE_IDS
                && let Some(oldest) = self.order.pop_front()
            {
                self.known.remove(&oldest);
            }
        }
    }

    /// Forgets an id whose write never reached the child, so that a retry is
    /// not mistaken for a duplicate.
    pub fn forget(&mut self, id: &str) {
        if self.known.remove(id)
            && let Some(index) = self.order.iter().rposition(|known| known == id)
        {
            self.order.remove(index);
        }
    }
}

/// Feeds queued writes into `sink` in order until stdin is closed, the child
/// closes its end, or `stop` fires (the process exited).
pub(crate) async fn run_writer<W>(
    mut sink: W,
    mut ops: mpsc::UnboundedReceiver<StdinOp>,
    stop: CancellationToken,
    on_child_closed: impl FnOnce(),
) where
    W: AsyncWrite + Unpin,
{
    let mut failure = None;
    while failure.is_none() {
        let op = tokio::select! {
            biased;
            _ = stop.cancelled() => { failure = Some(WriteFailure::Exited); break; }
            op = ops.recv() => op,
        };
        match op {
            None => break,
            Some(StdinOp::Write { data, done }) => {
                let written = tokio::select! {
                    biased;
                    _ = stop.cancelled() => Err(WriteFailure::Exited),
                    result = write_all(&mut sink, &data) => result.map_err(|_| WriteFailure::Closed),
                };
                if let Err(why) = written {
                    failure = Some(why);
                }
                let _ = done.send(written);
            }
            Some(StdinOp::Close { eof, done }) => {
                if let Some(eof) = eof {
                    let _ = write_all(&mut sink, &eof).await;
                }
                let _ = done.send(());
                break;
            }
        }
    }
    if failure == Some(WriteFailure::Closed) {
        on_child_closed();
    }
    drop(sink);
    // Whatever is still queued can no longer be written.
    ops.close();
    let answer = failure.unwrap_or(WriteFailure::Closed);
    while let Ok(op) = ops.try_recv() {
        match op {
            StdinOp::Write { done, .. } => {
                let _ = done.send(Err(answer));
            }
            StdinOp::Close { done, .. } => {
                let _ = done.send(());
            }
        }
    }
}

async fn write_all<W: AsyncWrite + Unpin>(sink: &mut W, data: &[u8]) -> io::Result<()> {
    sink.write_all(data).await?;
    sink.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_ids_remember_the_most_recent_4096() {
        let mut ids = WriteIds::default();
        for n in 0..=REMEMBERED_WRITE_IDS {
            ids.insert(&format!("w{n}"));
        }
        assert!(!ids.contains("w0"));
        assert!(ids.contains("w1"));
        assert!(ids.contains(&format!("w{REMEMBERED_WRITE_IDS}")));
        ids.forget("w1");
        assert!(!ids.contains("w1"));
    }
}
