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
