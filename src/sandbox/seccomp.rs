//! The seccomp filters of sandboxed children, compiled once per variant
//! with `seccompiler` (rust-vmm's, used by Firecracker): every call is
//! allowed but
//! - `io_uring_*` (its operations could make sockets without `socket(2)`),
//! - with the network off, `socket` and `socketpair` of any family but Unix
//!   (UDP, raw and netlink sockets included: Landlock covers only TCP
//!   before ABI 10),
//! - for a privileged server's children, the calls that change the kernel
//!   (modules, kexec, bpf, perf, mounts, keys, swap, clocks, I/O ports);
//!   they hold no capability, so these fail anyway: this is the second wall.
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

/// The filter for a child with the network `off` or on, of a `privileged`
/// server or not.
pub(crate) fn program(network_off: bool, privileged: bool) -> Result<Program, String> {
    static PROGRAMS: OnceLock<[Result<Program, String>; 4]> = OnceLock::new();
    let programs = PROGRAMS.get_or_init(|| {
        [(false, false), (false, true), (true, false), (true, true)]
            .map(|(off, privileged)| compile(off, privileged).map(Arc::new))
    });
    programs[usize::from(network_off) * 2 + usize::from(privileged)].clone()
}

fn compile(network_off: bool, privileged: bool) -> Result<BpfProgram, String> {
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
    if network_off {
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
    if privileged {
        for &call in KERNEL_CALLS.iter().chain(PORT_CALLS) {
            rules.insert(call, Vec::new());
        }
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
    if arch == TargetArch::x86_64 {
        refuse_x32(&mut program);
    }
    Ok(program)
}

/// The x32 ABI shares x86_64's architecture value and numbers its calls
/// from bit 30 up, so a filter that names x86_64 numbers would let them
/// through: kill them right after the architecture check.
fn refuse_x32(program: &mut BpfProgram) {
    use seccompiler::sock_filter;
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JMP_JGE_K: u16 = 0x05 | 0x30;
    const BPF_RET_K: u16 = 0x06;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    // seccompiler's program starts with the three instructions of its
    // architecture check; the syscall number is at offset 0 of seccomp_data.
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
    let at = 3.min(program.len());
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
    fn every_variant_compiles_and_the_x32_guard_follows_the_architecture_check() {
        for (off, privileged) in [(false, false), (false, true), (true, false), (true, true)] {
            let program = program(off, privileged).expect("compiles");
            assert!(program.len() > 8, "{} instructions", program.len());
            if target_arch() == Some(TargetArch::x86_64) {
                assert_eq!(program[4].k, 0x4000_0000);
                assert_eq!(program[5].k, libc::SECCOMP_RET_KILL_PROCESS);
            }
        }
        let off = program(true, false).expect("compiles");
        let on = program(false, false).expect("compiles");
        assert!(off.len() > on.len(), "the network rules add instructions");
    }
}
