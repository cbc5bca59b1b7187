//! The process tools, on the capability thread: each runs on a
//! [`RemoteProcess`] of the session and answers with the byte-exact,
//! seq-numbered output of capexec's retained log.

use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::{Peer, RoleServer};
use tokio_util::sync::CancellationToken;

use super::local::{Entry, Local, PROCESSES_PER_SESSION, Session};
use super::output::{Keeper, exit_info};
use super::types::{
    ExecArgs, ExecResult, Gap, InputArgs, InputResult, ListResult, NoArgs, OutputArgs,
    OutputResult, ProcessArgs, ProcessEntry, SignalArgs, SignalResult, TerminateResult,
};
use crate::client::{Command, Stdin};
use crate::model::{EventBody, Exit, Flow, OutputStream, ReadOutcome, Signal, WriteStatus};

const DEFAULT_YIELD: Duration = Duration::from_secs(10);
const LONGEST_WAIT_MS: u64 = 300_000;
const DEFAULT_OUTPUT_BYTES: u64 = 64 << 10;
const MOST_OUTPUT_BYTES: u64 = 1 << 20;
/// Output asked of the executor per read while `exec` waits.
const READ_BUDGET: u32 = 256 << 10;
/// How often `exec` reports progress while it waits, when asked to.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// How long `exec` goes on reading after the exit event for the output
/// streams to reach end-of-file (the close event): what the command wrote
/// comes in the same answer, and the answer does not depend on which of the
/// two events a read happened to see first. A grandchild that keeps the
/// streams open is not waited for beyond this.
const CLOSE_GRACE: Duration = Duration::from_millis(200);
/// The longest `write_id`, in bytes: the executor remembers the last 4096
/// ids of each process whole, so without a bound an agent could make it
/// hold 4096 ids of up to 16 MiB each (a whole JSON-RPC line) per process.
const MOST_WRITE_ID_BYTES: usize = 256;
/// The argv `process_list` shows, in bytes.
const SHOWN_ARGV: usize = 1024;

/// What a call brings beyond its arguments.
pub struct Call {
    /// Cancelled when the client cancels the request.
    pub cancelled: CancellationToken,
    /// The client's progress token, and the way to it.
    pub progress: Option<(Peer<RoleServer>, ProgressToken)>,
}

type Answer<T> = Result<T, String>;

/// A failure of a capexec call, as the agent reads it: capexec's tag kept
/// (`[capexec:not-allowed]`...), so that the reason is never lost.
fn failed(tool: &str, doing: &str, error: &crate::client::Error) -> String {
    match error.refusal_kind() {
        Some(kind) => format!("capexec: {tool}: {doing}: {error} {}", kind.tag()),
        None => format!("capexec: {tool}: {doing}: {error}"),
    }
}

fn unknown(tool: &str, id: &str) -> String {
    format!(
        "capexec: {tool}: no process {id:?} in this session (process_list lists them; \
         at most {PROCESSES_PER_SESSION} are kept, the oldest ended ones forgotten first)"
    )
}

fn entry(session: &Session, tool: &str, id: &str) -> Answer<Rc<Entry>> {
    session.find(id).ok_or_else(|| unknown(tool, id))
}

fn millis(value: Option<u64>, default: Duration, most: u64) -> Duration {
    value.map_or(default, |ms| Duration::from_millis(ms.min(most)))
}

fn budget(value: Option<u64>, tool: &str, name: &str) -> Answer<usize> {
    let bytes = value.unwrap_or(DEFAULT_OUTPUT_BYTES);
    if bytes == 0 || bytes > MOST_OUTPUT_BYTES {
        return Err(format!(
            "capexec: {tool}: {name} must be 1 to {MOST_OUTPUT_BYTES}, not {bytes}"
        ));
    }
    Ok(bytes as usize)
}

/// The events of reads, sorted into what an answer says.
struct Collected {
    streams: [Keeper; 2],
    gaps: Vec<Gap>,
    exit: Option<Exit>,
    exit_event: bool,
    closed: bool,
    /// The last seq read: the next read's `afterSeq`.
    after: u64,
}

impl Collected {
    fn new(limit: usize, after: u64) -> Collected {
        Collected {
            streams: [Keeper::new(limit), Keeper::new(limit)],
            gaps: Vec::new(),
            exit: None,
            exit_event: false,
            closed: false,
            after,
        }
    }

    fn take(&mut self, outcome: ReadOutcome) {
        // Closed and nothing after `afterSeq`: the close was read before.
        if outcome.closed && outcome.events.is_empty() {
            self.closed = true;
        }
        for event in outcome.events {
            match event.body {
                EventBody::Output { stream, data } => {
                    let index = usize::from(stream == OutputStream::Stderr);
                    self.streams[index].push(&data);
                }
                EventBody::Gap { from_seq } => self.gaps.push(Gap {
                    from_seq,
                    to_seq: event.seq,
                }),
                EventBody::Exited(exit) => {
                    self.exit = Some(exit);
                    self.exit_event = true;
                }
                EventBody::Closed => self.closed = true,
            }
        }
        if self.exit.is_none() {
            self.exit = outcome.exit;
        }
        self.after = outcome.next_seq.saturating_sub(1).max(self.after);
    }
}

/// The working directory asked, as a path of the executor's machine:
/// relative ones are taken from the root.
fn working_directory(root: &Path, cwd: Option<&str>) -> std::path::PathBuf {
    match cwd {
        None | Some("") => root.to_path_buf(),
        Some(cwd) => root.join(cwd),
    }
}

pub async fn exec(
    local: Rc<Local>,
    session: Rc<Session>,
    args: ExecArgs,
    call: Call,
) -> Answer<ExecResult> {
    let argv = match (args.argv, args.command) {
        (Some(argv), None) if !argv.is_empty() => argv,
        (Some(_), None) => return Err("capexec: exec: argv must not be empty".into()),
        (None, Some(command)) => vec!["sh".into(), "-c".into(), command],
        (Some(_), Some(_)) => {
            return Err("capexec: exec: give argv or command, not both".into());
        }
        (None, None) => {
            return Err(
                "capexec: exec: give argv (a program and its arguments) or command \
                        (a line for sh -c)"
                    .into(),
            );
        }
    };
    let limit = budget(args.max_output_bytes, "exec", "max_output_bytes")?;
    let yield_after = millis(args.yield_ms, DEFAULT_YIELD, LONGEST_WAIT_MS);
    let keep_open = args.keep_stdin_open.unwrap_or(false);
    session.make_room().await?;

    let mut command = Command::new(&argv[0]);
    command
        .args(&argv[1..])
        .current_dir(working_directory(&local.root, args.cwd.as_deref()))
        // By default the retained log (the last MiB): a process nobody
        // reads (a server's logs) is never held back, and what was evicted
        // is said as a gap. Lossless on request, as the Codex bridge starts
        // every process.
        .flow(if args.lossless.unwrap_or(false) {
            Flow::Lossless
        } else {
            Flow::Retain
        })
        .stdin(if args.stdin.is_some() || keep_open {
            Stdin::Piped
        } else {
            Stdin::Null
        });
    // The login token capexec's client reads from the environment is not
    // the agent's: a command (confined or not) does not inherit it.
    command.env_remove("CAPEXEC_TOKEN");
    for (name, value) in args.env.iter().flatten() {
        command.env(name, value);
    }
    if let Some(timeout) = args.timeout_ms.filter(|&ms| ms > 0) {
        command.timeout(Duration::from_millis(timeout));
    }
    let (process, started) = command.spawn_pipelined(&local.executor);
    // Pipelined behind the start: stdin's bytes and its end.
    let written = args
        .stdin
        .as_ref()
        .map(|data| process.write_in_order(data.as_bytes(), "capexec-mcp-stdin"));
    let closing = (args.stdin.is_some() && !keep_open).then(|| process.close_stdin_in_order());
    // Listed from now on, so that whatever happens next (a cancellation
    // included) leaves it in process_list until the start fails.
    let entry = session.add(process.clone(), shown(&argv));
    let started = tokio::select! {
        started = started => started,
        () = call.cancelled.cancelled() => {
            // Pipelined behind the start: ends it once it has started.
            let _ = process.terminate().await;
            return Err(format!("capexec: exec: cancelled; process {} was terminated", entry.id));
        }
    };
    if let Err(error) = started {
        session.forget(&entry);
        return Err(failed(
            "exec",
            &format!("cannot start {:?}", argv[0]),
            &error,
        ));
    }
    if let Some(written) = written {
        written
            .outcome()
            .await
            .map_err(|error| failed("exec", "cannot write stdin", &error))?;
    }
    if let Some(closing) = closing {
        closing
            .outcome()
            .await
            .map_err(|error| failed("exec", "cannot close stdin", &error))?;
    }

    let began = Instant::now();
    let deadline = began + yield_after;
    let mut collected = Collected::new(limit, 0);
    let mut last_progress = began;
    let mut progress_count = 0u32;
    // Set at the exit event: reading goes on until the close event or this.
    let mut close_deadline: Option<Instant> = None;
    loop {
        let until = close_deadline.map_or(deadline, |close| close.min(deadline));
        let remaining = until.saturating_duration_since(Instant::now());
        let wait = match &call.progress {
            Some(_) => remaining.min(PROGRESS_EVERY),
            None => remaining,
        };
        let read = process.read(collected.after, READ_BUDGET, wait);
        let outcome = tokio::select! {
            outcome = read => outcome,
            () = call.cancelled.cancelled() => {
                // Not handed back yet: the call was the process's only
                // handle, so it ends with it.
                let _ = process.terminate().await;
                return Err(format!("capexec: exec: cancelled; process {} was terminated", entry.id));
            }
        };
        let outcome = outcome.map_err(|error| failed("exec", "cannot read the output", &error))?;
        collected.take(outcome);
        if collected.closed && collected.exit.is_some() {
            break;
        }
        if collected.exit_event && close_deadline.is_none() {
            close_deadline = Some(Instant::now() + CLOSE_GRACE);
        }
        if Instant::now() >= close_deadline.map_or(deadline, |close| close.min(deadline)) {
            break;
        }
        if let Some((peer, token)) = &call.progress
            && last_progress.elapsed() >= PROGRESS_EVERY
        {
            last_progress = Instant::now();
            progress_count += 1;
            let bytes = collected.streams[0].total() + collected.streams[1].total();
            let note = ProgressNotificationParam::new(token.clone(), f64::from(progress_count))
                .with_message(format!(
                    "{} running for {} s, {bytes} bytes of output",
                    entry.id,
                    began.elapsed().as_secs()
                ));
            // A client that stopped listening still gets its answer.
            let _ = peer.notify_progress(note).await;
        }
    }
    let finished = collected.exit_event || collected.closed;
    let exit = collected.exit.filter(|_| finished);
    if exit.is_some() {
        entry.exit.set(exit);
    } else {
        entry.handed_back.set(true);
    }
    let [stdout, stderr] = collected.streams;
    Ok(ExecResult {
        process_id: entry.id.clone(),
        running: exit.is_none(),
        exit: exit.as_ref().map(exit_info),
        stdout: stdout.finish(),
        stderr: stderr.finish(),
        gaps: collected.gaps,
        next_seq: collected.after,
    })
}

/// argv as `process_list` shows it: at most [`SHOWN_ARGV`] bytes.
fn shown(argv: &[String]) -> Vec<String> {
    let mut left = SHOWN_ARGV;
    let mut shown = Vec::new();
    for arg in argv {
        if arg.len() <= left {
            left -= arg.len();
            shown.push(arg.clone());
            continue;
        }
        let mut end = left;
        while !arg.is_char_boundary(end) {
            end -= 1;
        }
        shown.push(format!("{}...", &arg[..end]));
        break;
    }
    shown
}

pub async fn output(
    _local: Rc<Local>,
    session: Rc<Session>,
    args: OutputArgs,
    call: Call,
) -> Answer<OutputResult> {
    let entry = entry(&session, "process_output", &args.process_id)?;
    let max = budget(args.max_bytes, "process_output", "max_bytes")?;
    let wait = millis(args.wait_ms, Duration::ZERO, LONGEST_WAIT_MS);
    let after = args.after_seq.unwrap_or(0);
    let read = entry
        .process
        .read(after, u32::try_from(max).unwrap_or(u32::MAX), wait);
    let outcome = tokio::select! {
        outcome = read => outcome,
        () = call.cancelled.cancelled() => return Err("capexec: process_output: cancelled".into()),
    };
    let outcome = outcome.map_err(|error| failed("process_output", "cannot read", &error))?;
    // Whole chunks up to the budget: nothing is cut, the next read goes on.
    let mut collected = Collected::new(usize::MAX, after);
    collected.take(outcome);
    if collected.exit.is_some() {
        entry.exit.set(collected.exit);
    }
    let [stdout, stderr] = collected.streams;
    Ok(OutputResult {
        process_id: entry.id.clone(),
        running: collected.exit.is_none(),
        exit: collected.exit.as_ref().map(exit_info),
        closed: collected.closed,
        stdout: stdout.finish(),
        stderr: stderr.finish(),
        gaps: collected.gaps,
        next_seq: collected.after,
    })
}

pub async fn input(
    _local: Rc<Local>,
    session: Rc<Session>,
    args: InputArgs,
    _call: Call,
) -> Answer<InputResult> {
    let entry = entry(&session, "process_input", &args.process_id)?;
    let close = args.close.unwrap_or(false);
    if args.data.is_none() && !close {
        return Err("capexec: process_input: give data to write, close: true, or both".into());
    }
    match args.write_id.as_deref().map(str::len) {
        Some(0) => return Err("capexec: process_input: write_id must not be empty".into()),
        Some(bytes) if bytes > MOST_WRITE_ID_BYTES => {
            return Err(format!(
                "capexec: process_input: write_id is {bytes} bytes; at most \
                 {MOST_WRITE_ID_BYTES}"
            ));
        }
        _ => {}
    }
    let status = match &args.data {
        Some(data) => {
            let write_id = args
                .write_id
                .clone()
                .unwrap_or_else(|| entry.next_write_id());
            let status = entry
                .process
                .write(data.as_bytes(), &write_id)
                .await
                .map_err(|error| failed("process_input", "cannot write", &error))?;
            match status {
                WriteStatus::Accepted => "accepted",
                WriteStatus::StdinClosed => "stdin_closed",
                WriteStatus::Exited => "exited",
                WriteStatus::Starting => "starting",
            }
        }
        None => "none",
    };
    if close {
        entry
            .process
            .close_stdin()
            .await
            .map_err(|error| failed("process_input", "cannot close stdin", &error))?;
    }
    Ok(InputResult {
        status: status.into(),
        closed: close,
    })
}

pub async fn signal(
    _local: Rc<Local>,
    session: Rc<Session>,
    args: SignalArgs,
    _call: Call,
) -> Answer<SignalResult> {
    let entry = entry(&session, "process_signal", &args.process_id)?;
    let signal: Signal = args
        .signal
        .parse()
        .map_err(|error: String| format!("capexec: process_signal: {error}"))?;
    let exited = entry
        .refresh_exit()
        .await
        .map_err(|error| failed("process_signal", "cannot ask about the process", &error))?;
    if exited.is_none() {
        entry
            .process
            .signal(signal)
            .await
            .map_err(|error| failed("process_signal", "cannot signal", &error))?;
    }
    Ok(SignalResult {
        signal: signal.name().into(),
        running: exited.is_none(),
    })
}

pub async fn terminate(
    _local: Rc<Local>,
    session: Rc<Session>,
    args: ProcessArgs,
    _call: Call,
) -> Answer<TerminateResult> {
    let entry = entry(&session, "process_terminate", &args.process_id)?;
    let running = entry
        .process
        .terminate()
        .await
        .map_err(|error| failed("process_terminate", "cannot terminate", &error))?;
    Ok(TerminateResult { running })
}

pub async fn list(
    _local: Rc<Local>,
    session: Rc<Session>,
    _args: NoArgs,
    _call: Call,
) -> Answer<ListResult> {
    let entries: Vec<Rc<Entry>> = session.processes.borrow().iter().cloned().collect();
    let mut processes = Vec::with_capacity(entries.len());
    for entry in entries {
        let exit = entry
            .refresh_exit()
            .await
            .map_err(|error| failed("process_list", "cannot ask about a process", &error))?;
        processes.push(ProcessEntry {
            process_id: entry.id.clone(),
            argv: entry.argv.clone(),
            running: exit.is_none(),
            exit: exit.as_ref().map(exit_info),
            started_at_ms: entry.started_at_ms,
        });
    }
    Ok(ListResult {
        processes,
        limit: PROCESSES_PER_SESSION as u64,
    })
}
