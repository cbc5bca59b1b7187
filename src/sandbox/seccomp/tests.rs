//! The filters against the programs `seccompiler` built for the same
//! policy before (the oracle), run by a classic-BPF interpreter over every
//! call number and the arguments that matter; and each attached by the
//! kernel in a child of its own, which then tries a denied call.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use super::bpf::{self, Arch};
use super::*;
use crate::sandbox::probe;

fn every_variant() -> impl Iterator<Item = Denied> {
    (0..Denied::VARIANTS).map(Denied::of_index)
}

/// `struct seccomp_data` for a call: nr, arch, instruction_pointer, args.
fn call_data(arch: u32, call: u32, first_argument: u64) -> [u8; 64] {
    let mut data = [0u8; 64];
    data[0..4].copy_from_slice(&call.to_le_bytes());
    data[4..8].copy_from_slice(&arch.to_le_bytes());
    data[16..24].copy_from_slice(&first_argument.to_le_bytes());
    data
}

/// Runs a classic-BPF seccomp program as the kernel would: the action it
/// returns and the instructions it took.
fn run(program: &[libc::sock_filter], data: &[u8; 64]) -> (u32, usize) {
    const ALU_AND_K: u16 = 0x54;
    const JA: u16 = 0x05;
    const JGT_K: u16 = 0x25;
    let mut accumulator: u32 = 0;
    let mut at = 0;
    for steps in 1.. {
        let instruction = program[at];
        at += 1;
        let branch = |taken: bool| {
            usize::from(if taken {
                instruction.jt
            } else {
                instruction.jf
            })
        };
        match instruction.code {
            bpf::LD_W_ABS => {
                let offset = instruction.k as usize;
                let word = data[offset..offset + 4].try_into().expect("4 bytes");
                accumulator = u32::from_le_bytes(word);
            }
            ALU_AND_K => accumulator &= instruction.k,
            JA => at += instruction.k as usize,
            bpf::JEQ_K => at += branch(accumulator == instruction.k),
            bpf::JGE_K => at += branch(accumulator >= instruction.k),
            JGT_K => at += branch(accumulator > instruction.k),
            bpf::JSET_K => at += branch(accumulator & instruction.k != 0),
            bpf::RET_K => return (instruction.k, steps),
            code => panic!("instruction {code:#x} at {}", at - 1),
        }
    }
    unreachable!("a program that returns")
}

/// The program `seccompiler` made for `denied`, with the two guards that
/// were spliced in after its architecture check, as built before.
fn reference(denied: Denied) -> Vec<libc::sock_filter> {
    let any_flag_of = |flags: &[u64]| -> Vec<SeccompRule> {
        flags
            .iter()
            .map(|&flag| {
                let condition = SeccompCondition::new(
                    0,
                    SeccompCmpArgLen::Qword,
                    SeccompCmpOp::MaskedEq(flag),
                    flag,
                )
                .expect("condition");
                SeccompRule::new(vec![condition]).expect("rule")
            })
            .collect()
    };
    let not_unix = || {
        let condition = SeccompCondition::new(
            0,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Ne,
            libc::AF_UNIX as u64,
        )
        .expect("condition");
        vec![SeccompRule::new(vec![condition]).expect("rule")]
    };
    let namespaces = [
        libc::CLONE_NEWNS,
        libc::CLONE_NEWCGROUP,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
    ]
    .map(|flag| flag as u64);
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for call in [
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
    ] {
        rules.insert(call, Vec::new());
    }
    if denied.network {
        rules.insert(libc::SYS_socket, not_unix());
        rules.insert(libc::SYS_socketpair, not_unix());
    }
    if denied.kernel_calls {
        for &call in KERNEL_CALLS.iter().chain(PORT_CALLS) {
            rules.insert(call, Vec::new());
        }
    }
    if denied.namespaces {
        rules.insert(libc::SYS_clone, any_flag_of(&namespaces));
        let mut unshare = namespaces.to_vec();
        unshare.push(u64::from(CLONE_NEWTIME));
        rules.insert(libc::SYS_unshare, any_flag_of(&unshare));
        rules.insert(libc::SYS_setns, Vec::new());
    }
    let arch = TargetArch::try_from(std::env::consts::ARCH).expect("an architecture with filters");
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .expect("filter");
    let program: BpfProgram = filter.try_into().expect("program");
    let mut program: Vec<libc::sock_filter> = program
        .iter()
        .map(|f| libc::sock_filter {
            code: f.code,
            jt: f.jt,
            jf: f.jf,
            k: f.k,
        })
        .collect();
    let guard = |call_test: u16, value: u32, action: u32| {
        [
            libc::sock_filter {
                code: bpf::LD_W_ABS,
                jt: 0,
                jf: 0,
                k: 0,
            },
            libc::sock_filter {
                code: call_test,
                jt: 0,
                jf: 1,
                k: value,
            },
            libc::sock_filter {
                code: bpf::RET_K,
                jt: 0,
                jf: 0,
                k: action,
            },
        ]
    };
    // Its three instructions of architecture check, then the guards.
    if denied.namespaces {
        let enosys = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
        program.splice(3..3, guard(bpf::JEQ_K, libc::SYS_clone3 as u32, enosys));
    }
    if arch == TargetArch::x86_64 {
        let kill = libc::SECCOMP_RET_KILL_PROCESS;
        program.splice(3..3, guard(bpf::JGE_K, bpf::X32_SYSCALL_BIT, kill));
    }
    program
}

/// First arguments that tell the argument checks apart: every single bit
/// (alone and with AF_UNIX), the families, every namespace flag at once
/// and every other flag, with and without high bits.
fn telling_arguments() -> Vec<u64> {
    let mut arguments = vec![
        0,
        u64::MAX,
        0xffff_ffff,
        0xffff_ffff_0000_0000,
        0x1_0000_0001,
        libc::AF_UNIX as u64,
        libc::AF_INET as u64,
        libc::AF_INET6 as u64,
        libc::AF_NETLINK as u64,
        libc::AF_PACKET as u64,
        (1 << 32) | libc::AF_UNIX as u64,
        (1 << 32) | libc::AF_INET as u64,
        u64::from(CLONE_NAMESPACES),
        !u64::from(CLONE_NAMESPACES),
        !u64::from(CLONE_NAMESPACES | CLONE_NEWTIME),
        u64::from(CLONE_NEWTIME),
        (libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD) as u64,
    ];
    for bit in 0..64 {
        arguments.push(1 << bit);
        arguments.push((1 << bit) | libc::AF_UNIX as u64);
    }
    arguments
}

#[test]
fn every_filter_does_what_seccompiler_s_did_for_every_call() {
    let native = Arch::native().expect("filters for this processor");
    let checked_calls = [
        libc::SYS_socket,
        libc::SYS_socketpair,
        libc::SYS_clone,
        libc::SYS_unshare,
    ]
    .map(|call| call as u32);
    let arguments = telling_arguments();
    let mut calls: Vec<u32> = (0..1100).collect();
    calls.extend((0..1100).map(|call| call | bpf::X32_SYSCALL_BIT));
    calls.extend([u32::MAX, bpf::X32_SYSCALL_BIT - 1, 0x8000_0000]);
    // i386's, the native one, none, and aarch64's or x86_64's.
    let other = if native.audit == bpf::AUDIT_ARCH_X86_64 {
        0xc000_00b7
    } else {
        bpf::AUDIT_ARCH_X86_64
    };
    let arches = [native.audit, 0x4000_0003, 0, other];
    for denied in every_variant() {
        let expected = reference(denied);
        let program = compile(denied).expect("builds");
        let mut compared = 0;
        for arch in arches {
            for &call in &calls {
                let tried: &[u64] = if checked_calls.contains(&call) {
                    &arguments
                } else {
                    &[0, u64::MAX]
                };
                for &argument in tried {
                    let data = call_data(arch, call, argument);
                    assert_eq!(
                        run(&program, &data).0,
                        run(&expected, &data).0,
                        "{denied:?}: arch {arch:#x}, call {call}, first argument {argument:#x}"
                    );
                    compared += 1;
                }
            }
        }
        assert!(compared > 4 * 2200, "{compared} calls compared");
    }
}

#[test]
fn a_filter_takes_a_few_steps_to_allow_a_call_whatever_it_denies() {
    let native = Arch::native().expect("filters for this processor");
    for denied in every_variant() {
        let program = compile(denied).expect("builds");
        let mut most = 0;
        for call in 0..512 {
            let (action, steps) = run(&program, &call_data(native.audit, call, 0));
            if action == libc::SECCOMP_RET_ALLOW {
                most = most.max(steps);
            }
        }
        // A search over at most 64 calls: the checks, 6 halvings, 3
        // comparisons and the return. The chain it replaced took up to 97.
        assert!(most <= 16, "{denied:?}: {most} steps to allow a call");
        assert!(
            program.len() <= 96,
            "{denied:?}: {} instructions",
            program.len()
        );
    }
}

#[test]
fn a_rule_list_too_long_for_one_jump_is_refused_not_cut() {
    let native = Arch::native().expect("filters for this processor");
    let rules: bpf::Rules = (0..600)
        .map(|call| (call, bpf::Rule::Fail(libc::EPERM as u32)))
        .collect();
    let error = bpf::assemble(native, &rules).expect_err("jumps over 255 instructions");
    assert!(error.contains("at most 255"), "{error}");
    let none = bpf::assemble(native, &bpf::Rules::new()).expect("an empty list builds");
    let (action, _) = run(&none, &call_data(native.audit, 0, 0));
    assert_eq!(action, libc::SECCOMP_RET_ALLOW);
}

/// The kernel takes every variant, and the child that took it is refused
/// `io_uring_setup` (every variant denies it) with EPERM; a filter the
/// kernel refused, or one that allowed it, fails the child.
#[test]
fn the_kernel_attaches_every_filter_and_it_denies() {
    assert!(probe::seccomp(), "this kernel has no seccomp filters");
    for denied in every_variant() {
        let program = compile(denied).expect("builds");
        let fprog = libc::sock_fprog {
            len: u16::try_from(program.len()).expect("fits"),
            filter: program.as_ptr().cast_mut(),
        };
        // SAFETY: the child makes raw system calls only, then _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            // SAFETY: raw calls on memory the child's copy still holds.
            unsafe {
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    libc::_exit(10);
                }
                let attach = libc::syscall(
                    libc::SYS_seccomp,
                    libc::SECCOMP_SET_MODE_FILTER,
                    0,
                    &fprog as *const libc::sock_fprog,
                );
                if attach != 0 {
                    libc::_exit(11);
                }
                let ring = libc::syscall(libc::SYS_io_uring_setup, 1, std::ptr::null_mut::<u8>());
                let refused = ring == -1 && *libc::__errno_location() == libc::EPERM;
                libc::_exit(if refused { 0 } else { 12 });
            }
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(waited, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "{denied:?}: the child's status {status:#x} (10 no_new_privs, 11 not attached, 12 io_uring allowed)"
        );
    }
}
