//! The sentinel: a small process forked when a capexec process makes its
//! cgroup root, that outlives it. It waits on a pipe only its creator holds
//! the writing end of; when that end closes (the creator exited, or was
//! killed with SIGKILL) it kills everything in the root (`cgroup.kill`),
//! waits until it is empty and removes the root and its leaves, in every
//! hierarchy. So nothing a server started outlives it, even when it is
//! killed.
//!
//! The sentinel is forked from a process that may run many threads, so the
//! child runs raw system calls only, on memory prepared before the fork.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::engine::os;

/// Held by the creator: the pipe's writing end, closed when it exits.
pub(crate) struct Sentinel {
    alive: OwnedFd,
}

impl Sentinel {
    /// The writing end, for a hand-over: kept open across the exec, the
    /// sentinel goes on waiting for the same process.
    pub fn raw_fd(&self) -> RawFd {
        self.alive.as_raw_fd()
    }

    /// The sentinel whose writing end the binary before kept open.
    pub fn taken_over(alive: OwnedFd) -> Sentinel {
        Sentinel { alive }
    }
}

/// How long the sentinel waits for the root to empty after killing it.
const PATIENCE_MILLIS: i32 = 10_000;

fn open(path: &Path, flags: libc::c_int) -> io::Result<OwnedFd> {
    let path = CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: open(2) on a NUL-terminated path.
    let fd = os::cvt(unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC) })?;
    // SAFETY: the kernel just returned this descriptor to us alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Forks the sentinel of the root at `dir` (locked by `lock`), which also
/// removes the root's mirrors named `name` in `v1_parents` (cgroup v1
/// groups), made or not: they are made only when a limit needs them.
pub(crate) fn start(
    lock: &OwnedFd,
    dir: &Path,
    v1_parents: &[PathBuf],
    name: &str,
) -> io::Result<Sentinel> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two new descriptors into `fds`.
    os::cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: the kernel just returned these descriptors to us alone.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let kill = open(&dir.join("cgroup.kill"), libc::O_WRONLY)?;
    let events = open(&dir.join("cgroup.events"), libc::O_RDONLY)?;
    let root = open(dir, libc::O_RDONLY | libc::O_DIRECTORY)?;
    let mut dirs = Vec::new();
    for parent in v1_parents {
        dirs.push(open(parent, libc::O_RDONLY | libc::O_DIRECTORY)?);
    }
    let mirror = CString::new(name)?;
    let path = CString::new(dir.as_os_str().as_bytes())?;
    let dir_fds: Vec<RawFd> = dirs.iter().map(AsRawFd::as_raw_fd).collect();
    let mut keep: Vec<RawFd> = vec![
        read.as_raw_fd(),
        kill.as_raw_fd(),
        events.as_raw_fd(),
        lock.as_raw_fd(),
        root.as_raw_fd(),
    ];
    keep.extend(&dir_fds);
    keep.sort_unstable();
    // At most 15 bytes: the kernel cuts longer names.
    let name = c"cgroup-sentinel";

    // SAFETY: the child runs only raw system calls on memory prepared
    // above (its own copy), and never returns.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: see above; `sentinel_main` never returns.
        unsafe {
            sentinel_main(
                &keep,
                read.as_raw_fd(),
                kill.as_raw_fd(),
                events.as_raw_fd(),
                Removal {
                    root: root.as_raw_fd(),
                    path: path.as_ptr(),
                    v1_parents: &dir_fds,
                    mirror: mirror.as_ptr(),
                },
                name.as_ptr(),
            )
        }
    }
    Ok(Sentinel { alive: write })
}

/// What the sentinel removes: the cgroup2 root (`root`, at `path`) and
/// the directories named `mirror` in `v1_parents`, with their leaves.
struct Removal<'a> {
    root: RawFd,
    path: *const libc::c_char,
    v1_parents: &'a [RawFd],
    mirror: *const libc::c_char,
}

/// The sentinel's life, in the forked child.
unsafe fn sentinel_main(
    keep: &[RawFd],
    read: RawFd,
    kill: RawFd,
    events: RawFd,
    removal: Removal<'_>,
    name: *const libc::c_char,
) -> ! {
    // SAFETY: raw system calls on descriptors and buffers this (forked)
    // process owns.
    unsafe {
        libc::syscall(libc::SYS_setsid);
        libc::syscall(libc::SYS_prctl, libc::PR_SET_NAME, name, 0, 0, 0);
        // Nothing of the creator's but what the sentinel needs: a listener
        // held open here would keep answering for a dead server.
        let mut from: u32 = 0;
        for &fd in keep {
            if (fd as u32) > from {
                libc::syscall(libc::SYS_close_range, from, fd as u32 - 1, 0u32);
            }
            from = fd as u32 + 1;
        }
        libc::syscall(libc::SYS_close_range, from, u32::MAX, 0u32);
        // Signals that end a session or a terminal job do not end this.
        for signal in [libc::SIGHUP, libc::SIGINT, libc::SIGTERM, libc::SIGPIPE] {
            libc::signal(signal, libc::SIG_IGN);
        }
        let mut byte = [0u8; 1];
        loop {
            let got = libc::syscall(libc::SYS_read, read, byte.as_mut_ptr(), 1usize);
            if got == 0 || (got < 0 && *libc::__errno_location() != libc::EINTR) {
                break;
            }
        }
        libc::syscall(libc::SYS_write, kill, c"1".as_ptr(), 1usize);
        let mut waited = 0;
        let mut buffer = [0u8; 256];
        while waited < PATIENCE_MILLIS {
            let got = libc::syscall(
                libc::SYS_pread64,
                events,
                buffer.as_mut_ptr(),
                buffer.len(),
                0i64,
            );
            if got <= 0 || !contains(&buffer[..got as usize], b"populated 1") {
                break;
            }
            let mut pollfd = libc::pollfd {
                fd: events,
                events: libc::POLLPRI,
                revents: 0,
            };
            libc::syscall(
                libc::SYS_poll,
                &mut pollfd as *mut libc::pollfd,
                1u64,
                100i32,
            );
            waited += 100;
        }
        // The mirrors first: the cgroup2 root goes once they are gone.
        for &parent in removal.v1_parents {
            let mirror = libc::syscall(
                libc::SYS_openat,
                parent,
                removal.mirror,
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            );
            if mirror >= 0 {
                remove_children(mirror as RawFd);
                libc::syscall(libc::SYS_close, mirror);
                libc::syscall(
                    libc::SYS_unlinkat,
                    parent,
                    removal.mirror,
                    libc::AT_REMOVEDIR,
                );
            }
        }
        remove_children(removal.root);
        libc::syscall(libc::SYS_rmdir, removal.path);
        libc::syscall(libc::SYS_exit_group, 0);
    }
    #[allow(clippy::empty_loop)]
    loop {}
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

/// How deep below a root [`remove_children`] goes: a root's leaves, or a
/// monitor's groups for its users with their workers' roots and leaves
/// (`u-UID-N/capexec-…/p-N`).
const REMOVAL_DEPTH: u32 = 4;

/// Removes the (empty) directories in `dir`: the leaves of a root, and
/// the cgroups below them up to [`REMOVAL_DEPTH`] levels down.
unsafe fn remove_children(dir: RawFd) {
    // SAFETY: as the caller's.
    unsafe { remove_children_below(dir, REMOVAL_DEPTH) }
}

unsafe fn remove_children_below(dir: RawFd, depth: u32) {
    let mut buffer = [0u8; 4096];
    // SAFETY: getdents64 writes at most `buffer.len()` bytes of records
    // into `buffer`; each record is read within what it wrote.
    unsafe {
        // Removing entries while reading can skip some: read again until a
        // pass removes nothing.
        loop {
            libc::syscall(libc::SYS_lseek, dir, 0i64, libc::SEEK_SET);
            let mut removed = false;
            loop {
                let got =
                    libc::syscall(libc::SYS_getdents64, dir, buffer.as_mut_ptr(), buffer.len());
                if got <= 0 {
                    break;
                }
                let mut at = 0usize;
                while at + 19 < got as usize {
                    // struct linux_dirent64: ino (8), off (8), reclen (2),
                    // type (1), then the NUL-terminated name.
                    let reclen = u16::from_ne_bytes([buffer[at + 16], buffer[at + 17]]) as usize;
                    let kind = buffer[at + 18];
                    let name = buffer.as_ptr().add(at + 19);
                    let dot = *name == b'.'
                        && (*name.add(1) == 0 || (*name.add(1) == b'.' && *name.add(2) == 0));
                    if kind == libc::DT_DIR && !dot {
                        let mut gone =
                            libc::syscall(libc::SYS_unlinkat, dir, name, libc::AT_REMOVEDIR) == 0;
                        // A cgroup with cgroups in it: those first.
                        if !gone && depth > 1 {
                            let child = libc::syscall(
                                libc::SYS_openat,
                                dir,
                                name,
                                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
                            );
                            if child >= 0 {
                                remove_children_below(child as RawFd, depth - 1);
                                libc::syscall(libc::SYS_close, child);
                                gone = libc::syscall(
                                    libc::SYS_unlinkat,
                                    dir,
                                    name,
                                    libc::AT_REMOVEDIR,
                                ) == 0;
                            }
                        }
                        removed |= gone;
                    }
                    if reclen == 0 {
                        break;
                    }
                    at += reclen;
                }
            }
            if !removed {
                break;
            }
        }
    }
}
