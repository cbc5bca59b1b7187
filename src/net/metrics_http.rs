//! `capexec serve --metrics tcp:HOST:PORT`: the Prometheus text of
//! `crate::metrics` over a minimal HTTP/1.1 responder (GET /metrics, one
//! request per connection). A scraper needs nothing more, and a web
//! framework would be most of the server's code.
//!
//! Nobody logs in here, so the endpoint bounds what a peer can hold: a
//! request head must arrive whole within [`HEAD_DEADLINE`] of its
//! acceptance (however the bytes trickle in), and one address holds at
//! most [`PER_ADDRESS`] of the [`MAX_CONCURRENT`] requests served at once.

use std::rc::Rc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::net::address::Address;
use crate::net::pending::PeerShares;
use crate::rpc::ServerContext;

/// Most bytes of a request head read; a scraper sends a few hundred.
const MAX_REQUEST: usize = 8192;
/// The whole request head must have arrived within this of the
/// connection's acceptance: a deadline per read would let a peer that sends
/// a byte now and then hold its place for ever.
const HEAD_DEADLINE: Duration = Duration::from_secs(1);
/// The answer must have been taken within this: a peer that does not read
/// holds its place no longer.
const ANSWER_DEADLINE: Duration = Duration::from_secs(1);
/// Requests served at once; more wait in the listener's queue.
const MAX_CONCURRENT: usize = 64;
/// Of those, what one address (an IPv4 address, an IPv6 /64) may hold;
/// its connections beyond are closed as they are accepted.
const PER_ADDRESS: usize = 8;

pub(crate) async fn accept_loop(
    address: Address,
    listener: TcpListener,
    context: Rc<ServerContext>,
) {
    tracing::info!(%address, "serving metrics at /metrics");
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT));
    // The requests each address has in service.
    let shares = PeerShares::new(PER_ADDRESS);
    loop {
        let Ok(slot) = std::sync::Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, %address, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(share) = shares.take(peer.ip()) else {
            tracing::debug!(%peer, "metrics: this address holds its share of requests; closing");
            continue;
        };
        let context = Rc::clone(&context);
        tokio::task::spawn_local(async move {
            let _held = (slot, share);
            let _ = serve(stream, &context).await;
        });
    }
}

/// What the peer sent before the deadline, or why there is nothing to
/// answer.
#[derive(Debug, PartialEq, Eq)]
enum Head {
    /// A whole request head: up to its blank line.
    Complete(Vec<u8>),
    /// [`MAX_REQUEST`] bytes without the end of a head.
    TooLarge,
    /// The peer closed first.
    Closed,
    /// [`HEAD_DEADLINE`] passed first.
    Late,
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    context: &ServerContext,
) -> std::io::Result<()> {
    let head = head_in_time(&mut stream).await?;
    let answering = async {
        match head {
            Head::Complete(head) => answer(&mut stream, &head, context).await,
            Head::TooLarge => {
                respond(
                    &mut stream,
                    "431 Request Header Fields Too Large",
                    "text/plain",
                    "",
                )
                .await
            }
            Head::Closed | Head::Late => Ok(()),
        }
    };
    tokio::time::timeout(ANSWER_DEADLINE, answering)
        .await
        .unwrap_or(Ok(()))
}

/// The request head, read under one deadline for all of it.
async fn head_in_time<S: AsyncRead + Unpin>(stream: &mut S) -> std::io::Result<Head> {
    tokio::time::timeout(HEAD_DEADLINE, read_head(stream))
        .await
        .unwrap_or(Ok(Head::Late))
}

async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> std::io::Result<Head> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        if head.len() >= MAX_REQUEST {
            return Ok(Head::TooLarge);
        }
        let read = stream
            .read(&mut buf[..(MAX_REQUEST - head.len()).min(1024)])
            .await?;
        if read == 0 {
            return Ok(Head::Closed);
        }
        head.extend_from_slice(&buf[..read]);
    }
    Ok(Head::Complete(head))
}

async fn answer<S: AsyncWrite + Unpin>(
    stream: &mut S,
    head: &[u8],
    context: &ServerContext,
) -> std::io::Result<()> {
    let request_line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let mut parts = request_line.split(|&b| b == b' ');
    let (method, target) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let path = target.split(|&b| b == b'?').next().unwrap_or_default();
    match (method, path) {
        (b"GET" | b"HEAD", b"/metrics") => {
            let body = crate::metrics::render(&crate::metrics::Now {
                processes: context.engine().live_count(),
                descriptors_waiting_to_close: crate::sys::waiting_to_close(),
                closing_threads: crate::sys::closing_threads(),
                closes_asleep: crate::sys::closing_for(crate::sys::ASLEEP_AFTER).len(),
            });
            let body = if method == b"HEAD" {
                String::new()
            } else {
                body
            };
            respond(
                stream,
                "200 OK",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                &body,
            )
            .await
        }
        (b"GET" | b"HEAD", _) => {
            respond(
                stream,
                "404 Not Found",
                "text/plain",
                "metrics are at /metrics\n",
            )
            .await
        }
        _ => respond(stream, "405 Method Not Allowed", "text/plain", "").await,
    }
}

async fn respond<S: AsyncWrite + Unpin>(
    stream: &mut S,
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

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    /// A peer that sends a byte every 100 ms never completes its head: it
    /// is cut off at the deadline although a byte came a moment ago (a
    /// deadline per read would keep waiting for as long as bytes come).
    #[tokio::test]
    async fn the_deadline_is_for_the_whole_head_however_it_trickles() {
        let (mut server_end, mut peer) = tokio::io::duplex(64);
        let trickle = tokio::spawn(async move {
            let mut sent = 0;
            for byte in b"GET /metrics HTTP/1.1\r\nX: y".iter().cycle() {
                if peer.write_all(&[*byte]).await.is_err() {
                    return sent;
                }
                sent += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            sent
        });
        let head = tokio::time::timeout(Duration::from_secs(30), head_in_time(&mut server_end))
            .await
            .expect("cut off while the bytes kept coming")
            .expect("read");
        assert_eq!(head, Head::Late);
        drop(server_end);
        let sent = trickle.await.expect("trickle");
        assert!(sent > 1, "the peer kept sending ({sent} bytes)");
    }

    #[tokio::test]
    async fn a_head_that_arrives_in_pieces_is_read_to_its_blank_line() {
        let (mut server_end, mut peer) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            for piece in ["GET /metrics ", "HTTP/1.1\r\n", "\r\n"] {
                peer.write_all(piece.as_bytes()).await.expect("write");
                tokio::task::yield_now().await;
            }
            // Kept open: the head ends at its blank line, not at a close.
            peer
        });
        let head = head_in_time(&mut server_end).await.expect("read");
        assert_eq!(
            head,
            Head::Complete(b"GET /metrics HTTP/1.1\r\n\r\n".to_vec())
        );
        drop(writer.await.expect("writer"));
    }

    #[test]
    fn one_address_holds_its_share_and_others_theirs() {
        let shares = PeerShares::new(2);
        let a: IpAddr = "192.0.2.1".parse().expect("a");
        let first = shares.take(a).expect("first");
        let _second = shares.take(a).expect("second");
        assert!(shares.take(a).is_none());
        // One IPv6 /64 is one address.
        let v6: IpAddr = "2001:db8::1".parse().expect("v6");
        let _v6 = shares.take(v6).expect("v6");
        let _v6_again = shares.take("2001:db8::2".parse().expect("v6")).expect("v6");
        assert!(shares.take("2001:db8::ffff".parse().expect("v6")).is_none());
        assert!(shares.take("192.0.2.2".parse().expect("b")).is_some());
        drop(first);
        assert!(shares.take(a).is_some());
    }
}
