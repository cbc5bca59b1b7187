//! The child between clone and exec: raw system calls only, on memory the
//! parent prepared, and how it tells the parent which step failed.

use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, Ordering};

use super::confine::Confinement;
use super::stdio::StdioAction;

/// The child's steps before exec that can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// New session, signals, standard descriptors.
    Setup,
    Chdir,
    /// Joining its cgroup.
    Cgroup,
    /// Capabilities, no_new_privs, Landlock, seccomp.
    Confine,
}

/// A failure of the child before its exec.
#[derive(Debug)]
pub(super) struct SetupFailure {
    pub(super) step: Step,
    pub(super) error: io::Error,
}

impl std::fmt::Display for SetupFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.step, self.error)
    }
}

impl std::error::Error for SetupFailure {}

pub(super) const FAILED_IN_SETUP: i32 = 1;
pub(super) const FAILED_IN_CHDIR: i32 = 2;
pub(super) const FAILED_IN_EXEC: i32 = 3;
pub(super) const FAILED_IN_CGROUP: i32 = 4;
pub(super) const FAILED_IN_CONFINE: i32 = 5;

/// Everything the child needs, prepared before the clone.
pub(super) struct ChildPlan<'a> {
    /// The leaf's `cgroup.procs`, when the child was not cloned into it.
    pub(super) join_procs: Option<RawFd>,
    pub(super) program: &'a CString,
    pub(super) argv: &'a [*const libc::c_char],
    pub(super) envp: &'a [*const libc::c_char],
    /// The working directory, opened (see `working_dir.rs`).
    pub(super) cwd: RawFd,
    pub(super) stdio: &'a [StdioAction],
    pub(super) max_signal: libc::c_int,
    /// Descriptors to mark close-on-exec when close_range(2) cannot.
    pub(super) open_fds: Option<&'a [RawFd]>,
    pub(super) extras: &'a Extras<'a>,
    /// The errno of the step that failed, and which step; shared with the
    /// parent (CLONE_VM).
    pub(super) error: AtomicI32,
    pub(super) step: AtomicI32,
}

/// [`ChildSetup`] as the child applies it.
pub(super) struct Extras<'a> {
    /// Our pid if the child must die with us, else 0.
    pub(super) parent: libc::pid_t,
    pub(super) descriptor_limit: Option<libc::rlimit64>,
    pub(super) confinement: &'a Confinement,
}

/// Runs in the child between clone and exec. It shares the parent's memory
/// and thread-local storage, so it must not allocate, lock, unwind or use
/// C library wrappers with side effects (cancellation points): raw system
/// calls only.
pub(super) extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's `ChildPlan`, alive while the parent is
    // suspended by CLONE_VFORK; everything below is a raw system call.
    unsafe {
        let plan = &*(arg as *const ChildPlan<'_>);
        let fail = |plan: &ChildPlan<'_>, step: i32, result: libc::c_long| -> ! {
            // Raw system calls return -errno.
            plan.error.store((-result as i32).max(1), Ordering::Release);
            plan.step.store(step, Ordering::Release);
            libc::syscall(libc::SYS_exit_group, 127);
            unreachable_child()
        };
        // Every disposition to default, including the signals the C library
        // reserves. All zeros is SIG_DFL, no flags and an empty mask in the
        // kernel's struct sigaction on every architecture.
        let default = [0u64; 4];
        for signal in 1..=plan.max_signal {
            if signal != libc::SIGKILL && signal != libc::SIGSTOP {
                raw(libc::syscall(
                    libc::SYS_rt_sigaction,
                    signal,
                    default.as_ptr(),
                    std::ptr::null_mut::<u64>(),
                    KERNEL_SIGSET_BYTES,
                ));
            }
        }
        // Into its cgroup first (unless born in it): nothing it starts is
        // ever outside it.
        for &procs in plan
            .join_procs
            .iter()
            .chain(&plan.extras.confinement.cgroup_procs)
        {
            let result = raw(libc::syscall(libc::SYS_write, procs, c"0".as_ptr(), 1usize));
            if result < 0 {
                fail(plan, FAILED_IN_CGROUP, result);
            }
        }
        // Rooted at its leaf, where the kernel keeps it (and what it
        // starts): it can name no cgroup outside to move into.
        if plan.extras.confinement.cgroup_namespace {
            let result = raw(libc::syscall(libc::SYS_unshare, libc::CLONE_NEWCGROUP));
            if result < 0 {
                fail(plan, FAILED_IN_CGROUP, result);
            }
        }
        let result = raw(libc::syscall(libc::SYS_setsid));
        if result < 0 {
            fail(plan, FAILED_IN_SETUP, result);
        }
        if let Some(limit) = &plan.extras.descriptor_limit {
            let result = raw(libc::syscall(
                libc::SYS_prlimit64,
                0,
                libc::RLIMIT_NOFILE,
                limit as *const libc::rlimit64,
                std::ptr::null_mut::<libc::rlimit64>(),
            ));
            if result < 0 {
                fail(plan, FAILED_IN_SETUP, result);
            }
        }
        let parent = plan.extras.parent;
        if parent != 0 {
            let result = raw(libc::syscall(
                libc::SYS_prctl,
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL,
                0,
                0,
                0,
            ));
            if result < 0 {
                fail(plan, FAILED_IN_SETUP, result);
            }
            // The parent may have died before the request took effect.
            if raw(libc::syscall(libc::SYS_getppid)) != libc::c_long::from(parent) {
                fail(plan, FAILED_IN_SETUP, -libc::c_long::from(libc::ESRCH));
            }
        }
        for action in plan.stdio {
            match action {
                StdioAction::Open { path, flags, to } => {
                    let fd = raw(libc::syscall(
                        libc::SYS_openat,
                        libc::AT_FDCWD,
                        path.as_ptr(),
                        *flags,
                        0,
                    ));
                    if fd < 0 {
                        fail(plan, FAILED_IN_SETUP, fd);
                    }
                    if fd != libc::c_long::from(*to) {
                        let result = raw(libc::syscall(libc::SYS_dup3, fd, *to, 0));
                        if result < 0 {
                            fail(plan, FAILED_IN_SETUP, result);
                        }
                        raw(libc::syscall(libc::SYS_close, fd));
                    }
                }
                StdioAction::Dup { from, to } if from == to => {
                    // A dup onto itself keeps close-on-exec; clear it.
                    raw(libc::syscall(libc::SYS_fcntl, *to, libc::F_SETFD, 0));
                }
                StdioAction::Dup { from, to } => {
                    let result = raw(libc::syscall(libc::SYS_dup3, *from, *to, 0));
                    if result < 0 {
                        fail(plan, FAILED_IN_SETUP, result);
                    }
                }
            }
        }
        // Before the working directory is entered: it may be one of them.
        if let Err(result) = plan.extras.confinement.mount_trees() {
            fail(plan, FAILED_IN_CONFINE, result);
        }
        // Entered by its descriptor, or, when the trees were mounted over
        // it (and entered again by path), proven to be the same inode.
        let result = if plan.extras.confinement.entered_mounted_cwd() {
            same_directory(plan.cwd)
        } else {
            raw(libc::syscall(libc::SYS_fchdir, plan.cwd))
        };
        if result < 0 {
            fail(plan, FAILED_IN_CHDIR, result);
        }
        // After the terminal is open and the directory changed (Landlock
        // rules apply to what is opened from now on), before the
        // descriptors close (the ruleset's among them).
        if let Err(result) = plan.extras.confinement.apply() {
            fail(plan, FAILED_IN_CONFINE, result);
        }
        // Marked close-on-exec, not closed: this child runs before its
        // parent's thread (the serving thread, CLONE_VFORK) goes on, and
        // closing the server's copy of a pipe a peer sent could be that
        // pipe's last close while a closing thread lets go of its own,
        // asleep on a lock the peer holds. The exec closes them after it
        // has let the parent go (so does an exit).
        match plan.open_fds {
            None => {
                raw(libc::syscall(
                    libc::SYS_close_range,
                    3u32,
                    u32::MAX,
                    CLOSE_RANGE_CLOEXEC,
                ));
            }
            Some(fds) => {
                for &fd in fds {
                    if fd > 2 {
                        raw(libc::syscall(
                            libc::SYS_fcntl,
                            fd,
                            libc::F_SETFD,
                            libc::FD_CLOEXEC,
                        ));
                    }
                }
            }
        }
        let empty = 0u64;
        raw(libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &empty as *const u64,
            std::ptr::null_mut::<u64>(),
            KERNEL_SIGSET_BYTES,
        ));
        let result = raw(libc::syscall(
            libc::SYS_execve,
            plan.program.as_ptr(),
            plan.argv.as_ptr(),
            plan.envp.as_ptr(),
        ));
        fail(plan, FAILED_IN_EXEC, result)
    }
}

/// 0 if the working directory is the directory `fd` names (the same
/// device and inode), else -ESTALE: its path, entered again, named another.
///
/// # Safety
/// Only in the child between clone and exec.
unsafe fn same_directory(fd: RawFd) -> libc::c_long {
    // SAFETY: fstatat fills the stat buffers on this stack.
    unsafe {
        let mut entered: libc::stat = std::mem::zeroed();
        let mut opened: libc::stat = std::mem::zeroed();
        let result = raw(libc::syscall(
            libc::SYS_newfstatat,
            libc::AT_FDCWD,
            c".".as_ptr(),
            &mut entered as *mut libc::stat,
            0,
        ));
        if result < 0 {
            return result;
        }
        let result = raw(libc::syscall(
            libc::SYS_newfstatat,
            fd,
            c"".as_ptr(),
            &mut opened as *mut libc::stat,
            libc::AT_EMPTY_PATH,
        ));
        if result < 0 {
            return result;
        }
        if (entered.st_dev, entered.st_ino) == (opened.st_dev, opened.st_ino) {
            0
        } else {
            -libc::c_long::from(libc::ESTALE)
        }
    }
}

/// Size of the kernel's signal set (64 signals); glibc's `sigset_t` is
/// larger. MIPS has 128 signals and is not supported.
pub(super) const KERNEL_SIGSET_BYTES: usize = 8;

/// close_range(2)'s flag that marks the range close-on-exec instead of
/// closing it (Linux 5.11; not in the libc crate for every target).
pub(super) const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
#[cfg(any(target_arch = "mips", target_arch = "mips64"))]
compile_error!("capexec's spawn assumes a 64-signal kernel sigset");

/// A raw system call's result as the kernel gives it: -errno on failure.
/// (libc::syscall returns -1 and sets errno; errno lives in the parent's
/// thread-local storage here, which is shared, so read it at once.)
pub(super) unsafe fn raw(result: libc::c_long) -> libc::c_long {
    if result == -1 {
        // SAFETY: errno of the calling thread, read right after the call.
        -libc::c_long::from(unsafe { *libc::__errno_location() })
    } else {
        result
    }
}

fn unreachable_child() -> ! {
    loop {
        // exit_group does not return; this only satisfies the type.
        std::hint::spin_loop();
    }
}
