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

mod events;
mod link;
mod outbox;

use std::any::Any;
use std::cell::RefCell;
use std::future::Future;
use std::rc::{Rc, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures::future::LocalBoxFuture;

use crate::capexec_capnp::executor;
use crate::client::error::RecoveryFailure;
use crate::client::{Command, Error, OutgoingBytes, Pending, PendingWrite, RemoteProcess};
use crate::model::{
    ExitStatus, OutputStream, ProcessSnapshot, PtySize, ReadOutcome, Signal, WriteStatus,
};

pub use self::events::ResilientEvents;
use self::link::{Link, LinkState, Plan};
pub use self::outbox::MAX_UNANSWERED_WRITES;
use self::outbox::{Outbox, OutgoingKind};

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
    link: RefCell<Link>,
    resume: Option<Resume>,
    outbox: Outbox,
    observer: RefCell<Option<Observer>>,
}

/// How the process is recovered.
struct Resume {
    connect: Connect,
    grace: Duration,
    /// Set once the server has made the process detachable.
    token: RefCell<Option<String>>,
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
                link: RefCell::new(Link::new(process, session)),
                resume: resume.map(|(connect, grace)| Resume {
                    connect,
                    grace,
                    token: RefCell::new(None),
                }),
                outbox: Outbox::default(),
                observer: RefCell::new(None),
            }),
        };
        // The token is recorded as soon as it arrives, whether or not the
        // caller ever awaits `ready`: a recovery needs it.
        let recorded = detached.map(|detached| {
            let inner = Rc::downgrade(&handle.inner);
            Pending::spawn(async move {
                let token = detached.await?;
                if let Some(inner) = inner.upgrade()
                    && let Some(resume) = &inner.resume
                {
                    *resume.token.borrow_mut() = Some(token);
                }
                Ok(())
            })
        });
        let ready = async move {
            started.await?;
            if let Some(recorded) = recorded {
                recorded.outcome().await?;
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

    /// Whether the way to the process is broken and being restored now (or
    /// could not be restored).
    pub fn is_recovering(&self) -> bool {
        !matches!(self.inner.link.borrow().state, LinkState::Up)
    }

    /// How long the server keeps the process without a connection, if it
    /// was made detachable.
    pub fn grace(&self) -> Option<Duration> {
        self.inner.resume.as_ref().map(|resume| resume.grace)
    }

    /// The process capability in use now (it changes with every restore).
    pub fn current(&self) -> RemoteProcess {
        self.inner.link.borrow().attached.process.clone()
    }

    /// Whether broken connections are recovered from.
    fn resumes(&self) -> bool {
        self.inner.resume.is_some()
    }

    /// The capability calls go to and its generation, unless the recovery
    /// gave up.
    fn attached(&self) -> Result<(RemoteProcess, u64), Error> {
        let link = self.inner.link.borrow();
        if let Some(failure) = link.failure() {
            return Err(failure);
        }
        Ok((link.attached.process.clone(), link.attached.generation))
    }

    /// Runs `call` on the current capability, recovering and calling again
    /// as long as the failure is a broken connection: for calls that may be
    /// repeated (every `Process` call but stdin writes and signals, which
    /// have methods of their own here). New calls of [`RemoteProcess`] are
    /// usable through it at once: `process.retrying(|p| async move { p.info().await })`.
    pub async fn retrying<T, F, Fut>(&self, call: F) -> Result<T, Error>
    where
        F: Fn(RemoteProcess) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        loop {
            let (process, generation) = self.attached()?;
            match call(process).await {
                Err(error) if error.is_transport_loss() && self.resumes() => {
                    self.recover(generation, &error).await?;
                }
                other => return other,
            }
        }
    }

    /// Recovers from a loss seen on `generation` (at once if another call
    /// has recovered since). Concurrent callers share one recovery.
    async fn recover(&self, generation: u64, cause: &Error) -> Result<(), Error> {
        let recovery = {
            let mut link = self.inner.link.borrow_mut();
            if let Some(failure) = link.failure() {
                return Err(failure);
            }
            if link.attached.generation != generation {
                return Ok(());
            }
            match &link.state {
                LinkState::Recovering(recovery) => recovery.clone(),
                _ => {
                    let recovery =
                        link::recovery(Rc::downgrade(&self.inner), self.plan(), cause.clone());
                    link.state = LinkState::Recovering(recovery.clone());
                    recovery
                }
            }
        };
        recovery.await.map_err(|failure| Error::Recovery {
            failure,
            cause: Box::new(cause.clone()),
        })
    }

    /// Waits for a recovery in progress, if any; the error every call gets
    /// if the recovery gave up.
    async fn recovered(&self) -> Result<(), Error> {
        let recovery = match &self.inner.link.borrow().state {
            LinkState::Recovering(recovery) => Some(recovery.clone()),
            _ => None,
        };
        if let Some(recovery) = recovery {
            let _ = recovery.await;
        }
        match self.inner.link.borrow().failure() {
            Some(failure) => Err(failure),
            None => Ok(()),
        }
    }

    fn plan(&self) -> Result<Plan, RecoveryFailure> {
        let resume = self
            .inner
            .resume
            .as_ref()
            .ok_or(RecoveryFailure::NotEnabled)?;
        let token = resume
            .token
            .borrow()
            .clone()
            .ok_or(RecoveryFailure::NotDetachable)?;
        Ok(Plan {
            connect: Rc::clone(&resume.connect),
            token,
            grace: resume.grace,
        })
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
        self.write_bytes_in_order(Bytes::copy_from_slice(data), write_id)
    }

    /// [`Self::write_in_order`] for bytes the caller already holds as
    /// [`Bytes`]: kept for a resend without a copy (stdin's data path).
    pub fn write_bytes_in_order(&self, data: Bytes, write_id: &str) -> PendingWrite {
        self.write_outgoing_in_order(data.into(), write_id)
    }

    /// [`Self::write_bytes_in_order`] for bytes that may leave as a
    /// segment of their own (read into a [`crate::client::SegmentBuffer`]):
    /// sent without a copy the first time.
    pub fn write_outgoing_in_order(&self, data: OutgoingBytes, write_id: &str) -> PendingWrite {
        self.enqueue(OutgoingKind::Write {
            data,
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
        let (process, generation) = self.attached()?;
        match process.signal(signal).await {
            Err(error) if error.is_transport_loss() && self.resumes() => {
                self.recover(generation, &error).await?;
                Err(error)
            }
            other => other,
        }
    }

    /// See [`RemoteProcess::close_output`]; retried across a reconnection.
    pub async fn close_output(&self, stream: OutputStream) -> Result<(), Error> {
        self.retrying(|process| async move { process.close_output(stream).await })
            .await
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
        ResilientEvents::new(self.clone(), after_seq)
    }

    /// Waits for the process to close, across recoveries, and returns its
    /// exit status, discarding output that was not read.
    pub async fn wait(&self) -> Result<ExitStatus, Error> {
        crate::client::process::exit_from(self.events(0)).await
    }

    /// A read-only view of the process (see [`RemoteProcess::observer`]),
    /// made on the current capability: it does not survive a broken
    /// connection.
    pub fn observer(&self) -> RemoteProcess {
        self.current().observer()
    }

    /// A stdin writer for the process (see [`RemoteProcess::stdin_writer`]),
    /// made on the current capability: it does not survive a broken
    /// connection.
    pub fn stdin_writer(&self) -> RemoteProcess {
        self.current().stdin_writer()
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
