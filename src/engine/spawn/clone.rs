//! The parent's side of the clone: the child's plan laid out in memory,
//! clone(2) or clone3 into a cgroup with every signal blocked, and the
//! child's failure read back once it has exec'd or exited.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, Ordering};

use super::c_string;
use super::child::{
    ChildPlan, Extras, FAILED_IN_CGROUP, FAILED_IN_CHDIR, FAILED_IN_CONFINE, FAILED_IN_EXEC,
    KERNEL_SIGSET_BYTES, SetupFailure, Step, child_main,
};
use super::stdio::StdioAction;
use crate::engine::os;

/// Stack of the child between clone and exec; it only makes system calls.
const CHILD_STACK_BYTES: usize = 64 * 1024;

pub(super) fn launch(
    program: &Path,
    argv: &[&OsStr],
    envp: &[OsString],
    cwd: RawFd,
    stdio: &[StdioAction],
    extras: &Extras<'_>,
) -> io::Result<(i32, OwnedFd)> {
    let program = c_string(program.as_os_str())?;
    let argv: Vec<CString> = argv
        .iter()
        .map(|a| c_string(a))
        .collect::<io::Result<_>>()?;
    let envp: Vec<CString> = envp
        .iter()
        .map(|e| c_string(e))
        .collect::<io::Result<_>>()?;
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut envp_ptrs: Vec<*const libc::c_char> = envp.iter().map(|e| e.as_ptr()).collect();
    envp_ptrs.push(std::ptr::null());
    let open_fds = (!close_range_works()).then(list_open_fds);
    let mut plan = ChildPlan {
        join_procs: None,
        program: &program,
        argv: &argv_ptrs,
        envp: &envp_ptrs,
        cwd,
        stdio,
        max_signal: libc::SIGRTMAX(),
        open_fds: open_fds.as_deref(),
        extras,
        error: AtomicI32::new(0),
        step: AtomicI32::new(0),
    };
    let mut stack = vec![0u8; CHILD_STACK_BYTES];
    // The stack grows down from its 16-byte aligned top.
    let top = (stack.as_mut_ptr() as usize + CHILD_STACK_BYTES) & !15;

    let dumpable = extras.confinement.user.map(|_| dumpable_before_children());
    // Signals stay blocked until the child has reset every handler: a
    // handler of ours must never run in the child, which shares our memory.
    let mut pidfd: libc::c_int = -1;
    let saved = block_all_signals();
    let arg = &plan as *const ChildPlan<'_> as *mut libc::c_void;
    let mut cloned = None;
    if let Some(cgroup) = extras.confinement.cgroup
        && extras.confinement.clone_into_cgroup
    {
        // SAFETY: as for clone below; the child is born in its cgroup.
        let result = unsafe { clone_into_cgroup(cgroup, &mut stack, arg, &mut pidfd) };
        match result {
            Ok(pid) => cloned = Some(pid),
            Err(error) if cannot_clone_into_cgroup(&error) => {}
            Err(error) => {
                restore_signals(saved);
                return Err(error);
            }
        }
    }
    let pid = match cloned {
        Some(pid) => {
            restore_signals(saved);
            pid
        }
        None => {
            // Without clone3's CLONE_INTO_CGROUP the child joins its cgroup
            // by writing its `cgroup.procs`, first thing.
            let procs = match extras.confinement.cgroup {
                Some(cgroup) => match open_procs(cgroup) {
                    Ok(procs) => Some(procs),
                    Err(error) => {
                        restore_signals(saved);
                        return Err(io::Error::other(SetupFailure {
                            step: Step::Cgroup,
                            error,
                        }));
                    }
                },
                None => None,
            };
            plan.join_procs = procs.as_ref().map(std::os::fd::AsRawFd::as_raw_fd);
            let arg = &plan as *const ChildPlan<'_> as *mut libc::c_void;
            // SAFETY: the child runs `child_main` on `stack`, touching only
            // `plan` and making system calls; CLONE_VFORK suspends us until
            // it has exec'd or exited, so everything it uses outlives it.
            unsafe {
                let pid = libc::clone(
                    child_main,
                    top as *mut libc::c_void,
                    libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD,
                    arg,
                    &mut pidfd as *mut libc::c_int,
                );
                let clone_error = io::Error::last_os_error();
                restore_signals(saved);
                if pid < 0 {
                    return Err(clone_error);
                }
                pid
            }
        }
    };
    drop(stack);
    if let Some(dumpable) = dumpable {
        // SAFETY: prctl(PR_SET_DUMPABLE) on this process.
        unsafe { libc::prctl(libc::PR_SET_DUMPABLE, dumpable, 0, 0, 0) };
    }
    // SAFETY: CLONE_PIDFD stored a new descriptor for the child in `pidfd`.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let failed = plan.error.load(Ordering::Acquire);
    if failed != 0 {
        // The child has exited; reap it before reporting why.
        {
            use std::os::fd::AsRawFd;
            super::reap(libc::P_PIDFD, pidfd.as_raw_fd() as libc::id_t);
        }
        let error = io::Error::from_raw_os_error(failed);
        return Err(match plan.step.load(Ordering::Acquire) {
            FAILED_IN_EXEC => error,
            FAILED_IN_CHDIR => io::Error::other(SetupFailure {
                step: Step::Chdir,
                error,
            }),
            FAILED_IN_CGROUP => io::Error::other(SetupFailure {
                step: Step::Cgroup,
                error,
            }),
            FAILED_IN_CONFINE => io::Error::other(SetupFailure {
                step: Step::Confine,
                error,
            }),
            _ => io::Error::other(SetupFailure {
                step: Step::Setup,
                error,
            }),
        });
    }
    Ok((pid, pidfd))
}

/// This process's dumpable flag before any child changed it. A child that
/// changes its uid before its exec changes the flag of the memory it
/// still shares with us (the kernel resets it as for a set-user-ID
/// program), so the parent puts it back once the child is gone from it.
fn dumpable_before_children() -> libc::c_int {
    static DUMPABLE: OnceLock<libc::c_int> = OnceLock::new();
    // SAFETY: prctl(PR_GET_DUMPABLE) only reads the flag.
    *DUMPABLE.get_or_init(|| unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) }.max(0))
}

/// Blocks every signal of the calling thread (the C library's reserved ones
/// included, which `pthread_sigmask` skips); returns the previous mask.
fn block_all_signals() -> u64 {
    let all = u64::MAX;
    let mut previous = 0u64;
    // SAFETY: rt_sigprocmask on this thread with kernel-sized sets.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &all as *const u64,
            &mut previous as *mut u64,
            KERNEL_SIGSET_BYTES,
        );
    }
    previous
}

fn restore_signals(previous: u64) {
    // SAFETY: as above.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &previous as *const u64,
            std::ptr::null_mut::<u64>(),
            KERNEL_SIGSET_BYTES,
        );
    }
}

/// The `cgroup.procs` of the cgroup2 directory `cgroup`, for writing.
fn open_procs(cgroup: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: openat(2) relative to a directory we hold, with a
    // NUL-terminated name.
    let fd = os::cvt(unsafe {
        libc::openat(
            cgroup,
            c"cgroup.procs".as_ptr(),
            libc::O_WRONLY | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: the kernel just returned this descriptor to us alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Whether clone3 failed only because this kernel cannot clone into a
/// cgroup (no clone3, or no CLONE_INTO_CGROUP): the child joins by
/// `cgroup.procs` then, and later starts do not try again.
fn cannot_clone_into_cgroup(error: &io::Error) -> bool {
    let unsupported = matches!(error.raw_os_error(), Some(libc::ENOSYS) | Some(libc::E2BIG));
    if unsupported {
        CLONE3_UNSUPPORTED.store(true, Ordering::Relaxed);
    }
    unsupported || error.raw_os_error() == Some(libc::EINVAL)
}

static CLONE3_UNSUPPORTED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// clone3's arguments (`struct clone_args`, up to `cgroup`: Linux 5.7).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Clones the child as [`launch`] does (`CLONE_VM | CLONE_VFORK`, a pidfd
/// in `pidfd`), running `child_main(arg)` on `stack`, born in the cgroup2
/// directory `cgroup`: joining a cgroup by `cgroup.procs` takes the
/// kernel's cgroup-wide write lock, whose first taking after a quiet while
/// waits out an RCU grace period (milliseconds); being cloned into one
/// takes only its read side. The pid, or why not.
///
/// # Safety
/// As for `clone(2)` with `child_main`: the child touches only `arg`'s
/// plan and makes system calls, while the caller is suspended; signals
/// are blocked.
#[cfg(target_arch = "x86_64")]
unsafe fn clone_into_cgroup(
    cgroup: RawFd,
    stack: &mut [u8],
    arg: *mut libc::c_void,
    pidfd: &mut libc::c_int,
) -> io::Result<i32> {
    if CLONE3_UNSUPPORTED.load(Ordering::Relaxed) {
        return Err(io::Error::from_raw_os_error(libc::ENOSYS));
    }
    let args = CloneArgs {
        flags: (libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD) as u64 | CLONE_INTO_CGROUP,
        pidfd: pidfd as *mut libc::c_int as u64,
        exit_signal: libc::SIGCHLD as u64,
        stack: stack.as_mut_ptr() as u64,
        stack_size: stack.len() as u64,
        cgroup: cgroup as u64,
        ..CloneArgs::default()
    };
    let entry: extern "C" fn(*mut libc::c_void) -> libc::c_int = child_main;
    let result: libc::c_long;
    // SAFETY: clone3 returns in both processes. The parent (rax: the pid
    // or -errno) goes on as after any system call. The child (rax 0) is
    // on the top of `stack` (the kernel sets its stack pointer there),
    // calls `child_main(arg)` from it and exits with its result; it never
    // comes back into this function's frame, which is the parent's.
    // r12 and r13 hold the entry and its argument across the call (the
    // kernel keeps them in both processes).
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "xor ebp, ebp",
            "and rsp, -16",
            "mov rdi, r13",
            "call r12",
            "mov edi, eax",
            "mov eax, {exit_group}",
            "syscall",
            "ud2",
            "2:",
            exit_group = const libc::SYS_exit_group,
            inlateout("rax") libc::SYS_clone3 => result,
            in("rdi") &args as *const CloneArgs,
            in("rsi") std::mem::size_of::<CloneArgs>(),
            in("r12") entry,
            in("r13") arg,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    if result < 0 {
        return Err(io::Error::from_raw_os_error(-result as i32));
    }
    Ok(result as i32)
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn clone_into_cgroup(
    _cgroup: RawFd,
    _stack: &mut [u8],
    _arg: *mut libc::c_void,
    _pidfd: &mut libc::c_int,
) -> io::Result<i32> {
    // Joined by `cgroup.procs`: no clone3 entry for this processor yet.
    Err(io::Error::from_raw_os_error(libc::ENOSYS))
}

fn close_range_works() -> bool {
    static WORKS: OnceLock<bool> = OnceLock::new();
    *WORKS.get_or_init(|| {
        // An empty range far above any open descriptor changes nothing but
        // tells whether the kernel knows the call and its flag (5.11).
        let probe = i32::MAX as u32;
        // SAFETY: close_range on an empty range has no effect.
        unsafe {
            libc::syscall(
                libc::SYS_close_range,
                probe,
                probe,
                super::child::CLOSE_RANGE_CLOEXEC,
            ) == 0
        }
    })
}

fn list_open_fds() -> Vec<RawFd> {
    std::fs::read_dir("/proc/thread-self/fd")
        .map(|dir| {
            dir.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}
