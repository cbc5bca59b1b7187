//! What the descriptor limit (`RLIMIT_NOFILE`) lets a server hold.
//!
//! Every process costs the server descriptors for as long as it is held
//! (its pidfd and the parent's ends of its pipes, or of its terminal), and
//! a start needs a few more for a moment (the child's ends). A server that
//! allowed more processes than its limit carries would fail starts with
//! EMFILE, for every client at once, and could no longer accept
//! connections. So the budget is worked out at start: a reserve is kept
//! for connections (and for what the server itself has open), another
//! for what capabilities hold open (directories, port connections,
//! transfers, watches: counted by `rpc::holdings`), another for the
//! descriptors Unix peers send ([`RECEIVED_DESCRIPTORS`]), another for
//! the pipes of direct channels ([`PUMP_PIPE_DESCRIPTORS`]), another for
//! the members of terminal sessions whose leader has ended
//! ([`SESSION_MEMBER_DESCRIPTORS`]), and the rest is divided among
//! processes.

use std::io;

pub use crate::sys::close_in_background;

use crate::model::{Refusal, RefusalKind};

/// Held by one process while it is held: its pidfd and the parent's ends
/// of stdin, stdout and stderr (a terminal: its pidfd, the master and the
/// master's non-blocking duplicate). A terminal whose session still has
/// other members when its child exits holds one more per member, from a
/// share of their own ([`SESSION_MEMBER_DESCRIPTORS`]).
pub const DESCRIPTORS_PER_PROCESS: u64 = 4;

/// Held for a moment by a start on top of its process's own: the child's
/// ends of its pipes (starts happen one at a time).
pub const DESCRIPTORS_PER_START: u64 = 3;

/// Kept for the server's own use on top of what it has open when the
/// budget is worked out: its runtime, listeners, upstream links, logs.
const SERVER_OWN: u64 = 64;

/// Most descriptors the pipes direct channels' bytes move through hold
/// (`ports::MAX_PUMP_PIPES`, two each; `cli::capacity`'s tests check it).
pub const PUMP_PIPE_DESCRIPTORS: u64 = 2 * 256;

/// The share of the limit kept for those pipes: all where the limit
/// leaves 4,096 for the rest, less (said at start) on a small one.
fn pipes_reserve(limit: u64) -> u64 {
    PUMP_PIPE_DESCRIPTORS.min(limit.saturating_sub(4096) / 8)
}

/// Most pidfds of terminal sessions' members the server keeps once their
/// leader has ended (`engine::keep_session_members_at_most`).
pub const SESSION_MEMBER_DESCRIPTORS: u64 = 1024;

/// The share of the limit kept for them: all where the limit leaves
/// 4,096 for the rest, less (said at start) on a small one; members
/// beyond are killed when their leader is reaped.
fn members_reserve(limit: u64) -> u64 {
    SESSION_MEMBER_DESCRIPTORS.min(limit.saturating_sub(4096) / 8)
}

/// The share of the limit kept for connections: one eighth, at least 64.
fn connection_reserve(limit: u64) -> u64 {
    (limit / 8).max(64)
}

/// Most descriptors that Unix sockets' peers may have the server hold at
/// once: those kept for starts (`conn::handoff`'s 1,024 server-wide),
/// those waiting to close (1,024, and the 253 of the read that found
/// more), the 253 the next read may bring (`sys::SCM_MAX_FD`), what
/// each closing thread holds while it reads out an ended connection's
/// socket (the socket's copy and one descriptor, 256 threads), and the
/// owners in line for a thread while every thread sleeps (256, past
/// which the server takes no new connection: `sys::closes_backed_up`). A read
/// that finds the table full does not fail: the kernel closes what it
/// could not hand over on the reading thread, the serving thread, which
/// a pipe whose lock the peer holds puts to sleep. `cli::capacity`'s
/// tests check the sum.
pub const RECEIVED_DESCRIPTORS: u64 = 1024 + 1024 + 253 + 253 + 2 * 256 + 256;

/// The share of the limit kept for the descriptors Unix peers send: all
/// they may have the server hold ([`RECEIVED_DESCRIPTORS`]) where the
/// limit leaves 4,096 for the rest, less (said at start) on a small one.
fn received_reserve(limit: u64) -> u64 {
    RECEIVED_DESCRIPTORS.min(limit.saturating_sub(4096) / 4)
}

/// The share of the limit kept for what capabilities hold open
/// (directories, port connections and listeners, file transfers,
/// watches): one eighth, at least 64.
fn held_reserve(limit: u64) -> u64 {
    (limit / 8).max(64)
}

/// How a descriptor limit is divided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DescriptorBudget {
    /// The limit itself.
    pub limit: u64,
    /// Kept for connections, never used by processes.
    pub connections: u64,
    /// Kept for what capabilities hold open (counted by the RPC layer's
    /// holdings), never used by processes.
    pub held: u64,
    /// Kept for the descriptors Unix peers send, never used by
    /// processes: [`RECEIVED_DESCRIPTORS`] unless the limit is small.
    pub received: u64,
    /// Kept for the pipes of direct channels' pumps:
    /// [`PUMP_PIPE_DESCRIPTORS`] unless the limit is small.
    pub pipes: u64,
    /// Kept for the pidfds of terminal sessions' members once their
    /// leader has ended: [`SESSION_MEMBER_DESCRIPTORS`] unless the limit
    /// is small.
    pub members: u64,
    /// Processes the rest carries.
    pub processes: u64,
}

/// A share of the budget that a small limit keeps less of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShortShare {
    pub kept: u64,
    pub meant: u64,
    /// The smallest limit that keeps all of it.
    pub limit_for_all: u64,
    /// What it is for, and what less of it leaves open.
    pub what: &'static str,
}

impl std::fmt::Display for ShortShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the descriptor limit keeps {} of the {} descriptors {} (raise it with ulimit -n to \
             {} or more)",
            self.kept, self.meant, self.what, self.limit_for_all
        )
    }
}

impl DescriptorBudget {
    /// The budget of `limit` descriptors when `open` are in use already.
    pub fn new(limit: u64, open: u64) -> DescriptorBudget {
        let connections = connection_reserve(limit);
        let held = held_reserve(limit);
        let received = received_reserve(limit);
        let pipes = pipes_reserve(limit);
        let members = members_reserve(limit);
        let reserved = open
            + SERVER_OWN
            + pipes
            + members
            + connections
            + held
            + received
            + DESCRIPTORS_PER_START;
        DescriptorBudget {
            limit,
            connections,
            held,
            received,
            pipes,
            members,
            processes: limit.saturating_sub(reserved) / DESCRIPTORS_PER_PROCESS,
        }
    }

    /// The shares this limit keeps less of than they are meant to have
    /// (a small limit), to say at start.
    pub fn short_shares(&self) -> Vec<ShortShare> {
        [
            ShortShare {
                kept: self.received,
                meant: RECEIVED_DESCRIPTORS,
                limit_for_all: 4096 + 4 * RECEIVED_DESCRIPTORS,
                what: "clients of the Unix sockets may have the server hold (kept for their \
                       starts, or waiting to close): one that sends many can fill the table, \
                       and a read that finds it full closes what it brought on the serving \
                       thread, which a pipe whose lock the client holds puts to sleep",
            },
            ShortShare {
                kept: self.pipes,
                meant: PUMP_PIPE_DESCRIPTORS,
                limit_for_all: 4096 + 8 * PUMP_PIPE_DESCRIPTORS,
                what: "the pipes of direct channels may hold: many busy ones can fill the table",
            },
            ShortShare {
                kept: self.members,
                meant: SESSION_MEMBER_DESCRIPTORS,
                limit_for_all: 4096 + 8 * SESSION_MEMBER_DESCRIPTORS,
                what: "the server uses to follow a terminal session's processes once its \
                       leader has ended: beyond, they are killed with it",
            },
        ]
        .into_iter()
        .filter(|share| share.kept < share.meant)
        .collect()
    }

    /// The budget of this process's (soft) limit now, where `processes'`
    /// of the descriptors open are held by processes handed over (counted
    /// as theirs, not as the server's own).
    pub fn of_this_process(processes: u64) -> io::Result<DescriptorBudget> {
        let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map_err(io::Error::from)?;
        Ok(DescriptorBudget::new(
            soft,
            open_descriptors()?.saturating_sub(processes),
        ))
    }
}

/// Descriptors this process has open.
pub fn open_descriptors() -> io::Result<u64> {
    Ok(std::fs::read_dir("/proc/self/fd")?.count() as u64)
}

/// Whether `error` says the process (EMFILE) or the system (ENFILE) is out
/// of descriptors.
pub(crate) fn is_exhaustion(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// The start failure for running out of descriptors while `doing`.
pub(crate) fn exhausted(doing: &str, error: &io::Error) -> Refusal {
    let whose = if error.raw_os_error() == Some(libc::ENFILE) {
        "the system is out of file descriptors"
    } else {
        "the server is out of file descriptors"
    };
    Refusal::new(
        RefusalKind::LimitReached,
        format!("cannot {doing}: {whose}; release processes or connections and try again"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_is_divided_between_connections_and_processes() {
        let budget = DescriptorBudget::new(20_000, 16);
        assert_eq!(budget.connections, 2_500);
        assert_eq!(budget.held, 2_500);
        assert_eq!(budget.received, RECEIVED_DESCRIPTORS);
        assert_eq!(budget.pipes, PUMP_PIPE_DESCRIPTORS);
        assert_eq!(budget.members, SESSION_MEMBER_DESCRIPTORS);
        assert_eq!(budget.short_shares(), []);
        assert_eq!(
            budget.processes,
            (20_000
                - 16
                - 64
                - PUMP_PIPE_DESCRIPTORS
                - SESSION_MEMBER_DESCRIPTORS
                - 2_500
                - 2_500
                - RECEIVED_DESCRIPTORS
                - 3)
                / 4
        );
        let small = DescriptorBudget::new(512, 16);
        assert_eq!(small.connections, 64);
        assert_eq!(small.held, 64);
        assert_eq!((small.received, small.pipes, small.members), (0, 0, 0));
        assert_eq!(small.short_shares().len(), 3);
        assert_eq!(small.processes, (512 - 16 - 64 - 64 - 64 - 3) / 4);
        let middling = DescriptorBudget::new(8_192, 16);
        assert_eq!(middling.received, 1_024);
        // Each share says the least limit that keeps all of it.
        let [received, members] = middling.short_shares()[..] else {
            panic!("{:?}", middling.short_shares());
        };
        assert_eq!(received.limit_for_all, 17_384);
        assert_eq!(members.limit_for_all, 12_288);
        assert_eq!(DescriptorBudget::new(17_384, 16).short_shares(), []);
        assert_eq!(DescriptorBudget::new(17_383, 16).short_shares().len(), 1);
        // A limit that carries nothing says so rather than wrapping.
        assert_eq!(DescriptorBudget::new(200, 50).processes, 0);
    }

    #[test]
    fn running_out_is_a_limit_not_a_spawn_failure() {
        let error = io::Error::from_raw_os_error(libc::EMFILE);
        assert!(is_exhaustion(&error));
        let refusal = exhausted("start sleep", &error);
        assert_eq!(refusal.kind, RefusalKind::LimitReached);
        assert_eq!(
            refusal.message,
            "cannot start sleep: the server is out of file descriptors; release processes or \
             connections and try again"
        );
        assert!(!is_exhaustion(&io::Error::from_raw_os_error(libc::ENOENT)));
    }
}
