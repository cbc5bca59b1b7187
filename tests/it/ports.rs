//! Ports through an executor (`Executor.dial`, `Executor.listen`): bytes
//! both ways exactly, half-close kept in each direction, resets read as
//! errors, a slow reader holding the writer back, listeners that take
//! their connections with them, and a restricted executor's address rule.
//! Every backend: through the chain the far server opens the sockets.

use crate::common;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use capexec::capexec_capnp::executor;
use capexec::client::{self, Error, PortStream};
use capexec::model::{Policy, PortPolicy, RefusalKind};
use common::Ctx;
use common::data::{Pattern, TempDir};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A TCP peer on loopback, on the test's side, and its address.
pub(crate) async fn peer() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a peer");
    let address = format!("tcp:{}", listener.local_addr().expect("address"));
    (listener, address)
}

/// A dial through the sinks, or through a direct channel where the test
/// runs with one ([`common::run_direct`]).
async fn dial(ctx: &Ctx, address: &str) -> PortStream {
    client::dial_via(&ctx.executor, address, ctx.dial_route.as_ref())
        .await
        .expect("dial")
}

fn chained(ctx: &Ctx) -> bool {
    ctx.backend == common::Backend::Chained
}

fn sha(bytes: &[u8]) -> Vec<u8> {
    Sha256::digest(bytes).to_vec()
}

/// Reads to the end, in whatever pieces arrive.
pub(crate) async fn read_all<R: tokio::io::AsyncRead + Unpin>(
    reader: &mut R,
) -> std::io::Result<Vec<u8>> {
    let mut all = Vec::new();
    reader.read_to_end(&mut all).await?;
    Ok(all)
}

async fn bulk_transfer_both_ways_at_once_is_byte_exact(ctx: Ctx) {
    const SIZE: usize = 8 << 20;
    let up = Arc::new(Pattern::bytes(1, SIZE));
    let down = Arc::new(Pattern::bytes(2, SIZE + 12_345));
    let (listener, address) = peer().await;
    let peer_down = Arc::clone(&down);
    let far = tokio::spawn(async move {
        let (socket, _) = listener.accept().await.expect("accept");
        let (mut read, mut write) = socket.into_split();
        let sending = async {
            write.write_all(&peer_down).await.expect("peer writes");
            write.shutdown().await.expect("peer half-closes");
        };
        let (_, got) = tokio::join!(sending, read_all(&mut read));
        sha(&got.expect("peer reads"))
    });
    let stream = dial(&ctx, &address).await;
    // Granted wherever it was asked for and the server dials itself.
    assert_eq!(
        stream.is_direct(),
        ctx.dial_route.is_some() && !chained(&ctx)
    );
    assert!(
        stream.info().peer.starts_with("tcp:127.0.0.1:"),
        "{:?}",
        stream.info()
    );
    let (mut read, mut write) = tokio::io::split(stream);
    let sending = async {
        write.write_all(&up).await.expect("write");
        write.shutdown().await.expect("half-close");
    };
    let (_, got) = tokio::join!(sending, read_all(&mut read));
    let got = got.expect("read");
    assert_eq!(got.len(), down.len());
    assert_eq!(sha(&got), sha(&down));
    assert_eq!(far.await.expect("peer"), sha(&up));
}

/// Small writes are gathered into bigger messages: they must still go
/// out without a flush once the writer waits, whole and in order.
async fn small_writes_arrive_whole_in_order_and_without_a_flush(ctx: Ctx) {
    let (listener, address) = peer().await;
    let far = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.expect("accept");
        let mut question = [0u8; 5];
        socket.read_exact(&mut question).await.expect("peer reads");
        assert_eq!(&question, b"hello");
        socket.write_all(b"world").await.expect("peer answers");
        sha(&read_all(&mut socket).await.expect("peer reads the rest"))
    });
    let mut stream = dial(&ctx, &address).await;
    // A question and its answer, with no flush in between.
    stream.write_all(b"hello").await.expect("write");
    let mut answer = [0u8; 5];
    stream
        .read_exact(&mut answer)
        .await
        .expect("read the answer");
    assert_eq!(&answer, b"world");
    // Writes of every size around the gathering's bounds, 6 MiB in all.
    let all = Pattern::bytes(3, 6 << 20);
    let sizes = [
        1, 7, 4095, 4096, 4097, 8192, 65_535, 65_536, 100_000, 262_144, 300_000,
    ];
    let (mut offset, mut turn) = (0, 0);
    while offset < all.len() {
        let end = (offset + sizes[turn % sizes.len()]).min(all.len());
        stream.write_all(&all[offset..end]).await.expect("write");
        offset = end;
        turn += 1;
        // A flush now and then, among gathered writes and whole ones.
        if turn % 7 == 0 {
            stream.flush().await.expect("flush");
        }
    }
    stream.shutdown().await.expect("half-close");
    assert_eq!(far.await.expect("peer"), sha(&all));
}

async fn half_close_is_kept_in_each_direction(ctx: Ctx) {
    let (listener, address) = peer().await;
    // The client ends first; the peer answers after reading its end.
    let far = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.expect("accept");
        let got = read_all(&mut socket).await.expect("peer reads");
        socket.write_all(b"after your end: ").await.expect("write");
        socket.write_all(&got).await.expect("write");
        socket.shutdown().await.expect("shutdown");
        let (mut socket, _) = listener.accept().await.expect("accept again");
        // Now the peer ends first and then reads.
        socket.write_all(b"hello").await.expect("write");
        socket.shutdown().await.expect("shutdown");
        read_all(&mut socket).await.expect("peer reads")
    });
    let mut stream = dial(&ctx, &address).await;
    stream.write_all(b"question").await.expect("write");
    stream.shutdown().await.expect("half-close");
    assert_eq!(
        read_all(&mut stream).await.expect("read"),
        b"after your end: question"
    );
    let mut stream = dial(&ctx, &address).await;
    assert_eq!(read_all(&mut stream).await.expect("read"), b"hello");
    stream
        .write_all(b"still talking")
        .await
        .expect("write after end of file");
    stream.shutdown().await.expect("half-close");
    assert_eq!(far.await.expect("peer"), b"still talking");
}

async fn resets_reach_the_other_end_as_errors(ctx: Ctx) {
    let (listener, address) = peer().await;
    // The peer resets: the client reads an error, not end of file.
    let far = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.expect("accept");
        // Only once the client is connected (else it is its connect that
        // is reset).
        let mut go = [0u8; 1];
        socket.read_exact(&mut go).await.expect("the client's byte");
        socket2::SockRef::from(&socket)
            .set_linger(Some(Duration::ZERO))
            .expect("linger");
        socket.write_all(b"partial").await.expect("write");
        drop(socket);
        // Then the client drops its stream mid-way: the peer reads a reset.
        let (mut socket, _) = listener.accept().await.expect("accept again");
        let mut got = Vec::new();
        socket.read_to_end(&mut got).await.map(|_| got)
    });
    let mut stream = dial(&ctx, &address).await;
    stream.write_all(b"!").await.expect("write");
    stream.flush().await.expect("flush");
    let mut got = Vec::new();
    let error = stream
        .read_to_end(&mut got)
        .await
        .expect_err("a reset is an error");
    assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}");
    assert!(error.to_string().contains("reset"), "{error}");
    assert_eq!(got, b"partial"[..got.len()]);
    // Writing after the reset fails too.
    let mut failed = false;
    for _ in 0..100 {
        if stream.write_all(b"x").await.is_err() || stream.flush().await.is_err() {
            failed = true;
            break;
        }
    }
    assert!(failed, "writes after a reset fail");

    let mut stream = dial(&ctx, &address).await;
    stream.write_all(b"half a message").await.expect("write");
    stream
        .flush()
        .await
        .expect("flushed: the peer has the bytes");
    drop(stream);
    let error = far
        .await
        .expect("peer")
        .expect_err("the peer reads a reset");
    assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}");
}

/// Polls `counter` until it stops moving (for several checks in a row):
/// a writer stalled by flow control.
async fn wait_until_stalled(counter: &AtomicU64) -> u64 {
    let mut last = u64::MAX;
    let mut still = 0;
    loop {
        let now = counter.load(Ordering::SeqCst);
        if now == last && now > 0 {
            still += 1;
            if still == 5 {
                return now;
            }
        } else {
            still = 0;
        }
        last = now;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Far more than any hop's window and the kernel's buffers hold.
const FLOOD: usize = 96 << 20;

/// The most a stalled writer may have got rid of: socket buffers at both
/// ends (a few MiB each on loopback) and each hop's window.
const STALL_BOUND: u64 = 32 << 20;

/// The peer writes `chunk` over and over, [`FLOOD`] bytes in all, then
/// half-closes; the counter says how much the kernel took so far.
fn flood_from_peer(
    mut far: TcpStream,
    chunk: Vec<u8>,
) -> (Arc<AtomicU64>, tokio::task::JoinHandle<()>) {
    let sent = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&sent);
    let writer = tokio::spawn(async move {
        while (counter.load(Ordering::SeqCst) as usize) < FLOOD {
            far.write_all(&chunk).await.expect("peer writes");
            counter.fetch_add(chunk.len() as u64, Ordering::SeqCst);
        }
        far.shutdown().await.expect("peer half-closes");
    });
    (sent, writer)
}

async fn a_slow_reader_holds_the_writer_back(ctx: Ctx) {
    let chunk = Pattern::bytes(3, 64 * 1024);
    let (listener, address) = peer().await;
    let (accepted_tx, accepted_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (socket, _) = listener.accept().await.expect("accept");
        let _ = accepted_tx.send(socket);
    });
    let stream = dial(&ctx, &address).await;
    let mut far = accepted_rx.await.expect("accepted");

    // Client to peer: the peer does not read, so the client's writes stop.
    let written = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&written);
    let chunk_copy = chunk.clone();
    let (mut read_half, mut write_half) = tokio::io::split(stream);
    let writer = tokio::task::spawn_local(async move {
        while (counter.load(Ordering::SeqCst) as usize) < FLOOD {
            write_half.write_all(&chunk_copy).await.expect("write");
            counter.fetch_add(chunk_copy.len() as u64, Ordering::SeqCst);
        }
        write_half.shutdown().await.expect("half-close");
        write_half
    });
    let stalled = wait_until_stalled(&written).await;
    assert!(
        stalled < STALL_BOUND,
        "the writer got {stalled} bytes out to a peer that does not read"
    );
    // Once the peer reads, everything arrives, in order.
    let mut got = 0usize;
    let mut buffer = vec![0u8; 256 * 1024];
    loop {
        let n = far.read(&mut buffer).await.expect("peer reads");
        if n == 0 {
            break;
        }
        for (index, byte) in buffer[..n].iter().enumerate() {
            assert_eq!(
                *byte,
                chunk[(got + index) % chunk.len()],
                "byte {}",
                got + index
            );
        }
        got += n;
    }
    assert_eq!(got, FLOOD);
    let write_half = writer.await.expect("writer");

    // Peer to client: the client does not read, so the peer's writes stop.
    let (sent, peer_writer) = flood_from_peer(far, chunk.clone());
    let stalled = wait_until_stalled(&sent).await;
    assert!(
        stalled < STALL_BOUND,
        "the peer got {stalled} bytes out to a client that does not read"
    );
    let all = read_all(&mut read_half).await.expect("read");
    assert_eq!(all.len(), FLOOD);
    assert!(
        all.chunks(chunk.len())
            .all(|piece| piece == &chunk[..piece.len()])
    );
    peer_writer.await.expect("peer writer");
    drop(read_half.unsplit(write_half));
}

/// Checks `bytes`, which begin at `offset` of a stream of `chunk` over
/// and over, a piece at a time.
fn assert_repeats(chunk: &[u8], offset: usize, bytes: &[u8]) {
    let mut at = 0;
    while at < bytes.len() {
        let start = (offset + at) % chunk.len();
        let take = (chunk.len() - start).min(bytes.len() - at);
        assert!(
            bytes[at..at + take] == chunk[start..start + take],
            "bytes {}..{} differ",
            offset + at,
            offset + at + take
        );
        at += take;
    }
}

/// A reader that looks at what arrived (`fill_buf`) without consuming it
/// holds the far writer back as one that does not read at all; the same
/// bytes are handed out until consumed, then everything, in order.
async fn bytes_handed_out_hold_the_writer_back_until_consumed(ctx: Ctx) {
    use tokio::io::AsyncBufReadExt;
    let chunk = Pattern::bytes(4, 64 * 1024);
    let (listener, address) = peer().await;
    let stream = dial(&ctx, &address).await;
    let (far, _) = listener.accept().await.expect("accept");
    let (mut reading, writing) = stream.into_split();
    let (sent, peer_writer) = flood_from_peer(far, chunk.clone());
    let first = reading.fill_buf().await.expect("fill").to_vec();
    assert!(!first.is_empty());
    assert_repeats(&chunk, 0, &first);
    let stalled = wait_until_stalled(&sent).await;
    assert!(
        stalled < STALL_BOUND,
        "the peer got {stalled} bytes out to a client that consumes nothing"
    );
    assert_eq!(reading.fill_buf().await.expect("fill again"), &first[..]);
    // Consumed in pieces that end anywhere in what was handed out.
    let mut got = 0usize;
    loop {
        let bytes = reading.fill_buf().await.expect("fill");
        if bytes.is_empty() {
            break;
        }
        let take = bytes.len().min(12_345);
        assert_repeats(&chunk, got, &bytes[..take]);
        reading.consume(take);
        got += take;
    }
    assert_eq!(got, FLOOD);
    peer_writer.await.expect("peer writer");
    drop((reading, writing));
}

/// The halves of a split stream live on their own: the writing half
/// still writes and half-closes once the reading half is gone, whose
/// unread bytes then hold the far writer back; dropping the writing half
/// too releases the connection, and the peer reads a reset.
async fn a_dropped_reading_half_leaves_the_writing_half_working(ctx: Ctx) {
    let (listener, address) = peer().await;
    let stream = dial(&ctx, &address).await;
    let (mut far, _) = listener.accept().await.expect("accept");
    let (mut reading, mut writing) = stream.into_split();
    far.write_all(b"first").await.expect("peer writes");
    let mut first = [0u8; 5];
    reading.read_exact(&mut first).await.expect("read");
    assert_eq!(&first, b"first");
    drop(reading);
    writing.write_all(b"still writing").await.expect("write");
    writing.shutdown().await.expect("half-close");
    let mut got = [0u8; 13];
    far.read_exact(&mut got).await.expect("peer reads");
    assert_eq!(&got, b"still writing");
    assert_eq!(
        far.read(&mut got).await.expect("the end of file"),
        0,
        "the client's direction ended"
    );
    let (far_read, mut far_write) = far.into_split();
    let sent = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&sent);
    let peer_writer = tokio::spawn(async move {
        let chunk = vec![b'p'; 64 * 1024];
        loop {
            if let Err(error) = far_write.write_all(&chunk).await {
                return error;
            }
            counter.fetch_add(chunk.len() as u64, Ordering::SeqCst);
        }
    });
    let stalled = wait_until_stalled(&sent).await;
    assert!(
        stalled < STALL_BOUND,
        "the peer got {stalled} bytes out to a client that reads no more"
    );
    assert!(
        !peer_writer.is_finished(),
        "the peer was reset, not held back"
    );
    drop(writing);
    let error = peer_writer.await.expect("peer writer");
    assert!(
        matches!(
            error.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        ),
        "the peer's writes fail once the connection is released: {error}"
    );
    drop(far_read);
}

async fn releasing_a_listener_closes_its_socket_and_connections(ctx: Ctx) {
    let mut listener = client::listen(&ctx.executor, "tcp:127.0.0.1:0")
        .await
        .expect("listen");
    let address = listener.address().to_string();
    let port: u16 = address
        .rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .expect("a port chosen");
    assert_ne!(port, 0);
    let mut outside = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let mut accepted = listener.accept().await.expect("a connection");
    assert_eq!(
        accepted.info().peer,
        format!("tcp:{}", outside.local_addr().expect("address"))
    );
    outside.write_all(b"ping").await.expect("write");
    let mut four = [0u8; 4];
    accepted.read_exact(&mut four).await.expect("read");
    assert_eq!(&four, b"ping");
    accepted.write_all(b"pong").await.expect("write");
    outside.read_exact(&mut four).await.expect("read");
    assert_eq!(&four, b"pong");

    drop(listener);
    // The accepted connection is reset, though its stream is still held.
    let mut rest = Vec::new();
    let error = outside
        .read_to_end(&mut rest)
        .await
        .expect_err("the connection is reset");
    assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}");
    let error = read_all(&mut accepted).await.expect_err("reset here too");
    assert!(
        error.to_string().contains("listener was released"),
        "{error}"
    );
    // And nothing listens any more (polled: the release travels first).
    common::eventually_async("nothing listens", async || {
        TcpStream::connect(("127.0.0.1", port)).await.is_err()
    })
    .await;
}

async fn unix_sockets_are_dialled_and_listened_on(ctx: Ctx) {
    let dir = TempDir::new("ports-unix");
    let path = dir.path().join("app.sock");
    let address = format!("unix:{}", path.display());
    let mut listener = client::listen(&ctx.executor, &address)
        .await
        .expect("listen");
    assert_eq!(listener.address(), address);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path)
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    // A path in use is refused, and left alone.
    match client::listen(&ctx.executor, &address).await {
        Err(Error::Refused(refusal)) => {
            assert_eq!(refusal.kind, RefusalKind::SocketFailed, "{refusal}")
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("listened twice on one path"),
    }
    let mut dialled = dial(&ctx, &address).await;
    let mut accepted = listener.accept().await.expect("accepted");
    // The accepted connection names the address listened on, not the
    // private path the socket was bound at before it was moved there.
    assert_eq!(accepted.info().local, address);
    dialled.write_all(b"over unix").await.expect("write");
    dialled.shutdown().await.expect("half-close");
    assert_eq!(read_all(&mut accepted).await.expect("read"), b"over unix");
    drop(listener);
    common::eventually_async("the socket file is removed", async || !path.exists()).await;
}

pub(crate) async fn refusal(result: Result<impl Sized, Error>) -> (RefusalKind, String) {
    match result {
        Err(Error::Refused(refusal)) => (refusal.kind, refusal.message),
        Err(other) => panic!("expected a refusal, got {other}"),
        Ok(_) => panic!("the call succeeded"),
    }
}

async fn bad_addresses_and_unreachable_ones_are_refused_clearly(ctx: Ctx) {
    for bad in [
        "tcp:127.0.0.1:0",
        "udp:1.2.3.4:5",
        "unix:relative",
        "tcp:nohost",
    ] {
        let (kind, message) = refusal(client::dial(&ctx.executor, bad).await).await;
        assert_eq!(kind, RefusalKind::InvalidArgument, "{bad}: {message}");
    }
    let long = format!("unix:/{}", "a".repeat(10_000));
    let (kind, message) = refusal(client::dial(&ctx.executor, &long).await).await;
    assert_eq!(kind, RefusalKind::InvalidArgument, "{message}");
    assert!(message.len() < 300, "{message}");
    // A port nothing listens on.
    let (listener, address) = peer().await;
    drop(listener);
    let (kind, message) = refusal(client::dial(&ctx.executor, &address).await).await;
    assert_eq!(kind, RefusalKind::SocketFailed, "{message}");
    assert!(message.contains("refused"), "{message}");
}

pub(crate) fn restricted(ctx: &Ctx, ports: Option<PortPolicy>, programs: bool) -> executor::Client {
    let policy = Policy {
        programs: programs.then(|| vec!["true".into()]),
        ports,
        ..Policy::default()
    };
    client::restrict(&ctx.executor, &policy)
}

/// An executor that may dial only loopback's `port` and listen nowhere.
pub(crate) fn dial_only_to(ctx: &Ctx, port: u16) -> executor::Client {
    restricted(
        ctx,
        Some(PortPolicy {
            dial: Some(vec![format!("tcp:127.0.0.1:{port}")]),
            listen: Some(Vec::new()),
        }),
        false,
    )
}

pub(crate) fn assert_not_allowed(refused: &(RefusalKind, String), rule: &str) {
    assert_eq!(refused.0, RefusalKind::NotAllowed, "{}", refused.1);
    assert!(
        refused.1.contains(&format!("policy rule `{rule}`")),
        "the error should name `{rule}`: {}",
        refused.1
    );
}

async fn restricted_executors_allow_only_the_addresses_of_their_rule(ctx: Ctx) {
    let (listener, address) = peer().await;
    let port = listener.local_addr().expect("address").port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let _ = socket.write_all(b"inside").await;
        }
    });
    let narrow = dial_only_to(&ctx, port);
    let mut stream = client::dial_via(&narrow, &address, ctx.dial_route.as_ref())
        .await
        .expect("inside the rule");
    assert_eq!(
        stream.is_direct(),
        ctx.dial_route.is_some() && !chained(&ctx)
    );
    let mut six = [0u8; 6];
    stream.read_exact(&mut six).await.expect("read");
    assert_eq!(&six, b"inside");
    // `localhost` resolves to an address the rule allows: the same.
    client::dial_via(
        &narrow,
        &format!("tcp:localhost:{port}"),
        ctx.dial_route.as_ref(),
    )
    .await
    .map(drop)
    .or_else(|error| match &error {
        // Resolving may give ::1 only, which the rule does not name.
        Error::Refused(refusal) if refusal.kind == RefusalKind::NotAllowed => Ok(()),
        _ => Err(error),
    })
    .expect("localhost");
    let other = format!("tcp:127.0.0.1:{}", port.wrapping_add(1).max(1));
    assert_not_allowed(
        &refusal(client::dial_via(&narrow, &other, ctx.dial_route.as_ref()).await).await,
        "ports.dial",
    );
    assert_not_allowed(
        &refusal(client::listen(&narrow, "tcp:127.0.0.1:0").await).await,
        "ports.listen",
    );
    // A narrower rule cannot widen it.
    let wider = client::restrict(
        &narrow,
        &Policy {
            ports: Some(PortPolicy {
                dial: Some(vec!["tcp:*:*".into()]),
                listen: None,
            }),
            ..Policy::default()
        },
    );
    let refused = refusal(client::dial_via(&wider, &address, ctx.dial_route.as_ref()).await).await;
    assert_eq!(refused.0, RefusalKind::NotAllowed, "{}", refused.1);
    // A restriction of programs allows no address unless it names some.
    let programs_only = restricted(&ctx, None, true);
    let refused =
        refusal(client::dial_via(&programs_only, &address, ctx.dial_route.as_ref()).await).await;
    assert_not_allowed(&refused, "ports.dial");
    assert!(
        refused
            .1
            .contains("(none when a policy sets `programs` and not `ports`)"),
        "{}",
        refused.1
    );
    assert_not_allowed(
        &refusal(client::listen(&programs_only, "tcp:127.0.0.1:0").await).await,
        "ports.listen",
    );
    let info = client::info(&narrow).await.expect("info");
    assert!(
        info.features.iter().any(|feature| feature == "ports"),
        "{:?}",
        info.features
    );
}

async fn a_connection_holds_at_most_its_maximum_of_listeners(ctx: Ctx) {
    let mut held = Vec::new();
    for _ in 0..capexec::rpc::MAX_PORT_LISTENERS {
        held.push(
            client::listen(&ctx.executor, "tcp:127.0.0.1:0")
                .await
                .expect("listen"),
        );
    }
    let (kind, message) = refusal(client::listen(&ctx.executor, "tcp:127.0.0.1:0").await).await;
    assert_eq!(kind, RefusalKind::LimitReached, "{message}");
    assert!(message.contains("listeners"), "{message}");
    drop(held.pop());
    // The place given back (the release travels first: polled).
    let listener = common::eventually_async("a listener place is given back", async || {
        client::listen(&ctx.executor, "tcp:127.0.0.1:0").await
    })
    .await;
    held.push(listener);
}

/// The real limit (1,024 port connections per connection): every one
/// under it works, the next is refused with `[capexec:limit]`, the
/// connection and the server go on, and a place given back is usable.
async fn a_connection_holds_at_most_its_maximum_of_port_connections(ctx: Ctx) {
    let (listener, address) = peer().await;
    // The peer takes every connection and answers one byte on each.
    let peer = tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            if socket.write_all(b"!").await.is_ok() {
                held.push(socket);
            }
        }
    });
    // Listeners are not port connections: one listening, holding none,
    // leaves every place to dials (and takes one per connection accepted).
    let idle = client::listen(&ctx.executor, "tcp:127.0.0.1:0")
        .await
        .expect("listen");
    let mut held = Vec::new();
    for _ in 0..capexec::rpc::MAX_PORT_STREAMS {
        held.push(dial(&ctx, &address).await);
    }
    let (kind, message) =
        refusal(client::dial_via(&ctx.executor, &address, ctx.dial_route.as_ref()).await).await;
    assert_eq!(kind, RefusalKind::LimitReached, "{message}");
    assert_eq!(
        message,
        format!(
            "this connection already holds its maximum of {} port connections",
            capexec::rpc::MAX_PORT_STREAMS
        )
    );
    // Every connection under the limit carries its bytes.
    let mut last = held.pop().expect("one");
    let mut byte = [0u8; 1];
    last.read_exact(&mut byte)
        .await
        .expect("the last one reads");
    assert_eq!(&byte, b"!");
    // The connection goes on (other calls work), and the place given back
    // (the release travels first: polled) is usable.
    client::info(&ctx.executor).await.expect("info");
    drop(last);
    let mut again = common::eventually_async("a port connection place is given back", async || {
        client::dial_via(&ctx.executor, &address, ctx.dial_route.as_ref()).await
    })
    .await;
    again.read_exact(&mut byte).await.expect("a new one reads");
    assert_eq!(&byte, b"!");
    drop((held, idle));
    peer.abort();
}

/// An IPv6 address goes in brackets: "tcp:::1:80" could be ::1 port 80
/// or ::1:80 with no port, and is refused rather than guessed, by `dial`,
/// by `listen` and in a policy's patterns.
async fn an_unbracketed_ipv6_address_is_refused(ctx: Ctx) {
    for bad in ["tcp:::1:80", "tcp:fe80::1:22", "tcp:[::1:80"] {
        let (kind, message) = refusal(client::dial(&ctx.executor, bad).await).await;
        assert_eq!(kind, RefusalKind::InvalidArgument, "{bad}: {message}");
        assert!(
            message.contains(&format!(
                "{bad:?}: an IPv6 address goes in brackets (tcp:[::1]:80)"
            )),
            "{bad}: {message}"
        );
    }
    let (kind, message) = refusal(client::listen(&ctx.executor, "tcp:::1:0").await).await;
    assert_eq!(kind, RefusalKind::InvalidArgument, "{message}");
    let restricted = restricted(
        &ctx,
        Some(PortPolicy {
            dial: Some(vec!["tcp:::1:80".into()]),
            listen: None,
        }),
        false,
    );
    let (kind, message) = refusal(client::info(&restricted).await).await;
    assert_eq!(kind, RefusalKind::InvalidArgument, "{message}");
    assert!(
        message.contains("an IPv6 address or block goes in brackets"),
        "{message}"
    );
}

/// A `fromSocket` that notes the size of every write and answers none
/// until it is opened.
struct Gated {
    sizes: Rc<RefCell<Vec<usize>>>,
    open: tokio::sync::watch::Receiver<bool>,
    ended: Rc<tokio::sync::Notify>,
}

impl capexec::capexec_capnp::port_sink::Server for Gated {
    async fn write(
        self: Rc<Self>,
        params: capexec::capexec_capnp::port_sink::WriteParams,
    ) -> Result<(), capnp::Error> {
        let length = params.get()?.get_bytes()?.len();
        self.sizes.borrow_mut().push(length);
        let mut open = self.open.clone();
        let _ = open.wait_for(|open| *open).await;
        Ok(())
    }

    async fn end(
        self: Rc<Self>,
        _: capexec::capexec_capnp::port_sink::EndParams,
        _: capexec::capexec_capnp::port_sink::EndResults,
    ) -> Result<(), capnp::Error> {
        self.ended.notify_one();
        Ok(())
    }
}

/// The server writes what a socket sends in writes of at most 256 KiB,
/// and of exactly that while more is waiting: a peer queues 3 MiB in its
/// socket while the client answers nothing, then the client answers.
async fn the_server_writes_a_socket_s_bytes_256_kib_at_most_at_a_time(ctx: Ctx) {
    use std::os::fd::AsRawFd;
    const TOTAL: usize = 3 << 20;
    let dir = TempDir::new("port-write-size");
    let path = dir.path().join("peer.sock");
    let listener = tokio::net::UnixListener::bind(&path).expect("bind");
    let sizes = Rc::new(RefCell::new(Vec::new()));
    let (opener, open) = tokio::sync::watch::channel(false);
    let ended = Rc::new(tokio::sync::Notify::new());
    let mut request = ctx.executor.dial_request();
    request
        .get()
        .set_address(format!("unix:{}", path.display()));
    request.get().set_from_socket(capnp_rpc::new_client(Gated {
        sizes: Rc::clone(&sizes),
        open,
        ended: Rc::clone(&ended),
    }));
    let response = request.send().promise.await.expect("dial");
    let (mut far, _) = listener.accept().await.expect("accept");
    // Room in the peer's socket for all of it while nothing is read (as
    // root, past the system's maximum).
    let size: libc::c_int = 16 << 20;
    // SAFETY: setsockopt on a socket we own, with an int option value.
    let set = unsafe {
        libc::setsockopt(
            far.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUFFORCE,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(
        set,
        0,
        "SO_SNDBUFFORCE: {}",
        std::io::Error::last_os_error()
    );
    far.write_all(&Pattern::bytes(3, TOTAL))
        .await
        .expect("the peer queues it all");
    far.shutdown().await.expect("shutdown");
    opener.send(true).expect("open");
    ended.notified().await;
    let sizes = sizes.borrow().clone();
    assert_eq!(sizes.iter().sum::<usize>(), TOTAL, "{sizes:?}");
    assert_eq!(sizes.iter().max(), Some(&(256 * 1024)), "{sizes:?}");
    drop(response);
}

backend_tests!(
    bulk_transfer_both_ways_at_once_is_byte_exact,
    small_writes_arrive_whole_in_order_and_without_a_flush,
    half_close_is_kept_in_each_direction,
    resets_reach_the_other_end_as_errors,
    a_slow_reader_holds_the_writer_back,
    bytes_handed_out_hold_the_writer_back_until_consumed,
    a_dropped_reading_half_leaves_the_writing_half_working,
    releasing_a_listener_closes_its_socket_and_connections,
    unix_sockets_are_dialled_and_listened_on,
    bad_addresses_and_unreachable_ones_are_refused_clearly,
    restricted_executors_allow_only_the_addresses_of_their_rule,
    a_connection_holds_at_most_its_maximum_of_listeners,
    a_connection_holds_at_most_its_maximum_of_port_connections,
    an_unbracketed_ipv6_address_is_refused,
    the_server_writes_a_socket_s_bytes_256_kib_at_most_at_a_time,
);

/// The same bodies with the client's dials asking for direct channels:
/// granted over a Unix socket, where the server dials itself; through the
/// chain the front server passes the dial on without asking, and the
/// sinks carry the bytes. (TCP has no route: `direct_channels`.)
mod direct {
    use super::*;
    backend_tests!(
        with run_direct on [unix, chained]:
        bulk_transfer_both_ways_at_once_is_byte_exact,
        small_writes_arrive_whole_in_order_and_without_a_flush,
        half_close_is_kept_in_each_direction,
        resets_reach_the_other_end_as_errors,
        a_slow_reader_holds_the_writer_back,
        bytes_handed_out_hold_the_writer_back_until_consumed,
        a_dropped_reading_half_leaves_the_writing_half_working,
        releasing_a_listener_closes_its_socket_and_connections,
        unix_sockets_are_dialled_and_listened_on,
        restricted_executors_allow_only_the_addresses_of_their_rule,
        a_connection_holds_at_most_its_maximum_of_port_connections,
    );
}

/// Client -> A -> (proxy) -> B: cutting the link between A and B fails the
/// connections crossing it at both ends, as errors.
#[test]
fn a_cut_link_fails_the_connections_crossing_it() {
    use capexec::net::{Address, UpstreamConfig};
    use common::proxy::Proxy;
    use common::server::ServerThread;
    common::run_local(async {
        let far = ServerThread::start(false);
        let dir = TempDir::new("ports-cut");
        let Address::Unix(far_path) = &far.address else {
            unreachable!("a unix server")
        };
        let proxy =
            Proxy::start(&dir.path().join("link.sock"), far_path, Duration::ZERO).expect("proxy");
        let front_dir = TempDir::new("ports-front");
        let listen = vec![Address::Unix(front_dir.path().join("capexec.sock"))];
        let upstream = UpstreamConfig::new(
            "b",
            Address::Unix(proxy.path().to_path_buf()),
            far.token.clone(),
        );
        let front = ServerThread::start_forwarding(front_dir, listen, vec![upstream], Some("b"));
        let connection = capexec::net::connect(&front.address, front.token.as_ref())
            .await
            .expect("connect");
        let executor = connection.executor();

        let (listener, address) = peer().await;
        let far_end = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            socket.write_all(b"hello").await.expect("write");
            let mut rest = Vec::new();
            socket.read_to_end(&mut rest).await.map(|_| rest)
        });
        let mut stream = client::dial(&executor, &address).await.expect("dial");
        let mut five = [0u8; 5];
        stream.read_exact(&mut five).await.expect("read");
        assert_eq!(&five, b"hello");
        stream.write_all(b"before").await.expect("write");
        stream.flush().await.expect("flush");

        proxy.cut();
        let error = read_all(&mut stream)
            .await
            .expect_err("an error, not end of file");
        assert_eq!(
            error.kind(),
            std::io::ErrorKind::ConnectionAborted,
            "{error}"
        );
        assert!(error.to_string().contains("lost"), "{error}");
        let mut failed = None;
        for _ in 0..1000 {
            let attempt = async {
                stream.write_all(b"after").await?;
                stream.flush().await
            };
            if let Err(error) = attempt.await {
                failed = Some(error);
                break;
            }
        }
        let error = failed.expect("writes after the cut fail");
        assert!(!error.to_string().is_empty());
        // The far server lost its client: it resets the socket.
        let error = far_end
            .await
            .expect("peer")
            .expect_err("the peer reads a reset");
        assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}");
    });
}

/// A sink that takes every write at once.
struct Swallow;

impl capexec::capexec_capnp::port_sink::Server for Swallow {}

/// Sends one write on `sink` as a plain call, not waiting for room.
pub(crate) fn raw_write(
    sink: &capexec::capexec_capnp::port_sink::Client,
    bytes: &[u8],
) -> capnp::capability::RemotePromise<capnp::any_pointer::Owned> {
    use capexec::capexec_capnp::port_sink;
    use capnp::traits::HasTypeId;
    let mut request = sink
        .client
        .new_call::<port_sink::write_params::Owned, capnp::any_pointer::Owned>(
            <port_sink::Client as HasTypeId>::TYPE_ID,
            0,
            None,
        );
    request.get().set_bytes(bytes);
    request.send()
}

async fn raw_dial(ctx: &Ctx, address: &str) -> capexec::capexec_capnp::port_sink::Client {
    let mut request = ctx.executor.dial_request();
    request.get().set_address(address);
    request
        .get()
        .set_from_socket(capnp_rpc::new_client(Swallow));
    let response = request.send().promise.await.expect("dial");
    let to_socket = response
        .get()
        .expect("results")
        .get_to_socket()
        .expect("toSocket");
    // The connection capability is kept by the answer while it lives.
    std::mem::forget(response);
    to_socket
}

async fn a_writer_that_ignores_flow_control_is_cut_off(ctx: Ctx) {
    let (listener, address) = peer().await;
    let accepted = tokio::spawn(async move { listener.accept().await.expect("accept").0 });
    let to_socket = raw_dial(&ctx, &address).await;
    let mut far = accepted.await.expect("peer");
    // Oversized: refused, and the connection is broken.
    let error = raw_write(&to_socket, &vec![0u8; (1 << 20) + 1])
        .promise
        .await
        .map(drop)
        .expect_err("a write over 1 MiB");
    let refusal = capexec::wire::refusal_of(&error).expect("a refusal");
    assert_eq!(refusal.kind, RefusalKind::InvalidArgument, "{refusal}");
    let error = read_all(&mut far)
        .await
        .expect_err("the peer reads a reset");
    assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}");

    // Writes sent without waiting for answers, to a peer that never reads:
    // the server holds them only up to its per-connection bound on calls
    // (64 MiB), then closes the connection, resetting its sockets.
    let (listener, address) = peer().await;
    let accepted = tokio::spawn(async move { listener.accept().await.expect("accept").0 });
    let to_socket = raw_dial(&ctx, &address).await;
    let mut far = accepted.await.expect("peer");
    let chunk = vec![7u8; 1 << 20];
    let answers: Vec<_> = (0..96)
        .map(|_| raw_write(&to_socket, &chunk).promise)
        .collect();
    let mut failure = None;
    for answer in answers {
        if let Err(error) = answer.await {
            failure = Some(error);
            break;
        }
    }
    let error = failure.expect("the flood is cut off");
    assert!(
        matches!(
            error.kind,
            capnp::ErrorKind::Disconnected | capnp::ErrorKind::Overloaded
        ),
        "{error}"
    );
    let mut got = 0usize;
    let mut buffer = vec![0u8; 1 << 20];
    let error = loop {
        match far.read(&mut buffer).await {
            Ok(0) => panic!("end of file after {got} bytes, not a reset"),
            Ok(n) => got += n,
            Err(error) => break error,
        }
    };
    assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}");
    assert!(got < 64 << 20, "{got} bytes reached the peer");
}

/// Remote backends only: a local capability runs one stream call at a
/// time, so in process there is no queue to grow.
mod remote {
    use super::*;
    backend_tests!(on [unix, tcp]: a_writer_that_ignores_flow_control_is_cut_off);
}
