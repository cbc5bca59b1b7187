//! Wall time of one whole process, stdin and stdout on /dev/null.

use std::error::Error;
use std::ffi::OsStr;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Runs `program args` to completion (with `env` set) and times it; a
/// failing command is an error.
pub fn time_process(
    program: &str,
    args: &[impl AsRef<OsStr>],
    env: Option<&(&'static str, String)>,
) -> Result<Duration, Box<dyn Error>> {
    let mut command = prepared(program, args, env, Stdio::null());
    let started = Instant::now();
    let status = command.status()?;
    let elapsed = started.elapsed();
    if !status.success() {
        let args: Vec<_> = args.iter().map(|a| a.as_ref().to_string_lossy()).collect();
        return Err(format!("{program} {args:?}: {status}").into());
    }
    Ok(elapsed)
}

/// `program args` with stdin on /dev/null, stdout as given, our stderr, and
/// `env` set.
pub fn prepared(
    program: &str,
    args: &[impl AsRef<OsStr>],
    env: Option<&(&'static str, String)>,
    stdout: Stdio,
) -> std::process::Command {
    let mut command = std::process::Command::new(program);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::inherit());
    if let Some((name, value)) = env {
        command.env(name, value);
    }
    command
}
