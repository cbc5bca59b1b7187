//! A typed client over the `Executor` and `Process` capabilities.
//!
//! It works the same for every executor: the in-process one from
//! [`crate::rpc::local_executor`], a remote one over a socket, or a chain of
//! them. Like capnp-rpc itself it is `!Send`: use it on one thread inside a
//! tokio `LocalSet`.
//!
//! ```no_run
//! # async fn demo(executor: capexec::capexec_capnp::executor::Client) -> Result<(), capexec::client::Error> {
//! use capexec::client::Command;
//!
//! let output = Command::new("sh").args(["-c", "echo hi; exit 3"]).output(&executor).await?;
//! assert_eq!(output.stdout, b"hi\n");
//! assert_eq!(output.status.shell_code(), 3);
//! # Ok(())
//! # }
//! ```

mod command;
mod error;
mod events;
mod process;

pub use self::command::{Command, Output, Stdin};
pub use self::error::{Error, describe};
pub use self::events::EventStream;
pub use self::process::{PendingWrite, RemoteProcess};
