//! The Cap'n Proto server objects: a thin layer over the [`crate::engine`].
//!
//! capnp-rpc is `!Send`, so everything here runs on one thread inside a
//! tokio `LocalSet`; the engine's own tasks may run on any runtime thread.

mod admin;
mod allocator;
mod context;
mod detach;
pub(crate) mod direct;
mod directory;
mod executor;
mod file_limits;
mod forward;
mod forward_directory;
mod forwarding;
mod handover;
mod holdings;
mod info;
mod port_quota;
mod ports;
mod process;
mod quota;
mod settled;
mod subscription;

pub use self::admin::{AdminImpl, ProcessTable};
pub use self::allocator::{keep_allocator_settings, tune_allocator};
pub use self::context::{
    Link, ServerContext, UpgradeRequest, Upstream, check_names as check_environment_names,
};
pub use self::detach::{DEFAULT_RETENTION, Detachments, MAX_GRACE};
pub use self::direct::{
    CHANNEL_CLAIMED, CLAIM_WITHIN as DIRECT_CLAIM_WITHIN, DirectChannels,
    MAX_UNCLAIMED_PER_CONNECTION, MAX_UNCLAIMED_TICKETS, TICKET_BYTES, Ticket,
};
pub use self::directory::DirectoryImpl;
pub use self::executor::{
    ExecutorImpl, forwarded_root_executor, local_executor, local_executor_with_stdio_route,
    restricted_root_executor, root_executor,
};
pub use self::handover::DetachedState;
pub use self::holdings::{
    HoldingLimits, MAX_HELD_DESCRIPTORS_PER_CONNECTION, MAX_HELD_MEMORY,
    MAX_HELD_MEMORY_PER_CONNECTION, ServerHoldings,
};
pub use self::info::features as protocol_features;
pub use self::port_quota::{MAX_PORT_LISTENERS, MAX_PORT_STREAMS, PortLimits};
pub use self::ports::MAX_PENDING_ACCEPTS;
pub use self::process::{MAX_WAIT_MS, ProcessImpl};
pub use self::quota::{AllowanceBuilder, Quota};
pub use self::subscription::deliveries_finished;
pub use crate::conn::{
    DescriptorOutbox, MAX_KEPT_DESCRIPTORS, MAX_WAITING_TO_CLOSE, ReceivedDescriptors, StdioRoute,
};

/// Output payload budget of one `EventSink.push`. A push carries whatever
/// has accumulated, up to this much: large batches cut the per-message cost
/// (system calls, acknowledgements) when output streams fast, and cost
/// nothing in latency since a push never waits to fill up.
pub const PUSH_BUDGET_BYTES: usize = 256 * 1024;

/// Unacknowledged event bytes a subscription may have on the way to its
/// sink: two pushes of [`PUSH_BUDGET_BYTES`], one being consumed, one on the
/// way.
pub const SUBSCRIPTION_WINDOW_BYTES: usize = 2 * PUSH_BUDGET_BYTES;
