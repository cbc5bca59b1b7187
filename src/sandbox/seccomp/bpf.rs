//! A seccomp filter as classic BPF, laid out for the kernel's cost of
//! taking it: the calls with a rule are found by a search tree over their
//! numbers, not a chain of comparisons.
//!
//! Why not the chain a general filter compiler emits: attaching a filter
//! costs the kernel a conversion and a JIT compilation per instruction, and
//! then a run of the filter for every call number (with interrupts off, to
//! find the calls it always allows, which it then never runs again). A
//! chain of 344 instructions that took 101 steps to allow most calls (117
//! for an `unshare` it allowed) cost every sandboxed start 178 µs in
//! seccomp(2) on the 2-vCPU machine; the tree does the same in 70
//! instructions and 11 to 13 steps, 48 µs (docs/BENCHMARKS.md, "A
//! sandboxed start's seccomp filter").
//!
//! The program: the architecture check (another architecture's calls kill
//! the process), on x86_64 the x32 check (its numbers share x86_64's
//! architecture value, from bit 30 up: killed too), the search tree, each
//! argument check, then the returns. Every jump is forward, as classic BPF
//! requires, and within 255 instructions, or building fails.

use std::collections::BTreeMap;

/// What the filter does with one call; every other call is allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Rule {
    /// Fails with this errno.
    Fail(u32),
    /// Fails with EPERM unless its first argument, an `int`, is this
    /// (a socket's address family).
    OnlyFirstArgument(u32),
    /// Fails with EPERM when its first argument has any of these bits in
    /// its low 32 (`clone`'s and `unshare`'s flags).
    FailWithAnyFlag(u32),
}

/// A call's number and what is done with it.
pub(crate) type Rules = BTreeMap<u32, Rule>;

/// The architecture of a filter's calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Arch {
    /// `AUDIT_ARCH_*`, as `seccomp_data.arch` holds it.
    pub audit: u32,
    /// Whether calls numbered from bit 30 up (x86_64's x32 ABI) are killed.
    pub kill_x32: bool,
}

impl Arch {
    /// The architecture this binary's children run, if filters are built
    /// for it.
    pub(crate) fn native() -> Option<Arch> {
        // The filter reads an argument's low half at its little-endian
        // place; a big-endian aarch64 names its calls with another value.
        if cfg!(target_endian = "big") {
            return None;
        }
        let audit = match std::env::consts::ARCH {
            "x86_64" => AUDIT_ARCH_X86_64,
            "aarch64" => AUDIT_ARCH_AARCH64,
            "riscv64" => AUDIT_ARCH_RISCV64,
            _ => return None,
        };
        Some(Arch {
            audit,
            kill_x32: audit == AUDIT_ARCH_X86_64,
        })
    }
}

pub(crate) const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
const AUDIT_ARCH_AARCH64: u32 = 0xc000_00b7;
const AUDIT_ARCH_RISCV64: u32 = 0xc000_00f3;
pub(crate) const X32_SYSCALL_BIT: u32 = 0x4000_0000;

// Classic BPF opcodes (linux/bpf_common.h): class | operation | source,
// the constant (K) forms.
/// BPF_LD | BPF_W | BPF_ABS: a 32-bit word of `seccomp_data`.
pub(crate) const LD_W_ABS: u16 = 0x20;
/// BPF_JMP | BPF_JEQ | BPF_K.
pub(crate) const JEQ_K: u16 = 0x15;
/// BPF_JMP | BPF_JGE | BPF_K.
pub(crate) const JGE_K: u16 = 0x35;
/// BPF_JMP | BPF_JSET | BPF_K.
pub(crate) const JSET_K: u16 = 0x45;
/// BPF_RET | BPF_K.
pub(crate) const RET_K: u16 = 0x06;

// Offsets in `struct seccomp_data`: nr, arch, instruction_pointer, args[6].
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;
/// The low half of `args[0]` (little-endian: see [`Arch::native`]).
const OFFSET_FIRST_ARGUMENT_LOW: u32 = 16;

/// At most this many calls are compared one after another at a leaf of
/// the tree (each comparison is an instruction; a branch costs one too).
const LEAF_CALLS: usize = 3;
// A leaf of none would split a list of one into itself, for ever.
const _: () = assert!(LEAF_CALLS >= 1);

/// The program for `rules` on `arch`.
pub(crate) fn assemble(arch: Arch, rules: &Rules) -> Result<Vec<libc::sock_filter>, String> {
    let mut program = Assembler::default();
    let allow = program.label();
    let kill = program.label();
    // One return per errno, shared by every call failing with it.
    let mut returns: BTreeMap<u32, Label> = BTreeMap::new();
    let eperm = program.label();
    returns.insert(libc::EPERM as u32, eperm);
    let mut targets: BTreeMap<Rule, Label> = BTreeMap::new();
    for rule in rules.values() {
        if targets.contains_key(rule) {
            continue;
        }
        let target = match *rule {
            Rule::Fail(errno) => *returns.entry(errno).or_insert_with(|| program.label()),
            Rule::OnlyFirstArgument(_) | Rule::FailWithAnyFlag(_) => program.label(),
        };
        targets.insert(*rule, target);
    }

    program.load(OFFSET_ARCH);
    program.push(JEQ_K, arch.audit, Jump::Next, Jump::To(kill));
    program.load(OFFSET_NR);
    if arch.kill_x32 {
        program.push(JGE_K, X32_SYSCALL_BIT, Jump::To(kill), Jump::Next);
    }
    let calls: Vec<(u32, Label)> = rules
        .iter()
        .map(|(call, rule)| (*call, targets[rule]))
        .collect();
    program.search(&calls, allow);
    for (rule, target) in &targets {
        match *rule {
            Rule::Fail(_) => {}
            Rule::OnlyFirstArgument(value) => {
                program.place(*target);
                program.load(OFFSET_FIRST_ARGUMENT_LOW);
                program.push(JEQ_K, value, Jump::To(allow), Jump::To(eperm));
            }
            Rule::FailWithAnyFlag(flags) => {
                program.place(*target);
                program.load(OFFSET_FIRST_ARGUMENT_LOW);
                program.push(JSET_K, flags, Jump::To(eperm), Jump::To(allow));
            }
        }
    }
    program.place(allow);
    program.ret(libc::SECCOMP_RET_ALLOW);
    program.place(kill);
    program.ret(libc::SECCOMP_RET_KILL_PROCESS);
    for (errno, target) in returns {
        program.place(target);
        program.ret(libc::SECCOMP_RET_ERRNO | (errno & libc::SECCOMP_RET_DATA));
    }
    program.finish()
}

/// An instruction's place, known once it is placed.
type Label = usize;

#[derive(Clone, Copy)]
enum Jump {
    Next,
    To(Label),
}

struct Instruction {
    code: u16,
    jt: Jump,
    jf: Jump,
    k: u32,
}

#[derive(Default)]
struct Assembler {
    instructions: Vec<Instruction>,
    /// Where each label was placed.
    labels: Vec<Option<usize>>,
    /// A label placed twice: the program is refused.
    placed_twice: bool,
}

impl Assembler {
    fn label(&mut self) -> Label {
        self.labels.push(None);
        self.labels.len() - 1
    }

    fn place(&mut self, label: Label) {
        let at = self.instructions.len();
        self.placed_twice |= self.labels[label].replace(at).is_some();
    }

    fn load(&mut self, offset: u32) {
        self.push(LD_W_ABS, offset, Jump::Next, Jump::Next);
    }

    fn ret(&mut self, action: u32) {
        self.push(RET_K, action, Jump::Next, Jump::Next);
    }

    fn push(&mut self, code: u16, k: u32, jt: Jump, jf: Jump) {
        self.instructions.push(Instruction { code, jt, jf, k });
    }

    /// `calls` (sorted by number, with where each goes): halves compared by
    /// `>=` down to a few, each of those by `==`; a call matching none goes
    /// to `otherwise`. The call number is in the accumulator.
    fn search(&mut self, calls: &[(u32, Label)], otherwise: Label) {
        if calls.len() <= LEAF_CALLS {
            for (index, &(call, target)) in calls.iter().enumerate() {
                let last = index + 1 == calls.len();
                let miss = if last {
                    Jump::To(otherwise)
                } else {
                    Jump::Next
                };
                self.push(JEQ_K, call, Jump::To(target), miss);
            }
            if calls.is_empty() {
                self.push(JEQ_K, 0, Jump::To(otherwise), Jump::To(otherwise));
            }
            return;
        }
        let middle = calls.len() / 2;
        let upper = self.label();
        self.push(JGE_K, calls[middle].0, Jump::To(upper), Jump::Next);
        self.search(&calls[..middle], otherwise);
        self.place(upper);
        self.search(&calls[middle..], otherwise);
    }

    fn finish(self) -> Result<Vec<libc::sock_filter>, String> {
        if self.placed_twice {
            return Err("a seccomp label placed twice".into());
        }
        let labels = self.labels;
        let length = self.instructions.len();
        let offset = |from: usize, jump: Jump| -> Result<u8, String> {
            let Jump::To(label) = jump else {
                return Ok(0);
            };
            let to = labels[label]
                .filter(|&to| to < length)
                .ok_or("a seccomp jump to nowhere")?;
            let distance = to.checked_sub(from + 1).ok_or("a seccomp jump backwards")?;
            u8::try_from(distance)
                .map_err(|_| format!("a seccomp jump over {distance} instructions (at most 255)"))
        };
        let program = self
            .instructions
            .iter()
            .enumerate()
            .map(|(at, instruction)| {
                Ok(libc::sock_filter {
                    code: instruction.code,
                    jt: offset(at, instruction.jt)?,
                    jf: offset(at, instruction.jf)?,
                    k: instruction.k,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        // BPF_MAXINSNS: the kernel takes no longer program. (The jump to
        // the kill, from the top over the whole program, fails the 255
        // check first today; this stays true if that layout changes.)
        if program.len() > 4096 {
            return Err(format!(
                "a seccomp filter of {} instructions",
                program.len()
            ));
        }
        Ok(program)
    }
}
