//! The `capexec` command line.

mod admin;
mod argument_error;
mod capacity;
mod codex_bridge;
mod config;
mod confinement;
mod copy;
mod deferred;
mod duration;
mod forward;
mod forward_spec;
mod generate;
mod habits;
mod input;
mod inspect;
mod known_servers;
mod local_terminal;
mod logging;
mod mcp;
mod named;
mod relay;
mod restrictions;
mod run;
mod self_signed;
mod serve;
mod serve_users;
mod servers;
mod signals;
mod stdin_chunks;
pub(crate) mod stdio;
mod stdio_handoff;
mod target;
mod upgrade;

use std::ffi::OsString;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use deferred::Deferred;

/// Exit status for failures of capexec itself (bad arguments, bad cwd,
/// lost connection), as opposed to the child's own status.
pub const EXIT_CAPEXEC_FAILURE: i32 = 125;
/// `capexec run --timeout` ended the command (as timeout(1) reports it).
pub const EXIT_TIMED_OUT: i32 = 124;
/// The memory limit (`--memory`, or the server's) ended the command: as a
/// shell reports SIGKILL.
pub const EXIT_KILLED_BY_MEMORY_LIMIT: i32 = 137;
/// capexec's stdout's reader went away (`| head`) before an answer was
/// written: silently, as a shell reports death by SIGPIPE.
pub const EXIT_STDOUT_CLOSED: i32 = 141;

#[derive(Parser, Debug)]
#[command(
    name = "capexec",
    about = "Run commands through Cap'n Proto process capabilities",
    after_help = "Example: capexec run --connect build -- make -j8"
)]
struct Cli {
    /// Say what capexec itself does, on stderr (`capexec: debug: ...`):
    /// where --connect leads and how it is trusted, the connection, the
    /// login, the start and the exit. RUST_LOG, when set, decides instead.
    #[arg(short = 'v', long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a command and relay its stdin, stdout, stderr, signals and exit
    /// status, as if it ran here.
    ///
    /// It runs where the executor is: with --connect, on the server's
    /// machine, in the server's working directory and with the server's
    /// environment (not ours), as changed by -w, -e, --unset-env and
    /// --clear-env. What it starts in the background ends with it: when
    /// the command's capability is released (capexec ends, or its
    /// connection does), the server terminates the whole process tree,
    /// unlike ssh, which leaves nohup'd jobs running.
    ///
    /// SIGINT, SIGTERM and SIGHUP go to the command while the connection
    /// works; if the server does not answer within 1 s, or on a second
    /// signal, capexec ends on its own (exit 128+N, or the command's status
    /// if it had exited) and says what it left behind. Ctrl-Z stops the
    /// command too. When our stdout's reader goes away (`| head`), what
    /// writes to the command's stdout next gets SIGPIPE, as locally; any
    /// other write error on our stdout or stderr ends the run (exit 125).
    ///
    /// Exit status: the command's; 128+N if it died of signal N; 124 if
    /// --timeout ended it; 127 if the program was not found, 126 if it
    /// could not be executed; 125 for failures of capexec itself.
    #[command(after_help = "Example: capexec run --connect build -w /src -- make -j8")]
    Run(Deferred<RunArgs>),
    /// Start the executor's shell, as `ssh HOST` does.
    ///
    /// The shell is the server account's login shell, as ssh's; on a terminal if
    /// our stdin is one (reading commands from stdin otherwise); the same
    /// as `capexec run` without a program.
    #[command(after_help = "Example: capexec shell --connect build")]
    Shell(Deferred<SessionArgs>),
    /// Serve an executor on Unix sockets and TCP.
    ///
    /// Without --listen it listens on the default socket,
    /// $XDG_RUNTIME_DIR/capexec/capexec.sock (for root
    /// /run/capexec/capexec.sock), which `--connect local` reaches.
    #[command(after_help = "Example: capexec serve --listen tcp:0.0.0.0:7000 --tls-self-signed")]
    // Boxed: the server's flags are many, and the other subcommands'
    // values need not be as big.
    Serve(Deferred<Box<ServeArgs>>),
    /// List the environments a server offers, with their states (`*`
    /// marks the default).
    #[command(after_help = "Example: capexec environments --connect build")]
    Environments(Deferred<EnvironmentsArgs>),
    /// Show what an executor reports about itself: version, features, OS,
    /// hostname, shell, working and temporary directories.
    #[command(after_help = "Example: capexec info --connect build --environment gpu")]
    Info(Deferred<InfoArgs>),
    /// List the servers named in the configuration file
    /// ($XDG_CONFIG_HOME/capexec/config.toml, else
    /// ~/.config/capexec/config.toml), which `--connect NAME` reaches.
    ///
    /// Each entry the file gets wrong is a line on stderr (exit 125); the
    /// others are listed all the same.
    #[command(after_help = "Example: capexec servers")]
    Servers(Deferred<servers::ListArgs>),
    /// Print what a new client needs to reach this machine's server: its
    /// token and the lines for the client's configuration file. Run it on
    /// the server's machine, as the server's user.
    #[command(
        after_help = "Example: capexec client-config build --address tcp:build-box:7000 --tls-self-signed"
    )]
    ClientConfig(Deferred<servers::ClientConfigArgs>),
    /// List every process the server holds, whoever started it, as `ps`
    /// does: pid, owning connection (or "detached"), state, age, CPU,
    /// memory and command; over its admin socket (serve --admin).
    #[command(after_help = "Example: capexec ps --connect unix:/run/capexec/admin.sock")]
    Ps(Deferred<admin::PsArgs>),
    /// Terminate processes of the server by pid (SIGTERM to the group,
    /// then SIGKILL), whoever started them; over its admin socket.
    #[command(after_help = "Example: capexec kill --connect unix:/run/capexec/admin.sock 4242")]
    Kill(Deferred<admin::KillArgs>),
    /// Upgrade the server in place, ending nothing: it re-executes into the
    /// binary now at its path (as SIGUSR2 does), handing over its listeners
    /// and every process a client can restore; over its admin socket.
    #[command(after_help = "Example: capexec upgrade --connect unix:/run/capexec/admin.sock")]
    Upgrade(Deferred<admin::UpgradeArgs>),
    /// Print a shell completion script (bash, zsh or fish) on stdout.
    #[command(after_help = "Example: capexec completions bash > /etc/bash_completion.d/capexec")]
    Completions(Deferred<generate::CompletionArgs>),
    /// Write the man pages (capexec.1 and one per subcommand), or print
    /// capexec.1 on stdout.
    #[command(after_help = "Example: capexec man --dir /usr/local/share/man/man1")]
    Man(Deferred<generate::ManArgs>),
    /// Copy files between this machine and the executor's, like scp.
    ///
    /// Remote paths are written :PATH (relative ones from the server's
    /// working directory), local ones as they are; the sources are all on
    /// one side and DST on the other. With several sources, or when DST is
    /// an existing directory, each source is copied into it under its own
    /// name. `cp - :PATH` uploads stdin, `cp :PATH -` writes the file to
    /// stdout. Each remote file is replaced atomically (readers see the
    /// old content or the new). Symlinks are copied as symlinks. Many
    /// files travel at once on one connection.
    ///
    /// Exit status: 0 when everything was copied; 1 when some files
    /// failed (one line each on stderr); 125 for bad arguments or a
    /// connection that could not be made.
    #[command(after_help = "Example: capexec cp -r --connect build ./src :work/src")]
    Cp(Deferred<CpArgs>),
    // Not deferred: its text is its struct's (see `deferred`).
    Forward(ForwardArgs),
    /// Serve Codex's exec-server protocol from this executor (for Codex's
    /// environments.toml)
    ///
    /// Speaks the protocol of `codex exec-server --listen stdio` on stdin
    /// and stdout, one JSON message per line, and serves it from the
    /// embedded executor or from the capexec server --connect names: every
    /// command, file read, write and patch of a Codex agent runs there.
    /// Diagnostics go to stderr. It exits when stdin closes; the processes
    /// it started end with it. See docs/CODEX.md.
    #[command(after_help = "In $CODEX_HOME/environments.toml:\n\n  \
        [[environments]]\n  id = \"build-box\"\n  program = \"capexec\"\n  \
        args = [\"codex-bridge\", \"--connect\", \"build\"]")]
    CodexBridge(Deferred<CodexBridgeArgs>),
    /// Serve this executor's processes as MCP tools (for coding agents)
    ///
    /// A Model Context Protocol server on stdin and stdout (newline-delimited
    /// JSON-RPC) whose tools (exec and process_* for processes; read_file,
    /// write_file, edit_file, list_directory, search_files and more for the
    /// files beneath --root) run on the embedded executor or on the capexec
    /// server --connect names. By default every
    /// command is confined to --root (default: the working directory) on the
    /// executor's machine: it starts there, may write only beneath it, and
    /// has no network (--network all gives it). --unconfined gives the plain
    /// executor, and every tool's description says so. Diagnostics go to
    /// stderr. It exits when stdin closes, ending the processes the session
    /// started (unless --keep-processes); 125 if the server is lost. See
    /// docs/MCP.md.
    #[command(after_help = "For Claude Code:\n\n  \
        claude mcp add capexec -- capexec mcp --root /path/to/project")]
    Mcp(Deferred<McpArgs>),
}

#[derive(Args, Debug)]
pub struct McpArgs {
    #[command(flatten)]
    connect: ConnectArgs,
    /// Serve through the executor of this environment (NAME, or
    /// NAME/NAME... through several hops).
    #[arg(long, value_name = "NAME")]
    environment: Option<String>,
    /// The directory of the executor's machine the agent works in (default:
    /// the working directory; a relative one is taken from it): commands
    /// start in it and, unless --unconfined, may write only beneath it.
    #[arg(long, value_name = "DIR")]
    root: Option<std::path::PathBuf>,
    /// Commands run with the executor's full access (no sandbox, any
    /// working directory, the network); every tool's description says so.
    #[arg(long)]
    unconfined: bool,
    /// The network of confined commands: none (Unix sockets only, the
    /// default) or all.
    #[arg(long, value_name = "none|all", value_parser = parse_network)]
    network: Option<capexec::model::Network>,
    /// The processes a session started go on running when it ends
    /// (detached on the executor for a day) instead of ending with it.
    #[arg(long = "keep-processes")]
    keep_processes: bool,
    /// Serve MCP over Streamable HTTP at http://HOST:PORT/PATH instead of
    /// stdio (port 0: any free one); the URL it listens on is printed as
    /// stdout's one line, and it serves until SIGTERM or SIGINT.
    #[arg(long, value_name = "http://HOST:PORT/PATH")]
    listen: Option<String>,
    /// With --listen: clients must present the token in FILE
    /// (`Authorization: Bearer TOKEN`); required when HOST is not loopback.
    /// Without --connect, --token-file FILE says the same.
    #[arg(long = "http-token-file", value_name = "FILE")]
    http_token_file: Option<std::path::PathBuf>,
    /// With --listen: an MCP session with no message either way for SECS
    /// (or 90s, 5m...) ends, and its processes with it (unless
    /// --keep-processes); a call waiting without progress notifications
    /// sends nothing, so keep it above the longest wait (300 s). Default:
    /// 30m.
    #[arg(long = "session-idle", value_name = "SECS", value_parser = duration::parse_positive)]
    session_idle: Option<std::time::Duration>,
}

fn parse_network(text: &str) -> Result<capexec::model::Network, String> {
    text.parse()
}

#[derive(Args, Debug)]
pub struct CodexBridgeArgs {
    #[command(flatten)]
    connect: ConnectArgs,
    /// Serve through the executor of this environment (NAME, or
    /// NAME/NAME... through several hops).
    #[arg(long, value_name = "NAME")]
    environment: Option<String>,
    /// Serve only this directory of the executor's machine: files beneath
    /// it, commands through its confined executor (they may write only
    /// beneath it), and it is the working directory Codex is told.
    #[arg(long, value_name = "DIR")]
    root: Option<std::path::PathBuf>,
    /// Serve Codex's `url` environments over a websocket at
    /// ws://HOST:PORT instead of stdio (port 0: any free one); the URL it
    /// listens on is printed as stdout's one line.
    #[arg(long, value_name = "ws://HOST:PORT")]
    listen: Option<String>,
    /// The token a websocket client must present (`Authorization: Bearer`,
    /// Codex's `auth_bearer_token`); required with --listen.
    #[arg(long, value_name = "FILE")]
    ws_token_file: Option<std::path::PathBuf>,
    /// With --listen: how long the session of a lost connection is kept
    /// for its client to resume (initialize with resumeSessionId), its
    /// processes running and their output held back meanwhile, in SECS (or
    /// 90s, 5m...); 0 ends it with its connection. Default: 30, as Codex's
    /// own exec-server.
    #[arg(long, value_name = "SECS", value_parser = duration::parse)]
    keep_session: Option<std::time::Duration>,
}

#[derive(Args, Debug)]
pub struct CpArgs {
    #[command(flatten)]
    connect: ConnectArgs,
    /// Copy through the executor of this environment (NAME, or
    /// NAME/NAME... through several hops).
    #[arg(long, value_name = "NAME")]
    environment: Option<String>,
    /// Copy directories and everything in them.
    #[arg(short = 'r', long)]
    recursive: bool,
    /// Keep permission bits (setuid and sticky too) and modification
    /// times.
    #[arg(short = 'p', long)]
    preserve: bool,
    /// SRC... DST: sources, then the destination.
    #[arg(value_name = "SRC... DST")]
    paths: Vec<OsString>,
}

#[derive(Args, Clone, Debug)]
pub struct ConnectArgs {
    /// Talk to the executor served at ADDR instead of an embedded one:
    /// unix:PATH or tcp:HOST:PORT (also written /PATH and HOST:PORT), the
    /// NAME of a server in the configuration file (see `capexec
    /// servers`), or `local` for the default socket of `capexec serve`.
    /// CAPEXEC_CONNECT gives it when the flag is not given (empty: as if
    /// unset).
    #[arg(long, value_name = "ADDR|NAME", env = "CAPEXEC_CONNECT")]
    connect: Option<String>,
    /// `connect` came from CAPEXEC_CONNECT, not the flag: errors name the
    /// variable.
    #[arg(skip)]
    connect_from_variable: bool,
    /// Read the login token for tcp: addresses from FILE. Default: the
    /// token itself in $CAPEXEC_TOKEN, else the file
    /// $XDG_CONFIG_HOME/capexec/token or ~/.config/capexec/token.
    #[arg(long, value_name = "FILE")]
    token_file: Option<std::path::PathBuf>,
    /// Connect over TLS and trust certificates signed by the CA in this
    /// PEM file (for the host name or IP address of --connect).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["tls_pin", "insecure_plaintext"])]
    tls_ca: Option<std::path::PathBuf>,
    /// Connect over TLS and trust exactly the certificate with this SHA-256
    /// fingerprint, as `capexec serve` logs it or openssl prints it (hex,
    /// with or without colons, `sha256:` or `SHA256 Fingerprint=`).
    #[arg(long, value_name = "SHA256", conflicts_with = "insecure_plaintext")]
    tls_pin: Option<String>,
    /// Present this PEM certificate (the client's own first, then its
    /// chain) when the server asks for one: a server that runs logins as
    /// users logs in a certificate its user map names (then no token is
    /// needed). With --tls-client-key.
    #[arg(
        long,
        value_name = "FILE",
        requires = "tls_client_key",
        conflicts_with = "insecure_plaintext"
    )]
    tls_client_cert: Option<std::path::PathBuf>,
    /// The PEM private key of --tls-client-cert.
    #[arg(long, value_name = "FILE", requires = "tls_client_cert")]
    tls_client_key: Option<std::path::PathBuf>,
    /// Send the login token to a non-loopback tcp: address without TLS
    /// (only over a network you trust, or a tunnel).
    #[arg(long)]
    insecure_plaintext: bool,
    /// Connect over TLS, trusting the server's certificate on first use as
    /// ssh does: an unknown one is shown and asked about (on a terminal),
    /// then remembered in $XDG_CONFIG_HOME/capexec/known-servers; a changed
    /// one is refused. The default for addresses already remembered
    /// there.
    #[arg(long, conflicts_with_all = ["tls_ca", "tls_pin", "insecure_plaintext"])]
    tls: bool,
    /// Trust and remember a certificate seen for the first time without
    /// asking (for scripts; a changed certificate is still refused).
    #[arg(long, conflicts_with_all = ["tls_ca", "tls_pin", "insecure_plaintext"])]
    tls_accept_new: bool,
    /// Give up if connecting and logging in take longer than SECS (or
    /// 0.5, 90s, 5m...). Default: 10.
    #[arg(long, value_name = "SECS", value_parser = duration::parse_positive)]
    connect_timeout: Option<std::time::Duration>,
    /// Treat the connection as lost (and with --resume, reconnect) when
    /// the server has sent nothing for SECS (or 90s, 5m...): a quiet
    /// connection is probed every fifth of it, so a silent path is noticed
    /// within 1.2 times SECS. 0 turns it off. Default: 15.
    #[arg(long, value_name = "SECS", value_parser = duration::parse)]
    keepalive: Option<std::time::Duration>,
}

/// Forward ports through the executor, like `ssh -L` and `ssh -R`
///
/// Runs until interrupted (SIGINT, SIGTERM or SIGHUP: exit 0).
/// Prints one line on stdout per forward once it listens, with the address
/// it listens on (the port chosen when 0 was asked for):
///
///   -L tcp:127.0.0.1:8080 -> tcp:localhost:80
///   -R tcp:127.0.0.1:9000 -> tcp:localhost:3000
///
/// and one line on stderr per connection that failed, as
/// `capexec: -L LISTEN -> TARGET: connection from PEER failed: REASON`.
/// A connection whose two directions both end cleanly prints nothing.
/// Exits 125 if a forward cannot be set up or the connection to the server
/// is lost (the connections through it are reset), unless --resume.
#[derive(Args, Debug)]
#[command(
    verbatim_doc_comment,
    after_help = "Example: capexec forward --connect build -L 8080:localhost:80 -R 0:localhost:3000"
)]
pub struct ForwardArgs {
    #[command(flatten)]
    connect: ConnectArgs,
    /// Forward through this environment of the server (NAME, or
    /// NAME/NAME... through several hops) instead of its default one.
    #[arg(long, value_name = "NAME")]
    environment: Option<String>,
    /// Survive a lost connection: reconnect for up to SECS (or 90s, 5m...),
    /// then go on forwarding. Connections open through the old one fail
    /// (reset); -L keeps listening on the same ports meanwhile, and -R
    /// listens again on the server (its line printed again).
    #[arg(long, value_name = "SECS", value_parser = duration::parse_positive)]
    resume: Option<std::time::Duration>,
    /// Listen here on [BIND_ADDRESS:]PORT (loopback unless BIND_ADDRESS is
    /// given; "*" for every interface) or unix:PATH, and connect each
    /// connection to HOST:HOSTPORT (or unix:PATH) from the executor's
    /// machine (repeatable).
    #[arg(short = 'L', value_name = "[BIND_ADDRESS:]PORT:HOST:HOSTPORT",
          value_parser = forward_spec::parse)]
    local: Vec<forward_spec::ForwardSpec>,
    /// Listen on the executor's machine on [BIND_ADDRESS:]PORT (loopback
    /// unless given; PORT 0: any free port) or unix:PATH, and connect each
    /// connection to HOST:HOSTPORT (or unix:PATH) from here (repeatable).
    #[arg(short = 'R', value_name = "[BIND_ADDRESS:]PORT:HOST:HOSTPORT",
          value_parser = forward_spec::parse)]
    remote: Vec<forward_spec::ForwardSpec>,
    /// ssh's -N, by habit: accepted and said to be needless (forward runs
    /// no command).
    #[arg(short = 'N', hide = true)]
    no_command: bool,
}

#[derive(Args, Debug)]
pub struct InfoArgs {
    #[command(flatten)]
    connect: ConnectArgs,
    /// Ask the executor of this environment (NAME, or NAME/NAME... through
    /// several hops).
    #[arg(long, value_name = "NAME")]
    environment: Option<String>,
    /// One JSON object instead of lines (see the README's "JSON output").
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct EnvironmentsArgs {
    #[command(flatten)]
    connect: ConnectArgs,
    /// One JSON array of objects instead of a table (see the README's
    /// "JSON output").
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Where to listen: unix:PATH or tcp:HOST:PORT (port 0 picks a free
    /// one); repeatable. Each resolved address (port chosen, path made
    /// absolute) is printed on stdout.
    /// Default: the default socket (see above).
    #[arg(long = "listen", value_name = "ADDR")]
    listen: Vec<String>,
    /// Login token of the TCP listeners; created (mode 0600, 256 random
    /// bits) if the file does not exist. Default:
    /// $XDG_CONFIG_HOME/capexec/token or ~/.config/capexec/token.
    #[arg(long, value_name = "FILE")]
    token_file: Option<std::path::PathBuf>,
    /// Forward to the executor at ADDR as the environment NAME
    /// (repeatable). Connected on first use. ADDR may be a server named in
    /// the configuration file: its token file and TLS trust (a pin, a CA,
    /// or the certificate remembered for it) come with it.
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
    /// (the server's certificate first); needs --tls-key. A certificate
    /// that has expired, or will within 14 days, is warned about at start.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// Serve the admin capability (every process: list, observe,
    /// terminate; see `capexec ps`) on this Unix socket, mode 0600, and
    /// nowhere else.
    #[arg(long, value_name = "unix:PATH")]
    admin: Option<String>,
    /// Serve counters for monitoring in the Prometheus text format at
    /// http://HOST:PORT/metrics (processes, starts, failures by tag, exits
    /// by class, bytes in and out, connections, refused logins, limit
    /// hits; never contents, tokens or arguments). Port 0 picks one, which
    /// is logged. No login: 64 requests are served at once, 8 of them
    /// from one address, each sent within 1 s.
    #[arg(long, value_name = "tcp:HOST:PORT")]
    metrics: Option<String>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// Serve TLS with a certificate of the server's own, made on first
    /// start (server-cert.pem and server-key.pem, mode 0600, in
    /// $XDG_CONFIG_HOME/capexec) and kept; its fingerprint is printed.
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"])]
    tls_self_signed: bool,
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
    /// Port connections (`dial`led, or accepted by a listener) one
    /// connection may hold at once; more are refused with
    /// [capexec:limit], and a listener leaves the rest in its backlog.
    #[arg(long, value_name = "N", default_value_t = capexec::rpc::MAX_PORT_STREAMS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    max_port_connections_per_connection: usize,
    /// Listening sockets (`listen`, `capexec forward -R`) one connection
    /// may hold at once; more are refused with [capexec:limit].
    #[arg(long, value_name = "N", default_value_t = capexec::rpc::MAX_PORT_LISTENERS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    max_listeners_per_connection: usize,
    /// inotify watches (one per directory watched) every `Directory.watch`
    /// of the server may hold together; a watch that would need more is
    /// refused with [capexec:limit], and a recursive one gets an overflow
    /// event for what it could not watch [default: half of
    /// fs.inotify.max_user_watches, so the user's other programs keep the
    /// rest].
    #[arg(long, value_name = "N",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000_000))]
    max_inotify_watches: Option<usize>,
    /// Connections the server holds open at once, over every listener
    /// (Unix and TCP, logged in or not; a dial's direct channel until it
    /// is claimed, then as its port connection); one more is refused at
    /// once, told why where it can read it. A value the descriptor limit cannot carry is refused
    /// [default: the descriptors the limit keeps for connections, one
    /// eighth of it].
    #[arg(long, value_name = "N",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000_000))]
    max_connections: Option<usize>,
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
    /// For tests only: treat this kernel feature as missing (repeatable):
    /// landlock, landlock-tcp, landlock-scopes, seccomp, cgroups, memory,
    /// pids, cpu, clone-into-cgroup, openat2, o-tmpfile, idmapped-mounts.
    #[arg(long = "hide-kernel-feature", value_name = "FEATURE", hide = true)]
    hide_kernel_features: Vec<capexec::sandbox::KernelFeature>,
    /// Run each login as its own Unix user (a server started as root): a
    /// Unix-socket peer as the user its credentials name, or the one FILE
    /// maps its uid to (`unix UID USER` lines), a TCP login as the user
    /// its token file maps to (`token FILE USER` lines; no other token
    /// logs in); `#` starts a comment. Unix listeners become open to every
    /// local user. Each user's
    /// commands, files and ports are served by a worker process with that
    /// user's ids, groups and login environment.
    #[arg(long, value_name = "FILE", conflicts_with = "token_file")]
    user_map: Option<std::path::PathBuf>,
    /// With --user-map: the user the front runs as, the part of the server
    /// that accepts connections and reads every peer's messages (never
    /// root). Give it a user of its own: another daemon's user could
    /// signal or trace it.
    #[arg(
        long,
        value_name = "USER",
        default_value = "capexec",
        requires = "user_map"
    )]
    privsep_user: String,
    /// With --user-map: most connections one Unix user may hold open on
    /// the server's Unix sockets at once, logged in or refused; more are
    /// turned away at once, so that one local user cannot take the
    /// descriptors every other user's logins need [default: 256, or half
    /// of --max-connections if that is less].
    #[arg(long, value_name = "N", requires = "user_map",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    max_connections_per_user: Option<usize>,
    /// Internal: serve as the front of a server that runs logins as users,
    /// taking the logins its monitor hands over at descriptor FD.
    #[arg(long, value_name = "FD", hide = true)]
    front: Option<i32>,
    /// Internal: the front asks TLS peers for a client certificate (the
    /// user map has `cert` lines).
    #[arg(long, hide = true, requires = "front")]
    client_certificates: bool,
    /// Internal: the front's socket for asking its monitor which worker a
    /// TCP login's token logs in to.
    #[arg(long, value_name = "FD", hide = true, requires = "front")]
    monitor_requests: Option<i32>,
    /// Internal: why the monitor's last upgrade did not execute the new
    /// binary (it went back to this one), for `Admin.lastUpgrade`.
    #[arg(long, value_name = "TEXT", hide = true, requires = "front")]
    failed_upgrade: Option<String>,
    /// Internal: a listening socket at descriptor FD to serve (NAME
    /// `admin`: the admin socket); repeatable.
    #[arg(
        long = "listen-fd",
        value_name = "FD[=NAME]",
        hide = true,
        requires = "front"
    )]
    listen_fds: Vec<String>,
    /// Internal: serve, as the user this process runs as, on the
    /// listening Unix socket at descriptor FD only (a user's worker, started
    /// by a server that maps logins to users and reached only by it; see
    /// docs/design/logins-as-users.md).
    #[arg(long, value_name = "FD", hide = true,
          conflicts_with_all = ["listen", "token_file", "upstreams", "admin", "metrics",
                                "tls_cert", "tls_self_signed", "user_map"])]
    worker: Option<i32>,
    /// Internal: a user's worker serves `Admin` on the listening Unix
    /// socket at descriptor FD (the front's view of the user's processes).
    #[arg(long, value_name = "FD", hide = true, requires = "worker")]
    worker_admin: Option<i32>,
    /// Internal: started by an upgrade of a server that runs logins as
    /// users (same process): the monitor before described its listeners
    /// and workers at memfd FD.
    #[arg(long, value_name = "FD", hide = true, requires = "user_map",
          conflicts_with_all = ["worker", "front", "handover"])]
    monitor_handover: Option<i32>,
    /// Internal: a user's worker makes its processes' cgroups in GROUP (as
    /// /proc/PID/cgroup names a cgroup), which its monitor delegated to
    /// the user, instead of in its own.
    #[arg(long, value_name = "GROUP", hide = true, requires = "worker")]
    cgroup_parent: Option<String>,
    /// Internal: started by an upgrade of the server before (same
    /// process): its listeners and processes are described at memfd FD.
    #[arg(long, value_name = "FD", hide = true, conflicts_with_all = ["front", "user_map"])]
    handover: Option<i32>,
    /// Internal: print the hand-over format this binary takes and exit (an
    /// upgrading server asks the new binary first).
    #[arg(long, hide = true)]
    handover_check: bool,
}

/// How to run a command: where, in what environment, with what
/// terminal; shared by `run` and `shell`.
#[derive(Args, Debug)]
pub struct SessionArgs {
    #[command(flatten)]
    connect: ConnectArgs,
    /// Run in this environment of the server (NAME, or NAME/NAME... through
    /// several hops) instead of its default one.
    #[arg(long, value_name = "NAME")]
    environment: Option<String>,
    /// Survive broken connections: the command keeps running for up to
    /// SECS (or 90s, 5m...) without us, and we reconnect and carry on
    /// without losing or repeating a byte (needs --connect).
    #[arg(long, value_name = "SECS", value_parser = duration::parse)]
    resume: Option<std::time::Duration>,
    /// Working directory of the command, on the executor's machine.
    /// Default: the server's own working directory (with --connect), or
    /// ours (embedded).
    #[arg(short = 'w', long, value_name = "DIR")]
    cwd: Option<OsString>,
    /// Set an environment variable (repeatable).
    #[arg(short = 'e', long = "env", value_name = "KEY=VALUE")]
    env: Vec<OsString>,
    /// Remove an environment variable (repeatable).
    #[arg(long = "unset-env", value_name = "KEY")]
    unset_env: Vec<OsString>,
    /// Start from an empty environment instead of the executor's (the
    /// server's with --connect, ours when embedded; ours is never sent).
    #[arg(long)]
    clear_env: bool,
    /// End the command (its process group: SIGTERM, then SIGKILL) if it has
    /// not finished after SECS (or 0.5, 90s, 5m...; 0: no limit); capexec
    /// then exits 124.
    #[arg(long, value_name = "SECS", value_parser = duration::parse)]
    timeout: Option<std::time::Duration>,
    /// When the command has finished, print on stderr the CPU time and peak
    /// memory its process tree used (like time(1)).
    #[arg(long)]
    usage: bool,
    /// Give the command an immediate end-of-file on stdin.
    #[arg(short = 'n', conflicts_with = "interactive")]
    no_stdin: bool,
    /// Keep stdin open for the command (it always is unless -n): accepted
    /// so that `-it` works as with docker and kubectl.
    #[arg(short = 'i')]
    interactive: bool,
    /// Run the command on a pseudo-terminal sized like ours (or --size),
    /// with our terminal in raw mode while it runs and our TERM sent with
    /// it. `~.` after a newline ends the session, `~~` sends one `~`.
    #[arg(short = 't')]
    tty: bool,
    /// Terminal size for -t, ROWSxCOLS (default: our terminal's, or 24x80).
    #[arg(long, value_name = "ROWSxCOLS")]
    size: Option<String>,
    /// Relay stdin, stdout and stderr through the executor even when it
    /// runs on this machine. By default an embedded command, or one
    /// started over a Unix socket, is handed capexec's own pipes and
    /// sockets (stdin: a regular file too) and reads and writes them
    /// itself, as a local child would; its output is then not retained
    /// by the server (its admin socket's observers see none).
    #[arg(long)]
    relay_stdio: bool,
    #[command(flatten)]
    confinement: confinement::ConfinementArgs,
    /// While the command runs, listen here and forward each connection
    /// from the executor's machine, as `capexec forward -L` (repeatable;
    /// each forward's line goes to stderr once it listens). With --resume,
    /// a reconnection fails the connections open through the old
    /// connection and carries new ones.
    #[arg(long = "forward", value_name = "[BIND_ADDRESS:]PORT:HOST:HOSTPORT",
          value_parser = forward_spec::parse)]
    forward: Vec<forward_spec::ForwardSpec>,
    /// While the command runs, listen on the executor's machine and
    /// forward each connection from here, as `capexec forward -R`
    /// (repeatable; the listener goes when the command ends; with
    /// --resume it listens again after a reconnection, announced again).
    #[arg(long = "reverse-forward", value_name = "[BIND_ADDRESS:]PORT:HOST:HOSTPORT",
          value_parser = forward_spec::parse)]
    reverse_forward: Vec<forward_spec::ForwardSpec>,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    session: SessionArgs,
    /// The program and its arguments, looked up on the executor's PATH.
    /// None: the executor's shell, as `capexec shell` starts it.
    #[arg(trailing_var_arg = true, value_name = "PROGRAM")]
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
    if asks_only_for_version() {
        // What clap would print, without building the definition of every
        // subcommand first (most of `capexec --version`'s own time).
        return stdio::print_answer(format!("capexec {}\n", version()), "the version");
    }
    let parsed = command().try_get_matches().and_then(|matches| {
        let mut cli = Cli::from_arg_matches(&matches)?;
        if let Some(connect) = cli.command.connect_args_mut() {
            connect.note_source(&matches);
        }
        Ok(cli)
    });
    let cli = match parsed {
        Ok(cli) => cli,
        Err(error) => return argument_failure(&error),
    };
    let verbose = cli.verbose;
    match cli.command {
        Command::Run(Deferred(args)) => {
            logging::init(tracing::Level::WARN, logging::Style::Client, verbose);
            run::main(args.session, args.argv)
        }
        Command::Shell(Deferred(args)) => {
            logging::init(tracing::Level::WARN, logging::Style::Client, verbose);
            run::main(args, Vec::new())
        }
        Command::Serve(Deferred(args)) => {
            logging::init(tracing::Level::INFO, logging::Style::Server, verbose);
            serve::main(*args)
        }
        Command::Environments(Deferred(args)) => {
            logging::init(tracing::Level::WARN, logging::Style::Client, verbose);
            inspect::environments_main(args)
        }
        Command::Info(Deferred(args)) => {
            logging::init(tracing::Level::WARN, logging::Style::Client, verbose);
            inspect::info_main(args)
        }
        Command::Servers(Deferred(args)) => servers::list_main(args),
        Command::Ps(Deferred(args)) => {
            logging::init(tracing::Level::WARN, logging::Style::Client, verbose);
            admin::ps_main(args)
        }
        Command::Kill(Deferred(args)) => {
            logging::init(tracing::Level::WARN, logging::Style::Client, verbose);
            admin::kill_main(args)
        }
        Command::Upgrade(Deferred(args)) => {
            logging::init(tracing::Level::WARN, logging::Style::Client, verbose);
            admin::upgrade_main(args)
        }
        Command::ClientConfig(Deferred(args)) => servers::client_config_main(args),
        Command::Completions(Deferred(args)) => generate::completions_main(args),
        Command::Man(Deferred(args)) => generate::man_main(args),
        Command::Cp(Deferred(args)) => {
            logging::init(tracing::Level::WARN, logging::Style::Client, verbose);
            copy::main(args)
        }
        Command::Forward(args) => {
            logging::init(tracing::Level::WARN, logging::Style::Client, verbose);
            forward::main(args)
        }
        Command::CodexBridge(Deferred(args)) => {
            logging::init(tracing::Level::WARN, logging::Style::Client, verbose);
            codex_bridge::main(args)
        }
        Command::Mcp(Deferred(args)) => {
            // rmcp warns of every error it answers (an unknown tool, a bad
            // argument): the agent already has the answer.
            logging::init_with(
                tracing::Level::WARN,
                logging::Style::Client,
                verbose,
                Some("rmcp::service=error"),
            );
            mcp::main(args)
        }
    }
}

impl Command {
    /// The `--connect` options of the subcommands that have them.
    fn connect_args_mut(&mut self) -> Option<&mut ConnectArgs> {
        match self {
            Command::Run(Deferred(args)) => Some(&mut args.session.connect),
            Command::Shell(Deferred(args)) => Some(&mut args.connect),
            Command::Environments(Deferred(args)) => Some(&mut args.connect),
            Command::Info(Deferred(args)) => Some(&mut args.connect),
            Command::Cp(Deferred(args)) => Some(&mut args.connect),
            Command::Forward(args) => Some(&mut args.connect),
            Command::CodexBridge(Deferred(args)) => Some(&mut args.connect),
            Command::Mcp(Deferred(args)) => Some(&mut args.connect),
            _ => None,
        }
    }
}

impl ConnectArgs {
    /// Notes whether `--connect` came from CAPEXEC_CONNECT, which counts
    /// as unset when empty (as an empty DOCKER_HOST does).
    fn note_source(&mut self, matches: &clap::ArgMatches) {
        let from_variable = matches.subcommand().is_some_and(|(_, matches)| {
            matches.ids().any(|id| id.as_str() == "connect")
                && matches.value_source("connect") == Some(clap::parser::ValueSource::EnvVariable)
        });
        if from_variable && self.connect.as_deref().is_some_and(str::is_empty) {
            self.connect = None;
        }
        self.connect_from_variable = from_variable && self.connect.is_some();
    }

    /// What gave `--connect`, as errors name it.
    pub fn connect_given(&self) -> &'static str {
        if self.connect_from_variable {
            named::CONNECT_VARIABLE
        } else {
            "--connect"
        }
    }
}

/// The clap definition, with `--version` saying what the protocol offers.
pub fn command() -> clap::Command {
    Cli::command().version(version())
}

/// The version, and the features of the protocol this binary speaks.
fn version() -> String {
    let features = capexec::rpc::protocol_features()
        .collect::<Vec<_>>()
        .join(" ");
    format!("{}\nfeatures: {features}", env!("CARGO_PKG_VERSION"))
}

/// `capexec --version` or `capexec -V`, and nothing else.
fn asks_only_for_version() -> bool {
    let mut args = std::env::args_os().skip(1);
    matches!(
        (args.next(), args.next()),
        (Some(only), None) if only == "--version" || only == "-V"
    )
}

/// Help and version go to stdout as clap writes them; errors become one
/// line and exit 125.
fn argument_failure(error: &clap::Error) -> i32 {
    if !error.use_stderr() {
        // Help and version: in colour on a terminal, as clap prints them;
        // elsewhere plain, under the rule of every answer on stdout.
        if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
            let _ = error.print();
            return 0;
        }
        let what = match error.kind() {
            clap::error::ErrorKind::DisplayVersion => "the version",
            _ => "the help",
        };
        return stdio::print_answer(error.render().to_string(), what);
    }
    let subcommand = std::env::args().nth(1).filter(|name| {
        command()
            .get_subcommands()
            .any(|subcommand| subcommand.get_name() == name)
    });
    eprintln!(
        "capexec: {}",
        argument_error::one_line(error, subcommand.as_deref())
    );
    EXIT_CAPEXEC_FAILURE
}
