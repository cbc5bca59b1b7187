//! A bound on what a peer may make this side hold.
//!
//! capnp-rpc reads and dispatches every message as it arrives and keeps no
//! limit of its own: a peer could announce huge frames, ask questions it
//! never finishes (each answer stays in capnp-rpc's tables until the
//! peer's `Finish`), or let answers pile up unread in the write queue. The
//! guard sits between capnp-rpc and the socket:
//!
//! - it reads frames itself ([`FrameReader`]): each header is checked
//!   against the connection's message limit before the body is read, and
//!   the body's memory grows with the bytes that arrive;
//! - it keeps a ledger of the peer's questions (calls and bootstraps) from
//!   their arrival until their `Finish`: parameters count until the
//!   answer, the answer's size from then on, and until it has been
//!   written; so do other replies queued for the peer (`unimplemented`
//!   echoes, releases) until they are written;
//! - before login (TCP), limits are small ([`LOGIN_MESSAGE_BYTES`], a few
//!   questions); a message over them waits while a login is being
//!   answered, so an honest client's calls pipelined on its login go on.
//!
//! Past a limit the connection is closed with an `overloaded` error that
//! names it, which the peer receives as the reason ([`Session::close`]).
//! Honest clients stay far below: the client library keeps its own windows
//! and finishes its questions.

use std::cell::{Cell, RefCell};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::rc::Rc;
use std::time::Duration;

use capnp::capability::Promise;
use capnp::message::ReaderOptions;
use capnp::traits::HasTypeId;
use capnp_rpc::rpc_capnp::message;
use capnp_rpc::rpc_twoparty_capnp::Side;
use capnp_rpc::{Connection, IncomingMessage, OutgoingMessage, VatNetwork};
use futures::channel::oneshot;
use futures::future::Either;

use crate::net::frame::{Frame, FrameReader};
use crate::net::session::Session;

/// How much a peer may have outstanding on one connection once it has
/// logged in (or on a connection that needs no login).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallLimits {
    /// Questions received and not yet finished.
    pub max_calls: usize,
    /// What they hold, in bytes: parameters until the answer, then the
    /// answer until it is finished and written; with replies not yet
    /// written.
    pub max_bytes: usize,
}

impl CallLimits {
    /// No bound: for the client side of a connection, whose peer is the
    /// server the user chose, and whose "calls" are that server's pushes of
    /// output, held open by the client's own flow control.
    pub fn unlimited() -> CallLimits {
        CallLimits {
            max_calls: usize::MAX,
            max_bytes: usize::MAX,
        }
    }
}

impl Default for CallLimits {
    fn default() -> Self {
        CallLimits {
            max_calls: 8192,
            max_bytes: 64 << 20,
        }
    }
}

/// Largest message accepted from a peer (in 8-byte words) once logged in:
/// far above any legitimate message (a full `read` result is a few MiB)
/// and far below capnp's 64 MiB default.
pub(crate) const RECEIVE_LIMIT_WORDS: usize = 2 << 20;

/// Largest message accepted before login: a login with a token of a few
/// hundred bytes fits many times over.
pub(crate) const LOGIN_MESSAGE_BYTES: usize = 4096;

/// Questions a peer may have outstanding before login: its bootstrap, its
/// login and a few calls pipelined on them.
pub(crate) const LOGIN_QUESTIONS: usize = 8;

/// What a peer's questions and unread replies may hold before login.
pub(crate) const LOGIN_HELD_BYTES: usize = 64 * 1024;

/// Staging buffer of the frame reader: small while a peer has not logged
/// in, the size of a big read once it has.
const STAGING_BEFORE_LOGIN: usize = 4096;
const STAGING_AFTER_LOGIN: usize = 64 * 1024;

/// How long a closing connection may take to hand the peer what is queued
/// for it (its goodbye included); a peer that does not read is then cut
/// off, so it cannot keep a closed connection's memory.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// How long, and how much, a server reads (and drops) of what a peer
/// still sends after the connection's goodbye was written: closing a
/// socket with unread input resets the connection, and a reset can destroy
/// the goodbye before the peer reads it. An honest peer has little on its
/// way by then; a flood is not worth the server's time.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 256 * 1024;

/// `Process.write`'s ordinal in the schema.
const WRITE_METHOD: u16 = 1;
/// `Gatekeeper.login`'s ordinal.
const LOGIN_METHOD: u16 = 0;

/// What a received call holds while it is outstanding. A stdin write's
/// data goes into the process's own stdin queue (bounded per process) as
/// the call is dispatched, copied or as a slice of its frame that holds at
/// most twice the data (`rpc/process.rs`), so only the rest of it counts
/// here.
fn payload_bytes(
    call: &capnp_rpc::rpc_capnp::call::Reader<'_>,
    body: capnp::any_pointer::Reader<'_>,
) -> capnp::Result<usize> {
    let is_write = call.get_interface_id()
        == <crate::capexec_capnp::process::Client as HasTypeId>::TYPE_ID
        && call.get_method_id() == WRITE_METHOD;
    if is_write {
        return Ok(0);
    }
    Ok(body.target_size()?.word_count as usize * 8)
}

fn is_login(call: &capnp_rpc::rpc_capnp::call::Reader<'_>) -> bool {
    call.get_interface_id() == <crate::capexec_capnp::gatekeeper::Client as HasTypeId>::TYPE_ID
        && call.get_method_id() == LOGIN_METHOD
}

/// One of the peer's questions.
struct Question {
    /// Its parameters until it is answered, then its answer.
    bytes: usize,
    /// Where its answer ends in the stream of bytes sent, once answered.
    answered_at: Option<u64>,
    /// A login not yet answered.
    login: bool,
}

/// What a message being sent is, for the ledger.
enum Sent {
    /// Our own question (an event push), bounded by flow control.
    Call,
    /// The answer to the peer's question.
    Return(u32),
    /// Anything else (an `unimplemented` echo, a release, a goodbye).
    Other,
}

struct Ledger {
    limits: CallLimits,
    questions: HashMap<u32, Question>,
    /// Everything counted, in bytes.
    bytes: usize,
    /// Replies that count until they are written: where each ends in the
    /// stream of bytes sent, and its size.
    unwritten: BinaryHeap<Reverse<(u64, usize)>>,
    logins_in_flight: usize,
    /// The most questions and bytes seen at once, logged at the end (what
    /// a peer's sessions need, for whoever tunes the limits).
    peak: (usize, usize),
}

impl Drop for Ledger {
    fn drop(&mut self) {
        let (questions, bytes) = self.peak;
        tracing::debug!(
            peak_questions = questions,
            peak_bytes = bytes,
            "the most the peer had outstanding at once"
        );
    }
}

impl Ledger {
    fn new(limits: CallLimits) -> Ledger {
        Ledger {
            limits,
            questions: HashMap::new(),
            bytes: 0,
            unwritten: BinaryHeap::new(),
            logins_in_flight: 0,
            peak: (0, 0),
        }
    }

    /// Counts what `incoming` asks for, or finishes. Returns whether a
    /// login was finished before it was answered.
    fn received(
        &mut self,
        incoming: &dyn IncomingMessage,
        before_login: bool,
        written: u64,
    ) -> capnp::Result<bool> {
        let body = incoming.get_body()?;
        let (id, question) = match body.get_as::<message::Reader>()?.which() {
            Ok(message::Call(call)) => {
                let call = call?;
                let question = Question {
                    bytes: payload_bytes(&call, body)?,
                    answered_at: None,
                    login: before_login && is_login(&call),
                };
                (call.get_question_id(), question)
            }
            Ok(message::Bootstrap(bootstrap)) => {
                let question = Question {
                    bytes: 0,
                    answered_at: None,
                    login: false,
                };
                (bootstrap?.get_question_id(), question)
            }
            Ok(message::Finish(finish)) => {
                return Ok(self.finished(finish?.get_question_id(), written));
            }
            // Other messages, and kinds this version does not know (which
            // capnp-rpc answers as unimplemented), are not questions.
            Ok(_) | Err(capnp::NotInSchema(_)) => return Ok(false),
        };
        self.bytes += question.bytes;
        self.logins_in_flight += usize::from(question.login);
        // A question id still in use is a protocol error, which capnp-rpc
        // reports; keep the count exact until it does.
        if let Some(previous) = self.questions.insert(id, question) {
            self.forget(previous);
        }
        Ok(false)
    }

    fn finished(&mut self, id: u32, written: u64) -> bool {
        let Some(question) = self.questions.remove(&id) else {
            return false;
        };
        match question.answered_at {
            // capnp-rpc forgets it now, but the answer is still queued.
            Some(end) if end > written => {
                self.unwritten.push(Reverse((end, question.bytes)));
                false
            }
            _ => self.forget(question),
        }
    }

    /// Returns whether it was a login in flight.
    fn forget(&mut self, question: Question) -> bool {
        self.bytes -= question.bytes;
        let login = question.login && question.answered_at.is_none();
        self.logins_in_flight -= usize::from(login);
        login
    }

    /// Counts a message of `size` bytes that ends at `end` in the stream
    /// of bytes sent. Returns whether it answered a login.
    fn sent(&mut self, sent: Sent, size: usize, end: u64) -> bool {
        match sent {
            Sent::Call => false,
            Sent::Return(id) => match self.questions.get_mut(&id) {
                Some(question) if question.answered_at.is_none() => {
                    self.bytes = self.bytes - question.bytes + size;
                    question.bytes = size;
                    question.answered_at = Some(end);
                    let login = std::mem::take(&mut question.login);
                    self.logins_in_flight -= usize::from(login);
                    login
                }
                _ => self.sent(Sent::Other, size, end),
            },
            Sent::Other => {
                self.unwritten.push(Reverse((end, size)));
                self.bytes += size;
                false
            }
        }
    }

    /// Lets go of replies written by now (`written` bytes in all).
    fn sweep(&mut self, written: u64) {
        while let Some(Reverse((end, size))) = self.unwritten.peek().copied() {
            if end > written {
                break;
            }
            self.unwritten.pop();
            self.bytes -= size;
        }
    }

    /// The limit exceeded, if one is.
    fn exceeded(&mut self, logged_in: bool, written: u64) -> Option<capnp::Error> {
        self.sweep(written);
        self.peak = (
            self.peak.0.max(self.questions.len()),
            self.peak.1.max(self.bytes),
        );
        if logged_in {
            if self.questions.len() > self.limits.max_calls {
                crate::metrics::limit_hit("calls");
                return Some(capnp::Error::overloaded(format!(
                    "more than {} calls outstanding on one connection; closing it",
                    self.limits.max_calls
                )));
            }
            if self.bytes > self.limits.max_bytes {
                crate::metrics::limit_hit("call-memory");
                return Some(capnp::Error::overloaded(format!(
                    "calls and answers not yet finished on one connection hold more than {} \
                     MiB; closing it",
                    self.limits.max_bytes >> 20
                )));
            }
        } else {
            if self.questions.len() > LOGIN_QUESTIONS {
                crate::metrics::limit_hit("login-calls");
                return Some(capnp::Error::overloaded(format!(
                    "more than {LOGIN_QUESTIONS} questions outstanding before login; closing the \
                     connection"
                )));
            }
            if self.bytes > LOGIN_HELD_BYTES {
                crate::metrics::limit_hit("login-memory");
                return Some(capnp::Error::overloaded(format!(
                    "questions and unread answers before login hold more than {} KiB; closing \
                     the connection",
                    LOGIN_HELD_BYTES >> 10
                )));
            }
        }
        None
    }
}

/// Logs why a connection is closed: a warning once the peer has logged in
/// (a client of the server's hits a limit: worth an operator's look),
/// quieter before (anyone can make that happen, as often as they like).
fn closing(session: &Session, error: &capnp::Error) {
    if session.is_logged_in() {
        tracing::warn!(%error, "closing the connection");
    } else {
        tracing::info!(%error, "closing the connection");
    }
}

/// The state every half of a guarded connection shares.
struct Guard {
    /// `None` for the client side: its peer is the server the user chose.
    ledger: Option<RefCell<Ledger>>,
    session: Rc<Session>,
    /// Bytes handed to the write queue so far.
    queued: Cell<u64>,
    /// Bytes the write queue has written so far (counted by its writer).
    written: Rc<Cell<u64>>,
    shutdown_started: RefCell<Option<oneshot::Sender<()>>>,
}

impl Guard {
    fn waiting_for_login(&self) -> bool {
        !self.session.is_logged_in()
            && self
                .ledger
                .as_ref()
                .is_some_and(|ledger| ledger.borrow().logins_in_flight > 0)
    }

    /// The largest message accepted now, in bytes, and how to read it.
    fn message_limit(&self) -> (usize, ReaderOptions) {
        let words = if self.session.is_logged_in() {
            RECEIVE_LIMIT_WORDS
        } else {
            LOGIN_MESSAGE_BYTES / 8
        };
        let mut options = ReaderOptions::new();
        options.traversal_limit_in_words(Some(words));
        (words * 8, options)
    }

    fn sending(&self, outgoing: &dyn OutgoingMessage) -> Option<Sent> {
        self.ledger.as_ref()?;
        let which = outgoing
            .get_body_as_reader()
            .and_then(|body| body.get_as::<message::Reader>())
            .ok()
            .map(|message| match message.which() {
                Ok(message::Call(_)) => Sent::Call,
                Ok(message::Return(Ok(answer))) => Sent::Return(answer.get_answer_id()),
                _ => Sent::Other,
            });
        Some(which.unwrap_or(Sent::Other))
    }

    fn sent(
        &self,
        sent: Option<Sent>,
        message: &capnp::message::Builder<capnp_rpc::MessageAllocator>,
    ) {
        let (Some(sent), Some(ledger)) = (sent, &self.ledger) else {
            return;
        };
        let segments = message.get_segments_for_output();
        let table = (4 * (segments.len() + 1)).next_multiple_of(8);
        let size = table + segments.iter().map(|segment| segment.len()).sum::<usize>();
        let end = self.queued.get() + size as u64;
        self.queued.set(end);
        let mut ledger = ledger.borrow_mut();
        if ledger.sent(sent, size, end) {
            self.session.changed();
        }
        if let Some(error) = ledger.exceeded(self.session.is_logged_in(), self.written.get()) {
            drop(ledger);
            // Once is enough: answers still on their way exceed it too.
            if self.session.close_reason().is_none() {
                closing(&self.session, &error);
                self.session.close(error);
            }
        }
    }
}

/// The reading half: the frame reader, taken by the receive under way.
struct Receiver<R> {
    frames: RefCell<Option<FrameReader<R>>>,
    guard: Rc<Guard>,
}

impl<R: tokio::io::AsyncRead + Unpin + 'static> Receiver<R> {
    /// On the server side, once everything was written (the write half is
    /// shut down with the write queue), drops the peer's input until it
    /// closes its end, for at most [`LINGER`] and [`LINGER_BYTES`].
    async fn linger(&self) {
        if self.guard.ledger.is_none() {
            return;
        }
        let Some(mut frames) = self.frames.borrow_mut().take() else {
            return;
        };
        let _ = tokio::time::timeout(LINGER, frames.discard_input(LINGER_BYTES)).await;
    }

    async fn receive(self: Rc<Self>) -> capnp::Result<Option<Box<dyn IncomingMessage>>> {
        let Some(mut frames) = self.frames.borrow_mut().take() else {
            return Err(capnp::Error::failed(
                "a second receive while one is under way".into(),
            ));
        };
        let received = {
            let closing = std::pin::pin!(self.guard.session.closing());
            let receiving = std::pin::pin!(self.receive_from(&mut frames));
            match futures::future::select(closing, receiving).await {
                Either::Left((reason, _)) => Err(reason),
                Either::Right((received, _)) => received,
            }
        };
        *self.frames.borrow_mut() = Some(frames);
        received
    }

    async fn receive_from(
        &self,
        frames: &mut FrameReader<R>,
    ) -> capnp::Result<Option<Box<dyn IncomingMessage>>> {
        let guard = &self.guard;
        let session = &guard.session;
        let staging = if session.is_logged_in() {
            STAGING_AFTER_LOGIN
        } else {
            STAGING_BEFORE_LOGIN
        };
        let Some(header) = frames.read_header(staging).await? else {
            return Ok(None);
        };
        let options = loop {
            let (limit, options) = guard.message_limit();
            if header.body_bytes() <= limit {
                break options;
            }
            if guard.waiting_for_login() {
                session.next_change().await;
                continue;
            }
            let when = if session.is_logged_in() {
                ""
            } else {
                " before login"
            };
            return Err(capnp::Error::overloaded(format!(
                "a message of {} bytes exceeds the limit of {limit} bytes per message{when}; \
                 closing the connection",
                header.body_bytes()
            )));
        };
        let frame: Frame = frames.read_body(header, options).await?;
        let Some(ledger) = &guard.ledger else {
            return Ok(Some(Box::new(frame)));
        };
        let written = guard.written.get();
        let finished_a_login =
            ledger
                .borrow_mut()
                .received(&frame, !session.is_logged_in(), written)?;
        if finished_a_login {
            session.changed();
        }
        loop {
            let exceeded = ledger
                .borrow_mut()
                .exceeded(session.is_logged_in(), guard.written.get());
            match exceeded {
                None => return Ok(Some(Box::new(frame))),
                // Calls pipelined on a login wait for its answer.
                Some(_) if guard.waiting_for_login() => session.next_change().await,
                Some(error) => {
                    closing(session, &error);
                    return Err(error);
                }
            }
        }
    }
}

/// A two-party network whose input the guard reads and whose output it
/// watches. capnp-rpc's own `twoparty` network still writes (its queue,
/// its stream flow control) and is given an input it never reads.
pub(crate) struct GuardedNetwork<R> {
    inner: capnp_rpc::twoparty::VatNetwork<futures::io::Empty>,
    receiver: Rc<Receiver<R>>,
    shutdown_started: Option<oneshot::Receiver<()>>,
}

impl<R> GuardedNetwork<R> {
    pub(crate) fn new(
        inner: capnp_rpc::twoparty::VatNetwork<futures::io::Empty>,
        frames: FrameReader<R>,
        written: Rc<Cell<u64>>,
        limits: CallLimits,
        session: Rc<Session>,
    ) -> GuardedNetwork<R> {
        let (started, shutdown_started) = oneshot::channel();
        let guard = Guard {
            ledger: (limits != CallLimits::unlimited()).then(|| RefCell::new(Ledger::new(limits))),
            session,
            queued: Cell::new(0),
            written,
            shutdown_started: RefCell::new(Some(started)),
        };
        GuardedNetwork {
            inner,
            receiver: Rc::new(Receiver {
                frames: RefCell::new(Some(frames)),
                guard: Rc::new(guard),
            }),
            shutdown_started: Some(shutdown_started),
        }
    }

    fn guarded(&self, inner: Box<dyn Connection<Side>>) -> Box<dyn Connection<Side>>
    where
        R: tokio::io::AsyncRead + Unpin + 'static,
    {
        Box::new(GuardedConnection {
            inner,
            receiver: Rc::clone(&self.receiver),
        })
    }
}

impl<R: tokio::io::AsyncRead + Unpin + 'static> VatNetwork<Side> for GuardedNetwork<R> {
    fn connect(&mut self, host_id: Side) -> Option<Box<dyn Connection<Side>>> {
        let inner = self.inner.connect(host_id)?;
        Some(self.guarded(inner))
    }

    fn accept(&mut self) -> Promise<Box<dyn Connection<Side>>, capnp::Error> {
        let accepted = self.inner.accept();
        let receiver = Rc::clone(&self.receiver);
        Promise::from_future(async move {
            let inner = accepted.await?;
            Ok(Box::new(GuardedConnection { inner, receiver }) as Box<dyn Connection<Side>>)
        })
    }

    fn drive_until_shutdown(&mut self) -> Promise<(), capnp::Error> {
        let driving = self.inner.drive_until_shutdown();
        let started = self.shutdown_started.take();
        let receiver = Rc::clone(&self.receiver);
        Promise::from_future(async move {
            let cut_off = async move {
                let started = match started {
                    Some(started) => started.await.is_ok(),
                    None => false,
                };
                if !started {
                    // Dropped with the connection: nothing to cut off.
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(SHUTDOWN_GRACE).await;
            };
            match futures::future::select(driving, std::pin::pin!(cut_off)).await {
                Either::Left((driven, _)) => {
                    receiver.linger().await;
                    driven
                }
                Either::Right(((), _)) => {
                    tracing::info!(
                        "the peer read nothing for {}s after the connection was closed; \
                         dropping what was queued for it",
                        SHUTDOWN_GRACE.as_secs()
                    );
                    Ok(())
                }
            }
        })
    }
}

struct GuardedConnection<R> {
    inner: Box<dyn Connection<Side>>,
    receiver: Rc<Receiver<R>>,
}

impl<R: tokio::io::AsyncRead + Unpin + 'static> Connection<Side> for GuardedConnection<R> {
    fn get_peer_vat_id(&self) -> Side {
        self.inner.get_peer_vat_id()
    }

    fn new_outgoing_message(&mut self, first_segment_word_size: u32) -> Box<dyn OutgoingMessage> {
        Box::new(GuardedOutgoing {
            inner: self.inner.new_outgoing_message(first_segment_word_size),
            guard: Rc::clone(&self.receiver.guard),
        })
    }

    fn receive_incoming_message(
        &mut self,
    ) -> Promise<Option<Box<dyn IncomingMessage>>, capnp::Error> {
        Promise::from_future(Rc::clone(&self.receiver).receive())
    }

    fn new_stream(
        &mut self,
    ) -> (
        Box<dyn capnp_rpc::FlowController>,
        Promise<(), capnp::Error>,
    ) {
        self.inner.new_stream()
    }

    fn shutdown(&mut self, result: capnp::Result<()>) -> Promise<(), capnp::Error> {
        if let Some(started) = self.receiver.guard.shutdown_started.borrow_mut().take() {
            let _ = started.send(());
        }
        self.inner.shutdown(result)
    }
}

struct GuardedOutgoing {
    inner: Box<dyn OutgoingMessage>,
    guard: Rc<Guard>,
}

impl OutgoingMessage for GuardedOutgoing {
    fn get_body(&mut self) -> capnp::Result<capnp::any_pointer::Builder<'_>> {
        self.inner.get_body()
    }

    fn get_body_as_reader(&self) -> capnp::Result<capnp::any_pointer::Reader<'_>> {
        self.inner.get_body_as_reader()
    }

    fn send(
        self: Box<Self>,
    ) -> (
        Promise<(), capnp::Error>,
        Rc<capnp::message::Builder<capnp_rpc::MessageAllocator>>,
    ) {
        let sent = self.guard.sending(self.inner.as_ref());
        let (promise, message) = self.inner.send();
        self.guard.sent(sent, &message);
        (promise, message)
    }

    fn take(self: Box<Self>) -> capnp::message::Builder<capnp_rpc::MessageAllocator> {
        self.inner.take()
    }

    fn size_in_words(&self) -> usize {
        self.inner.size_in_words()
    }
}
