//! `capexec mcp --listen http://HOST:PORT/PATH`: MCP over Streamable HTTP.
//!
//! rmcp's `StreamableHttpService` (a tower service) does the protocol:
//! sessions (`Mcp-Session-Id`), one request per POST answered as
//! server-sent events, the standalone GET stream, DELETE. Every request
//! first passes [`admission`] (Host, Origin, token, path); hyper serves
//! HTTP/1.1 on the MCP thread's runtime, as stdio does on its own.
//!
//! Each MCP session is one [`McpSession`] from the
//! [`Mcp`] factory, made for the handshake-era protocol versions only
//! (up to 2025-11-25): the 2026-07-28 lifecycle has no sessions over HTTP
//! (rmcp serves each of its requests with a new handler), and a process
//! handed back as a `process_id` must outlive the request that started
//! it. Clients that probe `server/discover` first (the Python SDK) fall
//! back to `initialize` on seeing no modern version.
//!
//! Bounds: [`MAX_SESSIONS`] sessions (a new one beyond is answered 503), a
//! session idle for [`SESSION_IDLE`] (or `--session-idle`) ends (rmcp's
//! keep-alive) and its processes with it, [`MAX_CONNECTIONS`] connections at once (more wait
//! to be accepted), request heads within [`HEAD_DEADLINE`], bodies within
//! [`REQUEST_DEADLINE`] (408) and of at most [`MAX_BODY_BYTES`] (413
//! beyond).

pub mod admission;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, SessionConfig};
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use self::admission::{Admission, Verdict};
use super::{Mcp, McpSession};

/// MCP sessions open at once.
pub const MAX_SESSIONS: usize = 64;
/// A session with no request (and nothing sent) for this long ends, by
/// default.
pub const SESSION_IDLE: Duration = Duration::from_secs(30 * 60);
/// HTTP connections served at once; more wait to be accepted.
pub const MAX_CONNECTIONS: usize = 64;
/// The largest request body (one JSON-RPC message): as stdio's line.
pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;
/// How long a client may take to send a request head.
pub const HEAD_DEADLINE: Duration = Duration::from_secs(10);
/// How long a client may take to send a request's body, until it is
/// queued in its session.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(60);
/// How long open connections get to finish once serving stops.
const DRAIN_DEADLINE: Duration = Duration::from_secs(5);

type Response = http::Response<BoxBody<Bytes, Infallible>>;

/// Everything a request goes through: admission, the session bound, rmcp.
struct Front {
    admission: Admission,
    service: StreamableHttpService<McpSession, LocalSessionManager>,
    sessions: Arc<LocalSessionManager>,
    /// Requests that may be creating a session right now: counted with
    /// the sessions, so that the bound is exact. Decremented by a guard,
    /// so that a request dropped midway (its client gone) is uncounted.
    creating: Arc<AtomicUsize>,
    /// Held while a new session's request is counted.
    admitting: tokio::sync::Mutex<()>,
}

/// Uncounts a request that may have been creating a session.
struct Creating(Arc<AtomicUsize>);

impl Drop for Creating {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Front {
    async fn handle(self: Arc<Self>, request: http::Request<Incoming>) -> Response {
        let verdict = self.admission.judge(request.uri().path(), |name| {
            request.headers().get(name).map(|value| value.as_bytes())
        });
        if let Verdict::Refuse { status, reason } = verdict {
            return refusal(status, reason);
        }
        let new_session = request.method() == http::Method::POST
            && !request.headers().contains_key("mcp-session-id");
        if request.method() == http::Method::DELETE {
            let mut response = self.service.handle(request).await;
            // rmcp answers 202, but the session has ended by then: clients
            // (the Python SDK) expect 200 or 204 and warn otherwise.
            if response.status() == http::StatusCode::ACCEPTED {
                *response.status_mut() = http::StatusCode::OK;
            }
            return response;
        }
        if !new_session {
            return self.within_deadline(request).await;
        }
        let counted = {
            let _admitting = self.admitting.lock().await;
            let open = self.sessions.sessions.read().await.len();
            // A request counted here is uncounted only once rmcp has
            // added its session (or failed): never both uncounted and
            // unlisted.
            if open + self.creating.load(Ordering::SeqCst) >= MAX_SESSIONS {
                return refusal(
                    503,
                    "capexec: mcp: this server holds 64 MCP sessions already; end one (DELETE) \
                     or wait for an idle one to expire",
                );
            }
            self.creating.fetch_add(1, Ordering::SeqCst);
            Creating(self.creating.clone())
        };
        let response = self.within_deadline(request).await;
        drop(counted);
        response
    }

    /// rmcp's answer, if the request's body is read and the request handed
    /// to its session within [`REQUEST_DEADLINE`] (a POST's answer is a
    /// stream, returned once the request is queued; the tool's work is not
    /// timed here). A client that sends its body slowly holds no
    /// connection, or place among the sessions, for longer.
    async fn within_deadline(&self, request: http::Request<Incoming>) -> Response {
        match tokio::time::timeout(REQUEST_DEADLINE, self.service.handle(request)).await {
            Ok(response) => response,
            Err(_) => refusal(
                408,
                "capexec: mcp: the request was not received and queued within 60 s",
            ),
        }
    }
}

fn refusal(status: u16, reason: &'static str) -> Response {
    let mut response = http::Response::new(Full::new(Bytes::from(reason)).boxed());
    *response.status_mut() =
        http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::FORBIDDEN);
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if status == 401 {
        headers.insert(
            http::header::WWW_AUTHENTICATE,
            http::HeaderValue::from_static("Bearer"),
        );
    }
    response
}

/// A bound listener, not yet serving.
pub struct Listener {
    listener: std::net::TcpListener,
    address: SocketAddr,
    path: String,
}

impl Listener {
    /// Binds `address` (port 0: any free one).
    pub fn bind(address: SocketAddr, path: &str) -> std::io::Result<Listener> {
        let listener = std::net::TcpListener::bind(address)?;
        listener.set_nonblocking(true)?;
        let address = listener.local_addr()?;
        Ok(Listener {
            listener,
            address,
            path: path.to_string(),
        })
    }

    /// The URL it listens on, the port resolved.
    pub fn url(&self) -> String {
        admission::shown_url(self.address, &self.path)
    }
}

/// Serves MCP sessions on `listener` from `mcp` (a session idle for `idle`
/// ends), on a thread of its own
/// (the MCP thread), until `shutdown` is cancelled: then no connection is
/// accepted, every session ends (its processes with it, unless
/// --keep-processes) and the thread ends once the factory and every
/// session are dropped.
pub fn serve_http(
    mcp: Mcp,
    listener: Listener,
    token: Option<crate::net::Token>,
    idle: Duration,
    shutdown: CancellationToken,
) -> std::io::Result<std::thread::JoinHandle<Result<(), String>>> {
    std::thread::Builder::new()
        .name("mcp-http".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|error| format!("cannot start the MCP runtime: {error}"))?;
            let served = runtime.block_on(run(mcp, listener, token, idle, shutdown));
            // Whatever is left (a connection past the drain deadline, its
            // session) is dropped with the runtime.
            runtime.shutdown_background();
            served
        })
}

async fn run(
    mcp: Mcp,
    listener: Listener,
    token: Option<crate::net::Token>,
    idle: Duration,
    shutdown: CancellationToken,
) -> Result<(), String> {
    let admission = Admission::new(listener.address, listener.path.clone(), token);
    let sessions = Arc::new({
        let mut manager = LocalSessionManager::default();
        let mut config = SessionConfig::default();
        config.keep_alive = Some(idle);
        manager.session_config = config;
        manager
    });
    let mcp = Arc::new(mcp);
    let factory = mcp.clone();
    // Host and Origin are judged by `admission` first; rmcp's own checks
    // are off rather than a second, different list.
    let config = StreamableHttpServerConfig::default()
        .disable_allowed_hosts()
        .disable_allowed_origins()
        .with_max_request_body_bytes(MAX_BODY_BYTES)
        .with_cancellation_token(shutdown.child_token());
    let service =
        StreamableHttpService::new(move || Ok(factory.http_session()), sessions.clone(), config);
    let front = Arc::new(Front {
        admission,
        service,
        sessions,
        creating: Arc::new(AtomicUsize::new(0)),
        admitting: tokio::sync::Mutex::new(()),
    });
    let accepting = tokio::net::TcpListener::from_std(listener.listener)
        .map_err(|error| format!("--listen: {error}"))?;
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut connections = tokio::task::JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let slot = tokio::select! {
            () = shutdown.cancelled() => break,
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
        };
        let (socket, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = accepting.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) if transient(&error) => {
                    tracing::debug!(%error, "accept");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
                Err(error) => return Err(format!("--listen: accepting: {error}")),
            },
        };
        let _ = socket.set_nodelay(true);
        let front = front.clone();
        let stop = shutdown.clone();
        connections.spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |request| {
                let front = front.clone();
                async move { Ok::<_, Infallible>(front.handle(request).await) }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEAD_DEADLINE);
            let connection =
                builder.serve_connection(hyper_util::rt::TokioIo::new(socket), service);
            tokio::pin!(connection);
            let served = tokio::select! {
                served = connection.as_mut() => served,
                () = stop.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(error) = served {
                tracing::debug!(%peer, %error, "MCP HTTP connection");
            }
        });
    }
    drop(accepting);
    // Sessions end with the cancellation; connections get a moment to
    // finish their answers.
    let _ = tokio::time::timeout(DRAIN_DEADLINE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    connections.abort_all();
    drop(front);
    drop(mcp);
    Ok(())
}

fn transient(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::Interrupted
    ) || matches!(
        error.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}
