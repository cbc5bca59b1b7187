//! `capexec run` end to end: the binary, its streams, exit codes and signals.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::data::Pattern;

const BIN: &str = env!("CARGO_BIN_EXE_capexec");
const DEADLINE: Duration = Duration::from_secs(60);

struct Finished {
    code: i32,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

fn capexec(args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command.args(args);
    command
}

/// Runs to completion, feeding `stdin` from a thread, within the deadline.
fn finish(mut command: Command, stdin: Option<Vec<u8>>) -> Finished {
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
    let status = wait(&mut child);
    if let Some(feeder) = feeder {
        feeder.join().expect("stdin feeder");
    }
    Finished {
        code: status,
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

/// The exit code, or 128 + signal like a shell would report.
fn wait(child: &mut Child) -> i32 {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status
                .code()
                .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("capexec did not finish within {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn exit_status_is_the_childs() {
    let done = finish(capexec(&["run", "--", "sh", "-c", "exit 7"]), None);
    assert_eq!(done.code, 7);
    let done = finish(capexec(&["run", "--", "true"]), None);
    assert_eq!(done.code, 0);
}

#[test]
fn death_by_signal_exits_128_plus_the_signal() {
    let done = finish(capexec(&["run", "--", "sh", "-c", "kill -TERM $$"]), None);
    assert_eq!(done.code, 128 + libc::SIGTERM);
    let done = finish(capexec(&["run", "--", "sh", "-c", "kill -KILL $$"]), None);
    assert_eq!(done.code, 128 + libc::SIGKILL);
}

#[test]
fn start_failures_exit_127_126_and_125_with_one_line() {
    let missing = finish(capexec(&["run", "--", "capexec-no-such-program"]), None);
    assert_eq!(missing.code, 127);
    assert_eq!(
        text(&missing.stderr),
        "capexec: program not found: capexec-no-such-program\n"
    );
    let not_executable = finish(capexec(&["run", "--", "/etc/passwd"]), None);
    assert_eq!(not_executable.code, 126);
    assert_eq!(
        text(&not_executable.stderr),
        "capexec: cannot execute /etc/passwd: Permission denied\n"
    );
    let bad_cwd = finish(
        capexec(&["run", "--cwd", "/capexec/none", "--", "true"]),
        None,
    );
    assert_eq!(bad_cwd.code, 125);
    assert_eq!(
        text(&bad_cwd.stderr),
        "capexec: working directory /capexec/none: No such file or directory\n"
    );
    let bad_env = finish(capexec(&["run", "--env", "NOEQUALS", "--", "true"]), None);
    assert_eq!(bad_env.code, 125);
    assert_eq!(
        text(&bad_env.stderr),
        "capexec: --env expects KEY=VALUE, got \"NOEQUALS\"\n"
    );
    let bad_flag = finish(capexec(&["run", "--no-such-flag", "--", "true"]), None);
    assert_eq!(bad_flag.code, 125);
    assert!(text(&bad_flag.stderr).contains("--no-such-flag"));
    let no_program = finish(capexec(&["run"]), None);
    assert_eq!(no_program.code, 125);
}

#[test]
fn stdout_and_stderr_stay_separate_and_exact() {
    let done = finish(
        capexec(&[
            "run",
            "--",
            "sh",
            "-c",
            "printf 'out\\0put'; printf err >&2; printf more",
        ]),
        None,
    );
    assert_eq!(done.code, 0);
    assert_eq!(done.stdout, b"out\0putmore");
    assert_eq!(done.stderr, b"err");
}

#[test]
fn stdin_is_forwarded_byte_for_byte_then_closed() {
    let data = Pattern::bytes(3, 8 << 20);
    let done = finish(capexec(&["run", "--", "cat"]), Some(data.clone()));
    assert_eq!(done.code, 0);
    assert!(done.stdout == data, "stdin came back altered");
    let count = finish(capexec(&["run", "--", "wc", "-c"]), Some(b"12345".to_vec()));
    assert_eq!(text(&count.stdout).trim(), "5");
}

#[test]
fn dash_n_gives_the_child_an_immediate_eof() {
    let done = finish(
        capexec(&["run", "-n", "--", "cat"]),
        Some(b"ignored".to_vec()),
    );
    assert_eq!(done.code, 0);
    assert_eq!(done.stdout, b"");
}

#[test]
fn environment_and_working_directory_options_apply() {
    let done = finish(
        capexec(&[
            "run",
            "--clear-env",
            "--env",
            "A=1=2",
            "--env",
            "B=",
            "--",
            "/usr/bin/env",
        ]),
        None,
    );
    let mut lines: Vec<String> = text(&done.stdout).lines().map(str::to_string).collect();
    lines.sort();
    assert_eq!(lines, vec!["A=1=2", "B="]);
    let pwd = finish(capexec(&["run", "--cwd", "/", "--", "pwd"]), None);
    assert_eq!(pwd.stdout, b"/\n");
    let unset = finish(
        capexec(&[
            "run",
            "--unset-env",
            "HOME",
            "--",
            "sh",
            "-c",
            "printf %s \"${HOME-unset}\"",
        ]),
        None,
    );
    assert_eq!(unset.stdout, b"unset");
}

/// Starts a child that traps `signal`, waits until it is ready, signals
/// capexec itself and returns capexec's exit status.
fn status_after_signal(signal: libc::c_int, trap: &str) -> i32 {
    let script = format!("trap 'exit 7' {trap}; echo ready; while :; do sleep 0.01; done");
    let mut child = capexec(&["run", "-n", "--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run capexec");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read ready");
    assert_eq!(line, "ready\n");
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
    wait(&mut child)
}

#[test]
fn int_term_and_hup_are_forwarded_to_the_child() {
    assert_eq!(status_after_signal(libc::SIGINT, "INT"), 7);
    assert_eq!(status_after_signal(libc::SIGTERM, "TERM"), 7);
    assert_eq!(status_after_signal(libc::SIGHUP, "HUP"), 7);
}

/// Like `yes | head -c 1`: when capexec's reader goes away the child gets
/// SIGPIPE, and capexec reports that death.
#[test]
fn a_closed_stdout_sends_sigpipe_to_the_child() {
    let mut child = capexec(&["run", "-n", "--", "yes"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run capexec");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut first = [0u8; 2];
    stdout.read_exact(&mut first).expect("read");
    assert_eq!(&first, b"y\n");
    drop(stdout);
    assert_eq!(wait(&mut child), 128 + libc::SIGPIPE);
}

#[test]
fn large_output_is_lossless() {
    let dir = common::data::TempDir::new("cli-big");
    let file = dir.path().join("big.bin");
    let len = 64 << 20;
    common::data::write_pattern_file(&file, 5, len);
    let path = file.to_str().expect("utf-8 path");
    let done = finish(capexec(&["run", "--", "cat", path]), None);
    assert_eq!(done.code, 0);
    assert_eq!(done.stdout.len(), len);
    assert!(
        done.stdout == Pattern::bytes(5, len),
        "output differs from the file"
    );
}
