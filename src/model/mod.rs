//! The values every layer speaks: the engine produces them, the wire layer
//! converts them to and from Cap'n Proto, the server objects and the client
//! hand them on. Nothing here depends on another part of the crate.

mod address;
mod admin;
mod error;
mod executor;
mod exit;
mod files;
mod fingerprint;
mod policy;
mod ports;
mod process;
mod sandbox;
mod signal;
mod spec;
mod text;

// Every value is reachable from here, whichever file holds it, so a new
// one is added to its file alone.
pub use self::address::*;
pub use self::admin::*;
pub use self::error::*;
pub use self::executor::*;
pub use self::exit::*;
pub use self::files::*;
pub use self::fingerprint::*;
pub use self::policy::*;
pub use self::ports::*;
pub use self::process::*;
pub use self::sandbox::*;
pub use self::signal::*;
pub use self::spec::*;
pub use self::text::*;
