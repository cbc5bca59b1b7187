//! The values every layer speaks: the engine produces them, the wire layer
//! converts them to and from Cap'n Proto, the server objects and the client
//! hand them on. Nothing here depends on another part of the crate.

mod error;
mod executor;
mod exit;
mod policy;
mod process;
mod signal;
mod spec;
mod text;

pub use self::error::{Refusal, RefusalKind, human_description};
pub use self::executor::{
    EnvironmentState, EnvironmentStatus, ExecutorInfo, LOCAL_ENVIRONMENT, valid_environment_name,
};
pub use self::exit::{Exit, ExitStatus, ResourceUsage};
pub use self::policy::{Policy, RuleNames};
pub use self::process::{
    Event, EventBody, Flow, OutputStream, ProcessSnapshot, PtySize, ReadOutcome, WriteStatus,
};
pub use self::signal::Signal;
pub(crate) use self::signal::signal_table;
pub(crate) use self::spec::env_name_problem;
pub use self::spec::{EnvSpec, MAX_ARGUMENT_BYTES, StartSpec};
pub use self::text::{EXCERPT_BYTES, excerpt, io_message, show_duration};
