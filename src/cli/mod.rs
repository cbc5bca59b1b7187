//! The `capexec` command line.

mod run;
mod stdio;

use std::ffi::OsString;

use clap::{Args, Parser, Subcommand};

/// Exit status for failures of capexec itself (bad arguments, bad cwd,
/// lost connection), as opposed to the child's own status.
pub const EXIT_CAPEXEC_FAILURE: i32 = 125;

#[derive(Parser, Debug)]
#[command(
    name = "capexec",
    version,
    about = "Run commands through Cap'n Proto process capabilities"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a command and relay its stdin, stdout, stderr, signals and exit
    /// status, like running it directly.
    Run(RunArgs),
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Working directory of the command.
    #[arg(long, value_name = "DIR")]
    cwd: Option<OsString>,
    /// Set an environment variable (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<OsString>,
    /// Remove an environment variable (repeatable).
    #[arg(long = "unset-env", value_name = "KEY")]
    unset_env: Vec<OsString>,
    /// Start from an empty environment instead of capexec's own.
    #[arg(long)]
    clear_env: bool,
    /// Give the command an immediate end-of-file on stdin.
    #[arg(short = 'n')]
    no_stdin: bool,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, value_name = "PROGRAM")]
    argv: Vec<OsString>,
}

/// Runs the command line and returns the process exit status.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let code = if error.use_stderr() {
                EXIT_CAPEXEC_FAILURE
            } else {
                0
            };
            let _ = error.print();
            return code;
        }
    };
    init_logging();
    match cli.command {
        Command::Run(args) => run::main(args),
    }
}

/// Logs go to stderr only, filtered by `RUST_LOG` (warnings by default), so
/// stdout stays the child's.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
