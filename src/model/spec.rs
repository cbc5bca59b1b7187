//! What to start: the validated description of one process.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use crate::model::{Flow, Limits, PtySize, Refusal, RefusalKind, Sandbox, excerpt};

/// How the child's environment is built: start from the server's (or empty),
/// remove `unset`, then apply `set` in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnvSpec {
    pub clear: bool,
    pub unset: Vec<OsString>,
    pub set: Vec<(OsString, OsString)>,
}

/// Everything needed to start one process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StartSpec {
    pub argv: Vec<OsString>,
    /// `None` (or empty): the server's working directory.
    pub cwd: Option<PathBuf>,
    pub env: EnvSpec,
    /// What the child sees as `argv[0]`, if not `argv[0]` itself.
    pub arg0: Option<OsString>,
    pub tty: bool,
    /// The terminal's type for a `tty` child: its `TERM`, unless `env`
    /// sets one. Ignored without `tty`.
    pub term: Option<OsString>,
    pub pipe_stdin: bool,
    pub pty_size: PtySize,
    pub flow: Flow,
    /// Terminate the process group if the child has not exited this long
    /// after its spawn; what an exited child left running in its group
    /// (a terminal: its session) is terminated then too.
    pub timeout: Option<std::time::Duration>,
    /// Confine the process (see [`Sandbox`]); `None`: not sandboxed,
    /// unless a restricted executor's policy says otherwise.
    pub sandbox: Option<Sandbox>,
    /// Resource limits of its tree.
    pub limits: Limits,
    /// Standard descriptors the client sent over its connection, to be
    /// the child's instead of pipes (see [`PassedStdio`]).
    pub passed_stdio: Option<PassedStdio>,
}

/// Which of a child's standard descriptors the client sent over its Unix
/// connection (SCM_RIGHTS), and where they are among all it sent there:
/// numbered from 0 in the order sent, stdin, stdout, stderr following from
/// `first` (those that are `true`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassedStdio {
    pub first: u64,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
}

impl PassedStdio {
    /// How many descriptors these are.
    pub fn count(&self) -> u64 {
        u64::from(self.stdin) + u64::from(self.stdout) + u64::from(self.stderr)
    }
}

/// Most bytes of argv and environment a client may send: half of Linux's
/// usual ARG_MAX (2 MiB), which the server's own environment shares.
pub const MAX_ARGUMENT_BYTES: usize = 1 << 20;

impl StartSpec {
    pub fn new<I, S>(argv: I) -> StartSpec
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        StartSpec {
            argv: argv.into_iter().map(Into::into).collect(),
            ..StartSpec::default()
        }
    }

    /// Rejects what the operating system could not take, with the reason.
    pub fn validate(&self) -> Result<(), Refusal> {
        let invalid = |message: String| Err(Refusal::new(RefusalKind::InvalidArgument, message));
        if self.argv.is_empty() {
            return invalid("argv must not be empty".into());
        }
        if self.argv[0].is_empty() {
            return invalid("argv[0] (the program) must not be empty".into());
        }
        for (index, arg) in self.argv.iter().enumerate() {
            if has_nul(arg) {
                return invalid(format!("argv[{index}] contains a NUL byte"));
            }
        }
        if let Some(arg0) = &self.arg0
            && has_nul(arg0)
        {
            return invalid("arg0 contains a NUL byte".into());
        }
        if let Some(cwd) = &self.cwd
            && has_nul(cwd.as_os_str())
        {
            return invalid("cwd contains a NUL byte".into());
        }
        for name in &self.env.unset {
            check_env_name(name)?;
        }
        for (name, value) in &self.env.set {
            check_env_name(name)?;
            if has_nul(value) {
                return invalid(format!(
                    "the value of environment variable {} contains a NUL byte",
                    excerpt(&name.to_string_lossy())
                ));
            }
        }
        let size = self.argument_bytes();
        if size > MAX_ARGUMENT_BYTES {
            return Err(Refusal::new(
                RefusalKind::LimitReached,
                format!(
                    "argv and environment take {size} bytes; the limit is {MAX_ARGUMENT_BYTES}"
                ),
            ));
        }
        if let Some(term) = &self.term
            && let Some(problem) = term_problem(term)
        {
            return invalid(format!(
                "terminal type {:?} {problem}",
                term.to_string_lossy()
            ));
        }
        if let Err(why) = self.limits.validate() {
            return invalid(format!("limits: {why}"));
        }
        if self.tty && (self.pty_size.rows == 0 || self.pty_size.cols == 0) {
            return invalid(format!(
                "pty size {}x{} is empty; rows and cols must be at least 1",
                self.pty_size.rows, self.pty_size.cols
            ));
        }
        Ok(())
    }

    /// What the client's argv, arg0 and environment take as the kernel
    /// counts them (each string with its terminating NUL; `NAME=VALUE`).
    fn argument_bytes(&self) -> usize {
        let strings = self.argv.iter().chain(self.arg0.as_ref());
        let args: usize = strings.map(|arg| arg.len() + 1).sum();
        let env: usize = self
            .env
            .set
            .iter()
            .map(|(name, value)| name.len() + value.len() + 2)
            .sum();
        args + env
    }

    /// The working directory to use, if not the server's.
    pub fn effective_cwd(&self) -> Option<&PathBuf> {
        self.cwd.as_ref().filter(|cwd| !cwd.as_os_str().is_empty())
    }
}

/// Longest terminal type accepted; terminfo names are short.
const MAX_TERM_BYTES: usize = 128;

/// What makes `term` unusable as a terminal type, if anything: terminfo
/// looks names up as file names, so no `/`, and nothing unprintable.
fn term_problem(term: &OsStr) -> Option<&'static str> {
    let bytes = term.as_bytes();
    if bytes.is_empty() {
        Some("is empty")
    } else if bytes.len() > MAX_TERM_BYTES {
        Some("is too long (at most 128 bytes)")
    } else if !bytes
        .iter()
        .all(|b| b.is_ascii_graphic() && !matches!(b, b'/' | b'\\' | b'='))
    {
        Some("may hold only printable ASCII, without '/', '\\' or '='")
    } else {
        None
    }
}

fn has_nul(text: &OsStr) -> bool {
    text.as_bytes().contains(&0)
}

/// What is wrong with `name` as an environment variable name, if anything.
pub(crate) fn env_name_problem(name: &OsStr) -> Option<&'static str> {
    if name.is_empty() {
        Some("an environment variable name is empty")
    } else if name.as_bytes().contains(&b'=') {
        Some("contains '='")
    } else if has_nul(name) {
        Some("contains a NUL byte")
    } else {
        None
    }
}

fn check_env_name(name: &OsStr) -> Result<(), Refusal> {
    match env_name_problem(name) {
        None => Ok(()),
        Some(problem) if name.is_empty() => Err(Refusal::new(
            RefusalKind::InvalidArgument,
            problem.to_string(),
        )),
        Some(problem) => Err(Refusal::new(
            RefusalKind::InvalidArgument,
            format!(
                "environment variable name {:?} {problem}",
                excerpt(&name.to_string_lossy())
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_problem() {
        let kind_and_message = |spec: StartSpec| {
            let error = spec.validate().expect_err("invalid spec");
            (error.kind, error.message)
        };
        assert_eq!(
            kind_and_message(StartSpec::new(Vec::<OsString>::new())),
            (
                RefusalKind::InvalidArgument,
                "argv must not be empty".to_string()
            )
        );
        assert_eq!(
            kind_and_message(StartSpec::new(["echo", "a\0b"])).1,
            "argv[1] contains a NUL byte"
        );
        let mut spec = StartSpec::new(["true"]);
        spec.env.set.push(("A=B".into(), "x".into()));
        assert_eq!(
            kind_and_message(spec).1,
            "environment variable name \"A=B\" contains '='"
        );
        assert!(StartSpec::new(["true"]).validate().is_ok());
    }
}
