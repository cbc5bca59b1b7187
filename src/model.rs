//! Plain value types shared by every layer: the engine produces them, the RPC
//! layer converts them to and from the wire, the client hands them to users.

use std::fmt;
use std::str::FromStr;

use bytes::Bytes;

/// Which output stream a chunk came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OutputStream {
    Stdout,
    Stderr,
    /// The merged output of a pseudo-terminal.
    Pty,
}

/// What the server does with output nobody has consumed yet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Flow {
    /// Always drain the child; evict the oldest retained output when full.
    #[default]
    Retain,
    /// Stop draining when the owner falls a window behind, so the child
    /// blocks in write(2) exactly as with a local pipe.
    Lossless,
}

/// Terminal size in character cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PtySize {
    pub rows: u16,
    pub cols: u16,
}

impl Default for PtySize {
    fn default() -> Self {
        PtySize { rows: 24, cols: 80 }
    }
}

/// The POSIX signals capexec can send and report, by name, so that a client
/// and a server whose operating systems number them differently agree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Signal {
    Hup,
    Int,
    Quit,
    Ill,
    Trap,
    Abrt,
    Bus,
    Fpe,
    Kill,
    Usr1,
    Segv,
    Usr2,
    Pipe,
    Alrm,
    Term,
    Chld,
    Cont,
    Stop,
    Tstp,
    Ttin,
    Ttou,
    Urg,
    Xcpu,
    Xfsz,
    Vtalrm,
    Prof,
    Winch,
    Io,
    Sys,
}

impl Signal {
    pub const ALL: [Signal; 29] = [
        Signal::Hup,
        Signal::Int,
        Signal::Quit,
        Signal::Ill,
        Signal::Trap,
        Signal::Abrt,
        Signal::Bus,
        Signal::Fpe,
        Signal::Kill,
        Signal::Usr1,
        Signal::Segv,
        Signal::Usr2,
        Signal::Pipe,
        Signal::Alrm,
        Signal::Term,
        Signal::Chld,
        Signal::Cont,
        Signal::Stop,
        Signal::Tstp,
        Signal::Ttin,
        Signal::Ttou,
        Signal::Urg,
        Signal::Xcpu,
        Signal::Xfsz,
        Signal::Vtalrm,
        Signal::Prof,
        Signal::Winch,
        Signal::Io,
        Signal::Sys,
    ];

    /// The number this host's operating system uses for the signal.
    pub fn number(self) -> i32 {
        match self {
            Signal::Hup => libc::SIGHUP,
            Signal::Int => libc::SIGINT,
            Signal::Quit => libc::SIGQUIT,
            Signal::Ill => libc::SIGILL,
            Signal::Trap => libc::SIGTRAP,
            Signal::Abrt => libc::SIGABRT,
            Signal::Bus => libc::SIGBUS,
            Signal::Fpe => libc::SIGFPE,
            Signal::Kill => libc::SIGKILL,
            Signal::Usr1 => libc::SIGUSR1,
            Signal::Segv => libc::SIGSEGV,
            Signal::Usr2 => libc::SIGUSR2,
            Signal::Pipe => libc::SIGPIPE,
            Signal::Alrm => libc::SIGALRM,
            Signal::Term => libc::SIGTERM,
            Signal::Chld => libc::SIGCHLD,
            Signal::Cont => libc::SIGCONT,
            Signal::Stop => libc::SIGSTOP,
            Signal::Tstp => libc::SIGTSTP,
            Signal::Ttin => libc::SIGTTIN,
            Signal::Ttou => libc::SIGTTOU,
            Signal::Urg => libc::SIGURG,
            Signal::Xcpu => libc::SIGXCPU,
            Signal::Xfsz => libc::SIGXFSZ,
            Signal::Vtalrm => libc::SIGVTALRM,
            Signal::Prof => libc::SIGPROF,
            Signal::Winch => libc::SIGWINCH,
            Signal::Io => libc::SIGIO,
            Signal::Sys => libc::SIGSYS,
        }
    }

    /// The named signal this host numbers `number`, if any.
    pub fn from_number(number: i32) -> Option<Signal> {
        Signal::ALL.into_iter().find(|s| s.number() == number)
    }

    /// The conventional name without the `SIG` prefix, e.g. `INT`.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Hup => "HUP",
            Signal::Int => "INT",
            Signal::Quit => "QUIT",
            Signal::Ill => "ILL",
            Signal::Trap => "TRAP",
            Signal::Abrt => "ABRT",
            Signal::Bus => "BUS",
            Signal::Fpe => "FPE",
            Signal::Kill => "KILL",
            Signal::Usr1 => "USR1",
            Signal::Segv => "SEGV",
            Signal::Usr2 => "USR2",
            Signal::Pipe => "PIPE",
            Signal::Alrm => "ALRM",
            Signal::Term => "TERM",
            Signal::Chld => "CHLD",
            Signal::Cont => "CONT",
            Signal::Stop => "STOP",
            Signal::Tstp => "TSTP",
            Signal::Ttin => "TTIN",
            Signal::Ttou => "TTOU",
            Signal::Urg => "URG",
            Signal::Xcpu => "XCPU",
            Signal::Xfsz => "XFSZ",
            Signal::Vtalrm => "VTALRM",
            Signal::Prof => "PROF",
            Signal::Winch => "WINCH",
            Signal::Io => "IO",
            Signal::Sys => "SYS",
        }
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SIG{}", self.name())
    }
}

impl FromStr for Signal {
    type Err = String;

    /// Accepts `INT`, `SIGINT`, `int` or a number of this host (`2`).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if let Ok(number) = text.parse::<i32>() {
            return Signal::from_number(number)
                .ok_or_else(|| format!("unknown signal number {number}"));
        }
        let upper = text.to_ascii_uppercase();
        let name = upper.strip_prefix("SIG").unwrap_or(&upper);
        Signal::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| format!("unknown signal {text:?}"))
    }
}

/// What a process tree used, as the kernel accounts it when the child is
/// waited for: the child itself plus every descendant it waited for
/// itself (the same figures a shell's `time` reports). Descendants still
/// running when the child exits, or orphaned before they ended, are not
/// included.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResourceUsage {
    /// CPU time spent in user mode.
    pub user_cpu: std::time::Duration,
    /// CPU time spent in the kernel on the tree's behalf.
    pub system_cpu: std::time::Duration,
    /// The largest resident set any single process of the accounted tree
    /// reached (the kernel's `ru_maxrss`; resident sets are not summed
    /// across processes). The kernel counts a process's memory from before
    /// it executed its program too, and children are started vfork-style,
    /// sharing the starting process's memory until they execute: the figure
    /// is never below that process's own peak at the time (a few MiB).
    pub peak_rss_bytes: u64,
}

impl fmt::Display for ResourceUsage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "user {:.3}s, system {:.3}s, peak RSS {} KiB",
            self.user_cpu.as_secs_f64(),
            self.system_cpu.as_secs_f64(),
            self.peak_rss_bytes / 1024
        )
    }
}

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    /// Normal exit with this code.
    Code(i32),
    /// Death by signal. `signal` is `None` for signals without a name in
    /// [`Signal`]; `number` is the server's own number for it.
    Killed {
        signal: Option<Signal>,
        number: i32,
        core_dumped: bool,
    },
}

impl ExitStatus {
    /// The status a shell would report: the code, or 128 + the signal number
    /// (numbered by this host when the signal has a name).
    pub fn shell_code(&self) -> i32 {
        match *self {
            ExitStatus::Code(code) => code,
            ExitStatus::Killed { signal, number, .. } => {
                128 + signal.map(Signal::number).unwrap_or(number)
            }
        }
    }

    pub fn success(&self) -> bool {
        *self == ExitStatus::Code(0)
    }
}

impl fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ExitStatus::Code(code) => write!(f, "exit code {code}"),
            ExitStatus::Killed {
                signal,
                number,
                core_dumped,
            } => {
                match signal {
                    Some(signal) => write!(f, "killed by {signal}")?,
                    None => write!(f, "killed by signal {number}")?,
                }
                if core_dumped {
                    write!(f, " (core dumped)")?;
                }
                Ok(())
            }
        }
    }
}

/// Outcome of a stdin write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteStatus {
    /// The bytes are in the child's stdin, or this write id was accepted before.
    Accepted,
    /// Stdin is not open (never piped, closed by the client or by the child).
    StdinClosed,
    /// The process is not spawned yet (never produced by capexec executors).
    Starting,
    /// The process has exited.
    Exited,
}

/// One entry of a process's event sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The event's seq; for a gap, the last lost seq.
    pub seq: u64,
    pub body: EventBody,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventBody {
    Output {
        stream: OutputStream,
        data: Bytes,
    },
    Exited(ExitStatus),
    Closed,
    /// Seqs `from_seq..=seq` were evicted before this consumer received them.
    Gap {
        from_seq: u64,
    },
}

/// Why a start failed, in a form that survives the wire (see the schema's
/// `[capexec:<code>]` tags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartErrorKind {
    InvalidArgument,
    ProgramNotFound,
    PermissionDenied,
    BadCwd,
    Unsupported,
    /// The executor cannot start anything now (it is shutting down).
    Unavailable,
    SpawnFailed,
    /// The start was for an upstream environment that cannot be reached.
    UpstreamUnavailable,
    /// No environment has the name asked for.
    UnknownEnvironment,
    /// `restore`: no process has this token (any more).
    UnknownToken,
    /// A configured limit (processes, argument size) would be exceeded.
    LimitReached,
    /// A rule of a restricted executor forbids it.
    NotAllowed,
}

impl StartErrorKind {
    const ALL: [StartErrorKind; 12] = [
        StartErrorKind::InvalidArgument,
        StartErrorKind::ProgramNotFound,
        StartErrorKind::PermissionDenied,
        StartErrorKind::BadCwd,
        StartErrorKind::Unsupported,
        StartErrorKind::Unavailable,
        StartErrorKind::SpawnFailed,
        StartErrorKind::UpstreamUnavailable,
        StartErrorKind::UnknownEnvironment,
        StartErrorKind::UnknownToken,
        StartErrorKind::LimitReached,
        StartErrorKind::NotAllowed,
    ];

    pub fn code(self) -> &'static str {
        match self {
            StartErrorKind::InvalidArgument => "invalid-argument",
            StartErrorKind::ProgramNotFound => "program-not-found",
            StartErrorKind::PermissionDenied => "permission-denied",
            StartErrorKind::BadCwd => "bad-cwd",
            StartErrorKind::Unsupported => "unsupported",
            StartErrorKind::Unavailable => "unavailable",
            StartErrorKind::SpawnFailed => "spawn-failed",
            StartErrorKind::UpstreamUnavailable => "upstream-unavailable",
            StartErrorKind::UnknownEnvironment => "unknown-environment",
            StartErrorKind::UnknownToken => "unknown-token",
            StartErrorKind::LimitReached => "limit",
            StartErrorKind::NotAllowed => "not-allowed",
        }
    }

    /// The tag written at the end of an error description.
    pub fn tag(self) -> String {
        format!("[capexec:{}]", self.code())
    }

    /// Finds the tag in an error description, wherever forwarding hops put it.
    pub fn from_description(description: &str) -> Option<StartErrorKind> {
        StartErrorKind::ALL
            .into_iter()
            .find(|kind| description.contains(&kind.tag()))
    }

    /// The exit status `capexec run` reports for this failure.
    pub fn cli_exit_code(self) -> i32 {
        match self {
            StartErrorKind::ProgramNotFound => 127,
            StartErrorKind::PermissionDenied => 126,
            _ => 125,
        }
    }
}

/// What an executor reports about itself (see the schema's `ExecutorInfo`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecutorInfo {
    pub version: String,
    pub features: Vec<String>,
    pub os: String,
    pub arch: String,
    pub hostname: String,
    pub default_shell: std::path::PathBuf,
    pub cwd: std::path::PathBuf,
    pub temp_dir: std::path::PathBuf,
    /// "local", or the path of environment names to where `start` runs.
    pub environment: String,
}

/// Name of a server's own engine among its environments.
pub const LOCAL_ENVIRONMENT: &str = "local";

/// One environment a server offers (see the schema's `Environment`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvironmentStatus {
    pub name: String,
    /// The upstream's address; empty for the local environment.
    pub address: String,
    pub is_default: bool,
    pub state: EnvironmentState,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EnvironmentState {
    Local,
    /// Not connected yet; connects on first use.
    Idle,
    Connecting,
    Connected,
    Failed {
        reason: String,
        retry_in: std::time::Duration,
    },
}

impl fmt::Display for EnvironmentState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnvironmentState::Local => write!(f, "local"),
            EnvironmentState::Idle => write!(f, "idle"),
            EnvironmentState::Connecting => write!(f, "connecting"),
            EnvironmentState::Connected => write!(f, "connected"),
            EnvironmentState::Failed { reason, .. } => write!(f, "failed: {reason}"),
        }
    }
}

/// Whether `name` can name an upstream environment: letters, digits, "-",
/// "_" and ".", not "local" (and so never "/", which separates the names of
/// a path through several hops).
pub fn valid_environment_name(name: &str) -> bool {
    !name.is_empty()
        && name != LOCAL_ENVIRONMENT
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A failed start: what went wrong, for people and for programs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartError {
    pub kind: StartErrorKind,
    pub message: String,
}

impl StartError {
    pub fn new(kind: StartErrorKind, message: impl Into<String>) -> StartError {
        StartError {
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.message, self.kind.tag())
    }
}

impl std::error::Error for StartError {}

/// How much of a value a peer sent a refusal quotes, in bytes.
pub const EXCERPT_BYTES: usize = 200;

/// `text`, or its first [`EXCERPT_BYTES`] bytes (cut at a character) and
/// its length: a refusal says what it refuses without repeating an 8 KiB
/// path back.
pub fn excerpt(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= EXCERPT_BYTES {
        return text.into();
    }
    let mut end = EXCERPT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &text[..end], text.len()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_names_and_numbers_round_trip() {
        for signal in Signal::ALL {
            assert_eq!(Signal::from_number(signal.number()), Some(signal));
            assert_eq!(signal.name().parse::<Signal>(), Ok(signal));
            assert_eq!(format!("{signal}").parse::<Signal>(), Ok(signal));
        }
        assert_eq!("int".parse::<Signal>(), Ok(Signal::Int));
        assert_eq!("9".parse::<Signal>(), Ok(Signal::Kill));
        assert!("NOPE".parse::<Signal>().is_err());
    }

    #[test]
    fn shell_codes_follow_the_128_plus_signal_rule() {
        assert_eq!(ExitStatus::Code(7).shell_code(), 7);
        let killed = ExitStatus::Killed {
            signal: Some(Signal::Term),
            number: 15,
            core_dumped: false,
        };
        assert_eq!(killed.shell_code(), 128 + libc::SIGTERM);
        let unnamed = ExitStatus::Killed {
            signal: None,
            number: 40,
            core_dumped: false,
        };
        assert_eq!(unnamed.shell_code(), 168);
    }

    #[test]
    fn excerpts_keep_short_values_and_cut_long_ones_at_a_character() {
        assert_eq!(excerpt("short"), "short");
        let long = "é".repeat(150);
        let cut = excerpt(&long);
        assert_eq!(cut, format!("{}... (300 bytes)", "é".repeat(100)));
    }

    #[test]
    fn start_error_tags_survive_prefixes() {
        let error = StartError::new(StartErrorKind::ProgramNotFound, "no such program \"x\"");
        let forwarded = format!("remote exception: remote exception: {error}");
        assert_eq!(
            StartErrorKind::from_description(&forwarded),
            Some(StartErrorKind::ProgramNotFound)
        );
        assert_eq!(StartErrorKind::from_description("plain failure"), None);
    }
}
