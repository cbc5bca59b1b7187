//! Connection plumbing shared by both ends of a connection, below the
//! server objects (`rpc`) and the client: descriptors handed over a Unix
//! socket for a start's stdio. The client names a route to its server here
//! without importing any server module.

mod handoff;

pub use self::handoff::{
    DescriptorOutbox, MAX_KEPT_DESCRIPTORS, MAX_KEPT_DESCRIPTORS_IN_SERVER, MAX_WAITING_TO_CLOSE,
    MAX_WAITING_TO_CLOSE_IN_SERVER, ReceivedDescriptors, StdioRoute,
};
