//! `capexec serve`: listeners, one RpcSystem per connection, shutdown.
//!
//! One file per concern: configuration, binding and shutdown (this file),
//! how every connection is served and what a reload changes
//! (`serving.rs`), accepting on a listener, with the TLS handshake and the
//! refusals of connections beyond the limits (`accept.rs`), and one
//! connection's RpcSystem (`connection.rs`).

mod accept;
mod connection;
mod serving;
mod upgrade;
mod users;
mod users_admin;

pub use self::upgrade::{
    HANDOVER_VERSION, HandedOver, UPGRADE_REASON, keep_across_exec, unblock_serving_signals,
};
pub use self::users::UsersConfig;

pub use self::connection::serve_stream;
pub(crate) use self::connection::server_network;
pub use self::serving::Reloader;

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;

use tokio::net::{TcpListener, UnixListener};
use tokio::task::JoinHandle;

use self::accept::accept_loop;
use self::serving::{Connections, Login, Serving, new_executor};
use crate::engine::Engine;
use crate::net::activation::Listening;
use crate::net::address::Address;
use crate::net::auth::LOGIN_DEADLINE;
use crate::net::guard::CallLimits;
use crate::net::pending::{PendingLimits, PendingLogins};
use crate::net::shutdown::Closing;
use crate::net::socket::{self, UnixSocketFile};
use crate::net::tls::TlsServer;
use crate::net::token::{Token, TokenError, default_token_path};
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
    /// Most connections open at once over every listener (`None`: the
    /// share of the descriptor limit `engine::descriptors` keeps for
    /// them).
    pub max_connections: Option<usize>,
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
    /// Serve as the front of a server that runs each login as its own
    /// Unix user: the monitor hands over the Unix logins it accepted, and
    /// says which worker a TCP login's token logs in to; every login's
    /// calls go to that worker.
    pub users: Option<UsersConfig>,
    /// What the binary before handed over at an upgrade: listeners (which
    /// replace `listen`, `admin` and `metrics`) and processes.
    pub handover: Option<Arc<HandedOver>>,
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
    /// Logins as users cannot be served as configured.
    Users(String),
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
            ServeError::Users(why) => write!(f, "--user-map: {why}"),
        }
    }
}

impl std::error::Error for ServeError {}

pub(super) enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
    /// The monitor of a server that runs logins as users, handing over
    /// the connections it accepted.
    Monitor(tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>),
}

/// Where a server's upgrades come from (SIGUSR2, `Admin.upgrade`), each
/// with where its answer goes, and the binary and arguments it re-executes
/// into.
pub struct Upgrades {
    pub requests: tokio::sync::mpsc::UnboundedReceiver<UpgradeRequest>,
    /// Where `Admin.upgrade` sends its requests.
    pub sender: tokio::sync::mpsc::UnboundedSender<UpgradeRequest>,
    /// Why this server cannot be upgraded in place, if it cannot: every
    /// request is answered with it.
    pub refused: Option<String>,
    pub exe: PathBuf,
    pub args: Vec<std::ffi::OsString>,
}

pub use crate::rpc::UpgradeRequest;

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
    /// Each listener as an upgrade hands it over.
    handed: Vec<upgrade::HandedListener>,
}

impl Server {
    /// Binds every listener (ports chosen where 0 was given) and, if any is
    /// TCP, loads or creates the token. Must run inside a tokio runtime.
    /// Every step that fails drops what the steps before it made: a socket
    /// file among them removes itself.
    pub async fn bind(config: ServerConfig, engine: Engine) -> Result<Server, ServeError> {
        if config.listen.is_empty() && config.inherited.is_empty() && config.users.is_none() {
            return Err(ServeError::NoListeners);
        }
        let inherited = inherited_listeners(&config.inherited)?;
        let inherited_tcp = inherited
            .iter()
            .any(|(_, _, listening)| matches!(listening, Listening::Tcp(_)));
        prepare_host(&config, engine.host());
        let host = engine.host().clone();
        let rules = restriction(&config)?;
        let context = server_context(&config, engine)?;
        let (login, token_path) = login(&config, inherited_tcp)?;
        let users = match &config.users {
            None => None,
            Some(users) => Some(Rc::new(users::Workers::new(
                users,
                Rc::clone(&context),
                config.max_processes_per_connection,
                config.port_limits,
            ))),
        };
        let mut server = Server {
            serving: Rc::new(Serving {
                takes_descriptors: rules.is_none(),
                host,
                peer_lookups: std::rc::Rc::new(tokio::sync::Semaphore::new(
                    accept::PEER_LOOKUPS_AT_ONCE,
                )),
                executor: new_executor(
                    &context,
                    config.max_processes_per_connection,
                    config.port_limits,
                    rules,
                ),
                login: std::cell::RefCell::new(login.map(Arc::new)),
                tls: std::cell::RefCell::new(config.tls.clone()),
                limits: config.call_limits,
                connections: Connections::new(
                    PendingLogins::new(config.pending_logins),
                    config
                        .max_connections
                        .unwrap_or_else(rpc::HoldingLimits::connections_of_this_process),
                ),
                direct: rpc::DirectChannels::default(),
                closing: Closing::new(),
                users,
            }),
            context,
            listeners: Vec::new(),
            unix_files: Vec::new(),
            token_path,
            admin: None,
            metrics: None,
            served: Vec::new(),
            handed: Vec::new(),
        };
        server.bind_metrics(config.metrics.as_ref()).await?;
        server.bind_admin(config.admin.as_ref())?;
        server.adopt(inherited)?;
        if let Some(handover) = &config.handover {
            server.take_over(handover);
        }
        for address in &config.listen {
            server
                .bind_one(address)
                .await
                .map_err(|error| ServeError::Bind(address.clone(), error))?;
        }
        if let Some(users) = &config.users {
            let monitor = users
                .monitor
                .try_clone()
                .and_then(|fd| {
                    // SAFETY: an OwnedFd keeps its descriptor open and
                    // unchanged for as long as the AsyncFd owns it.
                    unsafe {
                        tokio::io::unix::AsyncFd::register_with_interest(
                            fd,
                            tokio::io::Interest::READABLE,
                        )
                    }
                    .map_err(|error| error.into_parts().1)
                })
                .map_err(|error| ServeError::Users(format!("the monitor's socket: {error}")))?;
            server.listeners.push((
                Address::Unix(PathBuf::from("<the monitor>")),
                Listener::Monitor(monitor),
            ));
        }
        server.served = server.served_sockets();
        // Made now, before the addresses are printed: a server's open
        // descriptors are stable once it says where it listens.
        server.handed = server.listeners_to_hand_over();
        Ok(server)
    }

    /// The metrics endpoint, if there is one (a tcp: address).
    async fn bind_metrics(&mut self, address: Option<&Address>) -> Result<(), ServeError> {
        if let Some(address @ Address::Tcp { host, port }) = address {
            match TcpListener::bind((host.as_str(), *port)).await {
                Ok(listener) => {
                    let local = listener
                        .local_addr()
                        .map(Address::from_socket_addr)
                        .unwrap_or_else(|_| address.clone());
                    self.metrics = Some((local, listener));
                }
                Err(error) => return Err(ServeError::Bind(address.clone(), error)),
            }
        }
        Ok(())
    }

    /// The admin socket, if there is one.
    fn bind_admin(&mut self, path: Option<&PathBuf>) -> Result<(), ServeError> {
        if let Some(path) = path {
            let address = Address::Unix(path.clone());
            match socket::bind_unix(path) {
                Ok((listener, file)) => {
                    // Its connections are read plainly: a descriptor sent
                    // would be closed on the serving thread.
                    crate::sys::refuse_descriptors_or_warn(
                        std::os::fd::AsFd::as_fd(&listener),
                        "the admin socket",
                    );
                    self.unix_files.push(file);
                    self.admin = Some((address, listener));
                }
                Err(error) => return Err(ServeError::Bind(address, error)),
            }
        }
        Ok(())
    }

    /// The sockets a service manager passed, as listeners; the one named
    /// [`ADMIN_NAME`] as the admin socket.
    fn adopt(&mut self, inherited: Vec<(String, Address, Listening)>) -> Result<(), ServeError> {
        for (name, address, listening) in inherited {
            let adopted = match listening {
                Listening::Unix(listener) => UnixListener::from_std(listener).map(Listener::Unix),
                Listening::Tcp(listener) => TcpListener::from_std(listener).map(Listener::Tcp),
            }
            .map_err(|error| ServeError::Bind(address.clone(), error))?;
            match adopted {
                Listener::Unix(listener) if name == ADMIN_NAME => {
                    // Read plainly, as when bound here (`bind_admin`).
                    crate::sys::refuse_descriptors_or_warn(
                        std::os::fd::AsFd::as_fd(&listener),
                        "the admin socket",
                    );
                    self.admin = Some((address, listener));
                }
                Listener::Tcp(listener) if name == upgrade::METRICS_NAME => {
                    self.metrics = Some((address, listener));
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
                listener => self.listeners.push((address, listener)),
            }
        }
        Ok(())
    }

    /// Takes over what the binary before handed over: its socket files
    /// (removed at the end, as this server's own), then its processes,
    /// whose exits the reaper thread, started only now, reports.
    fn take_over(&mut self, handover: &HandedOver) {
        if let Some(why) = &handover.failed_upgrade {
            tracing::error!(
                "the upgrade did not execute the new binary ({why}): \
                 serving on from the binary before, which took everything back"
            );
            self.context.note_failed_upgrade(why.clone());
        }
        for listener in &handover.listeners {
            if let Some((path, lock)) = &listener.file {
                // SAFETY: kept open across the exec for us; ours alone.
                let lock = unsafe {
                    libc::fcntl(*lock, libc::F_SETFD, libc::FD_CLOEXEC);
                    <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(*lock)
                };
                self.unix_files
                    .push(UnixSocketFile::taken_over(path.clone(), lock));
            }
        }
        // Off this thread: a close may wait on a pipe's lock.
        crate::sys::close_in_background(std::mem::take(
            &mut *handover.to_close.lock().unwrap_or_else(|p| p.into_inner()),
        ));
        let Some(upgrade::Processes {
            processes,
            detached,
            blob,
        }) = handover.take()
        else {
            return;
        };
        let count = processes.len();
        let owners = self.context.engine().take_over(processes, blob);
        if let Err(error) = crate::engine::become_subreaper() {
            tracing::error!(%error, "cannot reap the processes taken over");
        }
        tracing::info!(
            processes = count,
            taken = owners.len(),
            "took over the processes of the binary before"
        );
        self.context.take_over_detached(owners, detached);
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
                Listener::Monitor(_) => None,
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
                if self.serving.users.is_some() {
                    // Every local user may connect: the kernel says who
                    // each peer is, and its worker runs as that user.
                    use std::os::unix::fs::PermissionsExt;
                    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
                }
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
    pub async fn serve_until(self, shutdown: impl Future<Output = ()>) {
        self.serve_until_or_upgraded(shutdown, None).await;
    }

    /// [`Server::serve_until`], and upgrades as `upgrades` asks for them:
    /// re-executes into the binary it names, handing everything over (see
    /// `upgrade.rs`); returns only at the end of a shutdown.
    pub async fn serve_until_or_upgraded(
        mut self,
        shutdown: impl Future<Output = ()>,
        mut upgrades: Option<Upgrades>,
    ) {
        let handed = std::mem::take(&mut self.handed);
        if let Some(upgrades) = &upgrades {
            self.context.serve_upgrades(upgrades.sender.clone());
        }
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
        let front_accepting = users_admin::Accepting::default();
        if let Some((address, listener)) = self.admin.take() {
            // A front holds no process: its operator sees the workers'.
            let bootstrap: crate::net::admin::AdminBootstrap = match &self.serving.users {
                Some(workers) => {
                    let admin = Rc::new(users_admin::UsersAdmin::new(
                        Rc::clone(workers),
                        Rc::clone(&front_accepting),
                    ));
                    Rc::new(move || capnp_rpc::new_client_from_rc(Rc::clone(&admin)))
                }
                None => crate::net::admin::own_admin(&self.context),
            };
            accepting.push(tokio::task::spawn_local(crate::net::admin::accept_loop(
                address,
                listener,
                Rc::clone(&self.context),
                self.serving.limits,
                bootstrap,
            )));
        }
        front_accepting
            .borrow_mut()
            .extend(accepting.iter().map(JoinHandle::abort_handle));
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let request = match upgrades.as_mut() {
                None => {
                    shutdown.as_mut().await;
                    break;
                }
                Some(upgrades) => tokio::select! {
                    () = shutdown.as_mut() => break,
                    request = upgrades.requests.recv() => request,
                },
            };
            let (Some(request), Some(to)) = (request, upgrades.as_ref()) else {
                upgrades = None;
                continue;
            };
            let asked = request.is_some();
            let answer = |result: Result<(), String>| {
                if let Some(answer) = request {
                    let _ = answer.send(result);
                }
            };
            // The front of a server that runs logins as users: its
            // monitor, upgrading, tells it to end (SIGUSR2) and starts a
            // front of the new binary on the same listeners.
            if self.serving.users.is_some() {
                if asked {
                    answer(Err("the front is upgraded by its monitor".to_string()));
                    continue;
                }
                tracing::info!(
                    "upgrading: closing every connection; the monitor starts a new front"
                );
                self.close_for_upgrade(&accepting).await;
                return;
            }
            if let Some(why) = to.refused.clone() {
                tracing::warn!("upgrade refused: {why}");
                answer(Err(why));
                continue;
            }
            tracing::info!(binary = %to.exe.display(), "upgrade asked for: checking the new binary");
            if let Err(why) = upgrade::check(self.context.engine(), &to.exe, &to.args).await {
                tracing::warn!("upgrade refused, still serving: {why}");
                answer(Err(why));
                continue;
            }
            // Last, right before the freeze: a thread asleep on a pipe's
            // lock would keep the exec waiting (`Engine::freeze`).
            let held = self.context.engine().holding_their_pipes_locked().await;
            if !held.is_empty() {
                let why = pipes_held_locked(&held);
                tracing::warn!("upgrade refused, still serving: {why}");
                answer(Err(why));
                continue;
            }
            // What is to be closed from here on is kept for the next
            // binary (a descriptor a client sent may be a pipe whose lock
            // it holds), and the closes in progress must end: one asleep
            // on such a lock would keep the exec waiting.
            crate::sys::keep_closes_for_the_next_binary();
            if let Err(asleep) = upgrade::closes_end().await {
                crate::sys::close_what_was_kept();
                let why = format!(
                    "{asleep} close{} of descriptors sleep{} on a lock held elsewhere (a pipe a \
                     client sent and holds locked), and the exec would wait for as long as that \
                     lasts; end what holds it, and try again",
                    if asleep == 1 { "" } else { "s" },
                    if asleep == 1 { "s" } else { "" },
                );
                tracing::warn!("upgrade refused, still serving: {why}");
                answer(Err(why));
                continue;
            }
            // No connection is accepted from here on: what connects waits
            // in the backlog for the new binary. A client told that the
            // upgrade goes on confirms it by reconnecting, which must not
            // reach this binary before its exec.
            for task in &accepting {
                task.abort();
            }
            answer(Ok(()));
            // The answer's task, then the admin connection's writer, run
            // before anything else is torn down (an idle server has no
            // other await before the exec); a client that misses it
            // anyway sees its connection end and confirms by reconnecting.
            for _ in 0..16 {
                tokio::task::yield_now().await;
            }
            tracing::info!("upgrading: closing every connection, handing every process over");
            // Frozen first: the processes the connections' ends let go
            // are only signalled, their pipes untouched (`Engine::freeze`).
            self.context.engine().freeze().await;
            self.close_for_upgrade(&accepting).await;
            let (handover, detached) = self.context.write_down_for_handover();
            let listeners = handed
                .iter()
                .map(|listener| upgrade::ListenerState {
                    name: listener.name.clone(),
                    fd: std::os::fd::AsRawFd::as_raw_fd(&listener.fd),
                    file: listener.file.clone(),
                })
                .collect();
            let pids: Vec<i32> = handover.processes.iter().map(|p| p.pid()).collect();
            let error = upgrade::exec(
                &to.exe,
                &to.args,
                listeners,
                handover.processes,
                detached,
                &handover.blob,
                handover.descriptors,
            );
            // Nothing can run the frozen processes any more: as a crash,
            // nothing is left behind.
            tracing::error!("the upgrade failed after the hand-over began: {error}");
            for pid in pids {
                // SAFETY: kill(2) of the process groups of our own children.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
            }
            std::process::exit(125);
        }
        tracing::info!("shutting down: no new connections; terminating every process");
        for task in accepting {
            task.abort();
        }
        // The listening sockets close now (a client is refused at once, not
        // left in a backlog nobody accepts from).
        drop(handed);
        self.context.close_upstreams();
        self.context.detachments().clear();
        self.context.engine().shutdown().await;
        self.serving.closing.close_all().await;
        self.remove_socket_files();
        tracing::info!("shut down");
    }

    /// Stops accepting (the listening sockets stay open: what connects
    /// meanwhile waits in the backlog) and closes every connection, saying
    /// the server is upgrading.
    async fn close_for_upgrade(&self, accepting: &[JoinHandle<()>]) {
        for task in accepting {
            task.abort();
        }
        self.context.close_upstreams();
        self.serving
            .closing
            .close_all_now(upgrade::UPGRADE_REASON)
            .await;
    }

    /// Every listener as an upgrade hands it over: its name, a duplicate
    /// of its descriptor (open while the accept loops own theirs), and for
    /// a Unix socket its file and lock.
    fn listeners_to_hand_over(&self) -> Vec<upgrade::HandedListener> {
        use std::os::fd::AsFd;
        let file_of = |address: &Address| match address {
            Address::Unix(path) => self
                .unix_files
                .iter()
                .map(UnixSocketFile::handover_parts)
                .find(|(file, _)| file == path),
            Address::Tcp { .. } => None,
        };
        let mut handed = Vec::new();
        let mut hand = |name: &str, fd: std::os::fd::BorrowedFd<'_>, address: &Address| match fd
            .try_clone_to_owned()
        {
            Ok(fd) => handed.push(upgrade::HandedListener {
                name: name.to_string(),
                fd,
                file: file_of(address),
            }),
            Err(error) => {
                tracing::warn!(%error, %address, "an upgrade could not hand this listener over")
            }
        };
        for (address, listener) in &self.listeners {
            match listener {
                Listener::Unix(listener) => hand("listener", listener.as_fd(), address),
                Listener::Tcp(listener) => hand("listener", listener.as_fd(), address),
                Listener::Monitor(_) => {}
            }
        }
        if let Some((address, listener)) = &self.admin {
            hand(ADMIN_NAME, listener.as_fd(), address);
        }
        if let Some((address, listener)) = &self.metrics {
            hand(upgrade::METRICS_NAME, listener.as_fd(), address);
        }
        handed
    }

    /// Removes the socket files now (each removes itself when dropped:
    /// on every early return of `bind` too).
    fn remove_socket_files(&mut self) {
        self.unix_files.clear();
    }
}

/// What the host needs before anything is served: no sandbox may read
/// the login token, and the cgroups exist (unless `host` hides them).
fn prepare_host(config: &ServerConfig, host: &crate::sandbox::HostConfig) {
    // No sandbox may read a login token (its policy's included).
    if let Some(path) = config.token_file.clone().or_else(default_token_path) {
        crate::sandbox::protect(&path, crate::sandbox::Secret::LoginToken);
    }
    // The cgroups (and their sentinel) from the start: the peer check
    // of every accept relies on them, and a dead server's are cleaned.
    crate::sandbox::prepare_host(host);
}

/// The rules of a restricted server, if it is one.
fn restriction(config: &ServerConfig) -> Result<Option<Rc<crate::policy::Rules>>, ServeError> {
    let rules = match &config.policy {
        Some(_) if !config.upstreams.is_empty() => {
            return Err(ServeError::Policy(
                "a restricted server runs only its own processes: restrictions cannot be \
                 combined with upstreams"
                    .into(),
            ));
        }
        Some(policy) => Some(Rc::new(
            crate::policy::Rules::unrestricted()
                .narrowed(policy)
                .map_err(|error| ServeError::Policy(error.message))?,
        )),
        None => None,
    };
    Ok(rules)
}

/// What every executor of the server shares.
fn server_context(config: &ServerConfig, engine: Engine) -> Result<Rc<ServerContext>, ServeError> {
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
    Ok(context)
}

/// The login of TCP connections and where its token is, if any listener
/// is TCP.
fn login(
    config: &ServerConfig,
    inherited_tcp: bool,
) -> Result<(Option<Login>, Option<PathBuf>), ServeError> {
    let tcp = config.listen.iter().any(Address::is_tcp) || inherited_tcp;
    if tcp && config.users.is_some() {
        // The monitor checks each token against the map's token files.
        let login = Login {
            token: None,
            deadline: config.login_deadline.unwrap_or(LOGIN_DEADLINE),
        };
        return Ok((Some(login), None));
    }
    let (login, token_path) = if tcp {
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
            token: Some(Arc::new(token)),
            deadline: config.login_deadline.unwrap_or(LOGIN_DEADLINE),
        };
        (Some(login), Some(path))
    } else {
        (None, None)
    };
    Ok((login, token_path))
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
                let path = socket.path.clone().unwrap_or_else(|| {
                    listener
                        .local_addr()
                        .ok()
                        .and_then(|a| a.as_pathname().map(PathBuf::from))
                        .unwrap_or_else(|| PathBuf::from(format!("<{}>", socket.name)))
                });
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

/// Why an upgrade cannot begin while `held` hold their pipes locked.
fn pipes_held_locked(held: &[crate::engine::HoldingItsPipeLocked]) -> String {
    let named: Vec<String> = held.iter().map(ToString::to_string).collect();
    format!(
        "{} {} a pipe of its own locked (something it started waits in a splice into or out of it), \
         and the exec would wait for as long as that lasts; end {} or what holds the pipe, and try again",
        named.join(", "),
        if held.len() == 1 {
            "holds"
        } else {
            "each hold"
        },
        if held.len() == 1 { "it" } else { "them" },
    )
}
