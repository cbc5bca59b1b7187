//! The child's stdin: an ordered queue of writes fed into the pipe (or pty) by
//! one task, and the memory of write ids that makes retries safe.

use std::collections::{HashMap, VecDeque};
use std::io;

use bytes::Bytes;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

/// How many write ids each process remembers.
pub const REMEMBERED_WRITE_IDS: usize = 4096;

/// Why stdin no longer takes writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) enum WriteFailure {
    Closed,
    Exited,
}

/// Where a write's outcome is published: `None` while it is queued. The
/// first write with an id and every retry of it watch the same outcome.
pub(crate) type Outcome = watch::Receiver<Option<Result<(), WriteFailure>>>;

pub(crate) enum StdinOp {
    Write {
        data: Bytes,
        /// The write's id, which a hand-over keeps with what is left of it.
        id: String,
        done: watch::Sender<Option<Result<(), WriteFailure>>>,
    },
    /// End-of-file after every earlier write. `eof` is written first when
    /// set (a terminal's EOF character); otherwise the pipe is closed.
    Close {
        eof: Option<Bytes>,
        done: oneshot::Sender<()>,
    },
}

/// The outcomes of the last [`REMEMBERED_WRITE_IDS`] write ids, oldest
/// forgotten first.
#[derive(Default)]
pub(crate) struct WriteIds {
    order: VecDeque<String>,
    known: HashMap<String, Outcome>,
}

impl WriteIds {
    pub fn get(&self, id: &str) -> Option<Outcome> {
        self.known.get(id).cloned()
    }

    /// Remembers `id`, forgetting the oldest finished ids beyond
    /// [`REMEMBERED_WRITE_IDS`]. An id whose write is still queued is never
    /// forgotten (the queue holds at most that many writes), so a retry of
    /// it can never write twice.
    pub fn insert(&mut self, id: &str, outcome: Outcome) {
        if self.known.insert(id.to_string(), outcome).is_none() {
            self.order.push_back(id.to_string());
        }
        while self.order.len() > REMEMBERED_WRITE_IDS {
            let finished = self.order.iter().position(|id| {
                self.known
                    .get(id)
                    .is_none_or(|outcome| outcome.borrow().is_some())
            });
            let Some(index) = finished else { break };
            if let Some(oldest) = self.order.remove(index) {
                self.known.remove(&oldest);
            }
        }
    }

    /// Every remembered id, oldest first, with its outcome so far.
    pub fn entries(&self) -> impl Iterator<Item = (String, Option<Result<(), WriteFailure>>)> + '_ {
        self.order.iter().filter_map(|id| {
            let outcome = *self.known.get(id)?.borrow();
            Some((id.clone(), outcome))
        })
    }

    /// Forgets an id whose write never reached the child, so that a later
    /// retry writes it.
    pub fn forget(&mut self, id: &str) {
        if self.known.remove(id).is_some()
            && let Some(index) = self.order.iter().rposition(|known| known == id)
        {
            self.order.remove(index);
        }
    }
}

/// What the writer task tells the process about.
pub(crate) trait StdinEvents: Send + 'static {
    /// One write of `bytes` left the queue (written or dropped).
    fn dequeued(&self, bytes: usize);
    /// The child closed its end of stdin.
    fn child_closed(&self);
}

/// A writer stopped for a hand-over (`engine::handover`): its sink, what is
/// left of the write it was in the middle of, and the queue behind it.
pub(crate) struct FrozenWriter<W> {
    /// Kept open until the exec.
    #[allow(dead_code)]
    pub sink: W,
    /// Not yet written of the current write (its first bytes are in the
    /// pipe), with its id; its queued size is still counted in full.
    pub current: Option<(StdinOp, usize)>,
    pub ops: mpsc::UnboundedReceiver<StdinOp>,
}

/// Feeds queued writes into `sink` in order until stdin is closed, the child
/// closes its end, or `stop` fires (the process exited). When `freeze`
/// fires (before `stop` or with it), stops between two write(2)s and
/// returns what it holds, so no byte is written twice or lost.
pub(crate) async fn run_writer<W>(
    mut sink: W,
    mut ops: mpsc::UnboundedReceiver<StdinOp>,
    stop: CancellationToken,
    freeze: CancellationToken,
    events: impl StdinEvents,
) -> Option<FrozenWriter<W>>
where
    W: AsyncWrite + Unpin,
{
    let mut failure = None;
    while failure.is_none() {
        let op = tokio::select! {
            biased;
            // The freeze first: an exit the pump records as it freezes
            // must not have the writer close its pipe (its lock may be
            // held, and the exec would wait on this thread).
            _ = freeze.cancelled() => return Some(FrozenWriter { sink, current: None, ops }),
            _ = stop.cancelled() => { failure = Some(WriteFailure::Exited); break; }
            op = ops.recv() => op,
        };
        match op {
            None => break,
            Some(StdinOp::Write { data, id, done }) => {
                let mut at = 0;
                let written = loop {
                    if at == data.len() {
                        break sink.flush().await.map_err(|_| WriteFailure::Closed);
                    }
                    // A write(2) that has not happened is dropped whole:
                    // what `at` counts is exactly what the child was given.
                    tokio::select! {
                        biased;
                        _ = freeze.cancelled() => {
                            let current = StdinOp::Write { data, id, done };
                            return Some(FrozenWriter { sink, current: Some((current, at)), ops });
                        }
                        _ = stop.cancelled() => break Err(WriteFailure::Exited),
                        result = sink.write(&data[at..]) => match result {
                            Ok(0) | Err(_) => break Err(WriteFailure::Closed),
                            Ok(n) => at += n,
                        },
                    }
                };
                events.dequeued(data.len());
                match written {
                    Ok(()) => crate::metrics::bytes_in(data.len()),
                    Err(why) => failure = Some(why),
                }
                done.send_replace(Some(written));
            }
            Some(StdinOp::Close { eof, done }) => {
                if let Some(bytes) = &eof {
                    // A terminal whose input is full holds this write:
                    // a freeze takes the close over whole (a write that
                    // has not happened is dropped whole).
                    let frozen = tokio::select! {
                        biased;
                        _ = freeze.cancelled() => true,
                        _ = write_all(&mut sink, bytes) => false,
                    };
                    if frozen {
                        let current = StdinOp::Close { eof, done };
                        return Some(FrozenWriter {
                            sink,
                            current: Some((current, 0)),
                            ops,
                        });
                    }
                }
                let _ = done.send(());
                break;
            }
        }
    }
    if failure == Some(WriteFailure::Closed) {
        events.child_closed();
    }
    drop(sink);
    // Whatever is still queued can no longer be written.
    ops.close();
    let answer = failure.unwrap_or(WriteFailure::Closed);
    while let Ok(op) = ops.try_recv() {
        match op {
            StdinOp::Write { data, done, .. } => {
                events.dequeued(data.len());
                done.send_replace(Some(Err(answer)));
            }
            StdinOp::Close { done, .. } => {
                let _ = done.send(());
            }
        }
    }
    None
}

async fn write_all<W: AsyncWrite + Unpin>(sink: &mut W, data: &[u8]) -> io::Result<()> {
    sink.write_all(data).await?;
    sink.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_ids_remember_the_most_recent_4096_finished_ones() {
        let mut ids = WriteIds::default();
        let (_done, finished) = watch::channel(Some(Ok(())));
        for n in 0..=REMEMBERED_WRITE_IDS {
            ids.insert(&format!("w{n}"), finished.clone());
        }
        assert!(ids.get("w0").is_none());
        assert!(ids.get("w1").is_some());
        assert!(ids.get(&format!("w{REMEMBERED_WRITE_IDS}")).is_some());
        ids.forget("w1");
        assert!(ids.get("w1").is_none());
    }

    struct NoEvents;

    impl StdinEvents for NoEvents {
        fn dequeued(&self, _: usize) {}
        fn child_closed(&self) {}
    }

    #[test]
    fn a_freeze_stops_between_two_writes_and_says_what_is_left() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            // A child that has read nothing: 4 bytes fit.
            let (sink, mut child) = tokio::io::duplex(4);
            let (ops, queue) = mpsc::unbounded_channel();
            let (freeze, stop) = (CancellationToken::new(), CancellationToken::new());
            let writer = tokio::spawn(run_writer(sink, queue, stop, freeze.clone(), NoEvents));
            let (done, _outcome) = watch::channel(None);
            let data = Bytes::from_static(b"0123456789");
            let _ = ops.send(StdinOp::Write {
                data,
                id: "w1".into(),
                done,
            });
            let (second, _) = watch::channel(None);
            let _ = ops.send(StdinOp::Write {
                data: Bytes::from_static(b"next"),
                id: "w2".into(),
                done: second,
            });
            let mut read = [0u8; 4];
            tokio::io::AsyncReadExt::read_exact(&mut child, &mut read)
                .await
                .expect("read");
            assert_eq!(&read, b"0123");
            // Read, so the writer may have written 4 more: whatever it did
            // is what `at` says.
            tokio::task::yield_now().await;
            freeze.cancel();
            let mut frozen = writer.await.expect("join").expect("frozen");
            let Some((StdinOp::Write { data, id, .. }, at)) = frozen.current.take() else {
                panic!("the write in progress is handed over");
            };
            assert_eq!(id, "w1");
            let mut given = Vec::new();
            drop(frozen.sink);
            tokio::io::AsyncReadExt::read_to_end(&mut child, &mut given)
                .await
                .expect("read");
            assert_eq!([&read[..], &given[..]].concat(), data[..at].to_vec());
            let Ok(StdinOp::Write { id, .. }) = frozen.ops.try_recv() else {
                panic!("the queued write is handed over");
            };
            assert_eq!(id, "w2");
        });
    }

    #[test]
    fn ids_of_queued_writes_are_never_forgotten() {
        let mut ids = WriteIds::default();
        let (_pending_done, pending) = watch::channel(None);
        let (_done, finished) = watch::channel(Some(Ok(())));
        ids.insert("queued", pending);
        for n in 0..REMEMBERED_WRITE_IDS + 10 {
            ids.insert(&format!("w{n}"), finished.clone());
        }
        assert!(ids.get("queued").is_some());
        assert!(ids.get("w0").is_none());
    }
}
