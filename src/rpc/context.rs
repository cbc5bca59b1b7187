//! What every executor of one server shares: the engine, the environments
//! the server offers (its own engine, "local", and the upstream executors
//! it forwards to) and the registry of its detachable processes. How an
//! upstream is reached (sockets, logins, reconnecting) is the network
//! layer's business; this layer only needs its executor capability and its
//! state.

use std::rc::Rc;
use std::time::Duration;

use futures::future::LocalBoxFuture;

use crate::capexec_capnp::executor;
use crate::engine::Engine;
use crate::model::{
    EnvironmentState, EnvironmentStatus, LOCAL_ENVIRONMENT, Refusal, RefusalKind,
    valid_environment_name,
};
use crate::rpc::detach::{DEFAULT_RETENTION, Detachments};

/// An upstream's executor on one connection to it.
#[derive(Clone)]
pub struct Link {
    pub executor: executor::Client,
    /// Changes with every new connection, so that capabilities obtained
    /// through an older one can be told apart and fetched again.
    pub generation: u64,
}

/// An executor on another server that this one forwards to.
pub trait Upstream {
    /// The environment name clients use for it.
    fn name(&self) -> &str;
    /// Where it is, for people (`unix:PATH`, `tcp:HOST:PORT`).
    fn address(&self) -> String;
    fn state(&self) -> EnvironmentState;
    /// Its executor, connecting first if needed. A failure is an error
    /// ready for the caller, tagged `[capexec:upstream-unavailable]` (or
    /// `[capexec:unavailable]` once closed).
    fn executor(self: Rc<Self>) -> LocalBoxFuture<'static, Result<Link, capnp::Error>>;
    /// Closes the connection for good, releasing what was started through
    /// it; later uses fail.
    fn close(&self);
}

/// Where an executor's `start` runs.
#[derive(Clone)]
pub(crate) enum Place {
    Local,
    Upstream(Rc<dyn Upstream>),
}

/// One server's engine, environments and detachable processes.
pub struct ServerContext {
    engine: Engine,
    upstreams: Vec<Rc<dyn Upstream>>,
    /// Index into `upstreams` of the default environment; `None`: local.
    default: Option<usize>,
    detachments: Rc<Detachments>,
    /// Every process the connections hold, for the admin capability.
    processes: crate::rpc::ProcessTable,
    /// What every connection's capabilities hold together (descriptors,
    /// memory), within the server's limits.
    holdings: crate::rpc::ServerHoldings,
    /// Where `Admin.upgrade` asks for an upgrade, when the server can be
    /// upgraded (see `net/server/upgrade.rs`).
    upgrades: std::cell::RefCell<Option<tokio::sync::mpsc::UnboundedSender<UpgradeRequest>>>,
    /// Why the upgrade that started this binary did not execute the new
    /// one (this binary took everything back), for `Admin.lastUpgrade`.
    failed_upgrade: std::cell::RefCell<Option<String>>,
}

/// An upgrade asked for; `Some`: who waits for whether the new binary
/// took it (an error says why not, and the server keeps serving).
pub type UpgradeRequest = Option<tokio::sync::oneshot::Sender<Result<(), String>>>;

impl ServerContext {
    /// Only the server's own engine.
    pub fn local_only(engine: Engine) -> ServerContext {
        ServerContext {
            engine,
            upstreams: Vec::new(),
            default: None,
            detachments: Detachments::new(DEFAULT_RETENTION),
            processes: crate::rpc::ProcessTable::default(),
            holdings: crate::rpc::ServerHoldings::new(crate::rpc::HoldingLimits::of_this_process()),
            upgrades: std::cell::RefCell::new(None),
            failed_upgrade: std::cell::RefCell::new(None),
        }
    }

    /// The engine plus `upstreams`; plain `start` goes to `default` (an
    /// upstream's name, or "local"), or to the engine if `None`. Finished
    /// detached processes stay restorable for `retention`.
    pub fn new(
        engine: Engine,
        upstreams: Vec<Rc<dyn Upstream>>,
        default: Option<&str>,
        retention: Duration,
    ) -> Result<ServerContext, String> {
        let names: Vec<&str> = upstreams.iter().map(|upstream| upstream.name()).collect();
        let default = check_names(&names, default)?;
        Ok(ServerContext {
            engine,
            upstreams,
            default,
            detachments: Detachments::new(retention),
            processes: crate::rpc::ProcessTable::default(),
            holdings: crate::rpc::ServerHoldings::new(crate::rpc::HoldingLimits::of_this_process()),
            upgrades: std::cell::RefCell::new(None),
            failed_upgrade: std::cell::RefCell::new(None),
        })
    }

    /// The same, with `limits` on what every connection's capabilities
    /// hold together.
    pub fn with_holding_limits(mut self, limits: crate::rpc::HoldingLimits) -> ServerContext {
        self.holdings = crate::rpc::ServerHoldings::new(limits);
        self
    }

    /// What every connection's capabilities hold together.
    pub fn holdings(&self) -> &crate::rpc::ServerHoldings {
        &self.holdings
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The processes of this server that may outlive their references.
    pub fn processes(&self) -> &crate::rpc::ProcessTable {
        &self.processes
    }

    /// Lets `Admin.upgrade` ask for upgrades through `requests`.
    pub fn serve_upgrades(&self, requests: tokio::sync::mpsc::UnboundedSender<UpgradeRequest>) {
        *self.upgrades.borrow_mut() = Some(requests);
    }

    /// Notes why the upgrade that started this binary did not execute
    /// the new one (the hand-over came back to the binary before).
    pub fn note_failed_upgrade(&self, why: String) {
        *self.failed_upgrade.borrow_mut() = Some(why);
    }

    /// Why the last upgrade did not execute the new binary, if it did not.
    pub fn failed_upgrade(&self) -> Option<String> {
        self.failed_upgrade.borrow().clone()
    }

    /// Asks for an upgrade; says whether the new binary took it.
    pub async fn upgrade(&self) -> Result<(), Refusal> {
        let unavailable = |why: String| Refusal::new(RefusalKind::Unavailable, why);
        let (answer, answered) = tokio::sync::oneshot::channel();
        let sent = self
            .upgrades
            .borrow()
            .as_ref()
            .is_some_and(|requests| requests.send(Some(answer)).is_ok());
        if !sent {
            return Err(unavailable(
                "this server cannot be upgraded in place (it was not started by `capexec serve`)"
                    .into(),
            ));
        }
        match answered.await {
            Ok(result) => result.map_err(unavailable),
            Err(_) => Err(unavailable("the server stopped before it answered".into())),
        }
    }

    pub fn detachments(&self) -> &Rc<Detachments> {
        &self.detachments
    }

    /// Where plain `start` on the root executor runs.
    pub(crate) fn default_place(&self) -> Place {
        match self.default {
            None => Place::Local,
            Some(index) => Place::Upstream(Rc::clone(&self.upstreams[index])),
        }
    }

    /// The environment called `name`.
    pub(crate) fn place(&self, name: &str) -> Result<Place, Refusal> {
        if name == LOCAL_ENVIRONMENT {
            return Ok(Place::Local);
        }
        match self
            .upstreams
            .iter()
            .find(|upstream| upstream.name() == name)
        {
            Some(upstream) => Ok(Place::Upstream(Rc::clone(upstream))),
            None => {
                let known: Vec<&str> = std::iter::once(LOCAL_ENVIRONMENT)
                    .chain(self.upstreams.iter().map(|upstream| upstream.name()))
                    .collect();
                Err(Refusal::new(
                    RefusalKind::UnknownEnvironment,
                    format!(
                        "no environment named {:?} (this server has: {})",
                        crate::model::excerpt(name),
                        known.join(", ")
                    ),
                ))
            }
        }
    }

    pub fn statuses(&self) -> Vec<EnvironmentStatus> {
        let local = EnvironmentStatus {
            name: LOCAL_ENVIRONMENT.to_string(),
            address: String::new(),
            is_default: self.default.is_none(),
            state: EnvironmentState::Local,
        };
        let upstreams =
            self.upstreams
                .iter()
                .enumerate()
                .map(|(index, upstream)| EnvironmentStatus {
                    name: upstream.name().to_string(),
                    address: upstream.address(),
                    is_default: self.default == Some(index),
                    state: upstream.state(),
                });
        std::iter::once(local).chain(upstreams).collect()
    }

    /// Closes every upstream connection.
    pub fn close_upstreams(&self) {
        for upstream in &self.upstreams {
            upstream.close();
        }
    }
}

/// Checks upstream environment names and the default's: every name valid
/// and given once, the default one of them or "local". Returns the index of
/// the default upstream (`None`: local).
pub fn check_names(names: &[&str], default: Option<&str>) -> Result<Option<usize>, String> {
    for (index, name) in names.iter().enumerate() {
        if !valid_environment_name(name) {
            return Err(format!(
                "invalid environment name {name:?}: use letters, digits, '-', '_' and '.', \
                 and not \"{LOCAL_ENVIRONMENT}\""
            ));
        }
        if names[..index].contains(name) {
            return Err(format!("environment {name:?} is given twice"));
        }
    }
    match default {
        None | Some(LOCAL_ENVIRONMENT) => Ok(None),
        Some(name) => names
            .iter()
            .position(|candidate| *candidate == name)
            .map(Some)
            .ok_or_else(|| format!("the default environment {name:?} is not defined")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert_eq!(check_names(&["b", "c"], Some("c")), Ok(Some(1)));
        assert_eq!(check_names(&["b"], Some("local")), Ok(None));
        assert_eq!(check_names(&[], None), Ok(None));
        assert!(check_names(&["local"], None).is_err());
        assert!(check_names(&["a/b"], None).is_err());
        assert!(check_names(&["b", "b"], None).is_err());
        assert!(check_names(&["b"], Some("x")).is_err());
    }
}
