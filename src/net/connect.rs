//! Connecting to a served Executor.

use std::fmt;
use std::time::Duration;

use capnp_rpc::RpcSystem;
use capnp_rpc::rpc_twoparty_capnp::Side;
use tokio::net::{TcpStream, UnixStream};
use tokio::task::JoinHandle;

use crate::capexec_capnp::{executor, gatekeeper};
use crate::net::address::Address;
use crate::net::socket;
use crate::net::token::Token;
use crate::net::transport;

/// How long establishing a connection may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub enum ConnectError {
    Io(Address, std::io::Error),
    Timeout(Address),
    TokenRequired(Address),
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectError::Io(address, error) => {
                write!(f, "cannot connect to {address}: {}", os_message(error))
            }
            ConnectError::Timeout(address) => write!(
                f,
                "cannot connect to {address}: no answer within {}s",
                CONNECT_TIMEOUT.as_secs()
            ),
            ConnectError::TokenRequired(address) => write!(
                f,
                "{address} needs a login token (--token-file FILE or CAPEXEC_TOKEN)"
            ),
        }
    }
}

impl std::error::Error for ConnectError {}

/// An I/O error's text without Rust's " (os error N)" suffix.
pub(crate) fn os_message(error: &std::io::Error) -> String {
    let text = error.to_string();
    match text.find(" (os error ") {
        Some(index) => text[..index].to_string(),
        None => text,
    }
}

/// A live connection to an executor server. Capabilities obtained through
/// it work while it lives; dropping it closes the connection, which releases
/// (and so terminates) every process started through it.
pub struct Connection {
    executor: executor::Client,
    rpc: JoinHandle<()>,
    /// The login's outcome once known (TCP); `None` while it is pending.
    login: Option<tokio::sync::watch::Receiver<Option<Result<(), capnp::Error>>>>,
}

impl Connection {
    /// The server's Executor. Over TCP it is the pipelined result of the
    /// login, so using it right away costs no extra round trip; a refused
    /// login makes its calls fail with the refusal.
    pub fn executor(&self) -> executor::Client {
        self.executor.clone()
    }

    /// Whether the connection has ended.
    pub fn is_closed(&self) -> bool {
        self.rpc.is_finished()
    }

    /// Waits until the server has accepted the login (at once for Unix
    /// sockets, which need none). Calls made without waiting are fine too:
    /// they fail with the refusal if there is one.
    pub async fn ready(&self) -> Result<(), capnp::Error> {
        let Some(login) = &self.login else {
            return Ok(());
        };
        let mut login = login.clone();
        match login.wait_for(Option::is_some).await {
            Ok(outcome) => outcome.clone().unwrap_or(Ok(())),
            Err(_) => Err(capnp::Error::disconnected(
                "the connection ended before the login was answered".to_string(),
            )),
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.rpc.abort();
    }
}

/// Connects to `address`; TCP addresses need `token`. Must run inside a
/// `LocalSet`.
pub async fn connect(address: &Address, token: Option<&Token>) -> Result<Connection, ConnectError> {
    let io = |error| ConnectError::Io(address.clone(), error);
    let timed_out = |_| ConnectError::Timeout(address.clone());
    let (network, token) = match address {
        Address::Unix(path) => {
            let stream = tokio::time::timeout(CONNECT_TIMEOUT, UnixStream::connect(path))
                .await
                .map_err(timed_out)?
                .map_err(io)?;
            let (reader, writer) = stream.into_split();
            (
                Box::new(transport::network(reader, writer, Side::Client))
                    as Box<dyn capnp_rpc::VatNetwork<Side>>,
                None,
            )
        }
        Address::Tcp { host, port } => {
            let token = token.ok_or_else(|| ConnectError::TokenRequired(address.clone()))?;
            let stream =
                tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect((host.as_str(), *port)))
                    .await
                    .map_err(timed_out)?
                    .map_err(io)?;
            socket::tune_tcp(&stream).map_err(io)?;
            let (reader, writer) = stream.into_split();
            (
                Box::new(transport::network(reader, writer, Side::Client))
                    as Box<dyn capnp_rpc::VatNetwork<Side>>,
                Some(token.as_str().to_string()),
            )
        }
    };
    let mut system = RpcSystem::new(network, None);
    let mut login_outcome = None;
    let executor = match token {
        None => system.bootstrap::<executor::Client>(Side::Server),
        Some(token) => {
            let gatekeeper: gatekeeper::Client = system.bootstrap(Side::Server);
            let mut login = gatekeeper.login_request();
            login.get().set_token(token.as_str());
            let login = login.send();
            let executor = login.pipeline.get_executor();
            // Keep the login question alive until it is answered; its
            // outcome reaches callers through the pipelined executor.
            let answer = login.promise;
            let (outcome, watch) = tokio::sync::watch::channel(None);
            login_outcome = Some(watch);
            tokio::task::spawn_local(async move {
                let result = answer.await.map(drop);
                if let Err(error) = &result {
                    tracing::debug!(%error, "login failed");
                }
                let _ = outcome.send(Some(result));
            });
            executor
        }
    };
    let rpc = tokio::task::spawn_local(async move {
        if let Err(error) = system.await {
            tracing::debug!(%error, "connection ended with an error");
        }
    });
    Ok(Connection {
        executor,
        rpc,
        login: login_outcome,
    })
}
