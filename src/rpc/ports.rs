//! The server side of `Executor.dial` and `Executor.listen`: a socket of
//! the ports engine joined to two `PortSink`s, one per direction, and
//! listeners that hand what they accept to the client's acceptor.
//!
//! Socket to client: one task reads only as much as the sender's window
//! has room for, so a client that stops reading stops the reads (the
//! kernel's buffers fill, then the peer's). Client to socket: writes are
//! queued in the order they arrive (at dispatch, before any await) and one
//! task writes them; each answer waits for its bytes to be in the socket.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::rc::{Rc, Weak};

use capnp::Error;
use tokio::sync::{Notify, Semaphore, oneshot};
use tokio::task::{AbortHandle, spawn_local};

use crate::capexec_capnp::{
    port_acceptor, port_connection, port_dial_params, port_dial_results, port_listen_params,
    port_listen_results, port_listener, port_sink,
};
use crate::engine::Rules;
use crate::model::{PortUse, Refusal, RefusalKind, excerpt, io_message, port_address};
use crate::ports::{Listening, PortRules, PumpError, Socket, socket_failure};
use crate::rpc::DIRECT_CLAIM_WITHIN;
use crate::rpc::direct::{CHANNEL_CLAIMED, Claim};
use crate::rpc::port_quota::{PortQuota, PortTicket};
use crate::wire::{self, MAX_PORT_WRITE_BYTES, PortSender};

/// Accepted connections waiting for the acceptor's answer at once.
pub const MAX_PENDING_ACCEPTS: usize = 16;

/// One socket and the state its two directions share.
struct Connection {
    socket: RefCell<Option<Rc<Socket>>>,
    /// Where the socket's bytes go (set once the acceptor answered).
    from_socket: RefCell<Option<port_sink::Client>>,
    /// The first failure: later calls fail with it.
    failure: RefCell<Option<String>>,
    to_ended: Cell<bool>,
    from_ended: Cell<bool>,
    tasks: RefCell<Vec<AbortHandle>>,
    /// Writes for the socket, oldest first. (capnp-rpc runs one stream
    /// call on a capability at a time, so this holds one write and the
    /// end; a sender that ignores flow control fills the connection's
    /// bound on unanswered calls instead, and the server closes it.)
    queue: RefCell<VecDeque<Queued>>,
    queue_changed: Notify,
    end_asked: Cell<bool>,
    /// Whether the bytes go through a direct channel, not the sinks (see
    /// "Direct channels" in the schema).
    direct: Cell<Direct>,
    /// Woken when the client declines its channel.
    declined: Notify,
    /// That channel, once claimed.
    channel: RefCell<Option<Rc<Socket>>>,
}

/// Where a connection's bytes go.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direct {
    /// Through the sinks.
    No,
    /// A channel was granted and is not claimed yet: nothing moves.
    Offered,
    /// Through the channel.
    Claimed,
}

enum Queued {
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
        })
    }

    fn socket(&self) -> Option<Rc<Socket>> {
        self.socket.borrow().clone()
    }

    fn failed(&self) -> Option<Refusal> {
        self.failure
            .borrow()
            .as_ref()
            .map(|reason| Refusal::new(RefusalKind::SocketFailed, reason.clone()))
    }

    /// Resets the socket (TCP RST), stops both directions, and tells the
    /// client's sink why; only the first reason counts.
    fn reset(&self, reason: &str) {
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
    fn release(&self, reason: &str) {
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
    fn close_if_done(&self) {
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

    fn track(&self, task: AbortHandle) {
        self.tasks.borrow_mut().push(task);
    }

    /// Queues a write or the end at dispatch, in arrival order.
    fn submit(&self, item: Queued) {
        self.queue.borrow_mut().push_back(item);
        self.queue_changed.notify_one();
    }
}

/// Writes the queued bytes into the socket, one write at a time.
async fn write_queue(connection: Rc<Connection>) {
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

/// Why a direct connection ended when its channel failed.
fn channel_failed(error: &io::Error) -> String {
    format!("the client's direct channel failed: {}", io_message(error))
}

/// Why a direct connection's relay could not go on without a pipe.
fn no_pipe(error: &io::Error) -> String {
    format!(
        "the server has no pipe for the relay: {}",
        io_message(error)
    )
}

/// Why reading the socket failed, as the client is told.
fn reading_failure(error: &io::Error) -> String {
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
struct ConnectionHandle {
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
fn open(
    socket: Socket,
    ticket: PortTicket,
) -> (Rc<Connection>, port_connection::Client, port_sink::Client) {
    let (connection, handle, to_socket) = capabilities(socket, ticket);
    let writer = spawn_local(write_queue(Rc::clone(&connection)));
    connection.track(writer.abort_handle());
    (connection, handle, to_socket)
}

/// A connection and its capabilities, nothing moving yet.
fn capabilities(
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

fn start_reading(connection: &Rc<Connection>, from_socket: port_sink::Client, quota: &PortQuota) {
    if connection.failure.borrow().is_some() {
        return;
    }
    *connection.from_socket.borrow_mut() = Some(from_socket.clone());
    let sender = PortSender::new(from_socket, quota.budget().clone());
    let reader = spawn_local(read_socket(Rc::clone(connection), sender));
    connection.track(reader.abort_handle());
}

/// `Executor.dial` and `Process.dial` (their parameters and results).
pub(crate) type DialParams = capnp::capability::Params<port_dial_params::Owned>;
pub(crate) type DialResults = capnp::capability::Results<port_dial_results::Owned>;
/// `Executor.listen` and `Process.listen`.
pub(crate) type ListenParams = capnp::capability::Params<port_listen_params::Owned>;
pub(crate) type ListenResults = capnp::capability::Results<port_listen_results::Owned>;

/// The rules of an executor's ports: `rules`' if it is restricted.
pub(crate) fn port_rules(rules: Option<&Rules>) -> &PortRules {
    static UNRESTRICTED: std::sync::LazyLock<PortRules> =
        std::sync::LazyLock::new(PortRules::unrestricted);
    rules.map_or(&UNRESTRICTED, Rules::ports)
}

/// The forwards made through one `Process` capability (`Process.dial`,
/// `Process.listen`): they end when it is released, which drops this.
#[derive(Default)]
pub(crate) struct Tied {
    connections: RefCell<Vec<Weak<Connection>>>,
    listeners: RefCell<Vec<Weak<Listener>>>,
}

/// Why the forwards of a released process end.
const PROCESS_RELEASED: &str = "the process's capability was released";

impl Tied {
    fn add_connection(&self, connection: &Rc<Connection>) {
        let mut list = self.connections.borrow_mut();
        list.retain(|weak| weak.strong_count() > 0);
        list.push(Rc::downgrade(connection));
    }

    fn add_listener(&self, listener: &Rc<Listener>) {
        let mut list = self.listeners.borrow_mut();
        list.retain(|weak| weak.strong_count() > 0);
        list.push(Rc::downgrade(listener));
    }
}

impl Drop for Tied {
    fn drop(&mut self) {
        for connection in self.connections.get_mut().drain(..) {
            if let Some(connection) = connection.upgrade() {
                connection.release(PROCESS_RELEASED);
            }
        }
        for listener in self.listeners.get_mut().drain(..) {
            if let Some(listener) = listener.upgrade() {
                listener.close(PROCESS_RELEASED);
            }
        }
    }
}

/// What a process's owner capability needs for `Process.dial` and
/// `Process.listen`: the rules and the limits of the executor that started
/// (or restored) the process, and the forwards made through it so far.
pub(crate) struct ProcessPorts {
    rules: Option<Rc<Rules>>,
    quota: PortQuota,
    tied: Rc<Tied>,
}

impl ProcessPorts {
    pub(crate) fn new(rules: Option<Rc<Rules>>, quota: PortQuota) -> ProcessPorts {
        ProcessPorts {
            rules,
            quota,
            tied: Rc::default(),
        }
    }

    /// `Process.dial`. Holds the capability's forwards only weakly while
    /// it connects, so a release meanwhile is not delayed.
    pub(crate) fn dial(
        &self,
        params: DialParams,
        results: DialResults,
    ) -> impl Future<Output = Result<(), Error>> + 'static + use<> {
        let (rules, quota, tie) = self.parts();
        async move {
            dial(
                port_rules(rules.as_deref()),
                &quota,
                params,
                results,
                Some(tie),
            )
            .await
        }
    }

    /// `Process.listen`, as [`ProcessPorts::dial`].
    pub(crate) fn listen(
        &self,
        params: ListenParams,
        results: ListenResults,
    ) -> impl Future<Output = Result<(), Error>> + 'static + use<> {
        let (rules, quota, tie) = self.parts();
        async move {
            listen(
                port_rules(rules.as_deref()),
                &quota,
                params,
                results,
                Some(tie),
            )
            .await
        }
    }

    /// What a call needs, owned, with the forwards held weakly.
    fn parts(&self) -> (Option<Rc<Rules>>, PortQuota, Weak<Tied>) {
        (
            self.rules.clone(),
            self.quota.clone(),
            Rc::downgrade(&self.tied),
        )
    }
}

/// The forwards of `tie`, if the call is tied to a process's capability
/// and it is still held; else the refusal of a forward made too late.
fn tied_to(tie: Option<&Weak<Tied>>) -> Result<Option<Rc<Tied>>, Refusal> {
    match tie {
        None => Ok(None),
        Some(tie) => tie
            .upgrade()
            .map(Some)
            .ok_or_else(|| Refusal::new(RefusalKind::SocketFailed, PROCESS_RELEASED)),
    }
}

/// `Executor.dial` on this machine under `rules`, or `Process.dial` with
/// the process's capability's forwards as `tie`.
pub(crate) async fn dial(
    rules: &PortRules,
    quota: &PortQuota,
    params: DialParams,
    mut results: DialResults,
    tie: Option<Weak<Tied>>,
) -> Result<(), Error> {
    let params = params.get()?;
    let asked = text_param(params.get_address())?;
    let from_socket = params.get_from_socket()?;
    let asks_direct = params.get_direct();
    let address = port_address(&asked, PortUse::Dial)?;
    tied_to(tie.as_ref())?;
    let ticket = quota.take_stream()?;
    let socket = crate::ports::dial(&address, &asked, rules).await?;
    // Released while connecting: the peer that just accepted sees a
    // reset, as every other connection of that capability did, not a
    // clean end of file.
    let tied = tied_to(tie.as_ref()).inspect_err(|_| socket.prepare_reset())?;
    let info = socket.info();
    let direct = if asks_direct {
        quota.issue_direct()
    } else {
        None
    };
    // A direct connection's relay, not the sinks' writer, moves its bytes.
    let (connection, handle, to_socket) = if direct.is_some() {
        capabilities(socket, ticket)
    } else {
        open(socket, ticket)
    };
    if let Some(tied) = tied {
        tied.add_connection(&connection);
    }
    let mut results = results.get();
    match direct {
        Some((direct_ticket, claim)) => {
            connection.direct.set(Direct::Offered);
            *connection.from_socket.borrow_mut() = Some(from_socket);
            let relay = spawn_local(relay_direct(Rc::clone(&connection), claim, quota.clone()));
            connection.track(relay.abort_handle());
            results.set_direct_ticket(&direct_ticket);
        }
        None => start_reading(&connection, from_socket, quota),
    }
    results.set_connection(handle);
    results.set_to_socket(to_socket);
    wire::port_info_to_wire(&info, results.init_info());
    Ok(())
}

/// A direct connection's relay: waits for its channel, then moves both
/// directions kernel to kernel, and says on the sinks how each ended.
async fn relay_direct(connection: Rc<Connection>, claim: Claim, quota: PortQuota) {
    let claimed = tokio::select! {
        // A decline seen in the same poll as a claim wins: its write may
        // have been queued (and answered) already.
        biased;
        () = connection.declined.notified() => {
            // The sinks carry the bytes from here (the write that declined
            // is queued already).
            let writer = spawn_local(write_queue(Rc::clone(&connection)));
            connection.track(writer.abort_handle());
            let from_socket = connection.from_socket.borrow_mut().take();
            if let Some(from_socket) = from_socket {
                start_reading(&connection, from_socket, &quota);
            }
            return;
        }
        channel = claim.channel() => channel,
    };
    let Some(channel) = claimed else {
        connection.reset(&format!(
            "its direct channel was not opened within {} s",
            DIRECT_CLAIM_WITHIN.as_secs()
        ));
        return;
    };
    let channel = Rc::new(channel);
    let Some(socket) = connection.socket() else {
        channel.prepare_reset();
        return;
    };
    connection.direct.set(Direct::Claimed);
    // Tells the client its channel is the connection's (a channel that
    // reached a server that did not grant it is closed unanswered).
    if let Err(error) = channel.write_all(&[CHANNEL_CLAIMED]).await {
        connection.reset(&channel_failed(&error));
        return;
    }
    *connection.channel.borrow_mut() = Some(Rc::clone(&channel));
    futures::join!(
        relay_to_socket(&connection, &channel, &socket),
        relay_from_socket(&connection, &socket, &channel),
    );
}

/// Moves one direction of a direct connection to its end of file; false
/// (the connection reset, saying why in the words given) if it failed.
async fn pumped(
    connection: &Connection,
    from: &Socket,
    to: &Socket,
    reading: fn(&io::Error) -> String,
    writing: fn(&io::Error) -> String,
) -> bool {
    let reason = match crate::ports::pump(from, to).await {
        Ok(_) => return true,
        Err(PumpError::Reading(error)) => reading(&error),
        Err(PumpError::Writing(error)) => writing(&error),
        Err(PumpError::Pipe(error)) => no_pipe(&error),
    };
    connection.reset(&reason);
    false
}

/// Client to socket: the channel's end of file is the client's end once
/// `end` has come too (a failure or a release resets instead).
async fn relay_to_socket(connection: &Rc<Connection>, channel: &Socket, socket: &Socket) {
    let writing = |error: &io::Error| socket_failure("writing to the connection", error).message;
    if !pumped(connection, channel, socket, channel_failed, writing).await {
        return;
    }
    loop {
        let next = connection.queue.borrow_mut().pop_front();
        match next {
            Some(Queued::End(done)) => {
                let result = socket.shutdown_write().map_err(|error| {
                    socket_failure("shutting the connection down for writing", &error)
                });
                match result {
                    Ok(()) => {
                        connection.to_ended.set(true);
                        let _ = done.send(Ok(()));
                        connection.close_if_done();
                    }
                    Err(refusal) => {
                        let _ = done.send(Err(refusal.clone()));
                        connection.reset(&refusal.message);
                    }
                }
                return;
            }
            // Refused when they came (`ToSocket::queue_write`).
            Some(Queued::Write(_, done)) => {
                let _ = done.send(Err(Refusal::new(
                    RefusalKind::InvalidArgument,
                    "a write on a direct connection",
                )));
            }
            None => connection.queue_changed.notified().await,
        }
    }
}

/// Socket to client: the peer's end of file is passed on as the
/// channel's, then `end` on the client's sink.
async fn relay_from_socket(connection: &Rc<Connection>, socket: &Socket, channel: &Socket) {
    if !pumped(connection, socket, channel, reading_failure, channel_failed).await {
        return;
    }
    if let Err(error) = channel.shutdown_write() {
        connection.reset(&channel_failed(&error));
        return;
    }
    let Some(sink) = connection.from_socket.borrow().clone() else {
        return;
    };
    match sink.end_request().send().promise.await {
        Ok(_) => {
            connection.from_ended.set(true);
            connection.from_socket.borrow_mut().take();
            connection.close_if_done();
        }
        Err(error) => connection.reset(&format!(
            "the client's end of the connection failed: {}",
            wire::describe(&error)
        )),
    }
}

fn text_param(text: capnp::Result<capnp::text::Reader<'_>>) -> Result<String, Refusal> {
    let text = text.map_err(|error| {
        Refusal::new(
            RefusalKind::InvalidArgument,
            format!("a malformed address: {error}"),
        )
    })?;
    text.to_str().map(str::to_string).map_err(|_| {
        Refusal::new(
            RefusalKind::InvalidArgument,
            "the address is not valid UTF-8",
        )
    })
}

/// A listening socket's accept loop and the connections it accepted.
struct Listener {
    accepting: AbortHandle,
    accepted: Rc<RefCell<Vec<Weak<Connection>>>>,
}

impl Listener {
    /// Stops listening (the loop owns the socket) and resets every
    /// accepted connection still open.
    fn close(&self, reason: &str) {
        self.accepting.abort();
        for connection in self.accepted.borrow_mut().drain(..) {
            if let Some(connection) = connection.upgrade() {
                connection.reset(reason);
            }
        }
    }
}

/// `PortListener`: holding it keeps the socket listening.
struct ListenerHandle {
    listener: Rc<Listener>,
    _ticket: PortTicket,
}

impl port_listener::Server for ListenerHandle {}

impl Drop for ListenerHandle {
    fn drop(&mut self) {
        self.listener.close("the listener was released");
    }
}

/// `Executor.listen` on this machine under `rules`, or `Process.listen`
/// with the process's capability's forwards as `tie`.
pub(crate) async fn listen(
    rules: &PortRules,
    quota: &PortQuota,
    params: ListenParams,
    mut results: ListenResults,
    tie: Option<Weak<Tied>>,
) -> Result<(), Error> {
    let params = params.get()?;
    let asked = text_param(params.get_address())?;
    let acceptor = params.get_acceptor()?;
    let address = port_address(&asked, PortUse::Listen)?;
    tied_to(tie.as_ref())?;
    let ticket = quota.take_listener()?;
    let listening = crate::ports::listen(&address, &asked, rules).await?;
    // Dropped (a Unix socket's file removed) if the process went meanwhile.
    let tied = tied_to(tie.as_ref())?;
    let bound = listening.address().to_string();
    let accepted = Rc::new(RefCell::new(Vec::new()));
    let accepting = spawn_local(accept_loop(
        listening,
        acceptor,
        quota.clone(),
        Rc::clone(&accepted),
    ))
    .abort_handle();
    let listener = Rc::new(Listener {
        accepting,
        accepted,
    });
    if let Some(tied) = tied {
        tied.add_listener(&listener);
    }
    let mut results = results.get();
    results.set_listener(capnp_rpc::new_client(ListenerHandle {
        listener,
        _ticket: ticket,
    }));
    results.set_address(bound.as_str());
    Ok(())
}

async fn accept_loop(
    listening: Listening,
    acceptor: port_acceptor::Client,
    quota: PortQuota,
    accepted: Rc<RefCell<Vec<Weak<Connection>>>>,
) {
    let pending = std::sync::Arc::new(Semaphore::new(MAX_PENDING_ACCEPTS));
    loop {
        // Until there is room, connections wait in the kernel's backlog.
        let Ok(slot) = std::sync::Arc::clone(&pending).acquire_owned().await else {
            return;
        };
        // Until the connection may hold one more, connections wait in the
        // kernel's backlog; a listener that waits holds no place itself.
        quota.wait_for_room().await;
        let (socket, info) = match listening.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of descriptors, or a connection that died in the
                // backlog: the listener goes on, a moment later.
                tracing::warn!(
                    "accepting on {}: {}",
                    listening.address(),
                    io_message(&error)
                );
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        // Taken by a dial meanwhile: this one waits for the next place.
        let ticket = quota.wait_for_stream().await;
        let (connection, handle, to_socket) = open(socket, ticket);
        {
            let mut list = accepted.borrow_mut();
            list.retain(|weak| weak.strong_count() > 0);
            list.push(Rc::downgrade(&connection));
        }
        let mut request = acceptor.accept_request();
        {
            let mut params = request.get();
            params.set_connection(handle);
            params.set_to_socket(to_socket);
            wire::port_info_to_wire(&info, params.init_info());
        }
        let answer = request.send().promise;
        let quota = quota.clone();
        spawn_local(async move {
            let result = answer
                .await
                .and_then(|response| response.get()?.get_from_socket());
            drop(slot);
            match result {
                Ok(from_socket) => start_reading(&connection, from_socket, &quota),
                Err(error) => connection.reset(&format!(
                    "the acceptor refused the connection: {}",
                    wire::describe(&error)
                )),
            }
        });
    }
}
