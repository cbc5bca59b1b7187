//! Nothing makes `capexec run` wait for ever: connecting and logging in
//! have a deadline, a path that goes silent is noticed within the
//! documented bound (and `--resume` recovers once it thaws), and Ctrl-C or
//! SIGTERM ends capexec within about a second whatever the server does.

use crate::common;

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::cli::{Served, Silent, Watched, kill, text};
use common::data::TempDir;
use common::proxy::Proxy;

/// `capexec run` against something that accepts and never answers.
fn silent_run(silent: &Silent, address: &str, extra: &[&str]) -> Watched {
    let mut args = vec!["run", "--connect", address];
    args.extend_from_slice(extra);
    args.extend(["-n", "--", "true"]);
    let mut command = common::cli::capexec(&args);
    command.env("CAPEXEC_TOKEN", "not-checked");
    let run = Watched::spawn(command);
    silent.wait_accepted();
    run
}

/// The default deadline (10 s) over TCP, where the login goes unanswered.
#[test]
fn a_silent_tcp_listener_fails_the_run_at_the_default_deadline() {
    let silent = Silent::start();
    let began = Instant::now();
    let done = silent_run(&silent, &silent.tcp, &[]).finish();
    let waited = began.elapsed();
    assert_eq!(
        (done.code, text(&done.stderr)),
        (
            125,
            format!(
                "capexec: cannot connect to {}: no answer within 10 s (is a capexec server \
                 listening there?)\n",
                silent.tcp
            )
        )
    );
    assert!(
        waited >= Duration::from_secs(10),
        "gave up after {waited:?}"
    );
}

/// `--connect-timeout`, over a Unix socket (no login there: the first
/// answer is what is waited for).
#[test]
fn a_silent_unix_listener_fails_the_run_at_the_given_deadline() {
    let silent = Silent::start();
    let done = silent_run(&silent, &silent.unix, &["--connect-timeout", "0.5"]).finish();
    assert_eq!(
        (done.code, text(&done.stderr)),
        (
            125,
            format!(
                "capexec: cannot connect to {}: no answer within 0.5 s (is a capexec server \
                 listening there?)\n",
                silent.unix
            )
        )
    );
}

/// Ctrl-C (or SIGTERM) while the server says nothing ends capexec at once.
#[test]
fn a_signal_ends_a_run_stuck_on_a_silent_server_at_once() {
    let silent = Silent::start();
    for (signal, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM")] {
        let run = silent_run(&silent, &silent.tcp, &["--connect-timeout", "1h"]);
        kill(&run.child, signal);
        let done = run.finish();
        assert_eq!(
            (done.code, text(&done.stderr)),
            (
                128 + signal,
                format!("capexec: {name}: stopped before the command started\n")
            )
        );
    }
}

/// A forwarded Ctrl-C that the command survives: the second one ends
/// capexec, and the command is terminated.
#[test]
fn a_second_ctrl_c_ends_capexec_and_the_command() {
    let served = Served::start();
    let script = "trap 'echo got-int' INT; echo \"pid-$$-\"; while :; do sleep 0.01; done";
    let run =
        Watched::spawn(served.run(&["--connect", &served.unix, "-n", "--", "sh", "-c", script]));
    run.wait_for_stdout("-\n");
    let pid = common::pid_after(&run.stdout_text(), "pid-");
    kill(&run.child, libc::SIGINT);
    run.wait_for_stdout("got-int\n");
    kill(&run.child, libc::SIGINT);
    let done = run.finish();
    assert_eq!(
        (done.code, text(&done.stderr)),
        (
            130,
            "capexec: SIGINT again: stopped waiting for the command; the command was \
             terminated\n"
                .to_string()
        )
    );
    common::run_on_runtime(common::procfs::wait_gone(pid));
}

/// A command that has exited while what it started in the background
/// still holds its output: a second Ctrl-C ends capexec with the command's
/// own exit status, and says so; the background is terminated.
#[test]
fn a_second_ctrl_c_after_the_exit_reports_the_commands_status() {
    let served = Served::start();
    let script = "sleep 1000 & echo \"pid-$!-\"; exit 42";
    let run = Watched::spawn(served.run(&[
        "-v",
        "--connect",
        &served.tcp,
        "--token-file",
        &served.token_arg(),
        "-n",
        "--",
        "sh",
        "-c",
        script,
    ]));
    run.wait_for_stdout("-\n");
    let background = common::pid_after(&run.stdout_text(), "pid-");
    run.wait_for_stderr(
        "capexec: debug: the command exited (exit code 42); relaying until its output ends\n",
    );
    kill(&run.child, libc::SIGINT);
    run.wait_for_stderr("capexec: debug: SIGINT forwarded to the command\n");
    kill(&run.child, libc::SIGINT);
    let done = run.finish();
    let stderr = text(&done.stderr);
    let last = stderr
        .lines()
        .filter(|line| !line.starts_with("capexec: debug: "))
        .collect::<Vec<_>>();
    assert_eq!(
        (done.code, last),
        (
            42,
            vec![
                "capexec: SIGINT again: stopped waiting for the command's output; it had exited \
                 (exit code 42); what it left running was terminated"
            ]
        ),
        "{stderr}"
    );
    common::run_on_runtime(common::procfs::wait_gone(background));
}

/// A proxy in front of `served`'s Unix socket, and `capexec run` through
/// it with `extra` arguments, started once the command has printed its
/// pid.
fn through_proxy(served: &Served, dir: &TempDir, extra: &[&str], script: &str) -> (Proxy, Watched) {
    let proxy = Proxy::start(
        &dir.path().join("proxy.sock"),
        &served.socket,
        Duration::ZERO,
    )
    .expect("proxy");
    let address = format!("unix:{}", proxy.path().display());
    let mut args = vec!["--connect", address.as_str()];
    args.extend_from_slice(extra);
    args.extend(["-n", "--", "sh", "-c", script]);
    let run = Watched::spawn(served.run(&args));
    (proxy, run)
}

/// A path that goes silent (both sockets open, nothing forwarded) is a
/// lost connection after the default 15 s of silence.
#[test]
fn a_frozen_path_is_a_lost_connection_after_the_default_keepalive() {
    let served = Served::start();
    common::run_on_runtime(async move {
        let dir = TempDir::new("frozen");
        let script = "echo \"pid-$$-\"; exec sleep 1000";
        let (proxy, run) = through_proxy(&served, &dir, &[], script);
        let run = tokio::task::spawn_blocking(move || {
            run.wait_for_stdout("-\n");
            run
        })
        .await
        .expect("task");
        let pid = common::pid_after(&run.stdout_text(), "pid-");
        proxy.set_frozen(true);
        let frozen = Instant::now();
        let done = tokio::task::spawn_blocking(move || run.finish())
            .await
            .expect("task");
        let waited = frozen.elapsed();
        assert_eq!(
            (done.code, text(&done.stderr)),
            (
                125,
                "capexec: lost the command: no answer from the server for 15 s\n".to_string()
            )
        );
        // Silent for the whole keepalive, and noticed within 1.2 times it
        // (with room for a loaded machine).
        assert!(
            waited >= Duration::from_secs(15),
            "declared lost after {waited:?}"
        );
        assert!(
            waited < Duration::from_secs(40),
            "declared lost after {waited:?}"
        );
        // Once the path thaws, the server sees the connection close and
        // ends what it held.
        proxy.set_frozen(false);
        common::procfs::wait_gone(pid).await;
    });
}

/// With `--resume`, a frozen path is recovered from once it thaws:
/// nothing lost, nothing repeated, the command's own status.
#[test]
fn a_resumable_run_recovers_once_a_frozen_path_thaws() {
    let served = Served::start();
    common::run_on_runtime(async move {
        let dir = TempDir::new("thaw");
        let go = dir.path().join("go");
        let script = format!(
            "echo first; while [ ! -e '{}' ]; do sleep 0.01; done; echo second; exit 4",
            go.display()
        );
        let extra = ["--resume", "60", "--keepalive", "1"];
        let (proxy, run) = through_proxy(&served, &dir, &extra, &script);
        let run = tokio::task::spawn_blocking(move || {
            run.wait_for_stdout("first\n");
            run
        })
        .await
        .expect("task");
        proxy.set_frozen(true);
        let run = tokio::task::spawn_blocking(move || {
            run.wait_for_stderr("reconnecting");
            run
        })
        .await
        .expect("task");
        proxy.set_frozen(false);
        std::fs::write(&go, b"").expect("go on");
        let done = tokio::task::spawn_blocking(move || run.finish())
            .await
            .expect("task");
        assert_eq!(done.code, 4, "{}", text(&done.stderr));
        assert_eq!(text(&done.stdout), "first\nsecond\n");
        assert_eq!(
            text(&done.stderr),
            "capexec: connection lost: no answer from the server for 1 s; reconnecting for up \
             to 1 min\ncapexec: reconnected; the command carries on\n"
        );
    });
}

/// A busy, healthy connection is never declared dead: with a keepalive far
/// shorter than the stall, a consumer that stops reading (so the server
/// stops sending) keeps its run, because the server answers the probes.
#[test]
fn a_stalled_consumer_keeps_its_connection() {
    let served = Served::start();
    common::run_on_runtime(async move {
        let dir = TempDir::new("stalled");
        let file = dir.path().join("big.bin");
        let len = 16 << 20;
        common::data::write_pattern_file(&file, 9, len);
        let proxy = Proxy::start(
            &dir.path().join("proxy.sock"),
            &served.socket,
            Duration::ZERO,
        )
        .expect("proxy");
        let address = format!("unix:{}", proxy.path().display());
        let script = format!("cat '{}'", file.display());
        let mut child = served
            .run(&[
                "--connect",
                &address,
                "--keepalive",
                "0.5",
                "-n",
                "--",
                "sh",
                "-c",
                &script,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("capexec run");
        // Nothing is read until the client has probed the quiet connection
        // many times over, for several times the keepalive.
        let before = proxy.calls();
        common::eventually_async("20 probes of the quiet connection", async || {
            proxy.calls() >= before + 20
        })
        .await;
        let mut stdout = child.stdout.take().expect("stdout");
        let mut stderr = child.stderr.take().expect("stderr");
        let done = tokio::task::spawn_blocking(move || {
            let mut output = Vec::new();
            stdout.read_to_end(&mut output).expect("read");
            let mut errors = String::new();
            stderr.read_to_string(&mut errors).expect("read");
            (common::cli::wait(&mut child), output, errors)
        })
        .await
        .expect("task");
        let (code, output, errors) = done;
        assert_eq!(code, 0, "{errors}");
        assert!(
            output == common::data::Pattern::bytes(9, len),
            "output differs from the file"
        );
    });
}
