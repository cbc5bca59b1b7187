//! `capexec serve`: listeners, one RpcSystem per connection, shutdown.

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use capnp_rpc::RpcSystem;
use capnp_rpc::rpc_twoparty_capnp::Side;
use futures::FutureExt;
use futures::future::LocalBoxFuture;
use tokio::net::{TcpListener, UnixListener};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::capexec_capnp::{executor, gatekeeper};
use crate::engine::Engine;
use crate::net::activation::Listening;
use crate::net::address::Address;
use crate::net::auth::{GatekeeperImpl, LOGIN_DEADLINE, enforce_login_deadline};
use crate::net::guard::CallLimits;
use crate::net::pending::{PendingLimits, PendingLogins};
use crate::net::session::Session;
use crate::net::shutdown::Closing;
use crate::net::socket::{self, UnixSocketFile};
use crate::net::tls::TlsServer;
use crate::net::token::{Token, TokenError, default_token_path};
use crate::net::transport::{self, Network};
use crate::net::upstream::{UpstreamConfig, UpstreamLink};
use crate::rpc::{self, ServerContext, Upstream};

/// What to serve.
#[derive(Clone, Debug, Default)]
pub struct ServerConfig {
    pub listen: Vec<Address>,
    /// Token of the TCP listeners; created (mode 0600, 256 random bits) if
    /// the file does not exist. Default: [`default_token_path`].
    pub token_file: Option<PathBuf>,
    /// Executors to forward to, as environments named after them.
    pub upstreams: Vec<UpstreamConfig>,
    /// The environment plain `start` uses: "local" (the default) or an
    /// upstream's name.
    pub default_environment: Option<String>,
    /// How long a finished detached process stays restorable (default
    /// [`rpc::DEFAULT_RETENTION`]).
    pub retention: Option<std::time::Duration>,
    /// TLS for every TCP listener (Unix sockets never use it).
    pub tls: Option<TlsServer>,
    /// What one connection may have outstanding before it is closed.
    pub call_limits: CallLimits,
    /// How many TCP connections may be open without having logged in.
    pub pending_logins: PendingLimits,
    /// Most processes one connection's starts may hold at once (`None`: no
    /// limit but the engine's own).
    pub max_processes_per_connection: Option<usize>,
    /// Most port connections and listeners one connection may hold.
    pub port_limits: rpc::PortLimits,
    /// Most descriptors and memory every connection's capabilities may
    /// hold together (one connection half of each). Default: the share
    /// of the descriptor limit `engine::descriptors` keeps for them, and
    /// [`rpc::MAX_HELD_MEMORY`].
    pub holding_limits: Option<rpc::HoldingLimits>,
    /// How long a TCP connection may go without logging in (default 30 s).
    pub login_deadline: Option<std::time::Duration>,
    /// Rules every start must satisfy, on every connection (the root
    /// executor is restricted by it); not with upstreams.
    pub policy: Option<crate::model::Policy>,
    /// The admin socket (mode 0600): its bootstrap is `Admin`, the
    /// operator's view of every process, reachable from nowhere else.
    pub admin: Option<PathBuf>,
    /// Listening sockets passed by the service manager (socket
    /// activation); one named "admin" is the admin socket.
    pub inherited: Vec<crate::net::activation::InheritedSocket>,
    /// Where to serve the Prometheus text of `crate::metrics` (a tcp:
    /// address).
    pub metrics: Option<Address>,
}

#[derive(Debug)]
pub enum ServeError {
    NoListeners,
    Environments(String),
    Bind(Address, std::io::Error),
    Token(TokenError),
    NoTokenPath,
    Policy(String),
    /// A socket passed by the service manager that cannot be served.
    Inherited(String, std::io::Error),
}

impl fmt::Display for ServeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServeError::NoListeners => write!(f, "nothing to listen on: give --listen ADDR"),
            ServeError::Environments(error) => write!(f, "{error}"),
            ServeError::Bind(address, error) => write!(
                f,
                "cannot listen on {address}: {}",
                crate::model::io_message(error)
            ),
            ServeError::Token(error) => write!(f, "{error}"),
            ServeError::NoTokenPath => write!(
                f,
                "tcp listeners need a token: give --token-file FILE (no HOME to find the default)"
            ),
            ServeError::Policy(error) => write!(f, "{error}"),
            ServeError::Inherited(name, error) => write!(
                f,
                "socket activation: the socket {name:?}: {}",
                crate::model::io_message(error)
            ),
        }
    }
}

impl std::error::Error for ServeError {}

enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

/// Bound listeners, ready to serve.
pub struct Server {
    /// What every executor of the server shares (engine, environments,
    /// detachable processes).
    context: Rc<ServerContext>,
    listeners: Vec<(Address, Listener)>,
    unix_files: Vec<UnixSocketFile>,
    token_path: Option<PathBuf>,
    /// How each connection is served.
    serving: Rc<Serving>,
    /// The admin socket, if any.
    admin: Option<(Address, UnixListener)>,
    /// The metrics endpoint, if any.
    metrics: Option<(Address, TcpListener)>,
    /// Every socket above, known to the ports engine as served on, so that
    /// no dial through this server reaches the server itself.
    served: Vec<crate::ports::own::ServedSocket>,
}

/// What every connection of a server is served with.
struct Serving {
    /// Makes the root executor of a new connection, with its own quota.
    executor: NewExecutor,
    /// Whether its starts may take the descriptors a Unix socket's peer
    /// sends: not on a restricted server, whose socket reads drop them.
    takes_descriptors: bool,
    /// What a TCP connection must do before it gets the executor (the
    /// token can be reloaded: see [`Reloader`]).
    login: std::cell::RefCell<Option<Arc<Login>>>,
    /// TLS for every TCP listener (its certificate can be reloaded).
    tls: std::cell::RefCell<Option<TlsServer>>,
    limits: CallLimits,
    connections: Connections,
    /// The unclaimed tickets of direct channels, for every connection.
    direct: rpc::DirectChannels,
    /// Closes every connection at a clean shutdown, saying why.
    closing: Closing,
}

/// What a TCP connection must do before it gets the executor.
struct Login {
    token: Arc<Token>,
    deadline: std::time::Duration,
}

/// Connections served so far, those not logged in yet, and whether memory
/// is about to be returned.
struct Connections {
    opened: AtomicU64,
    pending: PendingLogins,
    trim_pending: std::cell::Cell<bool>,
    /// Refusals since the last one logged, and when that was.
    refusals: std::cell::Cell<(u64, Option<Instant>)>,
}

/// Refused connections are logged at most this often (with their count),
/// so a flood of them cannot flood the log.
const REFUSAL_LOG_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// How long after a connection closes its memory is handed back, so a
/// burst of closes costs one trim.
const TRIM_DELAY: std::time::Duration = std::time::Duration::from_secs(1);

impl Connections {
    fn new(pending: PendingLogins) -> Connections {
        Connections {
            opened: AtomicU64::new(0),
            pending,
            trim_pending: std::cell::Cell::new(false),
            refusals: std::cell::Cell::new((0, None)),
        }
    }

    fn refused(&self, peer: &std::net::SocketAddr, reason: &str) {
        let (count, logged) = self.refusals.get();
        let now = Instant::now();
        if logged.is_some_and(|at| now.duration_since(at) < REFUSAL_LOG_INTERVAL) {
            self.refusals.set((count + 1, logged));
            return;
        }
        tracing::warn!(%peer, refused = count + 1, "refusing connections: {reason}");
        self.refusals.set((0, Some(now)));
    }

    /// Hands memory freed by closed connections back to the system, once
    /// per [`TRIM_DELAY`]. glibc keeps it otherwise, so a burst of clients
    /// would leave the server at its peak size for good.
    fn return_free_memory_soon(serving: &Rc<Serving>) {
        if serving.connections.trim_pending.replace(true) {
            return;
        }
        let serving = Rc::clone(serving);
        tokio::task::spawn_local(async move {
            tokio::time::sleep(TRIM_DELAY).await;
            serving.connections.trim_pending.set(false);
            crate::net::body::release_recycled();
            #[cfg(target_env = "gnu")]
            // SAFETY: malloc_trim only releases free memory of the allocator.
            unsafe {
                libc::malloc_trim(0);
            }
        });
    }
}

/// Makes the root executor of a new connection, named (its number and
/// peer) for the admin's process list, whose starts may take the
/// descriptors its peer sends (a Unix socket's).
type NewExecutor = Rc<
    dyn Fn(
        &str,
        Option<&rpc::ReceivedDescriptors>,
        Option<&rpc::DirectChannels>,
    ) -> executor::Client,
>;

/// Makes the root executor of one connection.
type ConnectionExecutor = Rc<dyn Fn() -> executor::Client>;

/// How long a TLS client may take to finish its handshake; a peer that
/// stalls is dropped without holding anything else up.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl Server {
    /// Binds every listener (ports chosen where 0 was given) and, if any is
    /// TCP, loads or creates the token. Must run inside a tokio runtime.
    pub async fn bind(config: ServerConfig, engine: Engine) -> Result<Server, ServeError> {
        if config.listen.is_empty() && config.inherited.is_empty() {
            return Err(ServeError::NoListeners);
        }
        let inherited = inherited_listeners(&config.inherited)?;
        let inherited_tcp = inherited
            .iter()
            .any(|(_, _, listening)| matches!(listening, Listening::Tcp(_)));
        // No sandbox may read a login token (its policy's included).
        if let Some(path) = config.token_file.clone().or_else(default_token_path) {
            crate::sandbox::protect(&path, crate::sandbox::Secret::LoginToken);
        }
        // The cgroups (and their sentinel) from the start: the peer check
        // of every accept relies on them, and a dead server's are cleaned.
        crate::sandbox::prepare_host();
        let rules = match &config.policy {
            Some(_) if !config.upstreams.is_empty() => {
                return Err(ServeError::Policy(
                    "a restricted server runs only its own processes: restrictions cannot be \
                     combined with upstreams"
                        .into(),
                ));
            }
            Some(policy) => Some(Rc::new(
                crate::engine::Rules::unrestricted()
                    .narrowed(policy)
                    .map_err(|error| ServeError::Policy(error.message))?,
            )),
            None => None,
        };
        let links = config
            .upstreams
            .iter()
            .cloned()
            .map(|config| UpstreamLink::new(config) as Rc<dyn Upstream>)
            .collect();
        let context = Rc::new(
            ServerContext::new(
                engine,
                links,
                config.default_environment.as_deref(),
                config.retention.unwrap_or(rpc::DEFAULT_RETENTION),
            )
            .map_err(ServeError::Environments)?
            .with_holding_limits(
                config
                    .holding_limits
                    .unwrap_or_else(rpc::HoldingLimits::of_this_process),
            ),
        );
        let (login, token_path) = if config.listen.iter().any(Address::is_tcp) || inherited_tcp {
            let path = config
                .token_file
                .clone()
                .or_else(default_token_path)
                .ok_or(ServeError::NoTokenPath)?;
            let (token, created) = Token::load_or_create(&path).map_err(ServeError::Token)?;
            if created {
                tracing::info!(path = %path.display(), "created a new token file");
            }
            let login = Login {
                token: Arc::new(token),
                deadline: config.login_deadline.unwrap_or(LOGIN_DEADLINE),
            };
            (Some(login), Some(path))
        } else {
            (None, None)
        };
        let takes_descriptors = rules.is_none();
        let mut server = Server {
            serving: Rc::new(Serving {
                takes_descriptors,
                executor: new_executor(
                    &context,
                    config.max_processes_per_connection,
                    config.port_limits,
                    rules,
                ),
                login: std::cell::RefCell::new(login.map(Arc::new)),
                tls: std::cell::RefCell::new(config.tls.clone()),
                limits: config.call_limits,
                connections: Connections::new(PendingLogins::new(config.pending_logins)),
                direct: rpc::DirectChannels::default(),
                closing: Closing::new(),
            }),
            context,
            listeners: Vec::new(),
            unix_files: Vec::new(),
            token_path,
            admin: None,
            metrics: None,
            served: Vec::new(),
        };
        if let Some(address @ Address::Tcp { host, port }) = &config.metrics {
            match TcpListener::bind((host.as_str(), *port)).await {
                Ok(listener) => {
                    let local = listener
                        .local_addr()
                        .map(Address::from_socket_addr)
                        .unwrap_or_else(|_| address.clone());
                    server.metrics = Some((local, listener));
                }
                Err(error) => return Err(ServeError::Bind(address.clone(), error)),
            }
        }
        if let Some(path) = &config.admin {
            let address = Address::Unix(path.clone());
            match socket::bind_unix(path) {
                Ok((listener, file)) => {
                    server.unix_files.push(file);
                    server.admin = Some((address, listener));
                }
                Err(error) => return Err(ServeError::Bind(address, error)),
            }
        }
        for (name, address, listening) in inherited {
            let adopted = match listening {
                Listening::Unix(listener) => UnixListener::from_std(listener).map(Listener::Unix),
                Listening::Tcp(listener) => TcpListener::from_std(listener).map(Listener::Tcp),
            }
            .map_err(|error| ServeError::Bind(address.clone(), error))?;
            match adopted {
                Listener::Unix(listener) if name == ADMIN_NAME => {
                    server.admin = Some((address, listener));
                }
                Listener::Tcp(_) if name == ADMIN_NAME => {
                    return Err(ServeError::Inherited(
                        name,
                        std::io::Error::new(
                            std::io::ErrorKind::InvalidInput,
                            "the admin socket must be a Unix socket (ListenStream=/PATH)",
                        ),
                    ));
                }
                listener => server.listeners.push((address, listener)),
            }
        }
        for address in &config.listen {
            let bound = server.bind_one(address).await;
            if let Err(error) = bound {
                return Err(ServeError::Bind(address.clone(), error));
            }
        }
        server.served = server.served_sockets();
        Ok(server)
    }

    /// Registers every socket this server listens on with the ports
    /// engine: Unix ones by their file, TCP ones by their bound address.
    fn served_sockets(&self) -> Vec<crate::ports::own::ServedSocket> {
        let unix = |address: &Address| match address {
            Address::Unix(path) => match crate::ports::own::serve_unix(path) {
                Ok(served) => Some(served),
                Err(error) => {
                    // Not reachable by its path either, then.
                    tracing::warn!(%error, %address, "cannot identify a served socket's file");
                    None
                }
            },
            Address::Tcp { .. } => None,
        };
        let tcp =
            |listener: &TcpListener| listener.local_addr().ok().map(crate::ports::own::serve_tcp);
        let mut served = Vec::new();
        for (address, listener) in &self.listeners {
            served.extend(match listener {
                Listener::Unix(_) => unix(address),
                Listener::Tcp(listener) => tcp(listener),
            });
        }
        served.extend(self.admin.as_ref().and_then(|(address, _)| unix(address)));
        served.extend(
            self.metrics
                .as_ref()
                .and_then(|(_, listener)| tcp(listener)),
        );
        served
    }

    async fn bind_one(&mut self, address: &Address) -> std::io::Result<()> {
        match address {
            Address::Unix(path) => {
                let (listener, file) = socket::bind_unix(path)?;
                self.unix_files.push(file);
                self.listeners
                    .push((address.clone(), Listener::Unix(listener)));
            }
            Address::Tcp { host, port } => {
                let listener = TcpListener::bind((host.as_str(), *port)).await?;
                let local = listener.local_addr()?;
                if !local.ip().is_loopback() && self.serving.tls.borrow().is_none() {
                    tracing::warn!(
                        address = %Address::from_socket_addr(local),
                        "listening on a non-loopback address: the login token travels in clear \
                         text over TCP, so anyone who can watch this network can take it \
                         (use --tls-cert and --tls-key)"
                    );
                }
                self.listeners
                    .push((Address::from_socket_addr(local), Listener::Tcp(listener)));
            }
        }
        Ok(())
    }

    /// The addresses actually listened on (with chosen ports), in order.
    pub fn addresses(&self) -> Vec<Address> {
        self.listeners.iter().map(|(a, _)| a.clone()).collect()
    }

    /// A handle that reloads the token and the TLS certificate of this
    /// server while it serves (SIGHUP).
    pub fn reloader(&self) -> Reloader {
        Reloader {
            serving: Rc::clone(&self.serving),
            token_path: self.token_path.clone(),
        }
    }

    /// The metrics endpoint's address (port chosen), if there is one.
    pub fn metrics_address(&self) -> Option<&Address> {
        self.metrics.as_ref().map(|(address, _)| address)
    }

    /// The admin socket's address, if there is one.
    pub fn admin_address(&self) -> Option<&Address> {
        self.admin.as_ref().map(|(address, _)| address)
    }

    /// Where the TCP token is, if any listener needs one.
    pub fn token_path(&self) -> Option<&PathBuf> {
        self.token_path.as_ref()
    }

    /// Serves until `shutdown` completes, then stops accepting, terminates
    /// every child process and removes the socket files. Must run inside a
    /// `LocalSet`.
    pub async fn serve_until(mut self, shutdown: impl Future<Output = ()>) {
        let mut accepting: Vec<JoinHandle<()>> = std::mem::take(&mut self.listeners)
            .into_iter()
            .map(|(address, listener)| {
                tokio::task::spawn_local(accept_loop(address, listener, Rc::clone(&self.serving)))
            })
            .collect();
        if let Some((address, listener)) = self.metrics.take() {
            accepting.push(tokio::task::spawn_local(
                crate::net::metrics_http::accept_loop(address, listener, Rc::clone(&self.context)),
            ));
        }
        if let Some((address, listener)) = self.admin.take() {
            accepting.push(tokio::task::spawn_local(crate::net::admin::accept_loop(
                address,
                listener,
                Rc::clone(&self.context),
                self.serving.limits,
            )));
        }
        shutdown.await;
        tracing::info!("shutting down: no new connections; terminating every process");
        for task in accepting {
            task.abort();
        }
        self.context.close_upstreams();
        self.context.detachments().clear();
        self.context.engine().shutdown().await;
        self.serving.closing.close_all().await;
        self.remove_socket_files();
        tracing::info!("shut down");
    }

    /// Removes the socket files now (each removes itself when dropped:
    /// on every early return of `bind` too).
    fn remove_socket_files(&mut self) {
        self.unix_files.clear();
    }
}

/// The name of the passed socket that is the admin socket
/// (`FileDescriptorName=admin`).
const ADMIN_NAME: &str = "admin";

/// Passed sockets, checked, with their names and addresses.
fn inherited_listeners(
    inherited: &[crate::net::activation::InheritedSocket],
) -> Result<Vec<(String, Address, Listening)>, ServeError> {
    let mut listeners = Vec::new();
    for socket in inherited {
        let described = |error: std::io::Error| ServeError::Inherited(socket.name.clone(), error);
        let listening = socket.listener().map_err(described)?;
        let address = match &listening {
            Listening::Unix(listener) => {
                let path = listener
                    .local_addr()
                    .ok()
                    .and_then(|a| a.as_pathname().map(PathBuf::from))
                    .unwrap_or_else(|| PathBuf::from(format!("<{}>", socket.name)));
                warn_if_shared(&path);
                Address::Unix(path)
            }
            Listening::Tcp(listener) => {
                Address::from_socket_addr(listener.local_addr().map_err(described)?)
            }
        };
        listeners.push((socket.name.clone(), address, listening));
    }
    Ok(listeners)
}

/// A Unix socket's permissions are its authentication: a passed one that
/// others may connect to is said so (the socket unit's `SocketMode=0600`).
fn warn_if_shared(path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(
            socket = %path.display(),
            mode = format!("{:o}", meta.permissions().mode() & 0o777),
            "the passed socket is open to other users, who can run anything as this server's \
             user: set SocketMode=0600 in its socket unit"
        );
    }
}

/// Reloads what can change under a running server, without touching a
/// connection or a process: the login token (connections already logged in
/// keep going) and the TLS certificate (new handshakes use the new one).
#[derive(Clone)]
pub struct Reloader {
    serving: Rc<Serving>,
    token_path: Option<PathBuf>,
}

impl Reloader {
    /// Re-reads the token file; on failure the old token stays.
    pub fn reload_token(&self) -> Result<(), TokenError> {
        let Some(path) = &self.token_path else {
            return Ok(());
        };
        let token = Token::load(path)?;
        let mut login = self.serving.login.borrow_mut();
        if let Some(current) = login.as_ref() {
            *login = Some(Arc::new(Login {
                token: Arc::new(token),
                deadline: current.deadline,
            }));
        }
        Ok(())
    }

    /// Serves `tls` to new TCP connections from now on.
    pub fn replace_tls(&self, tls: TlsServer) {
        *self.serving.tls.borrow_mut() = Some(tls);
    }
}

/// The root executor of each new connection: each gets its own, so it has
/// its own quota; a restricted server's rules are one set for every
/// connection, so that their process counts are the server's.
fn new_executor(
    context: &Rc<ServerContext>,
    per_connection: Option<usize>,
    port_limits: rpc::PortLimits,
    rules: Option<Rc<crate::engine::Rules>>,
) -> NewExecutor {
    let context = Rc::clone(context);
    Rc::new(
        move |connection: &str,
              received: Option<&rpc::ReceivedDescriptors>,
              direct: Option<&rpc::DirectChannels>| {
            let mut quota = rpc::Quota::for_connection(per_connection, context.holdings())
                .with_port_limits(port_limits);
            if let Some(received) = received {
                quota = quota.with_received_descriptors(received.clone());
            }
            if let Some(direct) = direct {
                quota = quota.with_direct_channels(direct.clone());
            }
            let quota = quota.owned_by(connection);
            match &rules {
                Some(rules) => {
                    rpc::restricted_root_executor(Rc::clone(&context), quota, Rc::clone(rules))
                }
                None => rpc::root_executor(Rc::clone(&context), quota),
            }
        },
    )
}

/// The server's end of a connection, guarded by `limits` and `session`.
pub(crate) fn server_network<R, W>(
    reader: R,
    writer: W,
    limits: CallLimits,
    session: &Rc<Session>,
) -> Network
where
    R: tokio::io::AsyncRead + Unpin + 'static,
    W: tokio::io::AsyncWrite + Unpin + 'static,
{
    transport::network(reader, writer, Side::Server, limits, Rc::clone(session))
}

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
}

async fn accept_loop(address: Address, listener: Listener, serving: Rc<Serving>) {
    tracing::info!(%address, tls = serving.tls.borrow().is_some() && address.is_tcp(), "listening");
    loop {
        let accepted = match &listener {
            Listener::Unix(listener) => listener
                .accept()
                .await
                .map(|(stream, _)| accept_unix(stream, &serving)),
            Listener::Tcp(listener) => listener
                .accept()
                .await
                .map(|(stream, peer)| accept_tcp(stream, peer, &serving)),
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
        let make = Rc::clone(&serving.executor);
        let (received, direct) = (accepted.received.clone(), accepted.direct.clone());
        let executor: ConnectionExecutor =
            Rc::new(move || make(&connection, received.as_ref(), direct.as_ref()));
        let open = crate::metrics::connection_opened();
        tokio::task::spawn_local(
            async move {
                let _open = open;
                if let Some(network) = accepted.network.await {
                    let closing = &serving.closing;
                    serve_connection(network, executor, accepted.session, accepted.login, closing)
                        .await;
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
fn accept_unix(stream: tokio::net::UnixStream, serving: &Serving) -> Option<Accepted> {
    use std::os::fd::AsRawFd;
    if crate::sandbox::peer_is_sandboxed(stream.as_raw_fd()) {
        tracing::warn!("refusing a connection from a sandboxed process");
        return None;
    }
    let session = Session::logged_in();
    // A restricted server reads plainly: the kernel drops whatever
    // descriptors come.
    let received = serving
        .takes_descriptors
        .then(rpc::ReceivedDescriptors::default);
    let network = {
        let (limits, direct) = (serving.limits, serving.direct.clone());
        let (session, received) = (Rc::clone(&session), received.clone());
        async move {
            let stream = rpc_or_channel(stream, &direct, |stream| {
                Ok(crate::ports::Socket::Unix(stream))
            })
            .await?;
            let (reader, writer) = stream.into_split();
            Some(match received {
                Some(received) => {
                    let reader = crate::net::passing::ReceivingReader::new(reader, received);
                    server_network(reader, writer, limits, &session)
                }
                None => server_network(reader, writer, limits, &session),
            })
        }
        .boxed_local()
    };
    Some(Accepted {
        network,
        peer: "unix".to_string(),
        session,
        login: None,
        received,
        direct: Some(serving.direct.clone()),
    })
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
    let network = match &tls {
        None => {
            let (reader, writer) = stream.into_split();
            let network = server_network(reader, writer, serving.limits, &session);
            futures::future::ready(Some(network)).boxed_local()
        }
        Some(tls) => {
            tls_handshake(tls.clone(), stream, serving.limits, Rc::clone(&session)).boxed_local()
        }
    };
    Some(Accepted {
        network,
        peer: peer.to_string(),
        session,
        login: serving.login.borrow().clone(),
        received: None,
        direct: None,
    })
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
) -> Option<Network> {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(&tls.config));
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => {
            let (reader, writer) = tokio::io::split(stream);
            Some(server_network(reader, writer, limits, &session))
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

/// Serves `executor` to the peer at the other end of `reader` and `writer`
/// (any byte stream: a pipe pair, an SSH channel, stdio) until it
/// disconnects: the executor is the bootstrap, and [`CallLimits`] bound
/// what the peer may have outstanding; process quotas are the executor's
/// own (see `rpc::root_executor`). Must run inside a `LocalSet`.
pub async fn serve_stream<R, W>(
    reader: R,
    writer: W,
    executor: executor::Client,
    limits: CallLimits,
) where
    R: tokio::io::AsyncRead + Unpin + 'static,
    W: tokio::io::AsyncWrite + Unpin + 'static,
{
    let session = Session::logged_in();
    let network = server_network(reader, writer, limits, &session);
    // Nothing shuts a lone stream down but its peer.
    let closing = Closing::new();
    serve_connection(
        network,
        Rc::new(move || executor.clone()),
        session,
        None,
        &closing,
    )
    .await;
}

/// One connection: its own RpcSystem, whose bootstrap is the Executor
/// (Unix) or a Gatekeeper (TCP), to be logged in to within the login
/// deadline. When it ends, capnp releases every capability the peer held,
/// which kills its processes.
async fn serve_connection(
    network: Network,
    executor: ConnectionExecutor,
    session: Rc<Session>,
    login: Option<Arc<Login>>,
    closing: &Closing,
) {
    let _open = closing.opened();
    let started = Instant::now();
    tracing::info!("connected");
    let (bootstrap, deadline) = match login {
        None => (executor().client, None),
        Some(login) => {
            let gatekeeper: gatekeeper::Client = capnp_rpc::new_client(GatekeeperImpl::new(
                executor,
                Arc::clone(&login.token),
                Rc::clone(&session),
            ));
            let deadline = enforce_login_deadline(Rc::clone(&session), login.deadline);
            (gatekeeper.client, Some(deadline))
        }
    };
    let mut system = RpcSystem::new(network, Some(bootstrap));
    let disconnector = system.get_disconnector().with_reason(Closing::reason());
    let deadline = async move {
        if let Some(deadline) = deadline {
            deadline.await;
        }
        std::future::pending::<()>().await
    };
    let ended = tokio::select! {
        ended = &mut system => ended,
        () = deadline => unreachable!("the deadline never completes"),
        () = closing.closing() => {
            // The abort goes out after everything already queued (the
            // last events); the system ends once it has left.
            futures::future::join(disconnector, &mut system).await.1
        }
    };
    match ended {
        Ok(()) => tracing::info!(
            duration_ms = started.elapsed().as_millis() as u64,
            "disconnected"
        ),
        Err(error) => tracing::info!(
            %error,
            duration_ms = started.elapsed().as_millis() as u64,
            "connection failed"
        ),
    }
}
