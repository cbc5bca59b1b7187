//! capexec: an exec server on Cap'n Proto capabilities.
//!
//! Layers, each depending only on the ones below it:
//! - [`model`]: plain value types (signals, exit statuses, events);
//! - [`engine`]: the local process engine, plain tokio code;
//! - [`rpc`]: the Cap'n Proto server objects over the engine;
//! - [`client`]: a typed client over the Cap'n Proto capabilities;
//! - [`net`]: serving the Executor over Unix sockets and TCP, and connecting;
//! - `cli` (the binary): `capexec run` and `capexec serve`.

capnp::generated_code!(pub mod capexec_capnp);

pub mod client;
pub mod engine;
pub mod model;
pub mod net;
pub mod rpc;
pub mod secret;
