//! The server side of `Executor.dial` and `Executor.listen`: a socket of
//! the ports engine joined to two `PortSink`s, one per direction, and
//! listeners that hand what they accept to the client's acceptor.
//!
//! Socket to client: one task reads only as much as the sender's window
//! has room for, so a client that stops reading stops the reads (the
//! kernel's buffers fill, then the peer's). Client to socket: writes are
//! queued in the order they arrive (at dispatch, before any await) and one
//! task writes them; each answer waits for its bytes to be in the socket.
//!
//! One file per concern: a connection's two directions through the sinks
//! (`connection.rs`), dialling and the direct channel's splice relay
//! (`dial.rs`), listeners and their accept loop (`listen.rs`), and the
//! forwards tied to a process's capability (`tied.rs`).

mod connection;
mod dial;
mod listen;
mod tied;

pub(crate) use self::dial::dial;
pub(crate) use self::listen::listen;
pub(crate) use self::tied::ProcessPorts;

use crate::capexec_capnp::{
    port_dial_params, port_dial_results, port_listen_params, port_listen_results,
};
use crate::model::{Refusal, RefusalKind};
use crate::policy::Rules;
use crate::ports::PortRules;

/// Accepted connections waiting for the acceptor's answer at once.
pub const MAX_PENDING_ACCEPTS: usize = 16;

/// `Executor.dial` and `Process.dial` (their parameters and results).
pub(crate) type DialParams = capnp::capability::Params<port_dial_params::Owned>;
pub(crate) type DialResults = capnp::capability::Results<port_dial_results::Owned>;
/// `Executor.listen` and `Process.listen`.
pub(crate) type ListenParams = capnp::capability::Params<port_listen_params::Owned>;
pub(crate) type ListenResults = capnp::capability::Results<port_listen_results::Owned>;

/// The rules of an executor's ports: `rules`' if it is restricted.
pub(crate) fn port_rules(rules: Option<&Rules>) -> &PortRules {
    static UNRESTRICTED: std::sync::LazyLock<PortRules> =
        std::sync::LazyLock::new(PortRules::unrestricted);
    rules.map_or(&UNRESTRICTED, Rules::ports)
}

pub(super) fn text_param(text: capnp::Result<capnp::text::Reader<'_>>) -> Result<String, Refusal> {
    let text = text.map_err(|error| {
        Refusal::new(
            RefusalKind::InvalidArgument,
            format!("a malformed address: {error}"),
        )
    })?;
    text.to_str().map(str::to_string).map_err(|_| {
        Refusal::new(
            RefusalKind::InvalidArgument,
            "the address is not valid UTF-8",
        )
    })
}
