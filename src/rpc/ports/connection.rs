//! One connection's socket joined to its two `PortSink`s: the write queue
//! into the socket, the reader into the client's sink, and the
//! capabilities that hold it.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::rc::Rc;

use capnp::Error;
use tokio::sync::{Notify, oneshot};
use tokio::task::{AbortHandle, spawn_local};

use crate::capexec_capnp::{port_connection, port_sink};
use crate::model::{Refusal, RefusalKind, excerpt, io_message};
use crate::ports::{Socket, socket_failure};
use crate::rpc::port_quota::{PortQuota, PortTicket};
use crate::wire::{self, MAX_PORT_WRITE_BYTES, PortSender};

/// One socket and the state its two directions share.
pub(super) struct Connection {
    pub(super) socket: RefCell<Option<Rc<Socket>>>,
    /// Where the socket's bytes go (set once the acceptor answered).
    pub(super) from_socket: RefCell<Option<port_sink::Client>>,
    /// The first failure: later calls fail with it.
    pub(super) failure: RefCell<Option<String>>,
    pub(super) to_ended: Cell<bool>,
    pub(super) from_ended: Cell<bool>,
    pub(super) tasks: RefCell<Vec<AbortHandle>>,
    /// Writes for the socket, oldest first. (capnp-rpc runs one stream
    /// call on a capability at a time, so this holds one write and the
    /// end; a sender that ignores flow control fills the connection's
    /// bound on unanswered calls instead, and the server closes it.)
    pub(super) queue: RefCell<VecDeque<Queued>>,
    pub(super) queue_changed: Notify,
    pub(super) end_asked: Cell<bool>,
    /// Whether the bytes go through a direct channel, not the sinks (see
    /// "Direct channels" in the schema).
    pub(super) direct: Cell<Direct>,
    /// Woken when the client declines its channel.
    pub(super) declined: Notify,
    /// That channel, once claimed.
    pub(super) channel: RefCell<Option<Rc<Socket>>>,
    /// The descriptors a direct channel takes, counted in the
    /// connection's holdings for as long as the connection is.
    pub(super) direct_hold: RefCell<Option<crate::rpc::holdings::Hold>>,
}

/// Where a connection's bytes go.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Direct {
    /// Through the sinks.
    No,
    /// A channel was granted and is not claimed yet: nothing moves.
    Offered,
    /// Through the channel.
    Claimed,
}

pub(super) enum Queued {
    /// The call's parameters themselves: the bytes go from the received
    /// message into the socket, with no copy of their own.
    Write(port_sink::WriteParams, oneshot::Sender<Result<(), Refusal>>),
    End(oneshot::Sender<Result<(), Refusal>>),
}

impl Connection {
    fn new(socket: Socket) -> Rc<Connection> {
        Rc::new(Connection {
            socket: RefCell::new(Some(Rc::new(socket))),
            from_socket: RefCell::new(None),
            failure: RefCell::new(None),
            to_ended: Cell::new(false),
            from_ended: Cell::new(false),
            tasks: RefCell::new(Vec::new()),
            queue: RefCell::new(VecDeque::new()),
            queue_changed: Notify::new(),
            end_asked: Cell::new(false),
            direct: Cell::new(Direct::No),
            declined: Notify::new(),
            channel: RefCell::new(None),
            direct_hold: RefCell::new(None),
        })
    }

    pub(super) fn socket(&self) -> Option<Rc<Socket>> {
        self.socket.borrow().clone()
    }

    pub(super) fn failed(&self) -> Option<Refusal> {
        self.failure
            .borrow()
            .as_ref()
            .map(|reason| Refusal::new(RefusalKind::SocketFailed, reason.clone()))
    }

    /// Resets the socket (TCP RST), stops both directions, and tells the
    /// client's sink why; only the first reason counts.
    pub(super) fn reset(&self, reason: &str) {
        if self.failure.borrow().is_some() {
            return;
        }
        *self.failure.borrow_mut() = Some(reason.to_string());
        if let Some(socket) = self.socket.borrow_mut().take() {
            socket.prepare_reset();
        }
        if let Some(channel) = self.channel.borrow_mut().take() {
            channel.prepare_reset();
        }
        for task in self.tasks.borrow_mut().drain(..) {
            task.abort();
        }
        let failure = self.failed();
        for queued in self.queue.borrow_mut().drain(..) {
            let (Queued::Write(_, done) | Queued::End(done)) = queued;
            let _ = done.send(Err(failure.clone().expect("set above")));
        }
        if !self.from_ended.get()
            && let Some(sink) = self.from_socket.borrow_mut().take()
        {
            let mut request = sink.fail_request();
            request.get().set_reason(reason);
            let answer = request.send().promise;
            // The answer only says the client heard; nothing waits for it.
            spawn_local(async move {
                let _ = answer.await;
            });
        }
    }

    /// Ends the connection for good: closes a socket whose two directions
    /// ended cleanly, resets any other for `reason`.
    pub(super) fn release(&self, reason: &str) {
        if self.to_ended.get() && self.from_ended.get() {
            self.socket.borrow_mut().take();
            self.channel.borrow_mut().take();
        } else {
            self.reset(reason);
        }
        for task in self.tasks.borrow_mut().drain(..) {
            task.abort();
        }
    }

    /// Closes the socket once both directions ended cleanly.
    pub(super) fn close_if_done(&self) {
        if self.to_ended.get() && self.from_ended.get() {
            self.socket.borrow_mut().take();
            self.channel.borrow_mut().take();
        }
    }

    /// A write or `end` before the channel was claimed: the client
    /// declined it, and the sinks carry the bytes.
    fn decline_channel(&self) {
        if self.direct.get() == Direct::Offered {
            self.direct.set(Direct::No);
            self.declined.notify_one();
        }
    }

    pub(super) fn track(&self, task: AbortHandle) {
        self.tasks.borrow_mut().push(task);
    }

    /// Queues a write or the end at dispatch, in arrival order.
    fn submit(&self, item: Queued) {
        self.queue.borrow_mut().push_back(item);
        self.queue_changed.notify_one();
    }
}

/// Writes the queued bytes into the socket, one write at a time.
pub(super) async fn write_queue(connection: Rc<Connection>) {
    loop {
        let next = connection.queue.borrow_mut().pop_front();
        let Some(item) = next else {
            connection.queue_changed.notified().await;
            continue;
        };
        let Some(socket) = connection.socket() else {
            return;
        };
        match item {
            Queued::Write(params, done) => {
                // Checked when queued (`ToSocket::queue_write`).
                let bytes = params.get().and_then(|params| params.get_bytes());
                let written = match bytes {
                    Ok(bytes) => socket.write_all(bytes).await,
                    Err(error) => Err(io::Error::other(error.to_string())),
                };
                match written {
                    Ok(()) => {
                        let _ = done.send(Ok(()));
                    }
                    Err(error) => {
                        let refusal = socket_failure("writing to the connection", &error);
                        let _ = done.send(Err(refusal.clone()));
                        connection.reset(&refusal.message);
                        return;
                    }
                }
            }
            Queued::End(done) => {
                let result = socket.shutdown_write().map_err(|error| {
                    socket_failure("shutting the connection down for writing", &error)
                });
                drop(socket);
                match result {
                    Ok(()) => {
                        connection.to_ended.set(true);
                        connection.close_if_done();
                        let _ = done.send(Ok(()));
                    }
                    Err(refusal) => {
                        let _ = done.send(Err(refusal.clone()));
                        connection.reset(&refusal.message);
                    }
                }
                return;
            }
        }
    }
}

thread_local! {
    /// Where a connection's reader reads the socket into when it cannot
    /// tell how many bytes are there (then copied into their `write`, with
    /// no await between): one buffer for the thread, not one per
    /// connection, so a thousand connections cost no more than one.
    static SCRATCH: RefCell<Vec<u8>> = RefCell::new(vec![0u8; wire::PORT_CHUNK_BYTES]);
}

/// Reads the socket into the client's sink, as fast as the sink answers.
async fn read_socket(connection: Rc<Connection>, sender: PortSender) {
    loop {
        let room = match sender.room().await {
            Ok(room) => room,
            Err(error) => {
                connection.reset(&format!(
                    "the client's end of the connection failed: {}",
                    wire::describe(&error)
                ));
                return;
            }
        };
        let Some(socket) = connection.socket() else {
            return;
        };
        let ready = std::future::poll_fn(|cx| {
            // A failure is seen when room is next asked for.
            let _ = sender.poll_progress(cx);
            socket.poll_read_ready(cx)
        });
        let read = match ready.await {
            // Bytes are there: read straight into the write's message.
            Ok(()) => match socket.pending().min(room) {
                0 => SCRATCH.with_borrow_mut(|buffer| {
                    let read = socket.try_read(&mut buffer[..room]);
                    if let Ok(read @ 1..) = read {
                        sender.send_now(&buffer[..read]);
                    }
                    read
                }),
                size => sender.send_read(size, |buffer| socket.try_read(buffer)),
            },
            Err(error) => Err(error),
        };
        if matches!(&read, Err(error) if error.kind() == io::ErrorKind::WouldBlock) {
            continue;
        }
        drop(socket);
        match read {
            Ok(0) => {
                match sender.end().await {
                    Ok(()) => {
                        connection.from_ended.set(true);
                        connection.from_socket.borrow_mut().take();
                        connection.close_if_done();
                    }
                    Err(error) => connection.reset(&format!(
                        "the client's end of the connection failed: {}",
                        wire::describe(&error)
                    )),
                }
                return;
            }
            Ok(_) => {}
            Err(error) => {
                connection.reset(&reading_failure(&error));
                return;
            }
        }
    }
}

/// Why reading the socket failed, as the client is told.
pub(super) fn reading_failure(error: &io::Error) -> String {
    match error.kind() {
        io::ErrorKind::ConnectionReset => "the connection was reset by its peer".to_string(),
        _ => format!("reading from the connection: {}", io_message(error)),
    }
}

/// `toSocket`: what the client writes goes into the socket.
struct ToSocket {
    connection: Rc<Connection>,
}

impl ToSocket {
    fn queue_write(
        &self,
        params: port_sink::WriteParams,
    ) -> Result<oneshot::Receiver<Result<(), Refusal>>, Refusal> {
        let connection = &self.connection;
        if let Some(failure) = connection.failed() {
            return Err(failure);
        }
        if connection.end_asked.get() {
            return Err(Refusal::new(
                RefusalKind::InvalidArgument,
                "a write after `end` on this connection",
            ));
        }
        connection.decline_channel();
        if connection.direct.get() == Direct::Claimed {
            let refusal = Refusal::new(
                RefusalKind::InvalidArgument,
                "a write on a connection whose bytes go through its direct channel",
            );
            connection.reset(&refusal.message);
            return Err(refusal);
        }
        let length = params
            .get()
            .and_then(|params| params.get_bytes())
            .map_err(|error| {
                Refusal::new(
                    RefusalKind::InvalidArgument,
                    format!("a malformed write: {error}"),
                )
            })?
            .len();
        if length > MAX_PORT_WRITE_BYTES {
            let refusal = Refusal::new(
                RefusalKind::InvalidArgument,
                format!("a write of {length} bytes; at most {MAX_PORT_WRITE_BYTES}"),
            );
            connection.reset(&refusal.message);
            return Err(refusal);
        }
        let (done, answer) = oneshot::channel();
        connection.submit(Queued::Write(params, done));
        Ok(answer)
    }
}

/// An answer from the writer task, or the connection's failure if it
/// stopped before answering.
async fn answered(
    connection: Rc<Connection>,
    answer: oneshot::Receiver<Result<(), Refusal>>,
) -> Result<(), Error> {
    match answer.await {
        Ok(result) => Ok(result?),
        Err(_) => Err(connection
            .failed()
            .unwrap_or_else(|| Refusal::new(RefusalKind::SocketFailed, "the connection closed"))
            .into()),
    }
}

impl port_sink::Server for ToSocket {
    // Not `async fn`: the write is queued while the call is dispatched, so
    // the bytes reach the socket in the order the calls arrived.
    fn write(
        self: Rc<Self>,
        params: port_sink::WriteParams,
    ) -> impl Future<Output = Result<(), Error>> + 'static {
        let queued = self.queue_write(params);
        let connection = Rc::clone(&self.connection);
        async move { answered(connection, queued?).await }
    }

    fn end(
        self: Rc<Self>,
        _: port_sink::EndParams,
        _: port_sink::EndResults,
    ) -> impl Future<Output = Result<(), Error>> + 'static {
        let connection = Rc::clone(&self.connection);
        connection.decline_channel();
        let queued = if let Some(failure) = connection.failed() {
            Err(failure)
        } else if connection.end_asked.replace(true) {
            Ok(None)
        } else {
            let (done, answer) = oneshot::channel();
            connection.submit(Queued::End(done));
            Ok(Some(answer))
        };
        async move {
            match queued? {
                Some(answer) => answered(connection, answer).await,
                None => Ok(()),
            }
        }
    }

    async fn fail(
        self: Rc<Self>,
        params: port_sink::FailParams,
        _: port_sink::FailResults,
    ) -> Result<(), Error> {
        let reason = params
            .get()
            .and_then(|params| params.get_reason())
            .ok()
            .and_then(|reason| reason.to_str().ok().map(|text| excerpt(text).into_owned()))
            .unwrap_or_default();
        self.connection
            .reset(&format!("the client failed the connection: {reason}"));
        Ok(())
    }
}

/// `PortConnection`: holding it keeps the socket open.
pub(super) struct ConnectionHandle {
    connection: Rc<Connection>,
    _ticket: PortTicket,
}

impl port_connection::Server for ConnectionHandle {}

impl Drop for ConnectionHandle {
    fn drop(&mut self) {
        self.connection
            .release("the connection's capability was released");
    }
}

/// The capabilities of a connection whose writer runs; its reader starts
/// once the client's sink is known ([`start_reading`]).
pub(super) fn open(
    socket: Socket,
    ticket: PortTicket,
) -> (Rc<Connection>, port_connection::Client, port_sink::Client) {
    let (connection, handle, to_socket) = capabilities(socket, ticket);
    let writer = spawn_local(write_queue(Rc::clone(&connection)));
    connection.track(writer.abort_handle());
    (connection, handle, to_socket)
}

/// A connection and its capabilities, nothing moving yet.
pub(super) fn capabilities(
    socket: Socket,
    ticket: PortTicket,
) -> (Rc<Connection>, port_connection::Client, port_sink::Client) {
    let connection = Connection::new(socket);
    let handle = capnp_rpc::new_client(ConnectionHandle {
        connection: Rc::clone(&connection),
        _ticket: ticket,
    });
    let to_socket = capnp_rpc::new_client(ToSocket {
        connection: Rc::clone(&connection),
    });
    (connection, handle, to_socket)
}

pub(super) fn start_reading(
    connection: &Rc<Connection>,
    from_socket: port_sink::Client,
    quota: &PortQuota,
) {
    if connection.failure.borrow().is_some() {
        return;
    }
    *connection.from_socket.borrow_mut() = Some(from_socket.clone());
    let sender = PortSender::new(from_socket, quota.budget().clone());
    let reader = spawn_local(read_socket(Rc::clone(connection), sender));
    connection.track(reader.abort_handle());
}
