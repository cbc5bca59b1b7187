//! What every connection of a server is served with: the executor each
//! gets, its login and TLS, the counters of its connections, and what a
//! reload changes.

use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use crate::capexec_capnp::executor;
use crate::net::guard::CallLimits;
use crate::net::pending::PendingLogins;
use crate::net::shutdown::Closing;
use crate::net::tls::TlsServer;
use crate::net::token::{Token, TokenError};
use crate::rpc::{self, ServerContext};

/// What every connection of a server is served with.
pub(super) struct Serving {
    /// Makes the root executor of a new connection, with its own quota.
    pub(super) executor: NewExecutor,
    /// Whether its starts may take the descriptors a Unix socket's peer
    /// sends: not on a restricted server, whose socket reads drop them.
    pub(super) takes_descriptors: bool,
    /// What the engine takes the kernel to support, which the peer checks
    /// of every accept ask (without cgroups, sandboxed peers are told by
    /// their no_new_privs and seccomp filter).
    pub(super) host: crate::sandbox::HostConfig,
    /// Places for the peer checks of local TCP connections, each a thread
    /// while it runs: a burst of connections waits for a place instead of
    /// starting a thread each (see `accept.rs`).
    pub(super) peer_lookups: std::rc::Rc<tokio::sync::Semaphore>,
    /// What a TCP connection must do before it gets the executor (the
    /// token can be reloaded: see [`Reloader`]).
    pub(super) login: std::cell::RefCell<Option<Arc<Login>>>,
    /// TLS for every TCP listener (its certificate can be reloaded).
    pub(super) tls: std::cell::RefCell<Option<TlsServer>>,
    pub(super) limits: CallLimits,
    pub(super) connections: Connections,
    /// The unclaimed tickets of direct channels, for every connection.
    pub(super) direct: rpc::DirectChannels,
    /// Closes every connection at a clean shutdown, saying why.
    pub(super) closing: Closing,
    /// Each login's user's worker, on a server that runs logins as users.
    pub(super) users: Option<Rc<super::users::Workers>>,
}

/// What a TCP connection must do before it gets the executor.
pub(super) struct Login {
    /// `None` on a server that runs logins as users: its monitor checks
    /// each token against the map.
    pub(super) token: Option<Arc<Token>>,
    pub(super) deadline: std::time::Duration,
}

/// Connections served so far, those not logged in yet, and whether memory
/// is about to be returned.
pub(super) struct Connections {
    pub(super) opened: AtomicU64,
    /// A place for each connection open, over every listener: one beyond
    /// is refused at once ([`Connections::admit`]).
    open: Arc<tokio::sync::Semaphore>,
    /// How many places there are.
    most: usize,
    pub(super) pending: PendingLogins,
    pub(super) trim_pending: std::cell::Cell<bool>,
    /// Refusals since the last one logged, and when that was.
    pub(super) refusals: std::cell::Cell<(u64, Option<Instant>)>,
}

/// Refused connections are logged at most this often (with their count),
/// so a flood of them cannot flood the log.
const REFUSAL_LOG_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// How long after a connection closes its memory is handed back, so a
/// burst of closes costs one trim.
const TRIM_DELAY: std::time::Duration = std::time::Duration::from_secs(1);

impl Connections {
    pub(super) fn new(pending: PendingLogins, most: usize) -> Connections {
        Connections {
            opened: AtomicU64::new(0),
            open: Arc::new(tokio::sync::Semaphore::new(most)),
            most,
            pending,
            trim_pending: std::cell::Cell::new(false),
            refusals: std::cell::Cell::new((0, None)),
        }
    }

    /// A place for a connection just accepted, held for as long as it is
    /// open; or why it is refused (the server holds its most).
    pub(super) fn admit(&self) -> Result<tokio::sync::OwnedSemaphorePermit, String> {
        Arc::clone(&self.open).try_acquire_owned().map_err(|_| {
            format!(
                "the server holds its most connections at once (the limit is {}); try again \
                 once others have closed",
                self.most
            )
        })
    }

    pub(super) fn refused(&self, peer: &dyn std::fmt::Display, reason: &str) {
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
    pub(super) fn return_free_memory_soon(serving: &Rc<Serving>) {
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
pub(super) type NewExecutor = Rc<
    dyn Fn(
        &str,
        Option<&rpc::ReceivedDescriptors>,
        Option<&rpc::DirectChannels>,
    ) -> executor::Client,
>;

/// Makes the root executor of one connection.
pub(super) type ConnectionExecutor = Rc<dyn Fn() -> executor::Client>;

/// Reloads what can change under a running server, without touching a
/// connection or a process: the login token (connections already logged in
/// keep going) and the TLS certificate (new handshakes use the new one).
#[derive(Clone)]
pub struct Reloader {
    pub(super) serving: Rc<Serving>,
    pub(super) token_path: Option<PathBuf>,
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
                token: Some(Arc::new(token)),
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
pub(super) fn new_executor(
    context: &Rc<ServerContext>,
    per_connection: Option<usize>,
    port_limits: rpc::PortLimits,
    rules: Option<Rc<crate::policy::Rules>>,
) -> NewExecutor {
    let context = Rc::clone(context);
    Rc::new(
        move |connection: &str,
              received: Option<&rpc::ReceivedDescriptors>,
              direct: Option<&rpc::DirectChannels>| {
            let mut allowance = rpc::Quota::for_connection(per_connection, context.holdings())
                .port_limits(port_limits)
                .owned_by(connection);
            if let Some(received) = received {
                allowance = allowance.received_descriptors(received.clone());
            }
            if let Some(direct) = direct {
                allowance = allowance.direct_channels(direct.clone());
            }
            let quota = allowance.build();
            match &rules {
                Some(rules) => {
                    rpc::restricted_root_executor(Rc::clone(&context), quota, Rc::clone(rules))
                }
                None => rpc::root_executor(Rc::clone(&context), quota),
            }
        },
    )
}
