//! The record layer against rustls's own buffered connections, a record
//! layer it does not share: every byte both ways in each suite and
//! version capexec offers, from either side; the peer's key updates and
//! ours; close_notify and its absence; session tickets kept for
//! resumption.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream as StdStream};
use std::sync::Arc;

use rustls::crypto::aws_lc_rs::{cipher_suite, default_provider};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, HandshakeKind, ServerConfig, SupportedCipherSuite};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::protection::{ALERT, APPLICATION_DATA, HANDSHAKE};
use super::{Established, client, server};

/// A suite and the version it runs under.
#[derive(Clone, Copy, Debug)]
struct Case {
    suite: SupportedCipherSuite,
    tls12: bool,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            suite: cipher_suite::TLS13_AES_128_GCM_SHA256,
            tls12: false,
        },
        Case {
            suite: cipher_suite::TLS13_AES_256_GCM_SHA384,
            tls12: false,
        },
        Case {
            suite: cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
            tls12: false,
        },
        Case {
            suite: cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            tls12: true,
        },
        Case {
            suite: cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
            tls12: true,
        },
        Case {
            suite: cipher_suite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
            tls12: true,
        },
    ]
}

struct Identity {
    certificate: CertificateDer<'static>,
    key: Vec<u8>,
}

fn identity() -> Identity {
    let generated =
        rcgen::generate_simple_self_signed(vec!["capexec".to_string()]).expect("a certificate");
    Identity {
        certificate: generated.cert.der().clone(),
        key: generated.signing_key.serialize_der(),
    }
}

fn provider(case: Case) -> Arc<rustls::crypto::CryptoProvider> {
    let mut provider = default_provider();
    provider.cipher_suites = vec![case.suite];
    Arc::new(provider)
}

fn versions(case: Case) -> &'static [&'static rustls::SupportedProtocolVersion] {
    static TLS12: [&rustls::SupportedProtocolVersion; 1] = [&rustls::version::TLS12];
    static TLS13: [&rustls::SupportedProtocolVersion; 1] = [&rustls::version::TLS13];
    if case.tls12 { &TLS12 } else { &TLS13 }
}

fn server_config(case: Case, identity: &Identity) -> Arc<ServerConfig> {
    let key = PrivateKeyDer::try_from(identity.key.clone()).expect("a key");
    let mut config = ServerConfig::builder_with_provider(provider(case))
        .with_protocol_versions(versions(case))
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(vec![identity.certificate.clone()], key)
        .expect("a server config");
    config.enable_secret_extraction = true;
    Arc::new(config)
}

fn client_config(case: Case, identity: &Identity) -> Arc<ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(identity.certificate.clone()).expect("a root");
    let mut config = ClientConfig::builder_with_provider(provider(case))
        .with_protocol_versions(versions(case))
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.enable_secret_extraction = true;
    Arc::new(config)
}

fn name() -> ServerName<'static> {
    ServerName::try_from("capexec").expect("a name")
}

/// What the rustls peer does with its connection, and how our side
/// sends.
#[derive(Clone, Copy)]
struct PeerPlan {
    /// Ask for a key update (its own, and ours) after echoing this many
    /// bytes.
    update_after: Option<usize>,
    /// Whether our side reads each 100 KB back before it sends more.
    lockstep: bool,
    /// Records our key seals before it is worn out (lockstep only).
    wear_out: Option<u64>,
}

/// What a run saw: bytes the peer echoed, its handshake, KeyUpdates our
/// side sent.
type Seen = (u64, HandshakeKind, u64);

static IDENTITY: std::sync::LazyLock<Identity> = std::sync::LazyLock::new(identity);

/// Echoes every byte back until the other side's close_notify, then sends
/// its own; what it saw of the connection.
fn echo<C, D>(connection: C, socket: StdStream, plan: PeerPlan) -> (u64, HandshakeKind)
where
    C: std::ops::DerefMut<Target = rustls::ConnectionCommon<D>>,
    D: rustls::SideData,
{
    let mut stream = rustls::StreamOwned::new(connection, socket);
    let mut echoed = 0u64;
    let mut updated = false;
    let mut buffer = vec![0; 100_000];
    loop {
        let read = stream.read(&mut buffer).expect("the peer reads");
        if read == 0 {
            break;
        }
        stream.write_all(&buffer[..read]).expect("the peer writes");
        stream.flush().expect("the peer flushes");
        echoed += read as u64;
        if let Some(after) = plan.update_after
            && !updated
            && echoed as usize >= after
        {
            stream.conn.refresh_traffic_keys().expect("a key update");
            updated = true;
        }
    }
    let kind = stream.conn.handshake_kind().expect("a handshake kind");
    stream.conn.send_close_notify();
    stream
        .conn
        .complete_io(&mut stream.sock)
        .expect("close_notify sent");
    (echoed, kind)
}

/// Sends `total` bytes in writes of varied sizes and reads them back in
/// reads of varied sizes (some smaller than a record, so opened in place;
/// some larger, so opened into the reader's buffer), then shuts down and
/// expects a clean end.
async fn round_trip<S>(established: Established<S>, total: usize)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + 'static,
{
    let Established {
        mut reader,
        mut writer,
        ..
    } = established;
    let data: Arc<Vec<u8>> = Arc::new((0..total).map(|i| (i * 7 + i / 251) as u8).collect());
    let sent = Arc::clone(&data);
    let sending = tokio::task::spawn_local(async move {
        let sizes = [1, 100, 16 * 1024, 16 * 1024 + 1, 70_000, 262_144, 5];
        let (mut at, mut turn) = (0, 0);
        while at < sent.len() {
            let size = sizes[turn % sizes.len()].min(sent.len() - at);
            if turn % 3 == 0 && size > 1 {
                let half = size / 2;
                let slices = [
                    std::io::IoSlice::new(&sent[at..at + half]),
                    std::io::IoSlice::new(&sent[at + half..at + size]),
                ];
                let written = writer.write_vectored(&slices).await.expect("written");
                writer
                    .write_all(&sent[at + written..at + size])
                    .await
                    .expect("written");
            } else {
                writer
                    .write_all(&sent[at..at + size])
                    .await
                    .expect("written");
            }
            at += size;
            turn += 1;
        }
        writer.flush().await.expect("flushed");
        writer.shutdown().await.expect("close_notify sent");
    });
    let mut received = Vec::with_capacity(total);
    let reads = [3, 17_000, 100_000, 16 * 1024, 1];
    let mut turn = 0;
    loop {
        let mut buffer = vec![0; reads[turn % reads.len()]];
        let read = reader.read(&mut buffer).await.expect("read");
        if read == 0 {
            break;
        }
        received.extend_from_slice(&buffer[..read]);
        turn += 1;
    }
    sending.await.expect("the sender");
    assert_eq!(received.len(), data.len());
    assert!(received == *data, "the bytes came back changed");
}

/// Sends `total` bytes 100 KB at a time, reading each back before the
/// next: so that what a side writes follows what it has read (a key
/// update, say).
async fn lockstep<S>(established: Established<S>, total: usize, wear_out: Option<u64>) -> u64
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + 'static,
{
    let Established {
        mut reader,
        mut writer,
        ..
    } = established;
    if let Some(records) = wear_out {
        writer.keys().wear_out_after(records);
    }
    let data: Vec<u8> = (0..total).map(|i| (i * 13 + i / 509) as u8).collect();
    let mut back = vec![0; 100_000];
    for chunk in data.chunks(100_000) {
        writer.write_all(chunk).await.expect("written");
        writer.flush().await.expect("flushed");
        reader
            .read_exact(&mut back[..chunk.len()])
            .await
            .expect("read back");
        assert!(back[..chunk.len()] == *chunk, "the bytes came back changed");
    }
    writer.shutdown().await.expect("close_notify sent");
    assert_eq!(reader.read(&mut back).await.expect("the end"), 0);
    writer.updates()
}

fn on_local<F: std::future::Future>(future: F) -> F::Output {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    tokio::task::LocalSet::new().block_on(&runtime, future)
}

/// Our client against rustls's server.
fn as_client(case: Case, total: usize, plan: PeerPlan) -> Seen {
    as_client_with(
        total,
        plan,
        client_config(case, &IDENTITY),
        server_config(case, &IDENTITY),
    )
}

/// [`as_client`] with its own client and server configs (their ticket
/// store and session cache).
fn as_client_with(
    total: usize,
    plan: PeerPlan,
    config: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
) -> Seen {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bound");
    let address = listener.local_addr().expect("an address");
    let peer = std::thread::spawn(move || {
        let (socket, _) = listener.accept().expect("accepted");
        echo(
            rustls::ServerConnection::new(server).expect("a connection"),
            socket,
            plan,
        )
    });
    let updates = on_local(async move {
        let socket = tokio::net::TcpStream::connect(address)
            .await
            .expect("connected");
        let established = client(config, name(), socket).await.expect("a handshake");
        if plan.lockstep {
            lockstep(established, total, plan.wear_out).await
        } else {
            round_trip(established, total).await;
            0
        }
    });
    let (echoed, kind) = peer.join().expect("the peer");
    (echoed, kind, updates)
}

/// Our server against rustls's client.
fn as_server(case: Case, total: usize, plan: PeerPlan) -> Seen {
    let identity = &*IDENTITY;
    let std_listener = TcpListener::bind("127.0.0.1:0").expect("bound");
    let address = std_listener.local_addr().expect("an address");
    let config = client_config(case, identity);
    let peer = std::thread::spawn(move || {
        let socket = StdStream::connect(address).expect("connected");
        let connection = rustls::ClientConnection::new(config, name()).expect("a connection");
        echo(connection, socket, plan)
    });
    let config = server_config(case, identity);
    let updates = on_local(async move {
        std_listener.set_nonblocking(true).expect("non-blocking");
        let listener = tokio::net::TcpListener::from_std(std_listener).expect("a listener");
        let (socket, _) = listener.accept().await.expect("accepted");
        let established = server(config, socket).await.expect("a handshake");
        if plan.lockstep {
            lockstep(established, total, plan.wear_out).await
        } else {
            round_trip(established, total).await;
            0
        }
    });
    let (echoed, kind) = peer.join().expect("the peer");
    (echoed, kind, updates)
}

#[test]
fn every_byte_crosses_both_ways_in_every_suite_from_either_side() {
    for case in cases() {
        for total in [0, 1, 16 * 1024, 1_000_003] {
            let plan = PeerPlan {
                update_after: None,
                lockstep: false,
                wear_out: None,
            };
            assert_eq!(
                as_client(case, total, plan).0,
                total as u64,
                "{case:?} client"
            );
            assert_eq!(
                as_server(case, total, plan).0,
                total as u64,
                "{case:?} server"
            );
        }
    }
}

#[test]
fn a_peers_key_update_is_followed_and_answered() {
    for case in cases().into_iter().filter(|case| !case.tls12) {
        // The peer updates its key and asks for ours; the bytes it sends
        // after are opened with its new key, and ours sealed with our new
        // one, or the peer could not read them.
        let plan = PeerPlan {
            update_after: Some(300_000),
            lockstep: true,
            wear_out: None,
        };
        // Asked, ours was updated too: once.
        crosses_from_either_side(case, plan, 1);
    }
}

/// 2 MB cross both ways under `plan` with our end as the client and as
/// the server, and ours sends `updates` KeyUpdates on the way.
fn crosses_from_either_side(case: Case, plan: PeerPlan, updates: u64) {
    for (side, seen) in [
        ("client", as_client(case, 2_000_000, plan)),
        ("server", as_server(case, 2_000_000, plan)),
    ] {
        assert_eq!(seen.0, 2_000_000, "{case:?} {side}");
        assert_eq!(seen.2, updates, "{case:?} {side}");
    }
}

#[test]
fn a_key_is_updated_before_it_is_worn_out() {
    for case in cases().into_iter().filter(|case| !case.tls12) {
        // Worn out after 50 records: 2 MB is about 130; the peer opens
        // each of them with the key our KeyUpdates announced.
        let plan = PeerPlan {
            update_after: None,
            lockstep: true,
            wear_out: Some(50),
        };
        crosses_from_either_side(case, plan, 2);
    }
}

#[test]
fn tls12_ends_the_connection_when_its_key_is_worn_out() {
    let case = cases()
        .into_iter()
        .find(|case| case.tls12)
        .expect("a TLS 1.2 suite");
    let config = server_config(case, &IDENTITY);
    let listener = TcpListener::bind("127.0.0.1:0").expect("bound");
    let address = listener.local_addr().expect("an address");
    let peer = std::thread::spawn(move || {
        let (socket, _) = listener.accept().expect("accepted");
        let mut stream = rustls::StreamOwned::new(
            rustls::ServerConnection::new(config).expect("a connection"),
            socket,
        );
        let mut sink = vec![0; 65536];
        while matches!(stream.read(&mut sink), Ok(read) if read > 0) {}
    });
    let config = client_config(case, &IDENTITY);
    on_local(async move {
        let socket = tokio::net::TcpStream::connect(address)
            .await
            .expect("connected");
        let mut established = client(config, name(), socket).await.expect("a handshake");
        // Record 0 was the handshake's Finished.
        established.writer.keys().wear_out_after(4);
        let record = vec![7; 16 * 1024];
        for _ in 0..3 {
            established
                .writer
                .write_all(&record)
                .await
                .expect("within the limit");
        }
        let error = established
            .writer
            .write_all(&record)
            .await
            .expect_err("worn out");
        assert!(
            error.to_string().contains("TLS 1.2 cannot update its keys"),
            "{error}"
        );
    });
    peer.join().expect("the peer");
}

#[test]
fn a_servers_session_ticket_is_kept_and_the_next_handshake_resumes() {
    for case in cases() {
        let (config, server) = (
            client_config(case, &IDENTITY),
            server_config(case, &IDENTITY),
        );
        let plan = PeerPlan {
            update_after: None,
            lockstep: true,
            wear_out: None,
        };
        let first = as_client_with(1000, plan, Arc::clone(&config), Arc::clone(&server));
        let second = as_client_with(1000, plan, config, server);
        assert_eq!(first.1, HandshakeKind::Full, "{case:?}");
        assert_eq!(second.1, HandshakeKind::Resumed, "{case:?}");
    }
}

/// Our reader's error once the peer has done `end` to the connection
/// after one round trip.
fn ended_by(
    end: fn(&mut rustls::StreamOwned<rustls::ServerConnection, StdStream>),
) -> std::io::Error {
    let case = cases()[0];
    let config = server_config(case, &IDENTITY);
    let listener = TcpListener::bind("127.0.0.1:0").expect("bound");
    let address = listener.local_addr().expect("an address");
    let peer = std::thread::spawn(move || {
        let (socket, _) = listener.accept().expect("accepted");
        let mut stream = rustls::StreamOwned::new(
            rustls::ServerConnection::new(config).expect("a connection"),
            socket,
        );
        let mut byte = [0];
        stream.read_exact(&mut byte).expect("a byte");
        stream.write_all(&byte).expect("echoed");
        stream.flush().expect("flushed");
        end(&mut stream);
    });
    let config = client_config(case, &IDENTITY);
    let error = on_local(async move {
        let socket = tokio::net::TcpStream::connect(address)
            .await
            .expect("connected");
        let Established {
            mut reader,
            mut writer,
            ..
        } = client(config, name(), socket).await.expect("a handshake");
        writer.write_all(b"x").await.expect("written");
        writer.flush().await.expect("flushed");
        let mut byte = [0];
        reader.read_exact(&mut byte).await.expect("echoed");
        reader
            .read(&mut byte)
            .await
            .expect_err("an error, not an end")
    });
    peer.join().expect("the peer");
    error
}

#[test]
fn an_end_without_close_notify_is_an_error_not_the_end_of_the_data() {
    let error = ended_by(|stream| {
        stream
            .sock
            .shutdown(std::net::Shutdown::Both)
            .expect("shut");
    });
    assert_eq!(
        error.kind(),
        std::io::ErrorKind::ConnectionAborted,
        "{error}"
    );
    assert!(
        error.to_string().contains("without close_notify"),
        "{error}"
    );
}

/// Two ends of an in-memory pipe holding `capacity` bytes, and the
/// server's and client's configurations of `case`.
fn in_memory(
    case: Case,
    capacity: usize,
) -> (
    tokio::io::DuplexStream,
    tokio::io::DuplexStream,
    Arc<ServerConfig>,
    Arc<ClientConfig>,
) {
    let (near, far) = tokio::io::duplex(capacity);
    (
        near,
        far,
        server_config(case, &IDENTITY),
        client_config(case, &IDENTITY),
    )
}

/// Asserts that `answer` is the record layer's end of the connection
/// (a lost connection to Cap'n Proto), saying `what`.
fn fails_saying(answer: std::io::Result<usize>, what: &str) {
    let error = answer.expect_err(what);
    assert_eq!(
        error.kind(),
        std::io::ErrorKind::ConnectionAborted,
        "{what}: {error}"
    );
    assert!(error.to_string().contains(what), "not {what:?}: {error}");
}

/// Our client's reader's answer to a record our server seals by hand
/// (`kind`, `content`), over an in-memory pipe.
fn answer_to(kind: u8, content: &'static [u8]) -> std::io::Result<usize> {
    answers_to(vec![(kind, content)], 1).remove(0)
}

/// Our client's answers to `reads` reads after our server sealed
/// `records` by hand.
fn answers_to(records: Vec<(u8, &'static [u8])>, reads: usize) -> Vec<std::io::Result<usize>> {
    answers_in(cases()[0], records, reads)
}

/// The same in the suite and version of `case`.
fn answers_in(
    case: Case,
    records: Vec<(u8, &'static [u8])>,
    reads: usize,
) -> Vec<std::io::Result<usize>> {
    let (near, far, server_config, client_config) = in_memory(case, 1 << 20);
    on_local(async move {
        let serving = tokio::task::spawn_local(async move {
            let mut established = server(server_config, far).await.expect("a handshake");
            for (kind, content) in records {
                established.writer.seal_raw(kind, content).expect("sealed");
            }
            established.writer.flush().await.expect("flushed");
            // Kept open until the client has read.
            let mut byte = [0];
            let _ = established.reader.read(&mut byte).await;
        });
        let mut established = client(client_config, name(), near)
            .await
            .expect("a handshake");
        let mut buffer = vec![0; 100];
        let mut answers = Vec::new();
        for _ in 0..reads {
            answers.push(established.reader.read(&mut buffer).await);
        }
        drop(established);
        serving.await.expect("the server");
        answers
    })
}

/// How the client's end goes when our server seals by hand what
/// `hostile` seals: the client's read, then its write and shutdown (as
/// capnp-rpc sends its Abort message after a read fails), and what the
/// server then reads.
fn refused_by_client(
    hostile: impl FnOnce(
        &mut super::writer::RecordWriter<tokio::io::WriteHalf<tokio::io::DuplexStream>>,
    ) + 'static,
) -> [std::io::Result<usize>; 3] {
    refused_in(cases()[0], hostile)
}

/// The same in the suite and version of `case`.
fn refused_in(
    case: Case,
    hostile: impl FnOnce(
        &mut super::writer::RecordWriter<tokio::io::WriteHalf<tokio::io::DuplexStream>>,
    ) + 'static,
) -> [std::io::Result<usize>; 3] {
    let (near, far, server_config, client_config) = in_memory(case, 1 << 20);
    on_local(async move {
        let serving = tokio::task::spawn_local(async move {
            let mut established = server(server_config, far).await.expect("a handshake");
            hostile(&mut established.writer);
            established.writer.flush().await.expect("flushed");
            let mut buffer = [0; 100];
            established.reader.read(&mut buffer).await
        });
        let mut established = client(client_config, name(), near)
            .await
            .expect("a handshake");
        let mut buffer = vec![0; 100];
        let read = established.reader.read(&mut buffer).await;
        let written = established.writer.write(b"abort").await;
        let _ = established.writer.shutdown().await;
        let seen = serving.await.expect("the server");
        [read, written, seen]
    })
}

#[test]
fn records_refused_are_answered_with_the_alert_that_says_why() {
    let bad_mac = refused_by_client(|writer| {
        writer
            .seal_raw(APPLICATION_DATA, b"tampered")
            .expect("sealed");
        writer.corrupt_last();
    });
    let overflow = refused_by_client(|writer| {
        writer
            .seal_raw(0, padded_by_one(16 * 1024))
            .expect("sealed");
    });
    let unexpected = refused_by_client(|writer| writer.seal_raw(20, &[1]).expect("sealed"));
    for ([read, written, seen], says, alert) in [
        (bad_mac, "bad_record_mac", "alert 20 (BadRecordMac)"),
        (overflow, "longer than 16 KiB", "alert 22 (RecordOverflow)"),
        (
            unexpected,
            "record of type 20",
            "alert 10 (UnexpectedMessage)",
        ),
    ] {
        let read = read.expect_err("the client's read fails");
        assert!(read.to_string().contains(says), "{read}");
        let written = written.expect_err("nothing is written after");
        assert_eq!(written.kind(), std::io::ErrorKind::BrokenPipe, "{written}");
        let seen = seen.expect_err("the server is told");
        assert!(seen.to_string().contains(alert), "{says}: {seen}");
    }
}

#[test]
fn after_the_peers_fatal_alert_nothing_is_sent_not_even_an_answer() {
    let [read, written, seen] =
        refused_by_client(|writer| writer.seal_raw(ALERT, &[2, 40]).expect("sealed"));
    assert!(read.expect_err("an error").to_string().contains("alert 40"));
    // Neither the write nor close_notify at the shutdown: the server reads
    // the end of the connection.
    let written = written.expect_err("nothing written");
    assert_eq!(written.kind(), std::io::ErrorKind::BrokenPipe, "{written}");
    fails_saying(seen, "without close_notify");
}

#[test]
fn a_peers_end_is_taken_whatever_came_before_it() {
    // After half a handshake message: the peer's alert, not a record
    // inside the message, and no answer.
    let [read, _, seen] = refused_by_client(|writer| {
        writer
            .seal_raw(HANDSHAKE, &[4, 0, 0, 9, 1])
            .expect("sealed");
        writer.seal_raw(ALERT, &[2, 40]).expect("sealed");
    });
    fails_saying(read, "alert 40");
    fails_saying(seen, "without close_notify");
    // After as many records without data as a peer may send in a row
    // (counted from the data before them, after the session tickets): its
    // alert or close_notify, not one quiet record too many.
    for (end, answer) in [(&[2, 40][..], "alert 40"), (&[1, 0][..], "the end")] {
        let mut records = vec![(APPLICATION_DATA, &b"x"[..])];
        records.extend([(APPLICATION_DATA, &[][..]); 32]);
        records.push((ALERT, end));
        let answers = answers_to(records, 2);
        assert_eq!(answers[0].as_ref().expect("the data"), &1);
        match &answers[1] {
            Ok(0) => assert_eq!(answer, "the end"),
            Ok(read) => panic!("{read} bytes after the quiet records"),
            Err(error) => assert!(error.to_string().contains(answer), "{error}"),
        }
    }
}

#[test]
fn a_tls13_record_longer_than_tls13_allows_is_refused_on_its_header() {
    // 2^14 + 300 bytes of content with a bad tag: too long for TLS 1.3
    // (2^14 + 256), though not for TLS 1.2, so refused before it is
    // opened, as an overflow rather than a bad MAC.
    let [read, _, seen] = refused_by_client(|writer| {
        writer
            .seal_raw(APPLICATION_DATA, &[1; 16 * 1024 + 300])
            .expect("sealed");
        writer.corrupt_last();
    });
    fails_saying(read, "longer than TLS allows");
    fails_saying(seen, "alert 22 (RecordOverflow)");
}

#[test]
fn tls12_records_are_refused_with_the_alert_that_says_why_in_each_suite() {
    // AES-GCM sends an explicit nonce, ChaCha20-Poly1305 does not.
    for case in [cases()[3], cases()[5]] {
        let answer = answers_in(case, vec![(APPLICATION_DATA, &[7; 16 * 1024][..])], 1).remove(0);
        assert_eq!(answer.expect("2^14 bytes taken"), 100);
        let [read, written, seen] = refused_in(case, |writer| {
            writer
                .seal_raw(APPLICATION_DATA, &[7; 16 * 1024 + 1])
                .expect("sealed");
        });
        fails_saying(read, "longer than 16 KiB");
        let written = written.expect_err("nothing written after");
        assert_eq!(written.kind(), std::io::ErrorKind::BrokenPipe);
        fails_saying(seen, "alert 22 (RecordOverflow)");
        let [_, _, seen] = refused_in(case, |writer| {
            writer.seal_raw(APPLICATION_DATA, b"x").expect("sealed");
            writer.corrupt_last();
        });
        fails_saying(seen, "alert 20 (BadRecordMac)");
    }
}

#[test]
fn an_empty_handshake_record_is_refused_in_either_version() {
    for case in [cases()[0], cases()[3]] {
        let answer = answers_in(
            case,
            vec![(HANDSHAKE, &[][..]), (APPLICATION_DATA, &b"after"[..])],
            1,
        )
        .remove(0);
        let error = answer.expect_err("refused");
        assert!(
            error.to_string().contains("empty handshake record"),
            "{case:?}: {error}"
        );
    }
}

#[test]
fn an_end_of_the_connection_without_close_notify_is_not_answered() {
    let (near, far, server_config, client_config) = in_memory(cases()[0], 1 << 20);
    let ending = on_local(async move {
        let serving = tokio::task::spawn_local(async move {
            drop(server(server_config, far).await.expect("a handshake"));
        });
        let mut established = client(client_config, name(), near)
            .await
            .expect("a handshake");
        serving.await.expect("the server");
        let mut buffer = vec![0; 100];
        let read = established.reader.read(&mut buffer).await;
        assert!(read.is_err());
        established.writer.keys().take_ending()
    });
    assert_eq!(ending, None);
}

#[test]
fn a_peers_fatal_alert_ends_the_connection_saying_which() {
    let error = answer_to(ALERT, &[2, 40]).expect_err("an error");
    assert!(
        error.to_string().contains("alert 40 (HandshakeFailure)"),
        "{error}"
    );
}

#[test]
fn records_no_peer_may_send_end_the_connection() {
    for (content_type, content, says) in [
        // A KeyUpdate with more after it in its record.
        (
            HANDSHAKE,
            &[24, 0, 0, 1, 0, 4, 0][..],
            "not at the end of its record",
        ),
        (HANDSHAKE, &[24, 0, 0, 1, 7][..], "malformed KeyUpdate"),
        // A ClientHello after the handshake.
        (
            HANDSHAKE,
            &[1, 0, 0, 1, 0][..],
            "handshake message 1 after the handshake",
        ),
        (ALERT, &[2][..], "malformed alert"),
        (20, &[1][..], "record of type 20 after the handshake"),
        (0, &[][..], "no content type"),
    ] {
        fails_saying(answer_to(content_type, content), says);
    }
}

#[test]
fn a_tls12_servers_hello_request_is_declined_by_ignoring_it() {
    let tls12 = cases()[3];
    assert!(tls12.tls12);
    // Two requests in one record, then one split across two, then data.
    let answers = answers_in(
        tls12,
        vec![
            (HANDSHAKE, &[0; 8][..]),
            (HANDSHAKE, &[0; 3][..]),
            (HANDSHAKE, &[0][..]),
            (APPLICATION_DATA, &b"after"[..]),
        ],
        1,
    );
    assert_eq!(answers[0].as_ref().expect("the data after"), &5);
    // Any other handshake message asks to renegotiate, as does data
    // inside a split request.
    for (records, says) in [
        (vec![(HANDSHAKE, &[1, 0, 0, 0][..])], "renegotiate"),
        (
            vec![(HANDSHAKE, &[0, 0][..]), (APPLICATION_DATA, &b"inside"[..])],
            "inside a handshake message",
        ),
    ] {
        fails_saying(answers_in(tls12, records, 1).remove(0), says);
    }
}

#[test]
fn a_tls12_server_takes_no_hello_request() {
    let (near, far, server_config, client_config) = in_memory(cases()[3], 1 << 20);
    let (taken, seen) = on_local(async move {
        let serving = tokio::task::spawn_local(async move {
            let mut established = server(server_config, far).await.expect("a handshake");
            let mut buffer = vec![0; 100];
            let taken = established.reader.read(&mut buffer).await;
            let _ = established.writer.write(b"x").await;
            taken
        });
        let mut established = client(client_config, name(), near)
            .await
            .expect("a handshake");
        established
            .writer
            .seal_raw(HANDSHAKE, &[0; 4])
            .expect("sealed");
        established.writer.flush().await.expect("flushed");
        let mut buffer = vec![0; 100];
        let seen = established.reader.read(&mut buffer).await;
        (serving.await.expect("the server"), seen)
    });
    fails_saying(taken, "renegotiate");
    fails_saying(seen, "alert 10 (UnexpectedMessage)");
}

#[test]
fn a_handshake_message_split_across_records_is_joined() {
    // Half a session ticket is no error; what follows waits for the rest.
    // A client's ticket sent to a client is refused only once whole: a
    // malformed ticket, here, proves the halves were joined.
    let error = answer_to(HANDSHAKE, &[4, 0, 0, 3, 1, 2, 3]).expect_err("an error");
    assert!(error.to_string().contains("session ticket"), "{error}");
}

#[test]
fn a_key_update_sent_with_the_finished_is_answered() {
    // A rustls client updates its keys and asks for ours in the flight of
    // its Finished: the server's handshake must leave that record to the
    // record layer, or rustls answers it into a queue no one sends and
    // the keys it hands over are ones the client never heard of.
    let case = cases()[0];
    let listener = TcpListener::bind("127.0.0.1:0").expect("bound");
    let address = listener.local_addr().expect("an address");
    let config = client_config(case, &IDENTITY);
    let peer = std::thread::spawn(move || -> Result<Vec<u8>, String> {
        let mut socket = StdStream::connect(address).map_err(|error| error.to_string())?;
        let mut connection = rustls::ClientConnection::new(config, name()).expect("a connection");
        let io = |error: std::io::Error| error.to_string();
        while connection.wants_write() {
            connection.write_tls(&mut socket).map_err(io)?;
        }
        while connection.is_handshaking() {
            connection.read_tls(&mut socket).map_err(io)?;
            connection
                .process_new_packets()
                .map_err(|error| error.to_string())?;
        }
        connection
            .refresh_traffic_keys()
            .map_err(|error| error.to_string())?;
        connection.writer().write_all(b"k").map_err(io)?;
        while connection.wants_write() {
            connection.write_tls(&mut socket).map_err(io)?;
        }
        loop {
            if connection.read_tls(&mut socket).map_err(io)? == 0 {
                return Err("the end".to_string());
            }
            connection
                .process_new_packets()
                .map_err(|error| error.to_string())?;
            let mut hello = [0; 5];
            if let Ok(5) = connection.reader().read(&mut hello) {
                return Ok(hello.to_vec());
            }
        }
    });
    let config = server_config(case, &IDENTITY);
    on_local(async move {
        listener.set_nonblocking(true).expect("non-blocking");
        let listener = tokio::net::TcpListener::from_std(listener).expect("a listener");
        let (socket, _) = listener.accept().await.expect("accepted");
        let mut established = server(config, socket).await.expect("a handshake");
        // The byte the client sent after its KeyUpdate: the update is in.
        let mut byte = [0];
        established
            .reader
            .read_exact(&mut byte)
            .await
            .expect("a byte");
        assert_eq!(&byte, b"k");
        established
            .writer
            .write_all(b"hello")
            .await
            .expect("written");
        established.writer.flush().await.expect("flushed");
        assert_eq!(established.writer.updates(), 1);
    });
    assert_eq!(peer.join().expect("the peer"), Ok(b"hello".to_vec()));
}

#[test]
fn a_stream_of_records_without_data_ends_the_connection() {
    // rustls's server sends its session tickets first, which count too.
    let mut within = vec![(APPLICATION_DATA, &[][..]); 20];
    within.push((APPLICATION_DATA, &b"data"[..]));
    assert_eq!(answers_to(within, 1)[0].as_ref().ok(), Some(&4));
    let beyond = vec![(APPLICATION_DATA, &[][..]); 33];
    let error = answers_to(beyond, 1).remove(0).expect_err("an error");
    assert!(
        error.to_string().contains("records in a row with no data"),
        "{error}"
    );
    let mut warnings = vec![(ALERT, &[1, 90][..]); 33];
    warnings.push((APPLICATION_DATA, &b"data"[..]));
    let error = answers_to(warnings, 1).remove(0).expect_err("an error");
    assert!(
        error.to_string().contains("records in a row with no data"),
        "{error}"
    );
}

#[test]
fn alerts_are_taken_at_their_level() {
    for (alert, says) in [
        (&[2, 90][..], "alert 90 (UserCanceled)"),
        (&[7, 0][..], "an alert of level 7"),
        (&[2, 0][..], "alert 0 (CloseNotify)"),
        (&[1, 42][..], "alert 42 (BadCertificate)"),
    ] {
        let error = answer_to(ALERT, alert).expect_err("an error");
        assert!(error.to_string().contains(says), "{says}: {error}");
    }
    assert_eq!(answer_to(ALERT, &[1, 0]).ok(), Some(0), "close_notify");
}

#[test]
fn a_record_inside_a_split_handshake_message_ends_the_connection() {
    let error = answers_to(
        vec![
            (HANDSHAKE, &[4, 0, 0, 9, 1][..]),
            (APPLICATION_DATA, &b"data"[..]),
        ],
        1,
    )
    .remove(0)
    .expect_err("an error");
    assert!(
        error.to_string().contains("inside a handshake message"),
        "{error}"
    );
}

#[test]
fn after_an_error_every_read_fails_the_same_way() {
    let answers = answers_to(
        vec![(ALERT, &[2, 40][..]), (APPLICATION_DATA, &b"after"[..])],
        2,
    );
    for answer in answers {
        let error = answer.expect_err("an error");
        assert!(error.to_string().contains("alert 40"), "{error}");
    }
}

#[test]
fn a_tls13_plaintext_longer_than_16_kib_and_its_type_is_refused() {
    static LONG: [u8; 16 * 1024 + 1] = [1; 16 * 1024 + 1];
    let error = answer_to(APPLICATION_DATA, &LONG).expect_err("an error");
    assert!(error.to_string().contains("longer than 16 KiB"), "{error}");
}

/// TLS 1.3 content of `length` bytes, its type and one byte of padding:
/// sealed as content `length + 1` bytes long of type 0, whose last byte
/// is the real type.
fn padded_by_one(length: usize) -> &'static [u8] {
    let mut content = vec![1; length];
    content.push(APPLICATION_DATA);
    Box::leak(content.into_boxed_slice())
}

#[test]
fn padding_counts_towards_a_tls13_records_limit() {
    let answer = answer_to(0, padded_by_one(16 * 1024 - 1));
    assert_eq!(
        answer.expect("16 KiB - 1 of content, padded to the limit"),
        100
    );
    let error = answer_to(0, padded_by_one(16 * 1024)).expect_err("an error");
    assert!(error.to_string().contains("longer than 16 KiB"), "{error}");
}

#[test]
fn an_idle_connection_holds_no_read_buffer_and_a_busy_one_grows_its_own() {
    let case = cases()[0];
    let (near, far, server_config, client_config) = in_memory(case, 1 << 22);
    on_local(async move {
        let serving = tokio::task::spawn_local(async move {
            let mut established = server(server_config, far).await.expect("a handshake");
            established
                .writer
                .write_all(b"small")
                .await
                .expect("written");
            established.writer.flush().await.expect("flushed");
            let mut byte = [0];
            established
                .reader
                .read_exact(&mut byte)
                .await
                .expect("go on");
            established
                .writer
                .write_all(&vec![1; 2 << 20])
                .await
                .expect("written");
            established.writer.flush().await.expect("flushed");
            let _ = established.reader.read(&mut byte).await;
        });
        let mut established = client(client_config, name(), near)
            .await
            .expect("a handshake");
        let mut small = [0; 5];
        established
            .reader
            .read_exact(&mut small)
            .await
            .expect("read");
        // Drained after light traffic: the next read waits on the stack.
        assert!(
            established.reader.poll_held_while_waiting().await == 0,
            "an idle reader holds a buffer"
        );
        established.writer.write_all(b"g").await.expect("written");
        established.writer.flush().await.expect("flushed");
        let mut bulk = vec![0; 2 << 20];
        let mut most = 0;
        let mut got = 0;
        while got < bulk.len() {
            let read = established
                .reader
                .read(&mut bulk[got..(got + 1000).min(2 << 20)])
                .await
                .expect("read");
            got += read;
            most = most.max(established.reader.held());
        }
        assert!(most > 2 * (16 * 1024), "the buffer stayed at {most} bytes");
        drop(established);
        serving.await.expect("the server");
    });
}

/// Our server's reader's answer to a record our client seals by hand.
fn server_answer_to(kind: u8, content: &'static [u8]) -> std::io::Result<usize> {
    let case = cases()[0];
    let (near, far, server_config, client_config) = in_memory(case, 1 << 20);
    on_local(async move {
        let serving = tokio::task::spawn_local(async move {
            let mut established = server(server_config, far).await.expect("a handshake");
            let mut buffer = vec![0; 100];
            established.reader.read(&mut buffer).await
        });
        let mut established = client(client_config, name(), near)
            .await
            .expect("a handshake");
        established.writer.seal_raw(kind, content).expect("sealed");
        established.writer.flush().await.expect("flushed");
        let answer = serving.await.expect("the server");
        drop(established);
        answer
    })
}

#[test]
fn a_handshake_message_no_peer_may_send_is_refused_on_its_header() {
    // A client's "ticket" announcing 60 KiB: refused on its four bytes,
    // before a server holds any of it.
    let error = server_answer_to(HANDSHAKE, &[4, 0, 0xF0, 0]).expect_err("an error");
    assert!(
        error
            .to_string()
            .contains("the client sent a session ticket"),
        "{error}"
    );
    let error = answer_to(HANDSHAKE, &[24, 0, 0, 2]).expect_err("an error");
    assert!(error.to_string().contains("malformed KeyUpdate"), "{error}");
}

/// A stream whose reads bring at most 7 bytes.
struct Trickle<S>(S);

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Trickle<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        out: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let mut few = [0; 7];
        let mut some = tokio::io::ReadBuf::new(&mut few[..out.remaining().min(7)]);
        std::task::ready!(std::pin::Pin::new(&mut self.0).poll_read(cx, &mut some))?;
        out.put_slice(some.filled());
        std::task::Poll::Ready(Ok(()))
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Trickle<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bytes: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, bytes)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[test]
fn a_handshake_that_arrives_a_few_bytes_at_a_time_completes() {
    // Every read partial: records split at every point, on both sides,
    // and the session tickets that follow the handshake left to the
    // record layer.
    for case in cases() {
        let (near, far, server_config, client_config) = in_memory(case, 1 << 20);
        on_local(async move {
            let serving = tokio::task::spawn_local(async move {
                let mut established = server(server_config, Trickle(far))
                    .await
                    .expect("a handshake");
                let mut hello = [0; 5];
                established
                    .reader
                    .read_exact(&mut hello)
                    .await
                    .expect("read");
                established.writer.write_all(&hello).await.expect("written");
                established.writer.shutdown().await.expect("closed");
            });
            let mut established = client(client_config, name(), Trickle(near))
                .await
                .expect("a handshake");
            established
                .writer
                .write_all(b"hello")
                .await
                .expect("written");
            established.writer.flush().await.expect("flushed");
            let mut back = Vec::new();
            established
                .reader
                .read_to_end(&mut back)
                .await
                .expect("read");
            assert_eq!(back, b"hello", "{case:?}");
            serving.await.expect("the server");
        });
    }
}
