//! A proxy between a Cap'n Proto client and its server (Unix sockets or
//! TCP) that counts round trips, can delay or hold the server's answers,
//! can freeze the path (both sockets stay open, nothing is forwarded
//! either way, as on a network path that went silent behind a box that
//! answers TCP keepalives), and can cut every connection and refuse new
//! ones until restored.
//!
//! Round trips are counted causally, not timed: a call the client sends
//! opens a new *flight* only if the proxy has delivered something from the
//! server since the previous flight began, because only then can the call
//! depend on an answer. Calls sent back to back, pipelined on answers not yet
//! received, share one flight however the scheduler interleaves them.
//!
//! Shared by the tests, `examples/pipelining.rs` and the benchmarks.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use capexec::net::Address;
use capnp_rpc::rpc_capnp::message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{mpsc, watch};
use tokio::task::AbortHandle;
use tokio::time::Instant;

type Reader = Pin<Box<dyn AsyncRead + Send>>;
type Writer = Pin<Box<dyn AsyncWrite + Send>>;

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
    /// Returns from server to client, counted as they reach the proxy
    /// (delivered or held).
    returns: AtomicU64,
}

pub struct Proxy {
    address: Address,
    counters: Arc<Counters>,
    /// While `false`, the server's messages are held back.
    gate: watch::Sender<bool>,
    /// While `false`, the client's messages are held back.
    upload_gate: watch::Sender<bool>,
    /// While set, connections are cut and new ones refused.
    cut: Arc<AtomicBool>,
    /// The pumps of the live connections, so a cut can end them.
    pumps: Arc<Mutex<Vec<AbortHandle>>>,
    task: tokio::task::JoinHandle<()>,
}

enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl Proxy {
    /// Listens on the Unix socket `listen` and forwards each connection to
    /// the one at `target`; each message waits `delay` in each direction.
    pub fn start(listen: &Path, target: &Path, delay: Duration) -> std::io::Result<Proxy> {
        let listener = Listener::Unix(UnixListener::bind(listen)?);
        let address = Address::Unix(listen.to_path_buf());
        Ok(Proxy::serve(
            listener,
            address,
            Address::Unix(target.to_path_buf()),
            delay,
        ))
    }

    /// A proxy in front of `target` (Unix or TCP), listening the same way
    /// (a socket in `dir`, or loopback TCP on a free port).
    pub async fn in_front_of(
        target: &Address,
        dir: &Path,
        delay: Duration,
    ) -> std::io::Result<Proxy> {
        let (listener, address) = match target {
            Address::Unix(_) => {
                let path = dir.join("proxy.sock");
                (
                    Listener::Unix(UnixListener::bind(&path)?),
                    Address::Unix(path),
                )
            }
            Address::Tcp { .. } => {
                let listener = TcpListener::bind("127.0.0.1:0").await?;
                let local: SocketAddr = listener.local_addr()?;
                (Listener::Tcp(listener), Address::from_socket_addr(local))
            }
        };
        Ok(Proxy::serve(listener, address, target.clone(), delay))
    }

    fn serve(listener: Listener, address: Address, target: Address, delay: Duration) -> Proxy {
        let counters = Arc::new(Counters {
            answered: AtomicBool::new(true),
            ..Counters::default()
        });
        let (gate, gate_watch) = watch::channel(true);
        let (upload_gate, upload_watch) = watch::channel(true);
        let cut = Arc::new(AtomicBool::new(false));
        let pumps = Arc::new(Mutex::new(Vec::new()));
        let shared = Arc::clone(&counters);
        let (refusing, live) = (Arc::clone(&cut), Arc::clone(&pumps));
        let task = tokio::spawn(async move {
            loop {
                let client = match accept(&listener).await {
                    Ok(client) => client,
                    Err(_) => return,
                };
                if refusing.load(Ordering::SeqCst) {
                    continue;
                }
                let Ok(server) = dial(&target).await else {
                    continue;
                };
                let (client_read, client_write) = client;
                let (server_read, server_write) = server;
                let raw = Arc::new(AtomicBool::new(false));
                let to_server = tokio::spawn(pump(
                    client_read,
                    server_write,
                    delay,
                    Direction::ToServer,
                    Arc::clone(&shared),
                    upload_watch.clone(),
                    Arc::clone(&raw),
                ));
                let to_client = tokio::spawn(pump(
                    server_read,
                    client_write,
                    delay,
                    Direction::ToClient,
                    Arc::clone(&shared),
                    gate_watch.clone(),
                    raw,
                ));
                let mut live = live.lock().unwrap_or_else(|p| p.into_inner());
                live.push(to_server.abort_handle());
                live.push(to_client.abort_handle());
            }
        });
        Proxy {
            address,
            counters,
            gate,
            upload_gate,
            cut,
            pumps,
            task,
        }
    }

    /// Where clients connect.
    pub fn address(&self) -> &Address {
        &self.address
    }

    pub fn path(&self) -> &Path {
        match &self.address {
            Address::Unix(path) => path,
            Address::Tcp { .. } => panic!("a TCP proxy has no path"),
        }
    }

    /// Breaks every connection through the proxy and refuses new ones
    /// until [`Proxy::restore`].
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        let live: Vec<AbortHandle> = self
            .pumps
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect();
        for pump in live {
            pump.abort();
        }
    }

    /// Accepts connections again after a [`Proxy::cut`].
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    pub fn calls(&self) -> u64 {
        self.counters.calls.load(Ordering::SeqCst)
    }

    pub fn flights(&self) -> u64 {
        self.counters.flights.load(Ordering::SeqCst)
    }

    /// Returns the server has sent, held ones included.
    pub fn returns(&self) -> u64 {
        self.counters.returns.load(Ordering::SeqCst)
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

    /// Freezes (`true`) or thaws (`false`) the path: while frozen, nothing
    /// is forwarded in either direction, on live connections or new ones,
    /// and every socket stays open. What was held is delivered on thawing.
    pub fn set_frozen(&self, frozen: bool) {
        self.gate.send_replace(!frozen);
        self.upload_gate.send_replace(!frozen);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut();
        if let Address::Unix(path) = &self.address {
            let _ = std::fs::remove_file(path);
        }
    }
}

async fn accept(listener: &Listener) -> std::io::Result<(Reader, Writer)> {
    Ok(match listener {
        Listener::Unix(listener) => {
            let (stream, _) = listener.accept().await?;
            let (read, write) = stream.into_split();
            (Box::pin(read), Box::pin(write))
        }
        Listener::Tcp(listener) => {
            let (stream, _) = listener.accept().await?;
            stream.set_nodelay(true)?;
            let (read, write) = stream.into_split();
            (Box::pin(read), Box::pin(write))
        }
    })
}

async fn dial(target: &Address) -> std::io::Result<(Reader, Writer)> {
    Ok(match target {
        Address::Unix(path) => {
            let (read, write) = UnixStream::connect(path).await?.into_split();
            (Box::pin(read), Box::pin(write))
        }
        Address::Tcp { host, port } => {
            let stream = TcpStream::connect((host.as_str(), *port)).await?;
            stream.set_nodelay(true)?;
            let (read, write) = stream.into_split();
            (Box::pin(read), Box::pin(write))
        }
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToServer,
    ToClient,
}

/// Reads whole messages from `from`, notes them, and has them written to
/// `to` once their delay has passed and the gate of their direction is
/// open, in order.
async fn pump(
    mut from: Reader,
    to: Writer,
    delay: Duration,
    direction: Direction,
    counters: Arc<Counters>,
    gate: watch::Receiver<bool>,
    raw: Arc<AtomicBool>,
) {
    let (queue, queued) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    // Reading and delivering both belong to this task, so that aborting it
    // (a cut) ends both and closes both sockets.
    let writer = deliver(queued, to, direction, Arc::clone(&counters), gate);
    let reader = async move {
        let mut buffer = Vec::with_capacity(64 * 1024);
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            let read = match from.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(read) => read,
            };
            let now = Instant::now();
            buffer.extend_from_slice(&chunk[..read]);
            // A direct channel (capexec::net::CHANNEL_MAGIC) is no Cap'n
            // Proto stream, nor is TLS (a ClientHello's record begins 22,
            // 3): their bytes go on as they come both ways, uncounted.
            // (The server answers only after the magic or the hello.)
            if direction == Direction::ToServer
                && (buffer.starts_with(&capexec::net::CHANNEL_MAGIC[..4])
                    || buffer.starts_with(&[22, 3]))
            {
                raw.store(true, Ordering::SeqCst);
            }
            if raw.load(Ordering::SeqCst) {
                if queue
                    .send((now + delay, std::mem::take(&mut buffer)))
                    .is_err()
                {
                    return;
                }
                continue;
            }
            while let Some(length) = framed_length(&buffer) {
                let message: Vec<u8> = buffer.drain(..length).collect();
                match (direction, kind(&message)) {
                    (Direction::ToServer, Kind::Call) => {
                        counters.calls.fetch_add(1, Ordering::SeqCst);
                        if counters.answered.swap(false, Ordering::SeqCst) {
                            counters.flights.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    (Direction::ToClient, Kind::Return) => {
                        counters.returns.fetch_add(1, Ordering::SeqCst);
                    }
                    _ => {}
                }
                if queue.send((now + delay, message)).is_err() {
                    return;
                }
            }
        }
    };
    tokio::join!(reader, writer);
}

async fn deliver(
    mut queued: mpsc::UnboundedReceiver<(Instant, Vec<u8>)>,
    mut to: Writer,
    direction: Direction,
    counters: Arc<Counters>,
    mut gate: watch::Receiver<bool>,
) {
    while let Some((due, message)) = queued.recv().await {
        tokio::time::sleep_until(due).await;
        if gate.wait_for(|open| *open).await.is_err() {
            return;
        }
        if direction == Direction::ToClient {
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

/// What a framed RPC message is, as far as the counters care.
enum Kind {
    /// A call or a bootstrap request.
    Call,
    Return,
    Other,
}

fn kind(mut bytes: &[u8]) -> Kind {
    let Ok(message) =
        capnp::serialize::read_message_from_flat_slice(&mut bytes, Default::default())
    else {
        return Kind::Other;
    };
    let Ok(root) = message.get_root::<message::Reader<'_>>() else {
        return Kind::Other;
    };
    match root.which() {
        Ok(message::Call(_)) | Ok(message::Bootstrap(_)) => Kind::Call,
        Ok(message::Return(_)) => Kind::Return,
        _ => Kind::Other,
    }
}
