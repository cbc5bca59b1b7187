//! How a process ended: one value, [`Exit`], wherever it is said (the
//! `exited` event, read results, process info, a client's `Output`).

use std::fmt;

use crate::model::Signal;

/// How the child ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ExitStatus {
    /// Normal exit with this code.
    Code(i32),
    /// Death by signal. `signal` is `None` for signals without a name in
    /// [`Signal`]; `number` is the server's own number for it.
    Killed {
        signal: Option<Signal>,
        number: i32,
        core_dumped: bool,
    },
}

impl ExitStatus {
    /// The status a shell would report: the code, or 128 + the signal number
    /// (numbered by this host when the signal has a name).
    pub fn shell_code(&self) -> i32 {
        match *self {
            ExitStatus::Code(code) => code,
            ExitStatus::Killed { signal, number, .. } => {
                128 + signal.map(Signal::number).unwrap_or(number)
            }
        }
    }

    pub fn success(&self) -> bool {
        *self == ExitStatus::Code(0)
    }
}

impl fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ExitStatus::Code(code) => write!(f, "exit code {code}"),
            ExitStatus::Killed {
                signal,
                number,
                core_dumped,
            } => {
                match signal {
                    Some(signal) => write!(f, "killed by {signal}")?,
                    None => write!(f, "killed by signal {number}")?,
                }
                if core_dumped {
                    write!(f, " (core dumped)")?;
                }
                Ok(())
            }
        }
    }
}

/// What a process tree used, as the kernel accounts it when the child is
/// waited for: the child itself plus every descendant it waited for
/// itself (the same figures a shell's `time` reports). Descendants still
/// running when the child exits, or orphaned before they ended, are not
/// included.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResourceUsage {
    /// CPU time spent in user mode.
    pub user_cpu: std::time::Duration,
    /// CPU time spent in the kernel on the tree's behalf.
    pub system_cpu: std::time::Duration,
    /// The largest resident set any single process of the accounted tree
    /// reached (the kernel's `ru_maxrss`; resident sets are not summed
    /// across processes). The kernel counts a process's memory from before
    /// it executed its program too, and children are started vfork-style,
    /// sharing the starting process's memory until they execute: the figure
    /// is never below that process's own peak at the time (a few MiB).
    pub peak_rss_bytes: u64,
}

impl fmt::Display for ResourceUsage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "user {:.3}s, system {:.3}s, peak RSS {} KiB",
            self.user_cpu.as_secs_f64(),
            self.system_cpu.as_secs_f64(),
            self.peak_rss_bytes / 1024
        )
    }
}

/// How a process ended: its status and what is known beside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Exit {
    pub status: ExitStatus,
    /// The start's timeout ended the process (it then usually dies by
    /// SIGTERM or SIGKILL, but may exit with a code of its own choosing).
    pub timed_out: bool,
    /// What the tree used; `None` when the server did not report it.
    pub usage: Option<ResourceUsage>,
    /// The tree's memory limit ended the child: the kernel killed a
    /// process of the tree for exceeding it, and the child died of SIGKILL
    /// (or exited 137, as a shell whose command was killed that way does).
    pub killed_by_memory_limit: bool,
    /// The server terminated the process because it was shutting down
    /// (its operator stopped it); the status is what the child made of
    /// that.
    pub server_shutdown: bool,
}

impl Exit {
    /// An exit with nothing known but its status.
    pub fn status(status: ExitStatus) -> Exit {
        Exit {
            status,
            timed_out: false,
            usage: None,
            killed_by_memory_limit: false,
            server_shutdown: false,
        }
    }
}

/// The status, and whether a timeout ended it.
impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.status)?;
        if self.timed_out {
            write!(f, " (timed out)")?;
        }
        if self.killed_by_memory_limit {
            write!(f, " (memory limit)")?;
        }
        if self.server_shutdown {
            write!(f, " (server shutdown)")?;
        }
        Ok(())
    }
}

impl From<ExitStatus> for Exit {
    fn from(status: ExitStatus) -> Exit {
        Exit::status(status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_codes_follow_the_128_plus_signal_rule() {
        assert_eq!(ExitStatus::Code(7).shell_code(), 7);
        let killed = ExitStatus::Killed {
            signal: Some(Signal::Term),
            number: 15,
            core_dumped: false,
        };
        assert_eq!(killed.shell_code(), 128 + libc::SIGTERM);
        let unnamed = ExitStatus::Killed {
            signal: None,
            number: 40,
            core_dumped: false,
        };
        assert_eq!(unnamed.shell_code(), 168);
    }
}
