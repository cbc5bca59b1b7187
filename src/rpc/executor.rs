//! The server's own `Executor`s: the root one (what a connection
//! bootstraps or logs in to), whose `start` goes to the default
//! environment; "local", whose `start` always uses this server's engine;
//! and restricted ones, "local" with rules every start must satisfy.

use std::rc::Rc;

use capnp::capability::Rc as ServerRc;

use crate::capexec_capnp::executor;
use crate::engine::{Engine, Rules};
use crate::model::{LOCAL_ENVIRONMENT, StartError, StartErrorKind};
use crate::rpc::convert;
use crate::rpc::detach::Held;
use crate::rpc::environments::{Environments, Place};
use crate::rpc::forward::{self, ForwardingExecutor};
use crate::rpc::info;
use crate::rpc::policy::policy_from_wire;
use crate::rpc::process::ProcessImpl;
use crate::rpc::quota::Quota;

pub struct ExecutorImpl {
    environments: Rc<Environments>,
    starts_at: Place,
    quota: Quota,
    /// Restricted executors (always local): what every start must satisfy.
    rules: Option<Rc<Rules>>,
}

impl ExecutorImpl {
    /// The root executor of a server with `environments`, whose local starts
    /// count against `quota`.
    pub fn root(environments: Rc<Environments>, quota: Quota) -> ExecutorImpl {
        let starts_at = environments.default_place();
        ExecutorImpl {
            environments,
            starts_at,
            quota,
            rules: None,
        }
    }

    fn local(&self, rules: Option<Rc<Rules>>) -> ExecutorImpl {
        ExecutorImpl {
            environments: Rc::clone(&self.environments),
            starts_at: Place::Local,
            quota: self.quota.clone(),
            rules,
        }
    }

    /// A forwarder for starts (and info) that go to an upstream.
    fn forwarder(&self) -> Option<ForwardingExecutor> {
        match &self.starts_at {
            Place::Local => None,
            Place::Upstream(upstream) => Some(ForwardingExecutor::new(Rc::clone(upstream))),
        }
    }

    fn engine(&self) -> &Engine {
        self.environments.engine()
    }
}

/// The in-process executor: the same capability remote clients get, served
/// by `engine` in this process (its only environment is "local").
pub fn local_executor(engine: Engine) -> executor::Client {
    root_executor(
        Rc::new(Environments::local_only(engine)),
        Quota::unlimited(),
    )
}

/// The root executor of a server whose every start must satisfy `rules`
/// (always local: a restricted server has no upstreams), for a connection
/// whose starts may hold `quota` processes at once.
pub fn restricted_root_executor(
    environments: Rc<Environments>,
    quota: Quota,
    rules: Rc<Rules>,
) -> executor::Client {
    capnp_rpc::new_client(ExecutorImpl {
        environments,
        starts_at: Place::Local,
        quota,
        rules: Some(rules),
    })
}

/// The root executor of a server with `environments`, for a connection
/// whose local starts may hold `quota` processes at once.
pub fn root_executor(environments: Rc<Environments>, quota: Quota) -> executor::Client {
    capnp_rpc::new_client(ExecutorImpl::root(environments, quota))
}

impl executor::Server for ExecutorImpl {
    async fn start(
        self: ServerRc<Self>,
        params: executor::StartParams,
        mut results: executor::StartResults,
    ) -> Result<(), capnp::Error> {
        if let Some(forwarder) = self.forwarder() {
            return forward::start(&forwarder, params, results).await;
        }
        let params = params.get()?.get_params()?;
        let spec = convert::start_spec_from_wire(params)
            .map_err(|error| convert::start_error_to_wire(&error))?;
        let (spec, admission) = match &self.rules {
            Some(rules) => {
                let (spec, admission) = rules
                    .admit(&spec)
                    .map_err(|error| convert::start_error_to_wire(&error))?;
                (spec, Some(admission))
            }
            None => (spec, None),
        };
        let ticket = self
            .quota
            .take()
            .map_err(|error| convert::start_error_to_wire(&error))?;
        let owner = self
            .engine()
            .start(&spec)
            .map_err(|error| convert::start_error_to_wire(&error))?;
        if let Some(admission) = admission {
            owner.handle().hold_while_running(admission);
        }
        results
            .get()
            .set_process(capnp_rpc::new_client(ProcessImpl::new(Held::new(
                owner,
                self.environments.detachments(),
                ticket,
            ))));
        Ok(())
    }

    async fn restore(
        self: ServerRc<Self>,
        params: executor::RestoreParams,
        mut results: executor::RestoreResults,
    ) -> Result<(), capnp::Error> {
        if let Some(forwarder) = self.forwarder() {
            return forward::restore(&forwarder, params, results).await;
        }
        let token = params.get()?.get_token()?.to_str()?;
        // Taken first, so a refused restore leaves the process parked.
        let ticket = self
            .quota
            .take()
            .map_err(|error| convert::start_error_to_wire(&error))?;
        let held = self.environments.detachments().restore(token)?;
        held.count_against(ticket);
        results
            .get()
            .set_process(capnp_rpc::new_client(ProcessImpl::new(held)));
        Ok(())
    }

    async fn info(
        self: ServerRc<Self>,
        _: executor::InfoParams,
        mut results: executor::InfoResults,
    ) -> Result<(), capnp::Error> {
        if let Some(forwarder) = self.forwarder() {
            return forward::info(&forwarder, results).await;
        }
        let mut info = info::local_info();
        if self.rules.is_some() {
            info.features.push(info::RESTRICTED_FEATURE.to_string());
        }
        info::info_to_wire(&info, results.get().init_info());
        Ok(())
    }

    async fn environments(
        self: ServerRc<Self>,
        _: executor::EnvironmentsParams,
        mut results: executor::EnvironmentsResults,
    ) -> Result<(), capnp::Error> {
        let mut statuses = self.environments.statuses();
        if self.rules.is_some() {
            // Only "local", where all of its starts go.
            statuses.truncate(1);
            for status in &mut statuses {
                status.is_default = true;
            }
        }
        let list = results.get().init_environments(statuses.len() as u32);
        info::environments_to_wire(&statuses, list);
        Ok(())
    }

    async fn environment(
        self: ServerRc<Self>,
        params: executor::EnvironmentParams,
        mut results: executor::EnvironmentResults,
    ) -> Result<(), capnp::Error> {
        let name = params.get()?.get_name()?.to_str()?;
        if let Some(rules) = &self.rules {
            // Nothing but itself: other environments are not its to give.
            if name != LOCAL_ENVIRONMENT {
                return Err(convert::start_error_to_wire(&StartError::new(
                    StartErrorKind::NotAllowed,
                    format!(
                        "a restricted executor offers no environment but {:?} (asked for {:?})",
                        LOCAL_ENVIRONMENT,
                        crate::model::excerpt(name)
                    ),
                )));
            }
            let itself = self.local(Some(Rc::clone(rules)));
            results.get().set_executor(capnp_rpc::new_client(itself));
            return Ok(());
        }
        let executor: executor::Client = match self.environments.place(name)? {
            Place::Local => capnp_rpc::new_client(self.local(None)),
            Place::Upstream(upstream) => capnp_rpc::new_client(ForwardingExecutor::new(upstream)),
        };
        results.get().set_executor(executor);
        Ok(())
    }

    async fn restrict(
        self: ServerRc<Self>,
        params: executor::RestrictParams,
        results: executor::RestrictResults,
    ) -> Result<(), capnp::Error> {
        if let Some(forwarder) = self.forwarder() {
            return forward::restrict(&forwarder, params, results).await;
        }
        let policy = policy_from_wire(params.get()?.get_policy()?)
            .map_err(|error| convert::start_error_to_wire(&error))?;
        let current = self.rules.as_deref().cloned().unwrap_or_default();
        let rules = current
            .narrowed(&policy)
            .map_err(|error| convert::start_error_to_wire(&error))?;
        let mut results = results;
        results
            .get()
            .set_executor(capnp_rpc::new_client(self.local(Some(Rc::new(rules)))));
        Ok(())
    }
}
