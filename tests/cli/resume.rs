//! `capexec run --resume`: a network cut in the middle of a run changes
//! nothing the user relies on (output bytes, stdin, exit status), apart
//! from a note on stderr.

use crate::common;

use std::io::Read;
use std::process::Stdio;
use std::time::Duration;

use common::cli::{Served, capexec, finish, text};
use common::data::TempDir;
use common::proxy::Proxy;

fn numbers(from: u32, to: u32) -> String {
    (from..=to).map(|n| format!("{n}\n")).collect()
}

#[test]
fn a_cut_during_a_resumable_run_is_invisible_in_its_output() {
    let served = Served::start();
    // Not a subreaper: the `capexec run` child is waited for here.
    common::run_on_runtime(async move {
        let dir = TempDir::new("resume");
        let proxy = Proxy::start(
            &dir.path().join("proxy.sock"),
            &served.socket,
            Duration::ZERO,
        )
        .expect("proxy");
        let (go, done) = (dir.path().join("go"), dir.path().join("done"));
        // Half the output, a pause the test controls, the other half; stdin
        // comes back at the end, so it crosses the cut as well.
        let script = format!(
            "seq 1 50000; while [ ! -e {go} ]; do sleep 0.01; done; seq 50001 100000; \
             : > {done}; cat; exit 5",
            go = go.display(),
            done = done.display()
        );
        let mut run = served.run(&[
            "--connect",
            &format!("unix:{}", proxy.path().display()),
            "--resume",
            "30",
            "--",
            "sh",
            "-c",
            &script,
        ]);
        let mut child = run
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("capexec run");
        let mut stdout = child.stdout.take().expect("stdout");
        let mut stderr = child.stderr.take().expect("stderr");
        let mut stdin = child.stdin.take().expect("stdin");
        let (seen, first_half) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut all = Vec::new();
            let mut buf = vec![0u8; 65536];
            let mut told = false;
            loop {
                match stdout.read(&mut buf) {
                    Ok(0) | Err(_) => return all,
                    Ok(n) => all.extend_from_slice(&buf[..n]),
                }
                if !told && all.ends_with(b"\n50000\n") {
                    told = true;
                    let _ = seen.send(());
                }
            }
        });
        let errors = std::thread::spawn(move || {
            let mut all = String::new();
            let _ = stderr.read_to_string(&mut all);
            all
        });
        tokio::task::spawn_blocking(move || first_half.recv_timeout(Duration::from_secs(60)))
            .await
            .expect("task")
            .expect("the first half arrived");

        proxy.cut();
        std::fs::write(&go, b"").expect("go on");
        common::eventually_async("the command is done", async || done.exists()).await;
        proxy.restore();
        // Written after the recovery began: it must arrive exactly once.
        use std::io::Write;
        stdin.write_all(b"from stdin\n").expect("stdin");
        drop(stdin);

        let code = tokio::task::spawn_blocking(move || common::cli::wait(&mut child))
            .await
            .expect("task");
        let output = reader.join().expect("stdout");
        let notes = errors.join().expect("stderr");
        assert_eq!(code, 5, "{notes}");
        assert!(
            output == format!("{}from stdin\n", numbers(1, 100000)).into_bytes(),
            "output differs from an uncut run ({} bytes)",
            output.len()
        );
        assert_eq!(
            notes,
            "capexec: connection lost: the server closed the connection; reconnecting for up \
             to 30 s\ncapexec: reconnected; the command carries on\n"
        );
    });
}

#[test]
fn resume_needs_a_connection_and_a_sane_grace() {
    let embedded = finish(capexec(&["run", "--resume", "10", "--", "true"]), None);
    assert_eq!(embedded.code, 125);
    assert_eq!(
        text(&embedded.stderr),
        "capexec: --resume needs --connect: an embedded command has no connection to lose\n"
    );
    let served = Served::start();
    let zero = finish(
        served.run(&["--connect", &served.unix, "--resume", "0", "--", "true"]),
        None,
    );
    assert_eq!(zero.code, 125);
    assert_eq!(
        text(&zero.stderr),
        "capexec: --resume needs a time above 0 (such as 30, 90s or 5m)\n"
    );
}
