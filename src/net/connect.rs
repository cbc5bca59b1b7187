//! Connecting to a served Executor.

use std::cell::Cell;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use capnp_rpc::RpcSystem;
use capnp_rpc::rpc_twoparty_capnp::Side;
use futures::FutureExt;
use futures::future::{LocalBoxFuture, Shared};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::capexec_capnp::{executor, gatekeeper};
use crate::net::address::Address;
pub use crate::net::connect_error::ConnectError;
use crate::net::direct::DirectRoute;
use crate::net::guard::CallLimits;
use crate::net::liveness::{self, Watch, Watched};
use crate::net::session::Session;
use crate::net::socket;
use crate::net::tls::{self, TlsClient};
use crate::net::token::Token;
use crate::net::transport;

/// How long establishing a connection may take by default.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How to connect: over TLS or not, how long it may take, whether to watch
/// for a silent server.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// TLS for a `tcp:` address.
    pub tls: Option<TlsClient>,
    /// Connecting, the TLS handshake and the server's first answer (to the
    /// login, or for a Unix socket to the bootstrap) must all happen within
    /// this; see [`Connection::established`].
    pub deadline: Duration,
    /// Treat the connection as lost when nothing has arrived from the
    /// server for this long (a quiet connection is probed with a cheap call
    /// every fifth of it, so a silent path is noticed within 1.2 times it).
    /// `None`: never (TCP keepalive only).
    pub keepalive: Option<Duration>,
    /// Refuse to send the login token without TLS to a host that does not
    /// resolve to loopback addresses only.
    pub plaintext_only_to_loopback: bool,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            tls: None,
            deadline: CONNECT_TIMEOUT,
            keepalive: None,
            plaintext_only_to_loopback: false,
        }
    }
}

/// The client's end of a connection: its peer is the server the user
/// chose, so only the message limit applies, from the start.
pub(crate) fn client_network<R, W>(reader: R, writer: W) -> transport::Network
where
    R: tokio::io::AsyncRead + Unpin + 'static,
    W: tokio::io::AsyncWrite + Unpin + 'static,
{
    transport::network(
        reader,
        writer,
        Side::Client,
        CallLimits::unlimited(),
        Session::logged_in(),
    )
}

/// A live connection to an executor server. Capabilities obtained through
/// it work while it lives; dropping it closes the connection, which releases
/// (and so terminates) every process started through it.
pub struct Connection {
    executor: executor::Client,
    rpc: JoinHandle<()>,
    /// Resolves once the RPC task has ended.
    ended: Shared<LocalBoxFuture<'static, ()>>,
    /// Tells the RPC task to disconnect: capabilities still held then fail
    /// with `disconnected` instead of waiting forever.
    close: Option<oneshot::Sender<()>>,
    established: Established,
    watchdog: Option<JoinHandle<()>>,
    /// Set when this side closes the connection, so that its end is not
    /// taken for the server's doing.
    closing: Rc<Cell<bool>>,
    /// A Unix socket's: descriptors to send to the server.
    outbox: Option<crate::rpc::DescriptorOutbox>,
    /// Where its dials' direct channels are opened (a Unix socket's).
    route: Option<DirectRoute>,
}

/// The server's first answer, raced against the connect deadline.
type Established = Shared<LocalBoxFuture<'static, Result<(), Rc<ConnectError>>>>;

impl Connection {
    /// The server's Executor. Over TCP it is the pipelined result of the
    /// login, so using it right away costs no extra round trip; a refused
    /// login makes its calls fail with the refusal.
    pub fn executor(&self) -> executor::Client {
        self.executor.clone()
    }

    /// Where this connection hands descriptors to the server for a start's
    /// stdio ([`crate::client::Command::pass_stdio`]): over a Unix socket
    /// only, which reaches a server on this machine.
    pub fn stdio_route(&self) -> Option<crate::rpc::StdioRoute> {
        self.outbox.clone().map(crate::rpc::StdioRoute::Socket)
    }

    /// Where this connection's dials open their direct channels
    /// ([`crate::client::dial_via`]): a Unix socket's path, which reaches
    /// a server on this machine; `None` over TCP.
    pub fn direct_route(&self) -> Option<DirectRoute> {
        self.route.clone()
    }

    /// Whether the connection has ended.
    pub fn is_closed(&self) -> bool {
        self.rpc.is_finished()
    }

    /// Why the server closed the connection, once it has, if it said why
    /// (its abort message: a clean shutdown says
    /// [`crate::net::SHUTDOWN_REASON`]); `None` when it ended without a
    /// word (a crash, a reset). The reason is what every call on the
    /// connection fails with from then on: a call costs nothing here.
    pub async fn abort_reason(&self) -> Option<String> {
        let error = self
            .executor
            .environments_request()
            .send()
            .promise
            .await
            .err()?;
        error
            .extra
            .starts_with("remote exception:")
            .then(|| crate::model::human_description(&error.extra))
    }

    /// Resolves once the connection has ended, whichever side ended it.
    /// Owns what it needs: it may outlive the connection.
    pub fn closed(&self) -> impl Future<Output = ()> + 'static + use<> {
        self.ended.clone()
    }

    /// Resolves once the server has answered (the login over TCP, a cheap
    /// call over a Unix socket), or fails if it has not within the
    /// connect deadline, refused the login, or closed the connection first.
    /// Calls made on [`Connection::executor`] meanwhile travel pipelined, so
    /// racing them against this costs no round trip. Owns what it needs:
    /// it may outlive the connection.
    pub fn established(
        &self,
    ) -> impl Future<Output = Result<(), Rc<ConnectError>>> + 'static + use<> {
        self.established.clone()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.closing.set(true);
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.abort();
        }
        if let Some(close) = self.close.take() {
            let _ = close.send(());
        }
    }
}

/// Connects to `address`; TCP addresses need `token`. Must run inside a
/// `LocalSet`.
pub async fn connect(address: &Address, token: Option<&Token>) -> Result<Connection, ConnectError> {
    connect_to(address, token, &ConnectOptions::default()).await
}

/// Connects to `address`, over TLS (TCP only) if `tls` is given; TCP
/// addresses need `token`. Must run inside a `LocalSet`.
pub async fn connect_with(
    address: &Address,
    token: Option<&Token>,
    tls: Option<&TlsClient>,
) -> Result<Connection, ConnectError> {
    let options = ConnectOptions {
        tls: tls.cloned(),
        ..ConnectOptions::default()
    };
    connect_to(address, token, &options).await
}

/// A byte stream to the server, before capnp-rpc takes it over.
struct Stream {
    network: transport::Network,
    /// Counts what the server sends, for the liveness check and to tell a
    /// server that never spoke from one that did.
    watch: Rc<Watch>,
    /// The resolved addresses of a plaintext TCP connection, to probe for
    /// TLS if the server closes without a word.
    plaintext_tcp: Option<(String, Vec<SocketAddr>)>,
    /// A Unix socket's: descriptors to send to the server.
    outbox: Option<crate::rpc::DescriptorOutbox>,
    route: Option<DirectRoute>,
}

/// Connects to `address` as `options` say; TCP addresses need `token`.
/// Returns as soon as the transport is up: the login travels pipelined
/// with the first calls (see [`Connection::established`]). Must run inside
/// a `LocalSet`.
pub async fn connect_to(
    address: &Address,
    token: Option<&Token>,
    options: &ConnectOptions,
) -> Result<Connection, ConnectError> {
    let deadline = Instant::now() + options.deadline;
    let timed_out = |_| ConnectError::Timeout(address.clone(), options.deadline);
    let (stream, token) = tokio::time::timeout_at(deadline, open(address, token, options))
        .await
        .map_err(timed_out)??;
    let outbox = stream.outbox.clone();
    let route = stream.route.clone();
    let mut system = RpcSystem::new(stream.network, None);
    let (executor, answer): (executor::Client, LocalBoxFuture<'static, capnp::Result<()>>) =
        match token {
            None => {
                let executor = system.bootstrap::<executor::Client>(Side::Server);
                // A cheap call sent along with the caller's first ones,
                // which the server answers itself (`info` would go on to the
                // default environment's upstream): any answer, even
                // "unimplemented" from an old server, shows a server is there.
                let answer = executor.environments_request().send().promise;
                // Unless what answered is not a capexec server at all.
                let watch = Rc::clone(&stream.watch);
                let answered = async move {
                    match answer.await {
                        Err(error)
                            if error.kind == capnp::ErrorKind::Disconnected
                                || watch.not_capexec().is_some() =>
                        {
                            Err(error)
                        }
                        _ => Ok(()),
                    }
                };
                (executor, answered.boxed_local())
            }
            Some(token) => {
                let gatekeeper: gatekeeper::Client = system.bootstrap(Side::Server);
                let mut login = gatekeeper.login_request();
                login.get().set_token(token.as_str());
                let login = login.send();
                let executor = login.pipeline.get_executor();
                // Its outcome also reaches callers through the pipelined
                // executor.
                let answer = login.promise;
                (
                    executor,
                    async move { answer.await.map(drop) }.boxed_local(),
                )
            }
        };
    // Awaited here whether or not anyone asks, so the question lives until
    // it is answered.
    let (answered, first_answer) = futures::channel::oneshot::channel();
    tokio::task::spawn_local(async move {
        let _ = answered.send(answer.await);
    });
    let first_answer = capnp::capability::Promise::from_future(async move {
        first_answer.await.unwrap_or_else(|_| {
            Err(capnp::Error::disconnected(
                "the connection was closed".to_string(),
            ))
        })
    });
    let closing = Rc::new(Cell::new(false));
    let established = establish(
        address.clone(),
        first_answer,
        Deadline {
            at: deadline,
            allowed: options.deadline,
        },
        Rc::clone(&stream.watch),
        stream.plaintext_tcp,
        Rc::clone(&closing),
    );
    let watchdog = options
        .keepalive
        .filter(|limit| !limit.is_zero())
        .map(|limit| {
            tokio::task::spawn_local(liveness::watch(
                Rc::clone(&stream.watch),
                executor.clone(),
                limit,
            ))
        });
    let disconnector = system.get_disconnector();
    let (close, closed) = oneshot::channel::<()>();
    // Dropped with the task, however it ends.
    let (ending, gone) = oneshot::channel::<()>();
    let rpc = tokio::task::spawn_local(async move {
        let _ending = ending;
        tokio::pin!(system);
        let ended = tokio::select! {
            ended = &mut system => ended,
            _ = closed => {
                // Break every capability of the connection and let the
                // system flush its goodbye and close the socket (it drives
                // the writes the disconnect waits for). Bounded: the peer
                // may be gone.
                let winding_down = futures::future::join(disconnector, &mut system);
                match tokio::time::timeout(CONNECT_TIMEOUT, winding_down).await {
                    Ok((_, ended)) => ended,
                    Err(_) => Ok(()),
                }
            }
        };
        if let Err(error) = ended {
            tracing::debug!(%error, "connection ended with an error");
        }
    });
    Ok(Connection {
        executor,
        rpc,
        ended: gone.map(|_| ()).boxed_local().shared(),
        close: Some(close),
        established,
        watchdog,
        closing,
        outbox,
        route,
    })
}

/// When the server must have answered, and the allowance it came from.
struct Deadline {
    at: Instant,
    allowed: Duration,
}

/// The first answer within the deadline, or why not.
fn establish(
    address: Address,
    first_answer: capnp::capability::Promise<(), capnp::Error>,
    deadline: Deadline,
    watch: Rc<Watch>,
    plaintext_tcp: Option<(String, Vec<SocketAddr>)>,
    closing: Rc<Cell<bool>>,
) -> Established {
    async move {
        let answer = match tokio::time::timeout_at(deadline.at, first_answer).await {
            Ok(answer) => answer,
            Err(_) => return Err(Rc::new(ConnectError::Timeout(address, deadline.allowed))),
        };
        let Err(error) = answer else {
            return Ok(());
        };
        if closing.get() {
            return Err(Rc::new(ConnectError::Closed(
                address,
                "the connection was closed before the server answered".to_string(),
            )));
        }
        // A TLS server drops a plaintext client with an alert, or without a
        // word: ask it for a handshake to be sure.
        if let Some((host, resolved)) = plaintext_tcp
            && (watch.first_bytes_look_like_tls()
                || (watch.received() == 0 && tls::speaks_tls(&host, &resolved, deadline.at).await))
        {
            return Err(Rc::new(ConnectError::SpeaksTls(address)));
        }
        if let Some(seen) = watch.not_capexec() {
            return Err(Rc::new(ConnectError::NotCapexec(address, seen)));
        }
        let error = match error.kind {
            capnp::ErrorKind::Disconnected | capnp::ErrorKind::PrematureEndOfFile
                if watch.received() == 0 =>
            {
                ConnectError::Closed(
                    address,
                    "the server closed the connection before answering".to_string(),
                )
            }
            capnp::ErrorKind::Disconnected => {
                ConnectError::Closed(address, crate::wire::describe(&error))
            }
            _ => ConnectError::Refused(address, crate::wire::describe(&error)),
        };
        Err(Rc::new(error))
    }
    .boxed_local()
    .shared()
}

/// The transport to `address`, and the token to log in with (TCP only).
async fn open(
    address: &Address,
    token: Option<&Token>,
    options: &ConnectOptions,
) -> Result<(Stream, Option<String>), ConnectError> {
    let io = |error| ConnectError::Io(address.clone(), error);
    let watch = Watch::new();
    match address {
        Address::Unix(_) if options.tls.is_some() => Err(ConnectError::Tls(
            address.clone(),
            "TLS is for tcp: addresses; a Unix socket is protected by its file permissions"
                .to_string(),
        )),
        Address::Unix(path) => {
            // A client reads its server plainly and takes no descriptors
            // from it: refused where the kernel can (6.16), so that a
            // server (an upstream server, for a link) cannot have the
            // kernel release one on the reading thread. Said nowhere
            // where it cannot: a client has its server's trust anyway.
            let socket = tokio::net::UnixSocket::new_stream().map_err(io)?;
            let _ = crate::sys::refuse_descriptors(std::os::fd::AsFd::as_fd(&socket));
            let stream = socket
                .connect(path)
                .await
                .map_err(|error| unix_error(address, path, error))?;
            let (reader, writer) = stream.into_split();
            let reader = Watched::new(reader, Rc::clone(&watch));
            let outbox = crate::rpc::DescriptorOutbox::default();
            let writer = crate::net::passing::SendingWriter::new(writer, outbox.clone());
            let network = client_network(reader, writer);
            Ok((
                Stream {
                    network,
                    watch,
                    plaintext_tcp: None,
                    outbox: Some(outbox),
                    route: Some(DirectRoute::unix(path.clone())),
                },
                None,
            ))
        }
        Address::Tcp { host, port } => {
            let token = token.ok_or_else(|| ConnectError::TokenRequired(address.clone()))?;
            let resolved: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), *port))
                .await
                .map_err(io)?
                .collect();
            // Checked on the addresses connected to, not on the name: a
            // name that resolves to loopback is as safe as `localhost`, and
            // one that does not is refused whatever it is called.
            let loopback = !resolved.is_empty() && resolved.iter().all(|a| a.ip().is_loopback());
            if options.tls.is_none() && options.plaintext_only_to_loopback && !loopback {
                return Err(ConnectError::ClearText(host.clone()));
            }
            let stream = connect_tcp(&resolved).await.map_err(io)?;
            socket::tune_tcp(&stream).map_err(io)?;
            let (network, plaintext_tcp) = match &options.tls {
                None => {
                    let (reader, writer) = stream.into_split();
                    let reader = Watched::new(reader, Rc::clone(&watch));
                    let network = client_network(reader, writer);
                    (network, Some((host.clone(), resolved)))
                }
                Some(tls) => {
                    // What a server that does not speak TLS sent instead
                    // says whether it is a capexec server at all.
                    let raw = Watch::raw();
                    let stream = Watched::new(stream, Rc::clone(&raw));
                    let established =
                        tls.handshake(host, stream)
                            .await
                            .map_err(|failure| match failure {
                                tls::Failure::NotTls => match raw.not_capexec() {
                                    Some(seen) => ConnectError::NotCapexec(address.clone(), seen),
                                    None => ConnectError::NoTls(address.clone()),
                                },
                                tls::Failure::Refused(why) => {
                                    ConnectError::Tls(address.clone(), why)
                                }
                                tls::Failure::Unknown(offered) => {
                                    ConnectError::UnknownCertificate(address.clone(), offered)
                                }
                                tls::Failure::Changed { known, offered } => {
                                    ConnectError::ChangedCertificate {
                                        address: address.clone(),
                                        known,
                                        offered,
                                    }
                                }
                            })?;
                    let reader = Watched::new(established.reader, Rc::clone(&watch));
                    let network = client_network(reader, established.writer);
                    (network, None)
                }
            };
            Ok((
                Stream {
                    network,
                    watch,
                    route: None,
                    plaintext_tcp,
                    outbox: None,
                },
                Some(token.as_str().to_string()),
            ))
        }
    }
}

/// Each resolved address in turn, as `TcpStream::connect` would try them.
async fn connect_tcp(resolved: &[SocketAddr]) -> std::io::Result<TcpStream> {
    let mut last = None;
    for address in resolved {
        match TcpStream::connect(address).await {
            Ok(stream) => return Ok(stream),
            Err(error) => last = Some(error),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "the name resolves to no address",
        )
    }))
}

/// Why a Unix socket could not be reached, naming what is at the path when
/// that is the problem (connecting to a directory says "Connection
/// refused", which misleads).
pub(crate) fn unix_error(address: &Address, path: &Path, error: std::io::Error) -> ConnectError {
    if error.kind() != std::io::ErrorKind::ConnectionRefused {
        return ConnectError::Io(address.clone(), error);
    }
    use std::os::unix::fs::FileTypeExt;
    let why = match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => format!("{} is a directory, not a socket", path.display()),
        Ok(meta) if !meta.file_type().is_socket() => {
            format!("{} is not a socket", path.display())
        }
        _ => format!(
            "nothing is listening on {} (the server is gone; the socket file was left behind)",
            path.display()
        ),
    };
    ConnectError::NotASocket(address.clone(), why)
}
