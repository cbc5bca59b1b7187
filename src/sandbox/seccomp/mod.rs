//! The seccomp filters of sandboxed children, built once per variant
//! (`bpf.rs` lays them out): every call is allowed but
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
//!
//! The filters were compiled by `seccompiler` (rust-vmm's, used by
//! Firecracker) until its chain of comparisons was measured costing every
//! sandboxed start 130 µs more to attach than a search tree (see `bpf.rs`);
//! it stays the tests' oracle: both programs give the same action for
//! every call number and the arguments that matter (`tests.rs`).

mod bpf;
#[cfg(test)]
mod tests;

use std::sync::{Arc, OnceLock};

use self::bpf::{Arch, Rule, Rules};

/// A compiled filter, as the child hands it to the kernel.
pub(crate) type Program = Arc<Vec<libc::sock_filter>>;

/// Whether filters are built for this processor.
pub(crate) fn supported() -> bool {
    Arch::native().is_some()
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
/// `unshare`'s only: `clone` reads those bits as the exit signal). All are
/// in the low 32 bits, which is all the filter reads of the flags.
const CLONE_NAMESPACES: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u32;
const CLONE_NEWTIME: u32 = 0x80;

/// What the filter denying `denied` does with each call it does not allow.
fn rules(denied: Denied) -> Rules {
    let number = |call: i64| call as u32;
    let eperm = Rule::Fail(libc::EPERM as u32);
    let mut rules = Rules::new();
    for call in [
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
    ] {
        rules.insert(number(call), eperm);
    }
    if denied.network {
        let unix_only = Rule::OnlyFirstArgument(libc::AF_UNIX as u32);
        rules.insert(number(libc::SYS_socket), unix_only);
        rules.insert(number(libc::SYS_socketpair), unix_only);
    }
    if denied.kernel_calls {
        for &call in KERNEL_CALLS.iter().chain(PORT_CALLS) {
            rules.insert(number(call), eperm);
        }
    }
    if denied.namespaces {
        rules.insert(
            number(libc::SYS_clone),
            Rule::FailWithAnyFlag(CLONE_NAMESPACES),
        );
        rules.insert(
            number(libc::SYS_unshare),
            Rule::FailWithAnyFlag(CLONE_NAMESPACES | CLONE_NEWTIME),
        );
        rules.insert(number(libc::SYS_setns), eperm);
        rules.insert(number(libc::SYS_clone3), Rule::Fail(libc::ENOSYS as u32));
    }
    rules
}

fn compile(denied: Denied) -> Result<Vec<libc::sock_filter>, String> {
    let arch = Arch::native().ok_or_else(|| {
        format!(
            "no seccomp filters for {} processors",
            std::env::consts::ARCH
        )
    })?;
    bpf::assemble(arch, &rules(denied))
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
