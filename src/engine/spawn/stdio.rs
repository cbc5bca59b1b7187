//! The child's standard descriptors: what a client handed over, pipes, or
//! a terminal, planned in the parent as the steps the child takes.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

use super::c_string;
use crate::engine::{descriptors, os};

/// Standard descriptors a child gets as they are, instead of pipes: a
/// client's own, which it sent to a server on its machine, so that the
/// child writes into the client's pipe (or file, or socket) itself. The
/// server closes its copies once the child has them.
#[derive(Debug, Default)]
pub struct GivenStdio {
    pub stdin: Option<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
}

impl GivenStdio {
    /// Whether `fd` may be a child's standard descriptor: a pipe, socket,
    /// regular file or character device (`confined`: a pipe or regular
    /// file only, since through a socket a sandboxed child could reach, or
    /// be sent, what its sandbox denies it); never a directory (a handle a
    /// sandboxed child could open paths under) or an `O_PATH` descriptor.
    /// Asks only what the kernel has cached (`AT_STATX_DONT_SYNC`): a
    /// file on a FUSE mount that stops answering must not stop the server.
    pub fn may_be_stdio(fd: &OwnedFd, confined: bool) -> bool {
        use rustix::fs::{AtFlags, StatxFlags};
        use std::os::fd::AsRawFd;
        // SAFETY: fcntl(F_GETFL) on a descriptor we own.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
        if flags < 0 || flags & libc::O_PATH != 0 {
            return false;
        }
        let Ok(stat) = rustix::fs::statx(
            fd,
            c"",
            AtFlags::EMPTY_PATH | AtFlags::STATX_DONT_SYNC,
            StatxFlags::TYPE,
        ) else {
            return false;
        };
        let kind = u32::from(stat.stx_mode) & libc::S_IFMT;
        match kind {
            libc::S_IFIFO | libc::S_IFREG => true,
            libc::S_IFSOCK | libc::S_IFCHR => !confined,
            _ => false,
        }
    }

    /// Whether every one of them [may be](Self::may_be_stdio) a standard
    /// descriptor.
    pub fn may_all_be_stdio(&self, confined: bool) -> bool {
        [&self.stdin, &self.stdout, &self.stderr]
            .into_iter()
            .flatten()
            .all(|fd| GivenStdio::may_be_stdio(fd, confined))
    }

    fn take_all(&mut self) -> Vec<OwnedFd> {
        [self.stdin.take(), self.stdout.take(), self.stderr.take()]
            .into_iter()
            .flatten()
            .collect()
    }
}

impl Drop for GivenStdio {
    fn drop(&mut self) {
        descriptors::close_in_background(self.take_all());
    }
}

/// The standard descriptors a child gets.
pub(crate) enum ChildStdio {
    /// What `given` has; for the rest, stdin piped or /dev/null, stdout
    /// and stderr piped.
    Pipes { pipe_stdin: bool, given: GivenStdio },
    /// All three on this terminal, opened by the child after it became a
    /// session leader, which makes it the controlling terminal.
    Terminal(PathBuf),
}

/// A close-on-exec pipe whose ends are above the standard descriptors, so
/// that setting up 0, 1 and 2 in the child cannot clobber one of them.
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    os::cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: the kernel just returned these descriptors to us alone.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((above_stdio(read)?, above_stdio(write)?))
}

fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: duplicates a descriptor we own to one numbered 3 or higher.
    let high = os::cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) })?;
    // SAFETY: fcntl just returned this descriptor to us alone.
    Ok(unsafe { OwnedFd::from_raw_fd(high as RawFd) })
}

/// One step of setting up the child's standard descriptors.
pub(super) enum StdioAction {
    /// Make `to` a copy of `from`.
    Dup { from: RawFd, to: RawFd },
    /// Open `path` as `to`.
    Open {
        path: CString,
        flags: libc::c_int,
        to: RawFd,
    },
}

impl StdioAction {
    /// The parent's descriptor this step copies, if any: a step copying
    /// one the child set up itself (0 onto 1 on a terminal) has none.
    pub(super) fn parent_descriptor(&self) -> Option<RawFd> {
        match *self {
            // The plan keeps every descriptor of the parent's above 2.
            StdioAction::Dup { from, .. } if from > 2 => Some(from),
            _ => None,
        }
    }
}

/// The child's descriptors, and the parent's ends of its pipes.
pub(super) struct StdioPlan {
    pub(super) actions: Vec<StdioAction>,
    pub(super) parent_stdin: Option<OwnedFd>,
    pub(super) parent_stdout: Option<OwnedFd>,
    pub(super) parent_stderr: Option<OwnedFd>,
    /// The child's ends, open in the parent until the child has them.
    /// Closed on the process's own thread (`SpawnedChild::child_ends`),
    /// or off this thread if the plan is dropped with them: once the
    /// child runs, it may hold their pipes' locks, which close(2) takes.
    pub(super) child_ends: Vec<OwnedFd>,
    /// Given descriptors (a client's): closed off this thread once the
    /// plan is dropped (see [`descriptors::close_in_background`]).
    given: Vec<OwnedFd>,
}

impl Drop for StdioPlan {
    fn drop(&mut self) {
        descriptors::close_in_background(std::mem::take(&mut self.given));
        descriptors::close_in_background(std::mem::take(&mut self.child_ends));
    }
}

impl StdioPlan {
    /// Whether a given descriptor may flush when a copy of it is closed:
    /// anything but a pipe, a socket, a terminal or a memory device
    /// (`/dev/null`), whose drivers have no flush, or a file on a local
    /// filesystem whose files have none (ext2-4, XFS, Btrfs, tmpfs,
    /// ramfs). A file on a FUSE mount waits for its server's answer, one
    /// on NFS for the network, one on overlayfs for whatever lies under
    /// it, and a device of a driver we do not know (CUSE) may wait too.
    /// Asks only what the kernel has cached, as
    /// [`GivenStdio::may_be_stdio`] does, and the mount, not the
    /// filesystem, which it names (`sys::filesystem_magic`).
    pub(super) fn given_may_flush(&self) -> bool {
        use rustix::fs::{AtFlags, StatxFlags};
        /// Memory devices, terminals, the console, pseudo-terminals.
        const NEVER_FLUSH: [u32; 11] = [1, 4, 5, 136, 137, 138, 139, 140, 141, 142, 143];
        /// ext2-4, XFS, Btrfs, tmpfs, ramfs: `file_operations` with no
        /// `flush` (Linux 6.18).
        const NO_FLUSH_FILESYSTEMS: [u64; 5] =
            [0xEF53, 0x5846_5342, 0x9123_683E, 0x0102_1994, 0x8584_58F6];
        /// `STATX_MNT_ID_UNIQUE` (Linux 6.8), which rustix does not name.
        const MNT_ID_UNIQUE: StatxFlags = StatxFlags::from_bits_retain(libc::STATX_MNT_ID_UNIQUE);
        self.given.iter().any(|fd| {
            // The mount's id with the type, in one call: FUSE asks its
            // server for neither (it has no such attribute to refresh).
            rustix::fs::statx(
                fd,
                c"",
                AtFlags::EMPTY_PATH | AtFlags::STATX_DONT_SYNC,
                StatxFlags::TYPE | MNT_ID_UNIQUE,
            )
            .map_or(true, |stat| match u32::from(stat.stx_mode) & libc::S_IFMT {
                libc::S_IFIFO | libc::S_IFSOCK => false,
                libc::S_IFCHR => !NEVER_FLUSH.contains(&stat.stx_rdev_major),
                libc::S_IFREG => {
                    !(stat.stx_mask & MNT_ID_UNIQUE.bits() != 0
                        && crate::sys::filesystem_magic(stat.stx_mnt_id)
                            .is_some_and(|magic| NO_FLUSH_FILESYSTEMS.contains(&magic)))
                }
                _ => true,
            })
        })
    }

    pub(super) fn new(stdio: ChildStdio) -> io::Result<StdioPlan> {
        use std::os::fd::AsRawFd;
        let mut plan = StdioPlan {
            actions: Vec::new(),
            parent_stdin: None,
            parent_stdout: None,
            parent_stderr: None,
            child_ends: Vec::new(),
            given: Vec::new(),
        };
        match stdio {
            ChildStdio::Pipes {
                pipe_stdin,
                mut given,
            } => {
                if let Some(stdin) = given.stdin.take() {
                    plan.give(stdin, 0)?;
                } else if pipe_stdin {
                    let (read, write) = pipe()?;
                    plan.actions.push(StdioAction::Dup {
                        from: read.as_raw_fd(),
                        to: 0,
                    });
                    plan.parent_stdin = Some(write);
                    plan.child_ends.push(read);
                } else {
                    plan.actions.push(StdioAction::Open {
                        path: c_string(OsStr::new("/dev/null"))?,
                        flags: libc::O_RDONLY,
                        to: 0,
                    });
                }
                match given.stdout.take() {
                    Some(stdout) => plan.give(stdout, 1)?,
                    None => plan.parent_stdout = Some(plan.output_pipe(1)?),
                }
                match given.stderr.take() {
                    Some(stderr) => plan.give(stderr, 2)?,
                    None => plan.parent_stderr = Some(plan.output_pipe(2)?),
                }
            }
            ChildStdio::Terminal(slave) => {
                // Without O_NOCTTY: it becomes the controlling terminal of
                // the session the child has just created.
                plan.actions.push(StdioAction::Open {
                    path: c_string(slave.as_os_str())?,
                    flags: libc::O_RDWR,
                    to: 0,
                });
                plan.actions.push(StdioAction::Dup { from: 0, to: 1 });
                plan.actions.push(StdioAction::Dup { from: 0, to: 2 });
            }
        }
        Ok(plan)
    }

    /// A pipe whose write end is the child's `to`; returns the read end.
    fn output_pipe(&mut self, to: RawFd) -> io::Result<OwnedFd> {
        use std::os::fd::AsRawFd;
        let (read, write) = pipe()?;
        self.actions.push(StdioAction::Dup {
            from: write.as_raw_fd(),
            to,
        });
        self.child_ends.push(write);
        Ok(read)
    }

    /// `fd` as the child's `to`, kept above the standard descriptors so
    /// that no earlier step of the plan overwrites it.
    fn give(&mut self, fd: OwnedFd, to: RawFd) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let fd = above_stdio(fd)?;
        self.actions.push(StdioAction::Dup {
            from: fd.as_raw_fd(),
            to,
        });
        self.given.push(fd);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn given(fd: OwnedFd) -> StdioPlan {
        StdioPlan::new(ChildStdio::Pipes {
            pipe_stdin: false,
            given: GivenStdio {
                stdin: None,
                stdout: Some(fd),
                stderr: None,
            },
        })
        .expect("plan")
    }

    #[test]
    fn only_pipes_sockets_ttys_memory_devices_and_local_files_cannot_flush() {
        let (_, write) = std::io::pipe().expect("pipe");
        assert!(!given(write.into()).given_may_flush());
        let (socket, _peer) = std::os::unix::net::UnixStream::pair().expect("pair");
        assert!(!given(socket.into()).given_may_flush());
        let proc = std::fs::File::open("/proc/self/stat").expect("a file of procfs");
        assert!(given(proc.into()).given_may_flush());
        // A file of tmpfs, whose files have no flush.
        let shm = tempfile::tempfile_in("/dev/shm").expect("a file in /dev/shm, a tmpfs");
        assert!(!given(shm.into()).given_may_flush());
        let null = std::fs::File::open("/dev/null").expect("a memory device");
        assert!(!given(null.into()).given_may_flush());
        let none = StdioPlan::new(ChildStdio::Pipes {
            pipe_stdin: true,
            given: GivenStdio::default(),
        })
        .expect("plan");
        assert!(!none.given_may_flush());
    }
}
