//! What is said about one process: how its output flows, its events, the
//! outcome of reads and writes, and snapshots of its state.

use std::time::Duration;

use bytes::Bytes;

use crate::model::Exit;

/// Which output stream a chunk came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum OutputStream {
    Stdout,
    Stderr,
    /// The merged output of a pseudo-terminal.
    Pty,
}

/// What the server does with output nobody has consumed yet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Flow {
    /// Always drain the child; evict the oldest retained output when full.
    #[default]
    Retain,
    /// Stop draining when the owner falls a window behind, so the child
    /// blocks in write(2) exactly as with a local pipe.
    Lossless,
}

/// Terminal size in character cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PtySize {
    pub rows: u16,
    pub cols: u16,
}

impl Default for PtySize {
    fn default() -> Self {
        PtySize { rows: 24, cols: 80 }
    }
}

/// Outcome of a stdin write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteStatus {
    /// The bytes are in the child's stdin, or this write id was accepted before.
    Accepted,
    /// Stdin is not open (never piped, closed by the client or by the child).
    StdinClosed,
    /// The process is not spawned yet (never produced by capexec executors).
    Starting,
    /// The process has exited.
    Exited,
}

/// One entry of a process's event sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The event's seq; for a gap, the last lost seq.
    pub seq: u64,
    pub body: EventBody,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventBody {
    Output {
        stream: OutputStream,
        data: Bytes,
    },
    Exited(Exit),
    Closed,
    /// Seqs `from_seq..=seq` were evicted before this consumer received them.
    Gap {
        from_seq: u64,
    },
}

/// What `read` returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadOutcome {
    pub events: Vec<Event>,
    pub next_seq: u64,
    pub exit: Option<Exit>,
    pub closed: bool,
}

/// A snapshot of a process and its retained log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessSnapshot {
    pub pid: u32,
    pub tty: bool,
    pub flow: Flow,
    pub stdin_open: bool,
    pub next_seq: u64,
    pub closed: bool,
    /// How it ended, once the exit event is logged.
    pub exit: Option<Exit>,
    pub retained_bytes: u64,
    pub retained_chunks: u32,
    pub peak_retained_bytes: u64,
    pub evicted_through_seq: u64,
    pub unconsumed_bytes: u64,
    pub uptime: Duration,
    /// Its timeout expired and it is being (or was) terminated for it: true
    /// before the exit is known too, unlike `exit.timed_out`.
    pub timed_out: bool,
    /// What confines the process and how its tree is followed.
    pub confinement: crate::model::Confinement,
    /// Processes of its tree are still running: the child, or what it
    /// left behind (as far as its tracking sees them).
    pub tree_running: bool,
}
