//! `capexec run` never loses output without saying so: a write error on
//! its stdout or stderr (a full disk, a descriptor the caller closed) ends
//! the run with one line and a non-zero status, and the command is
//! terminated, as a local program would stop at its first failed write.

use crate::common;

use std::process::{Command, Stdio};

use common::cli::{BIN, Served, capexec, finish, text, wait};
use common::data::TempDir;

/// `capexec ARGS` run by a shell with `redirect` applied (`>/dev/full`,
/// `>&-`), stderr captured in a file, through `served` or embedded.
fn redirected(served: Option<&Served>, args: &[&str], redirect: &str) -> (i32, String) {
    let dir = TempDir::new("redirected");
    let errors = dir.path().join("stderr");
    let mut line = String::from("exec \"$0\" run");
    if let Some(served) = served {
        line.push_str(&format!(" --connect '{}'", served.unix));
    }
    for arg in args {
        line.push_str(&format!(" '{arg}'"));
    }
    line.push_str(&format!(" {redirect} 2>'{}'", errors.display()));
    let mut command = Command::new("sh");
    command.args(["-c", &line, BIN]).stdin(Stdio::null());
    if let Some(served) = served {
        command.env("HOME", served.home.path());
    }
    let mut child = command.spawn().expect("sh");
    let code = wait(&mut child);
    let stderr = std::fs::read_to_string(&errors).expect("stderr file");
    (code, stderr)
}

fn a_full_disk_ends_the_run_with_one_line(served: Option<&Served>) {
    let (code, stderr) = redirected(served, &["--", "seq", "1", "100000"], ">/dev/full");
    assert_eq!(
        (code, stderr.as_str()),
        (
            125,
            "capexec: cannot write the command's output: No space left on device\n"
        )
    );
}

#[test]
fn a_full_disk_ends_an_embedded_run_with_one_line() {
    a_full_disk_ends_the_run_with_one_line(None);
}

#[test]
fn a_full_disk_ends_a_remote_run_with_one_line() {
    a_full_disk_ends_the_run_with_one_line(Some(&Served::start()));
}

fn a_closed_stdout_ends_the_run_with_one_line(served: Option<&Served>) {
    let (code, stderr) = redirected(served, &["--", "echo", "hello"], ">&-");
    assert_eq!(
        (code, stderr.as_str()),
        (
            125,
            "capexec: cannot write the command's output: Bad file descriptor\n"
        )
    );
    // Nothing written, nothing lost: a silent command is fine.
    let (code, stderr) = redirected(served, &["--", "true"], ">&-");
    assert_eq!((code, stderr.as_str()), (0, ""));
}

#[test]
fn a_closed_stdout_ends_an_embedded_run_with_one_line() {
    a_closed_stdout_ends_the_run_with_one_line(None);
}

#[test]
fn a_closed_stdout_ends_a_remote_run_with_one_line() {
    a_closed_stdout_ends_the_run_with_one_line(Some(&Served::start()));
}

/// A command that would write for ever is terminated on the server once
/// its output cannot be written.
#[test]
fn the_command_is_terminated_when_its_output_cannot_be_written() {
    let served = Served::start();
    let dir = TempDir::new("full-disk");
    let pid_file = dir.path().join("pid");
    let script = format!(
        "echo $$ > '{}'; while :; do echo more; done",
        pid_file.display()
    );
    let (code, stderr) = redirected(Some(&served), &["--", "sh", "-c", &script], ">/dev/full");
    assert_eq!(
        (code, stderr.as_str()),
        (
            125,
            "capexec: cannot write the command's output: No space left on device\n"
        )
    );
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .expect("pid file")
        .trim()
        .parse()
        .expect("pid");
    common::run_on_runtime(common::procfs::wait_gone(pid));
}

/// A failed write to stderr is an error too (the line itself cannot be
/// written, the status says it).
#[test]
fn a_full_stderr_fails_the_run() {
    let mut command = Command::new("sh");
    command.args([
        "-c",
        "exec \"$0\" run -- sh -c 'echo oops >&2' 2>/dev/full",
        BIN,
    ]);
    let done = finish(command, None);
    assert_eq!(done.code, 125, "{}", text(&done.stderr));
}

/// `capexec info` and `environments` answer on stdout: the same rule.
#[test]
fn answers_that_cannot_be_written_fail_too() {
    let mut command = Command::new("sh");
    command.args(["-c", "exec \"$0\" info >/dev/full", BIN]);
    let done = finish(command, None);
    assert_eq!(
        (done.code, text(&done.stderr)),
        (
            125,
            "capexec: cannot write the answer: No space left on device\n".to_string()
        )
    );
    let fine = finish(capexec(&["environments"]), None);
    assert_eq!(fine.code, 0);
}

/// Where a subcommand's stdout goes in [`stdout_rule`].
enum Stdout {
    /// A pipe whose reader has gone (`| head` that has read enough).
    ReaderGone,
    /// A full disk.
    Full,
}

/// `command` run with its stdout made `stdout`: its exit status and
/// stderr.
fn with_stdout(mut command: Command, stdout: Stdout) -> (i32, String) {
    let stdout = match stdout {
        Stdout::ReaderGone => {
            let (reader, writer) = std::io::pipe().expect("pipe");
            drop(reader);
            Stdio::from(writer)
        }
        Stdout::Full => Stdio::from(
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .expect("/dev/full"),
        ),
    };
    let mut child = command
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("run capexec");
    let mut stderr = child.stderr.take().expect("stderr");
    let said = std::thread::spawn(move || {
        let mut said = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut said);
        said
    });
    // Within the deadline: `forward` would otherwise run on.
    let code = wait(&mut child);
    (code, said.join().expect("stderr reader"))
}

/// One rule for a stdout that cannot be written, in every subcommand:
/// a reader that went away ends capexec silently with 141 (as SIGPIPE
/// ends a program in a local pipeline, and as `run` ends then); any other
/// write error is one line naming what was not written, and 125.
#[test]
fn every_subcommand_has_one_rule_for_its_stdout() {
    let home = TempDir::new("stdout-rule");
    let file = home.path().join("file");
    std::fs::write(&file, "copied\n").expect("file");
    let source = format!(":{}", file.display());
    // The server's token, which client-config prints.
    let config = home.path().join(".config/capexec");
    std::fs::create_dir_all(&config).expect("config directory");
    std::fs::write(config.join("token"), "0123456789abcdef".repeat(4)).expect("token");
    std::fs::set_permissions(
        config.join("token"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .expect("chmod");
    let admin = format!("unix:{}", home.path().join("admin.sock").display());
    let served = Served::start_with(&["--admin", &admin]);
    let cases: [(&[&str], &str); 12] = [
        (&["man"], "the man pages to stdout"),
        (&["completions", "bash"], "the completion script"),
        (&["--version"], "the version"),
        (&["run", "--help"], "the help"),
        (&["servers"], "the answer"),
        (&["servers", "--json"], "the answer"),
        (&["info"], "the answer"),
        (&["environments"], "the answer"),
        (&["cp", &source, "-"], &format!("{source} to stdout")),
        (
            &["client-config", "build", "--address", "tcp:build:7000"],
            "the configuration",
        ),
        (&["ps", "--connect", &admin], "the answer"),
        (
            &[
                "forward",
                "--connect",
                &served.unix,
                "-L",
                "127.0.0.1:0:127.0.0.1:9",
            ],
            "the forward's line",
        ),
    ];
    for (args, what) in cases {
        let command = || {
            let mut command = capexec(args);
            command
                .env("HOME", home.path())
                .env_remove("XDG_CONFIG_HOME")
                .env_remove("CAPEXEC_CONNECT");
            command
        };
        assert_eq!(
            with_stdout(command(), Stdout::ReaderGone),
            (141, String::new()),
            "{args:?} to a pipe without a reader"
        );
        assert_eq!(
            with_stdout(command(), Stdout::Full),
            (
                125,
                format!("capexec: cannot write {what}: No space left on device\n")
            ),
            "{args:?} to a full disk"
        );
    }
}
