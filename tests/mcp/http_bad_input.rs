//! What HTTP clients get wrong, and what they are refused: each is
//! answered, and the server goes on serving the session that was open.

use std::io::Write;
use std::net::TcpStream;
use std::process::{Command, Stdio};

use serde_json::json;

use crate::client::{bytes, gone, pid_in};
use crate::common::data::TempDir;
use crate::common::eventually;
use crate::http::{Listening, call, initialize, mcp_headers, request};

/// `exec` of `echo alive` in `session` still works.
fn still_serves(authority: &str, session: &str, id: u64) {
    let answer = call(
        authority,
        session,
        id,
        "tools/call",
        json!({"name": "exec", "arguments": {"argv": ["echo", "alive"]}}),
    );
    let result = &answer["result"];
    assert_eq!(result["isError"], false, "{answer}");
    assert_eq!(bytes(&result["structuredContent"]["stdout"]), b"alive\n");
}

#[test]
fn bad_http_input_is_answered_and_the_server_goes_on() {
    let root = TempDir::new("mcp-http-bad");
    let server = Listening::start(root.path(), &[]);
    let authority = server.authority.as_str();
    let session = initialize(authority);
    still_serves(authority, &session, 1);

    // Malformed JSON: a JSON-RPC parse error, with HTTP 4xx.
    let answer = request(
        authority,
        "POST",
        &mcp_headers(Some(&session)),
        b"{not json",
    );
    assert!((400..500).contains(&answer.status), "{answer:?}");
    still_serves(authority, &session, 2);
    // JSON that is no JSON-RPC message.
    let answer = request(
        authority,
        "POST",
        &mcp_headers(Some(&session)),
        br#"{"jsonrpc":"2.0","id":3,"method":5}"#,
    );
    assert!((400..500).contains(&answer.status), "{answer:?}");
    // An unknown tool: a JSON-RPC error naming the tools.
    let answer = call(
        authority,
        &session,
        4,
        "tools/call",
        json!({"name": "rm_rf", "arguments": {}}),
    );
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    assert!(
        answer["error"]["message"].as_str().is_some_and(
            |text| text.starts_with("capexec: unknown tool \"rm_rf\"; the tools are: exec,")
        ),
        "{answer}"
    );
    // Wrong argument types: a tool error.
    let answer = call(
        authority,
        &session,
        5,
        "tools/call",
        json!({"name": "exec", "arguments": {"argv": "echo hi"}}),
    );
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    let text = answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(
        text.starts_with("capexec: exec: invalid arguments: invalid type: string \"echo hi\""),
        "{text}"
    );
    // A huge body: 413 before it is all held.
    let huge = vec![b' '; 17 << 20];
    let answer = request(authority, "POST", &mcp_headers(Some(&session)), &huge);
    assert_eq!(answer.status, 413, "{answer:?}");
    // An unknown session: 404, as the spec says.
    let answer = call_status(authority, "not-a-session");
    assert_eq!(answer, 404);
    // A request head that never ends within the deadline is dropped; one
    // that was sent in part and abandoned too.
    let mut half = TcpStream::connect(authority).expect("connect");
    half.write_all(b"POST /mcp HTTP/1.1\r\nHost: ")
        .expect("half a head");
    drop(half);
    still_serves(authority, &session, 6);

    // Refusals: a rebinding Host, a foreign Origin, another path.
    let answer = request(authority, "POST", &[("Host", "evil.example.com")], b"{}");
    assert_eq!(answer.status, 403, "{answer:?}");
    assert_eq!(
        answer.body,
        "capexec: mcp: the Host header does not name this listener (DNS rebinding protection)"
    );
    let mut headers = mcp_headers(Some(&session));
    headers.push(("Origin", "https://evil.example.com"));
    let answer = request(authority, "POST", &headers, b"{}");
    assert_eq!(answer.status, 403, "{answer:?}");
    still_serves(authority, &session, 7);
}

fn call_status(authority: &str, session: &str) -> u16 {
    request(
        authority,
        "POST",
        &mcp_headers(Some(session)),
        br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
    )
    .status
}

/// The issue's spelling, `--listen URL --token-file FILE` (the embedded
/// executor has no connection for `--token-file` to log into), and
/// `--http-token-file FILE`, which also works beside `--connect`.
#[test]
fn a_token_is_required_when_given_and_compared() {
    for flag in ["--http-token-file", "--token-file"] {
        a_token_is_required_when_given_by(flag);
    }
}

fn a_token_is_required_when_given_by(flag: &str) {
    let root = TempDir::new("mcp-http-token");
    let secrets = TempDir::new("mcp-http-token-file");
    let token_file = secrets.path().join("token");
    std::fs::write(&token_file, "a-bearer-token-of-the-listener-42\n").expect("token");
    std::fs::set_permissions(
        &token_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .expect("chmod");
    let file = token_file.display().to_string();
    let server = Listening::start(root.path(), &[flag, &file]);
    let body = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let answer = request(&server.authority, "POST", &mcp_headers(None), body);
    assert_eq!(answer.status, 401, "{answer:?}");
    assert_eq!(answer.header("www-authenticate"), Some("Bearer"));
    assert_eq!(answer.body, "capexec: mcp: a bearer token is required");
    let mut headers = mcp_headers(None);
    headers.push(("Authorization", "Bearer a-bearer-token-of-the-listener-43"));
    let answer = request(&server.authority, "POST", &headers, body);
    assert_eq!(answer.status, 401, "{answer:?}");
    assert_eq!(answer.body, "capexec: mcp: invalid bearer token");
    let mut headers = mcp_headers(None);
    headers.push(("Authorization", "Bearer a-bearer-token-of-the-listener-42"));
    let answer = request(
        &server.authority,
        "POST",
        &headers,
        json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "capexec-tests", "version": "1"}},
        })
        .to_string()
        .as_bytes(),
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(answer.header("mcp-session-id").is_some(), "{answer:?}");
}

#[test]
fn off_loopback_without_a_token_is_refused_at_start() {
    let output = Command::new(crate::common::cli::BIN)
        .args(["mcp", "--listen", "http://0.0.0.0:0/mcp"])
        .stdin(Stdio::null())
        .output()
        .expect("run capexec mcp");
    assert_eq!(output.status.code(), Some(125));
    assert_eq!(output.stdout, b"");
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "capexec: mcp: --listen http://0.0.0.0:0/mcp is not a loopback address: it needs \
         --token-file FILE (with --connect: --http-token-file FILE), whose token clients must \
         present (Authorization: Bearer)\n"
    );
    // Beside --connect, --token-file is the connection's: which token the
    // clients present is asked, not guessed.
    let output = Command::new(crate::common::cli::BIN)
        .args([
            "mcp",
            "--connect",
            "tcp:127.0.0.1:1",
            "--token-file",
            "/nonexistent",
            "--listen",
            "http://127.0.0.1:0/mcp",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run capexec mcp");
    assert_eq!(output.status.code(), Some(125));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "capexec: mcp: with --connect, --token-file is the login token of the connection: name \
         the token of --listen's clients with --http-token-file FILE\n"
    );
    let output = Command::new(crate::common::cli::BIN)
        .args(["mcp", "--http-token-file", "/nonexistent"])
        .stdin(Stdio::null())
        .output()
        .expect("run capexec mcp");
    assert_eq!(output.status.code(), Some(125));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "capexec: mcp: --http-token-file is the token of --listen http://HOST:PORT/PATH\n"
    );
    let output = Command::new(crate::common::cli::BIN)
        .args(["mcp", "--listen", "ws://127.0.0.1:0"])
        .stdin(Stdio::null())
        .output()
        .expect("run capexec mcp");
    assert_eq!(output.status.code(), Some(125));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "capexec: mcp: --listen \"ws://127.0.0.1:0\": expected http://IP:PORT/PATH, such as \
         http://127.0.0.1:0/mcp\n"
    );
}

/// A client that vanishes mid-call (its process ends): the server goes
/// on; DELETE of a session ends its processes; SIGTERM ends the server
/// and every session's processes.
#[test]
fn vanished_clients_deleted_sessions_and_sigterm() {
    let root = TempDir::new("mcp-http-end");
    let mut server = Listening::start(root.path(), &[]);
    let authority = server.authority.clone();
    // A client process that starts a long exec and is killed mid-call.
    let session = initialize(&authority);
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "exec",
        "arguments": {"command": "echo $$ > vanished.pid; exec sleep 300", "yield_ms": 60000},
    }})
    .to_string();
    // The client is a process of its own (Python, a raw socket): it sends
    // the call, then waits to be killed.
    let (host, port) = authority.rsplit_once(':').expect("HOST:PORT");
    let raw = format!(
        "POST /mcp HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMcp-Session-Id: {session}\r\n\
         MCP-Protocol-Version: 2025-11-25\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut client = Command::new(&crate::tools::mcp_tools().python)
        .args([
            "-c",
            "import socket, sys, time\n\
             s = socket.create_connection((sys.argv[1], int(sys.argv[2])))\n\
             s.sendall(sys.argv[3].encode())\n\
             time.sleep(300)\n",
            host,
            port,
            &raw,
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("start the client");
    let vanished = pid_in(&root.path().join("vanished.pid"));
    client.kill().expect("kill the client");
    client.wait().expect("wait for the client");
    still_serves(&authority, &session, 2);
    let other = initialize(&authority);
    still_serves(&authority, &other, 1);
    // DELETE ends the session and its processes.
    let answer = request(&authority, "DELETE", &mcp_headers(Some(&session)), b"");
    assert_eq!(answer.status, 200, "{answer:?}");
    eventually("the deleted session's process ends", || gone(vanished));
    assert_eq!(call_status(&authority, &session), 404);
    // SIGTERM: every session's processes end, and capexec with 0.
    let answer = call(
        &authority,
        &other,
        2,
        "tools/call",
        json!({"name": "exec", "arguments": {"command": "echo $$ > other.pid; exec sleep 300", "yield_ms": 0}}),
    );
    assert_eq!(answer["result"]["isError"], false, "{answer}");
    let running = pid_in(&root.path().join("other.pid"));
    crate::common::cli::kill(&server.child, libc::SIGTERM);
    let code = crate::common::cli::wait(&mut server.child);
    assert_eq!(code, 0);
    assert!(gone(running), "a session's process outlived capexec mcp");
}

/// 64 sessions at once: the 65th is refused with 503 and the reason, and
/// one ending makes room.
#[test]
fn sessions_are_bounded() {
    let root = TempDir::new("mcp-http-sessions");
    let server = Listening::start(root.path(), &[]);
    let sessions: Vec<String> = (0..64).map(|_| initialize(&server.authority)).collect();
    let answer = request(
        &server.authority,
        "POST",
        &mcp_headers(None),
        json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "capexec-tests", "version": "1"}},
        })
        .to_string()
        .as_bytes(),
    );
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(
        answer.body,
        "capexec: mcp: this server holds 64 MCP sessions already; end one (DELETE) or wait \
         for an idle one to expire"
    );
    // The sessions open still serve.
    still_serves(&server.authority, &sessions[63], 1);
    let answer = request(
        &server.authority,
        "DELETE",
        &mcp_headers(Some(&sessions[0])),
        b"",
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    let newer = initialize(&server.authority);
    still_serves(&server.authority, &newer, 1);
}

/// A session with no request for --session-idle ends, and its processes
/// with it.
#[test]
fn an_idle_session_ends_with_its_processes() {
    let root = TempDir::new("mcp-http-idle");
    let server = Listening::start(root.path(), &["--session-idle", "2s"]);
    let authority = server.authority.as_str();
    let session = initialize(authority);
    let answer = call(
        authority,
        &session,
        1,
        "tools/call",
        json!({"name": "exec", "arguments": {"command": "echo $$ > idle.pid; exec sleep 300", "yield_ms": 0}}),
    );
    assert_eq!(answer["result"]["isError"], false, "{answer}");
    let pid = pid_in(&root.path().join("idle.pid"));
    eventually("the idle session's process ends", || gone(pid));
    assert_eq!(call_status(authority, &session), 404);
}

/// On every address (`0.0.0.0`) with a token: an IP address with the port
/// is a Host it answers to, a name is not; the token is required.
#[test]
fn a_listener_on_every_address_wants_its_token_and_an_ip_host() {
    let root = TempDir::new("mcp-http-any");
    let secrets = TempDir::new("mcp-http-any-token");
    let token_file = secrets.path().join("token");
    std::fs::write(&token_file, "token-of-the-listener-on-0.0.0.0\n").expect("token");
    std::fs::set_permissions(
        &token_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .expect("chmod");
    let file = token_file.display().to_string();
    let server = Listening::start_at(
        "http://0.0.0.0:0/mcp",
        root.path(),
        &["--http-token-file", &file],
        None,
    );
    let port = server
        .authority
        .strip_prefix("0.0.0.0:")
        .unwrap_or_else(|| panic!("{}", server.url))
        .to_string();
    let loopback = format!("127.0.0.1:{port}");
    let body = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let answer = request(&loopback, "POST", &mcp_headers(None), body);
    assert_eq!(answer.status, 401, "{answer:?}");
    let mut headers = mcp_headers(None);
    headers.push(("Authorization", "Bearer token-of-the-listener-on-0.0.0.0"));
    let named = format!("attacker.example:{port}");
    let mut rebinding = headers.clone();
    rebinding.push(("Host", &named));
    let answer = request(&loopback, "POST", &rebinding, body);
    assert_eq!(answer.status, 403, "{answer:?}");
    let initialize = json!({
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "capexec-tests", "version": "1"}},
    })
    .to_string();
    let answer = request(&loopback, "POST", &headers, initialize.as_bytes());
    assert_eq!(answer.status, 200, "{answer:?}");
}
