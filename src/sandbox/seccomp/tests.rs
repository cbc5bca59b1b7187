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

/// Every constant either program compares a word with, and one each side
/// of it, with the extremes: a call number and an architecture are only
/// ever compared with constants, so these reach every outcome there is.
fn boundaries(programs: &[Vec<libc::sock_filter>]) -> Vec<u32> {
    let mut values: std::collections::BTreeSet<u32> = programs
        .iter()
        .flatten()
        .flat_map(|f| [f.k.wrapping_sub(1), f.k, f.k.wrapping_add(1)])
        .collect();
    values.extend([0, 1, u32::MAX, 0x7fff_ffff, 0x8000_0000]);
    values.into_iter().collect()
}

/// First arguments for the calls whose argument is read: every subset of
/// the bits any argument check reads (the namespace flags, CLONE_NEWTIME's
/// bit, AF_UNIX), alone and with every other low bit set, under high
/// halves that no check may read.
fn telling_arguments() -> Vec<u64> {
    let read = CLONE_NAMESPACES | CLONE_NEWTIME | libc::AF_UNIX as u32;
    let bits: Vec<u32> = (0..32).filter(|bit| read & (1 << bit) != 0).collect();
    let mut lows = Vec::new();
    for subset in 0u32..(1 << bits.len()) {
        let low = bits
            .iter()
            .enumerate()
            .filter(|(index, _)| subset & (1 << index) != 0)
            .fold(0, |low, (_, bit)| low | (1 << bit));
        lows.extend([low, low | !read]);
    }
    lows.extend(
        [
            libc::AF_INET,
            libc::AF_INET6,
            libc::AF_NETLINK,
            libc::AF_PACKET,
        ]
        .map(|f| f as u32),
    );
    let highs = [0u64, 1, 0x8000_0000, 0xffff_ffff];
    lows.iter()
        .flat_map(|&low| highs.map(|high| (high << 32) | u64::from(low)))
        .collect()
}

#[test]
fn every_filter_does_what_seccompiler_s_did_for_every_call() {
    let native = Arch::native().expect("filters for this processor");
    let variants: Vec<_> = every_variant()
        .map(|denied| (denied, compile(denied).expect("builds"), reference(denied)))
        .collect();
    let programs: Vec<_> = variants
        .iter()
        .flat_map(|(_, new, old)| [new.clone(), old.clone()])
        .collect();
    let values = boundaries(&programs);
    let mut calls: Vec<u32> = (0..1100).chain(values.iter().copied()).collect();
    calls.extend((0..1100).map(|call| call | bpf::X32_SYSCALL_BIT));
    let arguments = telling_arguments();
    let read_calls = [
        libc::SYS_socket,
        libc::SYS_socketpair,
        libc::SYS_clone,
        libc::SYS_unshare,
    ]
    .map(|call| call as u32);
    for (denied, program, expected) in &variants {
        let same = |arch: u32, call: u32, argument: u64| {
            let data = call_data(arch, call, argument);
            assert_eq!(
                run(program, &data).0,
                run(expected, &data).0,
                "{denied:?}: arch {arch:#x}, call {call:#x}, first argument {argument:#x}"
            );
        };
        for &arch in &values {
            for &call in &calls {
                same(arch, call, 0);
            }
        }
        // Every argument for the calls whose argument is read; a few for
        // the rest, which no check may read.
        for &call in &calls {
            let tried: &[u64] = if read_calls.contains(&call) {
                &arguments
            } else {
                &[u64::MAX, 0xffff_ffff, libc::AF_INET as u64]
            };
            for &argument in tried {
                same(native.audit, call, argument);
            }
        }
    }
}

#[test]
fn a_filter_takes_a_few_steps_to_allow_a_call_whatever_it_denies() {
    let native = Arch::native().expect("filters for this processor");
    let read_arguments = [
        (libc::SYS_socket, libc::AF_UNIX as u64),
        (libc::SYS_socketpair, libc::AF_UNIX as u64),
        (libc::SYS_clone, libc::SIGCHLD as u64),
        (libc::SYS_unshare, libc::CLONE_FILES as u64),
    ];
    for denied in every_variant() {
        let program = compile(denied).expect("builds");
        let plain = (0..1100).map(|call| (call, 0));
        let read = read_arguments.map(|(call, argument)| (call as u32, argument));
        let most = plain
            .chain(read)
            .map(|(call, argument)| run(&program, &call_data(native.audit, call, argument)))
            .filter(|(action, _)| *action == libc::SECCOMP_RET_ALLOW)
            .map(|(_, steps)| steps)
            .max()
            .unwrap_or(0);
        // A search over at most 64 calls: the architecture and x32 checks
        // (4), 5 halvings, 3 comparisons, an argument check (2) and the
        // return. The chain it replaced took up to 117.
        assert!(most <= 16, "{denied:?}: {most} steps to allow a call");
        assert!(
            program.len() <= 96,
            "{denied:?}: {} instructions",
            program.len()
        );
    }
}

#[test]
fn each_variant_has_its_own_program() {
    for index in 0..Denied::VARIANTS {
        let denied = Denied::of_index(index);
        assert_eq!(denied.index(), index);
        let cached = program(denied).expect("builds");
        assert_eq!(
            cached
                .iter()
                .map(|f| (f.code, f.jt, f.jf, f.k))
                .collect::<Vec<_>>(),
            compile(denied)
                .expect("builds")
                .iter()
                .map(|f| (f.code, f.jt, f.jf, f.k))
                .collect::<Vec<_>>(),
            "{denied:?}"
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

/// How a call made in a child under a filter ended.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Outcome {
    Done,
    Errno(i32),
    Killed(i32),
    /// The filter could not be attached (exit status).
    NotAttached(i32),
}

/// Makes the call `attempt` makes in a forked child, under `program`.
fn in_child(program: &[libc::sock_filter], attempt: fn() -> i64) -> Outcome {
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
                libc::_exit(250);
            }
            let attach = libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0,
                &fprog as *const libc::sock_fprog,
            );
            if attach != 0 {
                libc::_exit(251);
            }
            let made = attempt();
            let errno = *libc::__errno_location();
            libc::_exit(if made >= 0 { 0 } else { errno.clamp(1, 249) });
        }
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(waited, pid);
    if libc::WIFSIGNALED(status) {
        return Outcome::Killed(libc::WTERMSIG(status));
    }
    match libc::WEXITSTATUS(status) {
        0 => Outcome::Done,
        code @ 250..=251 => Outcome::NotAttached(code),
        errno => Outcome::Errno(errno),
    }
}

/// An escape tried in a child: its name, the call, how it ends with
/// everything denied, how with only io_uring denied.
type Escape = (&'static str, fn() -> i64, Outcome, Outcome);

/// A call with its first two arguments.
fn call(number: i64, first: u64, second: u64) -> i64 {
    // SAFETY: every call below passes no pointer the kernel writes through.
    unsafe { libc::syscall(number, first, second, 0u64, 0u64) }
}

/// A `clone` whose child exits at once, reaped.
fn clone_with(flags: u64) -> i64 {
    let child = call(libc::SYS_clone, flags, 0);
    if child == 0 {
        // SAFETY: the new child leaves at once.
        unsafe { libc::_exit(0) };
    }
    if child > 0 {
        // SAFETY: reaps the child made above.
        unsafe { libc::waitpid(child as i32, std::ptr::null_mut(), 0) };
    }
    child
}

/// Escapes tried under the real kernel: with everything denied each is
/// refused by the filter (EPERM where the kernel itself would have said
/// EINVAL proves the filter answered), what is allowed still works, and
/// with nothing but io_uring denied the same calls reach the kernel.
#[test]
fn the_kernel_attaches_every_filter_and_refuses_the_escapes() {
    assert!(probe::seccomp(), "this kernel has no seccomp filters");
    const NAMESPACE_AND_FS: u64 = (libc::CLONE_NEWUSER | libc::CLONE_FS | libc::SIGCHLD) as u64;
    let attempts: [Escape; 9] = [
        (
            "getpid",
            || call(libc::SYS_getpid, 0, 0),
            Outcome::Done,
            Outcome::Done,
        ),
        (
            "socket(AF_UNIX)",
            || {
                call(
                    libc::SYS_socket,
                    libc::AF_UNIX as u64,
                    libc::SOCK_STREAM as u64,
                )
            },
            Outcome::Done,
            Outcome::Done,
        ),
        (
            "socket(AF_INET)",
            || {
                call(
                    libc::SYS_socket,
                    libc::AF_INET as u64,
                    libc::SOCK_STREAM as u64,
                )
            },
            Outcome::Errno(libc::EPERM),
            Outcome::Done,
        ),
        (
            "socket(AF_INET | 1 << 32)",
            || {
                call(
                    libc::SYS_socket,
                    (1 << 32) | libc::AF_INET as u64,
                    libc::SOCK_DGRAM as u64,
                )
            },
            Outcome::Errno(libc::EPERM),
            Outcome::Done,
        ),
        (
            "fork",
            || clone_with(libc::SIGCHLD as u64),
            Outcome::Done,
            Outcome::Done,
        ),
        (
            "clone(CLONE_NEWUSER | CLONE_FS)",
            || clone_with(NAMESPACE_AND_FS),
            Outcome::Errno(libc::EPERM),
            Outcome::Errno(libc::EINVAL),
        ),
        // CLONE_PARENT is no flag of unshare's: the kernel says EINVAL.
        (
            "unshare(CLONE_NEWTIME | CLONE_PARENT)",
            || {
                call(
                    libc::SYS_unshare,
                    u64::from(CLONE_NEWTIME) | libc::CLONE_PARENT as u64,
                    0,
                )
            },
            Outcome::Errno(libc::EPERM),
            Outcome::Errno(libc::EINVAL),
        ),
        (
            "clone3(NULL, 0)",
            || call(libc::SYS_clone3, 0, 0),
            Outcome::Errno(libc::ENOSYS),
            Outcome::Errno(libc::EINVAL),
        ),
        (
            "io_uring_setup(1, NULL)",
            || call(libc::SYS_io_uring_setup, 1, 0),
            Outcome::Errno(libc::EPERM),
            Outcome::Errno(libc::EPERM),
        ),
    ];
    let everything = compile(Denied::of_index(Denied::VARIANTS - 1)).expect("builds");
    let io_uring_only = compile(Denied::of_index(0)).expect("builds");
    for (name, attempt, denied, allowed) in attempts {
        assert_eq!(
            in_child(&everything, attempt),
            denied,
            "{name}, everything denied"
        );
        assert_eq!(
            in_child(&io_uring_only, attempt),
            allowed,
            "{name}, io_uring denied"
        );
    }
    #[cfg(target_arch = "x86_64")]
    for program in [&everything, &io_uring_only] {
        let x32_getpid = || call(i64::from(39 | bpf::X32_SYSCALL_BIT), 0, 0);
        assert_eq!(in_child(program, x32_getpid), Outcome::Killed(libc::SIGSYS));
    }
    for denied in every_variant() {
        let program = compile(denied).expect("builds");
        let io_uring = || call(libc::SYS_io_uring_setup, 1, 0);
        assert_eq!(
            in_child(&program, io_uring),
            Outcome::Errno(libc::EPERM),
            "{denied:?}"
        );
    }
}
