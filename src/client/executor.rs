//! Executor-level calls: choosing an environment, listing them, asking
//! an executor what it supports, and restricting one.

use crate::capexec_capnp::executor;
use crate::client::Error;
use crate::model::{EnvironmentStatus, ExecutorInfo, Policy};
use crate::wire;

/// The executor of environment `path` as seen from `executor`: a name
/// ("build"), or names joined by "/" to go through several hops
/// ("bastion/build"). Pipelined: it costs no round trip by itself, and a
/// start on the result travels in the same trip. An unknown name makes calls
/// on the result fail with [`crate::model::RefusalKind::UnknownEnvironment`].
pub fn environment(executor: &executor::Client, path: &str) -> executor::Client {
    path.split('/').fold(executor.clone(), |executor, name| {
        let mut request = executor.environment_request();
        request.get().set_name(name);
        request.send().pipeline.get_executor()
    })
}

/// The environments `executor`'s server offers, with their states.
pub async fn environments(executor: &executor::Client) -> Result<Vec<EnvironmentStatus>, Error> {
    let response = executor.environments_request().send().promise.await?;
    Ok(wire::environments_from_wire(
        response.get()?.get_environments()?,
    )?)
}

/// What `executor` reports about where its processes run.
pub async fn info(executor: &executor::Client) -> Result<ExecutorInfo, Error> {
    let response = executor.info_request().send().promise.await?;
    Ok(wire::info_from_wire(response.get()?.get_info()?)?)
}

/// An executor that can only do what `policy` allows, on top of what
/// `executor` allows (see [`crate::model::Policy`] and the schema's
/// `Executor.restrict`). Pipelined like [`environment`]: a policy the server
/// refuses makes calls on the result fail with that error
/// ([`crate::model::RefusalKind::NotAllowed`] or
/// [`crate::model::RefusalKind::InvalidArgument`]); call [`info`] on it to
/// find out at once.
pub fn restrict(executor: &executor::Client, policy: &Policy) -> executor::Client {
    let mut request = executor.restrict_request();
    wire::policy_to_wire(policy, request.get().init_policy());
    request.send().pipeline.get_executor()
}
