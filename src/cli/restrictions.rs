//! `capexec serve`'s restriction flags: a policy every start on every
//! connection must satisfy (the schema's `Executor.restrict`), for servers
//! handed to parties that should run only some programs, in some places.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use clap::Args;

use capexec::model::{Policy, PortPolicy, RuleNames};

#[derive(Args, Debug, Default)]
#[command(next_help_heading = "Restrictions (every start on every connection)")]
pub struct RestrictionArgs {
    /// Allow only this program: an absolute path, or a name looked up on
    /// the server's PATH at start-up (repeatable).
    #[arg(long = "allow-program", value_name = "PROGRAM")]
    allow_programs: Vec<OsString>,
    /// Allow only working directories in DIR or below, symlinks resolved
    /// (repeatable). A start without --cwd runs in the server's directory,
    /// which must then be under one.
    #[arg(long = "allow-cwd", value_name = "DIR")]
    allow_cwds: Vec<PathBuf>,
    /// Give every process exactly this environment instead of the
    /// server's (repeatable).
    #[arg(long = "fixed-env", value_name = "KEY=VALUE")]
    fixed_env: Vec<OsString>,
    /// The only variables starts may set or unset, comma-separated ("" for
    /// none). Default: any, or none with --allow-program.
    #[arg(long = "settable-env", value_name = "NAMES")]
    settable_env: Option<String>,
    /// Refuse starts that ask for a terminal.
    #[arg(long)]
    forbid_tty: bool,
    /// Most processes running at once, across all connections.
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    max_running: Option<u32>,
    /// End every process (its group: SIGTERM, then SIGKILL) after SECS
    /// seconds, or sooner if its start asks.
    #[arg(long, value_name = "SECS",
          value_parser = clap::value_parser!(u64).range(1..=31_536_000))]
    max_run_time: Option<u64>,
    /// Sandbox and limits of every start (narrowing only: a start's own
    /// sandbox must fit in it, its limits are the smaller).
    #[command(flatten)]
    confinement: crate::cli::confinement::ConfinementArgs,
    /// Allow `dial` (capexec forward -L) to addresses matching PATTERN:
    /// tcp:HOSTS:PORTS (HOSTS "*", "localhost", an IP or a block such as
    /// 10.0.0.0/8; PORTS "*", a port or a range) or unix:PATH ("unix:DIR/"
    /// for any socket below DIR) (repeatable). Default: any address, or
    /// none with --allow-program, --allow-cwd or --sandbox (and none at
    /// all under a --sandbox without --network all).
    #[arg(long = "allow-dial", value_name = "PATTERN")]
    allow_dial: Vec<String>,
    /// Allow `listen` (capexec forward -R) on addresses matching PATTERN,
    /// as --allow-dial (repeatable; a listen on port 0 needs PORTS "*").
    #[arg(long = "allow-listen", value_name = "PATTERN")]
    allow_listen: Vec<String>,
}

impl RestrictionArgs {
    /// The policy these flags describe; `None` when no flag was given.
    pub fn policy(&self) -> Result<Option<Policy>, String> {
        let mut environment = Vec::new();
        for pair in &self.fixed_env {
            let bytes = pair.as_bytes();
            match bytes.iter().position(|&b| b == b'=') {
                Some(at) if at > 0 => environment.push((
                    OsString::from(std::ffi::OsStr::from_bytes(&bytes[..at])),
                    OsString::from(std::ffi::OsStr::from_bytes(&bytes[at + 1..])),
                )),
                _ => return Err(format!("--fixed-env expects KEY=VALUE, got {pair:?}")),
            }
        }
        // Relative paths on the command line mean what they would in a
        // shell here; the policy itself takes absolute ones.
        let absolute = |path: &std::path::Path| {
            std::path::absolute(path).map_err(|error| format!("{}: {error}", path.display()))
        };
        let programs = self
            .allow_programs
            .iter()
            .map(|program| {
                if program.as_bytes().contains(&b'/') {
                    absolute(program.as_ref()).map(PathBuf::into_os_string)
                } else {
                    Ok(program.clone())
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let roots = self
            .allow_cwds
            .iter()
            .map(|root| absolute(root))
            .collect::<Result<Vec<_>, _>>()?;
        let policy = Policy {
            programs: (!programs.is_empty()).then_some(programs),
            cwd_roots: (!roots.is_empty()).then_some(roots),
            environment: (!environment.is_empty()).then_some(environment),
            settable_env: self.settable_env.as_ref().map(|names| {
                names
                    .split(',')
                    .filter(|name| !name.is_empty())
                    .map(OsString::from)
                    .collect()
            }),
            forbid_tty: self.forbid_tty,
            max_processes: self.max_running,
            max_run_time: self.max_run_time.map(std::time::Duration::from_secs),
            sandbox: self.confinement.sandbox()?,
            limits: self.confinement.limits(),
            ports: (!self.allow_dial.is_empty() || !self.allow_listen.is_empty()).then(|| {
                PortPolicy {
                    dial: (!self.allow_dial.is_empty()).then(|| self.allow_dial.clone()),
                    listen: (!self.allow_listen.is_empty()).then(|| self.allow_listen.clone()),
                }
            }),
            rule_names: RuleNames::Schema,
        };
        if policy == Policy::default() {
            return Ok(None);
        }
        // Refusals name these flags, not the schema's fields.
        Ok(Some(Policy {
            rule_names: RuleNames::ServeFlags,
            ..policy
        }))
    }
}
