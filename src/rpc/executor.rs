//! The server's own `Executor`s, whose starts run on this server's engine:
//! "local", and restricted ones (local with rules every start must
//! satisfy). A server whose default environment is an upstream has a
//! forwarding root instead (`rpc/forward.rs`); both find the server's
//! context through [`ServerContext`].

use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::rc::Rc;

use crate::capexec_capnp::executor;
use crate::engine::{Engine, GivenStdio};
use crate::model::{LOCAL_ENVIRONMENT, Policy, Refusal, RefusalKind, Sandbox};
use crate::policy::Rules;
use crate::rpc::context::{Place, ServerContext, Upstream};
use crate::rpc::detach::Held;
use crate::rpc::forward::ForwardingExecutor;
use crate::rpc::holdings::Hold;
use crate::rpc::info;
use crate::rpc::ports::ProcessPorts;
use crate::rpc::process::ProcessImpl;
use crate::rpc::quota::Quota;
use crate::wire;

/// The features of the schema this server's executors implement (see
/// `ExecutorInfo.features`); a new `Executor` method adds its name here.
pub(crate) const EXECUTOR_FEATURES: &[&str] = &[
    "start",
    "info",
    "environments",
    "restrict",
    "directory",
    "sandbox",
    "limits",
    "ports",
];

pub struct ExecutorImpl {
    context: Rc<ServerContext>,
    quota: Quota,
    /// Restricted executors: what every start must satisfy.
    rules: Option<Rc<Rules>>,
    /// The memory those rules take, counted against the connection for as
    /// long as an executor or directory keeps them.
    rules_held: Option<Rc<Hold>>,
    /// A directory's executor (`Directory.executor`): where starts without
    /// a working directory run, and what relative ones (and relative
    /// `directory` paths) are taken from.
    home: Option<PathBuf>,
}

impl ExecutorImpl {
    fn new(context: Rc<ServerContext>, quota: Quota, rules: Option<Rc<Rules>>) -> Self {
        ExecutorImpl {
            context,
            quota,
            rules,
            rules_held: None,
            home: None,
        }
    }

    /// An executor with these rules (whose memory `held` counts), the same
    /// context, quota and home.
    fn with_rules(&self, rules: Rc<Rules>, held: Option<Rc<Hold>>) -> executor::Client {
        capnp_rpc::new_client(ExecutorImpl {
            context: Rc::clone(&self.context),
            quota: self.quota.clone(),
            rules: Some(rules),
            rules_held: held,
            home: self.home.clone(),
        })
    }

    /// `path` as this executor reads it: from its home if it has one.
    fn taken_from_home(&self, path: PathBuf) -> PathBuf {
        match &self.home {
            Some(home) => home.join(path),
            None => path,
        }
    }

    /// What a directory this executor hands out needs to make
    /// `Directory.executor`.
    fn origin(&self) -> Origin {
        Origin {
            context: Rc::clone(&self.context),
            quota: self.quota.clone(),
            rules: self.rules.clone(),
            _rules_held: self.rules_held.clone(),
        }
    }

    fn engine(&self) -> &Engine {
        self.context.engine()
    }

    /// What `dial` and `listen` may use: the rules', or any address.
    fn port_rules(&self) -> &crate::ports::PortRules {
        crate::rpc::ports::port_rules(self.rules.as_deref())
    }

    /// The descriptors `params` names among those the connection's peer
    /// sent (see `StartParams.passedStdio`), taken from the connection
    /// before anything can refuse the start, so that a refused one closes
    /// them too. All of them, or none.
    fn handed_stdio(
        &self,
        params: crate::capexec_capnp::start_params::Reader<'_>,
    ) -> Result<Option<GivenStdio>, capnp::Error> {
        let Some(passed) = wire::passed_stdio_from_wire(params)? else {
            return Ok(None);
        };
        let Some(received) = self.quota.received_descriptors() else {
            return Ok(None);
        };
        let Some(taken) = received.take(passed.first, passed.count()) else {
            return Ok(None);
        };
        let mut taken = taken.into_iter();
        let mut next = |named: bool| if named { taken.next() } else { None };
        Ok(Some(GivenStdio {
            stdin: next(passed.stdin),
            stdout: next(passed.stdout),
            stderr: next(passed.stderr),
        }))
    }

    /// Whether `spec`'s child may have `given`: never under a restricted
    /// executor (its rules see paths and programs, not what a descriptor
    /// reaches) or on a terminal, and only descriptors a standard one may
    /// be (no socket for a sandboxed child).
    fn may_have(&self, spec: &crate::model::StartSpec, given: &GivenStdio) -> bool {
        self.rules.is_none() && !spec.tty && given.may_all_be_stdio(spec.sandbox.is_some())
    }

    /// A new owner capability for `held`, whose forwards follow this
    /// executor's rules and count against its connection.
    fn process_capability(&self, held: Rc<Held>) -> crate::capexec_capnp::process::Client {
        let ports = ProcessPorts::new(self.rules.clone(), self.quota.ports().clone());
        capnp_rpc::new_client(ProcessImpl::new(held, ports))
    }
}

/// The in-process executor: the same capability remote clients get, served
/// by `engine` in this process (its only environment is "local").
pub fn local_executor(engine: Engine) -> executor::Client {
    root_executor(
        Rc::new(ServerContext::local_only(engine)),
        Quota::unlimited(),
    )
}

/// [`local_executor`], and the route by which this process hands it
/// descriptors for its starts' stdio ([`crate::client::StdioHandoff`]).
pub fn local_executor_with_stdio_route(
    engine: Engine,
) -> (executor::Client, crate::rpc::StdioRoute) {
    let received = crate::rpc::ReceivedDescriptors::default();
    let executor = root_executor(
        Rc::new(ServerContext::local_only(engine)),
        Quota::builder(None, Default::default())
            .received_descriptors(received.clone())
            .build(),
    );
    (executor, crate::rpc::StdioRoute::InProcess(received))
}

/// The root executor of a server whose every start must satisfy `rules`
/// (always local: a restricted server has no upstreams), for a connection
/// whose starts may hold `quota` processes at once.
pub fn restricted_root_executor(
    context: Rc<ServerContext>,
    quota: Quota,
    rules: Rc<Rules>,
) -> executor::Client {
    capnp_rpc::new_client(ExecutorImpl::new(context, quota, Some(rules)))
}

/// The root executor of a server with `context`, for a connection
/// whose local starts may hold `quota` processes at once: its `start`
/// goes to the default environment.
pub fn root_executor(context: Rc<ServerContext>, quota: Quota) -> executor::Client {
    // Its calls carry messages of up to a MiB: keep their buffers.
    crate::rpc::tune_allocator();
    match context.default_place() {
        Place::Local => capnp_rpc::new_client(ExecutorImpl::new(context, quota, None)),
        Place::Upstream(upstream) => {
            capnp_rpc::new_client(ForwardingExecutor::root(upstream, context, quota))
        }
    }
}

/// The root executor of a connection whose every call goes on to
/// `upstream` (a user's worker, for a server that maps logins to users):
/// the connection's `quota` bounds what it holds here, as a chain's hop's.
pub fn forwarded_root_executor(
    upstream: Rc<dyn Upstream>,
    context: Rc<ServerContext>,
    quota: Quota,
) -> executor::Client {
    crate::rpc::tune_allocator();
    capnp_rpc::new_client(ForwardingExecutor::root(upstream, context, quota))
}

/// `Executor.environment(name)` of a server's own (unrestricted) executors:
/// "local" counts against the connection's `quota` like the root does.
pub(crate) fn environment(
    context: &Rc<ServerContext>,
    quota: &Quota,
    name: &str,
) -> Result<executor::Client, Refusal> {
    Ok(match context.place(name)? {
        Place::Local => {
            capnp_rpc::new_client(ExecutorImpl::new(Rc::clone(context), quota.clone(), None))
        }
        Place::Upstream(upstream) => {
            capnp_rpc::new_client(ForwardingExecutor::for_connection(upstream, quota))
        }
    })
}

impl executor::Server for ExecutorImpl {
    async fn start(
        self: Rc<Self>,
        params: executor::StartParams,
        mut results: executor::StartResults,
    ) -> Result<(), capnp::Error> {
        let params = params.get()?.get_params()?;
        let handed = self.handed_stdio(params)?;
        let mut spec = wire::start_spec_from_wire(params)?;
        // Those it may not have are closed (off this thread) and it has pipes.
        let given = handed.filter(|given| self.may_have(&spec, given));
        if let Some(home) = &self.home {
            // Relative to the home, which is also where a start without a
            // working directory runs.
            spec.cwd = Some(
                spec.cwd
                    .take()
                    .map_or_else(|| home.clone(), |cwd| home.join(cwd)),
            );
        }
        let (spec, admission) = match &self.rules {
            Some(rules) => {
                let (spec, admission) = rules
                    .admit(&spec)
                    .inspect_err(|refusal| crate::metrics::refused_start(refusal.kind))?;
                (spec, Some(admission))
            }
            None => (spec, None),
        };
        let ticket = self
            .quota
            .take()
            .inspect_err(|refusal| crate::metrics::refused_start(refusal.kind))?;
        let passed = given.is_some();
        let (admission, working_dir) = match admission {
            Some(mut admission) => {
                let working_dir = admission.take_working_dir();
                (Some(admission), working_dir)
            }
            None => (None, None),
        };
        let owner = self
            .engine()
            .start_in(&spec, given.unwrap_or_default(), working_dir)?;
        if let Some(admission) = admission {
            owner.handle().hold_while_running(admission);
        }
        let held = Held::new(owner, self.context.detachments(), ticket);
        self.context.processes().add(&held, &spec);
        results.get().set_process(self.process_capability(held));
        results.get().set_stdio_passed(passed);
        Ok(())
    }

    async fn restore(
        self: Rc<Self>,
        params: executor::RestoreParams,
        mut results: executor::RestoreResults,
    ) -> Result<(), capnp::Error> {
        let token = params.get()?.get_token()?.to_str()?;
        // Taken first, so a refused restore leaves the process parked.
        let ticket = self.quota.take()?;
        let held = self.context.detachments().restore(token)?;
        held.count_against(ticket);
        results.get().set_process(self.process_capability(held));
        Ok(())
    }

    async fn info(
        self: Rc<Self>,
        _: executor::InfoParams,
        mut results: executor::InfoResults,
    ) -> Result<(), capnp::Error> {
        let mut info = info::local_info(self.engine().host());
        if self.rules.is_some() {
            info.features.push(info::RESTRICTED_FEATURE.to_string());
        }
        wire::info_to_wire(&info, results.get().init_info());
        Ok(())
    }

    async fn environments(
        self: Rc<Self>,
        _: executor::EnvironmentsParams,
        mut results: executor::EnvironmentsResults,
    ) -> Result<(), capnp::Error> {
        let mut statuses = self.context.statuses();
        if self.rules.is_some() {
            // Only "local", where all of its starts go.
            statuses.truncate(1);
            for status in &mut statuses {
                status.is_default = true;
            }
        }
        let list = results.get().init_environments(statuses.len() as u32);
        wire::environments_to_wire(&statuses, list);
        Ok(())
    }

    async fn environment(
        self: Rc<Self>,
        params: executor::EnvironmentParams,
        mut results: executor::EnvironmentResults,
    ) -> Result<(), capnp::Error> {
        let name = params.get()?.get_name()?.to_str()?;
        let executor = match &self.rules {
            None => environment(&self.context, &self.quota, name)?,
            // Nothing but itself: other context are not its to give.
            Some(_) if name != LOCAL_ENVIRONMENT => {
                return Err(Refusal::new(
                    RefusalKind::NotAllowed,
                    format!(
                        "a restricted executor offers no environment but {LOCAL_ENVIRONMENT:?} \
                         (asked for {:?})",
                        crate::model::excerpt(name)
                    ),
                )
                .into());
            }
            Some(rules) => self.with_rules(Rc::clone(rules), self.rules_held.clone()),
        };
        results.get().set_executor(executor);
        Ok(())
    }

    async fn restrict(
        self: Rc<Self>,
        params: executor::RestrictParams,
        mut results: executor::RestrictResults,
    ) -> Result<(), capnp::Error> {
        let policy = wire::policy_from_wire(params.get()?.get_policy()?)?;
        let current = self.rules.as_deref().cloned().unwrap_or_default();
        let rules = current.narrowed(&policy)?;
        let held = hold_rules(&self.quota, &rules)?;
        results
            .get()
            .set_executor(self.with_rules(Rc::new(rules), Some(held)));
        Ok(())
    }

    async fn directory(
        self: Rc<Self>,
        params: executor::DirectoryParams,
        mut results: executor::DirectoryResults,
    ) -> Result<(), capnp::Error> {
        let path = self.taken_from_home(PathBuf::from(std::ffi::OsStr::from_bytes(
            params.get()?.get_path()?,
        )));
        let roots = self
            .rules
            .as_deref()
            .and_then(Rules::cwd_roots)
            .map(<[_]>::to_vec);
        let dir = crate::rpc::directory::open_directory(
            path,
            roots,
            self.engine().host().clone(),
            self.quota.files().clone(),
            self.origin(),
        )
        .await?;
        results.get().set_dir(dir);
        Ok(())
    }

    async fn dial(
        self: Rc<Self>,
        params: executor::DialParams,
        results: executor::DialResults,
    ) -> Result<(), capnp::Error> {
        crate::rpc::ports::dial(self.port_rules(), self.quota.ports(), params, results, None).await
    }

    async fn listen(
        self: Rc<Self>,
        params: executor::ListenParams,
        results: executor::ListenResults,
    ) -> Result<(), capnp::Error> {
        crate::rpc::ports::listen(self.port_rules(), self.quota.ports(), params, results, None)
            .await
    }
}

/// The executor a `Directory` came from, which `Directory.executor`
/// restricts to the directory.
pub(crate) struct Origin {
    context: Rc<ServerContext>,
    quota: Quota,
    rules: Option<Rc<Rules>>,
    /// Kept with `rules`: the directory may outlive the executor.
    _rules_held: Option<Rc<Hold>>,
}

/// Counts the memory `rules` take against `quota`'s connection.
fn hold_rules(quota: &Quota, rules: &Rules) -> Result<Rc<Hold>, Refusal> {
    quota
        .holdings()
        .hold(0, rules.approximate_bytes(), "restricted executors")
        .map(Rc::new)
}

impl Origin {
    /// An executor whose processes run in `dir` and may write only there
    /// (nowhere for a read-only directory), with no network: the origin's
    /// rules narrowed by that policy (see the schema's `Directory.executor`).
    pub(crate) fn confined_to(
        &self,
        dir: &crate::model::DirectoryInfo,
    ) -> Result<executor::Client, Refusal> {
        let root = vec![dir.path.clone()];
        let sandbox = if dir.read_only {
            Sandbox {
                read_only: root.clone(),
                read_only_cwd: true,
                ..Sandbox::default()
            }
        } else {
            Sandbox {
                writable: root.clone(),
                ..Sandbox::default()
            }
        };
        let policy = Policy {
            cwd_roots: Some(root),
            sandbox: Some(sandbox),
            ..Policy::default()
        };
        let current = self.rules.as_deref().cloned().unwrap_or_default();
        let rules = current.narrowed(&policy)?;
        let held = hold_rules(&self.quota, &rules)?;
        Ok(capnp_rpc::new_client(ExecutorImpl {
            context: Rc::clone(&self.context),
            quota: self.quota.clone(),
            rules: Some(Rc::new(rules)),
            rules_held: Some(held),
            home: Some(dir.path.clone()),
        }))
    }
}
