//! Confinement: the sandbox and the limits a start (or a policy) asks for,
//! and what the server enforced for a process (the schema's `Sandbox`,
//! `Limits` and `Confinement`).

use std::fmt;
use std::path::PathBuf;

/// What network a sandboxed process may reach.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
pub enum Network {
    /// No IP sockets (nor netlink, packet, vsock...); Unix sockets work.
    #[default]
    None,
    /// Whatever the server's host can reach.
    All,
}

impl Network {
    pub fn name(self) -> &'static str {
        match self {
            Network::None => "none",
            Network::All => "all",
        }
    }
}

impl std::str::FromStr for Network {
    type Err = String;

    fn from_str(text: &str) -> Result<Network, String> {
        match text {
            "none" => Ok(Network::None),
            "all" => Ok(Network::All),
            _ => Err(format!("expected none or all, got {text:?}")),
        }
    }
}

/// A sandbox: what a process may read, write and reach. The defaults are
/// an agent's: the system directories read-only, the working directory
/// writable, no network (see the schema's `Sandbox`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Sandbox {
    /// Readable (and executable) beyond the system directories.
    pub read_only: Vec<PathBuf>,
    /// Writable (and readable) beyond the working directory.
    pub writable: Vec<PathBuf>,
    pub network: Network,
    /// The system directories are not readable unless listed.
    pub no_system_roots: bool,
    /// The working directory is readable, not writable (unless listed).
    pub read_only_cwd: bool,
    /// The process may make namespaces (user, mount, network, pid...);
    /// otherwise its seccomp filter refuses them.
    pub allow_namespaces: bool,
    /// On a root server: the process stays root (every capability
    /// dropped) instead of becoming the unprivileged user.
    pub keep_root: bool,
    /// Start even if the kernel cannot enforce all of it, and say what was
    /// not enforced; otherwise such a start is refused.
    pub best_effort: bool,
    /// A root containing a secret of the server is split around it
    /// instead of refused (the schema's `Sandbox.leaveOutSecrets`).
    pub leave_out_secrets: bool,
    /// Inside a writable root, kept read-only by a read-only mount (the
    /// schema's `Sandbox.readOnlyInside`).
    pub read_only_inside: Vec<PathBuf>,
}

impl Sandbox {
    /// The sandbox with every default made explicit: `no_system_roots`
    /// and `read_only_cwd` set, the roots listed. What a process was given.
    pub fn is_explicit(&self) -> bool {
        self.no_system_roots && self.read_only_cwd
    }
}

/// Resource limits of a process tree; `None` fields set no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    /// Memory the whole tree may use (no swap); the kernel kills a process
    /// of the tree when it is exceeded.
    pub memory_bytes: Option<u64>,
    /// Processes (and threads) the tree may have at once.
    pub max_pids: Option<u32>,
    /// CPU time the tree may use, in thousandths of one CPU (500: half a
    /// CPU, 2000: two CPUs); at least [`MIN_CPU_MILLIS`].
    pub cpu_millis: Option<u32>,
    /// Start even if the kernel cannot enforce them, and say so; otherwise
    /// such a start is refused.
    pub best_effort: bool,
}

/// The smallest CPU limit, in thousandths of a CPU: the kernel's least
/// quota is 1 ms per period, and capexec's period is 100 ms.
pub const MIN_CPU_MILLIS: u32 = 10;

impl Limits {
    /// Refuses what no cgroup can enforce as asked (a smaller CPU limit
    /// would run at [`MIN_CPU_MILLIS`] while saying it runs at less).
    pub fn validate(&self) -> Result<(), String> {
        if let Some(millis) = self.cpu_millis
            && millis < MIN_CPU_MILLIS
        {
            return Err(format!(
                "cpuMillis {millis} is below the least CPU limit, {MIN_CPU_MILLIS} \
                 (a hundredth of one CPU)"
            ));
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.memory_bytes.is_none() && self.max_pids.is_none() && self.cpu_millis.is_none()
    }

    /// Both sets of limits at once: the smaller of each, and best effort
    /// only if both are (one that must be enforced stays so).
    pub fn and(&self, other: &Limits) -> Limits {
        fn min<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
            match (a, b) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        }
        let best_effort = match (self.is_empty(), other.is_empty()) {
            (true, _) => other.best_effort,
            (_, true) => self.best_effort,
            _ => self.best_effort && other.best_effort,
        };
        Limits {
            memory_bytes: min(self.memory_bytes, other.memory_bytes),
            max_pids: min(self.max_pids, other.max_pids),
            cpu_millis: min(self.cpu_millis, other.cpu_millis),
            best_effort,
        }
    }
}

/// How a process's tree is followed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Tracking {
    /// Its process group (a terminal: its session); what leaves it
    /// (setsid, setpgid) is not seen, nor ended.
    #[default]
    ProcessGroup,
    /// A cgroup of its own, which nothing it starts can leave.
    Cgroup,
}

/// Listed in `ExecutorInfo.features` by a server that can keep paths
/// read-only inside writable roots (`Sandbox.readOnlyInside`).
pub const READ_ONLY_INSIDE_FEATURE: &str = "sandbox-read-only-inside";

/// What the server enforced for one process (the schema's `Confinement`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Confinement {
    pub tracking: Tracking,
    /// The sandbox as applied (explicit: see [`Sandbox::is_explicit`]);
    /// `None`: not sandboxed.
    pub sandbox: Option<Sandbox>,
    /// The limits in force.
    pub limits: Limits,
    /// What is enforced, by stable names (see [`enforcement`]).
    pub enforced: Vec<String>,
    /// What was asked for (best effort) but is not enforced.
    pub not_enforced: Vec<String>,
}

/// The stable names of what a confinement can enforce, as `ProcessInfo`
/// and `capexec info` say them.
pub mod enforcement {
    /// A cgroup of its own tracks the tree.
    pub const CGROUP: &str = "cgroup";
    /// A cgroup namespace rooted at that cgroup, which the kernel keeps the
    /// tree in (no moving to another cgroup through `cgroup.procs`).
    pub const CGROUP_NAMESPACE: &str = "cgroup-namespace";
    /// Landlock filesystem rules: only the roots can be read or written.
    pub const FILESYSTEM: &str = "filesystem";
    /// Landlock TCP rules: no TCP bind or connect.
    pub const NETWORK_TCP: &str = "network-tcp";
    /// seccomp: no socket of a family but Unix.
    pub const NETWORK_SOCKETS: &str = "network-sockets";
    /// Landlock scoping: no signal to processes outside the sandbox.
    pub const SCOPE_SIGNALS: &str = "scope-signals";
    /// Landlock scoping: no connection to abstract Unix sockets made
    /// outside the sandbox.
    pub const SCOPE_ABSTRACT_SOCKETS: &str = "scope-abstract-sockets";
    /// `no_new_privs`: set-user-ID programs and file capabilities grant
    /// nothing.
    pub const NO_NEW_PRIVS: &str = "no-new-privs";
    /// Every capability dropped (a root server's children).
    pub const CAPABILITIES: &str = "capabilities";
    /// A root server's child runs as an unprivileged user, which owns what
    /// root owns in its roots and nothing elsewhere.
    pub const UNPRIVILEGED_USER: &str = "unprivileged-user";
    /// Paths inside writable roots mounted read-only over themselves
    /// (`Sandbox.readOnlyInside`).
    pub const READ_ONLY_INSIDE: &str = "read-only-inside";
    /// seccomp: io_uring denied (it could bypass the socket rules).
    pub const IO_URING: &str = "io-uring";
    /// seccomp: the calls that change the kernel (modules, kexec, bpf,
    /// mounts...) denied (a root server's children).
    pub const KERNEL_CALLS: &str = "kernel-calls";
    /// seccomp: no new namespaces (`unshare`, `clone` with a namespace
    /// flag, `setns`), unless the sandbox allows them.
    pub const NAMESPACES: &str = "namespaces";
    /// Capexec servers refuse connections from the process and what it
    /// starts.
    pub const SERVER_ISOLATION: &str = "server-isolation";
    pub const LIMIT_MEMORY: &str = "limit-memory";
    pub const LIMIT_PIDS: &str = "limit-pids";
    pub const LIMIT_CPU: &str = "limit-cpu";
}

impl fmt::Display for Limits {
    /// `memory 512 MiB, pids 64, cpus 0.5`, or `none`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(bytes) = self.memory_bytes {
            parts.push(format!("memory {}", show_bytes(bytes)));
        }
        if let Some(pids) = self.max_pids {
            parts.push(format!("pids {pids}"));
        }
        if let Some(millis) = self.cpu_millis {
            parts.push(format!("cpus {}", show_cpus(millis)));
        }
        if parts.is_empty() {
            return write!(f, "none");
        }
        write!(f, "{}", parts.join(", "))
    }
}

/// A size as people write it: `512 MiB`, `2 GiB`, `1.5 GiB`, `100 bytes`.
pub fn show_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (unit, size) in UNITS {
        if bytes >= size {
            let value = bytes as f64 / size as f64;
            let text = format!("{value:.2}");
            let text = text.trim_end_matches('0').trim_end_matches('.');
            return format!("{text} {unit}");
        }
    }
    format!("{bytes} bytes")
}

/// Thousandths of a CPU as a number of CPUs: `0.5`, `2`, `1.25`.
pub fn show_cpus(millis: u32) -> String {
    let text = format!("{:.3}", f64::from(millis) / 1000.0);
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// A size such as `512M`, `2G`, `1.5GiB`, `64k` or `1048576` (bytes):
/// suffixes count in powers of 1024.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let unit = unit.trim();
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => {
            return Err(format!(
                "{text:?} is not a size (such as 512M, 2G or 1048576)"
            ));
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size (such as 512M, 2G or 1048576)"))?;
    let bytes = value * scale as f64;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
        return Err(format!("{text:?} is not a size above 0"));
    }
    Ok(bytes.round() as u64)
}

/// A number of CPUs such as `2` or `0.5`, in thousandths (at least 0.01).
pub fn parse_cpus(text: &str) -> Result<u32, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of CPUs (such as 2 or 0.5)"))?;
    if !value.is_finite() || !(0.01..=1_000_000.0).contains(&value) {
        return Err(format!(
            "{text:?} CPUs: give at least 0.01 (a hundredth of one CPU)"
        ));
    }
    Ok((value * 1000.0).round() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_cpus_read_as_people_write_them() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        for bad in ["", "M", "-1G", "0", "1X", "1.2.3G"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
        assert_eq!(show_bytes(512 << 20), "512 MiB");
        assert_eq!(show_bytes(3 << 29), "1.5 GiB");
        assert_eq!(show_bytes(100), "100 bytes");
        assert_eq!(parse_cpus("0.5"), Ok(500));
        assert_eq!(parse_cpus("2"), Ok(2000));
        assert!(parse_cpus("0").is_err());
        assert!(parse_cpus("x").is_err());
        assert_eq!(show_cpus(500), "0.5");
        assert_eq!(show_cpus(2000), "2");
    }

    #[test]
    fn limits_together_take_the_smaller_of_each() {
        let a = Limits {
            memory_bytes: Some(1 << 30),
            max_pids: None,
            cpu_millis: Some(500),
            best_effort: true,
        };
        let b = Limits {
            memory_bytes: Some(1 << 20),
            max_pids: Some(10),
            cpu_millis: None,
            best_effort: false,
        };
        assert_eq!(
            a.and(&b),
            Limits {
                memory_bytes: Some(1 << 20),
                max_pids: Some(10),
                cpu_millis: Some(500),
                best_effort: false,
            }
        );
        // No limits of its own: the other's enforcement rule stands.
        assert!(Limits::default().and(&a).best_effort);
        assert_eq!(a.to_string(), "memory 1 GiB, cpus 0.5");
    }
}
