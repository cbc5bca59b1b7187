//! Processes that outlive the loss of their references: `detachable` gives
//! a process a restore token; when its last capability is released, the
//! process is *parked* here instead of terminated, until `restore` hands it
//! out again or its grace period ends.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::time::Duration;

use std::future::Future;

use futures::StreamExt;
use futures::future::{AbortHandle, AbortRegistration, Abortable};
use futures::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::engine::{Process, ProcessOwner};
use crate::model::{Refusal, RefusalKind};
use crate::rpc::quota::Ticket;

/// Longest grace a process may ask for: a day.
pub const MAX_GRACE: Duration = Duration::from_secs(86_400);
/// Default time a finished, parked process stays restorable.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(30);

type Key = [u8; 32];

/// One process as the RPC layer owns it: every `Process` capability for it
/// (the first one, and one per `restore`) shares this, and the process is
/// terminated when the last share goes, unless it is parked.
pub(crate) struct Held {
    owner: ProcessOwner,
    /// Counts the process against the quota of the connection that started
    /// (or last restored) it, while it lives.
    ticket: RefCell<std::rc::Rc<Ticket>>,
    detach: RefCell<Option<Detach>>,
    /// `Process` capabilities that are alive for this process.
    capabilities: Cell<usize>,
    /// Weak: the registry holds parked processes, which hold this.
    registry: Weak<Detachments>,
}

struct Detach {
    key: Key,
    token: String,
    grace: Duration,
}

impl Held {
    pub(crate) fn new(owner: ProcessOwner, registry: &Rc<Detachments>, ticket: Ticket) -> Rc<Held> {
        Rc::new(Held {
            owner,
            ticket: RefCell::new(std::rc::Rc::new(ticket)),
            detach: RefCell::new(None),
            capabilities: Cell::new(0),
            registry: Rc::downgrade(registry),
        })
    }

    /// A `Process` capability for this process was made.
    pub(crate) fn capability_made(&self) {
        self.capabilities.set(self.capabilities.get() + 1);
    }

    /// A `Process` capability for this process went; the last one parks a
    /// detachable process.
    pub(crate) fn capability_released(self: &Rc<Self>) {
        let capabilities = self.capabilities.get().saturating_sub(1);
        self.capabilities.set(capabilities);
        if capabilities == 0 {
            self.park_if_detachable();
        }
    }

    /// The process now counts against the connection that gave `ticket`
    /// (a restore), and no longer against the one before.
    pub(crate) fn count_against(&self, ticket: Ticket) {
        let previous = self.ticket.replace(std::rc::Rc::new(ticket));
        drop(previous);
    }

    /// A share of the process's place in its connection's quota, for a
    /// facet: while a facet holds the process's record, the place stays
    /// taken.
    pub(crate) fn quota_share(&self) -> std::rc::Rc<Ticket> {
        std::rc::Rc::clone(&self.ticket.borrow())
    }

    pub(crate) fn owner(&self) -> &ProcessOwner {
        &self.owner
    }

    /// The connection holding the process, or `None` while it is parked
    /// after a detach (no capability left, kept for a restore).
    pub(crate) fn connection(&self) -> Option<std::rc::Rc<str>> {
        if self.capabilities.get() == 0 && self.detach.borrow().is_some() {
            return None;
        }
        Some(self.ticket.borrow().connection())
    }

    /// Makes the process detachable (or changes its grace) and returns its
    /// restore token.
    pub(crate) fn make_detachable(self: &Rc<Self>, grace: Duration) -> Result<String, Refusal> {
        if grace.is_zero() || grace > MAX_GRACE {
            return Err(Refusal::new(
                RefusalKind::InvalidArgument,
                format!(
                    "graceSecs must be 1 to {}, got {}",
                    MAX_GRACE.as_secs(),
                    grace.as_secs()
                ),
            ));
        }
        let mut detach = self.detach.borrow_mut();
        if let Some(detach) = detach.as_mut() {
            detach.grace = grace;
            return Ok(detach.token.clone());
        }
        let Some(registry) = self.registry.upgrade().filter(|r| !r.closed.get()) else {
            return Err(Refusal::new(
                RefusalKind::Unavailable,
                "the server is shutting down; processes cannot be made detachable",
            ));
        };
        let token = crate::secret::random_hex(32).map_err(|error| {
            Refusal::new(
                RefusalKind::Internal,
                format!("cannot make a restore token: {error}"),
            )
        })?;
        registry.start_expiring();
        let key = crate::secret::digest(&token);
        registry.entries.borrow_mut().insert(
            key,
            Entry {
                held: Rc::downgrade(self),
                parked: None,
            },
        );
        *detach = Some(Detach {
            key,
            token: token.clone(),
            grace,
        });
        Ok(token)
    }

    /// A detachable process handed over by the binary before, parked
    /// under its restore token until restored or its grace (counted anew)
    /// ends.
    pub(crate) fn take_over_parked(
        owner: ProcessOwner,
        registry: &Rc<Detachments>,
        ticket: Ticket,
        token: String,
        grace: Duration,
    ) -> Rc<Held> {
        let held = Held::new(owner, registry, ticket);
        registry.start_expiring();
        let key = crate::secret::digest(&token);
        registry.entries.borrow_mut().insert(
            key,
            Entry {
                held: Rc::downgrade(&held),
                parked: None,
            },
        );
        *held.detach.borrow_mut() = Some(Detach { key, token, grace });
        held.park_if_detachable();
        held
    }

    /// The restore token and grace of a detachable process.
    pub(crate) fn detached(&self) -> Option<(String, Duration)> {
        self.detach
            .borrow()
            .as_ref()
            .map(|detach| (detach.token.clone(), detach.grace))
    }

    /// Parks the process if it is detachable and the server still runs.
    fn park_if_detachable(self: &Rc<Self>) {
        let Some((key, grace)) = self
            .detach
            .borrow()
            .as_ref()
            .map(|detach| (detach.key, detach.grace))
        else {
            return;
        };
        if let Some(registry) = self.registry.upgrade() {
            registry.park(key, Rc::clone(self), grace);
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(detach) = self.detach.get_mut()
            && let Some(registry) = self.registry.upgrade()
        {
            // Never ours while parked (a parked entry holds us), and the
            // registry is not borrowed while it drops a parked process.
            let entry = registry.entries.borrow_mut().remove(&detach.key);
            drop(entry);
        }
    }
}

struct Entry {
    held: Weak<Held>,
    parked: Option<Parked>,
}

/// A parked process: the only strong reference to it, which park this is,
/// and the handle that stops waiting for the park's end.
struct Parked {
    held: Rc<Held>,
    park: u64,
    waiting: AbortHandle,
}

/// A park's end: its grace, or for a finished process the retention.
struct Expiry {
    key: Key,
    park: u64,
    grace: Duration,
    process: Process,
    /// Aborted when the process is restored, so nothing is held for it.
    restored: AbortRegistration,
}

/// The detachable processes of one server, by the digest of their token.
pub struct Detachments {
    entries: RefCell<HashMap<Key, Entry>>,
    retention: Duration,
    parks: Cell<u64>,
    /// Set by `clear`: nothing more is made detachable.
    closed: Cell<bool>,
    /// Feeds the task that ends parks; started with the first park.
    expiries: RefCell<Option<mpsc::UnboundedSender<Expiry>>>,
}

impl Detachments {
    /// Finished, parked processes stay restorable at least until their
    /// grace ends, and for `retention` after their release or their close,
    /// whichever is later.
    pub fn new(retention: Duration) -> Rc<Detachments> {
        Rc::new(Detachments {
            entries: RefCell::new(HashMap::new()),
            retention,
            parks: Cell::new(0),
            closed: Cell::new(false),
            expiries: RefCell::new(None),
        })
    }

    /// Every detachable process still held, parked or not (for a
    /// hand-over to the next binary).
    pub(crate) fn held(&self) -> Vec<Rc<Held>> {
        self.entries
            .borrow()
            .values()
            .filter_map(|entry| entry.held.upgrade())
            .collect()
    }

    /// Processes that are parked right now.
    pub fn parked(&self) -> usize {
        self.entries
            .borrow()
            .values()
            .filter(|entry| entry.parked.is_some())
            .count()
    }

    /// Ends every park now and refuses new ones (the server is shutting
    /// down): the processes are terminated as if released, and the task
    /// that waited for the parks' ends stops.
    pub fn clear(&self) {
        self.closed.set(true);
        let entries: Vec<Entry> = self.entries.borrow_mut().drain().map(|(_, e)| e).collect();
        for parked in entries.iter().filter_map(|entry| entry.parked.as_ref()) {
            parked.waiting.abort();
        }
        self.expiries.borrow_mut().take();
        // Dropped outside the borrow: dropping a process touches the map.
        drop(entries);
    }

    fn park(self: &Rc<Self>, key: Key, held: Rc<Held>, grace: Duration) {
        let park = self.parks.get() + 1;
        self.parks.set(park);
        let process = held.owner.handle();
        let (waiting, restored) = AbortHandle::new_pair();
        {
            let mut entries = self.entries.borrow_mut();
            let Some(entry) = entries.get_mut(&key) else {
                return;
            };
            entry.parked = Some(Parked {
                held,
                park,
                waiting,
            });
        }
        tracing::info!(
            pid = process.pid(),
            grace_s = grace.as_secs(),
            "process parked until restored"
        );
        let expiry = Expiry {
            key,
            park,
            grace,
            process,
            restored,
        };
        let sent = match self.expiries.borrow().as_ref() {
            Some(sender) => sender.send(expiry).map_err(|unsent| unsent.0),
            None => Err(expiry),
        };
        if let Err(expiry) = sent {
            // Nothing can wait for a restore (the runtime is shutting
            // down): the process ends now.
            self.expire(expiry.key, expiry.park);
        }
    }

    /// Starts the task that ends parks, once. Parks happen while a
    /// connection's capabilities are being dropped, where spawning is not
    /// always possible, so one task, started by the first `detachable`
    /// call, does the waiting for all of them.
    fn start_expiring(self: &Rc<Self>) {
        if self.expiries.borrow().is_some() {
            return;
        }
        let (sender, mut receiver) = mpsc::unbounded_channel::<Expiry>();
        *self.expiries.borrow_mut() = Some(sender);
        let registry = Rc::downgrade(self);
        let retention = self.retention;
        tokio::task::spawn_local(async move {
            let mut waiting = FuturesUnordered::new();
            loop {
                tokio::select! {
                    expiry = receiver.recv() => match expiry {
                        Some(expiry) => waiting.push(wait_out(expiry, retention)),
                        None => return,
                    },
                    Some(ended) = waiting.next(), if !waiting.is_empty() => {
                        let Ok((key, park)) = ended else {
                            continue; // restored meanwhile
                        };
                        match registry.upgrade() {
                            Some(registry) => registry.expire(key, park),
                            None => return,
                        }
                    }
                }
            }
        });
    }

    /// Ends park number `park` of `key`, if it is still parked: the process
    /// is terminated (or, if it has finished, forgotten).
    fn expire(&self, key: Key, park: u64) {
        let removed = {
            let mut entries = self.entries.borrow_mut();
            match entries.get(&key) {
                Some(entry) if entry.parked.as_ref().is_some_and(|p| p.park == park) => {
                    entries.remove(&key)
                }
                _ => None,
            }
        };
        if let Some(entry) = &removed
            && let Some(parked) = &entry.parked
        {
            tracing::info!(
                pid = parked.held.owner.pid(),
                "nobody restored the process in time"
            );
        }
        // Dropped outside the borrow: dropping the process touches the map.
        drop(removed);
    }

    /// The process that `token` belongs to, unparking it if it was parked.
    pub(crate) fn restore(&self, token: &str) -> Result<Rc<Held>, capnp::Error> {
        let key = crate::secret::digest(token);
        let mut entries = self.entries.borrow_mut();
        let held = entries
            .get_mut(&key)
            .and_then(|entry| match entry.parked.take() {
                Some(parked) => {
                    parked.waiting.abort();
                    Some(parked.held)
                }
                None => entry.held.upgrade(),
            });
        held.ok_or_else(|| {
            capnp::Error::from(Refusal::new(
                RefusalKind::UnknownToken,
                "no process has this restore token (it never existed, it was not \
                 restored within its grace period, or it finished longer ago than the \
                 server keeps finished processes)",
            ))
        })
    }
}

/// Waits until the park may end: the grace period, or for a process that
/// finishes, the later of the grace's end and the retention after its close
/// (or after the park, if it had closed before): the client was promised
/// the grace, and a late one still learns how the process ended. Ends
/// early, with `Aborted`, if the process is restored.
fn wait_out(expiry: Expiry, retention: Duration) -> Abortable<impl Future<Output = (Key, u64)>> {
    let Expiry {
        key,
        park,
        grace,
        process,
        restored,
    } = expiry;
    Abortable::new(wait_park(key, park, grace, process, retention), restored)
}

async fn wait_park(
    key: Key,
    park: u64,
    grace: Duration,
    process: Process,
    retention: Duration,
) -> (Key, u64) {
    let expiry = (key, park);
    let grace_ends = Instant::now() + grace;
    tokio::select! {
        biased;
        _ = process.wait_closed() => {
            tokio::time::sleep_until(grace_ends.max(Instant::now() + retention)).await;
        }
        _ = tokio::time::sleep_until(grace_ends) => {}
    }
    expiry
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Engine, ProcessLimits};
    use crate::model::StartSpec;
    use crate::rpc::quota::Quota;

    fn on_local_set(body: impl Future<Output = ()>) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        tokio::task::LocalSet::new().block_on(&runtime, body);
    }

    async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// `argv` started on `engine` and held as one `Process` capability
    /// holds it, with the engine's handle on it.
    fn held_process(
        engine: &Engine,
        registry: &Rc<Detachments>,
        argv: &[&str],
    ) -> (Rc<Held>, crate::engine::Process) {
        let owner = engine.start(&StartSpec::new(argv)).expect("start");
        let process = owner.handle();
        let held = Held::new(
            owner,
            registry,
            Quota::unlimited().take().expect("unlimited"),
        );
        held.capability_made();
        (held, process)
    }

    /// A finished process is forgotten once both its grace and the
    /// retention after its close are over.
    #[test]
    fn a_finished_park_ends_after_its_grace_and_the_retention() {
        on_local_set(async {
            let engine = Engine::new(ProcessLimits::default());
            let registry = Detachments::new(Duration::from_millis(50));
            let (held, process) = held_process(&engine, &registry, &["true"]);
            let token = held
                .make_detachable(Duration::from_secs(1))
                .expect("detachable");
            process.wait_closed().await;
            held.capability_released();
            drop(held);
            assert_eq!(registry.parked(), 1);
            eventually("the park ends", || registry.parked() == 0).await;
            assert!(registry.restore(&token).is_err());
        });
    }

    /// Server shutdown ends parks, and nothing keeps the registry alive.
    #[test]
    fn clear_ends_every_park_and_frees_the_registry() {
        on_local_set(async {
            let engine = Engine::new(ProcessLimits::default());
            let registry = Detachments::new(DEFAULT_RETENTION);
            let (held, process) = held_process(&engine, &registry, &["sleep", "1000"]);
            held.make_detachable(MAX_GRACE).expect("detachable");
            held.capability_released();
            drop(held);
            assert_eq!(registry.parked(), 1);
            registry.clear();
            assert_eq!(registry.parked(), 0);
            let again = engine.start(&StartSpec::new(["true"])).expect("start");
            let late = Held::new(
                again,
                &registry,
                Quota::unlimited().take().expect("unlimited"),
            );
            assert!(
                late.make_detachable(MAX_GRACE).is_err(),
                "detachable after clear"
            );
            tokio::time::timeout(Duration::from_secs(30), process.wait_closed())
                .await
                .expect("the cleared process is terminated");
            let weak = Rc::downgrade(&registry);
            drop(registry);
            assert!(weak.upgrade().is_none(), "a reference cycle kept it alive");
        });
    }
}
