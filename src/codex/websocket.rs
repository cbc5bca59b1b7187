//! `capexec codex-bridge --listen ws://HOST:PORT`: Codex's exec-server
//! protocol over websocket frames (one JSON message a frame), for Codex's
//! `url` environments, which send `auth_bearer_token` as
//! `Authorization: Bearer`. As Codex's own listener does (observed, 0.169.0,
//! the same status lines and bodies): `GET /readyz` answers 200 without a
//! token; a request from a browser (an `Origin` header) gets 403, before
//! its token is looked at; an upgrade without the token, or with another,
//! gets 401. Unlike it, every accepted
//! socket has `TCP_NODELAY` (Codex's stalls ~40 ms on Nagle and delayed
//! ACKs), and a token is required.
//!
//! The request head is read and judged here, before the websocket library
//! sees it, so that refusals are plain HTTP answers; the upgrade is then
//! answered here too and the socket handed to `tokio-tungstenite` as an
//! established websocket.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use futures::{Sink, SinkExt, Stream, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

use crate::net::Token;

/// The messages a connection receives, each one JSON text.
pub type Inbound = Pin<Box<dyn Stream<Item = io::Result<String>>>>;
/// Where a connection's messages go; ready only when the peer reads.
pub type Outbound = Pin<Box<dyn Sink<String, Error = io::Error>>>;

/// The longest request head read before an answer.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// How long a client may take to send its request head.
const HEAD_DEADLINE: Duration = Duration::from_secs(10);
/// Connections served at once; more wait to be accepted.
const MAX_CONNECTIONS: usize = 256;
/// Bytes queued for a peer that does not read before sends wait for it.
const WRITE_BUFFER_BYTES: usize = 256 * 1024;
/// The largest message a peer may send (Codex's JSON-RPC lines are far
/// smaller; a file write's base64 is the largest).
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// `ws://HOST:PORT` as a socket address (HOST an IP address, or
/// `localhost`).
pub fn parse_listen_url(url: &str) -> Result<SocketAddr, String> {
    let rest = url
        .strip_prefix("ws://")
        .ok_or_else(|| format!("--listen {url:?}: expected ws://HOST:PORT"))?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let rest = match rest.strip_prefix("localhost:") {
        Some(port) => format!("127.0.0.1:{port}"),
        None => rest.to_string(),
    };
    rest.parse()
        .map_err(|_| format!("--listen {url:?}: expected ws://IP:PORT, such as ws://127.0.0.1:0"))
}

/// `--listen ws://HOST:PORT --ws-token-file FILE`: loads the token
/// (required: a listener without one is refused), binds, prints the URL
/// it listens on as stdout's one line, and serves each connection with
/// `serve` until accepting fails. Runs on the RPC thread's `LocalSet`.
pub async fn listen<F, Fut>(
    url: &str,
    token_file: Option<&std::path::Path>,
    serve: F,
) -> Result<(), String>
where
    F: Fn(Inbound, Outbound) -> Fut + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let address = parse_listen_url(url)?;
    let Some(token_file) = token_file else {
        return Err(format!(
            "--listen {url} needs --ws-token-file FILE: the listener serves only clients \
             that present its token (Codex's auth_bearer_token)"
        ));
    };
    let token = Token::load(token_file).map_err(|error| format!("--ws-token-file: {error}"))?;
    let listener = WsListener::bind(address, token)
        .await
        .map_err(|error| format!("--listen {url}: {}", crate::model::io_message(&error)))?;
    let shown = listener
        .url()
        .map_err(|error| format!("--listen {url}: {}", crate::model::io_message(&error)))?;
    {
        use std::io::Write;
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{shown}")
            .and_then(|()| stdout.flush())
            .map_err(|error| format!("stdout: {}", crate::model::io_message(&error)))?;
    }
    listener
        .run(serve)
        .await
        .map_err(|error| format!("--listen {url}: {}", crate::model::io_message(&error)))
}

/// A bound websocket listener and the token its clients must present.
pub struct WsListener {
    listener: TcpListener,
    token: Rc<Token>,
}

impl WsListener {
    pub async fn bind(address: SocketAddr, token: Token) -> io::Result<WsListener> {
        Ok(WsListener {
            listener: TcpListener::bind(address).await?,
            token: Rc::new(token),
        })
    }

    /// The URL it listens on, as printed: `ws://127.0.0.1:PORT`.
    pub fn url(&self) -> io::Result<String> {
        Ok(format!("ws://{}", self.listener.local_addr()?))
    }

    /// Serves every connection with `serve` (on this thread's `LocalSet`)
    /// until accepting fails.
    pub async fn run<F, Fut>(self, serve: F) -> io::Result<()>
    where
        F: Fn(Inbound, Outbound) -> Fut + 'static,
        Fut: std::future::Future<Output = ()> + 'static,
    {
        let serve = Rc::new(serve);
        let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return Ok(());
            };
            let (socket, peer) = match self.listener.accept().await {
                Ok(accepted) => accepted,
                // A peer that reset before it was accepted, or a shortage
                // of descriptors: the listener goes on.
                Err(error) if is_transient(&error) => {
                    tracing::debug!(%error, "accept");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
                Err(error) => return Err(error),
            };
            let token = self.token.clone();
            let serve = serve.clone();
            tokio::task::spawn_local(async move {
                let _slot = slot;
                match admit(socket, &token).await {
                    Ok(Some(websocket)) => {
                        let (inbound, outbound) = channels(websocket);
                        serve(inbound, outbound).await;
                    }
                    Ok(None) => {}
                    Err(error) => tracing::debug!(%peer, %error, "websocket handshake"),
                }
            });
        }
    }
}

fn is_transient(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    ) || matches!(
        error.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// What a request head asked for, as far as the listener cares.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Ready,
    Upgrade {
        key: String,
    },
    Refuse {
        status: &'static str,
        reason: &'static str,
    },
}

/// Judges a complete request head: `/readyz`, `Origin`, the token, and a
/// well-formed websocket upgrade, in that order.
fn judge(head: &[u8], token: &Token) -> Verdict {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    let bad = Verdict::Refuse {
        status: "400 Bad Request",
        reason: "not a websocket upgrade",
    };
    if !matches!(request.parse(head), Ok(httparse::Status::Complete(_))) {
        return bad;
    }
    let header = |name: &str| {
        request
            .headers
            .iter()
            .find(|header| header.name.eq_ignore_ascii_case(name))
            .map(|header| header.value)
    };
    let path = request.path.unwrap_or("");
    if request.method == Some("GET") && (path == "/readyz" || path.starts_with("/readyz?")) {
        return Verdict::Ready;
    }
    // Codex's listener refuses a browser before it looks at the token.
    if header("origin").is_some() {
        return Verdict::Refuse {
            status: "403 Forbidden",
            reason: "",
        };
    }
    let presented = header("authorization")
        .and_then(|value| std::str::from_utf8(value).ok())
        .and_then(|value| {
            let (scheme, credential) = value.trim().split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| credential.trim())
        });
    match presented {
        None => {
            return Verdict::Refuse {
                status: "401 Unauthorized",
                reason: "missing websocket bearer token",
            };
        }
        Some(candidate) if !token.matches(candidate) => {
            return Verdict::Refuse {
                status: "401 Unauthorized",
                reason: "invalid websocket bearer token",
            };
        }
        Some(_) => {}
    }
    let has = |name: &str, word: &str| {
        header(name)
            .and_then(|value| std::str::from_utf8(value).ok())
            .is_some_and(|value| {
                value
                    .split(',')
                    .any(|part| part.trim().eq_ignore_ascii_case(word))
            })
    };
    let key = header("sec-websocket-key").and_then(|key| std::str::from_utf8(key).ok());
    match key {
        Some(key)
            if request.method == Some("GET")
                && has("upgrade", "websocket")
                && has("connection", "upgrade")
                && has("sec-websocket-version", "13") =>
        {
            Verdict::Upgrade {
                key: key.trim().to_string(),
            }
        }
        _ => bad,
    }
}

/// Reads the request head and answers it: a websocket for an admitted
/// upgrade, `None` when the answer was all (readiness, a refusal).
async fn admit(
    mut socket: TcpStream,
    token: &Token,
) -> io::Result<Option<WebSocketStream<TcpStream>>> {
    socket.set_nodelay(true)?;
    let head = tokio::time::timeout(HEAD_DEADLINE, read_head(&mut socket))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no request head in time"))??;
    let Some(head) = head else {
        answer(
            &mut socket,
            "431 Request Header Fields Too Large",
            "request head too large",
        )
        .await?;
        return Ok(None);
    };
    match judge(&head, token) {
        Verdict::Ready => {
            answer(&mut socket, "200 OK", "").await?;
            Ok(None)
        }
        Verdict::Refuse { status, reason } => {
            answer(&mut socket, status, reason).await?;
            Ok(None)
        }
        Verdict::Upgrade { key } => {
            let response = format!(
                "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
                 Sec-WebSocket-Accept: {}\r\n\r\n",
                derive_accept_key(key.as_bytes())
            );
            socket.write_all(response.as_bytes()).await?;
            let config = WebSocketConfig::default()
                .write_buffer_size(WRITE_BUFFER_BYTES)
                .max_write_buffer_size(WRITE_BUFFER_BYTES * 4)
                .max_message_size(Some(MAX_MESSAGE_BYTES));
            Ok(Some(
                WebSocketStream::from_raw_socket(socket, Role::Server, Some(config)).await,
            ))
        }
    }
}

/// The request head, up to its blank line; `None` if longer than
/// [`MAX_HEAD_BYTES`]. A client sends nothing more before the answer.
async fn read_head(socket: &mut TcpStream) -> io::Result<Option<Vec<u8>>> {
    let mut head = Vec::with_capacity(1024);
    let mut buffer = [0u8; 2048];
    loop {
        let read = socket.read(&mut buffer).await?;
        if read == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed before its request head ended",
            ));
        }
        head.extend_from_slice(&buffer[..read]);
        if let Some(end) = head.windows(4).position(|window| window == b"\r\n\r\n") {
            if end + 4 != head.len() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "bytes after the request head before the answer",
                ));
            }
            return Ok(Some(head));
        }
        if head.len() > MAX_HEAD_BYTES {
            return Ok(None);
        }
    }
}

async fn answer(socket: &mut TcpStream, status: &str, body: &str) -> io::Result<()> {
    let mut response = format!("HTTP/1.1 {status}\r\n");
    if !body.is_empty() {
        response.push_str("Content-Type: text/plain; charset=utf-8\r\n");
    }
    if status.starts_with("401") {
        response.push_str("WWW-Authenticate: Bearer\r\n");
    }
    response.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    socket.write_all(response.as_bytes()).await?;
    socket.shutdown().await
}

/// The websocket as a stream of messages' text and a sink of messages.
fn channels(websocket: WebSocketStream<TcpStream>) -> (Inbound, Outbound) {
    let (sink, stream) = websocket.split();
    let inbound = stream.filter_map(|message| async move {
        match message {
            Ok(Message::Text(text)) => Some(Ok(text.as_str().to_string())),
            Ok(Message::Binary(bytes)) => Some(String::from_utf8(bytes.to_vec()).map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidData, "a binary message is not UTF-8")
            })),
            // Pings are answered by the library; a close ends the stream.
            Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_)) => None,
            Ok(Message::Close(_)) => None,
            Err(error) => Some(Err(io::Error::other(error))),
        }
    });
    let outbound = sink
        .sink_map_err(io::Error::other)
        .with(|text: String| futures::future::ready(Ok::<_, io::Error>(Message::text(text))));
    (Box::pin(inbound), Box::pin(outbound))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> Token {
        Token::new("s3cret-token-of-the-listener-0123456789")
    }

    fn upgrade(extra: &str) -> Vec<u8> {
        format!(
            "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
        )
        .into_bytes()
    }

    #[test]
    fn requests_are_judged_as_codex_judges_them() {
        let token = token();
        let bearer = "Authorization: Bearer s3cret-token-of-the-listener-0123456789\r\n";
        assert_eq!(
            judge(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n", &token),
            Verdict::Ready
        );
        assert!(matches!(
            judge(&upgrade(""), &token),
            Verdict::Refuse {
                status: "401 Unauthorized",
                ..
            }
        ));
        assert!(matches!(
            judge(&upgrade("Authorization: Bearer wrong\r\n"), &token),
            Verdict::Refuse {
                status: "401 Unauthorized",
                ..
            }
        ));
        assert!(matches!(
            judge(&upgrade("Authorization: Basic czNjcmV0\r\n"), &token),
            Verdict::Refuse {
                status: "401 Unauthorized",
                ..
            }
        ));
        assert!(matches!(
            judge(
                &upgrade(&format!("{bearer}Origin: https://example.com\r\n")),
                &token
            ),
            Verdict::Refuse {
                status: "403 Forbidden",
                ..
            }
        ));
        assert!(matches!(
            judge(&upgrade("Origin: https://example.com\r\n"), &token),
            Verdict::Refuse {
                status: "403 Forbidden",
                ..
            }
        ));
        assert_eq!(
            judge(&upgrade(bearer), &token),
            Verdict::Upgrade {
                key: "dGhlIHNhbXBsZSBub25jZQ==".into()
            }
        );
        assert!(matches!(
            judge(format!("GET / HTTP/1.1\r\n{bearer}\r\n").as_bytes(), &token),
            Verdict::Refuse {
                status: "400 Bad Request",
                ..
            }
        ));
        assert!(matches!(
            judge(b"\x00\x01garbage\r\n\r\n", &token),
            Verdict::Refuse {
                status: "400 Bad Request",
                ..
            }
        ));
    }

    #[test]
    fn listen_urls_are_ws_with_an_ip_and_a_port() {
        assert_eq!(
            parse_listen_url("ws://127.0.0.1:0"),
            Ok("127.0.0.1:0".parse().unwrap())
        );
        assert_eq!(
            parse_listen_url("ws://localhost:8080/"),
            Ok("127.0.0.1:8080".parse().unwrap())
        );
        assert_eq!(
            parse_listen_url("ws://[::1]:9"),
            Ok("[::1]:9".parse().unwrap())
        );
        assert!(parse_listen_url("wss://127.0.0.1:1").is_err());
        assert!(parse_listen_url("ws://example.com:1").is_err());
        assert!(parse_listen_url("127.0.0.1:1").is_err());
    }
}
