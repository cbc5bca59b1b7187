//! Accepting on a listener: a Unix peer told apart from a dial's direct
//! channel, a TCP peer held to the limits on connections that have not
//! logged in, and the TLS handshake, in the connection's own task.

use super::Listener;
use super::connection::{serve_connection, server_network};
use super::serving::{ConnectionExecutor, Connections, Login, Serving};
use crate::net::direct::Peek;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::FutureExt;
use futures::future::LocalBoxFuture;
use tokio::sync::OwnedSemaphorePermit;
use tracing::Instrument;

use crate::net::address::Address;
use crate::net::guard::CallLimits;
use crate::net::session::Session;
use crate::net::socket::{self};
use crate::net::tls::TlsServer;
use crate::net::transport::Network;
use crate::rpc;

/// How long a TLS client may take to finish its handshake; a peer that
/// stalls is dropped without holding anything else up.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A connection just accepted: its network (after a TLS handshake, which
/// runs in the connection's own task, so a stalling peer holds up nobody
/// else), who it is, and the state it shares with its guard.
struct Accepted {
    network: LocalBoxFuture<'static, Option<Network>>,
    peer: String,
    session: Rc<Session>,
    login: Option<Arc<Login>>,
    /// What a Unix socket's peer sends for its starts' stdio.
    received: Option<rpc::ReceivedDescriptors>,
    /// Where its dials' direct channels are claimed: a Unix socket's.
    direct: Option<rpc::DirectChannels>,
    /// On a server that runs logins as users: the worker the monitor
    /// named for it (or why it refused it).
    verdict: Option<Result<crate::users::Granted, String>>,
    /// The SHA-256 of the certificate a TLS client presented, once its
    /// handshake is done (a user map's `cert` lines log in by it).
    certificate: Rc<std::cell::Cell<Option<[u8; 32]>>>,
    /// On a server that runs logins as users: the place the Unix peer's
    /// user holds among its connections, for as long as this one is open.
    user_share: Option<crate::net::pending::PeerShare<u32>>,
    /// Its place among the server's connections, held as long as it is
    /// open.
    place: OwnedSemaphorePermit,
}

/// A Unix connection just accepted with its place, or `None` once it has
/// been refused (the server holds its most), told why, and closed off
/// this thread.
fn admit_unix(
    stream: tokio::net::UnixStream,
    serving: &Serving,
) -> Option<(tokio::net::UnixStream, OwnedSemaphorePermit)> {
    match serving.connections.admit() {
        Ok(place) => Some((stream, place)),
        Err(reason) => {
            crate::metrics::limit_hit("connections");
            serving.connections.refused(&"a Unix peer", &reason);
            refuse_unix(&stream, &reason);
            stream.close_off_this_thread();
            None
        }
    }
}

/// Tells a Unix peer refused at once why (a capnp `Abort`); the caller
/// then closes the connection off this thread (what the peer sent may
/// carry descriptors, which the close releases).
fn refuse_unix(stream: &tokio::net::UnixStream, reason: &str) {
    use std::os::fd::AsRawFd;
    // Written on the socket itself: the stream's readiness is not known
    // until the runtime's next turn, and the buffer of a new connection
    // takes it.
    let _ = nix::sys::socket::send(
        stream.as_raw_fd(),
        &abort_frame(reason),
        nix::sys::socket::MsgFlags::MSG_DONTWAIT | nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
    );
}

pub(super) async fn accept_loop(address: Address, listener: Listener, serving: Rc<Serving>) {
    tracing::info!(%address, tls = serving.tls.borrow().is_some() && address.is_tcp(), "listening");
    // Only Unix connections add closes (a TCP one is closed in place).
    let adds_closes = !matches!(listener, Listener::Tcp(_));
    loop {
        if adds_closes && crate::sys::closes_backed_up() {
            // Every closing thread is busy (asleep on locks a client
            // holds, most likely) and owners pile up behind them: a
            // connection taken now would add one more (refused, or
            // ended) for as long as the locks' holders like. Those that
            // come wait in the listener's backlog meanwhile.
            tracing::warn!(
                %address,
                "not accepting: every thread that closes descriptors clients sent is busy (on \
                 pipes whose locks are held?) and {} closes wait for one",
                crate::sys::MAX_OWNERS_IN_LINE
            );
            while crate::sys::closes_backed_up() {
                tokio::time::sleep(crate::sys::ASLEEP_AFTER).await;
            }
            tracing::info!(%address, "accepting again");
        }
        let accepted = match &listener {
            Listener::Unix(listener) => listener.accept().await.map(|(stream, _)| {
                let (stream, place) = admit_unix(stream, &serving)?;
                accept_unix(stream, &serving, None, place)
            }),
            Listener::Monitor(monitor) => handed_over(monitor).await.map(|(stream, verdict)| {
                let (stream, place) = admit_unix(stream, &serving)?;
                accept_unix(stream, &serving, Some(verdict), place)
            }),
            Listener::Tcp(listener) => listener.accept().await.map(|(stream, peer)| {
                let place = match serving.connections.admit() {
                    Ok(place) => place,
                    Err(reason) => {
                        crate::metrics::limit_hit("connections");
                        serving.connections.refused(&peer, &reason);
                        refuse(stream, &reason, serving.tls.borrow().is_some());
                        return None;
                    }
                };
                accept_tcp(stream, peer, &serving, place)
            }),
        };
        let accepted = match accepted {
            Ok(Some(accepted)) => accepted,
            Ok(None) => continue,
            Err(error) => {
                // Out of descriptors and the like: keep serving the others.
                tracing::warn!(%error, %address, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let id = serving.connections.opened.fetch_add(1, Ordering::Relaxed) + 1;
        let span = tracing::info_span!("connection", id, peer = %accepted.peer);
        let serving = Rc::clone(&serving);
        let connection = format!("{id} {}", accepted.peer);
        let connection_name = connection.clone();
        let (received, direct) = (accepted.received.clone(), accepted.direct.clone());
        let executor: ConnectionExecutor = match (&serving.users, accepted.verdict) {
            (Some(users), Some(verdict)) => {
                let users = Rc::clone(users);
                Rc::new(move || {
                    users.executor(&verdict, &connection, received.as_ref(), direct.as_ref())
                })
            }
            _ => {
                let make = Rc::clone(&serving.executor);
                Rc::new(move || make(&connection, received.as_ref(), direct.as_ref()))
            }
        };
        // A TCP login on a server that runs logins as users: the monitor
        // says which user's worker its token logs in to.
        // An empty token with a client certificate logs in by the
        // certificate.
        let users_login: Option<crate::net::auth::UsersLogin> = match &serving.users {
            Some(users) if accepted.login.is_some() => {
                let (users, connection) = (Rc::clone(users), connection_name.clone());
                let certificate = Rc::clone(&accepted.certificate);
                Some(Rc::new(move |token: String| {
                    let (users, connection) = (Rc::clone(&users), connection.clone());
                    let certificate = certificate.get();
                    async move {
                        let granted = match certificate {
                            Some(sha256) if token.is_empty() => {
                                users.verdict_for_certificate(sha256).await?
                            }
                            _ => users.verdict_for_token(token).await?,
                        };
                        Ok(users.executor(&Ok(granted), &connection, None, None))
                    }
                    .boxed_local()
                }))
            }
            _ => None,
        };
        let login = accepted.login.map(|login| (login, users_login));
        let open = crate::metrics::connection_opened();
        let (user_share, place) = (accepted.user_share, accepted.place);
        tokio::task::spawn_local(
            async move {
                let _open = (open, place);
                let _user_share = user_share;
                if let Some(network) = accepted.network.await {
                    let closing = &serving.closing;
                    serve_connection(network, executor, accepted.session, login, closing).await;
                }
                Connections::return_free_memory_soon(&serving);
            }
            .instrument(span),
        );
    }
}

/// A Unix socket's peer: file permissions were the authentication; a
/// sandboxed process (of any capexec server) is refused at once, so that
/// it cannot ask for an unconfined start. Its first bytes say whether it
/// is a Cap'n Proto connection or a dial's direct channel.
fn accept_unix(
    stream: tokio::net::UnixStream,
    serving: &Serving,
    verdict: Option<Result<crate::users::Granted, String>>,
    place: OwnedSemaphorePermit,
) -> Option<Accepted> {
    use std::os::fd::AsRawFd;
    // Urgent bytes (MSG_OOB) read in line: kept apart, a read skips
    // them and releases the descriptors they carry on the reading thread
    // (a pipe whose lock the peer holds: asleep for as long as it likes),
    // and a look (MSG_PEEK) does not see them.
    if let Err(error) = socket2::SockRef::from(&stream).set_out_of_band_inline(true) {
        tracing::warn!(%error, "refusing a Unix connection whose urgent bytes cannot be read in line");
        stream.close_off_this_thread();
        return None;
    }
    if crate::sandbox::peer_is_sandboxed(&serving.host, stream.as_raw_fd()) {
        // (A peer gone before the look is refused too: its number may
        // name another process by then.)
        tracing::warn!(
            "refusing a connection from a sandboxed process, or one gone before it was looked at"
        );
        // What it sent may carry descriptors, which the close releases.
        stream.close_off_this_thread();
        return None;
    }
    let user_share = match (&serving.users, &verdict) {
        (Some(users), Some(_)) => match users_share(users, &stream) {
            Ok(share) => Some(share),
            Err(reason) => {
                crate::metrics::limit_hit("connections-per-user");
                tracing::debug!(%reason, "refused a Unix connection");
                refuse_unix(&stream, &reason);
                stream.close_off_this_thread();
                return None;
            }
        },
        _ => None,
    };
    let session = Session::logged_in();
    // A restricted server keeps none of the descriptors that come, but
    // still reads them in (closed off this thread): a plain read would
    // have the kernel close them on this one, and a pipe among them
    // whose lock the peer holds would put it to sleep (`net/passing.rs`).
    let received = rpc::ReceivedDescriptors::default();
    if !serving.takes_descriptors {
        received.close();
    }
    let network = {
        let (limits, direct) = (serving.limits, serving.direct.clone());
        let (session, received) = (Rc::clone(&session), received.clone());
        async move {
            let stream = rpc_or_channel(stream, &direct, |stream| {
                Ok(crate::ports::Socket::Unix(stream))
            })
            .await?;
            let (reader, writer) = stream.into_split();
            let reader = crate::net::passing::ReceivingReader::new(reader, received);
            Some(server_network(reader, writer, limits, &session))
        }
        .boxed_local()
    };
    Some(Accepted {
        network,
        peer: "unix".to_string(),
        session,
        login: None,
        received: serving.takes_descriptors.then_some(received),
        direct: Some(serving.direct.clone()),
        verdict,
        certificate: Rc::new(std::cell::Cell::new(None)),
        user_share,
        place,
    })
}

/// The place a Unix peer's user takes among its connections, by the uid
/// the kernel gives for the peer.
fn users_share(
    users: &super::users::Workers,
    stream: &tokio::net::UnixStream,
) -> Result<crate::net::pending::PeerShare<u32>, String> {
    let uid = stream
        .peer_cred()
        .map_err(|error| format!("cannot tell who the peer is: {error}"))?
        .uid();
    users.admit(uid)
}

/// The next connection the monitor of a server that runs logins as users
/// accepted and handed over, with its verdict. If the monitor has gone,
/// nothing more comes (the front is ending: the monitor's death signals
/// it).
async fn handed_over(
    monitor: &tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
) -> std::io::Result<(
    tokio::net::UnixStream,
    Result<crate::users::Granted, String>,
)> {
    use crate::users::{Handed, receive_handed};
    use std::os::fd::AsFd;
    loop {
        let mut ready = monitor.readable().await?;
        match receive_handed(monitor.get_ref().as_fd())? {
            Handed::Connection(connection, verdict) => {
                let stream = std::os::unix::net::UnixStream::from(connection);
                stream.set_nonblocking(true)?;
                return Ok((tokio::net::UnixStream::from_std(stream)?, verdict));
            }
            Handed::Nothing => ready.clear_ready(),
            Handed::Closed => {
                tracing::warn!("the monitor has gone; no more logins");
                std::future::pending::<()>().await;
            }
        }
    }
}

/// A new plaintext connection back if it is a Cap'n Proto one; if it is
/// a direct channel instead, it goes (made a [`crate::ports::Socket`] by
/// `socket`) to the dial whose ticket it presents.
async fn rpc_or_channel<S: crate::net::direct::Peek>(
    mut stream: S,
    direct: &rpc::DirectChannels,
    socket: impl FnOnce(S) -> std::io::Result<crate::ports::Socket>,
) -> Option<S> {
    use crate::net::direct::{Opening, opening};
    match opening(&mut stream).await {
        Ok(Opening::Rpc) => Some(stream),
        Ok(Opening::Channel(ticket)) => {
            let claimed = socket(stream).is_ok_and(|channel| direct.claim(&ticket, channel));
            if claimed {
                tracing::debug!("a direct channel was claimed");
            } else {
                // Debug, not info: a local peer could flood the log.
                tracing::debug!("a direct channel presented an unknown ticket; closed");
            }
            None
        }
        Err(error) => {
            tracing::debug!(
                error = %crate::model::io_message(&error),
                "a direct channel that did not open properly; closed"
            );
            stream.close_off_this_thread();
            None
        }
    }
}

/// A TCP peer, which must log in; `None` if it is refused at once, beyond
/// the limits on connections that have not logged in.
fn accept_tcp(
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    serving: &Serving,
    among_connections: OwnedSemaphorePermit,
) -> Option<Accepted> {
    let place = match serving.connections.pending.admit(peer.ip()) {
        Ok(place) => place,
        Err(reason) => {
            crate::metrics::limit_hit("pending-logins");
            serving.connections.refused(&peer, &reason);
            refuse(stream, &reason, serving.tls.borrow().is_some());
            return None;
        }
    };
    if let Err(error) = socket::tune_tcp(&stream) {
        tracing::warn!(%error, %peer, "cannot tune the TCP connection");
    }
    let session = Session::awaiting_login(Some(place));
    let tls = serving.tls.borrow().clone();
    let limits = serving.limits;
    let host = serving.host.clone();
    let lookups = std::rc::Rc::clone(&serving.peer_lookups);
    let certificate = Rc::new(std::cell::Cell::new(None));
    let network = {
        let session = Rc::clone(&session);
        let presented = Rc::clone(&certificate);
        async move {
            // Before a byte is read: a sandboxed process of this machine
            // may not log in, whatever token it holds (see `tcp_peer.rs`).
            if sandboxed_local_peer(&stream, peer, host, &lookups).await {
                tracing::warn!(%peer, "refusing a TCP connection from a sandboxed process");
                return None;
            }
            match tls {
                None => {
                    let (reader, writer) = stream.into_split();
                    Some(server_network(reader, writer, limits, &session))
                }
                Some(tls) => tls_handshake(tls, stream, limits, session, &presented).await,
            }
        }
        .boxed_local()
    };
    Some(Accepted {
        network,
        peer: peer.to_string(),
        session,
        login: serving.login.borrow().clone(),
        received: None,
        direct: None,
        // (On a server that runs logins as users, a TCP login's user is
        // known at its login: see `accept_loop`.)
        verdict: None,
        certificate,
        user_share: None,
        place: among_connections,
    })
}

/// Local TCP peers looked up at once, server-wide. A lookup is a
/// netlink round trip (microseconds) unless it falls back to reading
/// `/proc` (tens of milliseconds with a thousand processes); each runs on
/// a blocking thread, and a burst of connections (a thousand logins at
/// once, or idle connections an attacker opens) would otherwise start a
/// thread, with its stack and malloc arena, per connection.
pub(super) const PEER_LOOKUPS_AT_ONCE: usize = 2;

/// Whether `stream`'s peer is a sandboxed process of this machine, looked
/// up off this thread (it may read `/proc`), holding one of `lookups`'s
/// places meanwhile.
async fn sandboxed_local_peer(
    stream: &tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    host: crate::sandbox::HostConfig,
    lookups: &tokio::sync::Semaphore,
) -> bool {
    let Ok(local) = stream.local_addr() else {
        return true;
    };
    // The semaphore is never closed: no place means refused, as an error.
    let Ok(_place) = lookups.acquire().await else {
        return true;
    };
    tokio::task::spawn_blocking(move || crate::sandbox::tcp_peer_is_sandboxed(&host, local, peer))
        .await
        .unwrap_or(true)
}

/// Turns away a connection beyond the limits on connections that have not
/// logged in: a plaintext peer is told why (a capnp `Abort`, written if
/// the socket takes it at once), a TLS one just sees the connection close.
fn refuse(stream: tokio::net::TcpStream, reason: &str, tls: bool) {
    if !tls {
        // What the peer already sent is read first, so closing sends a FIN
        // rather than a reset, which could destroy the goodbye unread.
        let mut sink = [0u8; 4096];
        while matches!(stream.try_read(&mut sink), Ok(read) if read > 0) {}
        let _ = stream.try_write(&abort_frame(reason));
    }
}

/// An RPC `Abort` message with an `overloaded` error saying `reason`.
fn abort_frame(reason: &str) -> Vec<u8> {
    use capnp_rpc::rpc_capnp::{exception, message};
    let mut builder = capnp::message::Builder::new_default();
    let mut abort = builder.init_root::<message::Builder>().init_abort();
    abort.set_reason(reason);
    abort.set_type(exception::Type::Overloaded);
    capnp::serialize::write_message_to_words(&builder)
}

/// The server's half of a TLS handshake, bounded by [`HANDSHAKE_TIMEOUT`];
/// `None` (logged) if it fails: a plaintext client gets nothing.
async fn tls_handshake(
    tls: TlsServer,
    stream: tokio::net::TcpStream,
    limits: CallLimits,
    session: Rc<Session>,
    presented: &std::cell::Cell<Option<[u8; 32]>>,
) -> Option<Network> {
    let handshake = crate::net::records::server(Arc::clone(&tls.config), stream);
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
        Ok(Ok(established)) => {
            presented.set(crate::net::tls::peer_fingerprint(
                &established.peer_certificates,
            ));
            Some(server_network(
                established.reader,
                established.writer,
                limits,
                &session,
            ))
        }
        Ok(Err(error)) => {
            tracing::info!(%error, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::info!("no TLS handshake within {}s", HANDSHAKE_TIMEOUT.as_secs());
            None
        }
    }
}
