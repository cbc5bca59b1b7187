//! Who a root server's sandboxed children are: not root. A process with
//! uid 0 keeps the owner's access to every root-owned file even with no
//! capability (`/etc/shadow` is 0640 root, private keys 0600 root), and
//! every daemon that trusts its peer's uid trusts it (a root-owned Unix
//! socket such as docker's or systemd's: Landlock before ABI 9 does not
//! check `connect`). So the child becomes an unprivileged user, `nobody`
//! (65534), with no supplementary groups, and what root owns in the
//! sandbox's own roots is made the child's through idmapped mounts in a
//! mount namespace of its own: a build in a root-owned checkout reads and
//! writes it as root would, and what it makes is root's on disk.
//!
//! Which roots are mapped: the working directory and the writable roots,
//! and the read-only roots outside the system directories (there root's
//! secrets stay root's), never the kernel's (devices, /proc, /sys: a
//! terminal of another session stays out of reach); a root below a
//! root-owned directory the child could not search (`/root`, 0700) is
//! reached through that directory, mapped instead. The parent prepares each mapped tree as a detached
//! mount (`open_tree`, then `mount_setattr` with the idmapping of a user
//! namespace made once); the child moves them into place with raw system
//! calls.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::roots::{Access, Root};

/// The user (and group) a root server's sandboxed children run as.
pub(crate) const SANDBOX_ID: u32 = 65534;

/// The directories whose files are the system's: read-only roots in them
/// are read as the unprivileged user (see the module's comment).
const SYSTEM_DIRECTORIES: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/boot",
];

/// The kernel's directories: never mapped.
const KERNEL_DIRECTORIES: &[&str] = &["/dev", "/proc", "/sys"];

/// The trees to map for a start in `cwd` (canonical) with `roots`:
/// outermost first, none inside another.
pub(crate) fn mapped_trees(roots: &[Root], cwd: &Path) -> Vec<PathBuf> {
    static RESOLVED: OnceLock<(Vec<PathBuf>, Vec<PathBuf>)> = OnceLock::new();
    let (system, kernel) =
        RESOLVED.get_or_init(|| (resolved(SYSTEM_DIRECTORIES), resolved(KERNEL_DIRECTORIES)));
    let within = |path: &Path, dirs: &[PathBuf]| dirs.iter().any(|dir| path.starts_with(dir));
    let mut trees: Vec<PathBuf> = roots
        .iter()
        .filter(|root| !within(&root.path, kernel))
        .filter(|root| {
            root.path == cwd || root.access == Access::Write || !within(&root.path, system)
        })
        .map(|root| reached_through(&root.path))
        .collect();
    trees.sort();
    trees.dedup();
    let all = trees.clone();
    trees.retain(|tree| {
        !all.iter()
            .any(|outer| outer != tree && tree.starts_with(outer))
    });
    trees
}

/// `dirs` as named and as they resolve on this host (`/bin` may be
/// `/usr/bin`).
fn resolved(dirs: &[&str]) -> Vec<PathBuf> {
    dirs.iter()
        .flat_map(|dir| [Some(PathBuf::from(dir)), std::fs::canonicalize(dir).ok()])
        .flatten()
        .collect()
}

/// `path`, or its outermost ancestor that root owns and the unprivileged
/// user could not search (the child reaches `path` through it).
fn reached_through(path: &Path) -> PathBuf {
    path.ancestors()
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .skip(1)
        .take_while(|ancestor| *ancestor != path)
        .find(|ancestor| {
            std::fs::metadata(ancestor)
                .is_ok_and(|meta| meta.is_dir() && meta.uid() == 0 && meta.mode() & 0o001 == 0)
        })
        .unwrap_or(path)
        .to_path_buf()
}

/// `tree` (and the mounts below it) as a detached mount on which root's
/// files are the unprivileged user's and the unprivileged user's are
/// root's (everyone else's stay theirs): files the child makes there are
/// root's on disk. Fails where the file system cannot be idmapped.
pub(crate) fn detached_mapped(tree: &Path) -> io::Result<OwnedFd> {
    detached(tree, true, false)
}

/// `tree` (and the mounts below it) as a detached mount, idmapped as
/// [`detached_mapped`] makes one when `mapped`, and read-only when
/// `read_only` (the schema's `Sandbox.readOnlyInside`).
pub(crate) fn detached(tree: &Path, mapped: bool, read_only: bool) -> io::Result<OwnedFd> {
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    const MOUNT_ATTR_RDONLY: u64 = 0x0000_0001;
    const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    let userns = if mapped {
        Some(mapping_namespace()?)
    } else {
        None
    };
    let path = CString::new(tree.as_os_str().as_bytes())?;
    // SAFETY: open_tree(2) on a NUL-terminated path.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            path.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_RECURSIVE as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us alone.
    let tree = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
    let attr = MountAttr {
        attr_set: if mapped { MOUNT_ATTR_IDMAP } else { 0 }
            | if read_only { MOUNT_ATTR_RDONLY } else { 0 },
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.map_or(0, |userns| userns.as_raw_fd() as u64),
    };
    if attr.attr_set == 0 {
        return Ok(tree);
    }
    // SAFETY: mount_setattr(2) on our detached tree, with its attribute
    // struct and size.
    let set = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if set != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(tree)
}

/// The user namespace whose ids the mapped trees are seen through: 0 and
/// 65534 swapped, every other id as it is. Made once.
fn mapping_namespace() -> io::Result<&'static OwnedFd> {
    static NAMESPACE: OnceLock<Result<OwnedFd, (io::ErrorKind, String)>> = OnceLock::new();
    NAMESPACE
        .get_or_init(|| make_mapping_namespace().map_err(|error| (error.kind(), error.to_string())))
        .as_ref()
        .map_err(|(kind, message)| io::Error::new(*kind, message.clone()))
}

/// Ids as the mapped trees show them: inside id, outside id, count.
const ID_MAP: &str = "0 65534 1\n1 1 65533\n65534 0 1\n65535 65535 4294901760\n";

fn make_mapping_namespace() -> io::Result<OwnedFd> {
    // A child in a new user namespace that waits for a byte on its pipe,
    // so that its maps can be written and the namespace opened. (It has a
    // copy of our descriptors, the pipe's write end among them: it would
    // never see the pipe close.)
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned these descriptors to us alone.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    extern "C" fn wait_for_a_byte(arg: *mut libc::c_void) -> libc::c_int {
        let mut byte = 0u8;
        // SAFETY: a raw read of one byte from the descriptor in `arg`
        // (CLONE_VM: the memory is the parent's, which waits for us).
        unsafe {
            libc::syscall(
                libc::SYS_read,
                arg as libc::c_long,
                &mut byte as *mut u8,
                1usize,
            );
        }
        0
    }
    const STACK_BYTES: usize = 16 * 1024;
    let mut stack = vec![0u8; STACK_BYTES];
    let top = (stack.as_mut_ptr() as usize + STACK_BYTES) & !15;
    let mut pidfd: libc::c_int = -1;
    // SAFETY: the child runs `wait_for_a_byte` on `stack`, which outlives
    // it (we wait for it below), making one raw read; no exit signal, so
    // no reaper of ours sees it.
    let pid = unsafe {
        libc::clone(
            wait_for_a_byte,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_NEWUSER | libc::CLONE_PIDFD,
            read.as_raw_fd() as libc::c_long as *mut libc::c_void,
            &mut pidfd as *mut libc::c_int,
        )
    };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: CLONE_PIDFD stored a new descriptor for the child.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let opened = (|| {
        std::fs::write(format!("/proc/{pid}/uid_map"), ID_MAP)?;
        std::fs::write(format!("/proc/{pid}/gid_map"), ID_MAP)?;
        std::fs::File::open(format!("/proc/{pid}/ns/user")).map(OwnedFd::from)
    })();
    // SAFETY: write(2) of one byte from a live buffer to our pipe.
    unsafe { libc::write(write.as_raw_fd(), b"x".as_ptr().cast(), 1) };
    drop(write);
    // SAFETY: siginfo_t is plain data, valid all zeroes.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child through its pidfd; __WALL because
    // it has no exit signal.
    unsafe {
        libc::waitid(
            libc::P_PIDFD,
            pidfd.as_raw_fd() as libc::id_t,
            &mut info,
            libc::WEXITED | libc::__WALL,
        );
    }
    drop(stack);
    opened
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(path: &str, access: Access) -> Root {
        Root {
            path: path.into(),
            access,
            origin: super::super::roots::Origin::Asked,
        }
    }

    #[test]
    fn the_cwd_writable_roots_and_roots_outside_the_system_are_mapped() {
        let roots = [
            root("/usr", Access::Read),
            root("/etc/ssl", Access::Read),
            root("/etc/app", Access::Write),
            root("/srv/data", Access::Read),
            root("/srv/data/out", Access::Write),
            root("/opt/src", Access::Read),
            root("/dev/null", Access::Write),
            root("/dev/pts", Access::Write),
            root("/proc", Access::Read),
        ];
        assert_eq!(
            mapped_trees(&roots, Path::new("/opt/src")),
            [
                PathBuf::from("/etc/app"),
                "/opt/src".into(),
                "/srv/data".into()
            ]
        );
    }
}
