//! Conversions between the model's values and the generated Cap'n Proto
//! types, both directions, one file per area of the schema. The server
//! objects (`rpc`) and the client both use them; nothing else touches the
//! generated builders and readers of these structs.

mod admin;
mod error;
mod event;
mod executor;
mod files;
mod lists;
mod policy;
mod port_sink;
mod ports;
mod process;
pub mod received;
mod sandbox;
mod signal;
mod start;
mod window;

// Every conversion is reachable from here, whichever file holds it, so a
// new one is added to its file alone. (`lists` holds field helpers the
// files share.)
pub use self::admin::*;
pub use self::error::*;
pub use self::event::*;
pub use self::executor::*;
pub use self::files::*;
pub use self::lists::{millis_u32, pty_size_from_wire, pty_size_to_wire};
pub use self::policy::*;
pub use self::port_sink::*;
pub use self::ports::*;
pub use self::process::*;
pub use self::sandbox::*;
pub use self::signal::*;
pub use self::start::*;
pub use self::window::{TRANSFER_WINDOW_BYTES, Window, stream_call};
