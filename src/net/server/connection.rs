//! One connection: its own RpcSystem behind the guard, bootstrapping the
//! executor (Unix, a stream) or a gatekeeper (TCP).

use super::serving::{ConnectionExecutor, Login};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use capnp_rpc::RpcSystem;
use capnp_rpc::rpc_twoparty_capnp::Side;

use crate::capexec_capnp::{executor, gatekeeper};
use crate::net::auth::{GatekeeperImpl, UsersLogin, enforce_login_deadline};
use crate::net::guard::CallLimits;
use crate::net::session::Session;
use crate::net::shutdown::Closing;
use crate::net::transport::{self, Network};

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
pub(super) async fn serve_connection(
    network: Network,
    executor: ConnectionExecutor,
    session: Rc<Session>,
    login: Option<(Arc<Login>, Option<UsersLogin>)>,
    closing: &Closing,
) {
    let _open = closing.opened();
    let started = Instant::now();
    tracing::info!("connected");
    let (bootstrap, deadline) = match login {
        None => (executor().client, None),
        Some((login, users)) => {
            let gatekeeper = match (&login.token, users) {
                (_, Some(users)) => GatekeeperImpl::for_users(users, Rc::clone(&session)),
                (Some(token), None) => {
                    GatekeeperImpl::new(executor, Arc::clone(token), Rc::clone(&session))
                }
                // (A server that runs logins as users always says how.)
                (None, None) => GatekeeperImpl::for_users(
                    Rc::new(|_| {
                        Box::pin(async { Err("login refused: no login is served here".into()) })
                    }),
                    Rc::clone(&session),
                ),
            };
            let gatekeeper: gatekeeper::Client = capnp_rpc::new_client(gatekeeper);
            let deadline = enforce_login_deadline(Rc::clone(&session), login.deadline);
            (gatekeeper.client, Some(deadline))
        }
    };
    let mut system = RpcSystem::new(network, Some(bootstrap));
    let deadline = async move {
        if let Some(deadline) = deadline {
            deadline.await;
        }
        std::future::pending::<()>().await
    };
    let ended = tokio::select! {
        ended = &mut system => Some(ended),
        () = deadline => unreachable!("the deadline never completes"),
        () = closing.closing() => None,
    };
    let ended = match ended {
        Some(ended) => ended,
        None => {
            // The abort goes out after everything already queued (the
            // last events); the system ends once it has left.
            let disconnector = system.get_disconnector().with_reason(closing.reason());
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
