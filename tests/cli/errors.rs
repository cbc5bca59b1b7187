//! Every error of the client is one line, starting `capexec:`, in words
//! (no Debug output, no "(os error N)"), naming the flag or file involved,
//! with exit status 125 (127 and 126 for programs not found or not
//! executable).

use crate::common;

use std::os::unix::fs::PermissionsExt;

use common::cli::{Served, Watched, capexec, finish, text};
use common::data::TempDir;
use common::pki::Authority;

/// Runs `args`, and returns the exit status and stderr.
fn failing(command: std::process::Command) -> (i32, String) {
    let done = finish(command, None);
    assert!(done.stdout.is_empty(), "{}", text(&done.stdout));
    (done.code, text(&done.stderr))
}

#[test]
fn argument_errors_are_one_line_and_say_where_to_look() {
    let cases: [(&[&str], &str); 7] = [
        (
            &["run", "--no-such-flag", "--", "true"],
            "capexec: unknown option --no-such-flag (see capexec run --help)\n",
        ),
        (
            &["run", "--envv", "A=1", "--", "true"],
            "capexec: unknown option --envv (did you mean --env?) (see capexec run --help)\n",
        ),
        (
            &["run", "--timeout", "soon", "--", "true"],
            "capexec: --timeout expects a duration such as 10, 0.5, 90s, 5m or 1h, got \
             \"soon\" (see capexec run --help)\n",
        ),
        (
            &["rum", "--", "true"],
            "capexec: unknown command \"rum\" (did you mean run?) (see capexec --help)\n",
        ),
        (
            &["serve", "--listen"],
            "capexec: --listen needs a value (see capexec serve --help)\n",
        ),
        (
            &[],
            "capexec: give a command, such as run, shell, serve, servers or info (see capexec \
             --help)\n",
        ),
        (
            &[
                "run",
                "--tls-ca",
                "ca.pem",
                "--insecure-plaintext",
                "--",
                "true",
            ],
            "capexec: --tls-ca cannot be used with --insecure-plaintext (see capexec run \
             --help)\n",
        ),
    ];
    for (args, expected) in cases {
        assert_eq!(
            failing(capexec(args)),
            (125, expected.to_string()),
            "{args:?}"
        );
    }
    // Help is not an error.
    let help = finish(capexec(&["run", "--help"]), None);
    assert_eq!(help.code, 0);
    assert!(text(&help.stdout).contains("--connect <ADDR|NAME>"));
}

/// Options that only mean something with `--connect` (or a `tcp:` one)
/// are refused rather than silently ignored.
#[test]
fn connection_options_without_a_connection_are_refused() {
    let served = Served::start();
    let cases: [(&[&str], &str); 4] = [
        (
            &["--tls-pin", "ab", "--", "true"],
            "capexec: --tls-pin needs --connect ADDR: the embedded executor has no connection\n",
        ),
        (
            &["--token-file", "token", "--", "true"],
            "capexec: --token-file needs --connect ADDR: the embedded executor has no \
             connection\n",
        ),
        (
            &["--keepalive", "5", "--", "true"],
            "capexec: --keepalive needs --connect ADDR: the embedded executor has no \
             connection\n",
        ),
        (
            &[
                "--connect",
                &served.unix,
                "--token-file",
                "token",
                "--",
                "true",
            ],
            "capexec: --token-file is for tcp: addresses: a Unix socket needs no token and no \
             TLS (its file permissions protect it)\n",
        ),
    ];
    for (args, expected) in cases {
        assert_eq!(
            failing(served.run(args)),
            (125, expected.to_string()),
            "{args:?}"
        );
    }
}

/// Plaintext against TLS and the reverse say exactly that.
#[test]
fn tls_and_plaintext_mismatches_say_so() {
    let dir = TempDir::new("mismatch");
    let authority = Authority::new(dir.path(), "ca");
    let (cert, key) = authority.server(dir.path(), "server", &["127.0.0.1"], false);
    let tls = Served::start_with(&[
        "--tls-cert",
        &cert.display().to_string(),
        "--tls-key",
        &key.display().to_string(),
    ]);
    let plain = Served::start();
    let ca = authority.pem.display().to_string();
    assert_eq!(
        failing(tls.run(&[
            "--connect",
            &tls.tcp,
            "--token-file",
            &tls.token_arg(),
            "--",
            "true",
        ])),
        (
            125,
            format!(
                "capexec: the server at {} speaks TLS: add --tls (trust on first use), --tls-ca or \
                 --tls-pin\n",
                tls.tcp
            )
        )
    );
    assert_eq!(
        failing(plain.run(&[
            "--connect",
            &plain.tcp,
            "--token-file",
            &plain.token_arg(),
            "--tls-ca",
            &ca,
            "--",
            "true",
        ])),
        (
            125,
            format!(
                "capexec: the server at {} does not speak TLS: remove --tls-ca\n",
                plain.tcp
            )
        )
    );
    // Each TLS flag is named as given, never one that was not.
    let pin = "ab".repeat(32);
    for (flags, named) in [
        (vec!["--tls-pin", pin.as_str()], "--tls-pin"),
        (vec!["--tls"], "--tls"),
        (vec!["--tls-accept-new"], "--tls-accept-new"),
    ] {
        let token = plain.token_arg();
        let mut args = vec!["--connect", &plain.tcp, "--token-file", &token];
        args.extend(flags);
        args.extend(["--", "true"]);
        assert_eq!(
            failing(plain.run(&args)),
            (
                125,
                format!(
                    "capexec: the server at {} does not speak TLS: remove {named}\n",
                    plain.tcp
                )
            )
        );
    }
    // Asked by nothing but a certificate remembered for the address: that
    // line is named, and the token is not sent in clear.
    let known = plain.home.path().join(".config/capexec/known-servers");
    std::fs::create_dir_all(known.parent().expect("dir")).expect("mkdir");
    std::fs::write(&known, format!("# remembered\n{} {pin}\n", plain.tcp)).expect("known");
    assert_eq!(
        failing(plain.run(&[
            "--connect",
            &plain.tcp,
            "--token-file",
            &plain.token_arg(),
            "--",
            "true",
        ])),
        (
            125,
            format!(
                "capexec: the server at {} does not speak TLS, yet its certificate is remembered \
                 in {} (line 2); nothing was sent to it (if it no longer serves TLS, delete that \
                 line)\n",
                plain.tcp,
                known.display()
            )
        )
    );
}

/// Listeners that speak another protocol: an SSH server's banner comes
/// first, an HTTP server answers the first bytes it gets; `talk` is what
/// each connection is sent (after reading what the client says, unless
/// `first`).
fn other_protocol<S>(
    mut accept: impl FnMut() -> std::io::Result<S> + Send + 'static,
    first: bool,
    talk: &'static [u8],
) where
    S: std::io::Read + std::io::Write + Send + 'static,
{
    std::thread::spawn(move || {
        while let Ok(mut stream) = accept() {
            std::thread::spawn(move || {
                if !first {
                    let mut said = [0u8; 4096];
                    let _ = stream.read(&mut said);
                }
                let _ = stream.write_all(talk);
                // Held until the client has read it and gone.
                let mut rest = [0u8; 4096];
                while matches!(stream.read(&mut rest), Ok(n) if n > 0) {}
            });
        }
    });
}

/// A port or socket that does not speak capexec is said to be so, with
/// what it sent: never "a frame announces 759714644 segments". Over TLS
/// too (what it sent instead of a handshake), and for `ps`.
#[test]
fn a_port_that_does_not_speak_capexec_is_named_as_such() {
    let dir = TempDir::new("other-protocols");
    let tcp = |first: bool, talk: &'static [u8]| {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = format!("tcp:{}", listener.local_addr().expect("address"));
        other_protocol(
            move || listener.accept().map(|(stream, _)| stream),
            first,
            talk,
        );
        address
    };
    let ssh = tcp(true, b"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13.5\r\n");
    let http = tcp(
        false,
        b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    let binary = tcp(
        false,
        &[
            0x45, 0, 0, 0, 0x6a, 0x53, 0x46, 0x41, 0x54, 0x41, 0x4c, 0, 0x43,
        ],
    );
    let socket = dir.path().join("http.sock");
    let unix = std::os::unix::net::UnixListener::bind(&socket).expect("bind unix");
    other_protocol(
        move || unix.accept().map(|(stream, _)| stream),
        false,
        b"HTTP/1.1 404 Not Found\r\n\r\n",
    );
    let unix = format!("unix:{}", socket.display());
    let token = dir.path().join("token");
    std::fs::write(&token, "t".repeat(32)).expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let token = token.display().to_string();
    let ssh_banner = "it sent an SSH banner: \"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13.5\"";
    let run = |address: &str, extra: &[&str]| {
        let mut args = vec!["run", "--connect", address];
        if address.starts_with("tcp:") {
            args.extend(["--token-file", &token]);
        }
        args.extend(extra);
        args.extend(["--", "true"]);
        let mut command = capexec(&args);
        command
            .env("HOME", dir.path())
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("CAPEXEC_CONNECT");
        failing(command)
    };
    for (address, extra, seen) in [
        (&ssh, &[][..], ssh_banner),
        (&ssh, &["--tls-accept-new"][..], ssh_banner),
        (
            &http,
            &[][..],
            "it answered in HTTP: \"HTTP/1.1 400 Bad Request\"",
        ),
        (
            &http,
            &["--tls-accept-new"][..],
            "it answered in HTTP: \"HTTP/1.1 400 Bad Request\"",
        ),
        (
            &binary,
            &[][..],
            "it sent the bytes 45 00 00 00 6a 53 46 41 54 41 4c 00 ...",
        ),
        (
            &unix,
            &[][..],
            "it answered in HTTP: \"HTTP/1.1 404 Not Found\"",
        ),
    ] {
        assert_eq!(
            run(address, extra),
            (
                125,
                format!("capexec: cannot connect to {address}: not a capexec server ({seen})\n")
            ),
            "{address} {extra:?}"
        );
    }
    let mut ps = capexec(&["ps", "--connect", &unix]);
    ps.env("HOME", dir.path());
    assert_eq!(
        failing(ps),
        (
            125,
            format!(
                "capexec: cannot connect to {unix}: not a capexec server (it answered in HTTP: \
                 \"HTTP/1.1 404 Not Found\")\n"
            )
        )
    );
}

/// Files that are missing or wrong are named with their flag.
#[test]
fn bad_files_are_named_with_their_flag() {
    let dir = TempDir::new("bad-files");
    let authority = Authority::new(dir.path(), "ca");
    let (cert, _) = authority.server(dir.path(), "server", &["127.0.0.1"], false);
    let stray = Authority::stray_key(dir.path(), "stray");
    let missing = dir.path().join("missing.pem");
    let (cert, stray, missing) = (
        cert.display().to_string(),
        stray.display().to_string(),
        missing.display().to_string(),
    );
    let listen = ["serve", "--listen", "tcp:127.0.0.1:0"];
    let serve = |extra: &[&str]| {
        let mut command = capexec(&listen);
        command.args(extra).env("HOME", dir.path());
        failing(command)
    };
    assert_eq!(
        serve(&["--tls-cert", &cert, "--tls-key", &stray]),
        (
            125,
            format!(
                "capexec: --tls-key {stray} is not the private key of the certificate in \
                 --tls-cert {cert}\n"
            )
        )
    );
    assert_eq!(
        serve(&["--tls-cert", &missing, "--tls-key", &stray]),
        (
            125,
            format!("capexec: --tls-cert {missing}: No such file or directory\n")
        )
    );
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "--connect", "tcp:127.0.0.1:9"];
        args.extend_from_slice(extra);
        args.extend(["--", "true"]);
        failing(capexec(&args))
    };
    assert_eq!(
        run(&["--token-file", &missing]),
        (
            125,
            format!("capexec: --token-file {missing}: No such file or directory\n")
        )
    );
    let token = dir.path().join("token");
    std::fs::write(&token, "a-secret-of-24-bytes-xyz\n").expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let token = token.display().to_string();
    assert_eq!(
        run(&["--token-file", &token, "--tls-ca", &missing]),
        (
            125,
            format!("capexec: --tls-ca {missing}: No such file or directory\n")
        )
    );
    assert_eq!(
        run(&["--token-file", &token, "--tls-pin", "sha256:abcd"]),
        (
            125,
            "capexec: --tls-pin \"sha256:abcd\" is not a SHA-256 fingerprint: expected 64 hex \
             digits (colons allowed), as `capexec serve` logs it\n"
                .to_string()
        )
    );
    assert_eq!(
        run(&[
            "--token-file",
            &token,
            "--tls-pin",
            &vec!["AB"; 20].join(":")
        ]),
        (
            125,
            format!(
                "capexec: --tls-pin \"{}\" is a SHA-1 fingerprint (40 hex digits): pin the \
                 SHA-256 one, which `capexec serve` logs (or `openssl x509 -noout -fingerprint \
                 -sha256 -in CERT`)\n",
                vec!["AB"; 20].join(":")
            )
        )
    );
}

/// What is at a Unix address when it is not a server, and what a program
/// is when it cannot be run.
#[test]
fn addresses_and_programs_that_are_not_what_they_seem() {
    let dir = TempDir::new("not-what-they-seem");
    let plain_file = dir.path().join("file");
    std::fs::write(&plain_file, b"").expect("file");
    let connect = |path: &std::path::Path| {
        failing(capexec(&[
            "run",
            "--connect",
            &format!("unix:{}", path.display()),
            "--",
            "true",
        ]))
    };
    assert_eq!(
        connect(dir.path()),
        (
            125,
            format!(
                "capexec: cannot connect to unix:{0}: {0} is a directory, not a socket\n",
                dir.path().display()
            )
        )
    );
    assert_eq!(
        connect(&plain_file),
        (
            125,
            format!(
                "capexec: cannot connect to unix:{0}: {0} is not a socket\n",
                plain_file.display()
            )
        )
    );
    let directory = dir.path().display().to_string();
    assert_eq!(
        failing(capexec(&["run", "--", &directory])),
        (
            126,
            format!("capexec: cannot execute {directory}: it is a directory\n")
        )
    );
    assert_eq!(
        failing(capexec(&["run", "--", "echo hi; ls"])),
        (
            127,
            "capexec: program not found: echo hi; ls (to run a shell command line, use: sh -c \
             'echo hi; ls')\n"
                .to_string()
        )
    );
    assert_eq!(
        failing(capexec(&["run", "--", "capexec-no-such-program"])),
        (
            127,
            "capexec: program not found: capexec-no-such-program\n".to_string()
        )
    );
}

/// A server that goes away mid-run: the line says so, in words.
#[test]
fn a_server_that_goes_away_is_named_as_such() {
    let mut served = Served::start();
    let run = Watched::spawn(served.run_script("echo ready; exec sleep 1000"));
    run.wait_for_stdout("ready\n");
    served.child.kill().expect("kill the server");
    let _ = served.child.wait();
    let done = run.finish();
    assert_eq!(
        (done.code, text(&done.stderr)),
        (
            125,
            "capexec: lost the command: the server closed the connection\n".to_string()
        )
    );
}

/// A server that goes away after the command exited (what it left
/// running still holding its output): the command's status stays the
/// truth, and the line says what was lost.
#[test]
fn a_server_that_goes_away_after_the_exit_keeps_the_commands_status() {
    let mut served = Served::start();
    let run = Watched::spawn(served.run(&[
        "-v",
        "--connect",
        &served.unix,
        "--relay-stdio",
        "-n",
        "--",
        "sh",
        "-c",
        "sleep 1000 & echo \"pid-$!-\"; exit 42",
    ]));
    run.wait_for_stdout("-\n");
    let background = common::pid_after(&run.stdout_text(), "pid-");
    run.wait_for_stderr(
        "capexec: debug: the command exited (exit code 42); relaying until its output ends\n",
    );
    served.child.kill().expect("kill the server");
    let _ = served.child.wait();
    let done = run.finish();
    // A killed server leaves what its children started behind.
    // SAFETY: kill(2) on the test's own leftover.
    unsafe { libc::kill(background as i32, libc::SIGKILL) };
    let stderr = text(&done.stderr);
    let said: Vec<&str> = stderr
        .lines()
        .filter(|line| !line.starts_with("capexec: debug: "))
        .collect();
    assert_eq!(
        (done.code, said),
        (
            42,
            vec![
                "capexec: the command had exited (exit code 42) when its output was lost: the \
                 server closed the connection"
            ]
        ),
        "{stderr}"
    );
}

/// A server its operator stops (SIGTERM) while commands run: each client
/// says so in one line with how its command ended, and exits with the
/// command's status; a client with no command learns the reason too.
#[test]
fn a_server_shut_down_by_its_operator_says_so_with_the_commands_status() {
    let mut served = Served::start();
    let token = served.token_arg();
    let killed = Watched::spawn(served.run(&[
        "--connect",
        &served.tcp,
        "--token-file",
        &token,
        "-n",
        "--",
        "sh",
        "-c",
        "echo ready; exec sleep 1000",
    ]));
    let trapped =
        Watched::spawn(served.run_script("trap 'exit 3' TERM; echo ready; sleep 1000 & wait"));
    let idle = Watched::spawn(served.command(
        "forward",
        &["--connect", &served.unix, "-L", "127.0.0.1:0:127.0.0.1:9"],
    ));
    killed.wait_for_stdout("ready\n");
    trapped.wait_for_stdout("ready\n");
    idle.wait_for_stdout(" -> tcp:127.0.0.1:9\n");
    common::cli::kill(&served.child, libc::SIGTERM);
    let killed = killed.finish();
    assert_eq!(
        (killed.code, text(&killed.stderr)),
        (
            128 + libc::SIGTERM,
            "capexec: the server is shutting down (its operator stopped it): it terminated the \
             command (killed by SIGTERM)\n"
                .to_string()
        )
    );
    let trapped = trapped.finish();
    assert_eq!(
        (trapped.code, text(&trapped.stderr)),
        (
            3,
            "capexec: the server is shutting down (its operator stopped it): it terminated the \
             command (exit code 3)\n"
                .to_string()
        )
    );
    let idle = idle.finish();
    assert_eq!(
        (idle.code, text(&idle.stderr)),
        (
            125,
            "capexec: the connection to the server was lost: the server is shutting down\n"
                .to_string()
        )
    );
    assert_eq!(common::cli::wait(&mut served.child), 0);
}

/// Warnings are one line in the same style, not log records.
#[test]
fn warnings_are_one_line_too() {
    let served = Served::start();
    let loose = served.home.path().join("loose-token");
    std::fs::copy(&served.token_file, &loose).expect("copy the token");
    std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let loose = loose.display().to_string();
    let done = finish(
        served.run(&[
            "--connect",
            &served.tcp,
            "--token-file",
            &loose,
            "--",
            "true",
        ]),
        None,
    );
    assert_eq!(
        (done.code, text(&done.stderr)),
        (
            0,
            format!(
                "capexec: warning: the token file is readable by other users; chmod 600 it \
                 (path={loose})\n"
            )
        )
    );
}
