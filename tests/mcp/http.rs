//! `capexec mcp --listen http://127.0.0.1:0/mcp` as a child, and a raw
//! HTTP/1.1 client for what an SDK would never send.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::cli::{BIN, Served};

/// A listening `capexec mcp`, killed when dropped.
pub struct Listening {
    pub child: Child,
    /// The URL it printed.
    pub url: String,
    /// `127.0.0.1:PORT`.
    pub authority: String,
    /// The capexec server it connects to, if any: ended after it.
    _served: Option<Served>,
}

impl Listening {
    /// `capexec mcp --root ROOT --listen http://127.0.0.1:0/mcp EXTRA...`,
    /// once it printed its URL.
    pub fn start(root: &Path, extra: &[&str]) -> Listening {
        Listening::start_with(root, extra, None)
    }

    /// The same through `served` (EXTRA says how to connect).
    pub fn start_with(root: &Path, extra: &[&str], served: Option<Served>) -> Listening {
        Listening::start_at("http://127.0.0.1:0/mcp", root, extra, served)
    }

    /// The same listening at `listen`.
    pub fn start_at(
        listen: &str,
        root: &Path,
        extra: &[&str],
        served: Option<Served>,
    ) -> Listening {
        let mut command = Command::new(BIN);
        command
            .arg("mcp")
            .arg("--root")
            .arg(root)
            .args(["--listen", listen])
            .args(extra)
            .env_remove("CAPEXEC_CONNECT")
            .env_remove("XDG_CONFIG_HOME")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(served) = &served {
            command.env("HOME", served.home.path());
        }
        let mut child = command.spawn().expect("start capexec mcp --listen");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read the URL");
        let url = line.trim_end().to_string();
        let authority = url
            .strip_prefix("http://")
            .and_then(|rest| rest.strip_suffix("/mcp"))
            .unwrap_or_else(|| panic!("not the URL of a listener: {line:?}"))
            .to_string();
        assert!(!authority.ends_with(":0"), "{url}");
        Listening {
            child,
            url,
            authority,
            _served: served,
        }
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP answer: status, headers (names lower-case) and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    /// The JSON-RPC messages of an SSE body, or of a JSON one.
    pub fn messages(&self) -> Vec<serde_json::Value> {
        if self.header("content-type") == Some("application/json") {
            return vec![serde_json::from_str(&self.body).expect("a JSON body")];
        }
        self.body
            .lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .filter(|data| !data.trim().is_empty())
            .map(|data| serde_json::from_str(data).expect("JSON data"))
            .collect()
    }
}

/// Sends one request (`Connection: close`) and reads the whole answer.
/// `headers` are added as given, after `Host` (unless given) and
/// `Content-Length`.
pub fn request(authority: &str, method: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
    let mut stream = TcpStream::connect(authority).expect("connect to capexec mcp");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let mut head = format!("{method} /mcp HTTP/1.1\r\n");
    if !headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("host"))
    {
        head.push_str(&format!("Host: {authority}\r\n"));
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    ));
    stream.write_all(head.as_bytes()).expect("send the head");
    // A server that refuses early may close before the whole body is sent.
    let _ = stream.write_all(body);
    read_answer(stream)
}

fn read_answer(stream: TcpStream) -> Answer {
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line).expect("a status line");
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("a status line: {status_line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).expect("a header line");
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').expect("name: value");
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    let mut raw = Vec::new();
    let _ = reader.read_to_end(&mut raw);
    let chunked = headers
        .iter()
        .any(|(name, value)| name == "transfer-encoding" && value == "chunked");
    let body = if chunked { unchunk(&raw) } else { raw };
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

fn unchunk(mut raw: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    while let Some(end) = raw.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&raw[..end])
            .ok()
            .and_then(|size| usize::from_str_radix(size.trim(), 16).ok())
            .unwrap_or(0);
        if size == 0 || raw.len() < end + 2 + size {
            break;
        }
        body.extend_from_slice(&raw[end + 2..end + 2 + size]);
        raw = &raw[(end + 4 + size).min(raw.len())..];
    }
    body
}

/// The headers of a POST of MCP, in session `session` if any.
pub fn mcp_headers(session: Option<&str>) -> Vec<(&str, &str)> {
    let mut headers = vec![
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
    ];
    if let Some(session) = session {
        headers.push(("Mcp-Session-Id", session));
        headers.push(("MCP-Protocol-Version", "2025-11-25"));
    }
    headers
}

/// Initializes a session and returns its id.
pub fn initialize(authority: &str) -> String {
    let answer = request(
        authority,
        "POST",
        &mcp_headers(None),
        serde_json::json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "capexec-tests", "version": "1"}},
        })
        .to_string()
        .as_bytes(),
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    let session = answer
        .header("mcp-session-id")
        .unwrap_or_else(|| panic!("no session id: {answer:?}"))
        .to_string();
    let initialized = request(
        authority,
        "POST",
        &mcp_headers(Some(&session)),
        br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    assert_eq!(initialized.status, 202, "{initialized:?}");
    session
}

/// One JSON-RPC request in `session`: its answer message.
pub fn call(
    authority: &str,
    session: &str,
    id: u64,
    method: &str,
    params: serde_json::Value,
) -> serde_json::Value {
    let answer = request(
        authority,
        "POST",
        &mcp_headers(Some(session)),
        serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    answer
        .messages()
        .into_iter()
        .find(|message| message.get("id") == Some(&serde_json::json!(id)))
        .unwrap_or_else(|| panic!("no answer to {id}: {answer:?}"))
}
