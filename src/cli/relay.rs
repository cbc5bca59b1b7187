//! Relaying a started command: its output to ours, our stdin and signals to
//! it, its exit status as ours.

use crate::cli::EXIT_TIMED_OUT;
use capexec::client::{Command, Connect, Error, RecoveryNote, ResilientProcess, Session};
use capexec::model::{EventBody, OutputStream, Signal};

use crate::cli::forward;
use crate::cli::stdio::OutputWriter;
use crate::cli::terminal::RawMode;
use crate::cli::{EXIT_CAPEXEC_FAILURE, RunArgs};

/// Why capexec ends without the command's own status.
pub struct Failure {
    pub code: i32,
    pub message: String,
}

impl Failure {
    /// A failure of capexec itself: exit status 125.
    pub fn capexec(message: impl Into<String>) -> Failure {
        Failure {
            code: EXIT_CAPEXEC_FAILURE,
            message: message.into(),
        }
    }
}

/// Runs `command` on `session` and returns the exit status to report.
/// With `resume` (a way to reconnect, and the grace), the command survives
/// broken connections.
pub async fn relay(
    command: Command,
    args: &RunArgs,
    session: Session,
    resume: Option<(Connect, std::time::Duration)>,
) -> Result<i32, Failure> {
    // Keystrokes go to the remote terminal as they are typed, Ctrl-C
    // included, as with ssh. The guard restores our terminal on every way
    // out of here (return, error, panic), before anything is printed.
    let raw = (args.tty && !args.no_stdin)
        .then(RawMode::enter_stdin)
        .flatten();
    let result = run_to_close(command, args, session, resume, raw.is_some()).await;
    drop(raw);
    result
}

async fn run_to_close(
    command: Command,
    args: &RunArgs,
    session: Session,
    resume: Option<(Connect, std::time::Duration)>,
    raw: bool,
) -> Result<i32, Failure> {
    let signals = forward::Signals::catch();
    let began = std::time::Instant::now();
    // Start (made detachable when resuming) and subscribe in one round
    // trip: the calls are pipelined on the process the start will return.
    let (process, started) = ResilientProcess::spawn_on(&command, session, resume);
    let end = if raw { "\r\n" } else { "\n" };
    process.on_recovery(move |note| match note {
        RecoveryNote::Lost { cause, grace } => eprint!(
            "capexec: connection lost ({cause}); reconnecting for up to {}s{end}",
            grace.as_secs()
        ),
        RecoveryNote::Restored => eprint!("capexec: reconnected; the command carries on{end}"),
        RecoveryNote::Failed { .. } => {}
    });
    let mut events = process.events(0);
    let (started, subscribed) = tokio::join!(started, events.subscribe_now());
    let events = subscribed.map(|()| events);
    match started {
        Ok(()) => {}
        Err(Error::Refused(error)) => {
            return Err(Failure {
                code: error.kind.cli_exit_code(),
                message: error.message,
            });
        }
        Err(error) => return Err(Failure::capexec(error.to_string())),
    }
    let mut events =
        events.map_err(|error| Failure::capexec(format!("cannot follow the command: {error}")))?;

    let mut output = OutputWriter::new();
    if !args.no_stdin {
        tokio::task::spawn_local(forward::stdin(process.clone()));
    }
    let signals = tokio::task::spawn_local(signals.forward(process.clone()));
    let resizes = (args.tty && args.size.is_none())
        .then(|| tokio::task::spawn_local(forward::resizes(process.clone())));

    let mut status = None;
    let mut sent_sigpipe = false;
    let mut closed = false;
    let outcome = loop {
        if closed {
            break Ok(());
        }
        let batch = match events.next_batch().await {
            Some(Ok(batch)) => batch,
            Some(Err(error)) => break Err(format!("lost the command: {error}")),
            None => break Ok(()),
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
                EventBody::Exited(exit) => status = Some(exit),
                EventBody::Closed => closed = true,
                EventBody::Gap { from_seq } => {
                    output.write(std::mem::take(&mut pieces)).await;
                    output.flush().await;
                    let end = if raw { "\r\n" } else { "\n" };
                    eprint!(
                        "capexec: output lost: events {from_seq}..={} were evicted before they could be relayed{end}",
                        event.seq
                    );
                }
            }
        }
        output.write(pieces).await;
        // Like a local pipeline: when our reader goes away, the writer gets
        // SIGPIPE.
        if output.stdout_broken() && !sent_sigpipe && status.is_none() {
            // Sent again only if a broken connection may have eaten it.
            sent_sigpipe = match process.signal(Signal::Pipe).await {
                Err(error) => !error.is_transport_loss(),
                Ok(()) => true,
            };
        }
    };
    signals.abort();
    if let Some(resizes) = resizes {
        resizes.abort();
    }
    output.flush().await;
    outcome.map_err(Failure::capexec)?;
    // The exit event says whether a time limit ended the command and what
    // it used; no further round trip.
    let exit =
        status.ok_or_else(|| Failure::capexec("the command closed without an exit status"))?;
    let end = if raw { "\r\n" } else { "\n" };
    if args.usage {
        match exit.usage {
            Some(usage) => eprint!("capexec: {usage}{end}"),
            None => eprint!("capexec: the executor did not report resource usage{end}"),
        }
    }
    // Like timeout(1): 124 when a time limit ended the command, ours or
    // the executor's (a restricted server's --max-run-time).
    if exit.timed_out {
        // Ours, unless it ended sooner than ours could have.
        match args
            .timeout
            .filter(|&secs| began.elapsed().as_secs() >= secs)
        {
            Some(secs) => eprint!("capexec: the command timed out after {secs} s{end}"),
            None => eprint!("capexec: the command timed out (the executor's time limit){end}"),
        }
        return Ok(EXIT_TIMED_OUT);
    }
    Ok(exit.status.shell_code())
}
