//! Conversions between the model's values and the generated Cap'n Proto
//! types, both directions, one file per area of the schema. The server
//! objects (`rpc`) and the client both use them; nothing else touches the
//! generated builders and readers of these structs.

mod error;
mod event;
mod executor;
mod lists;
mod policy;
mod process;
mod signal;
mod start;

pub use self::error::{LOST_CONNECTION_PREFIX, describe, refusal_of};
pub use self::event::{
    event_from_wire, event_to_wire, events_from_wire, events_message_size, events_to_wire,
    exit_from_wire, exit_to_wire,
};
pub use self::executor::{
    environments_from_wire, environments_to_wire, info_from_wire, info_to_wire,
};
pub use self::lists::{millis_u32, pty_size_from_wire, pty_size_to_wire};
pub use self::policy::{policy_from_wire, policy_to_wire};
pub use self::process::{
    flow_from_wire, flow_to_wire, read_outcome_from_wire, read_outcome_to_wire, snapshot_from_wire,
    snapshot_to_wire, write_status_from_wire, write_status_to_wire,
};
pub use self::signal::{signal_from_wire, signal_to_wire};
pub use self::start::{start_spec_from_wire, start_spec_to_wire};
