//! Confinement of started processes: what the kernel can enforce (probed
//! once), and the plan of one start, prepared in the parent: the Landlock
//! ruleset, the seccomp filter, the capability drop, the cgroup leaf and
//! its limits. The child applies the plan with raw system calls only
//! (`engine/spawn/`). No Cap'n Proto here; the values the other layers
//! speak are in `model/sandbox.rs`.

mod cgroup;
mod identity;
mod mounts;
mod probe;
mod program;
mod roots;
mod ruleset;
mod seccomp;
mod sentinel;
mod tcp_peer;

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub(crate) use self::cgroup::Leaf;
pub use self::cgroup::{
    DelegatedGroup, LeafState, RootState, delegate, make_root_in, remove_delegated,
    root_for_handover, take_over_root,
};
pub use self::program::AS_READ_ONLY_ROOT;
pub(crate) use self::seccomp::Program;

use crate::model::enforcement as name;
use crate::model::{Confinement, Limits, Network, Refusal, RefusalKind, Sandbox, Tracking};
/// What an engine takes the kernel to support, which every function here
/// that asks is given.
pub use crate::sys::{HostConfig, KernelFeature};

/// The server's secret files no sandbox's roots may contain.
static PROTECTED: Mutex<Vec<Protected>> = Mutex::new(Vec::new());

/// A server's file that no sandbox may read, whatever its roots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Secret {
    /// A login token: a server's own, or one it logs in upstream with.
    LoginToken,
    /// The private key of a server's TLS certificate.
    TlsKey,
}

/// A protected file, resolved, and what it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Protected {
    pub path: PathBuf,
    pub secret: Secret,
}

/// Refuse sandboxes whose roots contain `path`, a file holding `secret`.
pub fn protect(path: &Path, secret: Secret) {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut protected = PROTECTED.lock().unwrap_or_else(|p| p.into_inner());
    let entry = Protected { path, secret };
    if !protected.contains(&entry) {
        protected.push(entry);
    }
}

fn protected() -> Vec<Protected> {
    PROTECTED.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// What this host can enforce, as far as its [`HostConfig`] lets it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Support {
    /// The Landlock ABI in use (0: none).
    pub landlock_abi: u32,
    pub seccomp: bool,
    /// A cgroup per process; `Err` says why not.
    pub cgroups: Result<(), String>,
    pub memory: bool,
    pub pids: bool,
    pub cpu: bool,
}

/// Probes the host and makes this process's cgroup root now rather than
/// on the first start (servers do, before they listen), unless `host`
/// hides cgroups.
pub fn prepare_host(host: &HostConfig) {
    let _ = support(host);
}

/// What this host can enforce, `host`'s hidden features left out (the
/// kernel is probed on first use).
pub fn support(host: &HostConfig) -> Support {
    let mut abi = if host.hides(KernelFeature::Landlock) {
        0
    } else {
        probe::landlock_abi()
    };
    if host.hides(KernelFeature::LandlockTcp) {
        abi = abi.min(3);
    }
    if host.hides(KernelFeature::LandlockScopes) {
        abi = abi.min(5);
    }
    let root = cgroup_root(host);
    let controllers = root.ok().map(|root| root.controllers().clone());
    let has = |feature: KernelFeature, pick: fn(&cgroup::Controllers) -> bool| {
        !host.hides(feature) && controllers.as_ref().is_some_and(pick)
    };
    Support {
        landlock_abi: abi,
        seccomp: !host.hides(KernelFeature::Seccomp) && probe::seccomp(),
        cgroups: root.map(drop).map_err(str::to_string),
        memory: has(KernelFeature::MemoryController, |c| c.memory.is_some()),
        pids: has(KernelFeature::PidsController, |c| c.pids.is_some()),
        cpu: has(KernelFeature::CpuController, |c| c.cpu.is_some()),
    }
}

fn cgroup_root(
    host: &HostConfig,
) -> Result<&'static std::sync::Arc<cgroup::CgroupRoot>, &'static str> {
    if host.hides(KernelFeature::Cgroups) {
        return Err("cgroups are hidden (--hide-kernel-feature cgroups)");
    }
    cgroup::root()
}

/// What `Executor.info` lists of this host's confinement (see the schema).
pub fn info_features(host: &HostConfig) -> Vec<String> {
    let support = support(host);
    let mut features = Vec::new();
    if support.landlock_abi > 0 {
        features.push(format!("sandbox-landlock-{}", support.landlock_abi));
    }
    if support.seccomp {
        features.push("seccomp".into());
    }
    match support.cgroups {
        Ok(()) => {
            features.push("cgroup-tracking".into());
            features.push("peer-check:cgroup".into());
        }
        Err(_) => {
            features.push("process-group-tracking".into());
            features.push("peer-check:no-new-privs".into());
        }
    }
    let limits: Vec<&str> = [
        (support.memory, "memory"),
        (support.pids, "pids"),
        (support.cpu, "cpu"),
    ]
    .into_iter()
    .filter_map(|(has, name)| has.then_some(name))
    .collect();
    if !limits.is_empty() {
        features.push(format!("limits:{}", limits.join(",")));
    }
    if can_mount_read_only(host) {
        features.push(READ_ONLY_INSIDE_FEATURE.into());
    }
    features
}

/// Whether `feature` (of `Executor.info`) says what a server's host can
/// enforce, as [`info_features`] names it.
pub use crate::model::READ_ONLY_INSIDE_FEATURE;

pub fn is_host_feature(feature: &str) -> bool {
    ["sandbox-landlock-", "limits:", "peer-check:"]
        .iter()
        .any(|prefix| feature.starts_with(prefix))
        || [
            "seccomp",
            "cgroup-tracking",
            "process-group-tracking",
            READ_ONLY_INSIDE_FEATURE,
        ]
        .contains(&feature)
}

/// Everything the child applies before its exec, prepared in the parent.
#[derive(Default)]
pub(crate) struct Plan {
    /// The leaf's cgroup2 directory: the child is cloned into it.
    pub cgroup: Option<OwnedFd>,
    /// Whether the child may be cloned into it (clone3's
    /// CLONE_INTO_CGROUP) rather than join it by `cgroup.procs`.
    pub clone_into_cgroup: bool,
    /// `cgroup.procs` of the leaf's v1 mirrors: the child writes "0" to
    /// each, joining them.
    pub cgroup_procs: Vec<OwnedFd>,
    /// Whether the child, once in its cgroups, makes a cgroup namespace
    /// rooted there (see `cgroup.rs`).
    pub cgroup_namespace: bool,
    /// Detached idmapped trees (see `identity.rs`), each moved onto its
    /// path in a mount namespace of the child's own, outermost first.
    pub mounts: Vec<(std::ffi::CString, OwnedFd)>,
    /// The working directory, entered again once the trees are in place
    /// (the one it had is beneath them).
    pub mounted_cwd: Option<std::ffi::CString>,
    /// The uid and gid the child takes (no supplementary groups) instead
    /// of root's.
    pub user: Option<u32>,
    /// Drop every capability (bounding, ambient, then the sets).
    pub drop_capabilities: bool,
    pub last_capability: i32,
    /// The bounding set's capabilities (bit n: capability n): the ones to
    /// drop from it.
    pub bounding_set: u64,
    /// Whether there are ambient capabilities to clear.
    pub clear_ambient: bool,
    pub no_new_privs: bool,
    /// Shared by the starts with the same roots (see `ruleset.rs`).
    pub ruleset: Option<std::sync::Arc<OwnedFd>>,
    /// The roots the ruleset confines the child to, for the parent's check
    /// of the program ([`Plan::check_program`]).
    pub roots: Option<Vec<roots::Root>>,
    pub seccomp: Option<Program>,
}

impl Plan {
    /// Refuses `program` (`name` resolved) if the ruleset would not let
    /// the child execute it or an interpreter of its `#!` lines, saying
    /// which file and the directory to add (`program.rs`).
    pub(crate) fn check_program(
        &self,
        name: &std::ffi::OsStr,
        program: &Path,
    ) -> Result<(), Refusal> {
        match &self.roots {
            Some(roots) => program::check(roots, name, program),
            None => Ok(()),
        }
    }
}

/// A start's confinement: the child's plan, the leaf that tracks its tree,
/// and what ProcessInfo says of it.
#[derive(Default)]
pub(crate) struct Prepared {
    pub plan: Plan,
    pub leaf: Option<Leaf>,
    pub confinement: Confinement,
}

/// A start's sandbox (already narrowed by every policy) and the path of the
/// directory it starts in (canonical), which its roots name: a path is
/// read only for a start that has a sandbox.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SandboxIn<'a> {
    pub sandbox: &'a Sandbox,
    pub cwd: &'a Path,
}

/// The confinement of a start with `sandbox` (if it has one) and `limits`,
/// on a kernel with what `host` leaves of it; `cwd_identity` is the
/// (device, inode) of the directory the child enters (opened once by the
/// engine). Refused if something that must be enforced cannot be, or a
/// root is unacceptable.
pub(crate) fn prepare(
    host: &HostConfig,
    sandbox: Option<SandboxIn<'_>>,
    limits: &Limits,
    cwd_identity: (u64, u64),
) -> Result<Prepared, Refusal> {
    let support = support(host);
    let mut prepared = Prepared::default();
    let mut missing: Vec<(String, String)> = Vec::new();

    // Limits, and the leaf that tracks every process.
    let mut want = |asked: bool, has: bool, what: &str, why: &str| {
        if asked && !has {
            missing.push((what.to_string(), why.to_string()));
        }
    };
    let why_controller = |controller: &str| match &support.cgroups {
        Err(why) => why.clone(),
        Ok(()) => format!("no {controller} controller is available to this server"),
    };
    want(
        limits.memory_bytes.is_some(),
        support.memory,
        name::LIMIT_MEMORY,
        &why_controller("memory"),
    );
    want(
        limits.max_pids.is_some(),
        support.pids,
        name::LIMIT_PIDS,
        &why_controller("pids"),
    );
    want(
        limits.cpu_millis.is_some(),
        support.cpu,
        name::LIMIT_CPU,
        &why_controller("cpu"),
    );
    if !missing.is_empty() && !limits.best_effort {
        return Err(unsupported("limits", &missing));
    }
    let enforceable = Limits {
        memory_bytes: limits.memory_bytes.filter(|_| support.memory),
        max_pids: limits.max_pids.filter(|_| support.pids),
        cpu_millis: limits.cpu_millis.filter(|_| support.cpu),
        best_effort: limits.best_effort,
    };
    let mut confinement = Confinement {
        limits: enforceable,
        ..Confinement::default()
    };
    let mut limit_missing: Vec<String> = missing.drain(..).map(|(what, _)| what).collect();
    if let Ok(root) = cgroup_root(host) {
        match Leaf::create(root, sandbox.is_some(), &enforceable) {
            Ok(new) => {
                prepared.plan.cgroup = Some(new.dir);
                prepared.plan.clone_into_cgroup = !host.hides(KernelFeature::CloneIntoCgroup);
                prepared.plan.cgroup_procs = new.v1_procs;
                prepared.plan.cgroup_namespace = root.namespaced();
                prepared.leaf = Some(new.leaf);
                confinement.tracking = Tracking::Cgroup;
                confinement.enforced.push(name::CGROUP.into());
                if root.namespaced() {
                    confinement.enforced.push(name::CGROUP_NAMESPACE.into());
                }
                confinement
                    .enforced
                    .extend(limit_names(&enforceable).map(str::to_string));
            }
            Err(error) => {
                without_a_cgroup(sandbox.is_some(), &enforceable, &error)?;
                tracing::warn!(%error, "cannot make a cgroup for a process: tracking its process group");
                limit_missing.extend(limit_names(&enforceable).map(str::to_string));
                confinement.limits = Limits {
                    best_effort: limits.best_effort,
                    ..Limits::default()
                };
            }
        }
    }
    confinement.not_enforced = limit_missing;

    let Some(SandboxIn { sandbox, cwd }) = sandbox else {
        prepared.confinement = confinement;
        return Ok(prepared);
    };

    // The sandbox: roots first (refusals for bad roots come before
    // refusals for missing kernel features).
    let mut resolved = roots::resolve_in_canonical(sandbox, cwd, "sandbox")?;
    if sandbox.leave_out_secrets {
        resolved = roots::leave_out(resolved, &protected(), "sandbox")?;
    }
    roots::check(
        &resolved,
        &protected(),
        &mounts::kernel_mount_points(),
        "sandbox",
    )?;
    let privileged = probe::privileged();
    let network_off = sandbox.network == Network::None;
    let coverage = ruleset::Coverage::of(support.landlock_abi, sandbox.network);
    let tracked = prepared.leaf.is_some();
    let mut asks: Vec<(&str, bool, String)> = vec![
        (
            name::FILESYSTEM,
            coverage.filesystem,
            "the kernel has no Landlock (Linux 5.13, enabled in the `lsm=` boot list)".into(),
        ),
        (
            name::SCOPE_SIGNALS,
            coverage.scopes,
            format!(
                "Landlock ABI 6 (Linux 6.12) is needed, the kernel has ABI {}",
                support.landlock_abi
            ),
        ),
        (
            name::SCOPE_ABSTRACT_SOCKETS,
            coverage.scopes,
            format!(
                "Landlock ABI 6 (Linux 6.12) is needed, the kernel has ABI {}",
                support.landlock_abi
            ),
        ),
        (name::NO_NEW_PRIVS, true, String::new()),
        (
            name::IO_URING,
            support.seccomp,
            "the kernel has no seccomp filters".into(),
        ),
        (
            name::SERVER_ISOLATION,
            tracked || support.seccomp,
            "neither a cgroup nor a seccomp filter marks the process".into(),
        ),
    ];
    if network_off {
        asks.push((
            name::NETWORK_SOCKETS,
            support.seccomp,
            "the kernel has no seccomp filters".into(),
        ));
    }
    if !sandbox.allow_namespaces {
        asks.push((
            name::NAMESPACES,
            support.seccomp,
            "the kernel has no seccomp filters".into(),
        ));
    }
    let mut unprivileged = None;
    if probe::is_root() && !sandbox.keep_root {
        let ready = identity_of(host, &resolved, cwd);
        asks.push((
            name::UNPRIVILEGED_USER,
            ready.is_ok(),
            ready.as_ref().err().cloned().unwrap_or_default(),
        ));
        unprivileged = ready.ok();
    }
    let read_only_inside = read_only_inside(&resolved, &sandbox.read_only_inside)?;
    let mut mount_read_only = false;
    if !read_only_inside.is_empty() {
        let ready = read_only_mounts(host);
        mount_read_only = ready.is_ok();
        asks.push((
            name::READ_ONLY_INSIDE,
            ready.is_ok(),
            ready.err().unwrap_or_default(),
        ));
    }
    if privileged {
        asks.push((name::CAPABILITIES, true, String::new()));
        asks.push((
            name::KERNEL_CALLS,
            support.seccomp,
            "the kernel has no seccomp filters".into(),
        ));
    }
    let missing: Vec<(String, String)> = asks
        .iter()
        .filter(|(_, has, _)| !has)
        .map(|(what, _, why)| (what.to_string(), why.clone()))
        .collect();
    if !missing.is_empty() && !sandbox.best_effort {
        return Err(unsupported("sandbox", &missing));
    }
    for (what, has, _) in &asks {
        if *has {
            confinement.enforced.push(what.to_string());
        } else {
            confinement.not_enforced.push(what.to_string());
        }
    }
    if coverage.tcp {
        confinement.enforced.push(name::NETWORK_TCP.into());
    }
    if coverage.filesystem {
        prepared.plan.ruleset = Some(ruleset::ruleset(
            &resolved,
            Some((cwd, cwd_identity)),
            sandbox.network,
            support.landlock_abi,
        )?);
        prepared.plan.roots = Some(resolved.clone());
    }
    if support.seccomp {
        let denied = seccomp::Denied {
            network: network_off,
            kernel_calls: privileged,
            namespaces: !sandbox.allow_namespaces,
        };
        prepared.plan.seccomp =
            Some(seccomp::program(denied).map_err(|why| {
                Refusal::new(RefusalKind::SpawnFailed, format!("sandbox: {why}"))
            })?);
    }
    let mapped = unprivileged.is_some();
    let mut mounts = unprivileged.unwrap_or_default();
    if mount_read_only {
        // Over the mapped trees (the paths are inside them), outer first.
        for path in &read_only_inside {
            mounts.push(read_only_mount(path, mapped)?);
        }
    }
    if !mounts.is_empty() {
        use std::os::unix::ffi::OsStrExt;
        prepared.plan.mounted_cwd = std::ffi::CString::new(cwd.as_os_str().as_bytes()).ok();
        prepared.plan.mounts = mounts;
    }
    if mapped {
        prepared.plan.user = Some(identity::SANDBOX_ID);
    }
    prepared.plan.no_new_privs = true;
    prepared.plan.drop_capabilities = privileged;
    prepared.plan.last_capability = probe::last_capability();
    prepared.plan.bounding_set = probe::bounding_set();
    prepared.plan.clear_ambient = probe::has_ambient();
    let mut applied = roots::explicit(&resolved, sandbox);
    // What is read-only by a mount of its own; nothing when not enforced.
    applied.read_only_inside = if mount_read_only {
        read_only_inside
    } else {
        Vec::new()
    };
    confinement.sandbox = Some(applied);
    prepared.confinement = confinement;
    Ok(prepared)
}

/// `Sandbox.readOnlyInside` resolved (symbolic links followed), those
/// inside a writable root only (the others are read-only already), outer
/// first, none inside another.
fn read_only_inside(roots: &[roots::Root], asked: &[PathBuf]) -> Result<Vec<PathBuf>, Refusal> {
    let mut inside = Vec::new();
    for path in asked {
        let real = std::fs::canonicalize(path).map_err(|error| {
            Refusal::new(
                RefusalKind::InvalidArgument,
                format!(
                    "sandbox: readOnlyInside {}: {}",
                    path.display(),
                    crate::model::io_message(&error)
                ),
            )
        })?;
        if roots::access_at(roots, &real) == Some(roots::Access::Write) {
            inside.push(real);
        }
    }
    inside.sort();
    inside.dedup();
    let all = inside.clone();
    inside.retain(|path| {
        !all.iter()
            .any(|outer| outer != path && path.starts_with(outer))
    });
    Ok(inside)
}

/// Whether read-only mounts can be made for a child (see
/// `Sandbox.readOnlyInside`), or why not.
fn read_only_mounts(host: &HostConfig) -> Result<(), String> {
    if host.hides(KernelFeature::IdmappedMounts) {
        return Err(
            "detached mounts are hidden (--hide-kernel-feature idmapped-mounts)".to_string(),
        );
    }
    if !probe::is_root() || !probe::can_admin() {
        return Err(
            "a read-only mount in a mount namespace of the process's own needs a root \
             server with CAP_SYS_ADMIN"
                .to_string(),
        );
    }
    Ok(())
}

/// Whether this server can keep paths read-only inside writable roots,
/// as `ExecutorInfo.features` says.
pub(crate) fn can_mount_read_only(host: &HostConfig) -> bool {
    read_only_mounts(host).is_ok()
}

/// `path` as a detached read-only mount (idmapped when the child runs as
/// the unprivileged user, as the tree around it is), with its path.
fn read_only_mount(path: &Path, mapped: bool) -> Result<(std::ffi::CString, OwnedFd), Refusal> {
    use std::os::unix::ffi::OsStrExt;
    let tree = identity::detached(path, mapped, true).map_err(|error| {
        Refusal::new(
            RefusalKind::Unsupported,
            format!(
                "sandbox: readOnlyInside {}: the kernel refused a read-only mount of it ({})",
                path.display(),
                crate::model::io_message(&error)
            ),
        )
    })?;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        Refusal::new(
            RefusalKind::InvalidArgument,
            format!("sandbox: readOnlyInside {} has a NUL byte", path.display()),
        )
    })?;
    Ok((c_path, tree))
}

/// The detached trees a root server's child in `cwd` with `roots` runs
/// in as the unprivileged user, or why it cannot.
fn identity_of(
    host: &HostConfig,
    roots: &[roots::Root],
    cwd: &Path,
) -> Result<Vec<(std::ffi::CString, OwnedFd)>, String> {
    use std::os::unix::ffi::OsStrExt;
    const KEEP_ROOT: &str =
        "keepRoot (capexec run --keep-root) runs it as root without capabilities";
    if host.hides(KernelFeature::IdmappedMounts) {
        return Err(format!(
            "idmapped mounts are hidden (--hide-kernel-feature idmapped-mounts); {KEEP_ROOT}"
        ));
    }
    if !probe::can_admin() {
        return Err(format!(
            "running it as an unprivileged user that owns root's files in its roots takes \
             idmapped mounts, which need CAP_SYS_ADMIN, and this root server has none (a \
             container's root has none); {KEEP_ROOT}"
        ));
    }
    identity::mapped_trees(roots, cwd)
        .into_iter()
        .map(|tree| {
            let mapped = identity::detached_mapped(&tree).map_err(|error| {
                format!(
                    "running it as an unprivileged user takes an idmapped mount of {}, where \
                     root's files become its own, and the kernel refused one ({}): its file \
                     system may not support them; {KEEP_ROOT}",
                    tree.display(),
                    crate::model::io_message(&error)
                )
            })?;
            let path = std::ffi::CString::new(tree.as_os_str().as_bytes())
                .map_err(|_| format!("{} has a NUL byte", tree.display()))?;
            Ok((path, mapped))
        })
        .collect()
}

/// The names of the limits `limits` sets.
fn limit_names(limits: &Limits) -> impl Iterator<Item = &'static str> {
    [
        (limits.memory_bytes.is_some(), name::LIMIT_MEMORY),
        (limits.max_pids.is_some(), name::LIMIT_PIDS),
        (limits.cpu_millis.is_some(), name::LIMIT_CPU),
    ]
    .into_iter()
    .filter(|(set, _)| *set)
    .map(|(_, what)| what)
}

/// `[capexec:unsupported]` naming what cannot be enforced, and why, and
/// how to start anyway (the field, and the flag of `capexec run`, whose
/// users read this most).
fn unsupported(what: &str, missing: &[(String, String)]) -> Refusal {
    let mut reasons: Vec<String> = Vec::new();
    for (_, why) in missing {
        if !reasons.contains(why) {
            reasons.push(why.clone());
        }
    }
    let names: Vec<&str> = missing.iter().map(|(name, _)| name.as_str()).collect();
    Refusal::new(
        RefusalKind::Unsupported,
        format!(
            "{what}: this server cannot enforce {} ({}); bestEffort (capexec run --best-effort) \
             starts it without them",
            names.join(", "),
            reasons.join("; ")
        ),
    )
}

/// Whether the peer of the accepted Unix socket `socket` is sandboxed (see
/// [`is_sandboxed_process`]); a peer that cannot be identified for sure
/// (gone already, its number possibly reused) counts as sandboxed.
pub fn peer_is_sandboxed(host: &HostConfig, socket: std::os::fd::RawFd) -> bool {
    const SO_PEERPIDFD: libc::c_int = 77;
    let mut credentials = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut length = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `length` bytes into `credentials`.
    let got = unsafe {
        libc::getsockopt(
            socket,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut credentials as *mut libc::ucred).cast(),
            &mut length,
        )
    };
    if got != 0 || credentials.pid <= 0 {
        // A peer in another pid namespace has no number here: nothing
        // capexec sandboxes is there.
        return false;
    }
    let mut pidfd: libc::c_int = -1;
    let mut length = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: as above, an int.
    let has_pidfd = unsafe {
        libc::getsockopt(
            socket,
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut pidfd as *mut libc::c_int).cast(),
            &mut length,
        )
    } == 0
        && pidfd >= 0;
    let sandboxed = is_sandboxed_process(host, credentials.pid);
    if has_pidfd {
        // SAFETY: the kernel just gave us this descriptor.
        let pidfd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(pidfd) };
        let mut pollfd = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&pidfd),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one descriptor we own, without waiting.
        let exited = unsafe { libc::poll(&mut pollfd, 1, 0) } > 0;
        // Gone before we looked: its number may name someone else now.
        return sandboxed || exited;
    }
    sandboxed
}

/// Whether process `pid` is a sandboxed process of a capexec server, or
/// started by one: it may not talk to a server. `host` is the asking
/// server's: without cgroups its sandboxed processes are told by their
/// no_new_privs and seccomp filter.
pub fn is_sandboxed_process(host: &HostConfig, pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    if let Ok(memberships) = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        && cgroup::in_sandbox_leaf(&memberships)
    {
        return true;
    }
    if cgroup_root(host).is_ok() {
        return false;
    }
    // Without cgroups: a sandboxed process has no_new_privs and a filter.
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| {
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .map(str::trim)
                .map(str::to_string)
        };
        field("NoNewPrivs:").as_deref() == Some("1") && field("Seccomp:").as_deref() == Some("2")
    })
}

/// Whether a process may start without the cgroup a server with cgroups
/// makes for it (`error` says why it could not be made). Not a sandboxed
/// one: the server tells its sandboxed processes by their cgroup (a
/// sandboxed process outside one would pass the peer checks of its Unix
/// and TCP connections to the server), so it is refused rather than
/// tracked by its process group. Nor one with limits, unless they are
/// best effort.
fn without_a_cgroup(
    sandboxed: bool,
    limits: &Limits,
    error: &dyn std::fmt::Display,
) -> Result<(), Refusal> {
    if sandboxed {
        return Err(Refusal::new(
            RefusalKind::Unsupported,
            format!(
                "sandbox: cannot make the process's cgroup, by which this server tells its \
                 sandboxed processes: {error}"
            ),
        ));
    }
    if !limits.is_empty() && !limits.best_effort {
        return Err(Refusal::new(
            RefusalKind::Unsupported,
            format!("limits: cannot make the process's cgroup: {error}"),
        ));
    }
    Ok(())
}

pub use self::tcp_peer::tcp_peer_is_sandboxed;

/// Policies' sandboxes, resolved: what a start may be given.
pub use self::roots::PolicySandbox;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandboxed_start_without_its_cgroup_is_refused_and_a_plain_one_goes_on() {
        let none = Limits::default();
        let refused = without_a_cgroup(true, &none, &"No space left on device")
            .expect_err("a sandboxed start is refused");
        assert_eq!(refused.kind, RefusalKind::Unsupported);
        assert!(
            refused
                .to_string()
                .contains("sandbox: cannot make the process's cgroup"),
            "{refused}"
        );
        assert!(without_a_cgroup(false, &none, &"EAGAIN").is_ok());
        let memory = Limits {
            memory_bytes: Some(1 << 20),
            ..Limits::default()
        };
        assert!(without_a_cgroup(false, &memory, &"EAGAIN").is_err());
        let best_effort = Limits {
            best_effort: true,
            ..memory
        };
        assert!(without_a_cgroup(false, &best_effort, &"EAGAIN").is_ok());
    }
}
