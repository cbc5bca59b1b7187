//! capexec: an exec server on Cap'n Proto capabilities.
//!
//! Layers, each depending only on the ones below it (see
//! docs/ARCHITECTURE.md):
//! - [`model`]: the values every layer speaks (specs, policies, events,
//!   exits, signals, the tagged [`model::Refusal`]); depends on nothing else;
//! - [`engine`]: the local process engine, plain tokio code over the model;
//! - [`files`]: the file engine: directories confined by the kernel;
//! - [`ports`]: connections and listeners on this machine (dial, listen,
//!   the rules of a restricted executor), plain tokio code over the model;
//! - [`wire`]: conversions between the model and the Cap'n Proto types;
//! - [`rpc`]: the Cap'n Proto server objects over the engine;
//! - [`client`]: a typed client over the Cap'n Proto capabilities;
//! - [`net`]: serving the Executor over Unix sockets and TCP, and connecting;
//! - [`metrics`]: counters for monitoring (no contents, tokens or
//!   arguments), served as Prometheus text;
//! - `cli` (the binary): `capexec run` and `capexec serve`.

capnp::generated_code!(pub mod capexec_capnp);

// No module above the engines and the system calls needs `unsafe`: the
// compiler keeps it so.
#[forbid(unsafe_code)]
pub mod client;
#[forbid(unsafe_code)]
pub mod codex;
#[forbid(unsafe_code)]
pub mod conn;
pub mod engine;
pub mod files;
pub mod local_file;
#[forbid(unsafe_code)]
pub mod mcp;
#[forbid(unsafe_code)]
pub mod metrics;
#[forbid(unsafe_code)]
pub mod model;
pub mod net;
pub mod policy;
pub mod ports;
pub mod rpc;
pub mod sandbox;
pub mod secret;
pub mod segment;
pub mod sys;
pub mod users;
#[forbid(unsafe_code)]
pub mod wire;

/// The README's Rust example, compiled as a doctest so that the front page
/// stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// docs/LIBRARY.md's examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/LIBRARY.md")]
pub struct LibraryGuideDoctests;
