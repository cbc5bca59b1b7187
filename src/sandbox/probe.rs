//! What the running kernel can enforce, asked once per process (what an
//! engine takes it to have is its `HostConfig`: see `sys/host.rs`).

use std::sync::OnceLock;

/// The Landlock ABI version of the running kernel; 0 without Landlock.
pub(crate) fn landlock_abi() -> u32 {
    static ABI: OnceLock<u32> = OnceLock::new();
    *ABI.get_or_init(|| {
        const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
        // SAFETY: with a null attribute and the version flag the call only
        // returns the ABI version (or fails).
        let version = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                std::ptr::null::<libc::c_void>(),
                0usize,
                LANDLOCK_CREATE_RULESET_VERSION,
            )
        };
        u32::try_from(version).unwrap_or(0)
    })
}

/// Whether seccomp filters can be installed, and built for this CPU.
pub(crate) fn seccomp() -> bool {
    static SECCOMP: OnceLock<bool> = OnceLock::new();
    *SECCOMP.get_or_init(|| {
        let errno_action: u32 = libc::SECCOMP_RET_ERRNO;
        // SAFETY: SECCOMP_GET_ACTION_AVAIL only reads the action value.
        let available = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_GET_ACTION_AVAIL,
                0u32,
                &errno_action as *const u32,
            )
        } == 0;
        available && crate::sandbox::seccomp::supported()
    })
}

/// Whether this process has capabilities its children would keep: root,
/// or any capability in its permitted or ambient set.
pub(crate) fn privileged() -> bool {
    static PRIVILEGED: OnceLock<bool> = OnceLock::new();
    *PRIVILEGED.get_or_init(|| {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            return true;
        }
        let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
            return true;
        };
        status.lines().any(|line| {
            ["CapPrm:", "CapAmb:"].iter().any(|field| {
                line.strip_prefix(field)
                    .is_some_and(|mask| u64::from_str_radix(mask.trim(), 16).unwrap_or(1) != 0)
            })
        })
    })
}

/// Whether this process runs as root (its children would be root too).
pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Whether this process may make namespaces and change mounts
/// (CAP_SYS_ADMIN in its effective set).
pub(crate) fn can_admin() -> bool {
    static ADMIN: OnceLock<bool> = OnceLock::new();
    const CAP_SYS_ADMIN: u32 = 21;
    *ADMIN
        .get_or_init(|| status_mask("CapEff:").is_some_and(|mask| mask & (1 << CAP_SYS_ADMIN) != 0))
}

/// The capabilities in this process's bounding set (its children's too):
/// the ones a child must drop. It only ever shrinks, so reading it once is
/// enough: a later drop of one already gone does nothing. All of them if
/// it cannot be read.
pub(crate) fn bounding_set() -> u64 {
    static BOUNDING: OnceLock<u64> = OnceLock::new();
    *BOUNDING.get_or_init(|| status_mask("CapBnd:").unwrap_or(u64::MAX))
}

/// Whether this process has ambient capabilities (which only it could
/// raise, and capexec does not): a child has nothing to clear otherwise.
pub(crate) fn has_ambient() -> bool {
    static AMBIENT: OnceLock<bool> = OnceLock::new();
    *AMBIENT.get_or_init(|| status_mask("CapAmb:") != Some(0))
}

/// A capability mask of `/proc/self/status`.
fn status_mask(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
}

/// The highest capability number the kernel knows.
pub(crate) fn last_capability() -> i32 {
    static LAST: OnceLock<i32> = OnceLock::new();
    *LAST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(63)
    })
}
