//! `capexec run` end to end: the binary, its streams, exit codes and signals.

use crate::common;

use std::io::Read;
use std::process::{Command, Stdio};

use common::cli::{BIN, capexec, finish, kill, spawn_until_first_line, text, wait};
use common::data::Pattern;

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

/// Stdin is gathered into big writes only from what is already waiting: a
/// line typed (or written by a slow producer) reaches the command at once,
/// with stdin still open, and the next one after it.
#[test]
fn a_line_on_stdin_reaches_the_command_while_stdin_stays_open() {
    use std::io::Write;
    let mut run = common::cli::Watched::spawn(capexec(&["run", "--", "cat"]));
    let mut stdin = run.stdin.take().expect("stdin");
    stdin.write_all(b"first line\n").expect("write");
    stdin.flush().expect("flush");
    run.wait_for_stdout("first line\n");
    stdin.write_all(b"second\n").expect("write");
    run.wait_for_stdout("first line\nsecond\n");
    drop(stdin);
    let done = run.finish();
    assert_eq!(done.code, 0, "{}", text(&done.stderr));
    assert_eq!(done.stdout, b"first line\nsecond\n");
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
    let (mut child, line) =
        spawn_until_first_line(capexec(&["run", "-n", "--", "sh", "-c", &script]));
    assert_eq!(line, "ready\n");
    kill(&child, signal);
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

/// A capexec started with signals ignored (as under nohup or in a background
/// job) still starts children with every signal at its default.
#[test]
fn children_do_not_inherit_ignored_signals() {
    let mut command = Command::new("sh");
    command.args([
        "-c",
        "trap '' HUP USR1 QUIT PIPE; exec \"$0\" run -n -- grep SigIgn /proc/self/status",
        BIN,
    ]);
    let done = finish(command, None);
    assert_eq!(done.code, 0, "{}", text(&done.stderr));
    let line = text(&done.stdout);
    let mask =
        u64::from_str_radix(line.trim().trim_start_matches("SigIgn:").trim(), 16).expect("mask");
    assert_eq!(mask, 0, "{line}");
}

/// A relative --cwd and a relative program name the same place as with a
/// local shell: the program is looked up inside the working directory.
#[test]
fn relative_cwd_and_relative_program_agree() {
    let dir = common::data::TempDir::new("relative");
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).expect("mkdir");
    let script = sub.join("prog");
    std::fs::write(&script, "#!/bin/sh\npwd\n").expect("script");
    std::os::unix::fs::PermissionsExt::set_mode(
        &mut std::fs::metadata(&script).expect("meta").permissions(),
        0o755,
    );
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let mut command = capexec(&["run", "--cwd", "sub", "--", "./prog"]);
    command.current_dir(dir.path());
    let done = finish(command, None);
    assert_eq!(done.code, 0, "{}", text(&done.stderr));
    let canonical = std::fs::canonicalize(&sub).expect("canonical");
    assert_eq!(text(&done.stdout).trim(), canonical.display().to_string());
}

#[test]
fn run_timeout_ends_the_command_and_exits_124() {
    let timed_out = finish(
        capexec(&["run", "--timeout", "1", "--", "sleep", "100"]),
        None,
    );
    assert_eq!(timed_out.code, 124);
    assert_eq!(
        text(&timed_out.stderr),
        "capexec: the command timed out after 1 s\n"
    );
    let in_time = finish(
        capexec(&["run", "--timeout", "60", "--", "sh", "-c", "exit 3"]),
        None,
    );
    assert_eq!(in_time.code, 3);
}

#[test]
fn run_usage_reports_cpu_time_and_peak_memory_on_stderr() {
    // The shell holds a 30 MB string and spins until it has used 0.2 s of
    // user CPU time itself.
    let script = "x=$(head -c 30000000 /dev/zero | tr '\\0' a); \
         while :; do i=0; while [ $i -lt 5000 ]; do i=$((i+1)); done; \
         read -r _ _ _ _ _ _ _ _ _ _ _ _ _ utime _ < /proc/$$/stat; \
         [ \"$utime\" -ge 20 ] && exit 4; done";
    let done = finish(capexec(&["run", "--usage", "--", "sh", "-c", script]), None);
    assert_eq!(done.code, 4);
    assert!(done.stdout.is_empty());
    let line = text(&done.stderr);
    let figures: Vec<f64> = line
        .strip_prefix("capexec: user ")
        .and_then(|rest| rest.strip_suffix(" KiB\n"))
        .map(|rest| {
            rest.split(['s', ',', ' '])
                .filter_map(|piece| piece.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(figures.len(), 3, "unexpected usage line {line:?}");
    assert!(figures[0] >= 0.2, "user CPU in {line:?}");
    assert!(figures[2] >= 30_000_000.0 / 1024.0, "peak RSS in {line:?}");
}

/// Embedded runs started at once each make their own cgroup root while
/// the others look for dead ones' roots to clean: none takes another's for
/// dead (no warning, no command killed).
#[test]
fn concurrent_embedded_runs_leave_each_other_alone() {
    let runs: Vec<_> = (0..30)
        .map(|_| {
            let mut command = capexec(&["run", "-n", "--", "sh", "-c", "sleep 0.3; echo done"]);
            command
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start capexec")
        })
        .collect();
    for run in runs {
        let output = run.wait_with_output().expect("wait");
        assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
        assert_eq!(output.stdout, b"done\n");
        assert_eq!(text(&output.stderr), "");
    }
}
