//! Running the `capexec` binary from tests.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::data::TempDir;

pub const BIN: &str = env!("CARGO_BIN_EXE_capexec");
const DEADLINE: Duration = Duration::from_secs(60);

pub struct Finished {
    pub code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

pub fn capexec(args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command.args(args);
    command
}

/// Runs to completion, feeding `stdin` from a thread, within the deadline.
pub fn finish(mut command: Command, stdin: Option<Vec<u8>>) -> Finished {
    command
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("run capexec");
    let feeder = stdin.map(|data| {
        let mut pipe = child.stdin.take().expect("stdin");
        std::thread::spawn(move || {
            let _ = pipe.write_all(&data);
        })
    });
    let stdout = drain(child.stdout.take().expect("stdout"));
    let stderr = drain(child.stderr.take().expect("stderr"));
    let code = wait(&mut child);
    if let Some(feeder) = feeder {
        feeder.join().expect("stdin feeder");
    }
    Finished {
        code,
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    }
}

fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        bytes
    })
}

/// Waits within the deadline; the exit code, or 128 + signal like a shell.
pub fn wait(child: &mut Child) -> i32 {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status
                .code()
                .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("did not finish within {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Starts `command` with stdout piped and stderr discarded, and returns it
/// once it has printed its first line.
pub fn spawn_until_first_line(mut command: Command) -> (Child, String) {
    command.stderr(Stdio::null());
    spawn_reading_first_line(command)
}

/// The same, leaving stderr where `command` sends it.
pub fn spawn_reading_first_line(mut command: Command) -> (Child, String) {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read the first line");
    (child, line)
}

/// Sends `signal` to a child.
pub fn kill(child: &Child, signal: libc::c_int) {
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
}

/// A `capexec serve` child with a Unix and a TCP listener.
pub struct Served {
    pub child: Child,
    pub unix: String,
    pub tcp: String,
    pub token_file: PathBuf,
    pub socket: PathBuf,
    pub home: TempDir,
}

impl Served {
    pub fn start() -> Served {
        Served::start_with(&[])
    }

    /// The same with `extra` arguments for `capexec serve`.
    pub fn start_with(extra: &[&str]) -> Served {
        Served::start_limited(extra, None)
    }

    /// The same with a descriptor limit (soft and hard) of `descriptors`.
    pub fn start_limited(extra: &[&str], descriptors: Option<u64>) -> Served {
        let home = TempDir::new("cli-serve");
        let socket = home.path().join("capexec.sock");
        let token_file = home.path().join("token");
        let mut command = Command::new(BIN);
        if let Some(limit) = descriptors {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is async-signal-safe.
            unsafe {
                command.pre_exec(move || {
                    let limit = libc::rlimit {
                        rlim_cur: limit,
                        rlim_max: limit,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = command
            .args(["serve", "--listen"])
            .arg(format!("unix:{}", socket.display()))
            .args(["--listen", "tcp:127.0.0.1:0", "--token-file"])
            .arg(&token_file)
            .args(extra)
            .env("HOME", home.path())
            .env_remove("XDG_CONFIG_HOME")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start capexec serve");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let unix = lines.next().expect("unix line").expect("read");
        let tcp = lines.next().expect("tcp line").expect("read");
        assert_eq!(unix, format!("unix:{}", socket.display()));
        assert!(
            tcp.starts_with("tcp:127.0.0.1:") && !tcp.ends_with(":0"),
            "{tcp}"
        );
        Served {
            child,
            unix,
            tcp,
            token_file,
            socket,
            home,
        }
    }

    /// `capexec run` with a clean environment that has no default token.
    pub fn run(&self, args: &[&str]) -> Command {
        self.command("run", args)
    }

    /// Another `capexec` subcommand, with the same clean environment.
    pub fn command(&self, subcommand: &str, args: &[&str]) -> Command {
        let mut command = Command::new(BIN);
        command
            .arg(subcommand)
            .args(args)
            .env("HOME", self.home.path())
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("CAPEXEC_TOKEN");
        command
    }

    pub fn token_arg(&self) -> String {
        self.token_file.display().to_string()
    }

    /// The token TCP logins need.
    pub fn token(&self) -> capexec::net::Token {
        capexec::net::Token::load(&self.token_file).expect("token")
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
