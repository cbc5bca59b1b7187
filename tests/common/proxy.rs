//! A Unix-socket proxy between a Cap'n Proto client and its server that
//! counts round trips, and can delay or hold the server's answers.
//!
//! Round trips are counted causally, not timed: a call the client sends
//! opens a new *flight* only if the proxy has delivered something from the
//! server since the previous flight began, because only then can the call
//! depend on an answer. Calls sent back to back, pipelined on answers not yet
//! received, share one flight however the scheduler interleaves them.
//!
//! Shared by the tests and `examples/pipelining.rs`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use capnp_rpc::rpc_capnp::message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What the proxy has seen, over all its connections.
#[derive(Default)]
struct Counters {
    /// Calls (and bootstraps) from client to server.
    calls: AtomicU64,
    /// Client-to-server flights that carried at least one call.
    flights: AtomicU64,
    /// Something from the server reached the client since the last flight
    /// began (true at the start: the first call opens a flight).
    answered: AtomicBool,
}

pub struct Proxy {
    path: PathBuf,
    counters: Arc<Counters>,
    /// While `false`, the server's messages are held back.
    gate: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on `listen` and forwards each connection to `target`; each
    /// message waits `delay` in each direction.
    pub fn start(listen: &Path, target: &Path, delay: Duration) -> std::io::Result<Proxy> {
        let listener = UnixListener::bind(listen)?;
        let counters = Arc::new(Counters {
            answered: AtomicBool::new(true),
            ..Counters::default()
        });
        let (gate, gate_watch) = watch::channel(true);
        let target = target.to_path_buf();
        let shared = Arc::clone(&counters);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = UnixStream::connect(&target).await else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(pump(
                    client_read,
                    server_write,
                    delay,
                    Direction::ToServer,
                    Arc::clone(&shared),
                    gate_watch.clone(),
                ));
                tokio::spawn(pump(
                    server_read,
                    client_write,
                    delay,
                    Direction::ToClient,
                    Arc::clone(&shared),
                    gate_watch.clone(),
                ));
            }
        });
        Ok(Proxy {
            path: listen.to_path_buf(),
            counters,
            gate,
            task,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn calls(&self) -> u64 {
        self.counters.calls.load(Ordering::SeqCst)
    }

    pub fn flights(&self) -> u64 {
        self.counters.flights.load(Ordering::SeqCst)
    }

    /// Starts counting afresh.
    pub fn reset(&self) {
        self.counters.calls.store(0, Ordering::SeqCst);
        self.counters.flights.store(0, Ordering::SeqCst);
        self.counters.answered.store(true, Ordering::SeqCst);
    }

    /// Holds (`false`) or releases (`true`) the server's messages.
    pub fn set_open(&self, open: bool) {
        self.gate.send_replace(open);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToServer,
    ToClient,
}

/// Reads whole messages from `from`, notes them, and has them written to
/// `to` once their delay has passed (and, toward the client, the gate is
/// open), in order.
async fn pump(
    mut from: tokio::net::unix::OwnedReadHalf,
    to: tokio::net::unix::OwnedWriteHalf,
    delay: Duration,
    direction: Direction,
    counters: Arc<Counters>,
    gate: watch::Receiver<bool>,
) {
    let (queue, queued) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(deliver(queued, to, direction, Arc::clone(&counters), gate));
    let mut buffer = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let read = match from.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        let now = Instant::now();
        buffer.extend_from_slice(&chunk[..read]);
        while let Some(length) = framed_length(&buffer) {
            let message: Vec<u8> = buffer.drain(..length).collect();
            if direction == Direction::ToServer && is_call(&message) {
                counters.calls.fetch_add(1, Ordering::SeqCst);
                if counters.answered.swap(false, Ordering::SeqCst) {
                    counters.flights.fetch_add(1, Ordering::SeqCst);
                }
            }
            if queue.send((now + delay, message)).is_err() {
                return;
            }
        }
    }
    drop(queue);
    let _ = writer.await;
}

async fn deliver(
    mut queued: mpsc::UnboundedReceiver<(Instant, Vec<u8>)>,
    mut to: tokio::net::unix::OwnedWriteHalf,
    direction: Direction,
    counters: Arc<Counters>,
    mut gate: watch::Receiver<bool>,
) {
    while let Some((due, message)) = queued.recv().await {
        tokio::time::sleep_until(due).await;
        if direction == Direction::ToClient {
            if gate.wait_for(|open| *open).await.is_err() {
                return;
            }
            // Before the write: the client may answer before it returns.
            counters.answered.store(true, Ordering::SeqCst);
        }
        if to.write_all(&message).await.is_err() {
            return;
        }
    }
    let _ = to.shutdown().await;
}

/// Length of the first whole message in `buffer` (Cap'n Proto stream
/// framing: segment count - 1, segment sizes in words, padding to 8 bytes,
/// then the segments), if it is all there.
fn framed_length(buffer: &[u8]) -> Option<usize> {
    let word = |index: usize| -> Option<usize> {
        let bytes = buffer.get(index * 4..index * 4 + 4)?;
        Some(u32::from_le_bytes(bytes.try_into().ok()?) as usize)
    };
    let segments = word(0)? + 1;
    let header = (4 * (1 + segments)).div_ceil(8) * 8;
    let mut length = header;
    for segment in 0..segments {
        length += word(1 + segment)? * 8;
    }
    (buffer.len() >= length).then_some(length)
}

/// Whether a framed RPC message is a call (or a bootstrap request).
fn is_call(mut bytes: &[u8]) -> bool {
    let Ok(message) =
        capnp::serialize::read_message_from_flat_slice(&mut bytes, Default::default())
    else {
        return false;
    };
    let Ok(root) = message.get_root::<message::Reader<'_>>() else {
        return false;
    };
    matches!(
        root.which(),
        Ok(message::Call(_)) | Ok(message::Bootstrap(_))
    )
}
