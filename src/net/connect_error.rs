//! Why a connection to a server could not be made, in the user's terms.

use std::fmt;
use std::time::Duration;

use crate::model::{io_message, show_duration};
use crate::net::address::Address;

#[derive(Debug)]
pub enum ConnectError {
    Io(Address, std::io::Error),
    /// No connection, or no answer from the server, within the deadline.
    Timeout(Address, Duration),
    TokenRequired(Address),
    /// TLS could not be set up: the reason, in the user's terms.
    Tls(Address, String),
    /// The server at the address answers only TLS, and TLS was not asked for.
    SpeaksTls(Address),
    /// TLS was asked for, and the server at the address does not speak it.
    NoTls(Address),
    /// What answered is not a capexec server: what it sent instead.
    NotCapexec(Address, String),
    /// The token would cross the network in clear text: the host named.
    ClearText(String),
    /// A Unix address that is not a socket, or where nothing listens.
    NotASocket(Address, String),
    /// The connection ended before the server answered.
    Closed(Address, String),
    /// The server refused the login: its reason.
    Refused(Address, String),
    /// Trust on first use: the server's certificate is not known yet (its
    /// fingerprint); nothing was sent to it.
    UnknownCertificate(Address, String),
    /// Trust on first use: the server's certificate is not the one
    /// remembered for it; nothing was sent to it.
    ChangedCertificate {
        address: Address,
        known: String,
        offered: String,
    },
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectError::Io(address, error) => {
                write!(f, "cannot connect to {address}: {}", io_message(error))
            }
            ConnectError::Timeout(address, deadline) => write!(
                f,
                "cannot connect to {address}: no answer within {} (is a capexec server \
                 listening there?)",
                show_duration(*deadline)
            ),
            ConnectError::TokenRequired(address) => write!(
                f,
                "{address} needs a login token (--token-file FILE or CAPEXEC_TOKEN)"
            ),
            ConnectError::Tls(address, why) => write!(f, "cannot connect to {address}: {why}"),
            ConnectError::SpeaksTls(address) => write!(
                f,
                "the server at {address} speaks TLS: add --tls (trust on first use), --tls-ca or \
                 --tls-pin"
            ),
            ConnectError::NoTls(address) => {
                write!(f, "the server at {address} does not speak TLS")
            }
            ConnectError::NotCapexec(address, seen) => {
                write!(
                    f,
                    "cannot connect to {address}: not a capexec server ({seen})"
                )
            }
            ConnectError::ClearText(host) => write!(
                f,
                "refusing to send the login token in clear text to {host}: give --tls (trust on \
                 first use), --tls-ca FILE or --tls-pin SHA256 (or --insecure-plaintext over a \
                 network you trust)"
            ),
            ConnectError::NotASocket(address, why) => {
                write!(f, "cannot connect to {address}: {why}")
            }
            ConnectError::Closed(address, why) => write!(f, "cannot connect to {address}: {why}"),
            ConnectError::Refused(_, why) => write!(f, "{why}"),
            ConnectError::UnknownCertificate(address, offered) => write!(
                f,
                "the server at {address} offers a TLS certificate that is not known here \
                 (SHA-256 {offered}); nothing was sent to it"
            ),
            ConnectError::ChangedCertificate {
                address,
                known,
                offered,
            } => write!(
                f,
                "the TLS certificate of {address} has CHANGED: it was {known}, it is now \
                 {offered}; nothing was sent to it (someone may be intercepting the \
                 connection, or the server has a new certificate)"
            ),
        }
    }
}

impl std::error::Error for ConnectError {}
