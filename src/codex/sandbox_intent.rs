//! Codex's sandbox intent (`process/start.sandbox`, and `sandbox` on the
//! `fs/*` calls) as capexec's confinement.
//!
//! Codex sends a portable permission profile: file-system entries (a path,
//! or a special one such as the project roots, with `read`, `write` or
//! `none`; the most specific entry containing a path decides its access),
//! and the network restricted or enabled. capexec's sandbox is Landlock,
//! whose rules are unions: a root's access reaches everything below it and
//! nothing can take it back. So an entry that gives a path less than an
//! entry above it (`.git` read-only inside a writable project root) is
//! carved out: the enclosing root is split along the path to it, every
//! sibling on the way keeping the enclosing access, the directories on the
//! way only what everything below them may have. What cannot be split
//! exactly comes out stricter (a new entry at the top of a split root
//! cannot be made; a symbolic link there grants nothing), or the start is
//! refused; never weaker. The root itself is always split: its entries are
//! readable, /proc, /sys and /dev only as capexec's system roots give them. The split is made from listings on the
//! executor's machine ([`Tree`]), and [`Plan::check_applied`] and
//! [`Plan::directory_for`] make sure that what the kernel was given is what
//! was listed.

use std::ffi::{OsStr, OsString};
use std::future::Future;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

use serde_json::Value;

use crate::capexec_capnp::executor;
use crate::client::Directory;
use crate::model::{FileKind, Network, Sandbox};

/// The `sandboxType` Codex knows for a Linux sandbox (Landlock and seccomp
/// here, bubblewrap and seccomp in Codex's own server).
pub const SANDBOX_TYPE_LINUX: &str = "linuxSeccomp";
/// The `sandboxType` of an unconfined process.
pub const SANDBOX_TYPE_NONE: &str = "none";

/// The most roots one confinement may have: a split root gives one per
/// entry of each directory on the way to what is carved out of it.
pub const MAX_ROOTS: usize = 2048;

/// What an entry allows, weakest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    None,
    Read,
    Write,
}

/// Why an intent is not turned into a confinement. Codex shows the message
/// as the command's failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IntentError {
    /// Not the shape of a Codex sandbox intent.
    Malformed(String),
    /// A restriction capexec cannot enforce as asked, nor more strictly.
    Unenforceable(String),
    /// The executor could not be asked what the roots hold, or its answer
    /// changed under the start.
    Executor(String),
}

impl IntentError {
    /// The JSON-RPC error code Codex's server uses for such a failure.
    pub fn code(&self) -> i64 {
        match self {
            IntentError::Malformed(_) => -32602,
            IntentError::Unenforceable(_) | IntentError::Executor(_) => -32603,
        }
    }

    pub fn message(&self) -> String {
        match self {
            IntentError::Malformed(why) => format!("invalid sandbox: {why}"),
            IntentError::Unenforceable(why) => {
                format!("sandbox cannot be enforced by this capexec executor: {why}")
            }
            IntentError::Executor(why) => format!("sandbox: {why}"),
        }
    }
}

impl std::fmt::Display for IntentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.message())
    }
}

impl std::error::Error for IntentError {}

/// Where an entry points before the start's environment is known.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Place {
    Path(PathBuf),
    /// The start's `$TMPDIR`, if it has one.
    Tmpdir,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    place: Place,
    access: Access,
    /// `missing_path_behavior: "skip"`: a missing path has no entry.
    skip_missing: bool,
}

/// A restricting intent, parsed: what [`Confinement::plan`] turns into
/// roots on the executor's machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Confinement {
    entries: Vec<Entry>,
    /// The root or the platform's minimal set is readable: capexec's system
    /// directories (and the devices programs need) stay in.
    system_roots: bool,
    network: Network,
    cwd: PathBuf,
    /// The bridge's `--root`: what the intent gives is narrowed to it.
    within: Option<PathBuf>,
}

/// What `sandboxType` answers for `confinement`.
pub fn sandbox_type(confinement: Option<&Confinement>) -> &'static str {
    match confinement {
        Some(_) => SANDBOX_TYPE_LINUX,
        None => SANDBOX_TYPE_NONE,
    }
}

/// The confinement Codex's `intent` asks for a start (or an `fs/*` call)
/// in `cwd` (absolute), with `enforce_network` (`enforceManagedNetwork`):
/// `None` when there is nothing to confine (no intent, or full access).
pub fn confinement_for(
    intent: Option<&Value>,
    cwd: &Path,
    enforce_network: bool,
) -> Result<Option<Confinement>, IntentError> {
    let intent = match intent {
        None | Some(Value::Null) => {
            if enforce_network {
                return Err(IntentError::Unenforceable(
                    "enforceManagedNetwork without a sandbox: capexec turns the network \
                     off only for a sandboxed process"
                        .into(),
                ));
            }
            return Ok(None);
        }
        Some(intent) => object(intent, "sandbox")?,
    };
    let cwd = match intent.get("cwd") {
        None | Some(Value::Null) => cwd.to_path_buf(),
        Some(value) => absolute_path(value, "sandbox.cwd")?,
    };
    let workspace_roots = match intent.get("workspaceRoots") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(roots)) => roots
            .iter()
            .map(|root| absolute_path(root, "sandbox.workspaceRoots[]"))
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err(malformed("sandbox.workspaceRoots is not a list")),
    };
    let permissions = object(
        intent
            .get("permissions")
            .ok_or_else(|| malformed("sandbox.permissions is missing"))?,
        "sandbox.permissions",
    )?;
    match text(permissions.get("type"), "sandbox.permissions.type")? {
        "managed" => {}
        "disabled" => {
            return if enforce_network {
                confinement_for(None, &cwd, true)
            } else {
                Ok(None)
            };
        }
        other => {
            return Err(IntentError::Unenforceable(format!(
                "permissions of type {other:?} (capexec enforces \"managed\" permissions)"
            )));
        }
    }
    let network = match text(permissions.get("network"), "sandbox.permissions.network")? {
        "restricted" => Network::None,
        // A managed network (a proxy with allowed domains) is more than
        // capexec offers: no network at all is the stricter answer.
        "enabled" if enforce_network => Network::None,
        "enabled" => Network::All,
        other => return Err(malformed(format!("unknown network {other:?}"))),
    };
    let file_system = object(
        permissions
            .get("file_system")
            .ok_or_else(|| malformed("sandbox.permissions.file_system is missing"))?,
        "sandbox.permissions.file_system",
    )?;
    match text(
        file_system.get("type"),
        "sandbox.permissions.file_system.type",
    )? {
        "restricted" => {}
        "unrestricted" if network == Network::All => return Ok(None),
        "unrestricted" => {
            return Err(IntentError::Unenforceable(
                "the network restricted with the whole file system writable: capexec \
                 turns the network off only inside a file-system sandbox"
                    .into(),
            ));
        }
        other => {
            return Err(IntentError::Unenforceable(format!(
                "a file system of type {other:?}"
            )));
        }
    }
    let listed = match file_system.get("entries") {
        Some(Value::Array(entries)) => entries,
        _ => {
            return Err(malformed(
                "sandbox.permissions.file_system.entries is not a list",
            ));
        }
    };
    let mut entries = Vec::new();
    let mut system_roots = false;
    for (index, entry) in listed.iter().enumerate() {
        let what = format!("sandbox.permissions.file_system.entries[{index}]");
        let entry = object(entry, &what)?;
        let access = match text(entry.get("access"), &format!("{what}.access"))? {
            "read" => Access::Read,
            "write" => Access::Write,
            "none" => Access::None,
            other => return Err(malformed(format!("{what}: unknown access {other:?}"))),
        };
        let skip_missing = match entry.get("missing_path_behavior") {
            None | Some(Value::Null) => false,
            Some(value) => value.as_str() == Some("skip"),
        };
        let path = object(
            entry
                .get("path")
                .ok_or_else(|| malformed(format!("{what}.path is missing")))?,
            &format!("{what}.path"),
        )?;
        let mut add = |place: Place| {
            entries.push(Entry {
                place,
                access,
                skip_missing,
            })
        };
        match text(path.get("type"), &format!("{what}.path.type"))? {
            "path" => add(Place::Path(absolute_path(
                path.get("path").unwrap_or(&Value::Null),
                &format!("{what}.path.path"),
            )?)),
            "special" => {
                let value = object(
                    path.get("value").unwrap_or(&Value::Null),
                    &format!("{what}.path.value"),
                )?;
                let subpath = match value.get("subpath") {
                    None | Some(Value::Null) => None,
                    Some(subpath) => Some(relative_path(subpath, &format!("{what} subpath"))?),
                };
                let kind = text(value.get("kind"), &format!("{what}.path.value.kind"))?;
                let below = |base: &Path| match &subpath {
                    Some(subpath) => base.join(subpath),
                    None => base.to_path_buf(),
                };
                match kind {
                    "root" => add(Place::Path(below(Path::new("/")))),
                    "minimal" if subpath.is_none() => match access {
                        Access::Read => system_roots = true,
                        Access::None => {}
                        Access::Write => {
                            return Err(IntentError::Unenforceable(
                                "the platform's minimal paths writable".into(),
                            ));
                        }
                    },
                    "current_working_directory" => add(Place::Path(below(&cwd))),
                    "project_roots" => {
                        for root in &workspace_roots {
                            add(Place::Path(below(root)));
                        }
                    }
                    "slash_tmp" => add(Place::Path(below(Path::new("/tmp")))),
                    "tmpdir" if subpath.is_none() => add(Place::Tmpdir),
                    other => {
                        return Err(IntentError::Unenforceable(format!(
                            "{what}: the special path {other:?}{}",
                            match &subpath {
                                Some(subpath) => format!(" with subpath {}", subpath.display()),
                                None => String::new(),
                            }
                        )));
                    }
                }
            }
            other => {
                return Err(IntentError::Unenforceable(format!(
                    "{what}: a path of type {other:?}"
                )));
            }
        }
    }
    if entries
        .iter()
        .any(|entry| entry.access >= Access::Read && entry.place == Place::Path(PathBuf::from("/")))
    {
        system_roots = true;
    }
    Ok(Some(Confinement {
        entries,
        system_roots,
        network,
        cwd,
        within: None,
    }))
}

/// How a path with less access than the root around it is carved out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Carving {
    /// The root is split along the path to it (any executor; nothing new
    /// can be made at the top of a split directory).
    Split,
    /// A read-only path directly inside a writable root is mounted
    /// read-only over itself (`Sandbox.readOnlyInside`; executors that
    /// list "sandbox-read-only-inside"), the root kept whole; anything
    /// else is split.
    Mount,
}

/// A root planned for the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedRoot {
    pub path: PathBuf,
    pub access: Access,
}

/// A confinement made concrete on one executor's machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Readable and writable roots (no `none`), each path once.
    pub roots: Vec<PlannedRoot>,
    /// Paths carved out of a root with more access, where they are on the
    /// executor's machine (symbolic links resolved): no writable root may
    /// be or contain one.
    pub protected: Vec<PathBuf>,
    /// Read-only paths directly inside a writable root, mounted read-only
    /// ([`Carving::Mount`]), where they are on the executor's machine.
    pub read_only_inside: Vec<PathBuf>,
    /// Directories split around what is carved out of them, with the
    /// access of the root they were split from and the names of their
    /// entries that are carved out or lead to what is.
    pub splits: Vec<Split>,
    pub system_roots: bool,
    pub network: Network,
}

/// A directory split around what is carved out of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    pub path: PathBuf,
    /// Where it is on the executor's machine (symbolic links resolved).
    pub real_path: PathBuf,
    pub access: Access,
    /// Its entries that are carved out, or lead to what is.
    pub reserved: Vec<OsString>,
}

/// One entry of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    pub name: OsString,
    pub kind: FileKind,
}

/// A directory listing as it is on the executor's machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listing {
    /// The directory itself, symbolic links resolved.
    pub real_path: PathBuf,
    pub entries: Vec<Listed>,
}

/// The executor's file system, as far as a plan needs it.
pub trait Tree {
    /// What `path` is (a final symbolic link not followed); `None` if it
    /// does not exist.
    fn kind(&self, path: &Path) -> impl Future<Output = Result<Option<FileKind>, String>>;
    /// The entries of directory `path`; `None` if it does not exist.
    fn list(&self, path: &Path) -> impl Future<Output = Result<Option<Listing>, String>>;
}

impl Confinement {
    /// The roots this confinement gives on `tree`'s machine, for a start
    /// whose `$TMPDIR` is `tmpdir`.
    pub async fn plan<T: Tree>(
        &self,
        tree: &T,
        tmpdir: Option<&OsStr>,
    ) -> Result<Plan, IntentError> {
        self.plan_carving(tree, tmpdir, Carving::Split).await
    }

    /// [`Confinement::plan`], carving as `carving` says.
    pub async fn plan_carving<T: Tree>(
        &self,
        tree: &T,
        tmpdir: Option<&OsStr>,
        carving: Carving,
    ) -> Result<Plan, IntentError> {
        // Every entry where it is on this machine (`$TMPDIR` known now).
        let mut placed: Vec<(PathBuf, Access, bool)> = Vec::new();
        for entry in &self.entries {
            let path = match &entry.place {
                Place::Path(path) => path.clone(),
                Place::Tmpdir => match tmpdir.filter(|dir| !dir.is_empty()) {
                    Some(dir) => absolute_path(
                        &Value::String(String::from_utf8_lossy(dir.as_bytes()).into_owned()),
                        "TMPDIR",
                    )?,
                    None => continue,
                },
            };
            placed.push((path, entry.access, entry.skip_missing));
        }
        let mut system_roots = self.system_roots;
        let mut network = self.network;
        if let Some(dir) = &self.within {
            if !self.cwd.starts_with(dir) {
                return Err(IntentError::Unenforceable(format!(
                    "the working directory {} is outside the bridge's --root {}",
                    self.cwd.display(),
                    dir.display()
                )));
            }
            // The root readable: so are the system directories, which the
            // directory's executor keeps readable.
            system_roots |= placed
                .iter()
                .any(|(path, access, _)| path == Path::new("/") && *access >= Access::Read);
            placed = narrowed_to(placed, dir);
            network = Network::None;
        }
        let all: Vec<(PathBuf, Access)> = placed
            .iter()
            .map(|(path, access, _)| (path.clone(), *access))
            .collect();
        let mut entries: Vec<(PathBuf, Access)> = Vec::new();
        for (path, access, skip_missing) in placed {
            let enclosing = entries_above(&all, &path).unwrap_or(Access::None);
            if access < enclosing || skip_missing {
                // Carved out of an entry above (or skipped when missing):
                // it must not be a symbolic link, whose target the carving
                // would miss.
                match tree.kind(&path).await.map_err(IntentError::Executor)? {
                    None if skip_missing => continue,
                    Some(FileKind::Symlink) if access < enclosing => {
                        return Err(IntentError::Unenforceable(format!(
                            "{} is a symbolic link: its target cannot be kept {} inside \
                             a root with more access",
                            path.display(),
                            if access == Access::None {
                                "out of reach"
                            } else {
                                "read-only"
                            }
                        )));
                    }
                    _ => {}
                }
            }
            match entries.iter_mut().find(|(known, _)| *known == path) {
                // The same path twice: the stricter entry stands.
                Some((_, known)) => *known = (*known).min(access),
                None => entries.push((path, access)),
            }
        }
        if system_roots {
            for (path, access) in &entries {
                if *access == Access::None && is_system_path(path) {
                    return Err(IntentError::Unenforceable(format!(
                        "{} out of reach inside the system directories, which capexec's \
                         sandbox keeps readable",
                        path.display()
                    )));
                }
            }
        }
        let mut planner = Planner {
            tree,
            entries: &entries,
            carving,
            roots: Vec::new(),
            protected: Vec::new(),
            read_only_inside: Vec::new(),
            splits: Vec::new(),
        };
        for (path, access) in &entries {
            if *access >= Access::Read {
                planner.split(path, *access).await?;
            }
        }
        let mut roots = planner.roots;
        roots.sort_by(|a, b| a.path.cmp(&b.path).then(b.access.cmp(&a.access)));
        roots.dedup_by(|later, first| later.path == first.path);
        // A root below one that gives it as much adds nothing.
        let implied = |root: &PlannedRoot| {
            roots.iter().any(|above| {
                above.path != root.path
                    && root.path.starts_with(&above.path)
                    && above.access >= root.access
            })
        };
        let roots: Vec<PlannedRoot> = roots
            .iter()
            .filter(|root| !implied(root))
            .cloned()
            .collect();
        let mut protected = planner.protected;
        protected.sort();
        protected.dedup();
        let mut read_only_inside = planner.read_only_inside;
        read_only_inside.sort();
        read_only_inside.dedup();
        let plan = Plan {
            roots,
            protected,
            read_only_inside,
            splits: planner.splits,
            system_roots,
            network,
        };
        // capexec always lets a start read its working directory (and all
        // below it): only where the plan gives that already.
        if plan.access_at(&self.cwd) < Access::Read {
            return Err(IntentError::Unenforceable(format!(
                "the working directory {} is not readable in the sandbox (with all \
                 below it), and a capexec start always may read its working directory",
                self.cwd.display()
            )));
        }
        Ok(plan)
    }

    /// This confinement narrowed to `dir` (the bridge's `--root`, whose
    /// executor lets commands write only beneath it, read the system
    /// directories, and reach no network): what the intent gives beneath
    /// `dir`, `dir` itself what the intent's deepest entry above it gives,
    /// nothing elsewhere but the system directories where the intent reads
    /// them, and no network. Stricter than the intent, never weaker.
    pub fn within(mut self, dir: Option<&Path>) -> Confinement {
        self.within = dir.map(Path::to_path_buf);
        self
    }

    /// The working directory the intent names (its own `cwd`, else the
    /// start's).
    pub fn cwd(&self) -> &Path {
        &self.cwd
    }

    pub fn network(&self) -> Network {
        self.network
    }
}

/// `placed` narrowed to `dir`: the entries beneath it, and `dir` itself
/// with the access of the deepest entry at or above it (if any).
fn narrowed_to(placed: Vec<(PathBuf, Access, bool)>, dir: &Path) -> Vec<(PathBuf, Access, bool)> {
    let at_dir = placed
        .iter()
        .filter(|(path, _, _)| dir.starts_with(path))
        .max_by_key(|(path, _, _)| path.components().count())
        .map(|(_, access, _)| *access);
    let mut narrowed: Vec<(PathBuf, Access, bool)> = at_dir
        .map(|access| (dir.to_path_buf(), access, false))
        .into_iter()
        .collect();
    narrowed.extend(
        placed
            .into_iter()
            .filter(|(path, _, _)| path.starts_with(dir) && path != dir),
    );
    narrowed
}

/// The access of the deepest entry strictly above `path`.
fn entries_above(entries: &[(PathBuf, Access)], path: &Path) -> Option<Access> {
    entries
        .iter()
        .filter(|(known, _)| path != known && path.starts_with(known))
        .max_by_key(|(known, _)| known.components().count())
        .map(|(_, access)| *access)
}

/// Directories of `/` that no split of `/` gives: the kernel's objects
/// (/sys), its view of processes (/proc) and devices (/dev), of which
/// capexec's system roots give what programs need (/proc, /dev/null...).
/// A root server's sandboxed child runs on idmapped mounts of its roots,
/// which these file systems cannot have.
const KERNEL_DIRECTORIES: [&str; 3] = ["/dev", "/proc", "/sys"];

/// capexec's system directories, readable in every sandbox that keeps
/// them (the schema's `Sandbox.readOnly`).
const SYSTEM_DIRECTORIES: [&str; 10] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/proc",
];

fn is_system_path(path: &Path) -> bool {
    path.starts_with("/dev") || system_directory_of(path).is_some()
}

/// The system directory `path` is in, if any.
fn system_directory_of(path: &Path) -> Option<&'static Path> {
    SYSTEM_DIRECTORIES
        .iter()
        .map(Path::new)
        .find(|dir| path.starts_with(dir))
}

struct Planner<'a, T> {
    tree: &'a T,
    entries: &'a [(PathBuf, Access)],
    carving: Carving,
    roots: Vec<PlannedRoot>,
    protected: Vec<PathBuf>,
    read_only_inside: Vec<PathBuf>,
    splits: Vec<Split>,
}

impl<T: Tree> Planner<'_, T> {
    /// Gives `dir` `access`, but nothing below it more than the entries
    /// below it allow.
    async fn split(&mut self, dir: &Path, access: Access) -> Result<(), IntentError> {
        let mut lower: Vec<(PathBuf, Access)> = self
            .entries
            .iter()
            .filter(|(path, below)| *below < access && path != dir && path.starts_with(dir))
            .cloned()
            .collect();
        if dir == Path::new("/") {
            // The root is never a root of its own: the kernel's
            // directories in it are left to capexec's system roots.
            lower.extend(
                KERNEL_DIRECTORIES
                    .iter()
                    .map(|path| (PathBuf::from(path), Access::None)),
            );
        }
        if lower.is_empty() {
            return self.push(dir, access);
        }
        // What every path below may have, so `dir` itself may have it.
        let floor = lower
            .iter()
            .map(|(_, below)| *below)
            .min()
            .unwrap_or(Access::None);
        if floor >= Access::Read {
            self.push(dir, floor)?;
        }
        let Some(listing) = self.tree.list(dir).await.map_err(IntentError::Executor)? else {
            return Ok(());
        };
        let mountable = self.carving == Carving::Mount
            && access == Access::Write
            && dir != Path::new("/")
            && lower.iter().all(|(path, below)| {
                *below == Access::Read
                    && path.parent() == Some(dir)
                    && listing
                        .entries
                        .iter()
                        .any(|listed| dir.join(&listed.name) == *path)
            });
        if mountable {
            // Kept whole; what is below it read-only by mounts, those that
            // exist (an entry whose path is missing has nothing to keep).
            self.push(dir, access)?;
            for listed in &listing.entries {
                if lower
                    .iter()
                    .any(|(path, _)| *path == dir.join(&listed.name))
                {
                    self.read_only_inside
                        .push(listing.real_path.join(&listed.name));
                }
            }
            return Ok(());
        }
        self.splits.push(Split {
            path: dir.to_path_buf(),
            real_path: listing.real_path.clone(),
            access,
            reserved: lower
                .iter()
                .filter_map(|(path, _)| path.strip_prefix(dir).ok()?.iter().next())
                .map(OsStr::to_os_string)
                .collect(),
        });
        for listed in &listing.entries {
            let child = dir.join(&listed.name);
            if KERNEL_DIRECTORIES
                .iter()
                .any(|path| Path::new(path) == child)
            {
                continue;
            }
            if lower.iter().any(|(path, _)| *path == child) {
                // Its own entry gives it its access.
                self.protected.push(listing.real_path.join(&listed.name));
                continue;
            }
            let leads_to_lower = lower.iter().any(|(path, _)| path.starts_with(&child));
            match (listed.kind, leads_to_lower) {
                (FileKind::Symlink, true) => {
                    return Err(IntentError::Unenforceable(format!(
                        "{} is a symbolic link on the way to a path with less access",
                        child.display()
                    )));
                }
                // A link's target keeps what its own roots give it.
                (FileKind::Symlink, false) => {}
                (FileKind::Directory, true) => Box::pin(self.split(&child, access)).await?,
                (FileKind::Directory | FileKind::File, false) => self.push(&child, access)?,
                // A socket, pipe or device: no root (stricter).
                _ => {}
            }
        }
        Ok(())
    }

    fn push(&mut self, path: &Path, access: Access) -> Result<(), IntentError> {
        if self.roots.len() >= MAX_ROOTS {
            return Err(IntentError::Unenforceable(format!(
                "more than {MAX_ROOTS} roots are needed to keep the read-only paths \
                 inside {} so",
                path.parent().unwrap_or(path).display()
            )));
        }
        self.roots.push(PlannedRoot {
            path: path.to_path_buf(),
            access,
        });
        Ok(())
    }
}

impl Plan {
    /// The capexec sandbox of a start under this plan. Nothing is best
    /// effort: a kernel that cannot enforce all of it refuses the start.
    pub fn sandbox(&self) -> Sandbox {
        let listed = |access: Access| {
            self.roots
                .iter()
                .filter(|root| root.access == access)
                .map(|root| root.path.clone())
                .collect()
        };
        Sandbox {
            read_only: listed(Access::Read),
            writable: listed(Access::Write),
            network: self.network,
            no_system_roots: !self.system_roots,
            read_only_cwd: true,
            allow_namespaces: false,
            keep_root: false,
            best_effort: false,
            // A server's secret in one of them (a token in /tmp, or under
            // /root): the root is split around it.
            leave_out_secrets: true,
            read_only_inside: self.read_only_inside.clone(),
        }
    }

    /// The access this plan gives `path` (the greatest of the roots above
    /// it, as Landlock unites them).
    pub fn access_at(&self, path: &Path) -> Access {
        let access = self
            .roots_of(path)
            .map(|root| root.access)
            .max()
            .unwrap_or(Access::None);
        if self
            .read_only_inside
            .iter()
            .any(|inside| path.starts_with(inside))
        {
            access.min(Access::Read)
        } else {
            access
        }
    }

    /// The roots above `path` (itself included), capexec's system
    /// directories among them when kept.
    fn roots_of<'a>(&'a self, path: &'a Path) -> impl Iterator<Item = PlannedRoot> + 'a {
        let system = system_directory_of(path)
            .filter(|_| self.system_roots)
            .map(|dir| PlannedRoot {
                path: dir.to_path_buf(),
                access: Access::Read,
            });
        self.roots
            .iter()
            .filter(move |root| path.starts_with(&root.path))
            .cloned()
            .chain(system)
    }

    /// The directory split from a writable root that `path` is an entry
    /// of, unless the entry is carved out or leads to what is.
    pub fn top_of_split(&self, path: &Path) -> Option<&Split> {
        let name = path.file_name()?;
        self.splits.iter().find(|split| {
            split.access == Access::Write
                && path.parent() == Some(split.path.as_path())
                && !split.reserved.iter().any(|reserved| reserved == name)
        })
    }

    /// Checks what the executor applied (the process's
    /// `confinement.sandbox`, symbolic links resolved): no writable root
    /// may be or contain a protected path, nor lie inside one. A root that
    /// changed into a link between the plan and the start would show here;
    /// the caller then ends the process and fails the start.
    pub fn check_applied(&self, applied: &Sandbox) -> Result<(), IntentError> {
        for root in &applied.writable {
            if let Some(protected) = self
                .protected
                .iter()
                .find(|protected| root.starts_with(protected) || protected.starts_with(root))
            {
                return Err(IntentError::Executor(format!(
                    "the writable root {} reaches {}, which must stay read-only: the \
                     workspace changed while the start was prepared",
                    root.display(),
                    protected.display()
                )));
            }
        }
        for inside in &self.read_only_inside {
            if !applied.read_only_inside.contains(inside) {
                return Err(IntentError::Executor(format!(
                    "the executor did not keep {} read-only inside its writable root",
                    inside.display()
                )));
            }
            if let Some(root) = applied
                .writable
                .iter()
                .find(|root| root.starts_with(inside))
            {
                return Err(IntentError::Executor(format!(
                    "the writable root {} is inside {}, which must stay read-only",
                    root.display(),
                    inside.display()
                )));
            }
        }
        if self.network == Network::None && applied.network != Network::None {
            return Err(IntentError::Executor(
                "the executor left the network on".into(),
            ));
        }
        Ok(())
    }

    /// A directory through which an `fs/*` call may reach `path` with
    /// `need` (read, or write), and `path` relative to it: the deepest
    /// planned root above `path` that gives `need`, read-only unless it
    /// is writable. Paths below it are resolved beneath it by the kernel;
    /// the root itself is checked to be where the plan listed it.
    pub async fn directory_for(
        &self,
        executor: &executor::Client,
        path: &Path,
        need: Access,
    ) -> Result<(Directory, PathBuf), IntentError> {
        let (root, _, directory) = self.confined_root(executor, path, need).await?;
        let path = normal(path).unwrap_or_default();
        let relative = path
            .strip_prefix(&root)
            .map(Path::to_path_buf)
            .unwrap_or_default();
        Ok((directory, relative))
    }

    /// The planned root [`Plan::directory_for`] reaches `path` through:
    /// its path, its access, and the directory (read-only unless
    /// writable).
    pub async fn confined_root(
        &self,
        executor: &executor::Client,
        path: &Path,
        need: Access,
    ) -> Result<(PathBuf, Access, Directory), IntentError> {
        let path = normal(path).ok_or_else(|| {
            malformed(format!(
                "{} is not an absolute, normal path",
                path.display()
            ))
        })?;
        if need == Access::Write
            && let Some(split) = self.top_of_split(&path)
        {
            // An entry at the top of a directory split from a writable
            // root: made, replaced or removed through that directory, by
            // its one name (nothing on the way to follow), where the
            // listing found it.
            let directory = Directory::open(executor, &split.path);
            let info = directory.info().await.map_err(|error| {
                IntentError::Executor(format!("{}: {error}", split.path.display()))
            })?;
            if info.path != split.real_path {
                return Err(IntentError::Executor(format!(
                    "{} moved while the call was prepared",
                    split.path.display()
                )));
            }
            return Ok((split.path.clone(), Access::Write, directory));
        }
        if self.access_at(&path) < need.max(Access::Read) {
            return Err(IntentError::Unenforceable(format!(
                "{} is not {} in the sandbox",
                path.display(),
                if need == Access::Write {
                    "writable"
                } else {
                    "readable"
                }
            )));
        }
        let root = self
            .roots_of(&path)
            .filter(|root| root.access >= need)
            .max_by_key(|root| root.path.components().count())
            .ok_or_else(|| IntentError::Unenforceable(format!("{} has no root", path.display())))?;
        let mut directory = Directory::open(executor, &root.path);
        if root.access == Access::Read {
            directory = directory.read_only();
        }
        if root.access == Access::Write {
            let info = directory.info().await.map_err(|error| {
                IntentError::Executor(format!("{}: {error}", root.path.display()))
            })?;
            self.check_applied(&Sandbox {
                writable: vec![info.path],
                network: self.network,
                ..Sandbox::default()
            })?;
        }
        Ok((root.path, root.access, directory))
    }
}

/// Why a confined start did not start.
#[derive(Debug)]
pub enum StartError {
    /// The intent cannot be enforced, or its plan did not hold.
    Intent(IntentError),
    /// The executor refused the start, or could not be reached.
    Start(crate::client::Error),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Intent(error) => write!(f, "{error}"),
            StartError::Start(error) => write!(f, "{error}"),
        }
    }
}

impl std::error::Error for StartError {}

/// How many times a start is planned again when a root it was given
/// vanished before the executor opened it (a workspace's entries come
/// and go).
const PLAN_ATTEMPTS: usize = 3;

impl Confinement {
    /// Plans this confinement on `executor`'s machine and gives `command`
    /// its sandbox: what [`Confinement::start`] does before it starts,
    /// for a caller that starts otherwise (it then checks the applied
    /// sandbox with [`Plan::check_applied`]).
    pub async fn prepare(
        &self,
        executor: &executor::Client,
        command: &mut crate::client::Command,
        tmpdir: Option<&OsStr>,
        carving: Carving,
    ) -> Result<Plan, IntentError> {
        let plan = self
            .plan_carving(&ExecutorTree::new(executor.clone()), tmpdir, carving)
            .await?;
        command.sandbox(plan.sandbox());
        Ok(plan)
    }

    /// Starts `command` on `executor` confined by this intent: planned,
    /// started, and the sandbox the executor applied checked against the
    /// plan (a process whose sandbox does not hold is released, which ends
    /// it, and the start fails). Planned again if a root vanished between
    /// the plan and the start.
    pub async fn start(
        &self,
        executor: &executor::Client,
        command: &mut crate::client::Command,
        tmpdir: Option<&OsStr>,
        carving: Carving,
    ) -> Result<crate::client::RemoteProcess, StartError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let plan = self
                .prepare(executor, command, tmpdir, carving)
                .await
                .map_err(StartError::Intent)?;
            let process = match command.spawn(executor).await {
                Ok(process) => process,
                Err(error) if attempt < PLAN_ATTEMPTS && vanished_root(&error) => continue,
                Err(error) => return Err(StartError::Start(error)),
            };
            let info = process.info().await.map_err(StartError::Start)?;
            let Some(applied) = info.confinement.sandbox else {
                return Err(StartError::Intent(IntentError::Executor(
                    "the executor started the process without a sandbox".into(),
                )));
            };
            plan.check_applied(&applied).map_err(StartError::Intent)?;
            return Ok(process);
        }
    }
}

/// A refused start whose reason is a root that no longer exists.
fn vanished_root(error: &crate::client::Error) -> bool {
    use crate::model::RefusalKind;
    // Where the roots are resolved (`invalid-argument`), prepared as
    // mounts for a root server's child (`unsupported`), opened for
    // Landlock, or mounted in the child (`spawn-failed`).
    matches!(error, crate::client::Error::Refused(refusal)
        if matches!(
            refusal.kind,
            RefusalKind::InvalidArgument | RefusalKind::Unsupported | RefusalKind::SpawnFailed
        ) && (refusal.message.starts_with("sandbox: ")
            || refusal.message.starts_with("cannot confine "))
            && refusal.message.contains("No such file or directory"))
}

/// The executor's file system through its `Directory` capabilities.
pub struct ExecutorTree {
    executor: executor::Client,
}

impl ExecutorTree {
    pub fn new(executor: executor::Client) -> ExecutorTree {
        ExecutorTree { executor }
    }
}

impl Tree for ExecutorTree {
    async fn kind(&self, path: &Path) -> Result<Option<FileKind>, String> {
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Ok(Some(FileKind::Directory));
        };
        let directory = Directory::open(&self.executor, parent);
        match directory.symlink_metadata(name).await {
            Ok(stat) => Ok(Some(stat.kind)),
            Err(error) if is_missing(&error) => Ok(None),
            Err(error) => Err(format!("{}: {error}", path.display())),
        }
    }

    async fn list(&self, path: &Path) -> Result<Option<Listing>, String> {
        let directory = Directory::open(&self.executor, path);
        let info = match directory.info().await {
            Ok(info) => info,
            Err(error) if is_missing(&error) => return Ok(None),
            Err(error) => return Err(format!("{}: {error}", path.display())),
        };
        let entries = directory
            .read_dir(".")
            .await
            .collect_all()
            .await
            .map_err(|error| format!("listing {}: {error}", path.display()))?;
        Ok(Some(Listing {
            real_path: info.path,
            entries: entries
                .into_iter()
                .map(|entry| Listed {
                    name: OsString::from_vec(entry.path),
                    kind: entry
                        .stat
                        .map(|stat| stat.kind)
                        .unwrap_or(FileKind::Unknown),
                })
                .collect(),
        }))
    }
}

fn is_missing(error: &crate::client::Error) -> bool {
    matches!(error, crate::client::Error::Refused(refusal)
        if matches!(refusal.kind, crate::model::RefusalKind::NotFound | crate::model::RefusalKind::BadCwd))
}

fn malformed(why: impl Into<String>) -> IntentError {
    IntentError::Malformed(why.into())
}

fn object<'a>(
    value: &'a Value,
    what: &str,
) -> Result<&'a serde_json::Map<String, Value>, IntentError> {
    value
        .as_object()
        .ok_or_else(|| malformed(format!("{what} is not an object")))
}

fn text<'a>(value: Option<&'a Value>, what: &str) -> Result<&'a str, IntentError> {
    value
        .and_then(Value::as_str)
        .ok_or_else(|| malformed(format!("{what} is not a string")))
}

/// An absolute path: a `file://` URI (how Codex sends paths) or a plain
/// absolute path, without `..` (which only the executor could resolve).
fn absolute_path(value: &Value, what: &str) -> Result<PathBuf, IntentError> {
    let text = value
        .as_str()
        .ok_or_else(|| malformed(format!("{what} is not a string")))?;
    let path = match text.strip_prefix("file://") {
        Some(rest) => PathBuf::from(OsString::from_vec(
            percent_decode(rest)
                .ok_or_else(|| malformed(format!("{what}: {text:?} is not a valid file URI")))?,
        )),
        None => PathBuf::from(text),
    };
    normal(&path).ok_or_else(|| {
        malformed(format!(
            "{what}: {text:?} is not an absolute path without `..`"
        ))
    })
}

fn relative_path(value: &Value, what: &str) -> Result<PathBuf, IntentError> {
    let text = value
        .as_str()
        .ok_or_else(|| malformed(format!("{what} is not a string")))?;
    let path = Path::new(text);
    if path
        .components()
        .all(|component| matches!(component, Component::Normal(_) | Component::CurDir))
        && !text.is_empty()
    {
        Ok(path.components().collect())
    } else {
        Err(malformed(format!(
            "{what}: {text:?} is not a relative path below its root"
        )))
    }
}

/// `path` without `.` components; `None` unless absolute and free of `..`.
fn normal(path: &Path) -> Option<PathBuf> {
    if !path.is_absolute() {
        return None;
    }
    let mut result = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => result.push(part),
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    Some(result)
}

fn percent_decode(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = std::str::from_utf8(bytes.get(index + 1..index + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            index += 3;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    Some(out)
}

#[cfg(test)]
#[path = "sandbox_intent_tests.rs"]
mod tests;
