//! Serving the Executor over Unix sockets and TCP, and connecting to one.
//!
//! A Unix socket is created mode 0600 and bootstraps the `Executor`: file
//! permissions are the authentication. A TCP listener bootstraps a
//! `Gatekeeper` whose `login(token)` returns the `Executor`, so an
//! unauthenticated peer can reach nothing else.

pub mod activation;
mod address;
mod admin;
mod auth;
mod body;
mod certificate;
mod connect;
mod connect_error;
mod direct;
mod first_bytes;
mod frame;
mod guard;
mod liveness;
mod local_socket;
mod metrics_http;
mod outgoing_bytes;
mod passing;
mod pending;
mod records;
mod server;
mod session;
mod shutdown;
mod socket;
mod tls;
mod token;
mod transport;
mod trust;
mod upstream;
mod writer;

pub use self::address::Address;
pub use self::admin::{AdminConnection, connect_admin};
pub use self::auth::UNAUTHENTICATED_TAG;
pub use self::connect::{
    CONNECT_TIMEOUT, ConnectError, ConnectOptions, Connection, connect, connect_to, connect_with,
};
pub use self::direct::{CHANNEL_MAGIC, DirectRoute, PREAMBLE_WITHIN};
pub use self::guard::CallLimits;
pub use self::local_socket::{
    default_admin_socket_path, default_socket_dir, default_socket_path, ensure_private_dir,
};
pub(crate) use self::outgoing_bytes::send_write;
pub use self::pending::PendingLimits;
pub use self::server::{
    HANDOVER_VERSION, HandedOver, Reloader, ServeError, Server, ServerConfig, UPGRADE_REASON,
    UpgradeRequest, Upgrades, UsersConfig, keep_across_exec, serve_stream, unblock_serving_signals,
};
pub use self::shutdown::SHUTDOWN_REASON;
pub use self::socket::{BoundUnixSocket, BoundUnixSocketState, bind_unix_for_another};
pub use self::tls::{
    ClientIdentity, ServerTrust, TlsClient, TlsError, TlsServer, parse_fingerprint,
};
pub use self::token::{MIN_TOKEN_BYTES, Token, TokenError, default_token_path};
pub use self::upstream::UpstreamConfig;
pub use crate::segment::{OutgoingBytes, SegmentBuffer};
