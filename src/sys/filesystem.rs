//! Which filesystem a descriptor's file lies on, asked of the mount it
//! was opened through and never of the filesystem itself.

use std::collections::HashMap;
use std::sync::Mutex;

/// `statmount(2)` (Linux 6.8), where its number is 457: every
/// architecture but alpha and MIPS, whose numbers are offset.
const SYS_STATMOUNT: Option<libc::c_long> = if cfg!(any(
    target_arch = "x86_64",
    target_arch = "x86",
    target_arch = "aarch64",
    target_arch = "arm",
    target_arch = "riscv64",
    target_arch = "riscv32",
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "s390x",
    target_arch = "loongarch64"
)) {
    Some(457)
} else {
    None
};
/// `STATMOUNT_SB_BASIC`: the superblock's device, magic and flags.
const STATMOUNT_SB_BASIC: u64 = 0x1;
/// `MNT_ID_REQ_SIZE_VER0`: the request without a namespace, which looks
/// the mount up in our own (a `spare` of 0 names no namespace's fd).
const MNT_ID_REQ_SIZE_VER0: u32 = 24;
/// Where `struct statmount` keeps what was written (`mask`) and the
/// superblock's magic (`sb_magic`), in 64-bit words.
const STATMOUNT_MASK_WORD: usize = 1;
const STATMOUNT_SB_MAGIC_WORD: usize = 3;
/// The most mounts whose answer is kept (see [`filesystem_magic`]).
const MOUNTS_KEPT: usize = 4096;

#[repr(C)]
struct MountIdRequest {
    size: u32,
    spare: u32,
    mnt_id: u64,
    param: u64,
}

/// What `statmount` said of each mount asked about, by unique mount id.
static KNOWN: Mutex<Option<HashMap<u64, Option<u64>>>> = Mutex::new(None);

/// The magic number (`statfs`'s `f_type`) of the filesystem of the mount
/// whose unique id (`statx`'s `STATX_MNT_ID_UNIQUE`, Linux 6.8) is
/// `mount`, read from the mount (`statmount`) rather than asked of the
/// filesystem: `fstatfs(2)` of a file on a FUSE mount waits for its
/// server's answer, and this must answer whatever a client sent. `None`
/// where the kernel cannot say (before Linux 6.8, or a mount of another
/// mount namespace, which a client in a container can send).
///
/// `statmount` takes the kernel's lock of every mount namespace, which a
/// local user churning mounts of its own can keep busy for milliseconds:
/// each mount is asked about once. Unique mount ids are never reused, and
/// a mount's filesystem never changes, so what is kept stays true.
pub fn filesystem_magic(mount: u64) -> Option<u64> {
    if let Some(known) = KNOWN
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .as_ref()
        .and_then(|known| known.get(&mount))
    {
        return *known;
    }
    let magic = ask_statmount(mount);
    let mut known = KNOWN
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let known = known.get_or_insert_with(HashMap::new);
    if known.len() >= MOUNTS_KEPT {
        known.clear();
    }
    known.insert(mount, magic);
    magic
}

fn ask_statmount(mount: u64) -> Option<u64> {
    let request = MountIdRequest {
        size: MNT_ID_REQ_SIZE_VER0,
        spare: 0,
        mnt_id: mount,
        param: STATMOUNT_SB_BASIC,
    };
    // `struct statmount` is 512 bytes; the kernel writes no more than the
    // buffer holds, and nothing beyond it for SB_BASIC.
    let mut answer = [0u64; 64];
    // SAFETY: statmount reads `request` and writes at most
    // `size_of_val(&answer)` bytes into `answer`, both ours.
    let done = unsafe {
        libc::syscall(
            SYS_STATMOUNT?,
            &request as *const MountIdRequest,
            answer.as_mut_ptr(),
            std::mem::size_of_val(&answer),
            0u32,
        )
    };
    (done == 0 && answer[STATMOUNT_MASK_WORD] & STATMOUNT_SB_BASIC != 0)
        .then_some(answer[STATMOUNT_SB_MAGIC_WORD])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// The unique id of the mount `file` lies on.
    fn mount_of(file: &std::fs::File) -> u64 {
        // SAFETY: statx fills `stat`, which we own.
        unsafe {
            let mut stat: libc::statx = std::mem::zeroed();
            assert_eq!(
                libc::statx(
                    file.as_raw_fd(),
                    c"".as_ptr(),
                    libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC,
                    libc::STATX_MNT_ID_UNIQUE,
                    &mut stat,
                ),
                0
            );
            assert_ne!(
                stat.stx_mask & libc::STATX_MNT_ID_UNIQUE,
                0,
                "Linux 6.8 has statx's unique mount id"
            );
            stat.stx_mnt_id
        }
    }

    #[test]
    fn a_mount_s_filesystem_is_the_one_fstatfs_names() {
        for path in ["/proc/self/stat", "/dev/null", "/tmp", "/"] {
            let file = std::fs::File::open(path).expect("open");
            // SAFETY: fstatfs fills `stat`, which we own.
            let expected = unsafe {
                let mut stat: libc::statfs = std::mem::zeroed();
                assert_eq!(libc::fstatfs(file.as_raw_fd(), &mut stat), 0);
                stat.f_type as u64
            };
            let mount = mount_of(&file);
            assert_eq!(
                filesystem_magic(mount),
                Some(expected),
                "{path}: Linux 6.8 has statmount"
            );
            // Asked again, from what was kept.
            assert_eq!(filesystem_magic(mount), Some(expected), "{path}");
        }
        // No mount has the id 0 (ids start above any old-style id).
        assert_eq!(filesystem_magic(0), None);
    }
}
