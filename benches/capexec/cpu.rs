//! CPU time, user and system, of the processes a case runs: those this
//! process waited for, and whole trees of processes it did not (servers).

use std::collections::HashMap;
use std::time::Duration;

use nix::sys::resource::{UsageWho, getrusage};

/// The CPU time of every child of this process that has been waited for
/// (and of what they waited for in turn: a shell's pipeline), since it
/// started.
pub fn waited_children() -> Duration {
    match getrusage(UsageWho::RUSAGE_CHILDREN) {
        Ok(usage) => {
            let time = |t: nix::sys::time::TimeVal| {
                Duration::new(t.tv_sec().max(0) as u64, t.tv_usec().max(0) as u32 * 1000)
            };
            time(usage.user_time()) + time(usage.system_time())
        }
        Err(_) => Duration::ZERO,
    }
}

/// `/proc/PID/stat` fields after the command name: the parent (the
/// second), and utime, stime, cutime, cstime in clock ticks (the 12th to
/// 15th).
fn parent_and_ticks(pid: u32) -> Option<(u32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    let parent = fields.get(1)?.parse().ok()?;
    let mut ticks = 0;
    for field in fields.get(11..15)? {
        ticks += field.parse::<u64>().ok()?;
    }
    Some((parent, ticks))
}

/// The CPU time of `root` and of every process below it, the living ones'
/// and, through their parents' counts, those already reaped. Sampled
/// before and after a case, the difference is what the case cost the
/// tree, provided what it started was reaped within the tree by then.
pub fn tree(root: u32) -> Duration {
    let mut processes = HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            if let Some(found) = parent_and_ticks(pid) {
                processes.insert(pid, found);
            }
        }
    }
    let in_tree = |mut pid: u32| {
        // A parent chain ends at 1 (or 0); the bound guards against a
        // chain read mid-change.
        for _ in 0..64 {
            if pid == root {
                return true;
            }
            match processes.get(&pid) {
                Some((parent, _)) if *parent > 1 => pid = *parent,
                _ => return false,
            }
        }
        false
    };
    let ticks: u64 = processes
        .iter()
        .filter(|(pid, _)| in_tree(**pid))
        .map(|(_, (_, ticks))| ticks)
        .sum();
    // SAFETY: sysconf only reads a configuration value.
    let per_second = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .unwrap_or(100)
        .max(1);
    Duration::from_millis(ticks * 1000 / per_second)
}
