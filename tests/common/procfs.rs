//! Looking at processes and descriptors through /proc.

use std::time::{Duration, Instant};

/// The state letter of `pid` (`Z` for a zombie), or `None` if it is gone.
pub fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().next()?.chars().next()
}

/// Waits until `pid` no longer exists at all (neither running nor a zombie).
pub async fn wait_gone(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Some(state) = state(pid) {
        assert!(
            Instant::now() < deadline,
            "process {pid} still exists (state {state})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| dir.count())
        .unwrap_or(0)
}

/// Zombie children of `parent`.
pub fn zombie_children(parent: u32) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            let Some(close) = stat.rfind(')') else {
                return false;
            };
            let mut fields = stat[close + 1..].split_whitespace();
            let state = fields.next();
            let ppid = fields.next().and_then(|p| p.parse::<u32>().ok());
            state == Some("Z") && ppid == Some(parent)
        })
        .count()
}

/// Polls `condition` until it holds, failing after a generous deadline.
pub async fn wait_until(mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !condition() {
        assert!(Instant::now() < deadline, "condition never held");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Signals queued for `pid` and not yet acted on (process- and
/// thread-directed), from `/proc/PID/status`.
pub fn pending_signals(pid: u32) -> u64 {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return 0;
    };
    status
        .lines()
        .filter(|line| line.starts_with("SigPnd:") || line.starts_with("ShdPnd:"))
        .filter_map(|line| u64::from_str_radix(line.split_whitespace().nth(1)?, 16).ok())
        .fold(0, |all, mask| all | mask)
}
