//! `capexec serve` as a service: sockets passed the systemd way (by
//! Debian's `systemd-socket-activate`, which sets LISTEN_FDS, LISTEN_PID
//! and LISTEN_FDNAMES as systemd does), readiness and stopping over
//! NOTIFY_SOCKET, and SIGHUP reloading the token and the certificate
//! without dropping a connection or a process.

use crate::common;

use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::cli::{BIN, Watched, finish, kill, spawn_reading_first_line, text, wait};
use common::data::TempDir;

/// The service manager's end of NOTIFY_SOCKET.
fn notify_socket(dir: &Path) -> (UnixDatagram, String) {
    let path = dir.join("notify");
    let socket = UnixDatagram::bind(&path).expect("notify socket");
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    (socket, path.display().to_string())
}

fn next_state(socket: &UnixDatagram) -> String {
    let mut buf = [0u8; 4096];
    let n = socket.recv(&mut buf).expect("a notification within 30 s");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

fn wait_for_file(path: &Path) {
    common::eventually(&format!("{} appears", path.display()), || path.exists());
}

fn client(home: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env("HOME", home)
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("CAPEXEC_TOKEN")
        .env_remove("CAPEXEC_CONNECT");
    command
}

#[test]
fn sockets_passed_by_socket_activation_are_served_and_readiness_is_notified() {
    let dir = TempDir::new("cli-activation");
    let main = dir.path().join("capexec.sock");
    let admin = dir.path().join("admin.sock");
    let (notifications, notify_path) = notify_socket(dir.path());
    let mut activator = Command::new("systemd-socket-activate")
        .arg("-l")
        .arg(&main)
        .arg("-l")
        .arg(&admin)
        .arg("--fdname=main:admin")
        .arg(format!("--setenv=NOTIFY_SOCKET={notify_path}"))
        .arg(format!("--setenv=HOME={}", dir.path().display()))
        .args([BIN, "serve"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("systemd-socket-activate (Debian's systemd package) is installed");
    wait_for_file(&main);
    wait_for_file(&admin);
    // The first connection starts the server, which takes it from the
    // passed socket's queue.
    let main_address = format!("unix:{}", main.display());
    let ran = finish(
        client(
            dir.path(),
            &["run", "--connect", &main_address, "--", "echo", "activated"],
        ),
        None,
    );
    assert_eq!(
        (ran.code, text(&ran.stdout), text(&ran.stderr)),
        (0, "activated\n".to_string(), String::new())
    );
    assert_eq!(
        next_state(&notifications),
        format!("READY=1\nMAINPID={}", activator.id())
    );
    // The passed sockets were copied and closed once served: their slots
    // are kept for the server's own like every other below 64, so no
    // client's descriptor lands where the spawner's table starts from.
    let below_64 = std::fs::read_dir(format!("/proc/{}/fd", activator.id()))
        .expect("the server's descriptors")
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&fd| fd < 64)
        .count();
    assert_eq!(below_64, 64);
    // The socket named "admin" is the admin socket, and only it.
    let admin_address = format!("unix:{}", admin.display());
    let listed = finish(
        client(dir.path(), &["ps", "--connect", &admin_address, "--json"]),
        None,
    );
    assert_eq!((listed.code, text(&listed.stdout)), (0, "[]\n".to_string()));
    let not_admin = finish(
        client(dir.path(), &["ps", "--connect", &main_address]),
        None,
    );
    assert_eq!(not_admin.code, 125);
    // The children see none of the service manager's variables.
    let env = finish(
        client(
            dir.path(),
            &["run", "--connect", &main_address, "--", "env"],
        ),
        None,
    );
    let env = text(&env.stdout);
    for variable in [
        "LISTEN_FDS",
        "LISTEN_PID",
        "LISTEN_FDNAMES",
        "NOTIFY_SOCKET",
    ] {
        assert!(!env.contains(variable), "{variable} leaked: {env}");
    }

    kill(&activator, libc::SIGTERM);
    assert_eq!(next_state(&notifications), "STOPPING=1");
    assert_eq!(wait(&mut activator), 0);
}

#[test]
fn sighup_reloads_the_token_and_certificate_without_dropping_anything() {
    let dir = TempDir::new("cli-reload");
    let authority = common::pki::Authority::new(dir.path(), "ca");
    let (first_cert, first_key) = authority.server(dir.path(), "first", &["127.0.0.1"], false);
    let (second_cert, second_key) = authority.server(dir.path(), "second", &["127.0.0.1"], false);
    let fingerprint =
        |cert: &Path| capexec::net::TlsServer::certificate_fingerprint(cert).expect("certificate");
    let (first_pin, second_pin) = (fingerprint(&first_cert), fingerprint(&second_cert));
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::copy(&first_cert, &cert).expect("cert");
    std::fs::copy(&first_key, &key).expect("key");
    let token_file = dir.path().join("token");
    let first_token = "a".repeat(64);
    std::fs::write(&token_file, &first_token).expect("token");
    let (notifications, notify_path) = notify_socket(dir.path());
    let mut serve = Command::new(BIN);
    serve
        .args(["serve", "--listen", "tcp:127.0.0.1:0", "--token-file"])
        .arg(&token_file)
        .arg("--tls-cert")
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key)
        .env("HOME", dir.path())
        .env("NOTIFY_SOCKET", &notify_path)
        .stderr(Stdio::null());
    let (mut server, line) = spawn_reading_first_line(serve);
    let address = line.trim().to_string();
    assert!(next_state(&notifications).starts_with("READY=1\n"));

    let token_arg = token_file.display().to_string();
    let connect = |pin: &str| {
        vec![
            "--connect".to_string(),
            address.clone(),
            "--token-file".to_string(),
            token_arg.clone(),
            "--tls-pin".to_string(),
            pin.to_string(),
        ]
    };
    let mut long: Vec<String> = vec!["run".into()];
    long.extend(connect(&first_pin));
    long.extend(["--", "sh", "-c", "echo up; read x; echo still $x"].map(String::from));
    let long: Vec<&str> = long.iter().map(String::as_str).collect();
    let mut running = Watched::spawn(client(dir.path(), &long));
    running.wait_for_stdout("up\n");

    std::fs::write(&token_file, "b".repeat(64)).expect("new token");
    std::fs::copy(&second_cert, &cert).expect("new cert");
    std::fs::copy(&second_key, &key).expect("new key");
    kill(&server, libc::SIGHUP);
    assert!(next_state(&notifications).starts_with("RELOADING=1\nMONOTONIC_USEC="));
    assert_eq!(next_state(&notifications), "READY=1");

    let run = |pin: &str, token: Option<&str>| {
        let token_copy = dir.path().join("client-token");
        if let Some(token) = token {
            std::fs::write(&token_copy, token).expect("client token");
        }
        let mut args: Vec<String> = vec!["run".into()];
        args.extend(connect(pin));
        if token.is_some() {
            args[4] = token_copy.display().to_string();
        }
        args.extend(["--", "echo", "new"].map(String::from));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        finish(client(dir.path(), &args), None)
    };
    let fresh = run(&second_pin, None);
    assert_eq!(
        (fresh.code, text(&fresh.stdout)),
        (0, "new\n".to_string()),
        "{}",
        text(&fresh.stderr)
    );
    let old_certificate = run(&first_pin, None);
    assert_eq!(old_certificate.code, 125);
    assert!(text(&old_certificate.stderr).contains("pinned fingerprint"));
    let old_token = run(&second_pin, Some(&first_token));
    assert_eq!(old_token.code, 125, "{}", text(&old_token.stderr));

    // The connection made before the reload, and its process, go on.
    let mut stdin = running.stdin.take().expect("stdin");
    stdin.write_all(b"here\n").expect("write");
    drop(stdin);
    let done = running.finish();
    assert_eq!(
        (done.code, text(&done.stdout)),
        (0, "up\nstill here\n".to_string())
    );
    kill(&server, libc::SIGTERM);
    assert_eq!(next_state(&notifications), "STOPPING=1");
    assert_eq!(wait(&mut server), 0);
}

/// Descriptors that are not what socket activation promises are refused
/// with one line, before anything is served.
#[test]
fn bad_passed_descriptors_are_one_line_each() {
    let serve_with = |variables: &str, redirect: &str| {
        let mut command = Command::new("sh");
        command.args([
            "-c",
            &format!("{variables} exec \"$0\" serve {redirect}"),
            BIN,
        ]);
        command.env_remove("NOTIFY_SOCKET");
        finish(command, None)
    };
    for (variables, redirect, expected) in [
        (
            "LISTEN_PID=$$ LISTEN_FDS=many",
            "",
            "capexec: socket activation: LISTEN_FDS=\"many\" is not a number of descriptors\n",
        ),
        (
            "LISTEN_PID=$$ LISTEN_FDS=1",
            "3</dev/null",
            "capexec: socket activation: the socket \"unknown\": descriptor 3 is not a socket \
             (Socket operation on non-socket)\n",
        ),
        (
            "LISTEN_PID=$$ LISTEN_FDS=2 LISTEN_FDNAMES=main:admin",
            "3</dev/null 4</dev/null",
            "capexec: socket activation: the socket \"main\": descriptor 3 is not a socket \
             (Socket operation on non-socket)\n",
        ),
    ] {
        let failed = serve_with(variables, redirect);
        assert_eq!(
            (failed.code, text(&failed.stderr)),
            (125, expected.to_string()),
            "{variables}"
        );
    }
}
