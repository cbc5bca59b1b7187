//! What an executor reports about itself and about the environments its
//! server offers.

use std::fmt;

/// What an executor reports about itself (see the schema's `ExecutorInfo`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecutorInfo {
    pub version: String,
    pub features: Vec<String>,
    pub os: String,
    pub arch: String,
    pub hostname: String,
    pub default_shell: std::path::PathBuf,
    pub cwd: std::path::PathBuf,
    pub temp_dir: std::path::PathBuf,
    /// "local", or the path of environment names to where `start` runs.
    pub environment: String,
}

/// Name of a server's own engine among its environments.
pub const LOCAL_ENVIRONMENT: &str = "local";

/// One environment a server offers (see the schema's `Environment`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvironmentStatus {
    pub name: String,
    /// The upstream's address; empty for the local environment.
    pub address: String,
    pub is_default: bool,
    pub state: EnvironmentState,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EnvironmentState {
    Local,
    /// Not connected yet; connects on first use.
    Idle,
    Connecting,
    Connected,
    Failed {
        reason: String,
        retry_in: std::time::Duration,
    },
}

impl fmt::Display for EnvironmentState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnvironmentState::Local => write!(f, "local"),
            EnvironmentState::Idle => write!(f, "idle"),
            EnvironmentState::Connecting => write!(f, "connecting"),
            EnvironmentState::Connected => write!(f, "connected"),
            EnvironmentState::Failed { reason, .. } => write!(f, "failed: {reason}"),
        }
    }
}

/// Whether `name` can name an upstream environment: letters, digits, "-",
/// "_" and ".", not "local" (and so never "/", which separates the names of
/// a path through several hops).
pub fn valid_environment_name(name: &str) -> bool {
    !name.is_empty()
        && name != LOCAL_ENVIRONMENT
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}
