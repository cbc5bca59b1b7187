//! `capexec run`: start a command on an executor and relay it as if it ran
//! here: stdin in, stdout and stderr out byte for byte, signals forwarded,
//! the same exit status.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;

use futures::StreamExt;
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::stdio::{self, OutputWriter};
use crate::cli::{EXIT_CAPEXEC_FAILURE, RunArgs};
use capexec::capexec_capnp::executor;
use capexec::client::{Command, Error, RemoteProcess, Stdin};
use capexec::engine::{self, Engine};
use capexec::model::{EventBody, Flow, OutputStream, Signal, WriteStatus};
use capexec::net::{self, Address, Token};
use capexec::rpc;

/// Stdin writes in flight at once: enough to keep the pipe busy across a
/// round trip, few enough to bound memory.
const STDIN_WINDOW: usize = 8;

pub fn main(args: RunArgs) -> i32 {
    crate::cli::run_local(run_embedded(args))
}

async fn run_embedded(args: RunArgs) -> i32 {
    if let Some(address) = args.connect.clone() {
        return run_remote(args, &address).await;
    }
    if let Err(error) = engine::become_subreaper() {
        tracing::warn!(%error, "cannot become a subreaper; orphaned grandchildren will not be reaped here");
    }
    let executor = rpc::local_executor(Engine::default());
    relay(args, &executor).await
}

async fn run_remote(args: RunArgs, address: &str) -> i32 {
    let address: Address = match address.parse() {
        Ok(address) => address,
        Err(error) => {
            eprintln!("capexec: --connect {error}");
            return EXIT_CAPEXEC_FAILURE;
        }
    };
    let token = if address.is_tcp() {
        match login_token(&args) {
            Ok(token) => token,
            Err(message) => {
                eprintln!("capexec: {message}");
                return EXIT_CAPEXEC_FAILURE;
            }
        }
    } else {
        None
    };
    let connection = match net::connect(&address, token.as_ref()).await {
        Ok(connection) => connection,
        Err(error) => {
            eprintln!("capexec: {error}");
            return EXIT_CAPEXEC_FAILURE;
        }
    };
    relay(args, &connection.executor()).await
}

/// `--token-file`, else `$CAPEXEC_TOKEN`, else the default token file if it
/// exists.
fn login_token(args: &RunArgs) -> Result<Option<Token>, String> {
    if let Some(path) = &args.token_file {
        return Token::load(path).map(Some).map_err(|e| e.to_string());
    }
    if let Some(secret) = std::env::var_os("CAPEXEC_TOKEN") {
        let secret = secret.to_string_lossy().trim().to_string();
        if !secret.is_empty() {
            return Ok(Some(Token::new(secret)));
        }
    }
    match net::default_token_path() {
        Some(path) if path.exists() => Token::load(&path).map(Some).map_err(|e| e.to_string()),
        _ => Ok(None),
    }
}

fn command_from(args: &RunArgs) -> Result<Command, String> {
    let mut command = Command::new(&args.argv[0]);
    command.args(&args.argv[1..]);
    if args.clear_env {
        command.env_clear();
    }
    for name in &args.unset_env {
        command.env_remove(name);
    }
    for pair in &args.env {
        let bytes = pair.as_bytes();
        match bytes.iter().position(|&b| b == b'=') {
            Some(split) if split > 0 => {
                command.env(
                    OsString::from(std::ffi::OsStr::from_bytes(&bytes[..split])),
                    OsString::from(std::ffi::OsStr::from_bytes(&bytes[split + 1..])),
                );
            }
            _ => {
                return Err(format!(
                    "--env expects KEY=VALUE, got {:?}",
                    pair.to_string_lossy()
                ));
            }
        }
    }
    if let Some(cwd) = &args.cwd {
        command.current_dir(cwd);
    }
    command.stdin(if args.no_stdin {
        Stdin::Null
    } else {
        Stdin::Piped
    });
    command.flow(Flow::Lossless);
    Ok(command)
}

/// Runs the command on `executor` and returns the exit status to report.
pub async fn relay(args: RunArgs, executor: &executor::Client) -> i32 {
    let command = match command_from(&args) {
        Ok(command) => command,
        Err(message) => {
            eprintln!("capexec: {message}");
            return EXIT_CAPEXEC_FAILURE;
        }
    };
    // Start and subscribe in one round trip: the subscription is pipelined
    // on the process the start is about to return.
    let (process, started) = command.spawn_pipelined(executor);
    let (started, events) = tokio::join!(started, process.events(0));
    match started {
        Ok(()) => {}
        Err(Error::Start(error)) => {
            eprintln!("capexec: {}", error.message);
            return error.kind.cli_exit_code();
        }
        Err(error) => {
            eprintln!("capexec: {error}");
            return EXIT_CAPEXEC_FAILURE;
        }
    }
    let mut events = match events {
        Ok(events) => events,
        Err(error) => {
            eprintln!("capexec: cannot follow the command: {error}");
            return EXIT_CAPEXEC_FAILURE;
        }
    };
    let mut output = OutputWriter::new();
    if !args.no_stdin {
        tokio::task::spawn_local(forward_stdin(process.clone()));
    }
    let signals = tokio::task::spawn_local(forward_signals(process.clone()));

    let mut status = None;
    let mut sent_sigpipe = false;
    let mut closed = false;
    while !closed {
        let batch = match events.next_batch().await {
            Some(Ok(batch)) => batch,
            Some(Err(error)) => {
                output.flush().await;
                eprintln!("capexec: lost the command: {error}");
                return EXIT_CAPEXEC_FAILURE;
            }
            None => break,
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
                    eprintln!(
                        "capexec: output lost: events {from_seq}..={} were evicted before they could be relayed",
                        event.seq
                    );
                }
            }
        }
        output.write(pieces).await;
        // Like a local pipeline: when our reader goes away, the writer gets
        // SIGPIPE.
        if output.stdout_broken() && !sent_sigpipe && status.is_none() {
            sent_sigpipe = true;
            let _ = process.signal(Signal::Pipe).await;
        }
    }
    signals.abort();
    output.flush().await;
    match status {
        Some(status) => status.shell_code(),
        None => {
            eprintln!("capexec: the command closed without an exit status");
            EXIT_CAPEXEC_FAILURE
        }
    }
}

/// Relays our stdin to the child until end-of-file, then closes its stdin.
async fn forward_stdin(process: RemoteProcess) {
    let mut chunks = stdio::read_stdin();
    let mut in_flight = VecDeque::new();
    let mut count: u64 = 0;
    while let Some(Some(chunk)) = chunks.recv().await {
        if in_flight.len() >= STDIN_WINDOW
            && let Some(write) = in_flight.pop_front()
            && !accepted(write).await
        {
            return;
        }
        count += 1;
        in_flight.push_back(process.write_in_order(&chunk, &format!("stdin-{count}")));
    }
    for write in in_flight {
        if !accepted(write).await {
            return;
        }
    }
    let _ = process.close_stdin().await;
}

async fn accepted(write: capexec::client::PendingWrite) -> bool {
    matches!(write.outcome().await, Ok(WriteStatus::Accepted))
}

/// Forwards SIGINT, SIGTERM and SIGHUP to the child instead of dying of them.
async fn forward_signals(process: RemoteProcess) {
    let kinds = [
        (SignalKind::interrupt(), Signal::Int),
        (SignalKind::terminate(), Signal::Term),
        (SignalKind::hangup(), Signal::Hup),
    ];
    let mut streams = Vec::new();
    for (kind, name) in kinds {
        match signal(kind) {
            Ok(stream) => streams.push((stream, name)),
            Err(error) => tracing::warn!(%error, %name, "cannot forward signal"),
        }
    }
    let mut received = futures::stream::select_all(
        streams
            .into_iter()
            .map(|(stream, name)| tokio_stream_from(stream).map(move |()| name)),
    );
    while let Some(name) = received.next().await {
        if let Err(error) = process.signal(name).await {
            tracing::warn!(%error, %name, "cannot forward signal");
        }
    }
}

fn tokio_stream_from(
    mut stream: tokio::signal::unix::Signal,
) -> impl futures::Stream<Item = ()> + Unpin {
    Box::pin(futures::stream::poll_fn(move |cx| stream.poll_recv(cx)))
}
