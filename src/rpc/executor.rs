//! The server's own `Executor`s: the root one (what a connection
//! bootstraps or logs in to), whose `start` goes to the default
//! environment, and "local", whose `start` always uses this server's engine.

use std::rc::Rc;

use capnp::capability::Rc as ServerRc;

use crate::capexec_capnp::executor;
use crate::engine::Engine;
use crate::rpc::convert;
use crate::rpc::detach::Held;
use crate::rpc::environments::{Environments, Place};
use crate::rpc::forward::{self, ForwardingExecutor};
use crate::rpc::info;
use crate::rpc::process::ProcessImpl;
use crate::rpc::quota::Quota;

pub struct ExecutorImpl {
    environments: Rc<Environments>,
    starts_at: Place,
    quota: Quota,
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
        let ticket = self
            .quota
            .take()
            .map_err(|error| convert::start_error_to_wire(&error))?;
        let owner = self
            .engine()
            .start(&spec)
            .map_err(|error| convert::start_error_to_wire(&error))?;
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
        info::info_to_wire(&info::local_info(), results.get().init_info());
        Ok(())
    }

    async fn environments(
        self: ServerRc<Self>,
        _: executor::EnvironmentsParams,
        mut results: executor::EnvironmentsResults,
    ) -> Result<(), capnp::Error> {
        let statuses = self.environments.statuses();
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
        let executor: executor::Client = match self.environments.place(name)? {
            Place::Local => capnp_rpc::new_client(ExecutorImpl {
                environments: Rc::clone(&self.environments),
                starts_at: Place::Local,
                quota: self.quota.clone(),
            }),
            Place::Upstream(upstream) => capnp_rpc::new_client(ForwardingExecutor::new(upstream)),
        };
        results.get().set_executor(executor);
        Ok(())
    }
}
