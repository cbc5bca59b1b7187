//! A typed client over the `Executor` and `Process` capabilities, in the
//! spirit of `std::process::Command`.
//!
//! It works the same for every executor: the in-process one from
//! `rpc::local_executor`, a remote one from [`crate::net::connect`],
//! or a chain of them. Like capnp-rpc itself it is `!Send`: use it on one
//! thread inside a tokio `LocalSet`.
//!
//! Run a command to completion and collect its output:
//!
//! ```
//! use capexec::client::Command;
//! use capexec::engine::Engine;
//!
//! let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
//! tokio::task::LocalSet::new().block_on(&runtime, async {
//!     let executor = capexec::rpc::local_executor(Engine::default());
//!     let output = Command::new("sh")
//!         .args(["-c", "echo hi; echo oops >&2; exit 3"])
//!         .output(&executor)
//!         .await?;
//!     assert_eq!(output.stdout, b"hi\n");
//!     assert_eq!(output.stderr, b"oops\n");
//!     assert_eq!(output.exit.status.shell_code(), 3);
//!     Ok::<_, capexec::client::Error>(())
//! })?;
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! ```
//!
//! Drive a process: write its stdin and follow its events as a stream:
//!
//! ```
//! use futures::StreamExt;
//! use capexec::client::{Command, Stdin};
//! use capexec::engine::Engine;
//! use capexec::model::{EventBody, ExitStatus, WriteStatus};
//!
//! let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
//! tokio::task::LocalSet::new().block_on(&runtime, async {
//!     let executor = capexec::rpc::local_executor(Engine::default());
//!     let process = Command::new("tr").args(["a-z", "A-Z"]).stdin(Stdin::Piped).spawn(&executor).await?;
//!     // A retried write with the same id is applied once.
//!     assert_eq!(process.write(b"hello\n", "w1").await?, WriteStatus::Accepted);
//!     process.close_stdin().await?;
//!     let mut events = process.events(0).await?;
//!     let mut output = Vec::new();
//!     while let Some(event) = events.next().await {
//!         match event?.body {
//!             EventBody::Output { data, .. } => output.extend_from_slice(&data),
//!             EventBody::Exited(exit) => assert_eq!(exit.status, ExitStatus::Code(0)),
//!             _ => {}
//!         }
//!     }
//!     assert_eq!(output, b"HELLO\n");
//!     Ok::<_, capexec::client::Error>(())
//! })?;
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! ```
//!
//! The same code runs against a server; only the executor changes:
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use capexec::client::Command;
//! use capexec::net::{self, Token};
//!
//! let address = "tcp:build-box:7000".parse()?;
//! let token = Token::load(std::path::Path::new("/home/me/.config/capexec/token"))?;
//! let connection = net::connect(&address, Some(&token)).await?;
//! let status = Command::new("make").arg("test").status(&connection.executor()).await?;
//! println!("make test: {status}");
//! # Ok(())
//! # }
//! ```

pub mod admin;
mod command;
mod directory;
mod error;
mod events;
mod executor;
pub(crate) mod follow;
mod handle;
mod ports;
mod process;
mod resilient;
mod stdio_handoff;

pub use self::command::{Command, Output, Stdin};
pub use self::directory::{Directory, EntryStream, WatchStream};
pub use self::error::{Error, RecoveryFailure, describe};
pub use self::events::EventStream;
pub use self::executor::{environment, environments, info, restrict};
pub use self::follow::{follow_links, parent_and_name};
pub use self::handle::ProcessHandle;
pub use self::ports::{
    DirectEnds, DirectParts, PortListener, PortReadHalf, PortStream, PortWriteHalf, dial, dial_via,
    listen,
};
pub use self::process::{Pending, PendingWrite, RemoteProcess, restore};
pub use self::resilient::{
    Connect, MAX_UNANSWERED_WRITES, RecoveryNote, ResilientEvents, ResilientProcess, Session,
};
pub use self::stdio_handoff::StdioHandoff;
pub use crate::net::{OutgoingBytes, SegmentBuffer};
