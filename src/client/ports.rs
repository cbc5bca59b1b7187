//! Ports through an executor: [`dial`] a connection from the executor's
//! machine (the client's half of `ssh -L`), [`listen`] there and accept
//! what arrives (`ssh -R`). A connection is a [`PortStream`], tokio's
//! `AsyncRead + AsyncWrite`: `shutdown` half-closes (the far peer reads
//! end of file while the other direction goes on), a reset or a lost
//! connection reads as an error, never as end of file, and dropping it
//! resets the connection unless both directions had ended.
//!
//! Flow control is end to end: a write is answered once the far socket
//! took the bytes, and the stream keeps a bounded window unanswered; what
//! arrives is answered only once read, so a slow reader here holds the
//! far writer back.
//!
//! [`dial_via`] with a Unix connection's route asks for a direct channel:
//! the bytes then go through a socket of their own, which the server
//! splices to the far socket (the sockets' own flow control), and the
//! sinks only say how each direction ended.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use futures::future::LocalBoxFuture;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{mpsc, oneshot};

use crate::capexec_capnp::{
    executor, port_acceptor, port_connection, port_dial_params, port_dial_results,
    port_listen_params, port_listen_results, port_listener, port_sink,
};
use crate::client::Error;
use crate::model::{PortConnectionInfo, Refusal, RefusalKind};
use crate::net::DirectRoute;
use crate::sys::Socket;
use crate::wire::{self, OpenWrite, PortBudget, PortSender};

thread_local! {
    /// What the streams of this thread (all of its Cap'n Proto
    /// connections: capnp-rpc runs on one thread) may have unanswered.
    static BUDGET: PortBudget = PortBudget::default();
}

/// What has arrived from the far socket and not been read yet.
#[derive(Default)]
struct Inbox {
    chunks: VecDeque<Arrived>,
    end: Option<End>,
    waker: Option<Waker>,
    /// The stream was dropped: later writes fail.
    closed: bool,
    /// The bytes come through a direct channel: a write here is the
    /// server's mistake.
    direct: bool,
}

struct Arrived {
    /// The write's parameters themselves: read out of the received
    /// message, with no copy of their own.
    params: port_sink::WriteParams,
    length: usize,
    read: usize,
    /// Answers the write that brought it, once it is all read.
    taken: oneshot::Sender<()>,
}

#[derive(Clone)]
enum End {
    Clean,
    Failed(String),
    Lost,
}

type SharedInbox = Rc<RefCell<Inbox>>;

impl Inbox {
    fn finish(inbox: &SharedInbox, end: End) {
        let mut inbox = inbox.borrow_mut();
        if inbox.end.is_none() {
            inbox.end = Some(end);
        }
        if let Some(waker) = inbox.waker.take() {
            waker.wake();
        }
    }
}

/// `fromSocket`: the far socket's bytes, answered as they are read.
struct FromSocket {
    inbox: SharedInbox,
}

impl port_sink::Server for FromSocket {
    // Not `async fn`: queued at dispatch, in arrival order.
    fn write(
        self: Rc<Self>,
        params: port_sink::WriteParams,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        let queued = (|| -> Result<oneshot::Receiver<()>, capnp::Error> {
            let length = params.get()?.get_bytes()?.len();
            let mut inbox = self.inbox.borrow_mut();
            if inbox.closed {
                return Err(closed());
            }
            if inbox.direct {
                return Err(Refusal::new(
                    RefusalKind::InvalidArgument,
                    "a write on a connection whose bytes go through its direct channel",
                )
                .into());
            }
            if inbox.end.is_some() {
                return Err(Refusal::new(
                    RefusalKind::InvalidArgument,
                    "a write after the end of the connection",
                )
                .into());
            }
            let (taken, answer) = oneshot::channel();
            inbox.chunks.push_back(Arrived {
                params,
                length,
                read: 0,
                taken,
            });
            if let Some(waker) = inbox.waker.take() {
                waker.wake();
            }
            Ok(answer)
        })();
        async move { queued?.await.map_err(|_| closed()) }
    }

    async fn end(
        self: Rc<Self>,
        _: port_sink::EndParams,
        _: port_sink::EndResults,
    ) -> Result<(), capnp::Error> {
        Inbox::finish(&self.inbox, End::Clean);
        Ok(())
    }

    async fn fail(
        self: Rc<Self>,
        params: port_sink::FailParams,
        _: port_sink::FailResults,
    ) -> Result<(), capnp::Error> {
        let reason = params.get()?.get_reason()?.to_string()?;
        Inbox::finish(&self.inbox, End::Failed(reason));
        Ok(())
    }
}

impl Drop for FromSocket {
    fn drop(&mut self) {
        // Released with neither `end` nor `fail`: the server, or a link on
        // the way to it, is gone.
        Inbox::finish(&self.inbox, End::Lost);
    }
}

fn closed() -> capnp::Error {
    Refusal::new(
        RefusalKind::SocketFailed,
        "the client closed the connection",
    )
    .into()
}

/// Small writes gathered into one `PortSink.write`: each message costs
/// the server a call, its answer and their wake-ups, so a program writing
/// 8 or 64 KiB at a time is sent in writes of up to
/// [`wire::PORT_CHUNK_BYTES`], filled in place. What is gathered is sent
/// when the write is full, on flush or shutdown, or as soon as the writing
/// task yields (a task spawned at the first gathered byte runs then), so a
/// program that writes a request and awaits the answer never waits for a
/// flush it did not make.
#[derive(Default)]
struct Gathering {
    open: Option<OpenWrite>,
    /// The task that sends `open` once the writer yields is spawned.
    scheduled: bool,
    /// The size of the last write taken: the rest of a big write that only
    /// partly fitted is small, but more big ones follow.
    last_asked: usize,
}

/// Writes smaller than this are gathered into writes of at most
/// [`SMALL_GATHER_BYTES`] (a message of their own for each would cost more
/// than its bytes; one of the largest size, more than a few bytes need).
const SMALL_WRITE_BYTES: usize = 4 * 1024;
const SMALL_GATHER_BYTES: usize = 64 * 1024;

/// One connection through an executor. Like every capability of its RPC
/// system, it is used on that system's thread, inside a `LocalSet`: what a
/// write gathers is sent by a task spawned there.
pub struct PortStream {
    inbox: SharedInbox,
    sender: Rc<PortSender>,
    gathering: Rc<RefCell<Gathering>>,
    shutdown: Option<LocalBoxFuture<'static, Result<(), capnp::Error>>>,
    shut: bool,
    info: PortConnectionInfo,
    /// The connection's direct channel, if the server granted one: the
    /// bytes go through it, the sinks only say how each direction ended.
    channel: Option<Socket>,
    _connection: port_connection::Client,
}

impl PortStream {
    fn new(
        inbox: SharedInbox,
        to_socket: port_sink::Client,
        connection: port_connection::Client,
        info: PortConnectionInfo,
    ) -> PortStream {
        let budget = BUDGET.with(PortBudget::clone);
        PortStream {
            inbox,
            sender: Rc::new(PortSender::new(to_socket, budget)),
            gathering: Rc::default(),
            shutdown: None,
            shut: false,
            info,
            channel: None,
            _connection: connection,
        }
    }

    /// Whether the bytes go through a direct channel, kernel to kernel on
    /// the server, rather than through Cap'n Proto messages.
    pub fn is_direct(&self) -> bool {
        self.channel.is_some()
    }

    /// The direct channel and what says how its directions end, for a
    /// caller that relays the channel itself (`capexec forward` splices it
    /// to its local socket); the stream back if it has no channel.
    pub fn into_direct(mut self) -> Result<DirectParts, Box<PortStream>> {
        let Some(channel) = self.channel.take() else {
            return Err(Box::new(self));
        };
        let ends = DirectEnds {
            inbox: Rc::clone(&self.inbox),
            sender: Rc::clone(&self.sender),
            _connection: self._connection.clone(),
        };
        Ok(DirectParts { channel, ends })
    }

    /// How the far socket's direction ended, once its end of file came
    /// through the channel: clean only once the server said so.
    fn poll_channel_end(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        poll_end(&self.inbox, cx)
    }

    /// A channel's I/O error, with the server's reason if it gave one.
    fn channel_error(&self, error: io::Error) -> io::Error {
        match self.inbox.borrow().end.clone() {
            Some(End::Failed(reason)) => io::Error::new(io::ErrorKind::ConnectionReset, reason),
            _ => error,
        }
    }

    /// The socket's addresses on the executor's machine.
    pub fn info(&self) -> &PortConnectionInfo {
        &self.info
    }

    /// Sends what is gathered, now.
    fn send_gathered(&self) {
        send_gathered(&self.sender, &self.gathering);
    }

    /// Sends what is gathered once the writing task yields.
    fn send_gathered_soon(&self) {
        let mut gathering = self.gathering.borrow_mut();
        if gathering.scheduled {
            return;
        }
        gathering.scheduled = true;
        let (sender, gathering) = (Rc::downgrade(&self.sender), Rc::downgrade(&self.gathering));
        tokio::task::spawn_local(async move {
            // Gone with the stream: a dropped stream resets the connection.
            if let (Some(sender), Some(gathering)) = (sender.upgrade(), gathering.upgrade()) {
                gathering.borrow_mut().scheduled = false;
                send_gathered(&sender, &gathering);
            }
        });
    }
}

fn send_gathered(sender: &PortSender, gathering: &RefCell<Gathering>) {
    let open = gathering.borrow_mut().open.take();
    if let Some(open) = open {
        sender.send_open(open);
    }
}

/// A direct connection taken apart ([`PortStream::into_direct`]).
pub struct DirectParts {
    /// Carries the far socket's bytes both ways.
    pub channel: Socket,
    pub ends: DirectEnds,
}

/// How a direct connection's directions end. Dropping it releases the
/// connection: the far socket is reset unless both directions ended.
pub struct DirectEnds {
    inbox: SharedInbox,
    sender: Rc<PortSender>,
    _connection: port_connection::Client,
}

impl DirectEnds {
    /// After an end of file read from the channel: whether the far socket
    /// ended cleanly (else the reason it failed, or the connection's loss).
    pub async fn far_end(&self) -> io::Result<()> {
        std::future::poll_fn(|cx| poll_end(&self.inbox, cx)).await
    }

    /// The reason the connection failed, if the server said so already.
    pub fn failure(&self) -> Option<io::Error> {
        match self.inbox.borrow().end.clone() {
            Some(End::Clean) | None => None,
            Some(end) => end_result(end).err(),
        }
    }

    /// Ends this side's direction, after shutdown(SHUT_WR) on the channel:
    /// the server then shuts the far socket down for writing.
    pub async fn end(&self) -> io::Result<()> {
        self.sender.end().await.map_err(io_error)
    }
}

impl Drop for PortStream {
    fn drop(&mut self) {
        let mut inbox = self.inbox.borrow_mut();
        // A channel dropped before both directions ended is reset (TCP),
        // or closed (Unix: no reset); either way the release of the
        // connection that follows makes the server reset the far socket.
        if let Some(channel) = &self.channel
            && !(self.shut && matches!(inbox.end, Some(End::Clean)))
        {
            channel.prepare_reset();
        }
        inbox.closed = true;
        // Unanswered writes fail: the server resets the socket.
        inbox.chunks.clear();
    }
}

/// A write's failure as an I/O error: a reset (the far socket's, or the
/// connection's) for the connection's own failures.
fn io_error(error: capnp::Error) -> io::Error {
    let error = Error::from(error);
    let kind = match &error {
        Error::Refused(refusal) if refusal.kind == RefusalKind::SocketFailed => {
            io::ErrorKind::ConnectionReset
        }
        _ => io::ErrorKind::ConnectionAborted,
    };
    io::Error::new(kind, error.to_string())
}

impl AsyncRead for PortStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // Writes waiting on a local capability move on while we read.
        // (A failed write breaks the writing half only: reading goes on.)
        let _ = self.sender.poll_progress(cx);
        let this = self.get_mut();
        if let Some(channel) = this.channel.as_mut() {
            let before = buf.filled().len();
            return match poll_channel_read(channel, cx, buf) {
                Poll::Ready(Ok(())) if buf.filled().len() == before && buf.remaining() > 0 => {
                    this.poll_channel_end(cx)
                }
                Poll::Ready(Err(error)) => Poll::Ready(Err(this.channel_error(error))),
                other => other,
            };
        }
        let mut inbox = this.inbox.borrow_mut();
        if let Some(front) = inbox.chunks.front_mut() {
            // Checked when it arrived (`FromSocket::write`).
            let bytes = front.params.get().and_then(|params| params.get_bytes());
            let Ok(bytes) = bytes else {
                return Poll::Ready(Err(io::Error::other("a malformed write arrived")));
            };
            let rest = &bytes[front.read..front.length];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            front.read += n;
            if front.read == front.length
                && let Some(done) = inbox.chunks.pop_front()
            {
                let _ = done.taken.send(());
            }
            return Poll::Ready(Ok(()));
        }
        match inbox.end.clone() {
            Some(end) => Poll::Ready(end_result(end)),
            None => {
                inbox.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// How the far socket's direction ended, once the server said so.
fn poll_end(inbox: &SharedInbox, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
    let mut inbox = inbox.borrow_mut();
    match inbox.end.clone() {
        Some(end) => Poll::Ready(end_result(end)),
        None => {
            inbox.waker = Some(cx.waker().clone());
            Poll::Pending
        }
    }
}

/// What a read at the end of the far socket's direction returns.
fn end_result(end: End) -> io::Result<()> {
    match end {
        End::Clean => Ok(()),
        End::Failed(reason) => Err(io::Error::new(io::ErrorKind::ConnectionReset, reason)),
        End::Lost => Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "the connection through the executor was lost",
        )),
    }
}

fn poll_channel_read(
    channel: &mut Socket,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
) -> Poll<io::Result<()>> {
    match channel {
        Socket::Tcp(stream) => Pin::new(stream).poll_read(cx, buf),
        Socket::Unix(stream) => Pin::new(stream).poll_read(cx, buf),
    }
}

fn poll_channel_write(
    channel: &mut Socket,
    cx: &mut Context<'_>,
    buf: &[u8],
) -> Poll<io::Result<usize>> {
    match channel {
        Socket::Tcp(stream) => Pin::new(stream).poll_write(cx, buf),
        Socket::Unix(stream) => Pin::new(stream).poll_write(cx, buf),
    }
}

impl AsyncWrite for PortStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.shut {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the connection was shut down for writing",
            )));
        }
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let this = self.get_mut();
        if let Some(channel) = this.channel.as_mut() {
            // A failed `end` or `fail` from far away shows here too.
            if let Err(error) = this.sender.poll_progress(cx) {
                return Poll::Ready(Err(io_error(error)));
            }
            return match poll_channel_write(channel, cx, buf) {
                Poll::Ready(Err(error)) => Poll::Ready(Err(this.channel_error(error))),
                other => other,
            };
        }
        let (gathering, last_asked) = {
            let gathering = this.gathering.borrow();
            (gathering.open.is_some(), gathering.last_asked)
        };
        if gathering {
            // Filling a write needs no room, but a failed earlier write
            // must still end the stream now, not at the next full one.
            if let Err(error) = this.sender.poll_progress(cx) {
                return Poll::Ready(Err(io_error(error)));
            }
        } else {
            let room = match this.sender.poll_room(cx) {
                Poll::Ready(Ok(room)) => room,
                Poll::Ready(Err(error)) => return Poll::Ready(Err(io_error(error))),
                Poll::Pending => return Poll::Pending,
            };
            if buf.len() >= room {
                // A write of its own fills it: one copy, straight in.
                this.sender.send_now(&buf[..room]);
                this.gathering.borrow_mut().last_asked = buf.len();
                return Poll::Ready(Ok(room));
            }
            let size = if buf.len().max(last_asked) < SMALL_WRITE_BYTES {
                room.min(SMALL_GATHER_BYTES)
            } else {
                room
            };
            this.gathering.borrow_mut().open = Some(this.sender.open_write(size));
        }
        let (written, full) = {
            let mut gathering = this.gathering.borrow_mut();
            gathering.last_asked = buf.len();
            match gathering.open.as_mut() {
                Some(open) => (open.append(buf), open.is_full()),
                None => (0, false),
            }
        };
        if full {
            this.send_gathered();
        } else {
            this.send_gathered_soon();
        }
        Poll::Ready(Ok(written))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.channel.is_some() {
            // Written straight into the socket: nothing is held here.
            return Poll::Ready(Ok(()));
        }
        self.send_gathered();
        self.sender.poll_drained(cx).map_err(io_error)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.send_gathered();
        let this = &mut *self;
        if !this.shut
            && let Some(channel) = &this.channel
        {
            // The channel's end of file, then `end`: the server passes the
            // end on only once it has both.
            channel
                .shutdown_write()
                .map_err(|error| this.channel_error(error))?;
        }
        this.shut = true;
        let shutdown = this.shutdown.get_or_insert_with(|| {
            let sender = Rc::clone(&this.sender);
            Box::pin(async move { sender.end().await })
        });
        shutdown.as_mut().poll(cx).map_err(io_error)
    }
}

fn new_inbox() -> (SharedInbox, port_sink::Client) {
    let inbox = SharedInbox::default();
    let sink = capnp_rpc::new_client(FromSocket {
        inbox: Rc::clone(&inbox),
    });
    (inbox, sink)
}

/// A call of `Executor.dial` or `Process.dial`, not sent yet.
pub(crate) type DialRequest =
    capnp::capability::Request<port_dial_params::Owned, port_dial_results::Owned>;
/// A call of `Executor.listen` or `Process.listen`, not sent yet.
pub(crate) type ListenRequest =
    capnp::capability::Request<port_listen_params::Owned, port_listen_results::Owned>;

/// A connection to `address` (`tcp:HOST:PORT` or `unix:PATH`) opened from
/// `executor`'s machine, its bytes in Cap'n Proto messages.
pub async fn dial(executor: &executor::Client, address: &str) -> Result<PortStream, Error> {
    dial_with(executor.dial_request(), address, None).await
}

/// A connection to `address` opened from `executor`'s machine, whose bytes
/// skip Cap'n Proto if `route` (its connection's
/// [`crate::net::Connection::direct_route`]) is given and the server
/// grants a direct channel: the server then moves them kernel to kernel
/// (see "Direct channels" in the schema). Otherwise as [`dial`].
pub async fn dial_via(
    executor: &executor::Client,
    address: &str,
    route: Option<&DirectRoute>,
) -> Result<PortStream, Error> {
    dial_with(executor.dial_request(), address, route).await
}

/// The connection `request` opens to `address`, through a direct channel
/// on `route` if the server grants one.
pub(crate) async fn dial_with(
    mut request: DialRequest,
    address: &str,
    route: Option<&DirectRoute>,
) -> Result<PortStream, Error> {
    let (inbox, sink) = new_inbox();
    request.get().set_address(address);
    request.get().set_from_socket(sink);
    request.get().set_direct(route.is_some());
    let response = request.send().promise.await?;
    let results = response.get()?;
    let mut stream = PortStream::new(
        inbox,
        results.get_to_socket()?,
        results.get_connection()?,
        wire::port_info_from_wire(results.get_info()?)?,
    );
    if let (Some(route), true) = (route, results.has_direct_ticket()) {
        let ticket: crate::model::DirectTicket =
            results.get_direct_ticket()?.try_into().map_err(|_| {
                Error::Rpc(capnp::Error::failed(
                    "a malformed direct-channel ticket".into(),
                ))
            })?;
        match route.open(&ticket).await {
            Ok(channel) => {
                stream.inbox.borrow_mut().direct = true;
                stream.channel = Some(channel);
            }
            Err(error) => {
                // A write, even an empty one, declines the channel: the
                // sinks carry the bytes.
                tracing::debug!(
                    error = %crate::model::io_message(&error),
                    "no direct channel; the connection goes through its sinks"
                );
                stream.sender.send_now(&[]);
            }
        }
    }
    Ok(stream)
}

/// A socket listening on the executor's machine. Dropping it stops the
/// listening and resets the connections it accepted that are still open.
pub struct PortListener {
    address: String,
    incoming: mpsc::Receiver<PortStream>,
    _listener: port_listener::Client,
}

impl PortListener {
    /// Where it listens, on the executor's machine (a port 0 asked for is
    /// the port the kernel chose).
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The next connection; `None` once the listener is gone (its
    /// connection to the executor was lost).
    pub async fn accept(&mut self) -> Option<PortStream> {
        self.incoming.recv().await
    }
}

/// Hands accepted connections to [`PortListener::accept`], one at a time:
/// the server waits for each answer (at most a few at once), so
/// connections nobody accepts wait in the far kernel's backlog.
struct Acceptor {
    incoming: mpsc::Sender<PortStream>,
}

impl port_acceptor::Server for Acceptor {
    async fn accept(
        self: Rc<Self>,
        params: port_acceptor::AcceptParams,
        mut results: port_acceptor::AcceptResults,
    ) -> Result<(), capnp::Error> {
        let params = params.get()?;
        let (inbox, sink) = new_inbox();
        let stream = PortStream::new(
            inbox,
            params.get_to_socket()?,
            params.get_connection()?,
            wire::port_info_from_wire(params.get_info()?)?,
        );
        self.incoming.send(stream).await.map_err(|_| {
            capnp::Error::from(Refusal::new(
                RefusalKind::SocketFailed,
                "the client no longer accepts connections",
            ))
        })?;
        results.get().set_from_socket(sink);
        Ok(())
    }
}

/// Listens on `address` on `executor`'s machine.
pub async fn listen(executor: &executor::Client, address: &str) -> Result<PortListener, Error> {
    listen_with(executor.listen_request(), address).await
}

/// The listener `request` makes on `address`.
pub(crate) async fn listen_with(
    mut request: ListenRequest,
    address: &str,
) -> Result<PortListener, Error> {
    let (incoming, receiver) = mpsc::channel(1);
    let acceptor: port_acceptor::Client = capnp_rpc::new_client(Acceptor { incoming });
    request.get().set_address(address);
    request.get().set_acceptor(acceptor);
    let response = request.send().promise.await?;
    let results = response.get()?;
    Ok(PortListener {
        address: results
            .get_address()?
            .to_string()
            .map_err(|error| Error::Rpc(capnp::Error::failed(error.to_string())))?,
        incoming: receiver,
        _listener: results.get_listener()?,
    })
}
