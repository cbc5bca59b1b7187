//! What `capexec serve` refuses to do: follow a symbolic link where its
//! socket should be, or write secrets (tokens, stdin, output, environment
//! values) to its log, even at the most verbose level.

use crate::common;

use std::process::{Command, Stdio};

use common::cli::{
    capexec, finish, kill, spawn_reading_first_line, spawn_until_first_line, text, wait,
};
use common::data::TempDir;

#[test]
fn a_symlinked_socket_path_is_refused_and_left_alone() {
    let dir = TempDir::new("symlink-socket");
    let target = dir.path().join("elsewhere");
    std::fs::write(&target, b"not yours").expect("write");
    let link = dir.path().join("capexec.sock");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    let refused = finish(
        capexec(&["serve", "--listen", &format!("unix:{}", link.display())]),
        None,
    );
    assert_eq!(refused.code, 125);
    assert_eq!(
        text(&refused.stderr),
        format!(
            "capexec: cannot listen on unix:{}: {} is a symbolic link; not removing it\n",
            link.display(),
            link.display()
        )
    );
    assert!(
        std::fs::symlink_metadata(&link)
            .expect("link")
            .file_type()
            .is_symlink()
    );
    assert_eq!(std::fs::read(&target).expect("target"), b"not yours");
}

#[test]
fn secrets_never_reach_the_log_even_at_trace_level() {
    let dir = TempDir::new("quiet-log");
    let token_file = dir.path().join("token");
    let log = dir.path().join("server.log");
    let mut serve = capexec(&["serve", "--listen", "tcp:127.0.0.1:0", "--token-file"]);
    serve
        .arg(&token_file)
        .env("RUST_LOG", "trace")
        .stderr(Stdio::from(std::fs::File::create(&log).expect("log file")));
    let (mut server, address) = spawn_reading_first_line(serve);
    let token = std::fs::read_to_string(&token_file).expect("token");
    let mut run = Command::new(common::cli::BIN);
    run.args(["run", "--connect", address.trim(), "--token-file"])
        .arg(&token_file)
        .args([
            "--env",
            "SECRET_ENV=marker-env-7f3a",
            "--",
            "sh",
            "-c",
            "cat; echo marker-out-7f3a; printenv SECRET_ENV",
        ]);
    let ran = finish(run, Some(b"marker-stdin-7f3a\n".to_vec()));
    assert_eq!(
        text(&ran.stdout),
        "marker-stdin-7f3a\nmarker-out-7f3a\nmarker-env-7f3a\n"
    );
    kill(&server, libc::SIGTERM);
    assert_eq!(wait(&mut server), 0);
    let logged = std::fs::read_to_string(&log).expect("read the log");
    assert!(
        logged.contains("connected"),
        "the log is not verbose: {logged}"
    );
    for secret in [
        token.trim(),
        "marker-stdin-7f3a",
        "marker-out-7f3a",
        "marker-env-7f3a",
    ] {
        assert!(!logged.contains(secret), "{secret:?} is in the log");
    }
}

/// The server raises its own descriptor limit, but its children start with
/// the limit it was given (a huge soft limit slows programs that close
/// every descriptor up to it).
#[test]
fn children_keep_the_descriptor_limit_the_server_was_given() {
    use std::os::unix::process::CommandExt;
    let dir = TempDir::new("nofile");
    let socket = format!("unix:{}", dir.path().join("capexec.sock").display());
    let mut serve = capexec(&["serve", "--listen", &socket]);
    // SAFETY: setrlimit is async-signal-safe.
    unsafe {
        serve.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 256,
                rlim_max: 4096,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (mut server, address) = spawn_until_first_line(serve);
    let server_limit = std::fs::read_to_string(format!("/proc/{}/limits", server.id()))
        .expect("limits")
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .map(|line| line.split_whitespace().nth(3).unwrap_or("").to_string());
    assert_eq!(
        server_limit.as_deref(),
        Some("4096"),
        "the server raised its own"
    );
    let ran = finish(
        capexec(&[
            "run",
            "--connect",
            address.trim(),
            "--",
            "sh",
            "-c",
            "ulimit -n",
        ]),
        None,
    );
    assert_eq!(text(&ran.stdout), "256\n");
    kill(&server, libc::SIGTERM);
    assert_eq!(wait(&mut server), 0);
}

/// A `--max-processes` the descriptor limit cannot carry stops the server
/// at start with one line saying what it carries; a short token too.
#[test]
fn limits_and_tokens_the_server_cannot_honour_are_refused_at_start() {
    use std::os::unix::process::CommandExt;
    let dir = TempDir::new("refused-at-start");
    let socket = format!("unix:{}", dir.path().join("s.sock").display());
    let mut command = capexec(&["serve", "--listen", &socket, "--max-processes", "1000"]);
    // SAFETY: setrlimit is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 256,
                rlim_max: 256,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let refused = finish(command, None);
    let stderr = text(&refused.stderr);
    assert_eq!(refused.code, 125, "{stderr}");
    let carried: u64 = stderr
        .split("it carries at most ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no count in {stderr:?}"));
    assert!(carried > 0 && carried < 64, "{stderr}");
    assert!(
        stderr.starts_with("capexec: --max-processes 1000 needs about ")
            && stderr.contains(" descriptors, but the descriptor limit is 256: ")
            && stderr.ends_with(&format!(
                "(raise it with ulimit -n, or give --max-processes {carried} or less)\n"
            )),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");

    let token = dir.path().join("token");
    std::fs::write(&token, "short\n").expect("write");
    let mut command = capexec(&["serve", "--listen", "tcp:127.0.0.1:0", "--token-file"]);
    command.arg(&token);
    let tcp = finish(command, None);
    assert_eq!(
        (tcp.code, text(&tcp.stderr)),
        (
            125,
            format!(
                "capexec: token file {} holds a token of 5 bytes; a token needs at least 16 \
                 (remove the file and a new random one is made)\n",
                token.display()
            )
        )
    );
}
