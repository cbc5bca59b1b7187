//! The forwards made through one `Process` capability, ended when it is
//! released.

use std::cell::RefCell;
use std::future::Future;
use std::rc::{Rc, Weak};

use capnp::Error;

use super::connection::Connection;
use super::dial::dial;
use super::listen::Listener;
use super::listen::listen;
use super::{DialParams, DialResults, ListenParams, ListenResults, port_rules};
use crate::model::{Refusal, RefusalKind};
use crate::policy::Rules;
use crate::rpc::port_quota::PortQuota;

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
    pub(super) fn add_connection(&self, connection: &Rc<Connection>) {
        let mut list = self.connections.borrow_mut();
        list.retain(|weak| weak.strong_count() > 0);
        list.push(Rc::downgrade(connection));
    }

    pub(super) fn add_listener(&self, listener: &Rc<Listener>) {
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
pub(super) fn tied_to(tie: Option<&Weak<Tied>>) -> Result<Option<Rc<Tied>>, Refusal> {
    match tie {
        None => Ok(None),
        Some(tie) => tie
            .upgrade()
            .map(Some)
            .ok_or_else(|| Refusal::new(RefusalKind::SocketFailed, PROCESS_RELEASED)),
    }
}
