//! How many processes the starts of one connection may hold at once.

use std::cell::Cell;
use std::rc::Rc;

use crate::model::{Refusal, RefusalKind};
use crate::rpc::file_limits::FileLimits;
use crate::rpc::holdings::{Holdings, ServerHoldings};

/// A connection's allowance of live processes, shared by every executor
/// reached from its root (the "local" environment included).
#[derive(Clone)]
pub struct Quota(Rc<State>);

struct State {
    held: Cell<usize>,
    max: Option<usize>,
    /// Who the connection is, as the admin's process list names it.
    connection: std::cell::RefCell<Rc<str>>,
    /// The connection's file transfers and watches.
    files: FileLimits,
    /// The connection's port connections and listeners.
    ports: crate::rpc::port_quota::PortQuota,
    /// What the connection's peer sent to be its children's standard
    /// descriptors: only a Unix socket's peer (and an in-process client)
    /// can.
    received: Option<crate::rpc::ReceivedDescriptors>,
    /// What the connection's capabilities hold (descriptors, memory).
    holdings: Holdings,
}

impl Quota {
    /// No limit on processes (the embedded executor; the server's own
    /// limit still holds), and an account of its own for what its
    /// capabilities hold.
    pub fn unlimited() -> Quota {
        Quota::new(None, Holdings::default())
    }

    pub fn at_most(max: usize) -> Quota {
        Quota::new(Some(max), Holdings::default())
    }

    /// A connection of a server: at most `max` processes, and what its
    /// capabilities hold counted within `server`'s holdings.
    pub fn for_connection(max: Option<usize>, server: &ServerHoldings) -> Quota {
        Quota::new(max, server.connection())
    }

    fn new(max: Option<usize>, holdings: Holdings) -> Quota {
        Quota(Rc::new(State {
            held: Cell::new(0),
            max,
            connection: std::cell::RefCell::new(Rc::from("embedded")),
            files: FileLimits::new(holdings.clone()),
            ports: crate::rpc::port_quota::PortQuota::new(Default::default(), holdings.clone()),
            received: None,
            holdings,
        }))
    }

    /// Gives the connection `limits` on its port connections and
    /// listeners (before any is opened).
    pub fn with_port_limits(mut self, limits: crate::rpc::PortLimits) -> Quota {
        if let Some(state) = Rc::get_mut(&mut self.0) {
            state.ports = crate::rpc::port_quota::PortQuota::new(limits, state.holdings.clone());
        }
        self
    }

    /// The connection's account of what its capabilities hold.
    pub(crate) fn holdings(&self) -> &Holdings {
        &self.0.holdings
    }

    /// Lets the connection's starts take the descriptors its peer sent
    /// (before any executor has the quota).
    pub fn with_received_descriptors(mut self, received: crate::rpc::ReceivedDescriptors) -> Quota {
        if let Some(state) = Rc::get_mut(&mut self.0) {
            state.received = Some(received);
        }
        self
    }

    /// Lets the connection's dials have direct channels (a Unix socket's),
    /// with tickets from `channels`.
    pub fn with_direct_channels(mut self, channels: crate::rpc::DirectChannels) -> Quota {
        if let Some(state) = Rc::get_mut(&mut self.0) {
            state.ports = std::mem::take(&mut state.ports).with_direct_channels(channels);
        }
        self
    }

    /// The descriptors the connection's peer sent, if it can send any.
    pub(crate) fn received_descriptors(&self) -> Option<&crate::rpc::ReceivedDescriptors> {
        self.0.received.as_ref()
    }

    /// Names the connection whose allowance this is (its number and peer),
    /// for the admin's process list.
    pub fn owned_by(self, connection: &str) -> Quota {
        *self.0.connection.borrow_mut() = Rc::from(connection);
        self
    }

    /// The connection's allowance of file transfers and watches.
    pub(crate) fn files(&self) -> &FileLimits {
        &self.0.files
    }

    /// The connection's allowance of port connections and listeners.
    pub(crate) fn ports(&self) -> &crate::rpc::port_quota::PortQuota {
        &self.0.ports
    }

    /// One more process, or the limit's error; the ticket gives it back when
    /// it drops (with the process's last share).
    pub(crate) fn take(&self) -> Result<Ticket, Refusal> {
        let held = self.0.held.get();
        if let Some(max) = self.0.max
            && held >= max
        {
            return Err(Refusal::new(
                RefusalKind::LimitReached,
                format!("this connection already holds its maximum of {max} processes"),
            ));
        }
        self.0.held.set(held + 1);
        Ok(Ticket(Rc::clone(&self.0)))
    }
}

/// One process counted against a [`Quota`].
pub(crate) struct Ticket(Rc<State>);

impl Ticket {
    /// The connection whose quota this counts against.
    pub(crate) fn connection(&self) -> Rc<str> {
        Rc::clone(&self.0.connection.borrow())
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.held.set(self.0.held.get().saturating_sub(1));
    }
}
