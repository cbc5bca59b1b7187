//! How many processes the starts of one connection may hold at once.

use std::cell::Cell;
use std::rc::Rc;

use crate::model::{Refusal, RefusalKind};

/// A connection's allowance of live processes, shared by every executor
/// reached from its root (the "local" environment included).
#[derive(Clone)]
pub struct Quota(Rc<State>);

struct State {
    held: Cell<usize>,
    max: Option<usize>,
    /// The connection's port connections and listeners.
    ports: crate::rpc::port_quota::PortQuota,
}

impl Quota {
    /// No limit (the embedded executor; the server's own limit still holds).
    pub fn unlimited() -> Quota {
        Quota(Rc::new(State {
            held: Cell::new(0),
            max: None,
            ports: Default::default(),
        }))
    }

    pub fn at_most(max: usize) -> Quota {
        Quota(Rc::new(State {
            held: Cell::new(0),
            max: Some(max),
            ports: Default::default(),
        }))
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

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.held.set(self.0.held.get().saturating_sub(1));
    }
}
