//! What `capexec serve` refuses to do: follow a symbolic link where its
//! socket should be, or write secrets (tokens, stdin, output, environment
//! values) to its log, even at the most verbose level.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::cli::{capexec, finish, kill, text, wait};
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
    let mut server = capexec(&["serve", "--listen", "tcp:127.0.0.1:0", "--token-file"])
        .arg(&token_file)
        .env("RUST_LOG", "trace")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(&log).expect("log file")))
        .spawn()
        .expect("start capexec serve");
    let mut address = String::new();
    BufReader::new(server.stdout.take().expect("stdout"))
        .read_line(&mut address)
        .expect("address");
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
