//! The seccomp filters of sandboxed children, compiled once per variant
//! with `seccompiler` (rust-vmm's, used by Firecracker): every call is
//! allowed but
//! - `io_uring_*` (its operations could make sockets without `socket(2)`),
//! - with the network off, `socket` and `socketpair` of any family but Unix
//!   (UDP, raw and netlink sockets included: Landlock covers only TCP
//!   before ABI 10),
//! - for a privileged server's children, the calls that change the kernel
//!   (modules, kexec, bpf, perf, mounts, keys, swap, clocks, I/O ports);
//!   they hold no capability, so these fail anyway: this is the second wall,
//! - unless the sandbox allows namespaces, new ones: `unshare` and `clone`
//!   with a `CLONE_NEW*` flag, and `setns` (a user namespace hands its
//!   maker every capability inside it, and with them kernel code an
//!   unprivileged process never reaches); `clone3` passes its flags in
//!   memory a filter cannot read, so it fails with ENOSYS, on which the C
//!   library falls back to `clone`.
//!
//! Denied calls fail with EPERM. Other architectures' calls (i386, and x32
//! on x86_64) kill the process.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// A compiled filter, as the child hands it to the kernel.
pub(crate) type Program = Arc<BpfProgram>;

pub(crate) fn target_arch() -> Option<TargetArch> {
    TargetArch::try_from(std::env::consts::ARCH).ok()
}

/// What a child's filter denies beyond io_uring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Denied {
    /// Sockets of every family but Unix.
    pub network: bool,
    /// The calls that change the kernel (a privileged server's children).
    pub kernel_calls: bool,
    /// New namespaces.
    pub namespaces: bool,
}

impl Denied {
    const VARIANTS: usize = 8;

    fn index(self) -> usize {
        usize::from(self.network) * 4
            + usize::from(self.kernel_calls) * 2
            + usize::from(self.namespaces)
    }

    fn of_index(index: usize) -> Denied {
        Denied {
            network: index & 4 != 0,
            kernel_calls: index & 2 != 0,
            namespaces: index & 1 != 0,
        }
    }
}

/// The filter that denies `denied`, compiled once per variant.
pub(crate) fn program(denied: Denied) -> Result<Program, String> {
    static PROGRAMS: OnceLock<[Result<Program, String>; Denied::VARIANTS]> = OnceLock::new();
    let programs = PROGRAMS.get_or_init(|| {
        std::array::from_fn(|index| compile(Denied::of_index(index)).map(Arc::new))
    });
    programs[denied.index()].clone()
}

/// The namespace flags of `clone` and `unshare` (CLONE_NEWTIME is
/// `unshare`'s only: `clone` reads those bits as the exit signal).
const CLONE_NAMESPACES: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
];
const CLONE_NEWTIME: u64 = 0x80;

/// Rules that match a call whose first argument (flags) has any of
/// `flags` set.
fn any_flag_of(flags: &[u64]) -> Result<Vec<SeccompRule>, String> {
    flags
        .iter()
        .map(|&flag| {
            let condition = SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(flag),
                flag,
            )
            .map_err(|e| e.to_string())?;
            SeccompRule::new(vec![condition]).map_err(|e| e.to_string())
        })
        .collect()
}

fn compile(denied: Denied) -> Result<BpfProgram, String> {
    let arch = target_arch().ok_or_else(|| {
        format!(
            "no seccomp filters for {} processors",
            std::env::consts::ARCH
        )
    })?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for call in [
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
    ] {
        rules.insert(call, Vec::new());
    }
    if denied.network {
        let not_unix = || -> Result<Vec<SeccompRule>, String> {
            let condition = SeccompCondition::new(
                0,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Ne,
                libc::AF_UNIX as u64,
            )
            .map_err(|e| e.to_string())?;
            Ok(vec![
                SeccompRule::new(vec![condition]).map_err(|e| e.to_string())?,
            ])
        };
        rules.insert(libc::SYS_socket, not_unix()?);
        rules.insert(libc::SYS_socketpair, not_unix()?);
    }
    if denied.kernel_calls {
        for &call in KERNEL_CALLS.iter().chain(PORT_CALLS) {
            rules.insert(call, Vec::new());
        }
    }
    if denied.namespaces {
        rules.insert(libc::SYS_clone, any_flag_of(CLONE_NAMESPACES)?);
        let mut unshare = CLONE_NAMESPACES.to_vec();
        unshare.push(CLONE_NEWTIME);
        rules.insert(libc::SYS_unshare, any_flag_of(&unshare)?);
        rules.insert(libc::SYS_setns, Vec::new());
    }
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|error| error.to_string())?;
    let mut program: BpfProgram = filter
        .try_into()
        .map_err(|error: seccompiler::BackendError| error.to_string())?;
    if denied.namespaces {
        refuse_clone3(&mut program);
    }
    if arch == TargetArch::x86_64 {
        refuse_x32(&mut program);
    }
    Ok(program)
}

/// seccompiler's program starts with the three instructions of its
/// architecture check; what is spliced in right after it runs first.
const AFTER_ARCHITECTURE_CHECK: usize = 3;
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_RET_K: u16 = 0x06;

/// Makes `clone3` fail with ENOSYS, right after the architecture check
/// (seccompiler has one action for every rule it matches: EPERM).
fn refuse_clone3(program: &mut BpfProgram) {
    use seccompiler::sock_filter;
    const BPF_JMP_JEQ_K: u16 = 0x05 | 0x10;
    // The syscall number is at offset 0 of seccomp_data.
    let guard = [
        sock_filter {
            code: BPF_LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 0,
        },
        sock_filter {
            code: BPF_JMP_JEQ_K,
            jt: 0,
            jf: 1,
            k: libc::SYS_clone3 as u32,
        },
        sock_filter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        },
    ];
    let at = AFTER_ARCHITECTURE_CHECK.min(program.len());
    program.splice(at..at, guard);
}

/// The x32 ABI shares x86_64's architecture value and numbers its calls
/// from bit 30 up, so a filter that names x86_64 numbers would let them
/// through: kill them right after the architecture check.
fn refuse_x32(program: &mut BpfProgram) {
    use seccompiler::sock_filter;
    const BPF_JMP_JGE_K: u16 = 0x05 | 0x30;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    // The syscall number is at offset 0 of seccomp_data.
    let guard = [
        sock_filter {
            code: BPF_LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 0,
        },
        sock_filter {
            code: BPF_JMP_JGE_K,
            jt: 0,
            jf: 1,
            k: X32_SYSCALL_BIT,
        },
        sock_filter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_KILL_PROCESS,
        },
    ];
    let at = AFTER_ARCHITECTURE_CHECK.min(program.len());
    program.splice(at..at, guard);
}

/// Calls that change the kernel rather than use it.
const KERNEL_CALLS: &[i64] = &[
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_open_by_handle_at,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_move_mount,
    libc::SYS_fsopen,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_open_tree,
    libc::SYS_syslog,
    libc::SYS_acct,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_quotactl,
    libc::SYS_userfaultfd,
];

/// x86's I/O port access.
#[cfg(target_arch = "x86_64")]
const PORT_CALLS: &[i64] = &[libc::SYS_iopl, libc::SYS_ioperm];
#[cfg(not(target_arch = "x86_64"))]
const PORT_CALLS: &[i64] = &[];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_compiles_and_the_guards_follow_the_architecture_check() {
        for index in 0..Denied::VARIANTS {
            let denied = Denied::of_index(index);
            assert_eq!(denied.index(), index);
            let program = program(denied).expect("compiles");
            assert!(program.len() > 8, "{} instructions", program.len());
            let mut next = AFTER_ARCHITECTURE_CHECK;
            if target_arch() == Some(TargetArch::x86_64) {
                assert_eq!(program[next + 1].k, 0x4000_0000);
                assert_eq!(program[next + 2].k, libc::SECCOMP_RET_KILL_PROCESS);
                next += 3;
            }
            let clone3 = program[next + 1].k == libc::SYS_clone3 as u32
                && program[next + 2].k == libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
            assert_eq!(clone3, denied.namespaces, "{denied:?}");
        }
        let plain = Denied {
            network: false,
            kernel_calls: false,
            namespaces: false,
        };
        let on = program(plain).expect("compiles");
        for more in [
            Denied {
                network: true,
                ..plain
            },
            Denied {
                namespaces: true,
                ..plain
            },
        ] {
            let program = program(more).expect("compiles");
            assert!(program.len() > on.len(), "{more:?} adds instructions");
        }
    }
}
