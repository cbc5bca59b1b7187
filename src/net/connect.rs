//! Connecting to a served Executor.

use std::fmt;
use std::time::Duration;

use capnp_rpc::RpcSystem;
use capnp_rpc::rpc_twoparty_capnp::Side;
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::capexec_capnp::{executor, gatekeeper};
use crate::net::address::Address;
use crate::net::guard::CallLimits;
use crate::net::session::Session;
use crate::net::socket;
use crate::net::tls::TlsClient;
use crate::net::token::Token;
use crate::net::transport;

/// How long establishing a connection may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub enum ConnectError {
    Io(Address, std::io::Error),
    Timeout(Address),
    TokenRequired(Address),
    /// TLS could not be set up: the reason, in the user's terms.
    Tls(Address, String),
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
            ConnectError::Tls(address, why) => write!(f, "cannot connect to {address}: {why}"),
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

/// The client's end of a connection: its peer is the server the user
/// chose, so only the message limit applies, from the start.
fn client_network<R, W>(reader: R, writer: W) -> transport::Network
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
    /// Tells the RPC task to disconnect: capabilities still held then fail
    /// with `disconnected` instead of waiting forever.
    close: Option<oneshot::Sender<()>>,
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
}

impl Drop for Connection {
    fn drop(&mut self) {
        if let Some(close) = self.close.take() {
            let _ = close.send(());
        }
    }
}

/// Connects to `address`; TCP addresses need `token`. Must run inside a
/// `LocalSet`.
pub async fn connect(address: &Address, token: Option<&Token>) -> Result<Connection, ConnectError> {
    connect_with(address, token, None).await
}

/// Connects to `address`, over TLS (TCP only) if `tls` is given; TCP
/// addresses need `token`. Must run inside a `LocalSet`.
pub async fn connect_with(
    address: &Address,
    token: Option<&Token>,
    tls: Option<&TlsClient>,
) -> Result<Connection, ConnectError> {
    let io = |error| ConnectError::Io(address.clone(), error);
    let timed_out = |_| ConnectError::Timeout(address.clone());
    let (network, token) = match address {
        Address::Unix(_) if tls.is_some() => {
            return Err(ConnectError::Tls(
                address.clone(),
                "TLS is for tcp: addresses; a Unix socket is protected by its file permissions"
                    .to_string(),
            ));
        }
        Address::Unix(path) => {
            let stream = tokio::time::timeout(CONNECT_TIMEOUT, UnixStream::connect(path))
                .await
                .map_err(timed_out)?
                .map_err(io)?;
            let (reader, writer) = stream.into_split();
            (client_network(reader, writer), None)
        }
        Address::Tcp { host, port } => {
            let token = token.ok_or_else(|| ConnectError::TokenRequired(address.clone()))?;
            let stream =
                tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect((host.as_str(), *port)))
                    .await
                    .map_err(timed_out)?
                    .map_err(io)?;
            socket::tune_tcp(&stream).map_err(io)?;
            let network = match tls {
                None => {
                    let (reader, writer) = stream.into_split();
                    client_network(reader, writer)
                }
                Some(tls) => {
                    let failed = |why| ConnectError::Tls(address.clone(), why);
                    let name = rustls::pki_types::ServerName::try_from(host.clone())
                        .map_err(|_| failed(format!("TLS: {host:?} is not a valid server name")))?;
                    let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
                    let stream =
                        tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(name, stream))
                            .await
                            .map_err(timed_out)?
                            .map_err(|error| failed(tls.explain(host, &error)))?;
                    let (reader, writer) = tokio::io::split(stream);
                    client_network(reader, writer)
                }
            };
            (network, Some(token.as_str().to_string()))
        }
    };
    let mut system = RpcSystem::new(network, None);
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
            tokio::task::spawn_local(async move {
                if let Err(error) = answer.await {
                    tracing::debug!(%error, "login failed");
                }
            });
            executor
        }
    };
    let disconnector = system.get_disconnector();
    let (close, closed) = oneshot::channel::<()>();
    let rpc = tokio::task::spawn_local(async move {
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
        close: Some(close),
    })
}
