//! What arrives from the far socket: each `PortSink.write` the server
//! makes on `fromSocket` waits here, its bytes where the message brought
//! them, and is answered only once they are read (the flow control that
//! holds the far writer back while nothing reads here).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use tokio::sync::oneshot;

use crate::capexec_capnp::port_sink;
use crate::model::{Refusal, RefusalKind};

/// What has arrived from the far socket and not been read yet.
#[derive(Default)]
pub(super) struct Inbox {
    pub(super) chunks: VecDeque<Arrived>,
    pub(super) end: Option<End>,
    pub(super) waker: Option<Waker>,
    /// The stream was dropped: later writes fail.
    pub(super) closed: bool,
    /// The bytes come through a direct channel: a write here is the
    /// server's mistake.
    pub(super) direct: bool,
}

pub(super) struct Arrived {
    /// The write's parameters themselves: read out of the received
    /// message, with no copy of their own.
    params: port_sink::WriteParams,
    length: usize,
    read: usize,
    /// Answers the write that brought it, once it is all read.
    taken: oneshot::Sender<()>,
}

impl Arrived {
    /// The bytes not read yet, where the message brought them.
    pub(super) fn unread(&self) -> io::Result<&[u8]> {
        // Checked when it arrived (`FromSocket::write`).
        let bytes = self.params.get().and_then(|params| params.get_bytes());
        let bytes = bytes.map_err(|_| io::Error::other("a malformed write arrived"))?;
        Ok(&bytes[self.read..self.length])
    }

    /// Whether all of its bytes were read.
    pub(super) fn is_read(&self) -> bool {
        self.read == self.length
    }

    /// Counts `amount` more bytes read; true once all of them are.
    pub(super) fn consume(&mut self, amount: usize) -> bool {
        self.read = self.read.saturating_add(amount).min(self.length);
        self.read == self.length
    }

    /// Answers the write that brought it: the far socket may send more.
    pub(super) fn answer(self) {
        let _ = self.taken.send(());
    }
}

#[derive(Clone)]
pub(super) enum End {
    Clean,
    Failed(String),
    Lost,
}

pub(super) type SharedInbox = Rc<RefCell<Inbox>>;

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

    /// The next write that arrived, or how the direction ended (`None`:
    /// cleanly); pending, with `cx` woken, while neither is here.
    pub(super) fn poll_next(
        inbox: &SharedInbox,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<Option<Arrived>>> {
        let mut inbox = inbox.borrow_mut();
        if let Some(arrived) = inbox.chunks.pop_front() {
            return Poll::Ready(Ok(Some(arrived)));
        }
        match inbox.end.clone() {
            Some(end) => Poll::Ready(end_result(end).map(|()| None)),
            None => {
                inbox.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// `fromSocket`: the far socket's bytes, answered as they are read.
pub(super) struct FromSocket {
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

/// A new inbox and the `fromSocket` sink that fills it.
pub(super) fn new_inbox() -> (SharedInbox, port_sink::Client) {
    let inbox = SharedInbox::default();
    let sink = capnp_rpc::new_client(FromSocket {
        inbox: Rc::clone(&inbox),
    });
    (inbox, sink)
}

/// How the far socket's direction ended, once the server said so.
pub(super) fn poll_end(inbox: &SharedInbox, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
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
pub(super) fn end_result(end: End) -> io::Result<()> {
    match end {
        End::Clean => Ok(()),
        End::Failed(reason) => Err(io::Error::new(io::ErrorKind::ConnectionReset, reason)),
        End::Lost => Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "the connection through the executor was lost",
        )),
    }
}
