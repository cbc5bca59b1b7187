//! Signalling process groups and sessions.

use std::io;

/// Sends `signal` to process group `pgid`. `Ok(false)`: the group is empty.
pub(crate) fn signal_group(pgid: i32, signal: i32) -> io::Result<bool> {
    // SAFETY: kill(2) with a negative pid addresses a process group.
    if unsafe { libc::kill(-pgid, signal) } == 0 {
        return Ok(true);
    }
    let error = io::Error::last_os_error();
    match error.raw_os_error() {
        Some(libc::ESRCH) => Ok(false),
        _ => Err(error),
    }
}

/// Whether any process (zombies included) is in group `pgid`.
pub(crate) fn group_has_members(pgid: i32) -> bool {
    // SAFETY: signal 0 only checks that the group exists.
    if unsafe { libc::kill(-pgid, 0) } == 0 {
        return true;
    }
    io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Whether any process (zombies included) belongs to session `sid`.
pub(crate) fn session_has_members(sid: i32) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return true;
    };
    dir.flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .any(|pid| session_of(pid) == Some(sid))
}

/// Sends `signal` to every process of session `sid`, including those a job
/// control shell moved into other process groups. Returns how many were
/// signalled.
pub(crate) fn signal_session(sid: i32, signal: i32) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut signalled = 0;
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if session_of(pid) == Some(sid) {
            // SAFETY: kill(2) on a single pid.
            if unsafe { libc::kill(pid, signal) } == 0 {
                signalled += 1;
            }
        }
    }
    signalled
}

/// Session id of `pid` from /proc (zombies still report theirs).
fn session_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid pgrp session ..."; comm may hold spaces and ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_our_own_session() {
        // SAFETY: getsid(0) and getpid() have no preconditions.
        let (sid, pid) = unsafe { (libc::getsid(0), libc::getpid()) };
        assert_eq!(session_of(pid), Some(sid));
    }
}
