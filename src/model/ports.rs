//! Ports: connections and listeners opened on the executor's machine
//! (the schema's `Executor.dial` and `Executor.listen`), what a restricted
//! executor allows of them, and what a connection reports about itself.

use crate::model::{Address, Refusal, RefusalKind, excerpt};

/// Longest address text accepted from a peer.
pub const MAX_PORT_ADDRESS_BYTES: usize = 4096;

/// Which addresses a restricted executor may dial and listen on (the
/// schema's `PortPolicy`): patterns as text, resolved by the ports engine
/// (`ports::PortRules`). `None`: no rule of its own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortPolicy {
    pub dial: Option<Vec<String>>,
    pub listen: Option<Vec<String>>,
}

/// The two ends of a port connection, as its socket on the executor's
/// machine names them: `tcp:HOST:PORT`, `unix:PATH`, or `unix:` for an
/// unnamed Unix socket.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortConnectionInfo {
    pub local: String,
    pub peer: String,
}

/// What a port is for: an address to connect to, or to listen on (where
/// port 0 asks the kernel for a free one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortUse {
    Dial,
    Listen,
}

impl PortUse {
    /// The schema's name of the rule that governs it.
    pub fn rule(self) -> &'static str {
        match self {
            PortUse::Dial => "ports.dial",
            PortUse::Listen => "ports.listen",
        }
    }
}

/// `text` as an address to dial or listen on, checked as the schema's
/// "Ports" section says: `tcp:HOST:PORT` (port 0 only to listen) or
/// `unix:` and an absolute path, at most [`MAX_PORT_ADDRESS_BYTES`].
pub fn port_address(text: &str, use_: PortUse) -> Result<Address, Refusal> {
    let invalid = |why: String| Refusal::new(RefusalKind::InvalidArgument, why);
    if text.len() > MAX_PORT_ADDRESS_BYTES {
        return Err(invalid(format!(
            "the address is {} bytes; at most {MAX_PORT_ADDRESS_BYTES}",
            text.len()
        )));
    }
    if text.contains('\0') {
        return Err(invalid(format!(
            "address {:?} contains a NUL byte",
            excerpt(text)
        )));
    }
    let address: Address = text.parse().map_err(|error: String| {
        // The parser quotes what it read: only short texts are repeated.
        if text.len() <= crate::model::EXCERPT_BYTES {
            invalid(error)
        } else {
            invalid(format!(
                "{:?} is not an address: use tcp:HOST:PORT or unix:PATH",
                excerpt(text)
            ))
        }
    })?;
    match &address {
        Address::Tcp { port: 0, .. } if use_ == PortUse::Dial => Err(invalid(format!(
            "{:?}: port 0 cannot be dialled",
            excerpt(text)
        ))),
        Address::Unix(path) if !path.is_absolute() => Err(invalid(format!(
            "{:?}: a Unix socket path must be absolute",
            excerpt(text)
        ))),
        _ => Ok(address),
    }
}

/// The length of a direct channel's ticket (`DialResults.directTicket`),
/// in bytes.
pub const DIRECT_TICKET_BYTES: usize = 32;

/// A direct channel's ticket: what a client writes on the channel it opens
/// so that the server can tell which `dial` it carries.
pub type DirectTicket = [u8; DIRECT_TICKET_BYTES];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_addresses_are_checked_for_their_use() {
        assert_eq!(
            port_address("tcp:localhost:80", PortUse::Dial),
            Ok(Address::Tcp {
                host: "localhost".into(),
                port: 80
            })
        );
        assert!(port_address("tcp:127.0.0.1:0", PortUse::Listen).is_ok());
        for (bad, use_) in [
            ("tcp:127.0.0.1:0", PortUse::Dial),
            ("unix:relative.sock", PortUse::Dial),
            ("udp:1.2.3.4:5", PortUse::Dial),
            ("unix:/tmp/a\0b", PortUse::Listen),
        ] {
            let error = port_address(bad, use_).expect_err(bad);
            assert_eq!(error.kind, RefusalKind::InvalidArgument, "{bad}");
        }
        let long = format!("unix:/{}", "a".repeat(MAX_PORT_ADDRESS_BYTES));
        let error = port_address(&long, PortUse::Dial).expect_err("too long");
        assert!(error.message.len() < 200, "{}", error.message);
    }
}
