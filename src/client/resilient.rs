//! A process handle that survives broken connections.
//!
//! [`ResilientProcess`] makes its process detachable, and when the way to it
//! breaks (the connection, or a link of a chain) it reconnects with back-off
//! within the grace period, restores the process with its token and carries
//! on where it was: calls made meanwhile wait for the recovery; event
//! streams resume after the last event they delivered (every event exactly
//! once, or an explicit [`Error::OutputLost`] if the server no longer has
//! what was missed), while `read` takes `after_seq` from the caller and
//! reports evicted events as a `gap`, as a plain read does; and stdin
//! writes in flight are sent again, in order, with their write ids, so
//! each is applied exactly once.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::rc::Rc;
//! use std::time::Duration;
//! use capexec::client::{Command, Connect, ResilientProcess, Session};
//! use capexec::net::{self, Address};
//!
//! let address: Address = "unix:/run/capexec.sock".parse()?;
//! let connect: Connect = Rc::new(move || {
//!     let address = address.clone();
//!     Box::pin(async move {
//!         let connection = net::connect(&address, None)
//!             .await
//!             .map_err(|e| capexec::client::Error::Connect(e.to_string()))?;
//!         Ok(Session::new(connection.executor(), Some(Box::new(connection))))
//!     })
//! });
//! let (process, started) =
//!     ResilientProcess::spawn(&Command::new("make"), connect, Duration::from_secs(60)).await?;
//! started.await?;
//! let mut events = process.events(0);
//! while let Some(batch) = events.next_batch().await {
//!     println!("{:?}", batch?);
//! }
//! # Ok(())
//! # }
//! ```

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::rc::{Rc, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use futures::future::{LocalBoxFuture, Shared};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::capexec_capnp::executor;
use crate::client::{Command, Error, EventStream, PendingWrite, RemoteProcess, restore};
use crate::model::{Event, EventBody, ProcessSnapshot, PtySize, ReadOutcome, Signal, WriteStatus};

/// An executor, and whatever must stay alive for it to work (typically the
/// `net::Connection` it came from).
pub struct Session {
    executor: executor::Client,
    _keep_alive: Option<Box<dyn Any>>,
}

impl Session {
    pub fn new(executor: executor::Client, keep_alive: Option<Box<dyn Any>>) -> Session {
        Session {
            executor,
            _keep_alive: keep_alive,
        }
    }

    pub fn executor(&self) -> &executor::Client {
        &self.executor
    }
}

/// Makes a fresh [`Session`] with the executor the process was started on
/// (a new connection each time). Failures that are worth retrying should be
/// [`Error::Connect`].
pub type Connect = Rc<dyn Fn() -> LocalBoxFuture<'static, Result<Session, Error>>>;

/// What a recovery is doing, for people watching.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecoveryNote {
    /// The way to the process broke; reconnecting for up to the grace.
    Lost { cause: String, grace: Duration },
    /// The process is back; everything carries on.
    Restored,
    /// Recovery gave up.
    Failed { reason: String },
}

/// How long to wait for the call that asks why an event stream ended.
const PROBE_WAIT: Duration = Duration::from_secs(5);
/// Shortest and longest wait between recovery attempts.
const FIRST_RETRY: Duration = Duration::from_millis(50);
const MAX_RETRY: Duration = Duration::from_secs(1);
/// Most stdin calls that may wait for an answer at once. The server
/// remembers the last 4096 write ids of a process, so every call that is
/// sent again after a recovery is still recognised as a repeat.
pub const MAX_UNANSWERED_WRITES: usize = 1024;

type Recovery = Shared<LocalBoxFuture<'static, Result<(), String>>>;
type Observer = Box<dyn Fn(&RecoveryNote)>;

/// A handle on a process that survives broken connections (see the module
/// documentation). Clones share the process.
///
/// Dropping the last clone releases the process the way a broken
/// connection would: the server keeps it for its grace period (restorable
/// with [`ResilientProcess::token`]) and only then terminates it. To end it
/// now, call [`ResilientProcess::terminate`] first.
#[derive(Clone)]
pub struct ResilientProcess {
    inner: Rc<Inner>,
}

struct Inner {
    current: RefCell<Attached>,
    resume: Option<Resume>,
    recovery: RefCell<Option<Recovery>>,
    /// Why recovery gave up, after which every call fails with it.
    failed: RefCell<Option<String>>,
    outbox: RefCell<VecDeque<Outgoing>>,
    /// Why stdin refuses every further call: one was refused, and sending
    /// later ones would leave a hole in the child's input.
    stdin_refused: RefCell<Option<String>>,
    driver: Cell<bool>,
    observer: RefCell<Option<Observer>>,
}

struct Attached {
    process: RemoteProcess,
    _session: Option<Session>,
    /// Counts restores; calls note it to tell whether a recovery already
    /// happened since they failed.
    epoch: u64,
}

struct Resume {
    connect: Connect,
    grace: Duration,
    token: RefCell<Option<String>>,
}

/// A stdin write or end-of-file, kept until the server has answered it.
struct Outgoing {
    kind: OutgoingKind,
    reply: Option<oneshot::Sender<Result<WriteStatus, Error>>>,
    /// On which epoch's capability it was last sent (`None`: not yet).
    sent_on: Option<u64>,
    /// That call's answer, until the outbox driver takes it to wait on.
    answer: Option<JoinHandle<Result<WriteStatus, Error>>>,
}

enum OutgoingKind {
    Write { data: Bytes, write_id: String },
    CloseStdin,
}

impl ResilientProcess {
    /// Starts `command` on a session from `connect` and makes it detachable
    /// for `grace`, all pipelined: the handle is usable at once, and the
    /// future says whether the start (and the detach) worked.
    pub async fn spawn(
        command: &Command,
        connect: Connect,
        grace: Duration,
    ) -> Result<
        (
            ResilientProcess,
            impl Future<Output = Result<(), Error>> + 'static + use<>,
        ),
        Error,
    > {
        let session = connect().await?;
        Ok(ResilientProcess::spawn_on(
            command,
            session,
            Some((connect, grace)),
        ))
    }

    /// Starts `command` on `session`, recovering through `resume` (a way to
    /// reconnect, and the grace) if given; without it this is a plain
    /// handle whose calls fail when the connection does. Must be called
    /// inside a `tokio::task::LocalSet`, like everything on capnp clients.
    pub fn spawn_on(
        command: &Command,
        session: Session,
        resume: Option<(Connect, Duration)>,
    ) -> (
        ResilientProcess,
        impl Future<Output = Result<(), Error>> + 'static + use<>,
    ) {
        let (process, started) = command.spawn_pipelined(session.executor());
        // Sent now, pipelined behind the start, so no output can be lost
        // to a break between the start and the detach.
        let detached = resume.as_ref().map(|(_, grace)| process.detachable(*grace));
        let handle = ResilientProcess {
            inner: Rc::new(Inner {
                current: RefCell::new(Attached {
                    process,
                    _session: Some(session),
                    epoch: 0,
                }),
                resume: resume.map(|(connect, grace)| Resume {
                    connect,
                    grace,
                    token: RefCell::new(None),
                }),
                recovery: RefCell::new(None),
                failed: RefCell::new(None),
                outbox: RefCell::new(VecDeque::new()),
                stdin_refused: RefCell::new(None),
                driver: Cell::new(false),
                observer: RefCell::new(None),
            }),
        };
        // The token is recorded as soon as it arrives, whether or not the
        // caller ever awaits `ready`: a recovery needs it.
        let recorded = detached.map(|detached| {
            let inner = Rc::downgrade(&handle.inner);
            tokio::task::spawn_local(async move {
                let token = detached.await?;
                if let Some(inner) = inner.upgrade()
                    && let Some(resume) = &inner.resume
                {
                    *resume.token.borrow_mut() = Some(token);
                }
                Ok::<(), Error>(())
            })
        });
        let ready = async move {
            started.await?;
            if let Some(recorded) = recorded {
                recorded.await??;
            }
            Ok(())
        };
        (handle, ready)
    }

    /// Calls `observer` as recoveries begin and end.
    pub fn on_recovery(&self, observer: impl Fn(&RecoveryNote) + 'static) {
        *self.inner.observer.borrow_mut() = Some(Box::new(observer));
    }

    /// The restore token, once the server has given it.
    pub fn token(&self) -> Option<String> {
        self.inner.resume.as_ref()?.token.borrow().clone()
    }

    /// Whether the way to the process is broken and being restored now.
    pub fn is_recovering(&self) -> bool {
        self.inner.recovery.borrow().is_some() || self.inner.failed.borrow().is_some()
    }

    /// How long the server keeps the process without a connection, if it
    /// was made detachable.
    pub fn grace(&self) -> Option<Duration> {
        self.inner.resume.as_ref().map(|resume| resume.grace)
    }

    /// The process capability in use now (it changes with every restore).
    pub fn current(&self) -> RemoteProcess {
        self.inner.current.borrow().process.clone()
    }

    fn attached(&self) -> Result<(RemoteProcess, u64), Error> {
        if let Some(reason) = self.inner.failed.borrow().as_ref() {
            return Err(Error::Recovery {
                reason: reason.clone(),
                cause: "the connection broke earlier".to_string(),
            });
        }
        let current = self.inner.current.borrow();
        Ok((current.process.clone(), current.epoch))
    }

    fn epoch(&self) -> u64 {
        self.inner.current.borrow().epoch
    }

    /// Runs `call` on the current capability, recovering and calling again
    /// as long as the failure is a broken connection.
    async fn retrying<T, F, Fut>(&self, call: F) -> Result<T, Error>
    where
        F: Fn(RemoteProcess) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        loop {
            let (process, epoch) = self.attached()?;
            match call(process).await {
                Err(error) if error.is_transport_loss() && self.inner.resume.is_some() => {
                    self.recover(epoch, &error).await?;
                }
                other => return other,
            }
        }
    }

    /// Recovers from a loss seen on `epoch` (at once if another call has
    /// recovered since). Concurrent callers share one recovery.
    async fn recover(&self, epoch: u64, cause: &Error) -> Result<(), Error> {
        if let Some(reason) = self.inner.failed.borrow().clone() {
            return Err(Error::Recovery {
                reason,
                cause: cause.to_string(),
            });
        }
        if self.epoch() != epoch {
            return Ok(());
        }
        let recovery = self.inner.recovery.borrow().clone();
        let recovery = match recovery {
            Some(recovery) => recovery,
            None => {
                let recovery = self.start_recovery(cause.loss_reason());
                *self.inner.recovery.borrow_mut() = Some(recovery.clone());
                recovery
            }
        };
        recovery.await.map_err(|reason| Error::Recovery {
            reason,
            cause: cause.to_string(),
        })
    }

    /// The recovery holds the handle weakly: it is stored in the handle,
    /// and a handle dropped during a recovery must still be freed.
    fn start_recovery(&self, cause: String) -> Recovery {
        let inner = Rc::downgrade(&self.inner);
        let plan = match &self.inner.resume {
            None => Err("recovery is not enabled".to_string()),
            Some(resume) => match resume.token.borrow().clone() {
                None => Err("the connection broke before the process was detachable".to_string()),
                Some(token) => Ok((Rc::clone(&resume.connect), token, resume.grace)),
            },
        };
        async move {
            let outcome = match plan {
                Ok((connect, token, grace)) => {
                    note(&inner, &RecoveryNote::Lost { cause, grace });
                    reattach(&connect, &token, grace).await
                }
                Err(reason) => Err(reason),
            };
            let Some(inner) = inner.upgrade() else {
                return Err("the process handle was dropped".to_string());
            };
            *inner.recovery.borrow_mut() = None;
            match outcome {
                Ok((process, session)) => {
                    {
                        let mut current = inner.current.borrow_mut();
                        current.process = process;
                        current._session = Some(session);
                        current.epoch += 1;
                    }
                    inner.note(&RecoveryNote::Restored);
                    Ok(())
                }
                Err(reason) => {
                    *inner.failed.borrow_mut() = Some(reason.clone());
                    inner.note(&RecoveryNote::Failed {
                        reason: reason.clone(),
                    });
                    Err(reason)
                }
            }
        }
        .boxed_local()
        .shared()
    }

    /// Events after `after_seq`; waits up to `wait` for the first one. A
    /// read made while the connection is broken waits for the recovery.
    pub async fn read(
        &self,
        after_seq: u64,
        max_bytes: u32,
        wait: Duration,
    ) -> Result<ReadOutcome, Error> {
        self.retrying(|process| async move { process.read(after_seq, max_bytes, wait).await })
            .await
    }

    /// Writes to stdin; after a broken connection the write is sent again
    /// with the same id, so it is applied exactly once.
    pub async fn write(&self, data: &[u8], write_id: &str) -> Result<WriteStatus, Error> {
        self.write_in_order(data, write_id).outcome().await
    }

    /// Sends a write now without waiting for its outcome; writes reach the
    /// child in the order of the calls, across recoveries too. At most
    /// [`MAX_UNANSWERED_WRITES`] may wait for an answer: past that the call
    /// fails with `overloaded`, and so does every later stdin call, so the
    /// child never sees a hole in its input.
    pub fn write_in_order(&self, data: &[u8], write_id: &str) -> PendingWrite {
        self.enqueue(OutgoingKind::Write {
            data: Bytes::copy_from_slice(data),
            write_id: write_id.to_string(),
        })
    }

    /// End-of-file for the child after every earlier write.
    pub async fn close_stdin(&self) -> Result<(), Error> {
        self.enqueue(OutgoingKind::CloseStdin)
            .outcome()
            .await
            .map(drop)
    }

    /// Sends `signal` at most once: if the connection breaks while it is
    /// on its way, the handle recovers but reports the error, since the
    /// signal may or may not have been delivered.
    pub async fn signal(&self, signal: Signal) -> Result<(), Error> {
        let (process, epoch) = self.attached()?;
        match process.signal(signal).await {
            Err(error) if error.is_transport_loss() && self.inner.resume.is_some() => {
                self.recover(epoch, &error).await?;
                Err(error)
            }
            other => other,
        }
    }

    pub async fn terminate(&self) -> Result<bool, Error> {
        self.retrying(|process| async move { process.terminate().await })
            .await
    }

    pub async fn resize(&self, size: PtySize) -> Result<(), Error> {
        self.retrying(|process| async move { process.resize(size).await })
            .await
    }

    pub async fn info(&self) -> Result<ProcessSnapshot, Error> {
        self.retrying(|process| async move { process.info().await })
            .await
    }

    /// Every event after `after_seq`, then live ones, until `closed`,
    /// across recoveries.
    pub fn events(&self, after_seq: u64) -> ResilientEvents {
        ResilientEvents {
            process: self.clone(),
            stream: None,
            last_seq: after_seq,
            resumed: false,
            done: false,
        }
    }

    fn enqueue(&self, kind: OutgoingKind) -> PendingWrite {
        if self.inner.outbox.borrow().len() >= MAX_UNANSWERED_WRITES {
            *self.inner.stdin_refused.borrow_mut() = Some(format!(
                "{MAX_UNANSWERED_WRITES} stdin calls were waiting for an answer; wait for \
                 writes before sending more (stdin now refuses every call, so the child \
                 never sees a hole in its input)"
            ));
        }
        if let Some(reason) = self.inner.stdin_refused.borrow().clone() {
            return PendingWrite::from_outcome(tokio::task::spawn_local(async move {
                Err(Error::Rpc(capnp::Error::overloaded(reason)))
            }));
        }
        let (reply, outcome) = oneshot::channel();
        let mut outgoing = Outgoing {
            kind,
            reply: Some(reply),
            sent_on: None,
            answer: None,
        };
        // Sent now only if nothing before it waits to be sent again, so
        // the order of the calls is kept.
        if let Ok((process, epoch)) = self.attached() {
            let in_order = self
                .inner
                .outbox
                .borrow()
                .iter()
                .all(|earlier| earlier.sent_on == Some(epoch));
            if in_order && self.inner.recovery.borrow().is_none() {
                outgoing.sent_on = Some(epoch);
                outgoing.answer = Some(send(&process, &outgoing.kind));
            }
        }
        self.inner.outbox.borrow_mut().push_back(outgoing);
        if !self.inner.driver.replace(true) {
            tokio::task::spawn_local(self.clone().drive_outbox());
        }
        PendingWrite::from_outcome(tokio::task::spawn_local(async move {
            outcome.await.unwrap_or_else(|_| {
                Err(Error::Rpc(capnp::Error::failed(
                    "the process handle was dropped".to_string(),
                )))
            })
        }))
    }

    /// Answers stdin calls in order; after a recovery, sends again (in
    /// order) every call not yet answered on the new capability.
    async fn drive_outbox(self) {
        loop {
            let head = {
                let mut outbox = self.inner.outbox.borrow_mut();
                match outbox.front_mut() {
                    Some(head) => (head.sent_on, head.answer.take()),
                    None => {
                        self.inner.driver.set(false);
                        return;
                    }
                }
            };
            let (Some(epoch), Some(answer)) = head else {
                // Held back behind a recovery: wait for it, then send.
                let recovery = self.inner.recovery.borrow().clone();
                if let Some(recovery) = recovery
                    && let Err(reason) = recovery.await
                {
                    self.fail_outbox(&reason);
                    return;
                }
                if let Some(reason) = self.inner.failed.borrow().clone() {
                    self.fail_outbox(&reason);
                    return;
                }
                self.send_again();
                continue;
            };
            let result = answer.await.unwrap_or_else(|error| Err(Error::from(error)));
            match result {
                Err(error) if error.is_transport_loss() && self.inner.resume.is_some() => {
                    if let Err(error) = self.recover(epoch, &error).await {
                        self.fail_outbox(&error.to_string());
                        return;
                    }
                    self.send_again();
                }
                result => {
                    let reply = self
                        .inner
                        .outbox
                        .borrow_mut()
                        .pop_front()
                        .and_then(|mut head| head.reply.take());
                    if let Some(reply) = reply {
                        let _ = reply.send(result);
                    }
                }
            }
        }
    }

    /// Sends every unanswered stdin call again, in order, on the current
    /// capability.
    fn send_again(&self) {
        let Ok((process, epoch)) = self.attached() else {
            return;
        };
        for outgoing in self.inner.outbox.borrow_mut().iter_mut() {
            if outgoing.sent_on != Some(epoch) {
                outgoing.sent_on = Some(epoch);
                outgoing.answer = Some(send(&process, &outgoing.kind));
            }
        }
    }

    fn fail_outbox(&self, reason: &str) {
        let pending: Vec<Outgoing> = self.inner.outbox.borrow_mut().drain(..).collect();
        self.inner.driver.set(false);
        for mut outgoing in pending {
            if let Some(reply) = outgoing.reply.take() {
                let _ = reply.send(Err(Error::Recovery {
                    reason: reason.to_string(),
                    cause: "the connection broke".to_string(),
                }));
            }
        }
    }
}

impl Inner {
    fn note(&self, note: &RecoveryNote) {
        if let Some(observer) = self.observer.borrow().as_ref() {
            observer(note);
        }
    }
}

fn note(inner: &Weak<Inner>, recovery_note: &RecoveryNote) {
    if let Some(inner) = inner.upgrade() {
        inner.note(recovery_note);
    }
}

/// Reconnects and restores until it works or the grace is over; each
/// attempt is bounded by what is left of the grace, so a peer that accepts
/// but never answers cannot hold the recovery past it.
async fn reattach(
    connect: &Connect,
    token: &str,
    grace: Duration,
) -> Result<(RemoteProcess, Session), String> {
    let deadline = Instant::now() + grace;
    let gave_up = |error: &dyn std::fmt::Display| {
        format!(
            "gave up after {}: {error}",
            crate::model::show_duration(grace)
        )
    };
    let mut wait = FIRST_RETRY;
    loop {
        let attempt = async {
            let session = connect().await?;
            let (process, restored) = restore(session.executor(), token);
            restored.await?;
            Ok::<_, Error>((process, session))
        };
        match tokio::time::timeout_at(deadline, attempt).await {
            Ok(Ok(reattached)) => return Ok(reattached),
            Ok(Err(error)) if error.is_transport_loss() && Instant::now() + wait < deadline => {
                tracing::debug!(%error, "cannot restore the process yet");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(MAX_RETRY);
            }
            Ok(Err(error)) if error.is_transport_loss() => return Err(gave_up(&error)),
            Ok(Err(error)) => return Err(error.to_string()),
            Err(_elapsed) => return Err(gave_up(&"no answer from the server")),
        }
    }
}

fn send(process: &RemoteProcess, kind: &OutgoingKind) -> JoinHandle<Result<WriteStatus, Error>> {
    match kind {
        OutgoingKind::Write { data, write_id } => {
            let pending = process.write_in_order(data, write_id);
            tokio::task::spawn_local(pending.outcome())
        }
        OutgoingKind::CloseStdin => {
            let closing = process.close_stdin_in_order();
            tokio::task::spawn_local(async move { closing.await?.map(|()| WriteStatus::Accepted) })
        }
    }
}

/// The events of a [`ResilientProcess`] in seq order, each exactly once,
/// across recoveries; ends after `closed`.
pub struct ResilientEvents {
    process: ResilientProcess,
    stream: Option<(EventStream, u64)>,
    last_seq: u64,
    /// The stream was just resubscribed after a recovery.
    resumed: bool,
    done: bool,
}

impl ResilientEvents {
    /// The next batch of consecutive events; `None` after `closed`. If the
    /// server no longer retains events that were missed while the
    /// connection was broken, [`Error::OutputLost`] says exactly which.
    pub async fn next_batch(&mut self) -> Option<Result<Vec<Event>, Error>> {
        // Cancel-safe: the stream stays in `self` while it is awaited, and
        // `last_seq` and `resumed` change only with what is returned.
        loop {
            if self.done {
                return None;
            }
            let Some((stream, epoch)) = self.stream.as_mut() else {
                let (process, epoch) = match self.process.attached() {
                    Ok(attached) => attached,
                    Err(error) => return Some(Err(error)),
                };
                match process.events(self.last_seq).await {
                    Ok(stream) => self.stream = Some((stream, epoch)),
                    Err(error) => {
                        if let Err(error) = self.recover_from(epoch, error).await {
                            self.done = true;
                            return Some(Err(error));
                        }
                    }
                }
                continue;
            };
            let epoch = *epoch;
            match stream.next_batch().await {
                Some(Ok(batch)) => {
                    let fresh: Vec<Event> = batch
                        .into_iter()
                        .filter(|e| e.seq > self.last_seq)
                        .collect();
                    if fresh.is_empty() {
                        continue;
                    }
                    if self.resumed
                        && let Some(lost) = missed_while_away(self.last_seq, &fresh)
                    {
                        self.done = true;
                        return Some(Err(lost));
                    }
                    self.resumed = false;
                    if let Some(last) = fresh.last() {
                        self.last_seq = last.seq;
                        self.done = matches!(last.body, EventBody::Closed);
                    }
                    return Some(Ok(fresh));
                }
                Some(Err(error)) => {
                    self.stream = None;
                    let error = match error {
                        Error::EventsEnded => self.why_events_ended(epoch).await,
                        other => other,
                    };
                    if let Err(error) = self.recover_from(epoch, error).await {
                        self.done = true;
                        return Some(Err(error));
                    }
                }
                None => return None,
            }
        }
    }

    /// Subscribes now rather than at the first [`Self::next_batch`], so the
    /// subscription can travel with other pipelined calls (such as the
    /// start).
    pub async fn subscribe_now(&mut self) -> Result<(), Error> {
        if self.stream.is_some() {
            return Ok(());
        }
        let (process, epoch) = self.process.attached()?;
        let stream = process.events(self.last_seq).await?;
        self.stream = Some((stream, epoch));
        Ok(())
    }

    /// Why a subscription ended early: a cheap call on the same
    /// capability fails with the connection's own reason (closed by the
    /// server, lost, silent), which says more than the end of a stream.
    async fn why_events_ended(&self, epoch: u64) -> Error {
        let Ok((process, current)) = self.process.attached() else {
            return Error::EventsEnded;
        };
        if current != epoch {
            return Error::EventsEnded;
        }
        match tokio::time::timeout(PROBE_WAIT, process.info()).await {
            Ok(Err(error)) if error.is_transport_loss() => error,
            _ => Error::EventsEnded,
        }
    }

    async fn recover_from(&mut self, epoch: u64, error: Error) -> Result<(), Error> {
        if !error.is_transport_loss() || self.process.inner.resume.is_none() {
            return Err(error);
        }
        // Set first: if this call is cancelled during the recovery, the
        // next one still checks what it resubscribes to.
        self.resumed = true;
        self.process.recover(epoch, &error).await
    }
}

/// What the first batch after a resubscription says was lost, if anything:
/// a `gap` anywhere in it (the exit event may precede one), or (from a
/// server that did not say so) a jump in seqs.
fn missed_while_away(last_seq: u64, fresh: &[Event]) -> Option<Error> {
    let mut expected = last_seq + 1;
    for event in fresh {
        if let EventBody::Gap { from_seq } = event.body {
            return Some(Error::OutputLost {
                from_seq,
                to_seq: event.seq,
            });
        }
        if event.seq != expected {
            return Some(Error::OutputLost {
                from_seq: expected,
                to_seq: event.seq - 1,
            });
        }
        expected = event.seq + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ExitStatus;

    fn event(seq: u64, body: EventBody) -> Event {
        Event { seq, body }
    }

    #[test]
    fn a_resumed_batch_reports_a_gap_behind_the_exit_event() {
        let batch = [
            event(5, EventBody::Exited(ExitStatus::Code(0).into())),
            event(9, EventBody::Gap { from_seq: 6 }),
            event(10, EventBody::Closed),
        ];
        assert!(matches!(
            missed_while_away(4, &batch),
            Some(Error::OutputLost {
                from_seq: 6,
                to_seq: 9
            })
        ));
    }

    #[test]
    fn a_resumed_batch_reports_a_jump_in_seqs() {
        let batch = [event(7, EventBody::Closed)];
        assert!(matches!(
            missed_while_away(4, &batch),
            Some(Error::OutputLost {
                from_seq: 5,
                to_seq: 6
            })
        ));
        assert!(missed_while_away(6, &batch).is_none());
    }
}
