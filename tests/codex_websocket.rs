//! The Codex bridge's websocket listener (`--listen ws://`), as a client
//! meets it: `/readyz` open, 401 without the bearer token or with a wrong
//! one, 403 for a browser's `Origin`, and JSON messages both ways once
//! admitted. The listener serves an echo here; the protocol over it is the
//! bridge's, tested with the rest of the bridge.

mod common;

use std::net::SocketAddr;

use capexec::codex::websocket::{WsListener, parse_listen_url};
use capexec::net::Token;
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const SECRET: &str = "the-listener-token-0123456789abcdef";

/// A listener on loopback whose connections echo every message with a
/// prefix; its address.
async fn echo_listener() -> SocketAddr {
    let listener = WsListener::bind(
        parse_listen_url("ws://127.0.0.1:0").expect("url"),
        Token::new(SECRET),
    )
    .await
    .expect("bind");
    let url = listener.url().expect("url");
    assert!(url.starts_with("ws://127.0.0.1:"), "{url}");
    let address = parse_listen_url(&url).expect("printed url");
    tokio::task::spawn_local(listener.run(|mut inbound, mut outbound| async move {
        while let Some(Ok(text)) = inbound.next().await {
            if outbound.send(format!("echo {text}")).await.is_err() {
                break;
            }
        }
    }));
    address
}

/// Sends `request` as it is and reads the whole answer.
async fn raw(address: SocketAddr, request: &str) -> String {
    let mut socket = TcpStream::connect(address).await.expect("connect");
    socket.write_all(request.as_bytes()).await.expect("write");
    let mut answer = String::new();
    socket.read_to_string(&mut answer).await.expect("read");
    answer
}

fn upgrade(extra: &str) -> String {
    format!(
        "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
    )
}

fn status_line(answer: &str) -> &str {
    answer.lines().next().unwrap_or("")
}

#[test]
fn readyz_is_open_and_upgrades_need_the_token_and_no_origin() {
    common::run_on_runtime(async {
        let address = echo_listener().await;
        let ready = raw(address, "GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert_eq!(status_line(&ready), "HTTP/1.1 200 OK", "{ready}");
        assert!(ready.ends_with("Content-Length: 0\r\nConnection: close\r\n\r\n"));
        let missing = raw(address, &upgrade("")).await;
        assert_eq!(
            status_line(&missing),
            "HTTP/1.1 401 Unauthorized",
            "{missing}"
        );
        assert!(
            missing.contains("WWW-Authenticate: Bearer\r\n"),
            "{missing}"
        );
        assert!(
            missing.ends_with("\r\n\r\nmissing websocket bearer token"),
            "{missing}"
        );
        let wrong = raw(address, &upgrade("Authorization: Bearer not-the-token\r\n")).await;
        assert_eq!(status_line(&wrong), "HTTP/1.1 401 Unauthorized", "{wrong}");
        assert!(
            wrong.ends_with("\r\n\r\ninvalid websocket bearer token"),
            "{wrong}"
        );
        // A browser is refused before its token is looked at, as Codex does.
        let unauthenticated_browser =
            raw(address, &upgrade("Origin: http://evil.example\r\n")).await;
        assert_eq!(
            status_line(&unauthenticated_browser),
            "HTTP/1.1 403 Forbidden",
            "{unauthenticated_browser}"
        );
        let browser = raw(
            address,
            &upgrade(&format!(
                "Authorization: Bearer {SECRET}\r\nOrigin: http://evil.example\r\n"
            )),
        )
        .await;
        assert_eq!(status_line(&browser), "HTTP/1.1 403 Forbidden", "{browser}");
        let plain = raw(
            address,
            &format!("GET / HTTP/1.1\r\nAuthorization: Bearer {SECRET}\r\n\r\n"),
        )
        .await;
        assert_eq!(status_line(&plain), "HTTP/1.1 400 Bad Request", "{plain}");
    });
}

#[test]
fn an_admitted_client_exchanges_json_messages() {
    common::run_on_runtime(async {
        let address = echo_listener().await;
        let mut request = format!("ws://{address}/")
            .into_client_request()
            .expect("request");
        request.headers_mut().insert(
            "Authorization",
            format!("Bearer {SECRET}").parse().expect("header"),
        );
        let socket = TcpStream::connect(address).await.expect("connect");
        let (mut websocket, response) = tokio_tungstenite::client_async(request, socket)
            .await
            .expect("handshake");
        assert_eq!(response.status(), 101);
        for message in [r#"{"id":1,"method":"initialize","params":{}}"#, "{}"] {
            websocket.send(Message::text(message)).await.expect("send");
            let answer = websocket.next().await.expect("an answer").expect("read");
            assert_eq!(answer, Message::text(format!("echo {message}")));
        }
        // Binary frames carry messages too, as Codex's listener takes them.
        websocket
            .send(Message::binary(b"{\"b\":1}".to_vec()))
            .await
            .expect("send");
        let answer = websocket.next().await.expect("an answer").expect("read");
        assert_eq!(answer, Message::text("echo {\"b\":1}"));
        websocket.close(None).await.expect("close");
    });
}

#[test]
fn a_listener_without_a_token_is_refused() {
    common::run_on_runtime(async {
        let serve = |_inbound, _outbound| async {};
        let refused = capexec::codex::websocket::listen("ws://127.0.0.1:0", None, serve)
            .await
            .expect_err("no token");
        assert_eq!(
            refused,
            "--listen ws://127.0.0.1:0 needs --ws-token-file FILE: the listener serves only \
             clients that present its token (Codex's auth_bearer_token)"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let short = dir.path().join("short");
        std::fs::write(&short, "abc\n").expect("write");
        let refused = capexec::codex::websocket::listen("ws://127.0.0.1:0", Some(&short), serve)
            .await
            .expect_err("a short token");
        assert!(refused.starts_with("--ws-token-file: "), "{refused}");
        let refused = capexec::codex::websocket::listen("wss://127.0.0.1:0", Some(&short), serve)
            .await
            .expect_err("not ws");
        assert!(refused.contains("expected ws://HOST:PORT"), "{refused}");
    });
}

/// `capexec codex-bridge --listen`: the URL as stdout's one line, and
/// Codex's protocol over the websocket, a command's output pushed.
#[test]
fn the_bridge_serves_codex_s_protocol_over_a_websocket() {
    common::run_on_runtime(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, format!("{SECRET}\n")).expect("token");
        std::fs::set_permissions(
            &token_file,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .expect("chmod");
        let mut bridge = tokio::process::Command::new(env!("CARGO_BIN_EXE_capexec"))
            .args([
                "codex-bridge",
                "--listen",
                "ws://127.0.0.1:0",
                "--ws-token-file",
            ])
            .arg(&token_file)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("capexec codex-bridge");
        let mut stdout = tokio::io::BufReader::new(bridge.stdout.take().expect("stdout"));
        let mut url = String::new();
        tokio::io::AsyncBufReadExt::read_line(&mut stdout, &mut url)
            .await
            .expect("the URL");
        let address = parse_listen_url(url.trim_end()).expect("a ws:// URL and a newline");
        let mut request = format!("ws://{address}/")
            .into_client_request()
            .expect("request");
        request.headers_mut().insert(
            "Authorization",
            format!("Bearer {SECRET}").parse().expect("header"),
        );
        let socket = TcpStream::connect(address).await.expect("connect");
        let our_port = socket.local_addr().expect("local address").port();
        let (mut websocket, _) = tokio_tungstenite::client_async(request, socket)
            .await
            .expect("handshake");
        // The bridge's end of this connection has Nagle's algorithm off
        // (Codex's own listener leaves it on, and stalls ~40 ms).
        let pid = bridge.id().expect("the bridge runs");
        assert_eq!(peer_socket_nodelay(pid, our_port), Some(true));
        let mut send = async |message: serde_json::Value| {
            websocket
                .send(Message::text(message.to_string()))
                .await
                .expect("send");
        };
        send(
            serde_json::json!({"id": 1, "method": "initialize", "params": {"clientName": "test"}}),
        )
        .await;
        send(serde_json::json!({"method": "initialized", "params": {}})).await;
        send(
            serde_json::json!({"id": 2, "method": "process/start", "params": {
                "processId": "p1", "argv": ["sh", "-c", "echo over-ws"],
                "cwd": format!("file://{}", dir.path().display()), "env": {"PATH": "/usr/bin:/bin"},
                "tty": false, "pipeStdin": false, "sandbox": null,
            }}),
        )
        .await;
        let (mut output, mut exit, mut start) = (Vec::new(), None, None);
        while let Some(message) = websocket.next().await {
            let Message::Text(text) = message.expect("read") else {
                continue;
            };
            let message: serde_json::Value = serde_json::from_str(&text).expect("JSON");
            if message["id"] == 2 {
                start = Some(message["result"].clone());
            }
            match message["method"].as_str() {
                Some("process/output") => output.push(message["params"]["chunk"].clone()),
                Some("process/exited") => exit = Some(message["params"]["exitCode"].clone()),
                Some("process/closed") => break,
                _ => {}
            }
        }
        assert_eq!(
            start,
            Some(serde_json::json!({"processId": "p1", "sandboxType": "none"}))
        );
        // "over-ws\n" in base64.
        assert_eq!(output, [serde_json::json!("b3Zlci13cwo=")]);
        assert_eq!(exit, Some(serde_json::json!(0)));
    });
}

/// Without its token file, --listen is refused before anything is served.
#[test]
fn the_bridge_will_not_listen_without_a_token() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_capexec"))
        .args(["codex-bridge", "--listen", "ws://127.0.0.1:0"])
        .output()
        .expect("capexec codex-bridge");
    assert_eq!(output.status.code(), Some(125));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "");
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "capexec: codex-bridge: --listen ws://127.0.0.1:0 needs --ws-token-file FILE: the \
         listener serves only clients that present its token (Codex's auth_bearer_token)\n"
    );
}

/// Whether the TCP socket of process `pid` connected to our port
/// `our_port` has TCP_NODELAY set, read through a copy of its descriptor
/// (pidfd_getfd: this test's user may trace its own children).
fn peer_socket_nodelay(pid: u32, our_port: u16) -> Option<bool> {
    // SAFETY: plain system calls on descriptors this function owns.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) as libc::c_int;
        assert!(
            pidfd >= 0,
            "pidfd_open: {}",
            std::io::Error::last_os_error()
        );
        let mut found = None;
        for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).expect("the bridge's descriptors")
        {
            let Some(target) = entry
                .ok()
                .and_then(|entry| entry.file_name().to_str()?.parse::<libc::c_int>().ok())
            else {
                continue;
            };
            let fd = libc::syscall(libc::SYS_pidfd_getfd, pidfd, target, 0) as libc::c_int;
            if fd < 0 {
                continue;
            }
            let mut peer: libc::sockaddr_storage = std::mem::zeroed();
            let mut length = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            if libc::getpeername(fd, (&raw mut peer).cast(), &mut length) == 0
                && libc::c_int::from(peer.ss_family) == libc::AF_INET
            {
                let peer = &*(&raw const peer).cast::<libc::sockaddr_in>();
                if u16::from_be(peer.sin_port) == our_port {
                    let mut value: libc::c_int = 0;
                    let mut size = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                    let got = libc::getsockopt(
                        fd,
                        libc::IPPROTO_TCP,
                        libc::TCP_NODELAY,
                        (&raw mut value).cast(),
                        &mut size,
                    );
                    assert_eq!(got, 0, "getsockopt: {}", std::io::Error::last_os_error());
                    found = Some(value != 0);
                }
            }
            libc::close(fd);
        }
        libc::close(pidfd);
        found
    }
}
