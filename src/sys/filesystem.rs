//! Which filesystem a descriptor's file lies on, asked of the mount it
//! was opened through and never of the filesystem itself.

use std::os::fd::{AsRawFd, BorrowedFd};

/// `statmount(2)` (Linux 6.8): the same number on every architecture, as
/// every system call since 424 is.
const SYS_STATMOUNT: libc::c_long = 457;
/// `STATMOUNT_SB_BASIC`: the superblock's device, magic and flags.
const STATMOUNT_SB_BASIC: u64 = 0x1;
/// `MNT_ID_REQ_SIZE_VER0`: the request without a namespace, which looks
/// the mount up in our own.
const MNT_ID_REQ_SIZE_VER0: u32 = 24;
/// Where `struct statmount` keeps what was written (`mask`) and the
/// superblock's magic (`sb_magic`), in 64-bit words.
const STATMOUNT_MASK_WORD: usize = 1;
const STATMOUNT_SB_MAGIC_WORD: usize = 3;

#[repr(C)]
struct MountIdRequest {
    size: u32,
    spare: u32,
    mnt_id: u64,
    param: u64,
}

/// The magic number (`statfs`'s `f_type`) of the filesystem that `fd`'s
/// file lies on, read from its mount (`statx`'s unique mount id, then
/// `statmount`) rather than asked of the filesystem: `fstatfs(2)` of a
/// file on a FUSE mount waits for its server's answer, and this must
/// answer whatever a client sent. `None` where the kernel cannot say
/// (before Linux 6.8, or a mount of another mount namespace, which a
/// client in a container can send).
pub fn filesystem_magic(fd: BorrowedFd<'_>) -> Option<u64> {
    // SAFETY: statx fills `stat`, which we own; AT_STATX_DONT_SYNC asks
    // only what the kernel has, and the mount id is the VFS's own.
    let mount = unsafe {
        let mut stat: libc::statx = std::mem::zeroed();
        let done = libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC,
            libc::STATX_MNT_ID_UNIQUE,
            &mut stat,
        );
        (done == 0 && stat.stx_mask & libc::STATX_MNT_ID_UNIQUE != 0).then_some(stat.stx_mnt_id)
    }?;
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
            SYS_STATMOUNT,
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
    use std::os::fd::AsFd;

    #[test]
    fn a_file_s_filesystem_is_the_one_fstatfs_names() {
        for path in ["/proc/self/stat", "/dev/null", "/tmp", "/"] {
            let file = std::fs::File::open(path).expect("open");
            let fd = file.as_fd();
            // SAFETY: fstatfs fills `stat`, which we own.
            let expected = unsafe {
                let mut stat: libc::statfs = std::mem::zeroed();
                assert_eq!(libc::fstatfs(fd.as_raw_fd(), &mut stat), 0);
                stat.f_type as u64
            };
            assert_eq!(
                filesystem_magic(fd),
                Some(expected),
                "{path}: Linux 6.8 has statx's unique mount id and statmount"
            );
        }
    }
}
