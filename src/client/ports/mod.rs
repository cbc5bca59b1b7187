//! Ports through an executor: [`dial`] a connection from the executor's
//! machine (the client's half of `ssh -L`), [`listen`] there and accept
//! what arrives (`ssh -R`). A connection is a [`PortStream`], tokio's
//! `AsyncRead + AsyncBufRead + AsyncWrite` (a read hands out the bytes
//! where their message brought them; see `stream`), or its two halves:
//! `shutdown` half-closes (the far peer reads
//! end of file while the other direction goes on), a reset or a lost
//! connection reads as an error, never as end of file, and dropping it
//! resets the connection unless both directions had ended.
//!
//! Flow control is end to end: a write is answered once the far socket
//! took the bytes, and the stream keeps a bounded window unanswered; what
//! arrives is answered only once read, so a slow reader here holds the
//! far writer back.
//!
//! [`dial_via`] with a Unix connection's route asks for a direct channel:
//! the bytes then go through a socket of their own, which the server
//! splices to the far socket (the sockets' own flow control), and the
//! sinks only say how each direction ended.

mod inbox;
mod stream;

use std::rc::Rc;

use tokio::sync::mpsc;

use self::inbox::new_inbox;
pub use self::stream::{DirectEnds, DirectParts, PortReadHalf, PortStream, PortWriteHalf};
use crate::capexec_capnp::{
    executor, port_acceptor, port_dial_params, port_dial_results, port_listen_params,
    port_listen_results, port_listener,
};
use crate::client::Error;
use crate::model::{Refusal, RefusalKind};
use crate::net::DirectRoute;
use crate::wire;

/// A call of `Executor.dial` or `Process.dial`, not sent yet.
pub(crate) type DialRequest =
    capnp::capability::Request<port_dial_params::Owned, port_dial_results::Owned>;
/// A call of `Executor.listen` or `Process.listen`, not sent yet.
pub(crate) type ListenRequest =
    capnp::capability::Request<port_listen_params::Owned, port_listen_results::Owned>;

/// A connection to `address` (`tcp:HOST:PORT` or `unix:PATH`) opened from
/// `executor`'s machine, its bytes in Cap'n Proto messages.
pub async fn dial(executor: &executor::Client, address: &str) -> Result<PortStream, Error> {
    dial_with(executor.dial_request(), address, None).await
}

/// A connection to `address` opened from `executor`'s machine, whose bytes
/// skip Cap'n Proto if `route` (its connection's
/// [`crate::net::Connection::direct_route`]) is given and the server
/// grants a direct channel: the server then moves them kernel to kernel
/// (see "Direct channels" in the schema). Otherwise as [`dial`].
pub async fn dial_via(
    executor: &executor::Client,
    address: &str,
    route: Option<&DirectRoute>,
) -> Result<PortStream, Error> {
    dial_with(executor.dial_request(), address, route).await
}

/// The connection `request` opens to `address`, through a direct channel
/// on `route` if the server grants one.
pub(crate) async fn dial_with(
    mut request: DialRequest,
    address: &str,
    route: Option<&DirectRoute>,
) -> Result<PortStream, Error> {
    let (inbox, sink) = new_inbox();
    request.get().set_address(address);
    request.get().set_from_socket(sink);
    request.get().set_direct(route.is_some());
    let response = request.send().promise.await?;
    let results = response.get()?;
    let mut channel = None;
    if let (Some(route), true) = (route, results.has_direct_ticket()) {
        let ticket: crate::model::DirectTicket =
            results.get_direct_ticket()?.try_into().map_err(|_| {
                Error::Rpc(capnp::Error::failed(
                    "a malformed direct-channel ticket".into(),
                ))
            })?;
        match route.open(&ticket).await {
            Ok(opened) => channel = Some(opened),
            Err(error) => {
                tracing::debug!(
                    error = %crate::model::io_message(&error),
                    "no direct channel; the connection goes through its sinks"
                );
            }
        }
    }
    let declined = results.has_direct_ticket() && route.is_some() && channel.is_none();
    let stream = PortStream::new(
        inbox,
        results.get_to_socket()?,
        results.get_connection()?,
        wire::port_info_from_wire(results.get_info()?)?,
        channel,
    );
    if declined {
        // A write, even an empty one, declines the channel: the sinks
        // carry the bytes.
        stream.decline_channel();
    }
    Ok(stream)
}

/// A socket listening on the executor's machine. Dropping it stops the
/// listening and resets the connections it accepted that are still open.
pub struct PortListener {
    address: String,
    incoming: mpsc::Receiver<PortStream>,
    _listener: port_listener::Client,
}

impl PortListener {
    /// Where it listens, on the executor's machine (a port 0 asked for is
    /// the port the kernel chose).
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The next connection; `None` once the listener is gone (its
    /// connection to the executor was lost).
    pub async fn accept(&mut self) -> Option<PortStream> {
        self.incoming.recv().await
    }
}

/// Hands accepted connections to [`PortListener::accept`], one at a time:
/// the server waits for each answer (at most a few at once), so
/// connections nobody accepts wait in the far kernel's backlog.
struct Acceptor {
    incoming: mpsc::Sender<PortStream>,
}

impl port_acceptor::Server for Acceptor {
    async fn accept(
        self: Rc<Self>,
        params: port_acceptor::AcceptParams,
        mut results: port_acceptor::AcceptResults,
    ) -> Result<(), capnp::Error> {
        let params = params.get()?;
        let (inbox, sink) = new_inbox();
        let stream = PortStream::new(
            inbox,
            params.get_to_socket()?,
            params.get_connection()?,
            wire::port_info_from_wire(params.get_info()?)?,
            None,
        );
        self.incoming.send(stream).await.map_err(|_| {
            capnp::Error::from(Refusal::new(
                RefusalKind::SocketFailed,
                "the client no longer accepts connections",
            ))
        })?;
        results.get().set_from_socket(sink);
        Ok(())
    }
}

/// Listens on `address` on `executor`'s machine.
pub async fn listen(executor: &executor::Client, address: &str) -> Result<PortListener, Error> {
    listen_with(executor.listen_request(), address).await
}

/// The listener `request` makes on `address`.
pub(crate) async fn listen_with(
    mut request: ListenRequest,
    address: &str,
) -> Result<PortListener, Error> {
    let (incoming, receiver) = mpsc::channel(1);
    let acceptor: port_acceptor::Client = capnp_rpc::new_client(Acceptor { incoming });
    request.get().set_address(address);
    request.get().set_acceptor(acceptor);
    let response = request.send().promise.await?;
    let results = response.get()?;
    Ok(PortListener {
        address: results
            .get_address()?
            .to_string()
            .map_err(|error| Error::Rpc(capnp::Error::failed(error.to_string())))?,
        incoming: receiver,
        _listener: results.get_listener()?,
    })
}

#[cfg(test)]
mod tests;
