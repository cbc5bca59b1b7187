//! The admin socket: its accept loop (every connection's bootstrap is
//! `Admin`), and a client's connection to it. Only `capexec serve --admin`
//! binds one; no other listener ever hands out the capability.

use std::rc::Rc;

use capnp_rpc::RpcSystem;
use capnp_rpc::rpc_twoparty_capnp::Side;
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinHandle;

use crate::capexec_capnp::admin;
use crate::net::address::Address;
use crate::net::connect::{ConnectError, client_network, unix_error};
use crate::net::guard::CallLimits;
use crate::net::liveness::{Watch, Watched};
use crate::net::server::server_network;
use crate::net::session::Session;
use crate::rpc::{AdminImpl, ServerContext};

/// Every admin connection's bootstrap: the server's own view
/// ([`AdminImpl`]), or another (a front's view of its workers).
pub(crate) type AdminBootstrap = Rc<dyn Fn() -> admin::Client>;

/// The server's own view of its processes.
pub(crate) fn own_admin(context: &Rc<ServerContext>) -> AdminBootstrap {
    let context = Rc::clone(context);
    Rc::new(move || capnp_rpc::new_client(AdminImpl::new(Rc::clone(&context))))
}

pub(crate) async fn accept_loop(
    address: Address,
    listener: UnixListener,
    context: Rc<ServerContext>,
    limits: CallLimits,
    bootstrap: AdminBootstrap,
) {
    tracing::info!(%address, "admin socket listening");
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!(%error, %address, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        // Mode 0600 admits every process of the server's user, sandboxed
        // ones (of any capexec server) included; `Admin` lists every
        // process's arguments and terminates any of them.
        let host = context.engine().host();
        if crate::sandbox::peer_is_sandboxed(host, std::os::fd::AsRawFd::as_raw_fd(&stream)) {
            tracing::warn!(%address, "refusing an admin connection from a sandboxed process");
            // Anything it sent before the socket refused descriptors (a
            // listener a service manager passed) is released by its close.
            crate::net::direct::Peek::close_off_this_thread(stream);
            continue;
        }
        let (reader, writer) = stream.into_split();
        let network = server_network(reader, writer, limits, &Session::logged_in());
        let admin = bootstrap();
        let system = RpcSystem::new(network, Some(admin.client));
        tokio::task::spawn_local(async move {
            tracing::info!("admin connected");
            if let Err(error) = system.await {
                tracing::info!(%error, "admin connection failed");
            }
        });
    }
}

/// A connection to an admin socket; dropping it closes the connection.
pub struct AdminConnection {
    admin: admin::Client,
    rpc: JoinHandle<()>,
    address: Address,
    /// What the socket sent, to tell a failed call from a socket that is
    /// not a capexec server's.
    watch: Rc<Watch>,
}

impl AdminConnection {
    pub fn admin(&self) -> admin::Client {
        self.admin.clone()
    }

    /// Whether the connection has ended.
    pub fn is_closed(&self) -> bool {
        self.rpc.is_finished()
    }

    /// Once a call failed: why, if what answered is not a capexec server
    /// at all (its first bytes cannot begin a Cap'n Proto frame).
    pub fn not_a_capexec_server(&self) -> Option<ConnectError> {
        self.watch
            .not_capexec()
            .map(|seen| ConnectError::NotCapexec(self.address.clone(), seen))
    }
}

impl Drop for AdminConnection {
    fn drop(&mut self) {
        self.rpc.abort();
    }
}

/// Connects to the admin socket at `address` (a `unix:` one). Must run
/// inside a `LocalSet`.
pub async fn connect_admin(address: &Address) -> Result<AdminConnection, ConnectError> {
    let Address::Unix(path) = address else {
        return Err(ConnectError::NotASocket(
            address.clone(),
            "the admin capability is served on a Unix socket only (serve --admin unix:PATH)"
                .to_string(),
        ));
    };
    let stream = UnixStream::connect(path)
        .await
        .map_err(|error| unix_error(address, path, error))?;
    let (reader, writer) = stream.into_split();
    let watch = Watch::new();
    let reader = Watched::new(reader, Rc::clone(&watch));
    let mut system = RpcSystem::new(client_network(reader, writer), None);
    let admin = system.bootstrap::<admin::Client>(Side::Server);
    let rpc = tokio::task::spawn_local(async move {
        let _ = system.await;
    });
    Ok(AdminConnection {
        admin,
        rpc,
        address: address.clone(),
        watch,
    })
}
