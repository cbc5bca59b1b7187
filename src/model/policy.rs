//! What a restriction of an executor asks for (the schema's `Policy`). The
//! engine resolves it into rules (`policy::Rules`).

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
    /// Every start is sandboxed, within this sandbox: a start's own
    /// sandbox may only narrow it.
    pub sandbox: Option<crate::model::Sandbox>,
    /// Every start's limits are at most these.
    pub limits: crate::model::Limits,
    /// The addresses ports may use (see [`crate::model::PortPolicy`]).
    pub ports: Option<crate::model::PortPolicy>,
    /// What refusals call these rules (not on the wire).
    pub rule_names: RuleNames,
}

/// What messages call a policy's rules: the schema's field names (a
/// client's `Executor.restrict`), or the `capexec serve` flags that set
/// them, so that whoever reads a refusal knows what to change.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RuleNames {
    #[default]
    Schema,
    ServeFlags,
}

impl RuleNames {
    /// The name of the rule `field` (a schema field name) in a refusal.
    pub(crate) fn refusal(self, field: &str) -> String {
        match self.flag(field) {
            Some(flag) => format!("the server's {flag}"),
            None => format!("policy rule `{field}`"),
        }
    }

    /// The name of the rule `field` in an error about the policy itself.
    pub(crate) fn setup(self, field: &str) -> String {
        match self.flag(field) {
            Some(flag) => flag.to_string(),
            None => format!("policy rule `{field}`"),
        }
    }

    fn flag(self, field: &str) -> Option<&'static str> {
        if self == RuleNames::Schema {
            return None;
        }
        Some(match field {
            "programs" => "--allow-program",
            "cwdRoots" => "--allow-cwd",
            "environment" => "--fixed-env",
            "settableEnv" => "--settable-env",
            "forbidTty" => "--forbid-tty",
            "maxProcesses" => "--max-running",
            "maxRunTime" => "--max-run-time",
            "sandbox" => "--sandbox",
            "limits" => "--memory/--max-pids/--cpus",
            "ports.dial" => "--allow-dial",
            "ports.listen" => "--allow-listen",
            _ => return None,
        })
    }
}
