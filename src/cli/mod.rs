//! The `capexec` command line.

mod capacity;
mod connect;
mod environments;
mod forward;
mod relay;
mod restrictions;
mod run;
mod serve;
mod stdio;
mod terminal;

use std::ffi::OsString;

use clap::{Args, Parser, Subcommand};

/// Exit status for failures of capexec itself (bad arguments, bad cwd,
/// lost connection), as opposed to the child's own status.
pub const EXIT_CAPEXEC_FAILURE: i32 = 125;
/// `capexec run --timeout` ended the command (as timeout(1) reports it).
pub const EXIT_TIMED_OUT: i32 = 124;

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
    /// Serve an executor on Unix sockets and TCP.
    Serve(ServeArgs),
    /// List the environments a server offers, with their states (`*`
    /// marks the default).
    Environments(ConnectArgs),
    /// Show what an executor reports about itself: version, features, OS,
    /// hostname, shell, working and temporary directories.
    Info(InfoArgs),
}

#[derive(Args, Clone, Debug)]
pub struct ConnectArgs {
    /// Talk to the executor served at ADDR (unix:PATH or tcp:HOST:PORT)
    /// instead of an embedded one.
    #[arg(long, value_name = "ADDR")]
    connect: Option<String>,
    /// Login token for tcp: addresses. Default: $CAPEXEC_TOKEN, then
    /// $XDG_CONFIG_HOME/capexec/token or ~/.config/capexec/token.
    #[arg(long, value_name = "FILE")]
    token_file: Option<std::path::PathBuf>,
    /// Connect over TLS and trust certificates signed by the CA in this
    /// PEM file (for the host name or IP address of --connect).
    #[arg(long, value_name = "FILE", conflicts_with = "tls_pin")]
    tls_ca: Option<std::path::PathBuf>,
    /// Connect over TLS and trust exactly the certificate with this SHA-256
    /// fingerprint (64 hex digits, colons allowed; `capexec serve` logs it).
    #[arg(long, value_name = "SHA256")]
    tls_pin: Option<String>,
    /// Send the login token to a non-loopback tcp: address without TLS
    /// (only over a network you trust, or a tunnel).
    #[arg(long)]
    insecure_plaintext: bool,
}

#[derive(Args, Debug)]
pub struct InfoArgs {
    #[command(flatten)]
    connect: ConnectArgs,
    /// Ask the executor of this environment (NAME, or NAME/NAME... through
    /// several hops).
    #[arg(long, value_name = "NAME")]
    environment: Option<String>,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Where to listen: unix:PATH or tcp:HOST:PORT (port 0 picks a free
    /// one); repeatable. Each resolved address is printed on stdout.
    #[arg(long = "listen", value_name = "ADDR", required = true)]
    listen: Vec<String>,
    /// Login token of the TCP listeners; created (mode 0600, 256 random
    /// bits) if the file does not exist. Default:
    /// $XDG_CONFIG_HOME/capexec/token or ~/.config/capexec/token.
    #[arg(long, value_name = "FILE")]
    token_file: Option<std::path::PathBuf>,
    /// Forward to the executor at ADDR as the environment NAME
    /// (repeatable). Connected on first use.
    #[arg(long = "upstream", value_name = "NAME=ADDR")]
    upstreams: Vec<String>,
    /// Login token for the tcp: upstream NAME (repeatable; required for
    /// each tcp: upstream, refused for unix: ones).
    #[arg(long = "upstream-token-file", value_name = "NAME=FILE")]
    upstream_token_files: Vec<String>,
    /// Reach the tcp: upstream NAME over TLS, trusting the CA in FILE
    /// (repeatable).
    #[arg(long = "upstream-tls-ca", value_name = "NAME=FILE")]
    upstream_tls_cas: Vec<String>,
    /// Reach the tcp: upstream NAME over TLS, trusting exactly the
    /// certificate with this SHA-256 fingerprint (repeatable).
    #[arg(long = "upstream-tls-pin", value_name = "NAME=SHA256")]
    upstream_tls_pins: Vec<String>,
    /// Serve TLS on every tcp: listener with this PEM certificate chain
    /// (the server's certificate first); needs --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// Calls one connection may have unanswered at once; a peer that sends
    /// more is disconnected.
    #[arg(long, value_name = "N", default_value_t = 8192,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    max_calls_per_connection: usize,
    /// Memory (MiB) the unanswered calls of one connection may hold; a peer
    /// that needs more is disconnected.
    #[arg(long, value_name = "MIB", default_value_t = 64,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=65_536))]
    max_call_memory_per_connection: usize,
    /// Connections (on tcp: listeners) that may be open without having
    /// logged in, TLS handshakes included; more are refused at once
    /// [default: 1024, at most half the descriptors kept for connections].
    #[arg(long, value_name = "N",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    max_pending_logins: Option<usize>,
    /// The same from one peer address (an IPv6 peer: its /64)
    /// [default: 256].
    #[arg(long, value_name = "N",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    max_pending_logins_per_address: Option<usize>,
    /// Most processes the server holds at once (running, or finished and
    /// not yet released); starts beyond fail with [capexec:limit]. A value
    /// the descriptor limit cannot carry is refused [default: 10000, or
    /// what the descriptor limit carries if that is less].
    #[arg(long, value_name = "N",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    max_processes: Option<usize>,
    /// Most processes the starts of one connection hold at once; at most
    /// seven eighths of --max-processes, so that one connection at its
    /// quota leaves room for others [default: 4096].
    #[arg(long, value_name = "N",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    max_processes_per_connection: Option<usize>,
    /// The environment plain starts use: "local" (the default) or an
    /// upstream's NAME.
    #[arg(long = "default", value_name = "NAME")]
    default_environment: Option<String>,
    /// How long a finished process whose owner was disconnected stays
    /// restorable, in seconds, 0 to 86400 (see `run --resume`).
    #[arg(long, value_name = "SECS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(0..=86_400))]
    retention: u64,
    #[command(flatten)]
    restrictions: restrictions::RestrictionArgs,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    connect: ConnectArgs,
    /// Run in this environment of the server (NAME, or NAME/NAME... through
    /// several hops) instead of its default one.
    #[arg(long, value_name = "NAME")]
    environment: Option<String>,
    /// Survive broken connections: the command keeps running for up to
    /// SECS without us, and we reconnect and carry on without losing or
    /// repeating a byte (needs --connect).
    #[arg(long, value_name = "SECS")]
    resume: Option<u64>,
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
    /// End the command (its process group: SIGTERM, then SIGKILL) if it has
    /// not finished after SECS seconds; capexec then exits 124.
    #[arg(long, value_name = "SECS",
          value_parser = clap::value_parser!(u64).range(1..=31_536_000))]
    timeout: Option<u64>,
    /// When the command has finished, print on stderr the CPU time and peak
    /// memory its process tree used (like time(1)).
    #[arg(long)]
    usage: bool,
    /// Give the command an immediate end-of-file on stdin.
    #[arg(short = 'n')]
    no_stdin: bool,
    /// Run the command on a pseudo-terminal sized like ours (or --size),
    /// with our terminal in raw mode while it runs.
    #[arg(short = 't')]
    tty: bool,
    /// Terminal size for -t, ROWSxCOLS (default: our terminal's, or 24x80).
    #[arg(long, value_name = "ROWSxCOLS")]
    size: Option<String>,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, value_name = "PROGRAM")]
    argv: Vec<OsString>,
}

/// Runs `main` on a current-thread runtime inside a `LocalSet` (capnp-rpc
/// is single-threaded), without waiting for blocking threads at the end
/// (the stdin reader may be stuck in read(2)).
fn run_local<F: std::future::Future<Output = i32>>(main: F) -> i32 {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("capexec: cannot start the runtime: {error}");
            return EXIT_CAPEXEC_FAILURE;
        }
    };
    let local = tokio::task::LocalSet::new();
    let code = runtime.block_on(local.run_until(main));
    runtime.shutdown_background();
    code
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
    match cli.command {
        Command::Run(args) => {
            init_logging(tracing::Level::WARN);
            run::main(args)
        }
        Command::Serve(args) => {
            init_logging(tracing::Level::INFO);
            serve::main(args)
        }
        Command::Environments(args) => {
            init_logging(tracing::Level::WARN);
            environments::environments_main(args)
        }
        Command::Info(args) => {
            init_logging(tracing::Level::WARN);
            environments::info_main(args.connect, args.environment)
        }
    }
}

/// Logs go to stderr only, filtered by `RUST_LOG` (`default` otherwise), so
/// stdout stays the child's (or the listener addresses).
fn init_logging(default: tracing::Level) {
    let builder = tracing_subscriber::fmt()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    // A plain level filter unless RUST_LOG asks for more: cheaper to set up,
    // which short commands notice.
    match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.is_empty() => builder
            .with_env_filter(tracing_subscriber::EnvFilter::new(directives))
            .init(),
        _ => builder.with_max_level(default).init(),
    }
}
