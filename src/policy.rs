//! Restricted executors' rules: which programs, where, with what
//! environment, how many at once and for how long. A [`Policy`] is what a
//! client asks for; [`Rules`] is a policy resolved on this server (program
//! names looked up, symlinks resolved) and narrowed by every policy before
//! it. Plain logic over [`StartSpec`]s: the RPC layer only carries them.

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::engine::{self, WorkingDir};
use crate::model::{
    EXCERPT_BYTES, Policy, Refusal, RefusalKind, RuleNames, StartSpec, env_name_problem, excerpt,
    io_message,
};

/// Where each rule of [`Rules`] came from, for its refusals.
#[derive(Clone, Copy, Debug, Default)]
struct Labels {
    programs: RuleNames,
    cwd_roots: RuleNames,
    settable_env: RuleNames,
    /// The settable names are none because programs are restricted, not
    /// because a policy listed them.
    settable_env_implied: bool,
    forbid_tty: RuleNames,
    sandbox: RuleNames,
}

/// Most entries of each list of a policy: resolving them blocks the thread
/// that serves the connection.
pub const MAX_POLICY_ENTRIES: usize = 1024;

/// Most policies one executor may be restricted by, one on another.
pub const MAX_RESTRICTION_DEPTH: usize = 64;

/// The rules a start must satisfy: one policy after another, each
/// resolved when it was added.
#[derive(Clone, Debug, Default)]
pub struct Rules {
    /// How many policies these rules combine.
    depth: usize,
    /// The allowed programs, as [`program_identity`] names them.
    programs: Option<BTreeSet<PathBuf>>,
    /// Canonical roots.
    cwd_roots: Option<Vec<PathBuf>>,
    environment: Option<Vec<(OsString, OsString)>>,
    settable_env: Option<BTreeSet<OsString>>,
    forbid_tty: bool,
    max_run_time: Option<Duration>,
    /// One semaphore per policy with a `max_processes`, oldest first.
    counters: Vec<Arc<Counter>>,
    /// The sandboxes of the policies that have one, oldest first.
    sandboxes: Vec<crate::sandbox::PolicySandbox>,
    /// The smallest of every policy's limits.
    limits: crate::model::Limits,
    labels: Labels,
    /// Which addresses `dial` and `listen` may use (kept here so that one
    /// restriction narrows starts and ports together).
    ports: crate::ports::PortRules,
}

/// A policy's `max_processes`: its places, whose permits an
/// [`Admission`] holds.
#[derive(Debug)]
struct Counter {
    places: Arc<Semaphore>,
    max: usize,
    names: RuleNames,
}

/// Places taken in the process counters of a start's rules, one permit
/// each; dropping it gives them back (the engine holds it while the
/// process runs: see `Process::hold_while_running`).
#[derive(Debug)]
pub struct Admission {
    places: Vec<OwnedSemaphorePermit>,
    /// The working directory cwdRoots checked, opened: the start runs in
    /// this one (see `working_dir.rs`).
    working_dir: Option<WorkingDir>,
}

impl Admission {
    /// The working directory the cwdRoots check opened and admitted, for
    /// [`crate::engine::Engine::start_in`]; the admission holds no
    /// descriptor while the process runs.
    pub fn take_working_dir(&mut self) -> Option<WorkingDir> {
        self.working_dir.take()
    }
}

/// A start or a policy refused by a rule; `rule` names it (see
/// [`RuleNames`]).
fn not_allowed(rule: &str, message: String) -> Refusal {
    Refusal::new(RefusalKind::NotAllowed, format!("{rule}: {message}"))
}

/// A policy that cannot be resolved.
fn invalid(rule: &str, message: String) -> Refusal {
    Refusal::new(RefusalKind::InvalidArgument, format!("{rule}: {message}"))
}

/// A path for a message, quoted (at most an excerpt of it).
fn shown(path: &Path) -> String {
    format!("{:?}", excerpt(&path.display().to_string()))
}

/// A name or value for a message, quoted (at most an excerpt of it).
fn quoted(text: &OsStr) -> String {
    format!("{:?}", excerpt(&text.to_string_lossy()))
}

/// Items for a message: comma-separated, or "none"; a long list is cut
/// after a few hundred bytes with how many items it left out.
fn joined(items: impl Iterator<Item = String>) -> String {
    let mut text = String::new();
    let mut left_out = 0;
    for item in items {
        if text.len() >= EXCERPT_BYTES {
            left_out += 1;
            continue;
        }
        if !text.is_empty() {
            text.push_str(", ");
        }
        text.push_str(&item);
    }
    match (text.is_empty(), left_out) {
        (true, _) => "none".into(),
        (false, 0) => text,
        (false, more) => format!("{text} and {more} more"),
    }
}

fn listed<'a>(paths: impl IntoIterator<Item = &'a PathBuf>) -> String {
    joined(paths.into_iter().map(|path| shown(path)))
}

fn names_listed<'a>(names: impl IntoIterator<Item = &'a OsString>) -> String {
    joined(
        names
            .into_iter()
            .map(|name| excerpt(&name.to_string_lossy()).into_owned()),
    )
}

/// What starts may change of their environment, as a sentence's object.
fn changeable(settable: &BTreeSet<OsString>) -> String {
    if settable.is_empty() {
        "no variable".to_string()
    } else {
        format!("only {}", names_listed(settable))
    }
}

/// Where `spec` runs: its working directory, or the server's.
fn start_cwd(spec: &StartSpec) -> Result<PathBuf, Refusal> {
    match spec.effective_cwd() {
        Some(cwd) => Ok(cwd.clone()),
        None => std::env::current_dir().map_err(|error| {
            Refusal::new(
                RefusalKind::BadCwd,
                format!("the server's working directory: {}", io_message(&error)),
            )
        }),
    }
}

impl Rules {
    /// No rules: what an unrestricted executor allows.
    pub fn unrestricted() -> Rules {
        Rules::default()
    }

    /// These rules narrowed by `policy`, which is resolved now. Refuses a
    /// policy that cannot be resolved, or that asks for more than these
    /// rules allow, rather than silently allowing less than it says.
    /// The canonical directories starts must stay in, if restricted.
    pub fn cwd_roots(&self) -> Option<&[PathBuf]> {
        self.cwd_roots.as_deref()
    }

    /// About how many bytes these rules keep in memory: a restricted
    /// executor's rules are counted against its connection's memory, or
    /// restricting over and over with a big environment would take the
    /// server's.
    pub fn approximate_bytes(&self) -> usize {
        // Each entry costs its bytes and about 32 of bookkeeping.
        let texts = |texts: &mut dyn Iterator<Item = &OsStr>| -> usize {
            texts.map(|text| text.len() + 32).sum()
        };
        std::mem::size_of::<Rules>()
            + texts(&mut self.programs.iter().flatten().map(|path| path.as_os_str()))
            + texts(&mut self.cwd_roots.iter().flatten().map(|path| path.as_os_str()))
            + texts(
                &mut self
                    .environment
                    .iter()
                    .flatten()
                    .flat_map(|(name, value)| [name.as_os_str(), value.as_os_str()]),
            )
            + texts(&mut self.settable_env.iter().flatten().map(OsString::as_os_str))
            + self
                .sandboxes
                .iter()
                .map(crate::sandbox::PolicySandbox::approximate_bytes)
                .sum::<usize>()
            + self.counters.len() * std::mem::size_of::<Counter>()
            + self.ports.approximate_bytes()
    }

    /// What these rules allow `dial` and `listen`.
    pub fn ports(&self) -> &crate::ports::PortRules {
        &self.ports
    }

    pub fn narrowed(&self, policy: &Policy) -> Result<Rules, Refusal> {
        if self.depth >= MAX_RESTRICTION_DEPTH {
            return Err(Refusal::new(
                RefusalKind::LimitReached,
                format!("an executor can be restricted at most {MAX_RESTRICTION_DEPTH} times over"),
            ));
        }
        let lengths = [
            ("programs", policy.programs.as_ref().map_or(0, Vec::len)),
            ("cwdRoots", policy.cwd_roots.as_ref().map_or(0, Vec::len)),
            (
                "environment",
                policy.environment.as_ref().map_or(0, Vec::len),
            ),
            (
                "settableEnv",
                policy.settable_env.as_ref().map_or(0, Vec::len),
            ),
        ];
        let names = policy.rule_names;
        for (rule, length) in lengths {
            if length > MAX_POLICY_ENTRIES {
                return Err(invalid(
                    &names.setup(rule),
                    format!("{length} entries; at most {MAX_POLICY_ENTRIES}"),
                ));
            }
        }
        policy
            .limits
            .validate()
            .map_err(|why| invalid(&names.setup("limits"), why))?;
        let mut rules = self.clone();
        rules.depth += 1;
        rules.ports = self
            .ports
            .narrowed(policy.ports.as_ref(), closes_ports(policy), names)?;
        if let Some(programs) = &policy.programs {
            rules.programs = Some(self.narrowed_programs(programs, names)?);
            rules.labels.programs = names;
        }
        if let Some(roots) = &policy.cwd_roots {
            rules.cwd_roots = Some(self.narrowed_roots(roots, names)?);
            rules.labels.cwd_roots = names;
        }
        if let Some(environment) = &policy.environment {
            self.check_fixed_environment(environment, names)?;
            rules.environment = Some(environment.clone());
        }
        if let Some(settable) = &policy.settable_env {
            let asked: BTreeSet<OsString> = settable.iter().cloned().collect();
            if let Some(allowed) = &self.settable_env
                && let Some(name) = asked.difference(allowed).next()
            {
                return Err(not_allowed(
                    &names.setup("settableEnv"),
                    format!(
                        "{} is not settable on this executor (settable: {})",
                        quoted(name),
                        names_listed(allowed)
                    ),
                ));
            }
            rules.settable_env = Some(asked);
            rules.labels.settable_env = names;
            rules.labels.settable_env_implied = false;
        } else if policy.programs.is_some() {
            // Programs take orders from their environment (LD_PRELOAD,
            // GIT_SSH_COMMAND, PAGER...): a policy that restricts programs
            // allows only the changes it names, whatever came before.
            rules.settable_env = Some(BTreeSet::new());
            rules.labels.settable_env = names;
            rules.labels.settable_env_implied = true;
        }
        if policy.forbid_tty && !rules.forbid_tty {
            rules.labels.forbid_tty = names;
        }
        rules.forbid_tty |= policy.forbid_tty;
        if let Some(max) = policy.max_run_time.filter(|max| !max.is_zero()) {
            rules.max_run_time = Some(self.max_run_time.map_or(max, |old| old.min(max)));
        }
        if let Some(sandbox) = &policy.sandbox {
            let resolved = crate::sandbox::PolicySandbox::resolve(
                sandbox,
                self.sandboxes.last(),
                &names.setup("sandbox"),
            )?;
            rules.sandboxes.push(resolved);
            rules.labels.sandbox = names;
        }
        rules.limits = self.limits.and(&policy.limits);
        if let Some(max) = policy.max_processes.filter(|&max| max > 0) {
            rules.counters.push(Arc::new(Counter {
                places: Arc::new(Semaphore::new(max as usize)),
                max: max as usize,
                names,
            }));
        }
        Ok(rules)
    }

    fn narrowed_programs(
        &self,
        programs: &[OsString],
        names: RuleNames,
    ) -> Result<BTreeSet<PathBuf>, Refusal> {
        let mut resolved = BTreeSet::new();
        for program in programs {
            let path = resolve_allowed_program(program, &names.setup("programs"))?;
            if let Some(allowed) = &self.programs
                && !allowed.contains(&path)
            {
                return Err(not_allowed(
                    &names.setup("programs"),
                    format!(
                        "{} ({}) is not allowed on this executor (allowed: {})",
                        shown(Path::new(program)),
                        shown(&path),
                        listed(allowed)
                    ),
                ));
            }
            resolved.insert(path);
        }
        Ok(resolved)
    }

    fn narrowed_roots(&self, roots: &[PathBuf], names: RuleNames) -> Result<Vec<PathBuf>, Refusal> {
        let rule = names.setup("cwdRoots");
        let mut resolved = Vec::new();
        for root in roots {
            if !root.is_absolute() {
                return Err(invalid(
                    &rule,
                    format!("{} is not an absolute path", shown(root)),
                ));
            }
            let canonical = std::fs::canonicalize(root).map_err(|error| {
                invalid(&rule, format!("{}: {}", shown(root), io_message(&error)))
            })?;
            if !canonical.is_dir() {
                return Err(invalid(
                    &rule,
                    format!("{} is not a directory", shown(root)),
                ));
            }
            if let Some(allowed) = &self.cwd_roots
                && !allowed.iter().any(|outer| canonical.starts_with(outer))
            {
                return Err(not_allowed(
                    &rule,
                    format!(
                        "{} ({}) is outside this executor's roots ({})",
                        shown(root),
                        shown(&canonical),
                        listed(allowed)
                    ),
                ));
            }
            resolved.push(canonical);
        }
        Ok(resolved)
    }

    /// A new fixed environment replaces what starts would otherwise get,
    /// which is a change these rules must allow.
    fn check_fixed_environment(
        &self,
        wanted: &[(OsString, OsString)],
        names: RuleNames,
    ) -> Result<(), Refusal> {
        let rule = names.setup("environment");
        for (name, value) in wanted {
            if env_name_problem(name).is_some() || value.as_encoded_bytes().contains(&0) {
                return Err(invalid(
                    &rule,
                    format!(
                        "{} is not a valid variable (names are non-empty, without '=' or NUL)",
                        quoted(name)
                    ),
                ));
            }
        }
        let Some(settable) = &self.settable_env else {
            return Ok(());
        };
        let Some(current) = &self.environment else {
            return Err(not_allowed(
                &rule,
                format!(
                    "this executor lets starts change {}; a fixed environment would replace all of it",
                    changeable(settable)
                ),
            ));
        };
        let value_of = |env: &[(OsString, OsString)], name: &OsStr| {
            env.iter()
                .rev()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        let changed: BTreeSet<&OsString> = current
            .iter()
            .chain(wanted.iter())
            .map(|(name, _)| name)
            .collect();
        for name in changed {
            if value_of(current, name) != value_of(wanted, name) && !settable.contains(name) {
                return Err(not_allowed(
                    &rule,
                    format!(
                        "{} differs from this executor's fixed environment and is not settable (settable: {})",
                        quoted(name),
                        names_listed(settable)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Checks `spec` against every rule and returns what to start instead:
    /// the resolved program and directory, the fixed environment applied,
    /// the run time capped. The admission holds the start's places in the
    /// process counters until it is dropped.
    pub fn admit(&self, spec: &StartSpec) -> Result<(StartSpec, Admission), Refusal> {
        spec.validate()?;
        let mut admitted = spec.clone();
        if self.forbid_tty && spec.tty {
            return Err(not_allowed(
                &self.labels.forbid_tty.refusal("forbidTty"),
                "this executor does not allow terminals".into(),
            ));
        }
        self.admit_environment(&mut admitted)?;
        let working_dir = self.admit_cwd(&mut admitted)?;
        self.admit_program(&mut admitted)?;
        if let Some(max) = self.max_run_time {
            admitted.timeout = Some(admitted.timeout.map_or(max, |asked| asked.min(max)));
        }
        if !self.sandboxes.is_empty() {
            let cwd = start_cwd(&admitted)?;
            admitted.sandbox = Some(crate::sandbox::PolicySandbox::narrow(
                &self.sandboxes,
                spec.sandbox.as_ref(),
                &cwd,
                &self.labels.sandbox.refusal("sandbox"),
            )?);
        }
        admitted.limits = spec.limits.and(&self.limits);
        let mut admission = self.take_places()?;
        admission.working_dir = working_dir;
        Ok((admitted, admission))
    }

    fn admit_environment(&self, spec: &mut StartSpec) -> Result<(), Refusal> {
        if let Some(settable) = &self.settable_env {
            let rule = self.settable_rule();
            if spec.env.clear {
                return Err(not_allowed(
                    &rule,
                    format!(
                        "starts may not clear the environment; they may change {}",
                        changeable(settable)
                    ),
                ));
            }
            let changed = spec
                .env
                .unset
                .iter()
                .chain(spec.env.set.iter().map(|(name, _)| name));
            for name in changed {
                if !settable.contains(name) {
                    return Err(not_allowed(
                        &rule,
                        format!(
                            "{} may not be set or unset (settable: {})",
                            quoted(name),
                            names_listed(settable)
                        ),
                    ));
                }
            }
        }
        if let Some(fixed) = &self.environment {
            let mut set: Vec<(OsString, OsString)> = if spec.env.clear {
                Vec::new()
            } else {
                fixed
                    .iter()
                    .filter(|(name, _)| !spec.env.unset.contains(name))
                    .cloned()
                    .collect()
            };
            set.append(&mut spec.env.set);
            spec.env.clear = true;
            spec.env.unset.clear();
            spec.env.set = set;
        }
        Ok(())
    }

    /// Checks the working directory against cwdRoots, opened once: what
    /// is checked is what the start runs in, whatever its path names
    /// later.
    fn admit_cwd(&self, spec: &mut StartSpec) -> Result<Option<WorkingDir>, Refusal> {
        let Some(roots) = &self.cwd_roots else {
            return Ok(None);
        };
        let asked = start_cwd(spec)?;
        let outside = |canonical: &Path| {
            let resolved = if canonical == asked {
                String::new()
            } else {
                format!(" (resolved: {})", shown(canonical))
            };
            not_allowed(
                &self.labels.cwd_roots.refusal("cwdRoots"),
                format!(
                    "working directory {}{resolved} is outside the allowed roots ({})",
                    shown(&asked),
                    listed(roots)
                ),
            )
        };
        let opened = match WorkingDir::open(&asked) {
            Ok(opened) => opened,
            // Outside the roots the answer is the same whether or not the
            // directory exists.
            Err(_)
                if !crate::files::within::failure_is_inside(
                    &asked,
                    roots
                        .iter()
                        .map(|root| crate::files::within::Root::directory(root)),
                ) =>
            {
                return Err(outside(&asked));
            }
            Err(refusal) => return Err(refusal),
        };
        let canonical = opened.path()?.to_path_buf();
        if !roots.iter().any(|root| canonical.starts_with(root)) {
            return Err(outside(&canonical));
        }
        spec.cwd = Some(canonical);
        Ok(Some(opened))
    }

    fn admit_program(&self, spec: &mut StartSpec) -> Result<(), Refusal> {
        let Some(programs) = &self.programs else {
            return Ok(());
        };
        let rule = self.labels.programs.refusal("programs");
        // A multi-call program (busybox) picks what it does by the name it
        // sees: it must be the name that was checked.
        if let Some(arg0) = &spec.arg0
            && arg0 != &spec.argv[0]
        {
            return Err(not_allowed(
                &rule,
                format!(
                    "arg0 {} differs from the program {}; a restricted executor runs programs \
                     under their own names",
                    quoted(arg0),
                    quoted(&spec.argv[0])
                ),
            ));
        }
        if let Some(cwd) = spec.effective_cwd()
            && !cwd.is_dir()
        {
            // The engine's own error, not a missing program.
            return Err(Refusal::new(
                RefusalKind::BadCwd,
                format!(
                    "working directory {}: not an existing directory",
                    excerpt(&cwd.display().to_string())
                ),
            ));
        }
        let found = engine::program_path(spec)?;
        let canonical = program_identity(&found).map_err(|error| {
            Refusal::new(
                RefusalKind::ProgramNotFound,
                format!("program {}: {}", shown(&found), io_message(&error)),
            )
        })?;
        if !programs.contains(&canonical) {
            return Err(not_allowed(
                &rule,
                format!(
                    "{} ({}) is not one of the allowed programs ({})",
                    shown(Path::new(&spec.argv[0])),
                    shown(&canonical),
                    listed(programs)
                ),
            ));
        }
        // What was checked is what runs, whatever PATH says by the time of
        // the exec; the child still sees its argv[0].
        if spec.arg0.is_none() {
            spec.arg0 = Some(spec.argv[0].clone());
        }
        spec.argv[0] = canonical.into_os_string();
        Ok(())
    }

    /// How refusals of the settable names name their rule: saying why the
    /// list is empty when no flag set it.
    fn settable_rule(&self) -> String {
        let names = self.labels.settable_env;
        if self.labels.settable_env_implied && names == RuleNames::ServeFlags {
            format!(
                "{} (none by default with --allow-program)",
                names.refusal("settableEnv")
            )
        } else {
            names.refusal("settableEnv")
        }
    }

    fn take_places(&self) -> Result<Admission, Refusal> {
        let mut admission = Admission {
            places: Vec::with_capacity(self.counters.len()),
            working_dir: None,
        };
        for counter in &self.counters {
            let Ok(place) = Arc::clone(&counter.places).try_acquire_owned() else {
                // Dropping the admission gives back the places taken so far.
                return Err(not_allowed(
                    &counter.names.refusal("maxProcesses"),
                    format!(
                        "the limit of {} running processes is reached (it counts what was started \
                         through the executor that set it and the executors restricted from it)",
                        counter.max
                    ),
                ));
            };
            admission.places.push(place);
        }
        Ok(admission)
    }
}

/// Whether `policy` closes ports it does not name: a policy that confines
/// programs, working directories or a sandbox would confine nothing if its
/// executor could still dial any address (its own server's socket hands
/// out an unrestricted executor), and a sandbox without network means no
/// dial and no listen at all.
fn closes_ports(policy: &Policy) -> Option<crate::ports::Closed> {
    use crate::ports::Closed;
    if policy
        .sandbox
        .as_ref()
        .is_some_and(|sandbox| sandbox.network == crate::model::Network::None)
    {
        return Some(Closed::NoNetwork);
    }
    [
        ("programs", policy.programs.is_some()),
        ("cwdRoots", policy.cwd_roots.is_some()),
        ("sandbox", policy.sandbox.is_some()),
    ]
    .into_iter()
    .find_map(|(field, set)| set.then_some(Closed::By(field)))
}

/// A policy's program: an absolute path or a name on the server's PATH,
/// symlinks resolved.
fn resolve_allowed_program(program: &OsStr, rule: &str) -> Result<PathBuf, Refusal> {
    let path = Path::new(program);
    let found = if program.as_encoded_bytes().contains(&b'/') {
        if !path.is_absolute() {
            return Err(invalid(
                rule,
                format!(
                    "{} is neither an absolute path nor a name to look up on PATH",
                    shown(path)
                ),
            ));
        }
        path.to_path_buf()
    } else if program.is_empty() {
        return Err(invalid(rule, "a program name is empty".into()));
    } else {
        engine::program_on_own_path(program).map_err(|error| {
            let why = match error.kind() {
                std::io::ErrorKind::NotFound => String::new(),
                _ => format!(" ({})", io_message(&error)),
            };
            invalid(
                rule,
                format!("{} is not on the server's PATH{why}", shown(path)),
            )
        })?
    };
    let identity = program_identity(&found)
        .map_err(|error| invalid(rule, format!("{}: {}", shown(&found), io_message(&error))))?;
    if !identity.is_file() {
        return Err(invalid(rule, format!("{} is not a file", shown(&found))));
    }
    Ok(identity)
}

/// How a program is named for the `programs` rule: its directory with every
/// symlink resolved, and its own file name as it is. `/bin/true` and
/// `/usr/bin/true` are one program where /bin links to /usr/bin, but a
/// link `sh -> busybox` stays `sh`: multi-call programs do what their name
/// says, so allowing `ls` must not allow `sh`.
fn program_identity(path: &Path) -> std::io::Result<PathBuf> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a path to a file",
        ));
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    Ok(std::fs::canonicalize(parent)?.join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(name, value)| (name.into(), value.into()))
            .collect()
    }

    #[test]
    fn a_fixed_environment_is_the_base_and_settable_names_apply_on_top() {
        let rules = Rules::unrestricted()
            .narrowed(&Policy {
                environment: Some(env(&[("PATH", "/usr/bin:/bin"), ("LANG", "C")])),
                settable_env: Some(vec!["LANG".into(), "EXTRA".into()]),
                ..Policy::default()
            })
            .expect("narrow");
        let mut spec = StartSpec::new(["env"]);
        spec.env.set = env(&[("EXTRA", "1")]);
        spec.env.unset = vec!["LANG".into()];
        let (admitted, _admission) = rules.admit(&spec).expect("admit");
        let mut child_env = engine::child_env(&admitted);
        child_env.sort();
        assert_eq!(child_env, env(&[("EXTRA", "1"), ("PATH", "/usr/bin:/bin")]));

        spec.env.set = env(&[("PATH", "/tmp")]);
        let error = rules.admit(&spec).expect_err("PATH is not settable");
        assert_eq!(error.kind, RefusalKind::NotAllowed);
        assert!(error.message.contains("`settableEnv`"), "{error}");
    }

    #[test]
    fn narrowing_a_fixed_environment_may_change_only_settable_names() {
        let rules = Rules::unrestricted()
            .narrowed(&Policy {
                environment: Some(env(&[("A", "1"), ("B", "2")])),
                settable_env: Some(vec!["B".into()]),
                ..Policy::default()
            })
            .expect("narrow");
        let fine = Policy {
            environment: Some(env(&[("A", "1"), ("B", "3")])),
            ..Policy::default()
        };
        assert!(rules.narrowed(&fine).is_ok());
        let wider = Policy {
            environment: Some(env(&[("A", "9")])),
            ..Policy::default()
        };
        let error = rules.narrowed(&wider).expect_err("A is fixed");
        assert_eq!(error.kind, RefusalKind::NotAllowed);
        assert!(error.message.contains("\"A\""), "{error}");
        let more_settable = Policy {
            settable_env: Some(vec!["A".into()]),
            ..Policy::default()
        };
        assert!(rules.narrowed(&more_settable).is_err());
    }

    #[test]
    fn refusals_quote_only_an_excerpt_of_what_they_refuse() {
        let rules = Rules::unrestricted()
            .narrowed(&Policy {
                programs: Some(vec!["true".into()]),
                settable_env: Some(vec!["LANG".into()]),
                ..Policy::default()
            })
            .expect("narrow");
        let long = format!("/{}", "a".repeat(8190));
        let mut cwd = StartSpec::new(["true"]);
        cwd.cwd = Some(PathBuf::from(&long));
        let mut name = StartSpec::new(["true"]);
        name.env.set = env(&[(&long[1..], "x")]);
        for spec in [StartSpec::new([long.as_str()]), cwd, name] {
            let error = rules.admit(&spec).expect_err("refused");
            assert!(error.message.len() < 600, "{} bytes", error.message.len());
            assert!(error.message.contains(" bytes)"), "{}", error.message);
        }
    }

    #[test]
    fn restricting_programs_allows_no_environment_change_it_does_not_name() {
        let outer = Rules::unrestricted()
            .narrowed(&Policy {
                settable_env: Some(vec!["LD_PRELOAD".into()]),
                ..Policy::default()
            })
            .expect("narrow");
        let inner = outer
            .narrowed(&Policy {
                programs: Some(vec!["true".into()]),
                ..Policy::default()
            })
            .expect("narrow");
        let mut spec = StartSpec::new(["true"]);
        spec.env.set = env(&[("LD_PRELOAD", "/tmp/x.so")]);
        assert!(outer.admit(&spec).is_ok());
        let error = inner.admit(&spec).expect_err("LD_PRELOAD is not named");
        assert!(error.message.contains("`settableEnv`"), "{error}");
    }

    #[test]
    fn counters_of_every_policy_apply_and_are_given_back() {
        let outer = Rules::unrestricted()
            .narrowed(&Policy {
                max_processes: Some(2),
                ..Policy::default()
            })
            .expect("narrow");
        let inner = outer
            .narrowed(&Policy {
                max_processes: Some(5),
                ..Policy::default()
            })
            .expect("narrow");
        let spec = StartSpec::new(["true"]);
        let first = inner.admit(&spec).expect("first");
        let _second = outer.admit(&spec).expect("second");
        let error = inner.admit(&spec).expect_err("the outer limit holds");
        assert!(error.message.contains("`maxProcesses`"), "{error}");
        drop(first);
        let _third = inner.admit(&spec).expect("a place was given back");
    }

    #[test]
    fn the_shortest_run_time_wins() {
        let rules = Rules::unrestricted()
            .narrowed(&Policy {
                max_run_time: Some(Duration::from_secs(10)),
                ..Policy::default()
            })
            .and_then(|rules| {
                rules.narrowed(&Policy {
                    max_run_time: Some(Duration::from_secs(60)),
                    ..Policy::default()
                })
            })
            .expect("narrow");
        let mut spec = StartSpec::new(["true"]);
        assert_eq!(
            rules.admit(&spec).expect("admit").0.timeout,
            Some(Duration::from_secs(10))
        );
        spec.timeout = Some(Duration::from_secs(3));
        assert_eq!(
            rules.admit(&spec).expect("admit").0.timeout,
            Some(Duration::from_secs(3))
        );
    }
}
