//! `capexec serve` and `capexec run --connect` as separate processes.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::cli::{Served, finish, kill, spawn_until_first_line, text, wait};
use common::data::Pattern;

fn pid_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

fn wait_gone(pid: u32) {
    common::eventually(&format!("process {pid} is gone"), || !pid_exists(pid));
}

/// `capexec run --connect` of a shell that prints its pid and then runs
/// `then`, through `served` (with `extra` run arguments); returns the client
/// and the remote pid.
fn remote_shell(served: &Served, extra: &[&str], then: &str) -> (std::process::Child, u32) {
    let script = format!("echo $$; {then}");
    let mut args = vec!["--connect", served.unix.as_str()];
    args.extend_from_slice(extra);
    args.extend(["-n", "--", "sh", "-c", &script]);
    let (client, line) = spawn_until_first_line(served.run(&args));
    (client, line.trim().parse().expect("remote pid"))
}

#[test]
fn run_connect_behaves_like_the_embedded_executor_over_both_transports() {
    let served = Served::start();
    let script = ["--", "sh", "-c", "printf out; printf err >&2; exit 5"];
    let token = served.token_arg();
    let over_unix = finish(
        served.run(&[&["--connect", &served.unix][..], &script].concat()),
        None,
    );
    let over_tcp = finish(
        served.run(
            &[
                &["--connect", &served.tcp, "--token-file", &token][..],
                &script,
            ]
            .concat(),
        ),
        None,
    );
    for done in [&over_unix, &over_tcp] {
        assert_eq!(done.code, 5, "{}", text(&done.stderr));
        assert_eq!(done.stdout, b"out");
        assert_eq!(done.stderr, b"err");
    }

    // The token may come from the environment instead.
    let secret = std::fs::read_to_string(&served.token_file).expect("token");
    let mut from_env = served.run(&["--connect", &served.tcp, "--", "true"]);
    from_env.env("CAPEXEC_TOKEN", secret.trim());
    assert_eq!(finish(from_env, None).code, 0);

    // stdin goes through byte for byte, then end-of-file.
    let data = Pattern::bytes(21, 4 << 20);
    let echoed = finish(
        served.run(&[
            "--connect",
            &served.tcp,
            "--token-file",
            &token,
            "--",
            "cat",
        ]),
        Some(data.clone()),
    );
    assert_eq!(echoed.code, 0);
    assert!(echoed.stdout == data, "stdin altered over tcp");

    // The 127/126/125 rules hold remotely.
    let missing = finish(
        served.run(&["--connect", &served.unix, "--", "capexec-no-such-program"]),
        None,
    );
    assert_eq!(missing.code, 127);
    assert_eq!(
        text(&missing.stderr),
        "capexec: program not found: capexec-no-such-program\n"
    );
    let bad_cwd = finish(
        served.run(&[
            "--connect",
            &served.unix,
            "--cwd",
            "/capexec/none",
            "--",
            "true",
        ]),
        None,
    );
    assert_eq!(bad_cwd.code, 125);
}

#[test]
fn signals_are_forwarded_to_a_remote_child() {
    let served = Served::start();
    let (mut child, line) = spawn_until_first_line(
        served.run_script("trap 'exit 7' TERM; echo ready; while :; do sleep 0.01; done"),
    );
    assert_eq!(line, "ready\n");
    kill(&child, libc::SIGTERM);
    assert_eq!(wait(&mut child), 7);
}

#[test]
fn connection_failures_and_bad_tokens_are_one_line_and_exit_125() {
    let served = Served::start();
    let wrong = served.home.path().join("wrong-token");
    std::fs::write(&wrong, "0123456789abcdef0123456789abcdef\n").expect("write");
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let refused = finish(
        served.run(&[
            "--connect",
            &served.tcp,
            "--token-file",
            &wrong.display().to_string(),
            "--",
            "true",
        ]),
        None,
    );
    assert_eq!(refused.code, 125);
    assert_eq!(
        text(&refused.stderr),
        "capexec: login refused: wrong token\n"
    );

    let no_token = finish(served.run(&["--connect", &served.tcp, "--", "true"]), None);
    assert_eq!(no_token.code, 125);
    assert_eq!(
        text(&no_token.stderr),
        format!(
            "capexec: {} needs a login token (--token-file FILE or CAPEXEC_TOKEN)\n",
            served.tcp
        )
    );

    let nowhere = served.home.path().join("nobody.sock");
    let unreachable = finish(
        served.run(&[
            "--connect",
            &format!("unix:{}", nowhere.display()),
            "--",
            "true",
        ]),
        None,
    );
    assert_eq!(unreachable.code, 125);
    assert_eq!(
        text(&unreachable.stderr),
        format!(
            "capexec: cannot connect to unix:{}: No such file or directory\n",
            nowhere.display()
        )
    );
    let bad_address = finish(served.run(&["--connect", "http://x", "--", "true"]), None);
    assert_eq!(bad_address.code, 125);

    // Nothing is sent, so the address need not even exist.
    let cleartext = finish(
        served.run(&[
            "--connect",
            "tcp:192.0.2.1:7000",
            "--token-file",
            &served.token_arg(),
            "--",
            "true",
        ]),
        None,
    );
    assert_eq!(cleartext.code, 125);
    assert_eq!(
        text(&cleartext.stderr),
        "capexec: refusing to send the login token in clear text to 192.0.2.1: give --tls \
         (trust on first use), --tls-ca FILE or --tls-pin SHA256 (or --insecure-plaintext over \
         a network you trust)\n"
    );
}

/// A client killed mid-stream: the server notices the dead connection and
/// kills what it had started.
#[test]
fn a_killed_client_gets_its_processes_killed() {
    let served = Served::start();
    let (mut client, pid) = remote_shell(&served, &[], "while :; do echo tick; sleep 0.01; done");
    assert!(pid_exists(pid));
    client.kill().expect("SIGKILL the client");
    client.wait().expect("reap the client");
    wait_gone(pid);
}

#[test]
fn sigterm_stops_the_server_cleanly() {
    let mut served = Served::start();
    let (mut client, pid) = remote_shell(&served, &[], "exec sleep 1000");
    kill(&served.child, libc::SIGTERM);
    assert_eq!(wait(&mut served.child), 0);
    wait_gone(pid);
    assert!(!served.socket.exists(), "socket file left behind");
    // The client learns how its command ended (SIGTERM) or that the server
    // went away; either way it finishes.
    let code = wait(&mut client);
    assert!(
        code == 128 + libc::SIGTERM || code == 125,
        "client exited {code}"
    );
}

/// `serve --tls-cert/--tls-key`, `run --tls-ca` and `--tls-pin`, a
/// forwarding server reaching a TLS upstream with `--upstream-tls-ca`, and
/// the one-line refusals: a wrong pin, and plaintext against TLS.
#[test]
fn tls_through_the_cli_and_to_an_upstream() {
    let dir = common::data::TempDir::new("cli-tls");
    let authority = common::pki::Authority::new(dir.path(), "ca");
    let (cert, key) = authority.server(dir.path(), "server", &["127.0.0.1"], false);
    let (cert, key, ca) = (
        cert.display().to_string(),
        key.display().to_string(),
        authority.pem.display().to_string(),
    );
    let far = Served::start_with(&["--tls-cert", &cert, "--tls-key", &key]);
    let token = far.token_arg();
    let over_tls = finish(
        far.run(&[
            "--connect",
            &far.tcp,
            "--token-file",
            &token,
            "--tls-ca",
            &ca,
            "--",
            "echo",
            "hi",
        ]),
        None,
    );
    assert_eq!(
        (over_tls.code, text(&over_tls.stdout)),
        (0, "hi\n".to_string())
    );

    let wrong_pin = "ab".repeat(32);
    let pinned = finish(
        far.run(&[
            "--connect",
            &far.tcp,
            "--token-file",
            &token,
            "--tls-pin",
            &wrong_pin,
            "--",
            "true",
        ]),
        None,
    );
    assert_eq!(pinned.code, 125);
    let offered = capexec::net::TlsServer::from_files(cert.as_ref(), key.as_ref())
        .expect("TLS")
        .fingerprint()
        .to_string();
    assert_eq!(
        text(&pinned.stderr),
        format!(
            "capexec: cannot connect to {}: TLS: the server's certificate does not have the \
             pinned fingerprint (it offered {offered})\n",
            far.tcp
        )
    );
    let plaintext = finish(
        far.run(&[
            "--connect",
            &far.tcp,
            "--token-file",
            &token,
            "--",
            "echo",
            "leak",
        ]),
        None,
    );
    assert_eq!(
        (plaintext.code, text(&plaintext.stderr)),
        (
            125,
            format!(
                "capexec: the server at {} speaks TLS: add --tls (trust on first use), --tls-ca or \
                 --tls-pin\n",
                far.tcp
            )
        )
    );
    assert!(plaintext.stdout.is_empty());

    let front = Served::start_with(&[
        "--upstream",
        &format!("b={}", far.tcp),
        "--upstream-token-file",
        &format!("b={token}"),
        "--upstream-tls-ca",
        &format!("b={ca}"),
        "--default",
        "b",
    ]);
    let through = finish(
        front.run(&["--connect", &front.unix, "--", "echo", "via"]),
        None,
    );
    assert_eq!(
        (through.code, text(&through.stdout)),
        (0, "via\n".to_string())
    );
}

/// A server killed with SIGKILL takes its children with it (their
/// parent-death signal), and its socket does not block the next server.
#[test]
fn a_killed_server_leaves_no_child_and_no_stale_socket() {
    let mut served = Served::start();
    let (mut client, pid) = remote_shell(&served, &[], "exec sleep 1000");
    assert!(pid_exists(pid));
    served.child.kill().expect("SIGKILL the server");
    served.child.wait().expect("reap the server");
    wait_gone(pid);
    assert_ne!(wait(&mut client), 0, "the client noticed the server died");

    let socket = format!("unix:{}", served.socket.display());
    let (mut again, address) =
        spawn_until_first_line(common::cli::capexec(&["serve", "--listen", &socket]));
    assert_eq!(address.trim(), socket);
    kill(&again, libc::SIGTERM);
    assert_eq!(wait(&mut again), 0);
}

/// An upstream killed with SIGKILL: the client of a process on it gets
/// the failure, its process dies with the upstream, and the middle server
/// goes on serving its other environments.
#[test]
fn a_killed_upstream_fails_its_processes_and_nothing_else() {
    let mut far = Served::start();
    let front = Served::start_with(&["--upstream", &format!("b={}", far.unix)]);
    let (mut client, pid) = remote_shell(&front, &["--environment", "b"], "exec sleep 1000");
    far.child.kill().expect("SIGKILL the upstream");
    far.child.wait().expect("reap the upstream");
    wait_gone(pid);
    assert_eq!(
        wait(&mut client),
        125,
        "the client reports the lost upstream"
    );

    let local = finish(
        front.run(&["--connect", &front.unix, "--", "echo", "local"]),
        None,
    );
    assert_eq!(
        (local.code, text(&local.stdout)),
        (0, "local\n".to_string())
    );
}

/// Whoever the server closes a connection on learns why, and `capexec run`
/// prints it as its one error line: past a call limit, and beyond the
/// limit of connections that have not logged in.
#[test]
fn capexec_run_prints_why_the_server_closed_its_connection() {
    let served = Served::start_with(&[
        "--max-calls-per-connection",
        "1",
        "--max-pending-logins-per-address",
        "1",
    ]);
    let token = served.token_arg();
    for (address, login) in [(&served.unix, None), (&served.tcp, Some(&token))] {
        let mut args = vec!["--connect", address.as_str()];
        if let Some(token) = login {
            args.extend(["--token-file", token.as_str()]);
        }
        args.extend(["--", "true"]);
        let run = finish(served.run(&args), None);
        assert_eq!(
            (run.code, text(&run.stderr)),
            (
                125,
                "capexec: more than 1 calls outstanding on one connection; closing it\n".into()
            ),
            "{address}"
        );
    }
    let pid = served.child.id();
    let idle = std::net::TcpStream::connect(served.tcp.trim_start_matches("tcp:")).expect("idle");
    let std::net::SocketAddr::V4(from) = idle.local_addr().expect("local address") else {
        panic!("the server listens on 127.0.0.1");
    };
    // It holds the address's one place once the server has accepted it
    // (a count of the server's descriptors would not tell: those of the
    // two connections before may still be closing).
    common::eventually("the server accepts", || {
        common::procfs::holds_connection_from(pid, from)
    });
    let refused = finish(
        served.run(&[
            "--connect",
            &served.tcp,
            "--token-file",
            &token,
            "--",
            "true",
        ]),
        None,
    );
    assert_eq!(
        (refused.code, text(&refused.stderr)),
        (
            125,
            "capexec: too many connections from this address have not logged in (the limit is \
             1); try again later\n"
                .into()
        )
    );
}

/// `command` with stdin empty, read until its first line, then with its
/// stdout's reader gone (as `| head -1` leaves it): its exit status and
/// stderr.
fn with_reader_gone_after_a_line(mut command: std::process::Command) -> (i32, String) {
    use std::io::{BufRead, Read};
    let mut child = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read a line");
    // The reader (and with it the pipe's read end) is gone here.
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("stderr");
    (wait(&mut child), stderr)
}

/// Over TCP (output relayed) a stdout whose reader went away ends only
/// what writes to it, as in a local pipeline: the command's later stderr
/// arrives and capexec exits as the command does, as the same pipeline
/// run by sh does.
#[test]
fn a_closed_stdout_over_tcp_ends_only_its_writer_as_locally() {
    let served = Served::start();
    let script = "yes; echo \"yes ended $?\" >&2; echo after >&2; exit 0";
    let mut local = std::process::Command::new("sh");
    local.args(["-c", script]);
    let local = with_reader_gone_after_a_line(local);
    assert_eq!(local, (0, "yes ended 141\nafter\n".to_string()));
    let token = served.token_arg();
    let remote = served.run(&[
        "--connect",
        &served.tcp,
        "--token-file",
        &token,
        "--",
        "sh",
        "-c",
        script,
    ]);
    assert_eq!(with_reader_gone_after_a_line(remote), local);
    // The same through the relay on a Unix socket.
    let relayed = served.run(&[
        "--connect",
        &served.unix,
        "--relay-stdio",
        "--",
        "sh",
        "-c",
        script,
    ]);
    assert_eq!(with_reader_gone_after_a_line(relayed), local);
}
