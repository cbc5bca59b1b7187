//! `capexec forward -L` and `-R` end to end: a real TCP client and server
//! on either side of a `capexec serve`, the lines printed, failures
//! reported per connection, and the end on a signal or a lost server.

use crate::common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::thread::JoinHandle;

use common::cli::{Served, Watched, kill, text};
use common::data::Pattern;

/// A TCP server that answers one connection: reads to end of file, then
/// writes back the length it read and the bytes reversed, and closes.
fn answering_server() -> (u16, JoinHandle<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    let server = std::thread::spawn(move || {
        let (mut socket, _) = listener.accept().expect("accept");
        let mut got = Vec::new();
        socket
            .read_to_end(&mut got)
            .expect("read to the client's end");
        // Half-closed by the client: this direction still works.
        socket
            .write_all(format!("{} bytes:", got.len()).as_bytes())
            .expect("write");
        let reversed: Vec<u8> = got.iter().rev().copied().collect();
        socket.write_all(&reversed).expect("write");
        got
    });
    (port, server)
}

/// The one line a forward prints, and the port it listens on.
fn listening_port(forward: &Watched, prefix: &str) -> (String, u16) {
    forward.wait_for_stdout("\n");
    let out = forward.stdout_text();
    let line = out
        .lines()
        .find(|line| line.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting {prefix:?}: {out:?}"))
        .to_string();
    let listen = line[prefix.len()..].split(' ').next().expect("address");
    let port = listen
        .rsplit(':')
        .next()
        .expect("port")
        .parse()
        .expect("a port");
    (line, port)
}

/// `capexec forward -L` of each spec, through `served`'s Unix socket.
fn forward_l(served: &Served, specs: &[String]) -> Watched {
    let mut args = vec!["--connect", served.unix.as_str()];
    for spec in specs {
        args.extend(["-L", spec.as_str()]);
    }
    Watched::spawn(served.command("forward", &args))
}

/// `capexec forward -R spec`, through `served`'s TCP listener.
fn forward_r(served: &Served, spec: &str) -> Watched {
    let token = served.token_arg();
    Watched::spawn(served.command(
        "forward",
        &["--connect", &served.tcp, "--token-file", &token, "-R", spec],
    ))
}

/// Sends `data`, half-closes, and reads the answer to its end.
fn exchange(port: u16, data: &[u8]) -> Vec<u8> {
    let mut socket = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    socket.write_all(data).expect("write");
    socket.shutdown(Shutdown::Write).expect("half-close");
    let mut answer = Vec::new();
    socket.read_to_end(&mut answer).expect("read the answer");
    answer
}

fn expected_answer(data: &[u8]) -> Vec<u8> {
    let mut answer = format!("{} bytes:", data.len()).into_bytes();
    answer.extend(data.iter().rev());
    answer
}

#[test]
fn forward_l_carries_connections_to_the_executors_machine() {
    let served = Served::start();
    let (port, server) = answering_server();
    let dead = TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead_port = dead.local_addr().expect("address").port();
    drop(dead);
    let forward = forward_l(
        &served,
        &[
            format!("0:127.0.0.1:{port}"),
            format!("localhost:0:127.0.0.1:{dead_port}"),
        ],
    );
    forward.wait_for_stdout(&format!("-> tcp:127.0.0.1:{dead_port}\n"));
    let (line, local) = listening_port(&forward, "-L ");
    assert_eq!(
        line,
        format!("-L tcp:127.0.0.1:{local} -> tcp:127.0.0.1:{port}")
    );
    let data = Pattern::bytes(7, 3 << 20);
    assert_eq!(exchange(local, &data), expected_answer(&data));
    assert_eq!(server.join().expect("server"), data);

    // A connection the far end refuses: reset here, and one line.
    let out = forward.stdout_text();
    let dead_line = out.lines().nth(1).expect("second line").to_string();
    let dead_local: u16 = dead_line[3..]
        .split(' ')
        .next()
        .and_then(|address| address.rsplit(':').next())
        .and_then(|port| port.parse().ok())
        .expect("port");
    let mut socket = TcpStream::connect(("127.0.0.1", dead_local)).expect("connect");
    let client_port = socket.local_addr().expect("address").port();
    let mut rest = Vec::new();
    let error = socket.read_to_end(&mut rest).expect_err("reset");
    assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}");
    forward.wait_for_stderr("\n");
    kill(&forward.child, libc::SIGINT);
    let done = forward.finish();
    assert_eq!(done.code, 0, "{}", text(&done.stderr));
    assert_eq!(
        text(&done.stderr),
        format!(
            "capexec: -L tcp:127.0.0.1:{dead_local} -> tcp:127.0.0.1:{dead_port}: connection from \
             tcp:127.0.0.1:{client_port} failed: cannot connect to tcp:127.0.0.1:{dead_port}: \
             Connection refused\n"
        )
    );
}

#[test]
fn forward_r_listens_on_the_executors_machine() {
    let served = Served::start();
    let (port, server) = answering_server();
    let forward = forward_r(&served, &format!("0:localhost:{port}"));
    let (line, remote) = listening_port(&forward, "-R ");
    assert_eq!(
        line,
        format!("-R tcp:127.0.0.1:{remote} -> tcp:localhost:{port}")
    );
    let data = Pattern::bytes(8, 2 << 20);
    assert_eq!(exchange(remote, &data), expected_answer(&data));
    assert_eq!(server.join().expect("server"), data);
    kill(&forward.child, libc::SIGTERM);
    let done = forward.finish();
    assert_eq!(done.code, 0, "{}", text(&done.stderr));
    assert_eq!(text(&done.stderr), "");
    // The listener went with it.
    common::eventually("nothing listens", || {
        TcpStream::connect(("127.0.0.1", remote)).is_err()
    });
}

#[test]
fn forward_ends_with_125_when_the_server_is_lost() {
    let mut served = Served::start();
    let forward = Watched::spawn(served.command(
        "forward",
        &[
            "--connect",
            &served.unix,
            "-R",
            "unix:/nonexistent-dir/x.sock:h:1",
        ],
    ));
    let done = forward.finish();
    assert_eq!(done.code, 125);
    let stderr = text(&done.stderr);
    assert!(
        stderr.starts_with("capexec: -R unix:/nonexistent-dir/x.sock -> tcp:h:1: "),
        "{stderr}"
    );

    let forward = Watched::spawn(served.command(
        "forward",
        &["--connect", &served.unix, "-L", "0:127.0.0.1:9"],
    ));
    forward.wait_for_stdout("\n");
    let _ = served.child.kill();
    let _ = served.child.wait();
    let done = forward.finish();
    assert_eq!(done.code, 125, "{}", text(&done.stderr));
    assert_eq!(
        text(&done.stderr),
        "capexec: the connection to the server was lost\n"
    );
}

#[test]
fn forward_refuses_malformed_specs_in_one_line() {
    let served = Served::start();
    let done = common::cli::finish(served.command("forward", &["-L", "8080:host"]), None);
    assert_eq!(done.code, 125);
    assert_eq!(
        text(&done.stderr),
        "capexec: -L expected [BIND_ADDRESS:]PORT:HOST:HOSTPORT (either side may be unix:PATH) \
         (see capexec forward --help)\n"
    );
    let done = common::cli::finish(served.command("forward", &[]), None);
    assert_eq!(done.code, 125);
    assert_eq!(
        text(&done.stderr),
        "capexec: nothing to forward: give -L or -R (see capexec forward --help)\n"
    );
}

#[test]
fn a_restricted_server_forwards_only_what_its_flags_allow() {
    let (port, server) = answering_server();
    let served = Served::start_with(&[
        "--allow-program",
        "true",
        "--allow-dial",
        &format!("tcp:127.0.0.1:{port}"),
    ]);
    let forward = forward_l(
        &served,
        &[
            format!("0:127.0.0.1:{port}"),
            format!("0:127.0.0.1:{}", port.wrapping_add(1).max(1)),
        ],
    );
    forward.wait_for_stdout(&format!(
        "-> tcp:127.0.0.1:{}\n",
        port.wrapping_add(1).max(1)
    ));
    let out = forward.stdout_text();
    let locals: Vec<u16> = out
        .lines()
        .map(|line| {
            line[3..]
                .split(' ')
                .next()
                .and_then(|address| address.rsplit(':').next())
                .and_then(|port| port.parse().ok())
                .expect("port")
        })
        .collect();
    let data = b"allowed".to_vec();
    assert_eq!(exchange(locals[0], &data), expected_answer(&data));
    server.join().expect("server");
    let mut socket = TcpStream::connect(("127.0.0.1", locals[1])).expect("connect");
    let mut rest = Vec::new();
    assert!(socket.read_to_end(&mut rest).is_err(), "reset");
    forward.wait_for_stderr("\n");
    kill(&forward.child, libc::SIGINT);
    let done = forward.finish();
    let stderr = text(&done.stderr);
    let other = port.wrapping_add(1).max(1);
    assert!(
        stderr.ends_with(&format!(
            "failed: the server's --allow-dial: \"tcp:127.0.0.1:{other}\" may not be dialled \
             (allowed: tcp:127.0.0.1:{port})\n"
        )),
        "{stderr}"
    );
    // Listening is refused outright: none by default with --allow-program.
    let done = common::cli::finish(
        served.command("forward", &["--connect", &served.unix, "-R", "0:h:1"]),
        None,
    );
    assert_eq!(done.code, 125);
    let stderr = text(&done.stderr);
    assert!(
        stderr.contains("--allow-listen (none by default with --allow-program)"),
        "{stderr}"
    );
}

#[test]
fn run_forwards_for_the_lifetime_of_one_command() {
    let served = Served::start();
    let (port, server) = answering_server();
    let socket = served.home.path().join("reverse.sock");
    let script = format!(
        "import socket\n\
         s = socket.socket(socket.AF_UNIX)\n\
         s.connect({path:?})\n\
         s.sendall(b'abc')\n\
         s.shutdown(socket.SHUT_WR)\n\
         print(s.makefile('rb').read().decode())\n",
        path = socket.display().to_string()
    );
    let spec = format!("unix:{}:127.0.0.1:{port}", socket.display());
    let done = common::cli::finish(
        served.run(&[
            "--connect",
            &served.unix,
            "--reverse-forward",
            &spec,
            "-n",
            "--",
            "python3",
            "-c",
            &script,
        ]),
        None,
    );
    assert_eq!(done.code, 0, "{}", text(&done.stderr));
    assert_eq!(text(&done.stdout), "3 bytes:cba\n");
    assert_eq!(
        text(&done.stderr),
        format!(
            "capexec: -R unix:{} -> tcp:127.0.0.1:{port}\n",
            socket.display()
        )
    );
    assert_eq!(server.join().expect("server"), b"abc");
    // Nothing listens after the command: the socket file is gone.
    common::eventually(&format!("{} is removed", socket.display()), || {
        !socket.exists()
    });
}

/// `capexec serve` on a Unix socket at `path` (for a server that is
/// stopped and started again at the same address).
fn serve_at(path: &std::path::Path, home: &std::path::Path) -> std::process::Child {
    use std::io::BufRead;
    let _ = std::fs::remove_file(path);
    let mut child = std::process::Command::new(common::cli::BIN)
        .args(["serve", "--listen"])
        .arg(format!("unix:{}", path.display()))
        .arg("--token-file")
        .arg(home.join("token"))
        .env("HOME", home)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start capexec serve");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the listening line");
    assert_eq!(line.trim(), format!("unix:{}", path.display()));
    child
}

/// Answers every connection as [`answering_server`] answers one.
fn answering_servers() -> u16 {
    servers_answering_after(b"")
}

/// A TCP server that writes `greeting` to every connection, then answers
/// what it reads to its end as [`answering_server`] does.
fn servers_answering_after(greeting: &'static [u8]) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        for socket in listener.incoming() {
            let Ok(mut socket) = socket else { continue };
            std::thread::spawn(move || {
                let mut got = Vec::new();
                if socket.write_all(greeting).is_ok() && socket.read_to_end(&mut got).is_ok() {
                    let _ = socket.write_all(&expected_answer(&got));
                }
            });
        }
    });
    port
}

#[test]
fn forward_resume_keeps_forwarding_after_the_server_comes_back() {
    let home = common::data::TempDir::new("forward-resume");
    let path = home.path().join("capexec.sock");
    let mut server = serve_at(&path, home.path());
    let port = answering_servers();
    let forward = resumable_forward(home.path(), &path, port);
    let (_, local) = listening_port(&forward, "-L ");
    assert_eq!(exchange(local, b"first"), expected_answer(b"first"));

    let _ = server.kill();
    let _ = server.wait();
    forward.wait_for_stderr(
        "capexec: the connection to the server was lost; reconnecting (for up to 1 min)\n",
    );
    let mut server = serve_at(&path, home.path());
    forward.wait_for_stderr("capexec: reconnected: forwarding again\n");
    // The same local port, through the new connection.
    assert_eq!(exchange(local, b"second"), expected_answer(b"second"));
    kill(&forward.child, libc::SIGINT);
    let done = forward.finish();
    assert_eq!(done.code, 0, "{}", text(&done.stderr));
    let _ = server.kill();
    let _ = server.wait();
}

/// `capexec forward --resume 60 -L 0:127.0.0.1:PORT` through the server
/// at `socket`, with a clean environment in `home`.
fn resumable_forward(home: &std::path::Path, socket: &std::path::Path, port: u16) -> Watched {
    let mut command = served_command(home, "forward");
    command
        .args(["--connect", &format!("unix:{}", socket.display())])
        .args(["--resume", "60", "-L", &format!("0:127.0.0.1:{port}")]);
    Watched::spawn(command)
}

/// A `capexec` subcommand with a clean environment in `home`.
fn served_command(home: &std::path::Path, subcommand: &str) -> std::process::Command {
    let mut command = std::process::Command::new(common::cli::BIN);
    command
        .arg(subcommand)
        .env("HOME", home)
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("CAPEXEC_TOKEN");
    command
}

/// A TCP server that greets every connection with `hi`, then answers it
/// as [`answering_server`] does.
fn greeting_servers() -> u16 {
    servers_answering_after(b"hi")
}

#[test]
fn serve_limits_the_port_connections_of_one_connection_as_told() {
    let served = Served::start_with(&["--max-port-connections-per-connection", "1"]);
    let port = greeting_servers();
    let forward = forward_l(&served, &[format!("0:127.0.0.1:{port}")]);
    let (_, local) = listening_port(&forward, "-L ");
    // The one connection allowed: greeted, so dialled through.
    let mut first = TcpStream::connect(("127.0.0.1", local)).expect("connect");
    let mut greeting = [0u8; 2];
    first.read_exact(&mut greeting).expect("greeted");
    assert_eq!(&greeting, b"hi");
    // One more: refused by the server's limit, reset here, one line.
    let mut second = TcpStream::connect(("127.0.0.1", local)).expect("connect");
    let from = second.local_addr().expect("address").port();
    let mut rest = Vec::new();
    let error = second.read_to_end(&mut rest).expect_err("reset");
    assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}");
    forward.wait_for_stderr("\n");
    let stderr = forward.stderr_text();
    assert_eq!(
        stderr,
        format!(
            "capexec: -L tcp:127.0.0.1:{local} -> tcp:127.0.0.1:{port}: connection from \
             tcp:127.0.0.1:{from} failed: this connection already holds its maximum of 1 port \
             connections\n"
        )
    );
    // The first goes on, and the server and the forward with it.
    first.write_all(b"abc").expect("write");
    first.shutdown(Shutdown::Write).expect("half-close");
    let mut answer = Vec::new();
    first.read_to_end(&mut answer).expect("the answer");
    assert_eq!(answer, expected_answer(b"abc"));
    kill(&forward.child, libc::SIGINT);
    let done = forward.finish();
    assert_eq!(done.code, 0, "{}", text(&done.stderr));
}

#[test]
fn forward_resume_fails_open_connections_with_an_error_and_carries_new_ones() {
    let home = common::data::TempDir::new("forward-resume-open");
    let path = home.path().join("capexec.sock");
    let mut server = serve_at(&path, home.path());
    let port = greeting_servers();
    let forward = resumable_forward(home.path(), &path, port);
    let (_, local) = listening_port(&forward, "-L ");
    let mut open = TcpStream::connect(("127.0.0.1", local)).expect("connect");
    let from = open.local_addr().expect("address").port();
    let mut greeting = [0u8; 2];
    open.read_exact(&mut greeting).expect("greeted");

    let _ = server.kill();
    let _ = server.wait();
    // The open connection fails as an error (a reset), never a clean end.
    let mut rest = Vec::new();
    let error = open.read_to_end(&mut rest).expect_err("reset");
    assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}");
    forward.wait_for_stderr("reconnecting (for up to 1 min)\n");
    let mut server = serve_at(&path, home.path());
    forward.wait_for_stderr("capexec: reconnected: forwarding again\n");
    let mut new = TcpStream::connect(("127.0.0.1", local)).expect("connect");
    new.read_exact(&mut greeting).expect("greeted");
    new.write_all(b"after").expect("write");
    new.shutdown(Shutdown::Write).expect("half-close");
    let mut answer = Vec::new();
    new.read_to_end(&mut answer).expect("the answer");
    assert_eq!(answer, expected_answer(b"after"));
    kill(&forward.child, libc::SIGINT);
    let done = forward.finish();
    assert_eq!(done.code, 0, "{}", text(&done.stderr));
    // One line for the failed connection, one for the loss, one for the
    // reconnection.
    let stderr = text(&done.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 3, "{stderr}");
    assert!(
        lines.contains(
            &format!(
                "capexec: -L tcp:127.0.0.1:{local} -> tcp:127.0.0.1:{port}: connection from \
             tcp:127.0.0.1:{from} failed: the connection through the executor was lost"
            )
            .as_str()
        ),
        "{stderr}"
    );
    assert!(
        lines.contains(&"capexec: reconnected: forwarding again"),
        "{stderr}"
    );
    let _ = server.kill();
    let _ = server.wait();
}

/// `run --forward` with `--resume`: a cut fails the connections open
/// through it (an error, never a clean end), and once reconnected new
/// connections go through the new connection while the command carries on.
#[test]
fn run_forward_with_resume_carries_new_connections_after_a_cut() {
    let served = Served::start();
    let port = greeting_servers();
    common::run_on_runtime(async move {
        let dir = common::data::TempDir::new("run-forward-resume");
        let proxy = common::proxy::Proxy::start(
            &dir.path().join("proxy.sock"),
            &served.socket,
            std::time::Duration::ZERO,
        )
        .expect("proxy");
        let go = dir.path().join("go");
        let script = format!(
            "while [ ! -e {go} ]; do sleep 0.01; done; exit 7",
            go = go.display()
        );
        let run = Watched::spawn(served.run(&[
            "--connect",
            &format!("unix:{}", proxy.path().display()),
            "--resume",
            "60",
            "--forward",
            &format!("0:127.0.0.1:{port}"),
            "-n",
            "--",
            "sh",
            "-c",
            &script,
        ]));
        run.wait_for_stderr("\n");
        let first = run.stderr_text();
        let prefix = "capexec: -L tcp:127.0.0.1:";
        assert!(first.starts_with(prefix), "{first}");
        let local: u16 = first[prefix.len()..]
            .split(' ')
            .next()
            .and_then(|port| port.parse().ok())
            .expect("the forward's port");
        let mut open = TcpStream::connect(("127.0.0.1", local)).expect("connect");
        let mut greeting = [0u8; 2];
        open.read_exact(&mut greeting).expect("greeted");

        proxy.cut();
        let mut rest = Vec::new();
        let error = open.read_to_end(&mut rest).expect_err("reset");
        assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}");
        proxy.restore();
        run.wait_for_stderr("capexec: reconnected; the command carries on\n");
        let mut new = TcpStream::connect(("127.0.0.1", local)).expect("connect");
        new.read_exact(&mut greeting).expect("greeted");
        new.write_all(b"after").expect("write");
        new.shutdown(Shutdown::Write).expect("half-close");
        let mut answer = Vec::new();
        new.read_to_end(&mut answer).expect("the answer");
        assert_eq!(answer, expected_answer(b"after"));
        std::fs::write(&go, b"").expect("go on");
        let done = run.finish();
        assert_eq!(done.code, 7, "{}", text(&done.stderr));
        // Nothing listens after the command.
        assert!(TcpStream::connect(("127.0.0.1", local)).is_err());
    });
}

/// A far peer that resets its connection mid-stream: the connection here
/// is reset too (never a clean end), after the bytes that came first, and
/// one line says why. Over a Unix socket the bytes go through a direct
/// channel spliced on both sides, which must keep that.
#[test]
fn forward_l_passes_a_far_reset_on_as_a_reset() {
    let served = Served::start();
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    let peer = std::thread::spawn(move || {
        let (mut socket, _) = listener.accept().expect("accept");
        socket.write_all(b"before").expect("write");
        let mut four = [0u8; 4];
        socket.read_exact(&mut four).expect("read");
        socket2::SockRef::from(&socket)
            .set_linger(Some(std::time::Duration::ZERO))
            .expect("linger");
        four
    });
    let forward = forward_l(&served, &[format!("0:127.0.0.1:{port}")]);
    let (_, local) = listening_port(&forward, "-L ");
    let mut socket = TcpStream::connect(("127.0.0.1", local)).expect("connect");
    let from = socket.local_addr().expect("address").port();
    let mut six = [0u8; 6];
    socket
        .read_exact(&mut six)
        .expect("the bytes before the reset");
    assert_eq!(&six, b"before");
    socket.write_all(b"ping").expect("write");
    assert_eq!(&peer.join().expect("peer"), b"ping");
    let mut rest = Vec::new();
    let error = socket
        .read_to_end(&mut rest)
        .expect_err("a reset, not an end of file");
    assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}");
    assert!(rest.is_empty(), "{rest:?}");
    forward.wait_for_stderr("\n");
    kill(&forward.child, libc::SIGINT);
    let done = forward.finish();
    assert_eq!(done.code, 0, "{}", text(&done.stderr));
    assert_eq!(
        text(&done.stderr),
        format!(
            "capexec: -L tcp:127.0.0.1:{local} -> tcp:127.0.0.1:{port}: connection from \
             tcp:127.0.0.1:{from} failed: the connection was reset by its peer\n"
        )
    );
}
