//! `capexec run` and `capexec shell`: start a command on an executor
//! (embedded, or the server given by `--connect`) and relay it as if it ran
//! here.

use std::ffi::{OsStr, OsString};
use std::io::IsTerminal;
use std::os::unix::ffi::OsStrExt;
use std::rc::Rc;
use std::time::Duration;

use capexec::capexec_capnp::executor;
use capexec::client::{self, Command, Connect, Session, Stdin};
use capexec::model::{Flow, PtySize, RefusalKind};
use capexec::rpc::MAX_GRACE;

use tokio::task::JoinHandle;

use crate::cli::relay::{self, Failure};
use crate::cli::signals::{Interrupted, Signals};
use crate::cli::{SessionArgs, forward, local_terminal, stdio, stdio_handoff, target};

/// `capexec run -- ARGV` (`capexec shell` when `argv` is empty).
pub fn main(args: SessionArgs, argv: Vec<OsString>) -> i32 {
    crate::cli::run_local(async move {
        match run(args, argv).await {
            Ok(code) => {
                tracing::debug!("exit status {code}: the command's");
                code
            }
            Err(failure) => {
                stdio::note(&failure.message);
                tracing::debug!("exit status {}", failure.code);
                failure.code
            }
        }
    })
}

async fn run(mut args: SessionArgs, argv: Vec<OsString>) -> Result<i32, Failure> {
    let resume = resume_grace(&args)?;
    // No program: the executor's shell, on a terminal if ours is one, as
    // `ssh HOST` does.
    let shell = argv.is_empty();
    if shell && std::io::stdin().is_terminal() && !args.no_stdin {
        args.tty = true;
    }
    let mut command = command_from(&args, argv.first().cloned().unwrap_or_default(), &argv)
        .map_err(Failure::capexec)?;
    // Caught before anything can hang (connecting, the login): from now
    // on a signal always ends capexec within about a second.
    let (process, mut interrupted) = Signals::catch(args.tty).watch();
    let target = until_interrupted(&mut interrupted, target::target(&args.connect))
        .await?
        .map_err(Failure::capexec)?;
    // The configuration file's environment for a named server, unless
    // --environment says otherwise.
    if args.environment.is_none() {
        args.environment = target.environment.clone();
    }
    let root = target.executor.clone();
    let established = target.established();
    let established_again = target.established();
    let answered = target.established();
    // Kept until the end: explaining a failure may ask the server.
    let target = Rc::new(target);
    let connection = Rc::clone(&target);
    let work = async {
        // A command on this machine uses our stdio itself where it can.
        let handoff = (!args.tty && !args.relay_stdio)
            .then(|| {
                let confined = command.spec().sandbox.is_some();
                stdio_handoff::ours(target.stdio_route.clone(), !args.no_stdin, confined)
            })
            .flatten();
        if handoff.is_some() && target.connection.is_some() {
            // Only to a server that has answered: descriptors sent to one
            // that never reads them would stay in its socket, holding our
            // pipes open (a `| wc` would wait for it) after capexec ends.
            until_interrupted(&mut interrupted, answered)
                .await?
                .map_err(Failure::capexec)?;
        }
        let executor = match &args.environment {
            Some(path) => client::environment(&target.executor, path),
            None => target.executor.clone(),
        };
        let timeout = args.timeout.is_some_and(|limit| !limit.is_zero());
        if shell || timeout {
            let info = until_interrupted(&mut interrupted, client::info(&executor))
                .await?
                .map_err(|error| Failure::capexec(error.to_string()))?;
            // An older server would ignore the limit without a word.
            if timeout && !info.features.iter().any(|f| f == "timeout") {
                return Err(Failure::capexec(
                    "the executor does not support --timeout (it is older than capexec's \
                     timeouts)",
                ));
            }
            if shell {
                command = shell_command(&command, info.default_shell.into_os_string());
            }
        }
        if let Some(handoff) = handoff {
            command.pass_stdio(handoff);
        }
        // Held until the command is done, then dropped: nothing keeps
        // listening after it.
        let (lost, _ignored) = tokio::sync::mpsc::unbounded_channel();
        let forwards = until_interrupted(
            &mut interrupted,
            forward::Forwarding::open(
                &executor,
                forward::direct_route(&target),
                &args.forward,
                &args.reverse_forward,
                stdio::note,
                lost,
            ),
        )
        .await?
        .map_err(Failure::capexec)?;
        let forwards = Rc::new(forwards);
        if tracing::enabled!(tracing::Level::DEBUG) {
            let program = command.spec().argv.first().cloned().unwrap_or_default();
            match &args.environment {
                Some(environment) => tracing::debug!(
                    "starting {} in the environment {environment}",
                    program.to_string_lossy()
                ),
                None => tracing::debug!("starting {}", program.to_string_lossy()),
            }
        }
        let session = Session::new(executor, Some(Box::new(target)));
        let resume = resume.map(|grace| (forwarded(reconnect(&args), &forwards), grace));
        let signals = relay::Watched {
            process,
            interrupted: &mut interrupted,
        };
        relay::relay(command.clone(), &args, session, resume, signals).await
    };
    // The login travels with the start: nothing waits for it, but a
    // server that never answers (or refuses) ends the run.
    let failed = async {
        match established.await {
            Ok(()) => std::future::pending().await,
            Err(message) => Failure::capexec(message),
        }
    };
    let outcome = tokio::select! {
        biased;
        failure = failed => Err(failure),
        outcome = work => outcome,
    };
    let Err(failure) = outcome else {
        return outcome;
    };
    if failure.start_error.is_none() && !failure.ours {
        // A run that failed because the connection did: the connection's
        // own reason (no answer, TLS expected, refused login) says more.
        let settled = tokio::time::timeout(SETTLE_WAIT, established_again).await;
        if let Ok(Err(message)) = settled {
            return Err(Failure::capexec(message));
        }
    }
    let failure = explained(failure, &args, &command, &root).await;
    drop(connection);
    Err(failure)
}

/// How long a failed run waits to learn whether its connection failed too.
const SETTLE_WAIT: Duration = Duration::from_secs(1);

/// `work`, unless a signal ends capexec first (before the command runs,
/// any signal does).
async fn until_interrupted<T>(
    interrupted: &mut JoinHandle<Interrupted>,
    work: impl std::future::Future<Output = T>,
) -> Result<T, Failure> {
    let interrupted = async {
        match interrupted.await {
            Ok(interrupted) => interrupted,
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        biased;
        interrupted = interrupted => Err(Failure::ours(
            interrupted.exit_code(),
            format!("{}: stopped before the command started", interrupted.why),
        )),
        done = work => Ok(done),
    }
}

/// `--resume`'s grace, checked.
fn resume_grace(args: &SessionArgs) -> Result<Option<Duration>, Failure> {
    match args.resume {
        None => Ok(None),
        Some(_) if args.connect.connect.is_none() => Err(Failure::capexec(
            "--resume needs --connect: an embedded command has no connection to lose",
        )),
        Some(Duration::ZERO) => Err(Failure::capexec(
            "--resume needs a time above 0 (such as 30, 90s or 5m)",
        )),
        Some(grace) if grace > MAX_GRACE => Err(Failure::capexec(format!(
            "--resume takes at most {}",
            capexec::model::show_duration(MAX_GRACE)
        ))),
        Some(grace) => Ok(Some(grace)),
    }
}

/// How `--resume` reconnects: the same address, token and environment,
/// once the server has answered (a silent one fails the attempt, and the
/// next one follows).
fn reconnect(args: &SessionArgs) -> Connect {
    let connect_args = args.connect.clone();
    let environment = args.environment.clone();
    Rc::new(move || {
        let connect_args = connect_args.clone();
        let environment = environment.clone();
        Box::pin(async move {
            let target = target::target(&connect_args)
                .await
                .map_err(client::Error::Connect)?;
            if let Some(connection) = &target.connection
                && let Err(error) = connection.established().await
            {
                return Err(if target::worth_retrying(&error) {
                    client::Error::Connect(error.to_string())
                } else {
                    client::Error::Rpc(capnp::Error::failed(error.to_string()))
                });
            }
            let executor = match &environment {
                Some(path) => client::environment(&target.executor, path),
                None => target.executor.clone(),
            };
            Ok(Session::new(executor, Some(Box::new(target))))
        })
    })
}

/// `connect`, then the forwards through the new connection: new
/// connections go through it, the open ones failed with the old one. A
/// forward that cannot be opened again ends the run.
fn forwarded(connect: Connect, forwards: &Rc<forward::Forwarding>) -> Connect {
    let forwards = Rc::clone(forwards);
    Rc::new(move || {
        let (connect, forwards) = (Rc::clone(&connect), Rc::clone(&forwards));
        Box::pin(async move {
            let session = connect().await?;
            forwards
                .reconnected(session.executor())
                .await
                .map_err(|why| client::Error::Rpc(capnp::Error::failed(why)))?;
            Ok(session)
        })
    })
}

/// Adds what only the command line knows to a failed start: which hop of
/// `--environment` lacks the name, and how to run a shell command line.
async fn explained(
    mut failure: Failure,
    args: &SessionArgs,
    command: &Command,
    root: &executor::Client,
) -> Failure {
    match failure.start_error {
        Some(RefusalKind::UnknownEnvironment) => {
            if let Some(path) = &args.environment
                && let Some(message) = missing_hop(root, path, args.connect.connect.is_some()).await
            {
                failure.message = message;
            }
        }
        Some(RefusalKind::ProgramNotFound) => {
            let argv = &command.spec().argv;
            if let Some(hint) = crate::cli::habits::server_as_program(&argv[0]) {
                failure.message = format!("{} {hint}", failure.message);
            } else if looks_like_a_shell_line(&argv[0]) {
                let line = argv
                    .iter()
                    .map(|arg| arg.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(" ");
                let quoted = if line.contains('\'') {
                    "...".to_string()
                } else {
                    line
                };
                failure.message = format!(
                    "{} (to run a shell command line, use: sh -c '{quoted}')",
                    failure.message
                );
            }
        }
        Some(RefusalKind::PermissionDenied) if command.spec().sandbox.is_some() => {
            if let Some(message) = with_read_only_flag(&failure.message) {
                failure.message = message;
            }
        }
        _ => {}
    }
    failure
}

/// A program (or its interpreter) outside the sandbox's readable roots:
/// the executor names the directory that admits it, the command line has
/// the flag ("(add its directory with --read-only DIR)").
fn with_read_only_flag(message: &str) -> Option<String> {
    let (before, directory) = message.rsplit_once(capexec::sandbox::AS_READ_ONLY_ROOT)?;
    let directory = directory.strip_suffix(')')?;
    let plain = directory
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/._-+,:@%".contains(&b));
    let directory = if plain {
        directory.to_string()
    } else {
        format!("'{}'", directory.replace('\'', "'\\''"))
    };
    Some(format!("{before} with --read-only {directory})"))
}

/// Whether a program name that was not found is really a line for a shell
/// (`capexec run -- "make && make install"`).
fn looks_like_a_shell_line(program: &OsStr) -> bool {
    program
        .as_bytes()
        .iter()
        .any(|b| b" \t;|&<>()$`\\\"'*?[]{}~#=".contains(b))
}

/// `--environment A/B/C` failed for an unknown name: which hop lacks which
/// name, and what that hop has.
async fn missing_hop(root: &executor::Client, path: &str, remote: bool) -> Option<String> {
    let names: Vec<&str> = path.split('/').collect();
    let mut executor = root.clone();
    for (depth, name) in names.iter().enumerate() {
        let offered = client::environments(&executor).await.ok()?;
        if !offered.iter().any(|environment| environment.name == *name) {
            let known: Vec<&str> = offered.iter().map(|e| e.name.as_str()).collect();
            let place = if depth > 0 {
                format!("environment {:?}", names[..depth].join("/"))
            } else if remote {
                "the server".to_string()
            } else {
                "the embedded executor".to_string()
            };
            return Some(format!(
                "--environment {path}: {place} has no environment named {name:?} (it has: {})",
                known.join(", ")
            ));
        }
        executor = client::environment(&executor, name);
    }
    None
}

/// The command with the executor's shell as its program.
fn shell_command(template: &Command, shell: OsString) -> Command {
    let mut command = template.clone();
    command.set_program(shell);
    command
}

fn command_from(
    args: &SessionArgs,
    program: OsString,
    argv: &[OsString],
) -> Result<Command, String> {
    let mut command = Command::new(program);
    if let Some(rest) = argv.get(1..) {
        command.args(rest);
    }
    if let Some(limit) = args.timeout.filter(|limit| !limit.is_zero()) {
        command.timeout(limit);
    }
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
                    OsString::from(OsStr::from_bytes(&bytes[..split])),
                    OsString::from(OsStr::from_bytes(&bytes[split + 1..])),
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
    if let Some(sandbox) = args.confinement.sandbox()? {
        command.sandbox(sandbox);
    }
    command.limits(args.confinement.limits());
    if args.tty {
        command.tty(terminal_size(args)?);
        // As ssh sends it with its terminal request.
        if let Some(term) = std::env::var_os("TERM").filter(|term| !term.is_empty()) {
            command.terminal_type(term);
        }
    } else if args.size.is_some() {
        return Err("--size needs -t".to_string());
    }
    command.stdin(if args.no_stdin {
        Stdin::Null
    } else {
        Stdin::Piped
    });
    command.flow(Flow::Lossless);
    Ok(command)
}

/// `--size`, else the local terminal's, else 24x80.
fn terminal_size(args: &SessionArgs) -> Result<PtySize, String> {
    match &args.size {
        Some(text) => local_terminal::parse_size(text),
        None => Ok(local_terminal::local_size().unwrap_or_default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_lines_are_told_from_program_names() {
        for line in [
            "echo hi; ls",
            "make && make install",
            "ls *.rs",
            "a|b",
            "x=1 y",
        ] {
            assert!(looks_like_a_shell_line(OsStr::new(line)), "{line}");
        }
        for name in ["ls", "/usr/bin/env", "./build.sh", "gcc-13", "a.out", "c++"] {
            assert!(!looks_like_a_shell_line(OsStr::new(name)), "{name}");
        }
    }
}
