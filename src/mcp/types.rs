//! The arguments and results of the process tools, as JSON: each type's
//! JSON Schema (schemars) is the tool's `inputSchema` or `outputSchema`,
//! and every structured result is one of these serialised, so a result
//! always matches its declared schema. docs/MCP.md lists the same fields.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `exec`'s arguments.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecArgs {
    /// The program and its arguments (the program is looked up on the
    /// executor's PATH). Give this or `command`, not both.
    pub argv: Option<Vec<String>>,
    /// A shell command line, run as `sh -c COMMAND`. Give this or `argv`.
    pub command: Option<String>,
    /// The working directory: relative to the root, or absolute (beneath
    /// the root when confined). Default: the root.
    pub cwd: Option<String>,
    /// Variables set in the process's environment, on top of the
    /// executor's.
    pub env: Option<BTreeMap<String, String>>,
    /// Bytes (UTF-8 text) written to the process's stdin, which is then
    /// closed unless `keep_stdin_open`. Without it stdin reads end-of-file
    /// at once, unless `keep_stdin_open`.
    pub stdin: Option<String>,
    /// Keep stdin open for `process_input` (default false).
    pub keep_stdin_open: Option<bool>,
    /// End the process (SIGTERM, then SIGKILL) this long after its start;
    /// its exit then says `timed_out`. Default (and 0): no timeout.
    pub timeout_ms: Option<u64>,
    /// How long to wait for the process to exit before answering with its
    /// `process_id` while it goes on running. Default 10000, at most
    /// 300000.
    pub yield_ms: Option<u64>,
    /// Never lose output: the process is held back (its writes wait) while
    /// 512 KiB of its output has not been read past by `process_output`,
    /// instead of the executor keeping only the last MiB and saying what
    /// it evicted as a gap. For output that matters whole; a process nobody
    /// reads then stops. Default false.
    pub lossless: Option<bool>,
    /// The most bytes of each stream (stdout, stderr) in the answer: the
    /// first half and the last half are kept, the middle is cut and its
    /// size said. Default 65536, at most 1048576.
    pub max_output_bytes: Option<u64>,
}

/// `process_output`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputArgs {
    pub process_id: String,
    /// Output after this sequence number: 0 for everything still retained,
    /// or the `next_seq` of the previous answer. Default 0.
    pub after_seq: Option<u64>,
    /// About the most bytes of output in the answer: whole chunks, the
    /// first one always (a chunk is at most 64 KiB), and none after the
    /// one that reaches it. Default 65536, at most 1048576.
    pub max_bytes: Option<u64>,
    /// How long to wait for output when there is none after `after_seq`
    /// yet. Default 0, at most 300000.
    pub wait_ms: Option<u64>,
}

/// `process_input`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InputArgs {
    pub process_id: String,
    /// Bytes (UTF-8 text) to write to stdin.
    pub data: Option<String>,
    /// Makes the write idempotent: a write repeated with the same id (of
    /// the process's last 4096) is applied once. At most 256 bytes.
    pub write_id: Option<String>,
    /// Close stdin (after `data`, if any): the process reads end-of-file.
    pub close: Option<bool>,
}

/// `process_signal`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalArgs {
    pub process_id: String,
    /// A signal name (`INT`, `SIGINT`, `int`) or number (`2`).
    pub signal: String,
}

/// The arguments of tools that name only a process.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessArgs {
    pub process_id: String,
}

/// `process_list`'s arguments: none.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

/// The bytes of one stream in an answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, JsonSchema)]
pub struct StreamText {
    /// The stream's bytes (its head, when `cut_bytes` > 0), as `encoding`
    /// says.
    pub text: String,
    /// The last bytes when the middle was cut, else empty.
    pub tail: String,
    /// `utf-8`: `text` and `tail` are the bytes themselves; `base64`: the
    /// bytes were not UTF-8 and are in base64.
    pub encoding: String,
    /// The bytes the stream had in this answer's range, cut ones included.
    pub bytes: u64,
    /// The bytes cut from the middle (between `text` and `tail`).
    pub cut_bytes: u64,
}

/// Output the executor no longer had: sequence numbers `from_seq` to
/// `to_seq` (inclusive) were evicted from its retained log (the last MiB)
/// before they were read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct Gap {
    pub from_seq: u64,
    pub to_seq: u64,
}

/// How a process ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct ExitInfo {
    /// The exit code, if it exited.
    pub code: Option<i32>,
    /// The signal's name (`KILL`, `TERM`...), if a signal killed it.
    pub signal: Option<String>,
    /// The signal's number on the executor's machine, if a signal killed
    /// it.
    pub signal_number: Option<i32>,
    pub core_dumped: bool,
    /// The code a shell would report: the code, or 128 + the signal.
    pub shell_code: i32,
    /// `timeout_ms` ended it.
    pub timed_out: bool,
    /// The kernel killed it for exceeding its memory limit.
    pub killed_by_memory_limit: bool,
}

/// `exec`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ExecResult {
    /// Names the process in the other `process_*` tools.
    pub process_id: String,
    /// Still running: the answer came after `yield_ms`; read the rest with
    /// `process_output`.
    pub running: bool,
    /// How it ended (null while running).
    pub exit: Option<ExitInfo>,
    pub stdout: StreamText,
    pub stderr: StreamText,
    /// Output lost before it was read (rare: a flood faster than reading).
    pub gaps: Vec<Gap>,
    /// Pass as `after_seq` to `process_output` for what comes next.
    pub next_seq: u64,
}

/// `process_output`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct OutputResult {
    pub process_id: String,
    /// The process has not exited.
    pub running: bool,
    /// How it ended (null while running).
    pub exit: Option<ExitInfo>,
    /// It exited and every output stream reached end-of-file: no output
    /// comes after `next_seq`.
    pub closed: bool,
    pub stdout: StreamText,
    pub stderr: StreamText,
    /// Output evicted before it was read, said exactly.
    pub gaps: Vec<Gap>,
    /// Pass as `after_seq` for what comes next.
    pub next_seq: u64,
}

/// `process_input`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct InputResult {
    /// `accepted` (the bytes are in stdin's pipe, or this `write_id` was
    /// accepted before), `stdin_closed`, `exited`, or `none` (no `data`).
    pub status: String,
    /// Stdin was closed by this call.
    pub closed: bool,
}

/// `process_signal`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SignalResult {
    /// The signal sent, by its name.
    pub signal: String,
    /// The process had not exited (once it has, signals are not sent).
    pub running: bool,
}

/// `process_terminate`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct TerminateResult {
    /// Something of the process's tree was running, and is being ended
    /// (SIGTERM, then SIGKILL after 2 s).
    pub running: bool,
}

/// One process of `process_list`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ProcessEntry {
    pub process_id: String,
    /// As started, cut to 1024 bytes in all.
    pub argv: Vec<String>,
    pub running: bool,
    pub exit: Option<ExitInfo>,
    /// Milliseconds since the Unix epoch, on this server's clock.
    pub started_at_ms: u64,
}

/// `process_list`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ListResult {
    pub processes: Vec<ProcessEntry>,
    /// The most processes a session holds: beyond it, the oldest ended
    /// process is forgotten, and a start while all are running is refused.
    pub limit: u64,
}
