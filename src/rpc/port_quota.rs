//! How many port connections and listeners one Cap'n Proto connection may
//! hold at once, and the flow-control budget its senders share.

use std::rc::Rc;
use std::sync::Arc;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::model::{Refusal, RefusalKind};
use crate::rpc::DirectChannels;
use crate::rpc::holdings::{Hold, Holdings};
use crate::wire::PortBudget;

/// Port connections (dialled or accepted) one connection may hold.
pub const MAX_PORT_STREAMS: usize = 1024;

/// Listeners one connection may hold.
pub const MAX_PORT_LISTENERS: usize = 64;

/// How many port connections and listeners one connection may hold
/// (`capexec serve --max-port-connections-per-connection` and
/// `--max-listeners-per-connection`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortLimits {
    pub max_connections: usize,
    pub max_listeners: usize,
}

impl Default for PortLimits {
    fn default() -> Self {
        PortLimits {
            max_connections: MAX_PORT_STREAMS,
            max_listeners: MAX_PORT_LISTENERS,
        }
    }
}

/// Descriptors a direct channel holds on top of its port connection's
/// socket: the channel itself. (The pipes its bytes move through while
/// they move are the pumps', bounded server-wide: `ports::MAX_PUMP_PIPES`.)
const DIRECT_CHANNEL_DESCRIPTORS: usize = 1;

#[derive(Clone)]
pub(crate) struct PortQuota(Rc<State>);

struct State {
    /// The connection's places for port connections and listeners: the
    /// permit of each is a [`PortTicket`]'s.
    streams: Arc<Semaphore>,
    listeners: Arc<Semaphore>,
    max_streams: usize,
    max_listeners: usize,
    /// Woken when a stream's place is given back (a listener waits on it
    /// before accepting more).
    freed: Notify,
    budget: PortBudget,
    /// Where tickets for direct channels come from, when this
    /// connection's dials may have one (a Unix socket's).
    direct: Option<DirectChannels>,
    /// The connection's places for tickets not claimed yet.
    unclaimed: Arc<Semaphore>,
    /// What the connection's capabilities hold: each connection and
    /// listener holds a descriptor there too, within the server's share.
    holdings: Holdings,
}

impl PortQuota {
    pub(crate) fn new(
        limits: PortLimits,
        holdings: Holdings,
        direct: Option<DirectChannels>,
    ) -> PortQuota {
        PortQuota(Rc::new(State {
            streams: Arc::new(Semaphore::new(
                limits.max_connections.min(Semaphore::MAX_PERMITS),
            )),
            listeners: Arc::new(Semaphore::new(
                limits.max_listeners.min(Semaphore::MAX_PERMITS),
            )),
            max_streams: limits.max_connections,
            max_listeners: limits.max_listeners,
            freed: Notify::new(),
            budget: PortBudget::default(),
            direct,
            unclaimed: Arc::new(Semaphore::new(
                crate::rpc::direct::MAX_UNCLAIMED_PER_CONNECTION,
            )),
            holdings,
        }))
    }

    /// A ticket for a dial that asks for a direct channel, with the hold
    /// of the descriptors the channel takes, if this connection may have
    /// one, neither it nor the server holds its maximum of unclaimed
    /// tickets, and the capabilities' share of descriptors has room (the
    /// dial goes through the sinks otherwise).
    pub(crate) fn issue_direct(
        &self,
    ) -> Option<(crate::rpc::Ticket, crate::rpc::direct::Claim, Hold)> {
        let direct = self.0.direct.as_ref()?;
        let hold = self
            .0
            .holdings
            .hold(DIRECT_CHANNEL_DESCRIPTORS, 0, "port connections")
            .ok()?;
        let (ticket, claim) = direct.issue(&self.0.unclaimed)?;
        Some((ticket, claim, hold))
    }

    /// What the connection's senders share.
    pub(crate) fn budget(&self) -> &PortBudget {
        &self.0.budget
    }

    /// One more port connection, or the limit's error.
    pub(crate) fn take_stream(&self) -> Result<PortTicket, Refusal> {
        self.take(false)
    }

    /// One more listener, or the limit's error.
    pub(crate) fn take_listener(&self) -> Result<PortTicket, Refusal> {
        self.take(true)
    }

    fn take(&self, listener: bool) -> Result<PortTicket, Refusal> {
        let (places, max, what) = if listener {
            (&self.0.listeners, self.0.max_listeners, "listeners")
        } else {
            (&self.0.streams, self.0.max_streams, "port connections")
        };
        let Ok(place) = Arc::clone(places).try_acquire_owned() else {
            crate::metrics::limit_hit(if listener {
                "port-listeners"
            } else {
                "port-connections"
            });
            return Err(Refusal::new(
                RefusalKind::LimitReached,
                format!("this connection already holds its maximum of {max} {what}"),
            ));
        };
        // Refused here, the place goes back with `place`.
        let descriptor = self.0.holdings.hold(1, 0, what)?;
        Ok(PortTicket {
            place: Some(place),
            freed: (!listener).then(|| Rc::clone(&self.0)),
            _descriptor: descriptor,
        })
    }

    /// Waits until one more port connection could be taken (on this
    /// connection and in the server's share of descriptors), taking
    /// nothing: a listener waits so before it accepts, and holds no place
    /// while it listens.
    pub(crate) async fn wait_for_room(&self) {
        let server_freed = self.0.holdings.freed();
        loop {
            let freed = self.0.freed.notified();
            let elsewhere = server_freed.notified();
            if self.0.streams.available_permits() > 0 && self.0.holdings.has_room_for(1) {
                return;
            }
            tokio::select! {
                () = freed => {}
                () = elsewhere => {}
            }
        }
    }

    /// One more port connection, once one is free.
    pub(crate) async fn wait_for_stream(&self) -> PortTicket {
        loop {
            if let Ok(ticket) = self.take_stream() {
                return ticket;
            }
            self.wait_for_room().await;
        }
    }
}

/// A place taken in a [`PortQuota`]: its permit, given back when the
/// ticket drops.
pub(crate) struct PortTicket {
    place: Option<OwnedSemaphorePermit>,
    /// A port connection's quota, whose listeners waiting for room are
    /// woken once its place is back.
    freed: Option<Rc<State>>,
    _descriptor: Hold,
}

impl Drop for PortTicket {
    fn drop(&mut self) {
        drop(self.place.take());
        if let Some(state) = &self.freed {
            state.freed.notify_waiters();
        }
    }
}
