//! `capexec serve --metrics`: Prometheus text with what the server did,
//! and nothing of what went through it (no output, input, arguments,
//! tokens or peers).

use crate::common;

use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use common::cli::{BIN, Watched, finish, text};
use common::data::TempDir;

fn scrape(address: &str, request: &str) -> String {
    let mut stream = std::net::TcpStream::connect(address).expect("connect to the metrics");
    stream.write_all(request.as_bytes()).expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    response
}

/// The value of the sample `name` (with its labels) in `body`.
fn sample(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn metrics_count_what_happened_and_leak_nothing() {
    let home = TempDir::new("cli-metrics");
    let token_file = home.path().join("token");
    let secret_token = "SECRETTOKEN".repeat(4);
    std::fs::write(&token_file, &secret_token).expect("token");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let mut serve = Command::new(BIN);
    serve
        .args([
            "serve",
            "--listen",
            "tcp:127.0.0.1:0",
            "--metrics",
            "tcp:127.0.0.1:0",
            "--token-file",
        ])
        .arg(&token_file)
        .env("HOME", home.path());
    let server = Watched::spawn(serve);
    server.wait_for_stderr("/metrics\n");
    let stderr = server.stderr_text();
    let url = stderr
        .lines()
        .find_map(|line| line.strip_prefix("capexec: metrics at http://"))
        .expect("the metrics address")
        .trim_end_matches("/metrics")
        .to_string();
    server.wait_for_stdout("\n");
    let tcp = server.stdout_text().trim().to_string();
    let token = token_file.display().to_string();
    let run = |args: &[&str], stdin: Option<Vec<u8>>| {
        let mut command = Command::new(BIN);
        command
            .args(["run", "--connect", &tcp, "--token-file", &token])
            .args(args)
            .env("HOME", home.path())
            .env_remove("CAPEXEC_CONNECT");
        finish(command, stdin)
    };
    let ran = run(
        &[
            "--",
            "sh",
            "-c",
            "cat >/dev/null; printf SECRET-OUTPUT; exit 3",
            "SECRET-ARG",
        ],
        Some(b"SECRET-INPUT".to_vec()),
    );
    assert_eq!(
        (ran.code, text(&ran.stdout)),
        (3, "SECRET-OUTPUT".to_string())
    );
    let missing = run(&["--", "/nonexistent/SECRET-PROGRAM"], None);
    assert_eq!(missing.code, 127);
    let wrong_token = home.path().join("wrong");
    std::fs::write(&wrong_token, "W".repeat(40)).expect("wrong token");
    let mut refused = Command::new(BIN);
    refused
        .args(["run", "--connect", &tcp, "--token-file"])
        .arg(&wrong_token)
        .args(["--", "true"])
        .env("HOME", home.path());
    assert_eq!(finish(refused, None).code, 125);

    // Connections close on the server a moment after the clients exit.
    let body = common::eventually("no connections or processes left", || {
        let response = scrape(&url, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        let (head, body) = response.split_once("\r\n\r\n").expect("a response");
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(
            head.contains("Content-Type: application/openmetrics-text"),
            "{head}"
        );
        let body = body.to_string();
        if sample(&body, "capexec_connections{state=\"open\"}") == Some(0.0)
            && sample(&body, "capexec_processes") == Some(0.0)
        {
            Ok(body)
        } else {
            Err(body)
        }
    });
    assert_eq!(
        sample(&body, "capexec_connections{state=\"awaiting-login\"}"),
        Some(0.0),
        "{body}"
    );
    // A connection that has not logged in is counted as such while it
    // waits.
    let port = tcp.rsplit(':').next().expect("port");
    let waiting = std::net::TcpStream::connect(("127.0.0.1", port.parse::<u16>().expect("port")))
        .expect("connect");
    let awaiting = |wanted: f64| {
        common::eventually(&format!("{wanted} connections awaiting login"), || {
            let response = scrape(&url, "GET /metrics HTTP/1.1\r\n\r\n");
            let value = sample(&response, "capexec_connections{state=\"awaiting-login\"}");
            if value == Some(wanted) {
                Ok(())
            } else {
                Err(response)
            }
        })
    };
    awaiting(1.0);
    drop(waiting);
    awaiting(0.0);
    for (name, value) in [
        ("capexec_processes_started_total", 1.0),
        (
            "capexec_processes_failed_total{tag=\"program-not-found\"}",
            1.0,
        ),
        ("capexec_process_exits_total{class=\"1-125\"}", 1.0),
        ("capexec_stdin_bytes_total", "SECRET-INPUT".len() as f64),
        ("capexec_output_bytes_total", "SECRET-OUTPUT".len() as f64),
        ("capexec_connections_opened_total", 3.0),
        ("capexec_refused_logins_total", 1.0),
    ] {
        assert_eq!(sample(&body, name), Some(value), "{name} in {body}");
    }
    assert!(body.ends_with("# EOF\n"), "{body}");
    for secret in [
        "SECRET",
        "W".repeat(40).as_str(),
        "127.0.0.1",
        "sh -c",
        "nonexistent",
    ] {
        assert!(!body.contains(secret), "{secret} leaked into {body}");
    }

    // Only GET /metrics; anything else is a short refusal.
    assert!(scrape(&url, "GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
    assert!(scrape(&url, "POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405 "));
    // Exactly the most a request head may be, and no end to it: the
    // server reads it all (so closing sends no reset) and refuses it.
    let mut oversized = "GET /metrics HTTP/1.1\r\nX: ".to_string();
    oversized.push_str(&"a".repeat(8192 - oversized.len()));
    assert!(scrape(&url, &oversized).starts_with("HTTP/1.1 431 "));
    // A scraper that never sends its request holds up nobody.
    let _silent = std::net::TcpStream::connect(&url).expect("connect");
    assert!(scrape(&url, "GET /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 200 "));
    let mut server = server;
    let _ = server.child.kill();
    let _ = server.child.wait();
}

/// Connections from one address that send half a request and then a byte
/// now and then (a slowloris) hold the endpoint for nobody: each is closed
/// by the server within the request deadline, or at once beyond the
/// address's share, and a scrape from another address is answered while
/// they keep coming.
#[test]
fn half_sent_requests_from_one_address_leave_the_endpoint_to_others() {
    let home = TempDir::new("cli-metrics-held");
    let socket = home.path().join("sock");
    let mut serve = Command::new(BIN);
    serve
        .args(["serve", "--metrics", "tcp:127.0.0.1:0", "--listen"])
        .arg(format!("unix:{}", socket.display()))
        .env("HOME", home.path());
    let mut server = Watched::spawn(serve);
    server.wait_for_stderr("/metrics\n");
    let url = server
        .stderr_text()
        .lines()
        .find_map(|line| line.strip_prefix("capexec: metrics at http://"))
        .expect("the metrics address")
        .trim_end_matches("/metrics")
        .to_string();
    let address: std::net::SocketAddr = url.parse().expect("a socket address");

    // Five times the endpoint's 64 places, all from 127.0.0.1: without a
    // share per address, the listener's queue alone holds another client
    // back for four rounds of whatever a request may take.
    let attackers: Vec<std::net::TcpStream> = (0..320)
        .map(|_| {
            let stream = std::net::TcpStream::connect(address).expect("connect");
            (&stream)
                .write_all(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
                .expect("half a request");
            stream.set_nonblocking(true).expect("nonblocking");
            stream
        })
        .collect();
    let started = Instant::now();
    let dripping = std::thread::spawn(move || {
        let mut open: Vec<(usize, std::net::TcpStream)> =
            attackers.into_iter().enumerate().collect();
        let mut closed_after = vec![Duration::ZERO; open.len()];
        let deadline = started + Duration::from_secs(30);
        while !open.is_empty() && Instant::now() < deadline {
            open.retain(|(index, stream)| {
                let mut byte = [0u8; 1];
                let closed = match (&*stream).read(&mut byte) {
                    Ok(_) => true,
                    Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                        (&*stream).write_all(b"a").is_err()
                    }
                    Err(_) => true,
                };
                if closed {
                    closed_after[*index] = started.elapsed();
                }
                !closed
            });
            std::thread::sleep(Duration::from_millis(100));
        }
        (open.len(), closed_after)
    });

    // Another address on the loopback network.
    let scraper =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    let other: std::net::SocketAddr = "127.0.0.2:0".parse().expect("address");
    scraper.bind(&other.into()).expect("bind 127.0.0.2");
    scraper.connect(&address.into()).expect("connect");
    let mut scraper: std::net::TcpStream = scraper.into();
    // Within the time the attack's first round would take to run out, let
    // alone the four ahead of it in the queue.
    scraper
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    scraper
        .write_all(b"GET /metrics HTTP/1.1\r\n\r\n")
        .expect("request");
    let mut response = String::new();
    let read = scraper.read_to_string(&mut response);
    let answered_after = started.elapsed();
    assert!(
        read.is_ok() && response.starts_with("HTTP/1.1 200 OK\r\n"),
        "the scrape from 127.0.0.2 was not answered after {answered_after:?} ({read:?}): \
         {response:?}"
    );

    let (still_open, closed_after) = dripping.join().expect("the dripping thread");
    assert_eq!(
        still_open, 0,
        "connections that never finish their request are closed by the server"
    );
    eprintln!(
        "scrape answered after {answered_after:?}; the held requests closed after {:?} at most",
        closed_after.iter().max()
    );
    let _ = server.child.kill();
    let _ = server.child.wait();
}
