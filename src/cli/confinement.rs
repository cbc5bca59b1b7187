//! The confinement flags of `capexec run` (the start's sandbox and limits)
//! and of `capexec serve` (a policy's: every start is sandboxed within it
//! and limited by it).

use std::path::PathBuf;

use clap::Args;

use capexec::model::{Limits, Network, Sandbox, parse_cpus, parse_size};

#[derive(Args, Debug, Default, Clone)]
#[command(next_help_heading = "Confinement")]
pub struct ConfinementArgs {
    /// Sandbox the process and all it starts (Landlock, seccomp, no
    /// capabilities): the system directories read-only, the working
    /// directory writable, no network. Refused (exit 125) where the
    /// server's kernel cannot enforce it.
    #[arg(long)]
    pub sandbox: bool,
    /// Also readable (and executable): DIR or file and below (repeatable;
    /// implies --sandbox).
    #[arg(long = "read-only", value_name = "DIR")]
    pub read_only: Vec<PathBuf>,
    /// Also writable: DIR or file and below (repeatable; implies
    /// --sandbox). For `serve`, where every start may write: a start's
    /// working directory outside them is only readable.
    #[arg(long = "writable", value_name = "DIR")]
    pub writable: Vec<PathBuf>,
    /// The network of the sandbox: none (Unix sockets only) or all
    /// (implies --sandbox).
    #[arg(long, value_name = "none|all", value_parser = parse_network)]
    pub network: Option<Network>,
    /// Let the sandbox make namespaces (user, mount, network...: unshare,
    /// containers); denied otherwise (implies --sandbox).
    #[arg(long = "allow-namespaces")]
    pub allow_namespaces: bool,
    /// On a root server, keep the sandboxed process root (every
    /// capability dropped) instead of running it as nobody, which owns
    /// root's files in its roots only (implies --sandbox).
    #[arg(long = "keep-root")]
    pub keep_root: bool,
    /// Most memory of the whole tree (512M, 2G); beyond it the kernel kills
    /// it (exit 137, and a line saying so).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub memory: Option<u64>,
    /// Most processes and threads of the tree at once (forks beyond fail).
    #[arg(long = "max-pids", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_pids: Option<u32>,
    /// CPUs the tree may use (fractions allowed: 0.5; at least 0.01).
    #[arg(long, value_name = "N", value_parser = parse_cpus)]
    pub cpus: Option<u32>,
    /// Start even where the server cannot enforce all of the sandbox or
    /// the limits asked for, and say on stderr what it does not enforce;
    /// without it such a start is refused (exit 125). For `serve`: the
    /// policy's sandbox and limits are relaxed so for starts that ask for
    /// none of their own or for best effort too (logged at start-up).
    #[arg(long = "best-effort")]
    pub best_effort: bool,
}

fn parse_network(text: &str) -> Result<Network, String> {
    text.parse()
}

impl ConfinementArgs {
    /// The sandbox these flags ask for; relative paths are taken from
    /// capexec's working directory.
    pub fn sandbox(&self) -> Result<Option<Sandbox>, String> {
        if !self.sandbox
            && self.read_only.is_empty()
            && self.writable.is_empty()
            && self.network.is_none()
            && !self.allow_namespaces
            && !self.keep_root
        {
            if self.best_effort && self.limits().is_empty() {
                return Err(
                    "--best-effort needs a sandbox (--sandbox, --read-only, --writable...) \
                            or a limit (--memory, --max-pids, --cpus) to relax"
                        .to_string(),
                );
            }
            return Ok(None);
        }
        let absolute = |paths: &[PathBuf]| {
            paths
                .iter()
                .map(|path| {
                    std::path::absolute(path)
                        .map_err(|error| format!("{}: {error}", path.display()))
                })
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Some(Sandbox {
            read_only: absolute(&self.read_only)?,
            writable: absolute(&self.writable)?,
            network: self.network.unwrap_or_default(),
            allow_namespaces: self.allow_namespaces,
            keep_root: self.keep_root,
            best_effort: self.best_effort,
            ..Sandbox::default()
        }))
    }

    pub fn limits(&self) -> Limits {
        Limits {
            memory_bytes: self.memory,
            max_pids: self.max_pids,
            cpu_millis: self.cpus,
            best_effort: self.best_effort,
        }
    }
}

/// With `--best-effort`, what the server did not enforce, said on stderr
/// before the command's output is relayed: never weaker without a word.
pub async fn say_what_is_not_enforced(
    command: &capexec::client::Command,
    process: &capexec::client::ResilientProcess,
) {
    let spec = command.spec();
    let asked = spec
        .sandbox
        .as_ref()
        .is_some_and(|sandbox| sandbox.best_effort)
        || spec.limits.best_effort;
    if !asked {
        return;
    }
    match process.info().await {
        Ok(info) if info.confinement.not_enforced.is_empty() => {}
        Ok(info) => crate::cli::stdio::note(&format!(
            "best effort: this server does not enforce {}; the command runs without them",
            info.confinement.not_enforced.join(", ")
        )),
        Err(error) => crate::cli::stdio::note(&format!(
            "best effort: cannot learn what the server enforces: {error}"
        )),
    }
}
