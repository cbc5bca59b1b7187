//! One connection through an executor: [`PortStream`], tokio's
//! `AsyncRead + AsyncBufRead + AsyncWrite`, or its two halves
//! ([`PortStream::into_split`]) for a reading task and a writing task.
//!
//! A read hands out the bytes where their message brought them
//! (`AsyncBufRead::poll_fill_buf`): a relay writes them on from there, with
//! no copy of its own; `poll_read` copies them into the caller's buffer.
//! Either way a write from the far socket is answered once all of it was
//! read (consumed), which is what holds the far writer back.

use std::cell::{Cell, RefCell};
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker, ready};

use futures::future::LocalBoxFuture;
use futures::task::{ArcWake, AtomicWaker};
use tokio::io::{AsyncBufRead, AsyncRead, AsyncWrite, ReadBuf};

use super::inbox::{Arrived, End, Inbox, SharedInbox, poll_end};
use crate::capexec_capnp::{port_connection, port_sink};
use crate::client::Error;
use crate::model::{PortConnectionInfo, RefusalKind};
use crate::sys::Socket;
use crate::wire::{OpenWrite, PortBudget, PortSender};

thread_local! {
    /// What the streams of this thread (all of its Cap'n Proto
    /// connections: capnp-rpc runs on one thread) may have unanswered.
    static BUDGET: PortBudget = PortBudget::default();
}

/// Small writes gathered into one `PortSink.write`: each message costs
/// the server a call, its answer and their wake-ups, so a program writing
/// 8 or 64 KiB at a time is sent in writes of up to
/// [`crate::wire::PORT_CHUNK_BYTES`], filled in place. What is gathered is sent
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

/// What a direct channel's reader reads ahead for `poll_fill_buf` (its
/// bytes arrive in the kernel's socket, not in messages of ours).
const CHANNEL_READ_AHEAD_BYTES: usize = 64 * 1024;

/// Who waits on the answers to this side's writes: the writing half (for
/// room, a flush, its end) and the reading half, which collects them
/// while it reads (a local capability takes the next write only once the
/// last one's answer was polled). The answers are polled with a waker
/// that wakes both, so halves in two tasks each hear of them.
#[derive(Default)]
struct HalvesWaiting {
    reading: AtomicWaker,
    writing: AtomicWaker,
}

impl ArcWake for HalvesWaiting {
    fn wake_by_ref(halves: &Arc<Self>) {
        halves.reading.wake();
        halves.writing.wake();
    }
}

/// What a connection's halves share. Dropped with the last of them: the
/// server then resets the far socket unless both directions ended.
struct Shared {
    inbox: SharedInbox,
    sender: Rc<PortSender>,
    /// Who waits on `sender`'s answers, and the waker that wakes them all.
    waiting: Arc<HalvesWaiting>,
    answers_waker: Waker,
    /// This side's direction was ended (`shutdown`).
    shut: Cell<bool>,
    info: PortConnectionInfo,
    /// The connection's direct channel, if the server granted one: the
    /// bytes go through it, the sinks only say how each direction ended.
    /// Taken by [`PortStream::into_direct`].
    channel: RefCell<Option<Socket>>,
    _connection: port_connection::Client,
}

impl Shared {
    /// Polls `poll` (of `sender`'s answers) for the reading half, waking
    /// `cx` as well as the writing half when they come.
    fn for_reading<T>(&self, cx: &Context<'_>, poll: impl FnOnce(&mut Context<'_>) -> T) -> T {
        self.waiting.reading.register(cx.waker());
        poll(&mut Context::from_waker(&self.answers_waker))
    }

    /// Polls `poll` (of `sender`'s answers) for the writing half, waking
    /// `cx` as well as the reading half when they come.
    fn for_writing<T>(&self, cx: &Context<'_>, poll: impl FnOnce(&mut Context<'_>) -> T) -> T {
        self.waiting.writing.register(cx.waker());
        poll(&mut Context::from_waker(&self.answers_waker))
    }

    fn is_direct(&self) -> bool {
        self.channel.borrow().is_some()
    }

    /// A channel's I/O error, with the server's reason if it gave one.
    fn channel_error(&self, error: io::Error) -> io::Error {
        match self.inbox.borrow().end.clone() {
            Some(End::Failed(reason)) => io::Error::new(io::ErrorKind::ConnectionReset, reason),
            _ => error,
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let mut inbox = self.inbox.borrow_mut();
        // A channel dropped before both directions ended is reset (TCP),
        // or closed (Unix: no reset); either way the release of the
        // connection that follows makes the server reset the far socket.
        if let Some(channel) = self.channel.get_mut().as_ref()
            && !(self.shut.get() && matches!(inbox.end, Some(End::Clean)))
        {
            channel.prepare_reset();
        }
        inbox.closed = true;
        // Unanswered writes fail: the server resets the socket.
        inbox.chunks.clear();
    }
}

/// One connection through an executor. Like every capability of its RPC
/// system, it is used on that system's thread, inside a `LocalSet`: what a
/// write gathers is sent by a task spawned there.
pub struct PortStream {
    read: PortReadHalf,
    write: PortWriteHalf,
}

/// The reading half of a [`PortStream`] ([`PortStream::into_split`]).
/// Dropping it reads no more: what arrives then waits unanswered, holding
/// the far writer back, until the writing half goes too.
pub struct PortReadHalf {
    shared: Rc<Shared>,
    /// The write being read, taken out of the inbox: its bytes are handed
    /// out where its message brought them.
    reading: Option<Arrived>,
    /// A direct channel's bytes read ahead by `poll_fill_buf`.
    ahead: ReadAhead,
}

#[derive(Default)]
struct ReadAhead {
    bytes: Vec<u8>,
    start: usize,
    end: usize,
}

impl ReadAhead {
    fn is_empty(&self) -> bool {
        self.start == self.end
    }
}

/// The writing half of a [`PortStream`] ([`PortStream::into_split`]).
/// `shutdown` ends this side's direction. Dropping it sends what it
/// gathered but does not end the direction (unlike tokio's `TcpStream`
/// halves: the end is a call that is answered, which a drop cannot wait
/// for), so call `shutdown` first where the far peer waits for the end;
/// once the reading half is gone too, the connection is released, and
/// reset unless both directions ended.
pub struct PortWriteHalf {
    shared: Rc<Shared>,
    gathering: Rc<RefCell<Gathering>>,
    shutdown: Option<LocalBoxFuture<'static, Result<(), capnp::Error>>>,
}

impl PortStream {
    pub(super) fn new(
        inbox: SharedInbox,
        to_socket: port_sink::Client,
        connection: port_connection::Client,
        info: PortConnectionInfo,
        channel: Option<Socket>,
    ) -> PortStream {
        inbox.borrow_mut().direct = channel.is_some();
        let budget = BUDGET.with(PortBudget::clone);
        let waiting = Arc::new(HalvesWaiting::default());
        let shared = Rc::new(Shared {
            inbox,
            sender: Rc::new(PortSender::new(to_socket, budget)),
            answers_waker: futures::task::waker(Arc::clone(&waiting)),
            waiting,
            shut: Cell::new(false),
            info,
            channel: RefCell::new(channel),
            _connection: connection,
        });
        PortStream {
            read: PortReadHalf {
                shared: Rc::clone(&shared),
                reading: None,
                ahead: ReadAhead::default(),
            },
            write: PortWriteHalf {
                shared,
                gathering: Rc::default(),
                shutdown: None,
            },
        }
    }

    /// Sends an empty write now: it declines a direct channel the server
    /// offered (the sinks then carry the bytes).
    pub(super) fn decline_channel(&self) {
        self.write.shared.sender.send_now(&[]);
    }

    /// Whether the bytes go through a direct channel, kernel to kernel on
    /// the server, rather than through Cap'n Proto messages.
    pub fn is_direct(&self) -> bool {
        self.read.shared.is_direct()
    }

    /// The socket's addresses on the executor's machine.
    pub fn info(&self) -> &PortConnectionInfo {
        &self.read.shared.info
    }

    /// Its reading and writing halves, for a task each. The connection is
    /// released once both are dropped.
    pub fn into_split(self) -> (PortReadHalf, PortWriteHalf) {
        (self.read, self.write)
    }

    /// The direct channel and what says how its directions end, for a
    /// caller that relays the channel itself (`capexec forward` splices it
    /// to its local socket); the stream back if it has no channel, or if a
    /// read took bytes from the channel ahead of its reader already.
    pub fn into_direct(self) -> Result<DirectParts, Box<PortStream>> {
        if !self.read.ahead.is_empty() {
            return Err(Box::new(self));
        }
        let shared = &self.read.shared;
        let Some(channel) = shared.channel.borrow_mut().take() else {
            return Err(Box::new(self));
        };
        let ends = DirectEnds {
            inbox: Rc::clone(&shared.inbox),
            sender: Rc::clone(&shared.sender),
            _connection: shared._connection.clone(),
        };
        Ok(DirectParts { channel, ends })
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
            Some(end) => super::inbox::end_result(end).err(),
        }
    }

    /// Ends this side's direction, after shutdown(SHUT_WR) on the channel:
    /// the server then shuts the far socket down for writing.
    pub async fn end(&self) -> io::Result<()> {
        self.sender.end().await.map_err(io_error)
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

impl PortReadHalf {
    /// What a direct channel has, read ahead into memory of ours.
    fn poll_fill_from_channel(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<&[u8]>> {
        if self.ahead.is_empty() {
            if self.ahead.bytes.is_empty() {
                self.ahead.bytes = vec![0; CHANNEL_READ_AHEAD_BYTES];
            }
            let read = match self.shared.channel.borrow().as_ref() {
                Some(channel) => channel.poll_read(cx, &mut self.ahead.bytes),
                None => Poll::Ready(Ok(0)),
            };
            match ready!(read) {
                Ok(0) => {
                    ready!(poll_end(&self.shared.inbox, cx))?;
                    return Poll::Ready(Ok(&[]));
                }
                Ok(read) => (self.ahead.start, self.ahead.end) = (0, read),
                Err(error) => return Poll::Ready(Err(self.shared.channel_error(error))),
            }
        }
        Poll::Ready(Ok(&self.ahead.bytes[self.ahead.start..self.ahead.end]))
    }

    /// Reads a direct channel straight into `buf`, when nothing was read
    /// ahead.
    fn poll_read_channel(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let read = match self.shared.channel.borrow().as_ref() {
            Some(channel) => channel.poll_read(cx, buf.initialize_unfilled()),
            None => Poll::Ready(Ok(0)),
        };
        match ready!(read) {
            Ok(0) if buf.remaining() > 0 => poll_end(&self.shared.inbox, cx),
            Ok(read) => {
                buf.advance(read);
                Poll::Ready(Ok(()))
            }
            Err(error) => Poll::Ready(Err(self.shared.channel_error(error))),
        }
    }
}

impl AsyncBufRead for PortReadHalf {
    fn poll_fill_buf(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<&[u8]>> {
        let this = self.get_mut();
        // Writes waiting on a local capability move on while we read.
        // (A failed write breaks the writing half only: reading goes on.)
        let _ = this
            .shared
            .for_reading(cx, |cx| this.shared.sender.poll_progress(cx));
        if this.shared.is_direct() {
            return this.poll_fill_from_channel(cx);
        }
        // An empty write (a peer's mistake: the server sends none) is
        // answered and passed over, never read as the end.
        while this.reading.as_ref().is_none_or(Arrived::is_read) {
            if let Some(done) = this.reading.take() {
                done.answer();
            }
            match ready!(Inbox::poll_next(&this.shared.inbox, cx))? {
                Some(arrived) => this.reading = Some(arrived),
                None => return Poll::Ready(Ok(&[])),
            }
        }
        match &this.reading {
            Some(arrived) => Poll::Ready(arrived.unread()),
            None => Poll::Ready(Ok(&[])),
        }
    }

    fn consume(self: Pin<&mut Self>, amount: usize) {
        let this = self.get_mut();
        if this.shared.is_direct() {
            this.ahead.start = this.ahead.start.saturating_add(amount).min(this.ahead.end);
            return;
        }
        // Answered as soon as all of it is read: the far writer's room.
        if let Some(arrived) = this.reading.as_mut()
            && arrived.consume(amount)
            && let Some(done) = this.reading.take()
        {
            done.answer();
        }
    }
}

impl AsyncRead for PortReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.shared.is_direct() && this.ahead.is_empty() {
            let _ = this
                .shared
                .for_reading(cx, |cx| this.shared.sender.poll_progress(cx));
            return this.poll_read_channel(cx, buf);
        }
        let mut this = Pin::new(this);
        let bytes = ready!(this.as_mut().poll_fill_buf(cx))?;
        let taken = bytes.len().min(buf.remaining());
        buf.put_slice(&bytes[..taken]);
        this.consume(taken);
        Poll::Ready(Ok(()))
    }
}

impl Drop for PortReadHalf {
    fn drop(&mut self) {
        // Not read, so not answered: it waits with the rest until the
        // connection goes.
        if let Some(arrived) = self.reading.take() {
            self.shared.inbox.borrow_mut().chunks.push_front(arrived);
        }
    }
}

impl PortWriteHalf {
    /// Sends what is gathered, now.
    fn send_gathered(&self) {
        send_gathered(&self.shared.sender, &self.gathering);
    }

    /// Sends what is gathered once the writing task yields.
    fn send_gathered_soon(&self) {
        let mut gathering = self.gathering.borrow_mut();
        if gathering.scheduled {
            return;
        }
        gathering.scheduled = true;
        let sender = Rc::downgrade(&self.shared.sender);
        let gathering = Rc::downgrade(&self.gathering);
        tokio::task::spawn_local(async move {
            // Gone with the stream: a dropped stream resets the connection.
            if let (Some(sender), Some(gathering)) = (sender.upgrade(), gathering.upgrade()) {
                gathering.borrow_mut().scheduled = false;
                send_gathered(&sender, &gathering);
            }
        });
    }

    /// Writes straight into a direct channel.
    fn poll_write_channel(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        // A failed `end` or `fail` from far away shows here too.
        let progress = self
            .shared
            .for_writing(cx, |cx| self.shared.sender.poll_progress(cx));
        if let Err(error) = progress {
            return Poll::Ready(Err(io_error(error)));
        }
        let written = match self.shared.channel.borrow().as_ref() {
            Some(channel) => channel.poll_write(cx, buf),
            None => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        };
        match ready!(written) {
            Err(error) => Poll::Ready(Err(self.shared.channel_error(error))),
            other => Poll::Ready(other),
        }
    }
}

impl Drop for PortWriteHalf {
    fn drop(&mut self) {
        // Written, as far as the writer was told: it goes out, even with
        // no task left to send it once the writer yields.
        self.send_gathered();
    }
}

fn send_gathered(sender: &PortSender, gathering: &RefCell<Gathering>) {
    let open = gathering.borrow_mut().open.take();
    if let Some(open) = open {
        sender.send_open(open);
    }
}

impl AsyncWrite for PortWriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.shared.shut.get() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the connection was shut down for writing",
            )));
        }
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let this = self.get_mut();
        if this.shared.is_direct() {
            return this.poll_write_channel(cx, buf);
        }
        let (shared, sender) = (&this.shared, &this.shared.sender);
        let (gathering, last_asked) = {
            let gathering = this.gathering.borrow();
            (gathering.open.is_some(), gathering.last_asked)
        };
        if gathering {
            // Filling a write needs no room, but a failed earlier write
            // must still end the stream now, not at the next full one.
            if let Err(error) = shared.for_writing(cx, |cx| sender.poll_progress(cx)) {
                return Poll::Ready(Err(io_error(error)));
            }
        } else {
            let room = match shared.for_writing(cx, |cx| sender.poll_room(cx)) {
                Poll::Ready(Ok(room)) => room,
                Poll::Ready(Err(error)) => return Poll::Ready(Err(io_error(error))),
                Poll::Pending => return Poll::Pending,
            };
            if buf.len() >= room {
                // A write of its own fills it: one copy, straight in.
                sender.send_now(&buf[..room]);
                this.gathering.borrow_mut().last_asked = buf.len();
                return Poll::Ready(Ok(room));
            }
            let size = if buf.len().max(last_asked) < SMALL_WRITE_BYTES {
                room.min(SMALL_GATHER_BYTES)
            } else {
                room
            };
            this.gathering.borrow_mut().open = Some(sender.open_write(size));
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
        if self.shared.is_direct() {
            // Written straight into the socket: nothing is held here.
            return Poll::Ready(Ok(()));
        }
        self.send_gathered();
        let shared = &self.shared;
        shared
            .for_writing(cx, |cx| shared.sender.poll_drained(cx))
            .map_err(io_error)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.send_gathered();
        let this = &mut *self;
        if !this.shared.shut.get()
            && let Some(channel) = this.shared.channel.borrow().as_ref()
        {
            // The channel's end of file, then `end`: the server passes the
            // end on only once it has both.
            channel
                .shutdown_write()
                .map_err(|error| this.shared.channel_error(error))?;
        }
        this.shared.shut.set(true);
        let shutdown = this.shutdown.get_or_insert_with(|| {
            let sender = Rc::clone(&this.shared.sender);
            Box::pin(async move { sender.end().await })
        });
        this.shared
            .for_writing(cx, |cx| shutdown.as_mut().poll(cx))
            .map_err(io_error)
    }
}

impl AsyncRead for PortStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().read).poll_read(cx, buf)
    }
}

impl AsyncBufRead for PortStream {
    fn poll_fill_buf(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<&[u8]>> {
        Pin::new(&mut self.get_mut().read).poll_fill_buf(cx)
    }

    fn consume(self: Pin<&mut Self>, amount: usize) {
        Pin::new(&mut self.get_mut().read).consume(amount)
    }
}

impl AsyncWrite for PortStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().write).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().write).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().write).poll_shutdown(cx)
    }
}
