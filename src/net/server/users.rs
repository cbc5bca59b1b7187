//! The front of a server that runs each login as its own Unix user
//! (`--user-map`): this process runs as an unprivileged user, parses
//! every peer's bytes, and forwards each Unix peer's connection, as a
//! chain's hop does, to the worker the monitor (the root process that
//! started it) named when it accepted the connection and handed it over
//! (see `crate::users::serve_monitor`); nothing a peer sends reaches the
//! monitor.

use std::cell::RefCell;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use crate::capexec_capnp::executor;
use crate::net::address::Address;
use crate::net::auth::UNAUTHENTICATED_TAG;
use crate::net::pending::{PeerShare, PeerShares};
use crate::net::upstream::{UpstreamConfig, UpstreamLink};
use crate::rpc::{self, ServerContext, Upstream};
use crate::users::Granted;

/// What the front of a server that runs logins as users needs.
#[derive(Clone, Debug)]
pub struct UsersConfig {
    /// The front's end of the monitor's socket, on which the monitor hands
    /// over each connection it accepted, with its worker.
    pub monitor: Arc<OwnedFd>,
    /// The front's end of the socket on which it asks the monitor which
    /// worker a TCP login's token logs in to (one question at a time).
    pub requests: Option<Arc<Mutex<OwnedFd>>>,
    /// Most connections one Unix user may hold on the Unix listeners.
    pub connections_per_user: usize,
    /// Why the upgrade that started the monitor's binary did not execute
    /// the new one (see `Admin.lastUpgrade`), if it did not.
    pub failed_upgrade: Option<String>,
}

impl UsersConfig {
    /// The default of `--max-connections-per-user`.
    pub const CONNECTIONS_PER_USER: usize = 256;
}

/// The links to the workers, by uid, with the generation of the worker
/// each reaches.
pub(super) struct Workers {
    requests: Option<Arc<Mutex<OwnedFd>>>,
    links: RefCell<HashMap<u32, (u64, Rc<UpstreamLink>)>>,
    /// Each worker's admin socket, by uid (for the operator's view).
    admin_sockets: RefCell<HashMap<u32, std::path::PathBuf>>,
    context: Rc<ServerContext>,
    per_connection: Option<usize>,
    port_limits: rpc::PortLimits,
    /// The connections each local user holds on the Unix listeners, by
    /// the uid the kernel gives for the peer.
    per_user: PeerShares<u32>,
}

impl Workers {
    pub(super) fn new(
        config: &UsersConfig,
        context: Rc<ServerContext>,
        per_connection: Option<usize>,
        port_limits: rpc::PortLimits,
    ) -> Workers {
        if let Some(why) = &config.failed_upgrade {
            context.note_failed_upgrade(why.clone());
        }
        Workers {
            requests: config.requests.clone(),
            links: RefCell::new(HashMap::new()),
            admin_sockets: RefCell::new(HashMap::new()),
            context,
            per_connection,
            port_limits,
            per_user: PeerShares::new(config.connections_per_user),
        }
    }

    /// Why the monitor's last upgrade did not execute the new binary, if
    /// it did not.
    pub(super) fn failed_upgrade(&self) -> Option<String> {
        self.context.failed_upgrade()
    }

    /// A place for one more Unix connection from the user with `uid` (the
    /// kernel's word for the peer, not the monitor's verdict, so a refused
    /// login counts too), or why there is none.
    pub(super) fn admit(&self, uid: u32) -> Result<PeerShare<u32>, String> {
        self.per_user.take_for(uid).ok_or_else(|| {
            format!(
                "too many connections from uid {uid} (the limit is {} per user); close some and \
                 try again",
                self.per_user.per_peer()
            )
        })
    }

    /// The root executor of a connection the monitor handed over with
    /// `verdict`: every call goes to the worker it named, within the
    /// connection's own quota; a refusal fails every call, tagged.
    pub(super) fn executor(
        &self,
        verdict: &Result<Granted, String>,
        connection: &str,
        received: Option<&rpc::ReceivedDescriptors>,
        direct: Option<&rpc::DirectChannels>,
    ) -> executor::Client {
        let granted = match verdict {
            Ok(granted) => granted,
            Err(why) => {
                return executor::Client {
                    client: capnp_rpc::new_broken_cap(capnp::Error::failed(format!(
                        "{why} {UNAUTHENTICATED_TAG}"
                    ))),
                };
            }
        };
        let mut allowance =
            rpc::Quota::for_connection(self.per_connection, self.context.holdings())
                .port_limits(self.port_limits)
                .owned_by(connection);
        if let Some(received) = received {
            allowance = allowance.received_descriptors(received.clone());
        }
        if let Some(direct) = direct {
            allowance = allowance.direct_channels(direct.clone());
        }
        rpc::forwarded_root_executor(
            self.link(granted),
            Rc::clone(&self.context),
            allowance.build(),
        )
    }

    /// The worker the TLS client certificate with `sha256` logs in to, as
    /// the monitor says.
    pub(super) async fn verdict_for_certificate(
        &self,
        sha256: [u8; 32],
    ) -> Result<Granted, String> {
        self.ask(move |requests| crate::users::ask_for_certificate(requests, &sha256))
            .await
    }

    /// The worker a TCP login's `token` logs in to, as the monitor says.
    pub(super) async fn verdict_for_token(&self, token: String) -> Result<Granted, String> {
        self.ask(move |requests| crate::users::ask_for_token(requests, &token))
            .await
    }

    /// Asks the monitor to upgrade the server: `Ok` once it has found that
    /// the new binary takes over (the upgrade goes on, and ends this
    /// front), else why not.
    pub(super) async fn upgrade(&self) -> Result<(), String> {
        self.ask(|requests| {
            crate::users::ask_for_upgrade(requests).map(|()| Granted {
                uid: 0,
                generation: 0,
                socket: std::path::PathBuf::new(),
            })
        })
        .await
        .map(drop)
    }

    /// Asks the monitor `question` on the request socket, off the serving
    /// thread (it may be starting the worker), one question at a time.
    async fn ask(
        &self,
        question: impl FnOnce(std::os::fd::BorrowedFd<'_>) -> Result<Granted, String> + Send + 'static,
    ) -> Result<Granted, String> {
        let Some(requests) = self.requests.clone() else {
            return Err("login refused: this server takes no TCP login".to_string());
        };
        tokio::task::spawn_blocking(move || {
            use std::os::fd::AsFd;
            let requests = requests
                .lock()
                .map_err(|_| "the monitor's socket is unusable".to_string())?;
            question(requests.as_fd())
        })
        .await
        .map_err(|error| format!("asking the monitor failed: {error}"))?
    }

    /// The admin socket of every worker a login reached, with its uid, in
    /// uid order.
    pub(super) fn admin_sockets(&self) -> Vec<(u32, std::path::PathBuf)> {
        let mut sockets: Vec<_> = self
            .admin_sockets
            .borrow()
            .iter()
            .map(|(uid, path)| (*uid, path.clone()))
            .collect();
        sockets.sort();
        sockets
    }

    /// The link to the worker `granted` names: the one already made, unless
    /// that reached an older worker of the user.
    fn link(&self, granted: &Granted) -> Rc<UpstreamLink> {
        self.admin_sockets.borrow_mut().insert(
            granted.uid,
            crate::users::worker_admin_socket(&granted.socket),
        );
        let mut links = self.links.borrow_mut();
        if let Some((generation, link)) = links.get(&granted.uid) {
            if *generation == granted.generation {
                return Rc::clone(link);
            }
            link.close();
        }
        let link = UpstreamLink::new(UpstreamConfig::new(
            format!("uid {}", granted.uid),
            Address::Unix(granted.socket.clone()),
            None,
        ));
        links.insert(granted.uid, (granted.generation, Rc::clone(&link)));
        link
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for (_, link) in self.links.get_mut().values() {
            link.close();
        }
    }
}
