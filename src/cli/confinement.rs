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
            ..Sandbox::default()
        }))
    }

    pub fn limits(&self) -> Limits {
        Limits {
            memory_bytes: self.memory,
            max_pids: self.max_pids,
            cpu_millis: self.cpus,
            best_effort: false,
        }
    }
}
