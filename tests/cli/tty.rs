//! `capexec run -t` driven from a pseudo-terminal made by the test, as a
//! user at a terminal would drive it.

use crate::common;

use std::io::{Read, Write};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use portable_pty::{CommandBuilder, MasterPty, PtySize, native_pty_system};

use common::cli::{BIN, Served, capexec, finish, text};

const DEADLINE: Duration = Duration::from_secs(60);

/// capexec running on a terminal of ours.
struct OnTerminal {
    master: Box<dyn MasterPty + Send>,
    input: Box<dyn Write + Send>,
    output: mpsc::Receiver<Vec<u8>>,
    seen: Vec<u8>,
    child: Box<dyn portable_pty::Child + Send + Sync>,
    /// The terminal's settings before capexec started.
    initial: libc::termios,
}

impl OnTerminal {
    fn start(rows: u16, cols: u16, args: &[&str]) -> OnTerminal {
        OnTerminal::start_with_term(rows, cols, args, "xterm")
    }

    /// The same on a terminal of type `term` (capexec's TERM).
    fn start_with_term(rows: u16, cols: u16, args: &[&str], term: &str) -> OnTerminal {
        OnTerminal::spawn(rows, cols, args, |command| command.env("TERM", term))
    }

    /// capexec with `configure` applied to its command.
    fn spawn(
        rows: u16,
        cols: u16,
        args: &[&str],
        configure: impl FnOnce(&mut CommandBuilder),
    ) -> OnTerminal {
        let pair = native_pty_system()
            .openpty(PtySize {
                rows,
                cols,
                pixel_width: 0,
                pixel_height: 0,
            })
            .expect("openpty");
        let initial = termios_of(pair.master.as_ref());
        let mut command = CommandBuilder::new(BIN);
        command.args(args);
        configure(&mut command);
        // capexec leads the session of this terminal, as a login shell's
        // child would, so it gets SIGWINCH when the size changes.
        let child = pair.slave.spawn_command(command).expect("spawn capexec");
        drop(pair.slave);
        let mut reader = pair.master.try_clone_reader().expect("reader");
        let (sender, output) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 || sender.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        let input = pair.master.take_writer().expect("writer");
        OnTerminal {
            master: pair.master,
            input,
            output,
            seen: Vec::new(),
            child,
            initial,
        }
    }

    /// Waits until the terminal has shown `needle`.
    fn expect(&mut self, needle: &str) {
        let deadline = Instant::now() + DEADLINE;
        while !text(&self.seen).contains(needle) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.output.recv_timeout(left) {
                Ok(bytes) => self.seen.extend(bytes),
                Err(_) => panic!(
                    "never saw {needle:?}; the terminal shows {:?}",
                    text(&self.seen)
                ),
            }
        }
    }

    fn type_keys(&mut self, keys: &[u8]) {
        self.input.write_all(keys).expect("type");
        self.input.flush().expect("flush");
    }

    fn wait(&mut self) -> u32 {
        let status = common::eventually("capexec exits", || {
            let status = self.child.try_wait().expect("wait");
            while let Ok(bytes) = self.output.try_recv() {
                self.seen.extend(bytes);
            }
            status
        });
        status.exit_code()
    }

    fn settings(&self) -> libc::termios {
        termios_of(self.master.as_ref())
    }
}

fn termios_of(master: &dyn MasterPty) -> libc::termios {
    let fd = master.as_raw_fd().expect("master fd");
    // SAFETY: tcgetattr fills the zeroed termios for an open terminal.
    unsafe {
        let mut termios: libc::termios = std::mem::zeroed();
        assert_eq!(libc::tcgetattr(fd, &mut termios), 0, "tcgetattr");
        termios
    }
}

/// The parts of the terminal settings raw mode changes.
fn modes(termios: &libc::termios) -> (u32, u32, u32, u32, Vec<u8>) {
    (
        termios.c_iflag,
        termios.c_oflag,
        termios.c_cflag,
        termios.c_lflag,
        termios.c_cc.to_vec(),
    )
}

fn ctrl_c_reaches_the_remote_command_and_the_terminal_is_restored(extra: &[&str]) {
    let script = "stty size; trap 'echo INTERRUPTED; exit 9' INT; echo ready; \
                  while :; do sleep 0.01; done";
    let mut args = vec!["run"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["-t", "--", "sh", "-c", script]);
    let mut terminal = OnTerminal::start(33, 101, &args);
    let before = modes(&terminal.initial);
    terminal.expect("33 101\r\n");
    terminal.expect("ready");
    let during = terminal.settings();
    assert_eq!(
        during.c_lflag & libc::ICANON,
        0,
        "our terminal is in raw mode while the command runs"
    );
    // In raw mode Ctrl-C is a byte; the remote terminal turns it into SIGINT.
    terminal.type_keys(b"\x03");
    terminal.expect("INTERRUPTED");
    assert_eq!(terminal.wait(), 9);
    assert_eq!(
        modes(&terminal.settings()),
        before,
        "terminal settings restored"
    );
}

#[test]
fn embedded_tty_shows_the_size_passes_ctrl_c_and_restores_the_terminal() {
    ctrl_c_reaches_the_remote_command_and_the_terminal_is_restored(&[]);
}

#[test]
fn remote_tty_shows_the_size_passes_ctrl_c_and_restores_the_terminal() {
    let served = Served::start();
    ctrl_c_reaches_the_remote_command_and_the_terminal_is_restored(&["--connect", &served.unix]);
}

#[test]
fn keystrokes_and_resizes_reach_the_remote_terminal() {
    let script = "trap 'stty size' WINCH; echo ready; IFS= read -r line; echo \"got:$line\"; \
                  IFS= read -r _; exit 3";
    let mut terminal = OnTerminal::start(24, 80, &["run", "-t", "--", "sh", "-c", script]);
    terminal.expect("ready");
    terminal.type_keys(b"hello\r");
    terminal.expect("got:hello");
    terminal
        .master
        .resize(PtySize {
            rows: 40,
            cols: 120,
            pixel_width: 0,
            pixel_height: 0,
        })
        .expect("resize");
    terminal.expect("40 120\r\n");
    terminal.type_keys(b"\r");
    assert_eq!(terminal.wait(), 3);
}

#[test]
fn errors_leave_the_terminal_as_it_was() {
    let mut terminal = OnTerminal::start(24, 80, &["run", "-t", "--", "capexec-no-such-program"]);
    let before = modes(&terminal.initial);
    assert_eq!(terminal.wait(), 127);
    terminal.expect("capexec: program not found: capexec-no-such-program\r\n");
    assert_eq!(modes(&terminal.settings()), before);
}

#[test]
fn without_a_local_terminal_the_remote_one_is_24x80_or_given() {
    let default = finish(capexec(&["run", "-t", "-n", "--", "stty", "size"]), None);
    assert_eq!(default.code, 0);
    assert_eq!(default.stdout, b"24 80\r\n");
    let sized = finish(
        capexec(&["run", "-t", "--size", "30x100", "-n", "--", "stty", "size"]),
        None,
    );
    assert_eq!(sized.stdout, b"30 100\r\n");
    let bad = finish(capexec(&["run", "-t", "--size", "30", "--", "true"]), None);
    assert_eq!(bad.code, 125);
    assert_eq!(
        text(&bad.stderr),
        "capexec: --size expects ROWSxCOLS (for example 24x80), got \"30\"\n"
    );
}

#[test]
fn a_signal_to_capexec_or_a_lost_server_also_restores_the_terminal() {
    // SIGTERM to capexec goes to the command; capexec reports its death.
    let mut terminal = OnTerminal::start(
        24,
        80,
        &["run", "-t", "--", "sh", "-c", "echo ready; exec sleep 1000"],
    );
    let before = modes(&terminal.initial);
    terminal.expect("ready");
    let pid = terminal.child.process_id().expect("pid") as i32;
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    assert_eq!(terminal.wait(), 128 + libc::SIGTERM as u32);
    assert_eq!(modes(&terminal.settings()), before);

    // The server dies mid-run: one line, exit 125, terminal restored.
    let mut served = Served::start();
    let mut terminal = remote_terminal(&served, "echo \"pid-$$-\"; exec sleep 1000");
    let before = modes(&terminal.initial);
    terminal.expect("-\r\n");
    let shown = text(&terminal.seen);
    let orphan = common::pid_after(&shown, "pid-") as i32;
    served.child.kill().expect("kill the server");
    let _ = served.child.wait();
    assert_eq!(terminal.wait(), 125);
    terminal.expect("capexec: lost the command");
    assert_eq!(modes(&terminal.settings()), before);
    // A server killed outright cannot clean up; do not leave its child.
    // SAFETY: kill(2) on a process this test started.
    unsafe { libc::kill(orphan, libc::SIGKILL) };
}

/// Like `ssh -t`, the remote command gets our terminal's type, not the
/// server's (capexec serve runs here with another TERM).
#[test]
fn the_terminal_type_is_ours() {
    let served = Served::start();
    let mut terminal = OnTerminal::start_with_term(
        24,
        80,
        &[
            "run",
            "--connect",
            &served.unix,
            "-t",
            "--",
            "sh",
            "-c",
            "echo \"term=$TERM.\"",
        ],
        "capexec-test-term",
    );
    assert_eq!(terminal.wait(), 0);
    terminal.expect("term=capexec-test-term.\r\n");
    // An explicit -e TERM=... wins, as it would locally.
    let mut terminal = OnTerminal::start_with_term(
        24,
        80,
        &[
            "run",
            "-t",
            "-e",
            "TERM=dumb",
            "--",
            "sh",
            "-c",
            "echo \"term=$TERM.\"",
        ],
        "capexec-test-term",
    );
    assert_eq!(terminal.wait(), 0);
    terminal.expect("term=dumb.\r\n");
}

/// The remote pid a script printed as `pid-N-`.
fn remote_pid(terminal: &mut OnTerminal) -> u32 {
    terminal.expect("-\r\n");
    common::pid_after(&text(&terminal.seen), "pid-")
}

/// `capexec run -t` of a shell `script` on `served`, on a terminal of ours.
fn remote_terminal(served: &Served, script: &str) -> OnTerminal {
    OnTerminal::start(
        24,
        80,
        &[
            "run",
            "--connect",
            &served.unix,
            "-t",
            "--",
            "sh",
            "-c",
            script,
        ],
    )
}

/// `~.` after a newline ends a session whatever the command does, as in
/// ssh; the command is terminated and the terminal restored.
#[test]
fn tilde_dot_ends_the_session() {
    let served = Served::start();
    let mut terminal = remote_terminal(&served, "echo \"pid-$$-\"; exec sleep 1000");
    let before = modes(&terminal.initial);
    let pid = remote_pid(&mut terminal);
    terminal.type_keys(b"\r~.");
    assert_eq!(terminal.wait(), 125);
    terminal.expect("capexec: ~.: ended the session; the command was terminated\r\n");
    assert_eq!(modes(&terminal.settings()), before);
    common::run_on_runtime(common::procfs::wait_gone(pid));
}

/// SIGTERM to capexec ends a `-t` session even when the command ignores
/// SIGTERM (an interactive shell does), as closing ssh's terminal would.
#[test]
fn sigterm_ends_a_terminal_session_whose_command_ignores_it() {
    let served = Served::start();
    let mut terminal = remote_terminal(
        &served,
        "trap '' TERM; echo \"pid-$$-\"; while :; do sleep 0.05; done",
    );
    let before = modes(&terminal.initial);
    let pid = remote_pid(&mut terminal);
    let capexec = terminal.child.process_id().expect("pid") as i32;
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(capexec, libc::SIGTERM) }, 0);
    assert_eq!(terminal.wait(), 128 + libc::SIGTERM as u32);
    terminal.expect(
        "capexec: SIGTERM received: stopped waiting for the command; the command was \
         terminated\r\n",
    );
    assert_eq!(modes(&terminal.settings()), before);
    common::run_on_runtime(common::procfs::wait_gone(pid));
}

/// A note printed while the command's output stopped mid-line (a shell
/// prompt) starts on a line of its own.
#[test]
fn notes_start_on_a_fresh_line() {
    let mut served = Served::start();
    let mut terminal = remote_terminal(&served, "printf 'prompt$ '; exec sleep 1000");
    terminal.expect("prompt$ ");
    served.child.kill().expect("kill the server");
    let _ = served.child.wait();
    assert_eq!(terminal.wait(), 125);
    terminal.expect("prompt$ \r\ncapexec: lost the command: the server closed the connection\r\n");
}

/// `capexec shell` (and `run` with no program) starts the executor's
/// shell on a terminal, as `ssh HOST` does.
#[test]
fn shell_starts_the_executors_shell_on_a_terminal() {
    let served = Served::start();
    for args in [
        vec!["shell", "--connect", served.unix.as_str()],
        vec!["run", "--connect", served.unix.as_str()],
    ] {
        let mut terminal = OnTerminal::start(24, 80, &args);
        terminal.type_keys(b"test -t 0 && echo on-a-tty-$((40+2))\r");
        terminal.expect("on-a-tty-42");
        terminal.type_keys(b"exit 3\r");
        assert_eq!(terminal.wait(), 3);
    }
}

/// `-it`, as docker and kubectl users type it.
#[test]
fn dash_it_runs_on_a_terminal() {
    let mut terminal = OnTerminal::start(
        24,
        80,
        &[
            "run",
            "-it",
            "--",
            "sh",
            "-c",
            "test -t 0 && echo interactive-tty",
        ],
    );
    assert_eq!(terminal.wait(), 0);
    terminal.expect("interactive-tty\r\n");
}

/// Trust on first use at a terminal: the fingerprint is shown and asked
/// about; "no" refuses and remembers nothing, "yes" connects and remembers.
#[test]
fn an_unknown_certificate_is_asked_about_on_the_terminal() {
    let served = Served::start_with(&["--tls-self-signed"]);
    let cert = served.home.path().join(".config/capexec/server-cert.pem");
    let fingerprint = capexec::net::TlsServer::certificate_fingerprint(&cert).expect("cert");
    let known = served.home.path().join(".config/capexec/known-servers");
    let token = served.token_arg();
    let args = [
        "run",
        "--connect",
        &served.tcp,
        "--token-file",
        &token,
        "--tls",
        "--",
        "echo",
        "asked",
    ];
    let home = served.home.path().to_path_buf();
    let start = || {
        OnTerminal::spawn(24, 80, &args, |command| {
            command.env("HOME", &home);
            command.env_remove("XDG_CONFIG_HOME");
            command.env_remove("CAPEXEC_TOKEN");
            command.env_remove("CAPEXEC_CONNECT");
        })
    };
    let mut refused = start();
    refused.expect(&format!("Its SHA-256 fingerprint is {fingerprint}."));
    refused.expect("(yes/no) ");
    refused.type_keys(b"no\r");
    refused.expect("was not trusted; nothing was sent to it");
    assert_eq!(refused.wait(), 125);
    assert!(!known.exists());

    let mut accepted = start();
    accepted.expect("(yes/no) ");
    accepted.type_keys(b"yes\r");
    accepted.expect("asked");
    assert_eq!(accepted.wait(), 0);
    let remembered = std::fs::read_to_string(&known).expect("known-servers");
    assert!(
        remembered.ends_with(&format!("{} {fingerprint}\n", served.tcp)),
        "{remembered}"
    );
}

/// Ctrl-C at the trust-on-first-use question ends capexec at once (130),
/// with its line on a line of its own and nothing remembered; `run` and
/// `forward` alike.
#[test]
fn ctrl_c_at_the_certificate_question_ends_capexec_at_once() {
    let served = Served::start_with(&["--tls-self-signed"]);
    let known = served.home.path().join(".config/capexec/known-servers");
    let token = served.token_arg();
    let home = served.home.path().to_path_buf();
    let start = |args: &[&str]| {
        OnTerminal::spawn(24, 80, args, |command| {
            command.env("HOME", &home);
            command.env_remove("XDG_CONFIG_HOME");
            command.env_remove("CAPEXEC_TOKEN");
            command.env_remove("CAPEXEC_CONNECT");
        })
    };
    let connect = ["--connect", &served.tcp, "--token-file", &token, "--tls"];
    let run: Vec<&str> = ["run"]
        .iter()
        .chain(&connect)
        .chain(&["--", "echo", "asked"])
        .copied()
        .collect();
    let forward: Vec<&str> = ["forward"]
        .iter()
        .chain(&connect)
        .chain(&["-L", "127.0.0.1:0:127.0.0.1:9"])
        .copied()
        .collect();
    for (args, line) in [
        (
            run,
            "capexec: SIGINT: stopped before the command started\r\n",
        ),
        (forward, "capexec: SIGINT: stopped before forwarding\r\n"),
    ] {
        let mut asked = start(&args);
        asked.expect("(yes/no) ");
        asked.type_keys(b"\x03");
        // The terminal turns the question's "\r\n" into "\r\r\n" (ONLCR).
        asked.expect(&format!("(yes/no) ^C\r\r\n{line}"));
        assert_eq!(asked.wait(), 130, "{}", text(&asked.seen));
        assert!(!known.exists());
    }
}

/// An upgrade of the server in the middle of a terminal session: the
/// client with --resume reconnects, and keystrokes, resizes and the exit
/// status go on as before.
#[test]
fn a_terminal_session_goes_on_across_an_upgrade() {
    let served = crate::upgrade::Upgradable::start();
    let script = "trap 'stty size' WINCH; echo ready; IFS= read -r line; echo \"got:$line\"; \
                  IFS= read -r line; echo \"then:$line\"; IFS= read -r _; exit 3";
    let home = served.dir.path().to_path_buf();
    let args = [
        "run",
        "--connect",
        &served.unix,
        "--resume",
        "60",
        "-t",
        "--",
        "sh",
        "-c",
        script,
    ];
    let mut terminal = OnTerminal::spawn(24, 80, &args, |command| {
        command.env("HOME", &home);
        command.env("TERM", "xterm");
    });
    terminal.expect("ready");
    terminal.type_keys(b"hello\r");
    terminal.expect("got:hello");
    let upgraded = served.upgrade();
    assert_eq!(upgraded.code, 0, "{}", text(&upgraded.stderr));
    terminal.expect("reconnected; the command carries on");
    terminal.type_keys(b"world\r");
    terminal.expect("then:world");
    terminal
        .master
        .resize(PtySize {
            rows: 40,
            cols: 120,
            pixel_width: 0,
            pixel_height: 0,
        })
        .expect("resize");
    terminal.expect("40 120\r\n");
    terminal.type_keys(b"\r");
    assert_eq!(terminal.wait(), 3);
}
