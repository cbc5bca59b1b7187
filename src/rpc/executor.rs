//! `Executor`: starts processes on the local engine.

use capnp::capability::Rc;

use crate::capexec_capnp::executor;
use crate::engine::Engine;
use crate::rpc::convert;
use crate::rpc::process::ProcessImpl;

pub struct ExecutorImpl {
    engine: Engine,
}

impl ExecutorImpl {
    pub fn new(engine: Engine) -> ExecutorImpl {
        ExecutorImpl { engine }
    }
}

/// The in-process executor: the same capability remote clients get, served
/// by `engine` in this process.
pub fn local_executor(engine: Engine) -> executor::Client {
    capnp_rpc::new_client(ExecutorImpl::new(engine))
}

impl executor::Server for ExecutorImpl {
    async fn start(
        self: Rc<Self>,
        params: executor::StartParams,
        mut results: executor::StartResults,
    ) -> Result<(), capnp::Error> {
        let params = params.get()?.get_params()?;
        let spec = convert::start_spec_from_wire(params)
            .map_err(|error| convert::start_error_to_wire(&error))?;
        let owner = self
            .engine
            .start(&spec)
            .map_err(|error| convert::start_error_to_wire(&error))?;
        results
            .get()
            .set_process(capnp_rpc::new_client(ProcessImpl::new(owner)));
        Ok(())
    }
}
