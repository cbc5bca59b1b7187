//! `capexec run`: start a command on an executor (embedded, or the server
//! given by `--connect`) and relay it as if it ran here.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

use crate::cli::relay::{self, Failure};
use crate::cli::{RunArgs, connect, terminal};
use std::rc::Rc;
use std::time::Duration;

use capexec::client::{self, Command, Connect, Session, Stdin};
use capexec::model::{Flow, PtySize};
use capexec::rpc::MAX_GRACE;

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
    let resume = match args.resume {
        None => None,
        Some(_) if args.connect.connect.is_none() => {
            return Err(Failure::capexec(
                "--resume needs --connect: an embedded command has no connection to lose",
            ));
        }
        Some(0) => return Err(Failure::capexec("--resume needs at least 1 second")),
        Some(secs) if secs > MAX_GRACE.as_secs() => {
            return Err(Failure::capexec(format!(
                "--resume takes at most {} seconds",
                MAX_GRACE.as_secs()
            )));
        }
        Some(secs) => Some(Duration::from_secs(secs)),
    };
    let target = connect::target(&args.connect)
        .await
        .map_err(Failure::capexec)?;
    let executor = match &args.environment {
        Some(path) => client::environment(&target.executor, path),
        None => target.executor.clone(),
    };
    if args.timeout.is_some() {
        // An older server would ignore the limit without a word.
        let info = client::info(&executor)
            .await
            .map_err(|error| Failure::capexec(error.to_string()))?;
        if !info.features.iter().any(|feature| feature == "timeout") {
            return Err(Failure::capexec(
                "the executor does not support --timeout (it is older than capexec's timeouts)",
            ));
        }
    }
    let session = Session::new(executor, Some(Box::new(target)));
    let resume = match resume {
        Some(grace) => Some((reconnect(&args).map_err(Failure::capexec)?, grace)),
        None => None,
    };
    relay::relay(command, &args, session, resume).await
}

/// How `--resume` reconnects: the same address, token and environment.
fn reconnect(args: &RunArgs) -> Result<Connect, String> {
    let connect_args = args.connect.clone();
    let environment = args.environment.clone();
    Ok(Rc::new(move || {
        let connect_args = connect_args.clone();
        let environment = environment.clone();
        Box::pin(async move {
            let target = connect::target(&connect_args)
                .await
                .map_err(client::Error::Connect)?;
            let executor = match &environment {
                Some(path) => client::environment(&target.executor, path),
                None => target.executor.clone(),
            };
            Ok(Session::new(executor, Some(Box::new(target))))
        })
    }))
}

fn command_from(args: &RunArgs) -> Result<Command, String> {
    let mut command = Command::new(&args.argv[0]);
    command.args(&args.argv[1..]);
    if let Some(secs) = args.timeout {
        command.timeout(std::time::Duration::from_secs(secs));
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
