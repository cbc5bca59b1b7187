//! What a restriction of an executor asks for (the schema's `Policy`). The
//! engine resolves it into rules (`engine::Rules`).

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// What a restriction asks for; `None` fields add no rule (see the
/// schema's `Policy` for each rule's exact meaning).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// Absolute paths, or names looked up on the server's PATH.
    pub programs: Option<Vec<OsString>>,
    /// Absolute directories the working directory must be in or below.
    pub cwd_roots: Option<Vec<PathBuf>>,
    /// The fixed environment of every start.
    pub environment: Option<Vec<(OsString, OsString)>>,
    /// The only names a start may set or unset.
    pub settable_env: Option<Vec<OsString>>,
    pub forbid_tty: bool,
    /// Most processes of this executor running at once.
    pub max_processes: Option<u32>,
    /// Longest run time of each process.
    pub max_run_time: Option<Duration>,
}
