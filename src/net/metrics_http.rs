//! `capexec serve --metrics tcp:HOST:PORT`: the Prometheus text of
//! `crate::metrics` over a minimal HTTP/1.1 responder (GET /metrics, one
//! request per connection). A scraper needs nothing more, and a web
//! framework would be most of the server's code.

use std::rc::Rc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::net::address::Address;
use crate::rpc::ServerContext;

/// Most bytes of a request head read; a scraper sends a few hundred.
const MAX_REQUEST: usize = 8192;
/// A peer that has not sent its request within this is dropped.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Scrapes answered at once; more wait for the listener's queue.
const MAX_CONCURRENT: usize = 64;

pub(crate) async fn accept_loop(
    address: Address,
    listener: TcpListener,
    context: Rc<ServerContext>,
) {
    tracing::info!(%address, "serving metrics at /metrics");
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT));
    loop {
        let Ok(slot) = std::sync::Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!(%error, %address, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let context = Rc::clone(&context);
        tokio::task::spawn_local(async move {
            let _slot = slot;
            let _ = tokio::time::timeout(REQUEST_TIMEOUT, answer(stream, &context)).await;
        });
    }
}

async fn answer(mut stream: TcpStream, context: &ServerContext) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        if head.len() >= MAX_REQUEST {
            return respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                "",
            )
            .await;
        }
        let read = stream.read(&mut buf).await?;
        if read == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..read]);
    }
    let request_line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let mut parts = request_line.split(|&b| b == b' ');
    let (method, target) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let path = target.split(|&b| b == b'?').next().unwrap_or_default();
    match (method, path) {
        (b"GET" | b"HEAD", b"/metrics") => {
            let body = crate::metrics::render(context.engine().live_count());
            let body = if method == b"HEAD" {
                String::new()
            } else {
                body
            };
            respond(
                &mut stream,
                "200 OK",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                &body,
            )
            .await
        }
        (b"GET" | b"HEAD", _) => {
            respond(
                &mut stream,
                "404 Not Found",
                "text/plain",
                "metrics are at /metrics\n",
            )
            .await
        }
        _ => respond(&mut stream, "405 Method Not Allowed", "text/plain", "").await,
    }
}

async fn respond(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}
