//! Forwarding an `Executor` to an upstream without costing round trips.
//!
//! A capability that merely passes through a server keeps working, but
//! capnp-rpc (level 1, no tail calls) answers a forwarded call only when the
//! upstream has answered, so calls pipelined on its result wait a full round
//! trip at this hop. These forwarders instead send the upstream call, publish
//! its pipelined result at once (`set_pipeline`), and only then wait for the
//! answer: calls pipelined on `start(...).process` or
//! `environment(...).executor` go on to the upstream immediately, and a
//! chain of any depth costs one trip per hop.

use std::rc::Rc;

use capnp::capability::Rc as ServerRc;

use crate::capexec_capnp::executor;
use crate::model::{StartError, StartErrorKind};
use crate::rpc::convert;
use crate::rpc::environments::Upstream;
use crate::rpc::info;

/// What a forwarder sends its calls to.
#[derive(Clone)]
pub(crate) enum Target {
    /// An upstream's root executor, reached through its link.
    Upstream(Rc<dyn Upstream>),
    /// An executor obtained from the upstream (possibly still a promise).
    Executor(executor::Client),
}

/// An executor whose every method runs at the far end of the link `hop`.
pub(crate) struct ForwardingExecutor {
    target: Target,
    /// Name of the upstream whose link the calls cross.
    hop: String,
}

impl ForwardingExecutor {
    pub(crate) fn new(target: Target, hop: String) -> ForwardingExecutor {
        ForwardingExecutor { target, hop }
    }

    async fn target(&self) -> Result<executor::Client, capnp::Error> {
        match &self.target {
            Target::Upstream(upstream) => Rc::clone(upstream).executor().await,
            Target::Executor(client) => Ok(client.clone()),
        }
    }

    /// A broken link is the upstream's failure, not the caller's connection:
    /// say which hop broke, tagged so that clients classify it.
    fn hop_error(&self, error: capnp::Error) -> capnp::Error {
        if error.kind != capnp::ErrorKind::Disconnected {
            return error;
        }
        convert::start_error_to_wire(&StartError::new(
            StartErrorKind::UpstreamUnavailable,
            format!(
                "the connection to upstream {:?} was lost: {}",
                self.hop,
                convert::describe(&error)
            ),
        ))
    }
}

/// `start` at the far end of `forwarder`, with calls pipelined on the new
/// process forwarded before the upstream answers.
pub(crate) async fn start(
    forwarder: &ForwardingExecutor,
    params: executor::StartParams,
    mut results: executor::StartResults,
) -> Result<(), capnp::Error> {
    let upstream = forwarder.target().await?;
    let mut request = upstream.start_request();
    request.get().set_params(params.get()?.get_params()?)?;
    let call = request.send();
    results.get().set_process(call.pipeline.get_process());
    results.set_pipeline()?;
    call.promise
        .await
        .map_err(|error| forwarder.hop_error(error))?;
    Ok(())
}

pub(crate) async fn info(
    forwarder: &ForwardingExecutor,
    mut results: executor::InfoResults,
) -> Result<(), capnp::Error> {
    let upstream = forwarder.target().await?;
    let response = upstream
        .info_request()
        .send()
        .promise
        .await
        .map_err(|error| forwarder.hop_error(error))?;
    let far = info::info_from_wire(response.get()?.get_info()?)?;
    let seen = info::seen_through_hop(far, &forwarder.hop);
    info::info_to_wire(&seen, results.get().init_info());
    Ok(())
}

impl executor::Server for ForwardingExecutor {
    async fn start(
        self: ServerRc<Self>,
        params: executor::StartParams,
        results: executor::StartResults,
    ) -> Result<(), capnp::Error> {
        start(&self, params, results).await
    }

    async fn info(
        self: ServerRc<Self>,
        _: executor::InfoParams,
        results: executor::InfoResults,
    ) -> Result<(), capnp::Error> {
        info(&self, results).await
    }

    async fn environments(
        self: ServerRc<Self>,
        _: executor::EnvironmentsParams,
        mut results: executor::EnvironmentsResults,
    ) -> Result<(), capnp::Error> {
        let upstream = self.target().await?;
        let response = upstream
            .environments_request()
            .send()
            .promise
            .await
            .map_err(|error| self.hop_error(error))?;
        results
            .get()
            .set_environments(response.get()?.get_environments()?)?;
        Ok(())
    }

    async fn environment(
        self: ServerRc<Self>,
        params: executor::EnvironmentParams,
        mut results: executor::EnvironmentResults,
    ) -> Result<(), capnp::Error> {
        let upstream = self.target().await?;
        let mut request = upstream.environment_request();
        request.get().set_name(params.get()?.get_name()?);
        let call = request.send();
        // A local forwarder, not the bare promise: starts made on it keep
        // their pipelining across this hop too.
        let far = ForwardingExecutor::new(
            Target::Executor(call.pipeline.get_executor()),
            self.hop.clone(),
        );
        results.get().set_executor(capnp_rpc::new_client(far));
        results.set_pipeline()?;
        call.promise.await.map_err(|error| self.hop_error(error))?;
        Ok(())
    }
}
