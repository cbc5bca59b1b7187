//! `capexec run`: start a command on an executor (embedded, or the server
//! given by `--connect`) and relay it as if it ran here.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

use crate::cli::RunArgs;
use crate::cli::relay::{self, Failure};
use crate::cli::terminal;
use capexec::client::{Command, Stdin};
use capexec::engine::{self, Engine};
use capexec::model::{Flow, PtySize};
use capexec::net::{self, Address, Token};
use capexec::rpc;

pub fn main(args: RunArgs) -> i32 {
    crate::cli::run_local(async move {
        match run(args).await {
            Ok(code) => code,
            Err(failure) => {
                eprintln!("capexec: {}", failure.message);
                failure.code
            }
        }
    })
}

async fn run(args: RunArgs) -> Result<i32, Failure> {
    let command = command_from(&args).map_err(Failure::capexec)?;
    match &args.connect {
        None => {
            if let Err(error) = engine::become_subreaper() {
                tracing::warn!(%error, "cannot become a subreaper; orphaned grandchildren will not be reaped here");
            }
            let executor = rpc::local_executor(Engine::default());
            relay::relay(command, &args, &executor).await
        }
        Some(address) => {
            let address: Address = address
                .parse()
                .map_err(|error| Failure::capexec(format!("--connect {error}")))?;
            let token = if address.is_tcp() {
                login_token(&args).map_err(Failure::capexec)?
            } else {
                None
            };
            let connection = net::connect(&address, token.as_ref())
                .await
                .map_err(|error| Failure::capexec(error.to_string()))?;
            relay::relay(command, &args, &connection.executor()).await
        }
    }
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
    if args.tty {
        command.tty(terminal_size(args)?);
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
fn terminal_size(args: &RunArgs) -> Result<PtySize, String> {
    match &args.size {
        Some(text) => terminal::parse_size(text),
        None => Ok(terminal::local_size().unwrap_or_default()),
    }
}
