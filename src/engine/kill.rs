//! Signalling processes, process groups and sessions without ever reaching
//! an unrelated process that reused a freed number: wherever possible the
//! target is named by a pidfd (which names one kernel object, not a number).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;

use crate::engine::os;

/// pidfd_send_signal(2) flag (Linux 6.9): signal the process group whose id
/// *is* the pidfd's process (its kernel object, even after it was reaped).
const PIDFD_SIGNAL_PROCESS_GROUP: libc::c_uint = 1 << 2;

/// Sends `signal` to process group `pgid` by number. Callers make sure the
/// number is still theirs. `Ok(false)`: the group is empty.
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

/// Whether the kernel can signal a process group through a pidfd.
pub(crate) fn pidfd_group_signals() -> bool {
    static SUPPORTED: OnceLock<bool> = OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        // SAFETY: getpid has no preconditions.
        let Ok(own) = pidfd_open(unsafe { libc::getpid() }) else {
            return false;
        };
        // Signal 0 only checks. ESRCH: supported, but we lead no group
        // (common as pid 1 of a namespace); EINVAL: the flag is unknown.
        match pidfd_signal(&own, 0, PIDFD_SIGNAL_PROCESS_GROUP) {
            Ok(()) => true,
            Err(error) => error.raw_os_error() == Some(libc::ESRCH),
        }
    })
}

/// Sends `signal` to the group led by the process behind `pidfd`.
pub(crate) fn signal_group_by_pidfd(pidfd: &OwnedFd, signal: i32) -> io::Result<()> {
    match pidfd_signal(pidfd, signal, PIDFD_SIGNAL_PROCESS_GROUP) {
        Err(error) if error.raw_os_error() == Some(libc::ESRCH) => Ok(()),
        other => other,
    }
}

/// Sends `signal` to exactly the process behind `pidfd`.
pub(crate) fn signal_process(pidfd: &OwnedFd, signal: i32) {
    let _ = pidfd_signal(pidfd, signal, 0);
}

fn pidfd_signal(pidfd: &OwnedFd, signal: i32, flags: libc::c_uint) -> io::Result<()> {
    // SAFETY: pidfd_send_signal on a pidfd we own, without siginfo.
    os::cvt(unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            flags,
        )
    })
    .map(drop)
}

pub(crate) fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor.
    let fd = os::cvt(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: the kernel just returned this descriptor to us alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Gives `each` the processes of session `sid` (only those of group
/// `pgid`, if given) one at a time, each as a pidfd that is known to name
/// the process that was in the session, not a later owner of its number:
/// one open at a time here, however many members the session has.
pub(crate) fn for_each_session_member(sid: i32, pgid: Option<i32>, mut each: impl FnMut(OwnedFd)) {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return;
    };
    let wanted = |identity: &Identity| {
        identity.session == sid && pgid.is_none_or(|pgid| identity.group == pgid)
    };
    dir.flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let before = identity(pid).filter(wanted)?;
            let pidfd = pidfd_open(pid).ok()?;
            // Same start time after opening: the pidfd names that process.
            (identity(pid) == Some(before)).then_some(pidfd)
        })
        .for_each(&mut each);
}

/// Whether any process (zombies included) belongs to session `sid`.
pub(crate) fn session_has_members(sid: i32) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return true;
    };
    dir.flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .any(|pid| identity(pid).is_some_and(|identity| identity.session == sid))
}

/// Whether any live process (not a zombie) but `leader` itself belongs to
/// its session (`session`) or else its process group: what a child that
/// exited left running.
pub(crate) fn others_led_by(leader: i32, session: bool) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return true;
    };
    let led = |pid: i32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // "pid (comm) state ppid pgrp session ..."; comm may hold ')'.
        let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
        let alive = *fields.first()? != "Z";
        let id: i32 = fields.get(if session { 3 } else { 2 })?.parse().ok()?;
        Some(alive && id == leader)
    };
    dir.flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != leader)
        .any(|pid| led(pid).unwrap_or(false))
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct Identity {
    group: i32,
    session: i32,
    started: u64,
}

/// Group, session and start time of `pid` from /proc (zombies too).
fn identity(pid: i32) -> Option<Identity> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid pgrp session ..."; comm may hold spaces and ')'.
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    Some(Identity {
        group: fields.get(2)?.parse().ok()?,
        session: fields.get(3)?.parse().ok()?,
        started: fields.get(19)?.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_our_own_session() {
        // SAFETY: getsid(0) and getpid() have no preconditions.
        let (sid, pid) = unsafe { (libc::getsid(0), libc::getpid()) };
        assert_eq!(identity(pid).map(|identity| identity.session), Some(sid));
        assert!(session_has_members(sid));
    }
}
