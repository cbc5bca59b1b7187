//! `capexec serve` with restriction flags: every connection gets a
//! restricted executor, refusals reach `capexec run` as one line and exit
//! 125, and flags that cannot be resolved stop the server before it
//! listens.

use crate::common;

use common::cli::{Served, capexec, finish, text};
use common::data::TempDir;

#[test]
fn a_restricted_server_runs_only_what_its_flags_allow() {
    let root = TempDir::new("cli-restricted");
    let root_arg = root.path().display().to_string();
    let served = Served::start_with(&[
        "--allow-program",
        "sh",
        "--allow-cwd",
        &root_arg,
        "--fixed-env",
        "PATH=/usr/bin:/bin",
        "--fixed-env",
        "GREETING=hi",
        "--settable-env",
        "NAME",
        "--max-run-time",
        "1",
    ]);
    let canonical_root = std::fs::canonicalize(root.path()).expect("canonical root");
    let token = served.token_arg();

    // In policy, over both transports: the fixed environment, the settable
    // name, the working directory.
    let script = "echo \"$GREETING $NAME\"; pwd; exit 3";
    for connect in [
        vec!["--connect", served.unix.as_str()],
        vec!["--connect", served.tcp.as_str(), "--token-file", &token],
    ] {
        let mut args = connect.clone();
        args.extend([
            "--cwd", &root_arg, "--env", "NAME=you", "-n", "--", "sh", "-c", script,
        ]);
        let done = finish(served.run(&args), None);
        assert_eq!(done.code, 3, "{}", text(&done.stderr));
        assert_eq!(
            text(&done.stdout),
            format!("hi you\n{}\n", canonical_root.display())
        );
    }

    // Each rule's refusal: one line naming the flag that set it, exit 125.
    let refused = |args: &[&str], flag: &str| {
        let mut all = vec!["--connect", served.unix.as_str()];
        all.extend_from_slice(args);
        let done = finish(served.run(&all), None);
        assert_eq!(done.code, 125, "{}", text(&done.stderr));
        let stderr = text(&done.stderr);
        assert!(
            stderr.starts_with(&format!("capexec: the server's {flag}: "))
                && stderr.ends_with('\n')
                && stderr.lines().count() == 1,
            "expected one line naming {flag}, got {stderr:?}"
        );
    };
    refused(&["--cwd", &root_arg, "-n", "--", "true"], "--allow-program");
    refused(
        &["--cwd", "/", "-n", "--", "sh", "-c", "true"],
        "--allow-cwd",
    );
    refused(
        &[
            "--cwd",
            &root_arg,
            "--env",
            "PATH=/tmp",
            "-n",
            "--",
            "sh",
            "-c",
            "true",
        ],
        "--settable-env",
    );

    // The run-time limit ends what runs too long, and `run` says so as
    // timeout(1) would.
    let done = finish(
        served.run(&[
            "--connect",
            &served.unix,
            "--cwd",
            &root_arg,
            "-n",
            "--",
            "sh",
            "-c",
            "exec sleep 100",
        ]),
        None,
    );
    assert_eq!(done.code, 124, "{}", text(&done.stderr));
    assert_eq!(
        text(&done.stderr),
        "capexec: the command timed out (the executor's time limit)\n"
    );

    // Clients can tell.
    let info = finish(served.command("info", &["--connect", &served.unix]), None);
    assert_eq!(info.code, 0, "{}", text(&info.stderr));
    assert!(
        text(&info.stdout).contains("restricted"),
        "{}",
        text(&info.stdout)
    );
}

#[test]
fn restriction_flags_that_cannot_be_resolved_stop_the_server() {
    let dir = TempDir::new("cli-restricted-bad");
    let socket = format!("unix:{}", dir.path().join("s.sock").display());
    let cases: [(&[&str], &str); 3] = [
        (
            &["--allow-program", "no-such-program-anywhere"],
            "capexec: --allow-program: \"no-such-program-anywhere\" is not on the server's PATH\n",
        ),
        (
            &["--allow-cwd", "/no/such/directory"],
            "capexec: --allow-cwd: \"/no/such/directory\": No such file or directory\n",
        ),
        (
            &["--fixed-env", "NOVALUE"],
            "capexec: --fixed-env expects KEY=VALUE, got \"NOVALUE\"",
        ),
    ];
    for (flags, expected) in cases {
        let mut args = vec!["serve", "--listen", socket.as_str()];
        args.extend_from_slice(flags);
        let done = finish(capexec(&args), None);
        assert_eq!(done.code, 125, "{flags:?}: {}", text(&done.stderr));
        assert!(done.stdout.is_empty(), "nothing was listened on");
        assert!(
            text(&done.stderr).starts_with(expected),
            "{flags:?}: expected {expected:?}, got {:?}",
            text(&done.stderr)
        );
    }
    let with_upstream = finish(
        capexec(&[
            "serve",
            "--listen",
            &socket,
            "--upstream",
            "b=unix:/nonexistent.sock",
            "--allow-program",
            "sh",
        ]),
        None,
    );
    assert_eq!(with_upstream.code, 125);
    assert!(
        text(&with_upstream.stderr).contains("cannot be combined with upstreams"),
        "{}",
        text(&with_upstream.stderr)
    );
}

/// Refusals name the `capexec serve` flag that set the rule, and say why
/// a list nobody gave is empty.
#[test]
fn refusals_name_the_serve_flags() {
    let served = Served::start_with(&[
        "--allow-program",
        "sh",
        "--forbid-tty",
        "--max-running",
        "1",
    ]);
    let refused = |args: &[&str]| {
        let mut all = vec!["--connect", served.unix.as_str()];
        all.extend_from_slice(args);
        let done = finish(served.run(&all), None);
        (done.code, text(&done.stderr))
    };
    assert_eq!(
        refused(&["-e", "X=1", "-n", "--", "sh", "-c", "true"]),
        (
            125,
            "capexec: the server's --settable-env (none by default with --allow-program): \"X\" \
             may not be set or unset (settable: none)\n"
                .to_string()
        )
    );
    assert_eq!(
        refused(&["-t", "-n", "--", "sh", "-c", "true"]),
        (
            125,
            "capexec: the server's --forbid-tty: this executor does not allow terminals\n"
                .to_string()
        )
    );
    let busy = common::cli::Watched::spawn(served.run_script("echo busy; exec sleep 1000"));
    busy.wait_for_stdout("busy\n");
    let (code, stderr) = refused(&["-n", "--", "sh", "-c", "true"]);
    assert_eq!(code, 125);
    assert!(
        stderr.starts_with(
            "capexec: the server's --max-running: the limit of 1 running processes is reached"
        ),
        "{stderr}"
    );
    common::cli::kill(&busy.child, libc::SIGTERM);
    busy.finish();
}
