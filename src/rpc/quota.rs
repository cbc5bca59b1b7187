//! A connection's allowance: how many processes its starts may hold at
//! once, its file transfers and watches, its port connections and
//! listeners, the descriptors its peer may pass, and what its capabilities
//! hold. Built once, by [`AllowanceBuilder`], before any executor has it;
//! the process count is a semaphore whose permit is the [`Ticket`].

use std::rc::Rc;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::model::{Refusal, RefusalKind};
use crate::rpc::file_limits::FileLimits;
use crate::rpc::holdings::{Holdings, ServerHoldings};
use crate::rpc::port_quota::{PortLimits, PortQuota};

/// A connection's allowance, shared by every executor reached from its
/// root (the "local" environment included).
#[derive(Clone)]
pub struct Quota(Rc<State>);

struct State {
    /// The processes it may still start; `None`: no limit of its own (the
    /// server's still holds).
    processes: Option<(Arc<Semaphore>, usize)>,
    /// Who the connection is, as the admin's process list names it.
    connection: Rc<str>,
    /// The connection's file transfers and watches.
    files: FileLimits,
    /// The connection's port connections and listeners.
    ports: PortQuota,
    /// What the connection's peer sent to be its children's standard
    /// descriptors: only a Unix socket's peer (and an in-process client)
    /// can.
    received: Option<crate::rpc::ReceivedDescriptors>,
    /// What the connection's capabilities hold (descriptors, memory).
    holdings: Holdings,
}

/// What a [`Quota`] is made of, given before it is built.
pub struct AllowanceBuilder {
    max_processes: Option<usize>,
    holdings: Holdings,
    port_limits: PortLimits,
    received: Option<crate::rpc::ReceivedDescriptors>,
    direct: Option<crate::rpc::DirectChannels>,
    connection: Rc<str>,
}

impl AllowanceBuilder {
    /// Limits on the connection's port connections and listeners.
    pub fn port_limits(mut self, limits: PortLimits) -> AllowanceBuilder {
        self.port_limits = limits;
        self
    }

    /// Lets the connection's starts take the descriptors its peer sent.
    pub fn received_descriptors(
        mut self,
        received: crate::rpc::ReceivedDescriptors,
    ) -> AllowanceBuilder {
        self.received = Some(received);
        self
    }

    /// Lets the connection's dials have direct channels (a Unix socket's),
    /// with tickets from `channels`.
    pub fn direct_channels(mut self, channels: crate::rpc::DirectChannels) -> AllowanceBuilder {
        self.direct = Some(channels);
        self
    }

    /// Names the connection (its number and peer), for the admin's
    /// process list.
    pub fn owned_by(mut self, connection: &str) -> AllowanceBuilder {
        self.connection = Rc::from(connection);
        self
    }

    pub fn build(self) -> Quota {
        let AllowanceBuilder {
            max_processes,
            holdings,
            port_limits,
            received,
            direct,
            connection,
        } = self;
        Quota(Rc::new(State {
            processes: max_processes.map(|max| {
                (
                    Arc::new(Semaphore::new(max.min(Semaphore::MAX_PERMITS))),
                    max,
                )
            }),
            connection,
            files: FileLimits::new(holdings.clone()),
            ports: PortQuota::new(port_limits, holdings.clone(), direct),
            received,
            holdings,
        }))
    }
}

impl Quota {
    /// No limit on processes (the embedded executor; the server's own
    /// limit still holds), and an account of its own for what its
    /// capabilities hold.
    pub fn unlimited() -> Quota {
        Quota::builder(None, Holdings::default()).build()
    }

    pub fn at_most(max: usize) -> Quota {
        Quota::builder(Some(max), Holdings::default()).build()
    }

    /// A connection of a server: at most `max` processes, and what its
    /// capabilities hold counted within `server`'s holdings; the rest is
    /// given to the builder.
    pub fn for_connection(max: Option<usize>, server: &ServerHoldings) -> AllowanceBuilder {
        Quota::builder(max, server.connection())
    }

    /// An allowance of at most `max_processes` (none: no limit of its
    /// own), counting what its capabilities hold in `holdings`.
    pub(crate) fn builder(max_processes: Option<usize>, holdings: Holdings) -> AllowanceBuilder {
        AllowanceBuilder {
            max_processes,
            holdings,
            port_limits: PortLimits::default(),
            received: None,
            direct: None,
            connection: Rc::from("embedded"),
        }
    }

    /// The connection's account of what its capabilities hold.
    pub(crate) fn holdings(&self) -> &Holdings {
        &self.0.holdings
    }

    /// The descriptors the connection's peer sent, if it can send any.
    pub(crate) fn received_descriptors(&self) -> Option<&crate::rpc::ReceivedDescriptors> {
        self.0.received.as_ref()
    }

    /// The connection's allowance of file transfers and watches.
    pub(crate) fn files(&self) -> &FileLimits {
        &self.0.files
    }

    /// The connection's allowance of port connections and listeners.
    pub(crate) fn ports(&self) -> &PortQuota {
        &self.0.ports
    }

    /// One more process, or the limit's error; the ticket gives it back when
    /// it drops (with the process's last share).
    pub(crate) fn take(&self) -> Result<Ticket, Refusal> {
        let permit = match &self.0.processes {
            None => None,
            Some((processes, max)) => {
                Some(Arc::clone(processes).try_acquire_owned().map_err(|_| {
                    Refusal::new(
                        RefusalKind::LimitReached,
                        format!("this connection already holds its maximum of {max} processes"),
                    )
                })?)
            }
        };
        Ok(Ticket {
            _permit: permit,
            connection: Rc::clone(&self.0.connection),
        })
    }
}

/// One process counted against a [`Quota`]: its permit, given back when
/// the ticket drops.
pub(crate) struct Ticket {
    _permit: Option<OwnedSemaphorePermit>,
    connection: Rc<str>,
}

impl Ticket {
    /// The connection whose quota this counts against.
    pub(crate) fn connection(&self) -> Rc<str> {
        Rc::clone(&self.connection)
    }
}
