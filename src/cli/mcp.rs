//! `capexec mcp`: an MCP server on stdio (or Streamable HTTP with
//! --listen) whose tools run on the embedded executor or the capexec
//! server --connect names, confined to --root by default (see
//! `capexec::mcp` and docs/MCP.md).

use std::path::PathBuf;

use capexec::client;
use capexec::mcp::{self, Options};
use capexec::model::Network;
use capexec::net::Token;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::cli::{EXIT_CAPEXEC_FAILURE, McpArgs, target};

pub fn main(args: McpArgs) -> i32 {
    crate::cli::run_local(async move {
        match serve(args).await {
            Ok(()) => 0,
            Err(message) => {
                eprintln!("capexec: mcp: {message}");
                EXIT_CAPEXEC_FAILURE
            }
        }
    })
}

/// The root as a path of the executor's machine: absolute as given, a
/// relative one (and the default, `.`) taken from capexec's working
/// directory, as `capexec run`'s sandbox paths are.
fn root(given: Option<PathBuf>) -> Result<PathBuf, String> {
    let given = given.unwrap_or_else(|| PathBuf::from("."));
    if given.is_absolute() {
        return Ok(given);
    }
    let here = std::env::current_dir()
        .map_err(|error| format!("--root: cannot tell the working directory: {error}"))?;
    let joined = here.join(&given);
    // `.` adds nothing but noise to every path the agent is told.
    Ok(if given == std::path::Path::new(".") {
        here
    } else {
        joined
    })
}

async fn serve(mut args: McpArgs) -> Result<(), String> {
    if args.unconfined && args.network.is_some() {
        return Err(
            "--network is the network of confined commands: --unconfined ones have the \
             executor's own"
                .into(),
        );
    }
    if args.listen.is_some() && args.http_token_file.is_none() {
        args.http_token_file = listen_token_file(&mut args.connect)?;
    }
    let listen = match &args.listen {
        Some(url) => Some(http_listen(url, args.http_token_file.as_deref())?),
        None if args.http_token_file.is_some() => {
            return Err("--http-token-file is the token of --listen http://HOST:PORT/PATH".into());
        }
        None if args.session_idle.is_some() => {
            return Err(
                "--session-idle is for --listen http://HOST:PORT/PATH: over stdio a session \
                 ends when stdin closes"
                    .into(),
            );
        }
        None => None,
    };
    let options = Options {
        root: root(args.root)?,
        confined: !args.unconfined,
        network: args.network.unwrap_or(Network::None),
        keep_processes: args.keep_processes,
    };
    let target = target::established_target(&args.connect).await?;
    let environment = args.environment.or_else(|| target.environment.clone());
    let executor = match &environment {
        Some(path) => client::environment(&target.executor, path),
        None => target.executor.clone(),
    };
    // The root must be a directory the executor can open: said now, not
    // at the agent's first call.
    client::Directory::open(&executor, &options.root)
        .info()
        .await
        .map_err(|error| {
            let tag = error
                .refusal_kind()
                .map(|kind| format!(" {}", kind.tag()))
                .unwrap_or_default();
            format!("--root {}: {error}{tag}", options.root.display())
        })?;
    let (factory, capabilities) = mcp::prepare(&executor, &options);
    let mcp_thread = match listen {
        None => mcp::serve_stdio(factory),
        Some((url, token)) => {
            // Caught from before the URL is printed, so that a signal sent
            // as soon as it is read ends the server properly.
            let (mut terminate, mut interrupt) = match (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) {
                (Ok(terminate), Ok(interrupt)) => (terminate, interrupt),
                (Err(error), _) | (_, Err(error)) => {
                    return Err(format!("cannot handle signals: {error}"));
                }
            };
            let listener = mcp::http::Listener::bind(url.address, &url.path)
                .map_err(|error| format!("--listen {}: {}", args_url(&url), io(&error)))?;
            {
                use std::io::Write;
                let mut stdout = std::io::stdout().lock();
                writeln!(stdout, "{}", listener.url())
                    .and_then(|()| stdout.flush())
                    .map_err(|error| format!("stdout: {}", io(&error)))?;
            }
            let shutdown = CancellationToken::new();
            let stop = shutdown.clone();
            tokio::task::spawn_local(async move {
                tokio::select! {
                    _ = terminate.recv() => tracing::info!("SIGTERM received"),
                    _ = interrupt.recv() => tracing::info!("SIGINT received"),
                }
                stop.cancel();
            });
            let idle = args.session_idle.unwrap_or(mcp::http::SESSION_IDLE);
            mcp::http::serve_http(factory, listener, token, idle, shutdown)
        }
    }
    .map_err(|error| format!("cannot start the MCP thread: {error}"))?;
    // A server whose executor is gone can serve nothing: capexec ends, so
    // that the agent sees its MCP server fail instead of waiting.
    let lost = async {
        match &target.connection {
            Some(connection) => {
                connection.closed().await;
                connection.abort_reason().await
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = capabilities.serve() => {}
        reason = lost => {
            return Err(match reason {
                Some(reason) => format!("lost the capexec server: {reason}"),
                None => "lost the capexec server: it closed the connection".to_string(),
            });
        }
    }
    // The MCP thread has dropped its last handle: it is ending.
    let ended = mcp_thread
        .join()
        .unwrap_or_else(|_| Err("the MCP thread panicked".into()));
    drop(target);
    ended
}

/// With `--listen` and the embedded executor, `--token-file FILE` is the
/// token HTTP clients present (there is no connection for it to log
/// into). With `--connect` it is the connection's login token, and the
/// clients' is `--http-token-file`: given only `--token-file`, which one
/// is meant is asked rather than guessed.
fn listen_token_file(
    connect: &mut super::ConnectArgs,
) -> Result<Option<std::path::PathBuf>, String> {
    let connects = connect.connect.as_deref().is_some_and(|to| !to.is_empty());
    match (&connect.token_file, connects) {
        (None, _) => Ok(None),
        (Some(_), false) => Ok(connect.token_file.take()),
        (Some(_), true) => Err(
            "with --connect, --token-file is the login token of the connection: name the token \
             of --listen's clients with --http-token-file FILE"
                .into(),
        ),
    }
}

/// `--listen http://HOST:PORT/PATH` and its token: required off loopback,
/// where anyone who can reach the port could otherwise run commands.
fn http_listen(
    url: &str,
    token_file: Option<&std::path::Path>,
) -> Result<(mcp::http::admission::ListenUrl, Option<Token>), String> {
    let parsed = mcp::http::admission::parse_listen_url(url)?;
    let token = token_file
        .map(|file| Token::load(file).map_err(|error| format!("--http-token-file: {error}")))
        .transpose()?;
    if token.is_none() && !parsed.address.ip().is_loopback() {
        return Err(format!(
            "--listen {url} is not a loopback address: it needs --token-file FILE (with \
             --connect: --http-token-file FILE), whose token clients must present \
             (Authorization: Bearer)"
        ));
    }
    Ok((parsed, token))
}

fn args_url(url: &mcp::http::admission::ListenUrl) -> String {
    mcp::http::admission::shown_url(url.address, &url.path)
}

fn io(error: &std::io::Error) -> String {
    capexec::model::io_message(error)
}
