//! The Cap'n Proto server objects: a thin layer over the [`crate::engine`].
//!
//! capnp-rpc is `!Send`, so everything here runs on one thread inside a
//! tokio `LocalSet`; the engine's own tasks may run on any runtime thread.

pub mod convert;
mod executor;
mod process;
mod subscription;

pub use self::executor::{ExecutorImpl, local_executor};
pub use self::process::{MAX_WAIT_MS, ProcessImpl};

/// Output payload budget of one `EventSink.push`.
pub const PUSH_BUDGET_BYTES: usize = 64 * 1024;
