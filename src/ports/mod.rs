//! The ports engine: connections and listening sockets on this machine,
//! for `Executor.dial` and `Executor.listen` (the server's side of
//! `ssh -L` and `ssh -R`) and for `capexec forward`'s own side.
//!
//! Plain tokio code that knows nothing of Cap'n Proto: addresses are the
//! model's [`crate::model::Address`], refusals [`crate::model::Refusal`]s
//! tagged `[capexec:socket-failed]` (or `not-allowed` by a rule,
//! `invalid-argument`, `limit` when out of descriptors).
//!
//! - [`Socket`]: a connected TCP or Unix socket that one task reads while
//!   another writes, half-closes, and resets (TCP RST) on request;
//! - [`pump`]: one direction of a connection moved from one socket to
//!   another by splice(2), never through this process's memory;
//! - [`dial`], [`listen`]: connecting and listening as [`PortRules`]
//!   allow (a restricted executor's rule; host names resolved first, so
//!   what is checked is what is used).

mod dial;
mod listen;
pub mod own;
mod rules;
mod splice;

pub use self::dial::{DIAL_TIMEOUT, dial, socket_failure};
pub use self::listen::{Listening, listen};
pub use self::rules::{Closed, MAX_PORT_PATTERNS, PortRules, Target};
pub use self::splice::{MAX_PUMP_PIPES, PUMP_CHUNK_BYTES, PumpError, pump};
pub use crate::sys::Socket;
