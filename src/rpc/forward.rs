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
//!
//! Parameters go on whole (a field this server does not know yet reaches
//! the far end), with the hop's own cleared explicitly: descriptors passed
//! for stdio, a direct channel. Answers without a capability come back
//! whole, amended where the hop says something of its own (`info`). An
//! answer whose capability is published before the far end answers cannot
//! be copied whole afterwards (capnp 0.27's builder panics overwriting a
//! struct that holds a capability), so its other fields are copied by name:
//! `tests/it/method_table.rs` lists them from the schema, and a new one
//! fails it until it is forwarded here.
//!
//! Every `Executor` method is forwarded here once, in the
//! `executor::Server` impl: one line each through `rpc/forwarding.rs`
//! (the mechanism `Directory`'s forwarder shares), except those the hop
//! answers in part itself (`start` closes the descriptors passed for
//! stdio, `info` is amended, `environment` and `restrict` record the step
//! to take again after a reconnection, `environments` of a root is this
//! server's). A server's root executor whose default environment is an
//! upstream is a forwarder too (with the server's own environments for
//! `environments` and `environment`).

use std::cell::RefCell;
use std::rc::Rc;

use crate::capexec_capnp::executor;
use crate::model::{Refusal, RefusalKind};
use crate::rpc::context::{Link, ServerContext, Upstream};
use crate::rpc::forward_directory::ForwardingDirectory;
use crate::rpc::forwarding::{Forwarder, forward};
use crate::rpc::info;
use crate::rpc::quota::Quota;
use crate::wire;

/// A call's parameters as they came, kept to be sent again: fields this
/// server does not know of yet reach the far end all the same.
type Kept = Rc<capnp::message::Builder<capnp::message::HeapAllocator>>;

/// One step from the upstream's root executor to the one calls go to.
#[derive(Clone)]
enum Step {
    /// `environment(...)`, its parameters.
    Environment(Kept),
    /// `restrict(...)`, its parameters.
    Restrict(Kept),
}

/// `params` kept whole (see [`Kept`]).
fn kept<T: capnp::traits::Owned>(params: T::Reader<'_>) -> Result<Kept, capnp::Error> {
    let mut message = capnp::message::Builder::new_default();
    message.set_root::<T>(params)?;
    Ok(Rc::new(message))
}

/// Where a forwarder's far executor is.
enum Far {
    /// At the executor `path` leads to from the upstream's root executor
    /// (environments and restrictions).
    Upstream {
        upstream: Rc<dyn Upstream>,
        path: Vec<Step>,
        /// The far executor of `path` on one connection (by generation):
        /// fetched again, pipelined, once the link has reconnected.
        resolved: RefCell<Option<Link>>,
    },
    /// An executor the far end handed out otherwise (a forwarded
    /// directory's), on the connection it came on: it ends with it.
    Fixed {
        executor: executor::Client,
        hop: Rc<str>,
    },
}

/// An executor whose every method runs across the link to an upstream.
pub(crate) struct ForwardingExecutor {
    far: Far,
    /// Set for a server's root executor whose default environment is the
    /// upstream: `environments` and `environment` describe this server.
    root: Option<Root>,
    /// The descriptors the connection's peer sent for its starts' stdio:
    /// a forwarded start cannot take them to another machine, so it
    /// closes them here (the far end starts with pipes).
    received: Option<crate::rpc::ReceivedDescriptors>,
}

/// What a forwarding root executor answers itself.
struct Root {
    context: Rc<ServerContext>,
    /// The connection's allowance for processes of the "local" environment.
    quota: Quota,
}

impl ForwardingExecutor {
    pub(crate) fn new(upstream: Rc<dyn Upstream>) -> ForwardingExecutor {
        ForwardingExecutor::at_path(upstream, Vec::new())
    }

    /// The root executor of a server whose default environment is
    /// `upstream`.
    pub(crate) fn root(
        upstream: Rc<dyn Upstream>,
        context: Rc<ServerContext>,
        quota: Quota,
    ) -> ForwardingExecutor {
        ForwardingExecutor {
            received: quota.received_descriptors().cloned(),
            root: Some(Root { context, quota }),
            ..ForwardingExecutor::new(upstream)
        }
    }

    /// An executor forwarded to `upstream` for a connection with `quota`.
    pub(crate) fn for_connection(upstream: Rc<dyn Upstream>, quota: &Quota) -> ForwardingExecutor {
        ForwardingExecutor {
            received: quota.received_descriptors().cloned(),
            ..ForwardingExecutor::new(upstream)
        }
    }

    fn at_path(upstream: Rc<dyn Upstream>, path: Vec<Step>) -> ForwardingExecutor {
        ForwardingExecutor {
            far: Far::Upstream {
                upstream,
                path,
                resolved: RefCell::new(None),
            },
            root: None,
            received: None,
        }
    }

    /// The executor of a far directory (`Directory.executor` through a
    /// hop): starts on it keep their pipelining across this hop.
    pub(crate) fn of_far_directory(executor: executor::Client, hop: Rc<str>) -> ForwardingExecutor {
        ForwardingExecutor {
            far: Far::Fixed { executor, hop },
            root: None,
            received: None,
        }
    }

    fn hop(&self) -> &str {
        match &self.far {
            Far::Upstream { upstream, .. } => upstream.name(),
            Far::Fixed { hop, .. } => hop,
        }
    }

    /// The executor calls go to, on the link's current connection.
    async fn target(&self) -> Result<Link, capnp::Error> {
        let (upstream, path, resolved) = match &self.far {
            Far::Upstream {
                upstream,
                path,
                resolved,
            } => (upstream, path, resolved),
            Far::Fixed { executor, .. } => {
                return Ok(settled(Link {
                    executor: executor.clone(),
                    generation: 0,
                }));
            }
        };
        let root = Rc::clone(upstream).executor().await?;
        if path.is_empty() {
            return Ok(settled(root));
        }
        let mut resolved = resolved.borrow_mut();
        if let Some(link) = resolved
            .as_ref()
            .filter(|l| l.generation == root.generation)
        {
            return Ok(settled(link.clone()));
        }
        let executor = path
            .iter()
            .fold(root.executor, |executor, step| match step {
                Step::Environment(params) => {
                    let mut request = executor.environment_request();
                    match params
                        .get_root_as_reader()
                        .and_then(|params| request.set(params))
                    {
                        Ok(()) => request.send().pipeline.get_executor(),
                        Err(error) => executor::Client {
                            client: capnp_rpc::new_broken_cap(error),
                        },
                    }
                }
                Step::Restrict(params) => {
                    let mut request = executor.restrict_request();
                    // A copy this server already read once; should it fail
                    // now, the executor fails rather than go unrestricted.
                    match params
                        .get_root_as_reader()
                        .and_then(|params| request.set(params))
                    {
                        Ok(()) => request.send().pipeline.get_executor(),
                        Err(error) => executor::Client {
                            client: capnp_rpc::new_broken_cap(malformed_policy(&error)),
                        },
                    }
                }
            });
        let link = Link {
            executor,
            generation: root.generation,
        };
        *resolved = Some(link.clone());
        Ok(link)
    }

    /// A broken link is the upstream's failure, not the caller's connection:
    /// say which hop broke, tagged so that clients classify it.
    fn hop_error(&self, error: capnp::Error) -> capnp::Error {
        upstream_lost(self.hop(), error)
    }

    /// A local forwarder one step further, not the bare promise: starts
    /// made on it keep their pipelining across this hop, and it finds its
    /// far executor again (taking the same steps) after the link
    /// reconnects.
    fn step(&self, step: Step, far: executor::Client, generation: u64) -> ForwardingExecutor {
        let far = match &self.far {
            Far::Upstream { upstream, path, .. } => {
                let mut path = path.clone();
                path.push(step);
                Far::Upstream {
                    upstream: Rc::clone(upstream),
                    path,
                    resolved: RefCell::new(Some(Link {
                        executor: far,
                        generation,
                    })),
                }
            }
            Far::Fixed { hop, .. } => Far::Fixed {
                executor: far,
                hop: Rc::clone(hop),
            },
        };
        ForwardingExecutor {
            far,
            root: None,
            received: self.received.clone(),
        }
    }
}

impl Forwarder for ForwardingExecutor {
    type Far = executor::Client;

    async fn far(&self) -> Result<executor::Client, capnp::Error> {
        Ok(self.target().await?.executor)
    }

    fn lost(&self, error: capnp::Error) -> capnp::Error {
        self.hop_error(error)
    }

    fn hop(&self) -> Rc<str> {
        ForwardingExecutor::hop(self).into()
    }
}

/// `error` of a call to upstream `hop`: a broken link is the upstream's
/// failure, tagged `upstream-unavailable`; anything else as it came.
pub(crate) fn upstream_lost(hop: &str, error: capnp::Error) -> capnp::Error {
    if error.kind != capnp::ErrorKind::Disconnected {
        return error;
    }
    Refusal::new(
        RefusalKind::UpstreamUnavailable,
        format!(
            "the connection to upstream {hop:?} was lost ({})",
            wire::describe(&error)
        ),
    )
    .into()
}

/// `link` with its executor as what it has resolved to (see
/// [`crate::rpc::settled`]).
fn settled(link: Link) -> Link {
    Link {
        executor: crate::rpc::settled::settled(&link.executor),
        generation: link.generation,
    }
}

fn malformed_policy(error: &capnp::Error) -> capnp::Error {
    Refusal::new(
        RefusalKind::InvalidArgument,
        format!("malformed policy: {error}"),
    )
    .into()
}

impl executor::Server for ForwardingExecutor {
    /// `start` at the far end, with calls pipelined on the new process
    /// forwarded before the upstream answers.
    async fn start(
        self: Rc<Self>,
        params: executor::StartParams,
        mut results: executor::StartResults,
    ) -> Result<(), capnp::Error> {
        let params = params.get()?;
        let spec = params.get_params()?;
        if let (Some(received), Some(passed)) =
            (&self.received, wire::passed_stdio_from_wire(spec)?)
            && let Some(fds) = received.take(passed.first, passed.count())
        {
            // Closed now (off this thread): they stay on this machine,
            // the start does not.
            crate::engine::close_in_background(fds);
        }
        let upstream = self.target().await?.executor;
        let mut request = upstream.start_request();
        request.set(params).map_err(|error| {
            Refusal::new(
                RefusalKind::InvalidArgument,
                format!("malformed start parameters: {error}"),
            )
        })?;
        if spec.has_passed_stdio() {
            // Hop-local: the far end's numbers are this hop's, which
            // sends none.
            request.get().get_params()?.init_passed_stdio();
        }
        let call = request.send();
        results.get().set_process(call.pipeline.get_process());
        results.set_pipeline()?;
        // Its other field is hop-local: no descriptors were passed on
        // (this hop passes none), so stdioPassed stays false.
        call.promise.await.map_err(|error| self.hop_error(error))?;
        Ok(())
    }

    async fn info(
        self: Rc<Self>,
        _: executor::InfoParams,
        mut results: executor::InfoResults,
    ) -> Result<(), capnp::Error> {
        let upstream = self.target().await?.executor;
        let answer = upstream.info_request().send().promise.await;
        match answer {
            Ok(response) => {
                // Whole, then what this hop changes of it.
                let far = response.get()?;
                results.set(far)?;
                let seen =
                    info::seen_through_hop(wire::info_from_wire(far.get_info()?)?, self.hop());
                wire::hop_view_to_wire(&seen, results.get().get_info()?);
            }
            Err(error) if error.kind == capnp::ErrorKind::Unimplemented => {
                let seen = info::seen_through_hop(info::unknown_info(), self.hop());
                wire::info_to_wire(&seen, results.get().init_info());
            }
            Err(error) => return Err(self.hop_error(error)),
        }
        Ok(())
    }

    async fn environments(
        self: Rc<Self>,
        _: executor::EnvironmentsParams,
        mut results: executor::EnvironmentsResults,
    ) -> Result<(), capnp::Error> {
        if let Some(root) = &self.root {
            let statuses = root.context.statuses();
            let list = results.get().init_environments(statuses.len() as u32);
            wire::environments_to_wire(&statuses, list);
            return Ok(());
        }
        let upstream = self.target().await?.executor;
        let response = upstream
            .environments_request()
            .send()
            .promise
            .await
            .map_err(|error| self.hop_error(error))?;
        results.set(response.get()?)
    }

    async fn environment(
        self: Rc<Self>,
        params: executor::EnvironmentParams,
        mut results: executor::EnvironmentResults,
    ) -> Result<(), capnp::Error> {
        let params = params.get()?;
        if let Some(root) = &self.root {
            let name = params.get_name()?.to_str()?;
            let executor = crate::rpc::executor::environment(&root.context, &root.quota, name)?;
            results.get().set_executor(executor);
            return Ok(());
        }
        let kept = kept::<executor::environment_params::Owned>(params)?;
        let target = self.target().await?;
        let mut request = target.executor.environment_request();
        request.set(params)?;
        let call = request.send();
        let far = self.step(
            Step::Environment(kept),
            call.pipeline.get_executor(),
            target.generation,
        );
        results.get().set_executor(capnp_rpc::new_client(far));
        results.set_pipeline()?;
        call.promise.await.map_err(|error| self.hop_error(error))?;
        Ok(())
    }

    /// `restrict` at the far end, where the processes run and the policy is
    /// resolved, pipelined like `environment`.
    async fn restrict(
        self: Rc<Self>,
        params: executor::RestrictParams,
        mut results: executor::RestrictResults,
    ) -> Result<(), capnp::Error> {
        // Kept whole: the same restriction is asked for again on a new
        // connection after the link reconnects.
        let params = params.get()?;
        let kept = kept::<executor::restrict_params::Owned>(params)
            .map_err(|error| malformed_policy(&error))?;
        let target = self.target().await?;
        let mut request = target.executor.restrict_request();
        request
            .set(params)
            .map_err(|error| malformed_policy(&error))?;
        let call = request.send();
        let far = self.step(
            Step::Restrict(kept),
            call.pipeline.get_executor(),
            target.generation,
        );
        results.get().set_executor(capnp_rpc::new_client(far));
        results.set_pipeline()?;
        call.promise.await.map_err(|error| self.hop_error(error))?;
        Ok(())
    }

    // `restore`, `directory`, `dial` and `listen` at the far end, their
    // capability published before it answers (`start` and `restore` are
    // pipelined alike; calls on the directory go on to the upstream at
    // once, see `rpc/forward_directory.rs`). A dial passes the client's
    // sink on, so both directions' writes cross this hop as calls whose
    // answers come from the far end, and flow control holds end to end;
    // its direct channel is hop-local: one is claimed on the far server's
    // socket, which the client is not connected to, so through a hop the
    // bytes go as messages and the far end is not asked for a ticket
    // nobody could claim (it would reset the connection after 10 s).
    forward! { executor;
        restore: restore_request, RestoreParams, RestoreResults [
            publish set_process(get_process)
        ];
        directory: directory_request, DirectoryParams, DirectoryResults [
            publish set_dir(get_dir, ForwardingDirectory::new)
        ];
        dial: dial_request, DialParams, DialResults [
            clear set_direct(false);
            publish set_connection(get_connection), set_to_socket(get_to_socket);
            copy set_info(get_info)
        ];
        listen: listen_request, ListenParams, ListenResults [
            publish set_listener(get_listener);
            copy set_address(get_address)
        ];
    }
}
