//! Noticing a connection that has gone silent.
//!
//! TCP keepalive cannot tell a dead path from a live one when something in
//! between (a proxy, a NAT box, a VPN) answers for the far end, and a Unix
//! socket has none: a client could wait for ever on a server that will
//! never speak again. So the client watches what it receives instead:
//! [`Watched`] counts the bytes read from the server, and [`watch`] wakes
//! every fifth of the limit. A quiet tick sends one cheap call
//! (`Executor.environments` on the connection's own executor, which the
//! first server answers itself, never an upstream) that makes the server
//! say something; when nothing at all has arrived for the whole limit, the
//! reader fails with [`silence_message`] and capnp-rpc breaks every
//! capability of the connection with it, as with any lost connection (so a
//! resilient process reconnects).
//!
//! A busy connection costs nothing: bytes arriving count as life, so no
//! call is made while output flows, and a counter add per read is all the
//! data path sees. A slow consumer does not look dead either: the server
//! stops pushing when the flow-control window is full, but still answers
//! the probe at once.

use std::cell::{Cell, RefCell};
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, MissedTickBehavior};

use crate::capexec_capnp::executor;
use crate::model::show_duration;
use crate::net::first_bytes;

/// What the reader and the watchdog share.
#[derive(Default)]
pub(crate) struct Watch {
    received: Cell<u64>,
    /// The first bytes from the server, to recognise a TLS record, or
    /// what is not a capexec server.
    first: RefCell<Vec<u8>>,
    /// Set when the watchdog gives up, or the first bytes are not a
    /// capexec server's: every later read fails with it.
    failed: RefCell<Option<String>>,
    reader: RefCell<Option<Waker>>,
    /// Only records the first bytes: a TLS handshake's, which are not
    /// Cap'n Proto frames.
    raw: bool,
}

impl Watch {
    /// The watch of a connection's Cap'n Proto stream: first bytes that
    /// cannot begin a frame fail it at once (the frame reader would fail
    /// on them too, but may wait for a table or a body that never comes).
    pub(crate) fn new() -> Rc<Watch> {
        Rc::new(Watch::default())
    }

    /// The watch of a TLS handshake, which records what the server sent.
    pub(crate) fn raw() -> Rc<Watch> {
        Rc::new(Watch {
            raw: true,
            ..Watch::default()
        })
    }

    /// Bytes received from the server so far.
    pub(crate) fn received(&self) -> u64 {
        self.received.get()
    }

    /// Whether the server's first bytes start a TLS record (a handshake
    /// or an alert): a TLS server answering a plaintext client. A Cap'n
    /// Proto message starts with its segment count, which is small.
    pub(crate) fn first_bytes_look_like_tls(&self) -> bool {
        first_bytes::look_like_tls(&self.first.borrow())
    }

    /// What the server is, if its first bytes cannot begin a Cap'n Proto
    /// frame (see `first_bytes::not_capexec`).
    pub(crate) fn not_capexec(&self) -> Option<String> {
        first_bytes::not_capexec(&self.first.borrow())
    }

    fn fail(&self, message: String) {
        *self.failed.borrow_mut() = Some(message);
        if let Some(reader) = self.reader.borrow_mut().take() {
            reader.wake();
        }
    }
}

/// How the connection ends when the watchdog gives up.
pub(crate) fn silence_message(limit: Duration) -> String {
    format!("no answer from the server for {}", show_duration(limit))
}

/// A reader that counts what it reads, and fails once its [`Watch`] says
/// the connection is dead.
pub(crate) struct Watched<R> {
    inner: R,
    watch: Rc<Watch>,
}

impl<R> Watched<R> {
    pub(crate) fn new(inner: R, watch: Rc<Watch>) -> Watched<R> {
        Watched { inner, watch }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Watched<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(message) = self.watch.failed.borrow().as_ref() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                message.clone(),
            )));
        }
        let before = buf.filled().len();
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        match &polled {
            Poll::Ready(Ok(())) => {
                let fresh = &buf.filled()[before..];
                let received = this.watch.received.get();
                if received < first_bytes::KEPT as u64 {
                    let wanted = first_bytes::KEPT - received as usize;
                    let kept = &fresh[..fresh.len().min(wanted)];
                    this.watch.first.borrow_mut().extend_from_slice(kept);
                    if !this.watch.raw
                        && let Some(seen) = this.watch.not_capexec()
                    {
                        this.watch.fail(format!("not a capexec server ({seen})"));
                    }
                }
                this.watch.received.set(received + fresh.len() as u64);
            }
            Poll::Pending => {
                let mut reader = this.watch.reader.borrow_mut();
                if !reader
                    .as_ref()
                    .is_some_and(|known| known.will_wake(cx.waker()))
                {
                    *reader = Some(cx.waker().clone());
                }
            }
            Poll::Ready(Err(_)) => {}
        }
        polled
    }
}

/// Writes pass through: a TLS handshake reads and writes one stream,
/// watched for what a server that does not speak TLS sends instead.
impl<W: AsyncWrite + Unpin> AsyncWrite for Watched<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Watches a connection until it is declared dead after `limit` of
/// silence (or until the task is aborted with the connection).
pub(crate) async fn watch(watch: Rc<Watch>, executor: executor::Client, limit: Duration) {
    let tick = (limit / 5).max(Duration::from_millis(20));
    let mut ticks = tokio::time::interval(tick);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut seen = watch.received();
    let mut last_heard = Instant::now();
    let probing = Rc::new(Cell::new(false));
    loop {
        let due = ticks.tick().await;
        let now = Instant::now();
        let count = watch.received();
        // A tick far behind its time means this process was not running
        // (stopped with Ctrl-Z, a suspended laptop, a starved machine): the
        // silence is ours, not the server's, so start counting afresh.
        if count != seen || now.duration_since(due) > tick {
            seen = count;
            last_heard = now;
            continue;
        }
        if now.duration_since(last_heard) >= limit {
            tracing::debug!(?limit, "no answer from the server; closing the connection");
            watch.fail(silence_message(limit));
            return;
        }
        if !probing.replace(true) {
            let answer = executor.environments_request().send().promise;
            let probing = Rc::clone(&probing);
            tokio::task::spawn_local(async move {
                // Any answer, an error included, is bytes received.
                let _ = answer.await;
                probing.set(false);
            });
        }
    }
}
