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
            limit_descriptors(&mut command, limit);
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

    /// `capexec run --connect` this server `-n -- sh -c SCRIPT`.
    pub fn run_script(&self, script: &str) -> Command {
        self.run(&["--connect", &self.unix, "-n", "--", "sh", "-c", script])
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

/// A `capexec` child whose stdout and stderr are collected as they come,
/// so that a test can wait for what it prints, then for its end.
pub struct Watched {
    pub child: Child,
    pub stdin: Option<std::process::ChildStdin>,
    stdout: Collected,
    stderr: Collected,
}

type Collected = (
    std::sync::Arc<(std::sync::Mutex<Vec<u8>>, std::sync::Condvar)>,
    Option<std::thread::JoinHandle<()>>,
);

fn collect(mut pipe: impl Read + Send + 'static) -> Collected {
    let shared =
        std::sync::Arc::new((std::sync::Mutex::new(Vec::new()), std::sync::Condvar::new()));
    let writer = std::sync::Arc::clone(&shared);
    let thread = std::thread::spawn(move || {
        let mut buf = [0u8; 65536];
        loop {
            let n = match pipe.read(&mut buf) {
                Ok(0) | Err(_) => 0,
                Ok(n) => n,
            };
            let (bytes, changed) = &*writer;
            bytes.lock().expect("lock").extend_from_slice(&buf[..n]);
            changed.notify_all();
            if n == 0 {
                return;
            }
        }
    });
    (shared, Some(thread))
}

fn wait_for_text(collected: &Collected, needle: &str, what: &str) {
    let (bytes, changed) = &*collected.0;
    let deadline = Instant::now() + DEADLINE;
    let mut seen = bytes.lock().expect("lock");
    while !text(&seen).contains(needle) {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "{what} never showed {needle:?}: {:?}",
            text(&seen)
        );
        seen = changed.wait_timeout(seen, left).expect("wait").0;
    }
}

/// A child a test let go of without waiting for it ends with the test,
/// so that no test leaves a process behind.
impl Drop for Watched {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Watched {
    /// Starts `command` with every standard stream piped.
    pub fn spawn(mut command: Command) -> Watched {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start capexec");
        let stdin = child.stdin.take();
        let stdout = collect(child.stdout.take().expect("stdout"));
        let stderr = collect(child.stderr.take().expect("stderr"));
        Watched {
            child,
            stdin,
            stdout,
            stderr,
        }
    }

    /// Waits until stdout has shown `needle`.
    pub fn wait_for_stdout(&self, needle: &str) {
        wait_for_text(&self.stdout, needle, "stdout");
    }

    /// Waits until stderr has shown `needle`.
    pub fn wait_for_stderr(&self, needle: &str) {
        wait_for_text(&self.stderr, needle, "stderr");
    }

    pub fn stdout_text(&self) -> String {
        text(&self.stdout.0.0.lock().expect("lock"))
    }

    pub fn stderr_text(&self) -> String {
        text(&self.stderr.0.0.lock().expect("lock"))
    }

    /// Waits for the end (within the deadline) and returns everything.
    pub fn finish(mut self) -> Finished {
        drop(self.stdin.take());
        let code = wait(&mut self.child);
        for reader in [self.stdout.1.take(), self.stderr.1.take()]
            .into_iter()
            .flatten()
        {
            reader.join().expect("reader");
        }
        let (stdout, stderr) = (
            std::sync::Arc::clone(&self.stdout.0),
            std::sync::Arc::clone(&self.stderr.0),
        );
        let bytes = |shared: std::sync::Arc<(std::sync::Mutex<Vec<u8>>, std::sync::Condvar)>| {
            std::mem::take(&mut *shared.0.lock().expect("lock"))
        };
        Finished {
            code,
            stdout: bytes(stdout),
            stderr: bytes(stderr),
        }
    }
}

/// Listeners that accept connections and never say a word: a server that
/// hangs, or something that is not a capexec server at all.
pub struct Silent {
    pub tcp: String,
    pub unix: String,
    accepted: std::sync::mpsc::Receiver<()>,
    _dir: TempDir,
}

impl Silent {
    pub fn start() -> Silent {
        let dir = TempDir::new("silent");
        let socket = dir.path().join("silent.sock");
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("bind tcp");
        let unix = std::os::unix::net::UnixListener::bind(&socket).expect("bind unix");
        let addresses = (
            format!("tcp:{}", tcp.local_addr().expect("address")),
            format!("unix:{}", socket.display()),
        );
        let (told, accepted) = std::sync::mpsc::channel();
        let told_too = told.clone();
        // The accepted sockets are kept (never read, never closed) for as
        // long as the test runs.
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in tcp.incoming().flatten() {
                held.push(stream);
                let _ = told.send(());
            }
        });
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in unix.incoming().flatten() {
                held.push(stream);
                let _ = told_too.send(());
            }
        });
        Silent {
            tcp: addresses.0,
            unix: addresses.1,
            accepted,
            _dir: dir,
        }
    }

    /// Waits until a connection has been accepted.
    pub fn wait_accepted(&self) {
        self.accepted
            .recv_timeout(DEADLINE)
            .expect("a connection was accepted");
    }
}

/// Asserts that `done` exited `code` having printed exactly `stdout`
/// (stderr and `context` shown otherwise).
pub fn assert_printed(done: &Finished, code: i32, stdout: &str, context: &str) {
    assert_eq!(
        (done.code, text(&done.stdout)),
        (code, stdout.to_string()),
        "{context}: {}",
        text(&done.stderr)
    );
}

/// Runs `command` under a descriptor limit (soft and hard) of `limit`.
pub fn limit_descriptors(command: &mut Command, limit: u64) {
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
