//! Relaying a started command: its output to ours, our stdin and signals to
//! it, its exit status as ours.

use std::cell::OnceCell;
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

use tokio::task::JoinHandle;

use capexec::client::{Command, Connect, Error, RecoveryNote, ResilientProcess, Session};
use capexec::model::{EventBody, Exit, OutputStream, RefusalKind, Signal, show_duration};

use crate::cli::local_terminal::RawMode;
use crate::cli::signals::Interrupted;
use crate::cli::stdio::{self, OutputWriter};
use crate::cli::{
    EXIT_CAPEXEC_FAILURE, EXIT_KILLED_BY_MEMORY_LIMIT, EXIT_TIMED_OUT, SessionArgs, input,
};

/// How long capexec waits for the server to terminate the command when
/// it ends without the command's status (an error of ours, a signal).
const TERMINATE_WAIT: Duration = Duration::from_secs(1);

/// Why capexec ends without the command's own status.
pub struct Failure {
    pub code: i32,
    pub message: String,
    /// A start refused by the executor: its kind, for the caller to add
    /// what it knows (the environment path, a shell hint).
    pub start_error: Option<RefusalKind>,
    /// capexec ended the run itself (a signal, `~.`, output it could not
    /// write): the connection's state explains nothing.
    pub ours: bool,
}

impl Failure {
    /// A failure of capexec itself: exit status 125.
    pub fn capexec(message: impl Into<String>) -> Failure {
        Failure {
            code: EXIT_CAPEXEC_FAILURE,
            message: message.into(),
            start_error: None,
            ours: false,
        }
    }

    /// A failure capexec decided on (see [`Failure::ours`]).
    pub fn ours(code: i32, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
            start_error: None,
            ours: true,
        }
    }
}

/// What ends a run early, on our side.
enum Ending {
    Signal(Interrupted),
    /// `~.` typed after a newline under `-t`.
    Escape,
}

/// Runs `command` on `session` and returns the exit status to report.
/// With `resume` (a way to reconnect, and the grace), the command survives
/// broken connections.
pub async fn relay(
    command: Command,
    args: &SessionArgs,
    session: Session,
    resume: Option<(Connect, Duration)>,
    signals: Watched<'_>,
) -> Result<i32, Failure> {
    // Keystrokes go to the remote terminal as they are typed, Ctrl-C
    // included, as with ssh. The guard restores our terminal on every way
    // out of here (return, error, panic), before anything is printed.
    let raw = (args.tty && !args.no_stdin)
        .then(RawMode::enter_stdin)
        .flatten();
    let result = run_to_close(command, args, session, resume, signals, raw.is_some()).await;
    drop(raw);
    result
}

/// The signal watcher of a run (see `signals::Signals::watch`): where to
/// tell it the process, and its verdict.
pub struct Watched<'a> {
    pub process: Rc<OnceCell<ResilientProcess>>,
    pub interrupted: &'a mut JoinHandle<Interrupted>,
}

async fn run_to_close(
    command: Command,
    args: &SessionArgs,
    session: Session,
    resume: Option<(Connect, Duration)>,
    signals: Watched<'_>,
    raw: bool,
) -> Result<i32, Failure> {
    let began = std::time::Instant::now();
    // Start (made detachable when resuming) and subscribe in one round
    // trip: the calls are pipelined on the process the start will return.
    let (process, started) = ResilientProcess::spawn_on(&command, session, resume);
    if command.stdio_handoff().is_some() {
        // The command may write to our stdout before its start is
        // answered here, so whoever sees that output and signals us must
        // reach it: signals are forwarded from now on, pipelined behind
        // the start (the server has answered already: nothing hangs).
        let _ = signals.process.set(process.clone());
    }
    process.on_recovery(|note| match note {
        RecoveryNote::Lost { cause, grace } => stdio::note(&format!(
            "connection lost: {cause}; reconnecting for up to {}",
            show_duration(*grace)
        )),
        RecoveryNote::Restored => stdio::note("reconnected; the command carries on"),
        RecoveryNote::Failed { .. } => {}
    });
    let interrupted = signals.interrupted;
    let (escape, escaped) = tokio::sync::oneshot::channel();
    let ending = async move {
        let escaped = async {
            match escaped.await {
                Ok(()) => Ending::Escape,
                // Stdin ended without `~.`.
                Err(_) => std::future::pending().await,
            }
        };
        tokio::select! {
            interrupted = interrupted => match interrupted {
                Ok(interrupted) => Ending::Signal(interrupted),
                Err(_) => std::future::pending().await,
            },
            ending = escaped => ending,
        }
    };
    let mut ending = std::pin::pin!(ending);

    let mut events = process.events(0);
    let startup = async {
        let (started, subscribed) = tokio::join!(started, events.subscribe_now());
        (started, subscribed)
    };
    // With handed stdio the command may be running and seen already.
    let handed = command.stdio_handoff().is_some();
    let (started, subscribed) = match until(&mut ending, startup).await {
        Ok(startup) => startup,
        Err(ending) => return Err(end_early(ending, &process, handed).await),
    };
    match started {
        // From now on signals are forwarded to the command.
        Ok(()) => {
            let _ = signals.process.set(process.clone());
        }
        Err(Error::Refused(error)) => {
            return Err(Failure {
                code: error.kind.cli_exit_code(),
                message: error.message,
                start_error: Some(error.kind),
                ours: false,
            });
        }
        Err(error) if handed && error.is_transport_loss() => {
            return Err(Failure::capexec(lost(&error)));
        }
        Err(error) => return Err(Failure::capexec(error.to_string())),
    }
    subscribed.map_err(|error| {
        // Handed stdio shows output before the subscription is answered:
        // a connection lost then has lost a command that ran.
        if handed && error.is_transport_loss() {
            Failure::capexec(lost(&error))
        } else {
            Failure::capexec(format!("cannot follow the command: {error}"))
        }
    })?;
    crate::cli::confinement::say_what_is_not_enforced(&command, &process).await;

    let mut output = OutputWriter::new();
    // A stdin the command was handed is read by the command alone.
    let stdin_handed = command
        .stdio_handoff()
        .is_some_and(|handoff| handoff.taken() && handoff.has_stdin());
    if !args.no_stdin && !stdin_handed {
        let escape = (args.tty && raw).then_some(escape);
        tokio::task::spawn_local(input::stdin(process.clone(), escape));
    }
    let resizes = (args.tty && args.size.is_none())
        .then(|| tokio::task::spawn_local(input::resizes(process.clone())));

    let mut status = None;
    let mut stdout_let_go = false;
    let mut closed = false;
    let outcome = loop {
        if closed {
            break Ok(());
        }
        let batch = match until(&mut ending, events.next_batch()).await {
            Err(ending) => return end_early_after(ending, &process, status, args, began).await,
            Ok(Some(Ok(batch))) => batch,
            Ok(Some(Err(error))) => break Err(error),
            Ok(None) => break Ok(()),
        };
        let mut pieces = Vec::with_capacity(batch.len());
        for event in batch {
            match event.body {
                EventBody::Output { stream, data } => pieces.push((
                    match stream {
                        OutputStream::Stdout | OutputStream::Pty => 1,
                        OutputStream::Stderr => 2,
                    },
                    data,
                )),
                EventBody::Exited(exit) => {
                    tracing::debug!("the command exited ({exit}); relaying until its output ends");
                    status = Some(exit);
                }
                EventBody::Closed => closed = true,
                EventBody::Gap { from_seq } => {
                    let written = async {
                        output.write(std::mem::take(&mut pieces)).await;
                        output.flush().await;
                    };
                    if let Err(ending) = until(&mut ending, written).await {
                        return end_early_after(ending, &process, status, args, began).await;
                    }
                    stdio::note(&format!(
                        "output lost: events {from_seq}..={} were evicted before they could be relayed",
                        event.seq
                    ));
                }
            }
        }
        if let Err(ending) = until(&mut ending, output.write(pieces)).await {
            return end_early_after(ending, &process, status, args, began).await;
        }
        if let Some(error) = output.failure() {
            return Err(cannot_write(&error, &process).await);
        }
        // Like a local pipeline: when our reader goes away, whoever writes
        // to the command's stdout next gets SIGPIPE, and its stderr goes on.
        if output.stdout_broken() && !stdout_let_go {
            // Done again only if a broken connection may have eaten it.
            stdout_let_go = reader_gone(&process, args.tty, status.is_some()).await;
        }
    };
    if let Some(resizes) = resizes {
        resizes.abort();
    }
    if let Err(ending) = until(&mut ending, output.flush()).await {
        return end_early_after(ending, &process, status, args, began).await;
    }
    if let Some(error) = output.failure() {
        return Err(cannot_write(&error, &process).await);
    }
    if let Err(error) = outcome {
        // The command's own exit arrived before the loss (what it left
        // running held its output open): that status stays the truth.
        let Some(exit) = status else {
            return Err(Failure::capexec(lost(&error)));
        };
        // A shutdown's line (see `reported`) says all there is.
        if !exit.server_shutdown {
            stdio::note(&format!(
                "the command had exited ({}) when its output was lost: {}",
                exit.status,
                lost_reason(&error)
            ));
        }
        return Ok(reported(&exit, args, began));
    }
    // The exit event says whether a time limit ended the command and what
    // it used; no further round trip.
    let exit =
        status.ok_or_else(|| Failure::capexec("the command closed without an exit status"))?;
    Ok(reported(&exit, args, began))
}

/// The exit status capexec reports for the command's `exit`, with the
/// notes that go with it (usage, a memory or time limit).
fn reported(exit: &Exit, args: &SessionArgs, began: std::time::Instant) -> i32 {
    if exit.server_shutdown {
        // The one line of an operator's stop: why, and how the command
        // took it (its status is ours, as with any other ending).
        stdio::note(&format!(
            "{} (its operator stopped it): it terminated the command ({})",
            capexec::net::SHUTDOWN_REASON,
            exit.status
        ));
    }
    if args.usage {
        match exit.usage {
            Some(usage) => stdio::note(&usage.to_string()),
            None => stdio::note("the executor did not report resource usage"),
        }
    }
    if exit.killed_by_memory_limit {
        stdio::note("the command was killed by its memory limit");
        return EXIT_KILLED_BY_MEMORY_LIMIT;
    }
    // Like timeout(1): 124 when a time limit ended the command, ours or
    // the executor's (a restricted server's --max-run-time).
    if exit.timed_out {
        // Ours, unless it ended sooner than ours could have.
        match args
            .timeout
            .filter(|limit| !limit.is_zero() && began.elapsed() >= *limit)
        {
            Some(limit) => stdio::note(&format!(
                "the command timed out after {}",
                show_duration(limit)
            )),
            None => stdio::note("the command timed out (the executor's time limit)"),
        }
        return EXIT_TIMED_OUT;
    }
    exit.status.shell_code()
}

/// Our stdout's reader went away: the server stops reading the command's
/// stdout and closes that pipe, so the next write to it gets SIGPIPE, as
/// in a local pipeline (`command | head`), while its stderr is still
/// relayed. A terminal carries both streams (and an older server cannot
/// close one): then the command gets SIGPIPE, unless it has exited.
/// Whether that was done (false: a broken connection may have eaten it).
async fn reader_gone(process: &ResilientProcess, tty: bool, exited: bool) -> bool {
    if !tty {
        match process.close_output(OutputStream::Stdout).await {
            Ok(()) => return true,
            Err(Error::Rpc(error)) if error.kind == capnp::ErrorKind::Unimplemented => {}
            Err(error) => return !error.is_transport_loss(),
        }
    }
    if exited {
        return true;
    }
    match process.signal(Signal::Pipe).await {
        Err(error) => !error.is_transport_loss(),
        Ok(()) => true,
    }
}

/// `work`, unless `ending` comes first.
async fn until<T>(
    ending: &mut std::pin::Pin<&mut impl Future<Output = Ending>>,
    work: impl Future<Output = T>,
) -> Result<T, Ending> {
    tokio::select! {
        biased;
        ending = ending.as_mut() => Err(ending),
        done = work => Ok(done),
    }
}

/// The one line for a run whose events stopped before the command closed.
fn lost(error: &Error) -> String {
    format!("lost the command: {}", lost_reason(error))
}

/// Why a run's events stopped before the command closed.
fn lost_reason(error: &Error) -> String {
    match error {
        Error::Recovery { failure, .. } => format!("could not reconnect: {failure}"),
        error if error.is_transport_loss() => error.loss_reason(),
        error => error.to_string(),
    }
}

/// Output could not be written: the command is ended, as it would be by
/// SIGPIPE in a local pipeline, and the run fails.
async fn cannot_write(error: &str, process: &ResilientProcess) -> Failure {
    let _ = tokio::time::timeout(TERMINATE_WAIT, process.current().terminate()).await;
    Failure::ours(
        EXIT_CAPEXEC_FAILURE,
        format!("cannot write the command's output: {error}"),
    )
}

/// Ends the run on our side once the command has started: as
/// [`end_early`] while it runs; once it has exited (what it started in
/// the background still holds its output), what it left running is
/// terminated and capexec exits as the command did, saying so.
async fn end_early_after(
    ending: Ending,
    process: &ResilientProcess,
    status: Option<Exit>,
    args: &SessionArgs,
    began: std::time::Instant,
) -> Result<i32, Failure> {
    let (Some(exit), Ending::Signal(interrupted)) = (status, &ending) else {
        return Err(end_early(ending, process, true).await);
    };
    let left = match terminate_briefly(process, interrupted.unreachable).await {
        Some(true) => "what it left running was terminated".to_string(),
        Some(false) => "nothing it started runs any more".to_string(),
        None => format!("what it left running {}", left_running(process)),
    };
    stdio::note(&format!(
        "{}: stopped waiting for the command's output; it had exited ({}); {left}",
        interrupted.why, exit.status
    ));
    Ok(reported(&exit, args, began))
}

/// Asks the server to terminate the command's tree, waiting at most
/// [`TERMINATE_WAIT`]: whether anything of it ran, or `None` if the server
/// did not say (or is known to be out of reach).
async fn terminate_briefly(process: &ResilientProcess, unreachable: bool) -> Option<bool> {
    if unreachable {
        return None;
    }
    tokio::time::timeout(TERMINATE_WAIT, process.current().terminate())
        .await
        .ok()
        .and_then(Result::ok)
}

/// What becomes of a command capexec could not have terminated.
fn left_running(process: &ResilientProcess) -> String {
    match process.grace() {
        Some(grace) => format!(
            "may run on without us for up to {} (--resume), then the server terminates it",
            show_duration(grace)
        ),
        None => "may run on until the server notices that the connection is gone, then it is \
                 terminated"
            .to_string(),
    }
}

/// Ends the run on our side: asks the server (briefly) to terminate the
/// command, and says what was left behind.
async fn end_early(ending: Ending, process: &ResilientProcess, started: bool) -> Failure {
    let (code, what, unreachable) = match ending {
        // The same line whether connecting or starting: nothing is known
        // to run yet, and nothing is waited for.
        Ending::Signal(interrupted) if !started => {
            return Failure::ours(
                interrupted.exit_code(),
                format!("{}: stopped before the command started", interrupted.why),
            );
        }
        Ending::Signal(interrupted) => (
            interrupted.exit_code(),
            format!("{}: stopped waiting for the command", interrupted.why),
            interrupted.unreachable,
        ),
        Ending::Escape => (
            EXIT_CAPEXEC_FAILURE,
            "~.: ended the session".to_string(),
            false,
        ),
    };
    let left = match terminate_briefly(process, unreachable).await {
        Some(true) => "the command was terminated".to_string(),
        Some(false) => "the command had already exited".to_string(),
        None => format!("the command {}", left_running(process)),
    };
    Failure::ours(code, format!("{what}; {left}"))
}
