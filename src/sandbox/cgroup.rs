//! A cgroup per process: tracking that nothing a process starts can leave
//! (`setsid` and double forks included), ending all of it at once
//! (`cgroup.kill`), knowing when it is empty (`cgroup.events`, which wakes
//! pollers with POLLPRI), and limits.
//!
//! Each capexec process makes one root, `capexec-<pid>-<random>`, in its
//! own cgroup2 group, and a leaf in it per process: `p-<n>`, or `s-<n>`
//! for a sandboxed one (which is how servers recognise sandboxed peers).
//! Limits use the cgroup2 controllers where the root can have them, else,
//! on hybrid hosts, the cgroup v1 hierarchies that hold the memory, pids
//! and cpu controllers: there the root and the leaves are mirrored under
//! the process's own v1 groups, and the child joins both.
//!
//! The root is flock'ed by its process (and by its sentinel, see
//! `sentinel.rs`), so that a later process can tell a root whose owners
//! are gone from a live one without trusting pids, whichever pid namespace
//! it sits in: it cleans up the roots it can lock.
//!
//! A process that may write `cgroup.procs` files (a root server's child:
//! it owns them) could move itself to a cgroup outside its leaf and
//! outlive its release. Where the server can, each child gets a cgroup
//! namespace rooted at its leaf, and the hierarchy treats namespaces as
//! delegation boundaries (`nsdelegate`): the kernel then refuses any move
//! into or out of the namespace's subtree (ENOENT) and any write to the
//! leaf's own limits from inside it.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::model::Limits;
use crate::sandbox::mounts::{self, Mount};
use crate::sandbox::sentinel::{self, Sentinel};

/// The period of CPU limits, in microseconds (the kernels' default).
const CPU_PERIOD_MICROS: u64 = 100_000;

/// Where a controller is.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) enum Place {
    /// Enabled for the root's leaves in the cgroup2 hierarchy.
    V2,
    /// A cgroup v1 hierarchy: the root's mirror there.
    V1(PathBuf),
}

/// The controllers limits can use.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Controllers {
    pub memory: Option<Place>,
    pub pids: Option<Place>,
    pub cpu: Option<Place>,
}

/// This process's cgroup root.
pub(crate) struct CgroupRoot {
    /// The root's cgroup2 directory.
    dir: PathBuf,
    /// The root as `/proc/PID/cgroup` names it (`0::` lines).
    path: String,
    /// The cgroup2 hierarchy's mount, where cgroups are looked up by id
    /// (see [`CgroupRoot::sandboxed_cgroup`]).
    hierarchy: Mount,
    controllers: Controllers,
    /// Whether children are put in a cgroup namespace at their leaf, which
    /// the kernel keeps them in (see [`namespaces_are_boundaries`]).
    namespaced: bool,
    /// The v1 mirrors of the root made so far (see [`Self::make_v1_root`]).
    v1_made: Mutex<Vec<PathBuf>>,
    next: AtomicU64,
    _lock: OwnedFd,
    _sentinel: Sentinel,
}

static ROOT: OnceLock<Result<Arc<CgroupRoot>, String>> = OnceLock::new();

/// The cgroup (as `/proc/PID/cgroup` names it) this process makes its
/// root in, if not its own: a user's worker's, which the root process
/// that started it delegated to the user (see [`delegate`]).
static ROOT_PARENT: OnceLock<String> = OnceLock::new();

/// Makes this process's root in `group` (as `/proc/PID/cgroup` names a
/// cgroup) instead of in its own; must come before anything uses the root.
pub fn make_root_in(group: String) -> Result<(), String> {
    if ROOT.get().is_some() {
        return Err("the cgroup root was made before its parent was given".to_string());
    }
    ROOT_PARENT
        .set(group)
        .map_err(|_| "the cgroup root's parent was given twice".to_string())
}

/// A cgroup made in this process's root for another user (a user's
/// worker): the user may make cgroups in it and move its processes among
/// them, and nothing outside it, since every ancestor is root's. The
/// process started in it joins `worker` below it (a group with processes
/// cannot pass controllers on, so the worker's own cgroups are its
/// siblings); this process's sentinel kills and removes it with the root.
pub struct DelegatedGroup {
    /// The group's directory.
    pub dir: PathBuf,
    /// The group as `/proc/PID/cgroup` names it (a worker's
    /// `--cgroup-parent`).
    pub path: String,
    /// `worker`'s `cgroup.procs`, open for writing: the started process
    /// writes itself there before it takes the user's ids.
    pub worker_procs: OwnedFd,
}

/// Makes `name` in this process's root, the user `uid`'s (group `gid`).
pub fn delegate(name: &str, uid: u32, gid: u32) -> Result<DelegatedGroup, String> {
    let root = root().map_err(str::to_string)?;
    let failed = |what: &Path, error: io::Error| {
        format!("{}: {}", what.display(), crate::model::io_message(&error))
    };
    let dir = root.dir.join(name);
    std::fs::create_dir(&dir).map_err(|error| failed(&dir, error))?;
    let made = Made(dir.clone());
    // The files delegation hands over (cgroup-v2.rst, "Delegation
    // Containment"): the directory, to make cgroups in; cgroup.procs and
    // cgroup.threads, so that moves among them are the user's (the kernel
    // checks the common ancestor's); cgroup.subtree_control, to pass
    // controllers on.
    for file in [
        "",
        "cgroup.procs",
        "cgroup.threads",
        "cgroup.subtree_control",
    ] {
        let path = if file.is_empty() {
            dir.clone()
        } else {
            dir.join(file)
        };
        std::os::unix::fs::chown(&path, Some(uid), Some(gid))
            .map_err(|error| failed(&path, error))?;
    }
    let worker = dir.join("worker");
    std::fs::create_dir(&worker).map_err(|error| failed(&worker, error))?;
    let worker_procs = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(worker.join("cgroup.procs"))
        .map_err(|error| failed(&worker, error))?;
    std::mem::forget(made);
    Ok(DelegatedGroup {
        path: format!("{}/{name}", root.path.trim_end_matches('/')),
        dir,
        worker_procs: worker_procs.into(),
    })
}

/// Removes a delegated group whose process has ended, with what is left
/// below it (kills what still runs there first).
pub fn remove_delegated(dir: &Path) {
    let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    wait_empty_blocking(dir, Duration::from_secs(1));
    remove_tree(dir);
}

/// The cgroup root as an upgrade hands it to the next binary (same
/// process): its lock and its sentinel's pipe stay open across the exec,
/// so the sentinel goes on guarding the same root.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct RootState {
    dir: PathBuf,
    path: String,
    controllers: Controllers,
    namespaced: bool,
    v1_made: Vec<PathBuf>,
    next: u64,
    lock: std::os::fd::RawFd,
    sentinel: std::os::fd::RawFd,
}

impl RootState {
    pub fn lock_fd(&self) -> std::os::fd::RawFd {
        self.lock
    }

    pub fn sentinel_fd(&self) -> std::os::fd::RawFd {
        self.sentinel
    }
}

/// This process's root, if it made one, for a hand-over; the descriptors
/// it names must stay open across the exec.
pub fn root_for_handover() -> Option<RootState> {
    let root = ROOT.get()?.as_ref().ok()?;
    Some(RootState {
        dir: root.dir.clone(),
        path: root.path.clone(),
        controllers: root.controllers.clone(),
        namespaced: root.namespaced,
        v1_made: root
            .v1_made
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone(),
        next: root.next.load(Ordering::Relaxed),
        lock: root._lock.as_raw_fd(),
        sentinel: root._sentinel.raw_fd(),
    })
}

/// Takes over the root the binary before handed over; must come before
/// anything uses the root.
pub fn take_over_root(state: RootState) -> Result<(), String> {
    let hierarchy = mounts::mounts()
        .into_iter()
        .find(|mount| mount.fstype == "cgroup2")
        .ok_or("no cgroup2 hierarchy is mounted")?;
    // SAFETY: kept open across the exec for us, owned by nothing else.
    let (lock, sentinel) = unsafe {
        libc::fcntl(state.lock, libc::F_SETFD, libc::FD_CLOEXEC);
        libc::fcntl(state.sentinel, libc::F_SETFD, libc::FD_CLOEXEC);
        (
            OwnedFd::from_raw_fd(state.lock),
            OwnedFd::from_raw_fd(state.sentinel),
        )
    };
    let root = CgroupRoot {
        dir: state.dir,
        path: state.path,
        hierarchy,
        controllers: state.controllers,
        namespaced: state.namespaced,
        v1_made: Mutex::new(state.v1_made),
        next: AtomicU64::new(state.next),
        _lock: lock,
        _sentinel: Sentinel::taken_over(sentinel),
    };
    ROOT.set(Ok(Arc::new(root)))
        .map_err(|_| "the cgroup root was made before the hand-over was read".to_string())
}

/// The process's root, made on first use; why there is none otherwise.
pub(crate) fn root() -> Result<&'static Arc<CgroupRoot>, &'static str> {
    ROOT.get_or_init(|| {
        let root = CgroupRoot::create().map(Arc::new);
        if let Err(reason) = &root {
            tracing::info!("no cgroup tracking: {reason}");
        }
        root
    })
    .as_ref()
    .map_err(String::as_str)
}

impl CgroupRoot {
    fn create() -> Result<CgroupRoot, String> {
        let mounts = mounts::mounts();
        let memberships = std::fs::read_to_string("/proc/self/cgroup")
            .map_err(|error| format!("cannot read /proc/self/cgroup: {error}"))?;
        let v2 = mounts
            .iter()
            .find(|mount| mount.fstype == "cgroup2")
            .ok_or("no cgroup2 hierarchy is mounted")?;
        let own = match ROOT_PARENT.get() {
            Some(given) => given.as_str(),
            None => memberships
                .lines()
                .find_map(|line| line.strip_prefix("0::"))
                .ok_or("this process is in no cgroup2 group")?,
        };
        let parent = inside(v2, own);
        let hierarchy = v2.clone();
        let namespaced = crate::sandbox::probe::can_admin() && namespaces_are_boundaries(v2);
        let (name, dir, made, lock) = make_locked_root(&parent)?;
        if !dir.join("cgroup.kill").exists() {
            return Err("the kernel cannot kill a cgroup (cgroup.kill needs Linux 5.14)".into());
        }
        let mut controllers = enable_v2_controllers(&parent, &dir);
        // The v1 mirrors of the root are made by the first start that sets
        // a limit there (most starts set none): here only the groups they
        // go in, if this process may make them.
        let mut v1_parents = Vec::new();
        for (controller, slot) in [
            ("memory", &mut controllers.memory),
            ("pids", &mut controllers.pids),
            ("cpu", &mut controllers.cpu),
        ] {
            if slot.is_some() {
                continue;
            }
            if let Some(v1_parent) = v1_group(&mounts, &memberships, controller)
                && writable_dir(&v1_parent)
            {
                *slot = Some(Place::V1(v1_parent.join(&name)));
                if !v1_parents.contains(&v1_parent) {
                    v1_parents.push(v1_parent);
                }
            }
        }
        let sentinel = sentinel::start(&lock, &dir, &v1_parents, &name)
            .map_err(|error| format!("cannot start the cgroup sentinel: {error}"))?;
        std::mem::forget(made);
        let path = format!("{}/{name}", own.trim_end_matches('/'));
        let stale = StaleRoots {
            parent,
            own_name: name,
            v1_parents,
        };
        let _ = std::thread::Builder::new()
            .name("capexec-cgroup-cleanup".into())
            .spawn(move || stale.clean());
        Ok(CgroupRoot {
            dir,
            path,
            hierarchy,
            controllers,
            namespaced,
            v1_made: Mutex::new(Vec::new()),
            next: AtomicU64::new(1),
            _lock: lock,
            _sentinel: sentinel,
        })
    }

    pub fn controllers(&self) -> &Controllers {
        &self.controllers
    }

    /// Whether each child gets a cgroup namespace at its leaf, out of
    /// which the kernel moves nothing.
    pub fn namespaced(&self) -> bool {
        self.namespaced
    }

    /// Whether the cgroup numbered `id` (a cgroup id: the inode number of
    /// its directory, as the kernel names a socket's cgroup) is a sandbox
    /// leaf of a capexec process or below one, as [`in_sandbox_leaf`]
    /// tells it from a process's memberships; `None` if this process
    /// cannot tell: the cgroup is gone or out of its sight, or it is the
    /// hierarchy's root on a kernel that also names the root for sockets
    /// it did not attribute (see [`sockets_name_their_cgroup`]).
    ///
    /// This process's live leaves are known by id. Another cgroup is
    /// looked for in the hierarchy, one walk at a time (lookups of the
    /// same new cgroup at once wait for the first), and what is found is
    /// remembered: a cgroup2 directory is never renamed or moved and the
    /// kernel never numbers two alike, so an id names one path for good.
    pub fn sandboxed_cgroup(&self, id: u64) -> Option<bool> {
        if id == HIERARCHY_ROOT_ID && !sockets_name_their_cgroup() {
            return None;
        }
        if let Some(&sandboxed) = held(&LEAVES).get(&id) {
            return Some(sandboxed);
        }
        if let Some(&known) = held(&FOUND).get(&id) {
            return known;
        }
        let _walking = held(&WALKING);
        if let Some(&known) = held(&FOUND).get(&id) {
            return known;
        }
        let known = match find(&self.hierarchy, id) {
            Walk::Found(path) => Some(path_in_sandbox_leaf(&path.to_string_lossy())),
            Walk::NotThere => None,
            // Perhaps in what could not be read: not remembered.
            Walk::Unread => return None,
        };
        let mut found = held(&FOUND);
        if found.len() >= FOUND_AT_MOST {
            found.clear();
        }
        found.insert(id, known);
        known
    }

    /// Makes the root's mirror `v1_root` (one of its v1 places) unless it
    /// is made already; its sentinel removes it with the root.
    fn make_v1_root(&self, v1_root: &Path) -> io::Result<()> {
        let mut made = self.v1_made.lock().unwrap_or_else(|p| p.into_inner());
        if made.iter().any(|root| root == v1_root) {
            return Ok(());
        }
        match std::fs::create_dir(v1_root) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
            Err(error) => {
                return Err(io::Error::new(
                    error.kind(),
                    format!("cannot create {}: {error}", v1_root.display()),
                ));
            }
        }
        made.push(v1_root.to_path_buf());
        Ok(())
    }
}

/// This process's leaves not dropped yet, by cgroup id, each with whether
/// it is sandboxed: registered before a child is cloned into one.
static LEAVES: Mutex<BTreeMap<u64, bool>> = Mutex::new(BTreeMap::new());

/// What walks of the hierarchy found of other cgroups, by id: whether
/// each is a sandbox leaf or below one, `None` for one not there (gone for
/// good: ids are not reused); forgotten all at once beyond
/// [`FOUND_AT_MOST`].
static FOUND: Mutex<BTreeMap<u64, Option<bool>>> = Mutex::new(BTreeMap::new());

/// Held during a walk of the hierarchy.
static WALKING: Mutex<()> = Mutex::new(());

const FOUND_AT_MOST: usize = 4096;

/// The id of the cgroup2 hierarchy's root (on 64-bit kernels, where an id
/// is the inode number; on 32-bit ones inode numbers are an id's low half,
/// so no directory is ever found by id there and peers are looked up as
/// without ids).
const HIERARCHY_ROOT_ID: u64 = 1;

fn held<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether the kernel names a socket's own cgroup whatever else is
/// configured: before Linux 5.15, once a cgroup v1 net_cls or net_prio
/// controller had been configured, it named the hierarchy's root for every
/// socket made after (the root then says nothing of a socket's maker). A
/// kernel whose version cannot be read counts as older.
fn sockets_name_their_cgroup() -> bool {
    static FAITHFUL: OnceLock<bool> = OnceLock::new();
    *FAITHFUL.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .is_ok_and(|release| release_at_least(&release, (5, 15)))
    })
}

/// Whether a kernel release (`6.18.44-…`) is at least `version`.
fn release_at_least(release: &str, version: (u32, u32)) -> bool {
    let mut numbers = release.trim().split(['.', '-']);
    let mut next = || numbers.next().and_then(|number| number.parse::<u32>().ok());
    match (next(), next()) {
        (Some(major), Some(minor)) => (major, minor) >= version,
        _ => false,
    }
}

/// What a walk of the hierarchy found.
enum Walk {
    /// The cgroup, as `/proc/PID/cgroup` names it.
    Found(PathBuf),
    NotThere,
    /// Not found, and some directory could not be read.
    Unread,
}

/// The cgroup whose id is `id` in the cgroup2 hierarchy mounted as
/// `mount`, looked for directory by directory (the entries carry the
/// inode numbers, so nothing is stat'ed). Its ancestors cannot go while
/// it is there, so a walk while others come and go still finds it. A
/// directory numbered above `id` is not entered: the kernel numbers a
/// hierarchy's directories in the order they are made (kernfs: 64-bit
/// ids, the high half counting the wraps of the low one), so none made
/// after the cgroup holds it. Were that ever untrue, a cgroup would go
/// unfound, and its peers be looked up through the processes.
fn find(mount: &Mount, id: u64) -> Walk {
    use std::os::unix::fs::{DirEntryExt, MetadataExt};
    match std::fs::metadata(&mount.point) {
        Ok(top) if top.ino() == id => return Walk::Found(mount.root.clone()),
        Ok(_) => {}
        Err(_) => return Walk::Unread,
    }
    let mut unread = false;
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(mount.point.join(&relative)) else {
            unread = true;
            continue;
        };
        for entry in entries {
            let Ok(entry) = entry else {
                unread = true;
                break;
            };
            match entry.file_type() {
                Ok(kind) if kind.is_dir() => {}
                Ok(_) => continue,
                Err(_) => {
                    unread = true;
                    continue;
                }
            }
            let child = relative.join(entry.file_name());
            if entry.ino() == id {
                return Walk::Found(mount.root.join(child));
            }
            if entry.ino() < id {
                pending.push(child);
            }
        }
    }
    if unread { Walk::Unread } else { Walk::NotThere }
}

/// The cgroup2 options a reconfiguration must say again to keep them (it
/// sets exactly the flags it is given).
const CGROUP2_FLAGS: &[&str] = &[
    "nsdelegate",
    "favordynmods",
    "memory_localevents",
    "memory_recursiveprot",
    "memory_hugetlb_accounting",
    "pids_localevents",
];

/// Whether the cgroup2 hierarchy mounted at `v2` treats cgroup namespaces
/// as delegation boundaries (`nsdelegate`), turning it on if it is off:
/// systemd mounts cgroup2 with it, hosts without systemd often do not. The
/// hierarchy's other options are kept; the kernel takes the change only
/// from the initial cgroup namespace, so it is read back. This changes the
/// host's hierarchy for good (as systemd sets it): only processes in
/// cgroup namespaces see a difference.
fn namespaces_are_boundaries(v2: &Mount) -> bool {
    let delegates = |options: &str| options.split(',').any(|option| option == "nsdelegate");
    if delegates(&v2.super_options) {
        return true;
    }
    let mut flags: Vec<&str> = v2
        .super_options
        .split(',')
        .filter(|option| !matches!(*option, "" | "rw" | "ro"))
        .collect();
    if let Some(unknown) = flags.iter().find(|flag| !CGROUP2_FLAGS.contains(flag)) {
        tracing::warn!(
            option = unknown,
            "cannot turn on the cgroup2 hierarchy's nsdelegate without knowing all its options: \
             children can move themselves out of their cgroups"
        );
        return false;
    }
    flags.push("nsdelegate");
    let reconfigured = rustix::mount::fspick(
        rustix::fs::CWD,
        v2.point.as_path(),
        rustix::mount::FsPickFlags::FSPICK_CLOEXEC,
    )
    .and_then(|context| {
        for flag in &flags {
            rustix::mount::fsconfig_set_flag(&context, *flag)?;
        }
        rustix::mount::fsconfig_reconfigure(&context)
    });
    if let Err(error) = reconfigured {
        tracing::warn!(
            %error,
            "cannot turn on the cgroup2 hierarchy's nsdelegate: children can move themselves \
             out of their cgroups"
        );
        return false;
    }
    let taken = mounts::mounts().iter().any(|mount| {
        mount.point == v2.point && mount.fstype == "cgroup2" && delegates(&mount.super_options)
    });
    if taken {
        tracing::info!(
            mount = %v2.point.display(),
            "turned on nsdelegate on the cgroup2 hierarchy: each child's cgroup namespace keeps \
             it in its cgroup"
        );
    }
    taken
}

/// Whether `dir` is a directory this process may make cgroups in.
fn writable_dir(dir: &Path) -> bool {
    let Ok(path) = CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access(2) reads a NUL-terminated path.
    dir.is_dir() && unsafe { libc::access(path.as_ptr(), libc::W_OK) } == 0
}

/// Removes a directory made during a creation that failed.
struct Made(PathBuf);

impl Drop for Made {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// `group` (a path as `/proc/self/cgroup` says it) under `mount`.
pub(super) fn inside(mount: &Mount, group: &str) -> PathBuf {
    let relative = Path::new(group)
        .strip_prefix(&mount.root)
        .unwrap_or(Path::new(group));
    let relative = relative.strip_prefix("/").unwrap_or(relative);
    mount.point.join(relative)
}

/// This process's group in the v1 hierarchy that holds `controller`.
fn v1_group(mounts: &[Mount], memberships: &str, controller: &str) -> Option<PathBuf> {
    let has = |list: &str| list.split(',').any(|item| item == controller);
    let mount = mounts
        .iter()
        .find(|mount| mount.fstype == "cgroup" && has(&mount.super_options))?;
    let group = memberships.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        has(controllers).then_some(path)
    })?;
    Some(inside(mount, group))
}

/// Enables the memory, pids and cpu controllers for the root's leaves as
/// far as the root's parent offers them (asking the parent to pass them
/// down, which fails where it holds processes itself).
fn enable_v2_controllers(parent: &Path, root: &Path) -> Controllers {
    let listed = |dir: &Path, file: &str| -> Vec<String> {
        std::fs::read_to_string(dir.join(file))
            .map(|text| text.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default()
    };
    let wanted = ["memory", "pids", "cpu"];
    let mut available = listed(root, "cgroup.controllers");
    let offered = listed(parent, "cgroup.controllers");
    for controller in wanted {
        if !available.iter().any(|c| c == controller) && offered.iter().any(|c| c == controller) {
            let _ = std::fs::write(
                parent.join("cgroup.subtree_control"),
                format!("+{controller}"),
            );
        }
    }
    available = listed(root, "cgroup.controllers");
    let mut controllers = Controllers::default();
    for controller in wanted {
        if available.iter().any(|c| c == controller)
            && std::fs::write(
                root.join("cgroup.subtree_control"),
                format!("+{controller}"),
            )
            .is_ok()
        {
            let slot = match controller {
                "memory" => &mut controllers.memory,
                "pids" => &mut controllers.pids,
                _ => &mut controllers.cpu,
            };
            *slot = Some(Place::V2);
        }
    }
    controllers
}

fn random() -> u32 {
    let mut bytes = [0u8; 4];
    // SAFETY: getrandom writes at most 4 bytes into `bytes`.
    let filled = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if filled != 4 {
        // Uniqueness only: the pid and the time will do.
        return std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |time| time.subsec_nanos());
    }
    u32::from_ne_bytes(bytes)
}

/// Attempts at a root of our own: another capexec's sweep may take a fresh
/// root for a dead one's between its mkdir and its flock.
const ROOT_ATTEMPTS: usize = 5;

/// Makes a root `capexec-PID-RANDOM` under `parent` and locks it; if a
/// sweep got to it first (it holds the lock, or removed it), makes another.
fn make_locked_root(parent: &Path) -> Result<(String, PathBuf, Made, OwnedFd), String> {
    for _ in 0..ROOT_ATTEMPTS {
        let name = format!("capexec-{}-{:08x}", std::process::id(), random());
        let dir = parent.join(&name);
        std::fs::create_dir(&dir).map_err(|error| {
            format!(
                "cannot create a cgroup in {}: {}",
                parent.display(),
                crate::model::io_message(&error)
            )
        })?;
        let made = Made(dir.clone());
        match lock(&dir) {
            // The sweep may have had the lock first and removed the
            // directory before letting it go: ours only if the path still
            // names what we locked.
            Ok(Some(lock)) if still_names(&dir, &lock) => return Ok((name, dir, made, lock)),
            Ok(Some(_)) => std::mem::forget(made),
            // Taken (and perhaps removed) by a sweep: the sweep's to clean.
            Ok(None) => std::mem::forget(made),
            Err(error) if error.kind() == io::ErrorKind::NotFound => std::mem::forget(made),
            Err(error) => return Err(format!("cannot lock {}: {error}", dir.display())),
        }
    }
    Err(format!(
        "cannot make a cgroup of our own in {}: {ROOT_ATTEMPTS} fresh ones were taken by other \
         capexec processes' cleanup",
        parent.display()
    ))
}

/// Whether `path` still names the directory open as `fd`.
fn still_names(path: &Path, fd: &OwnedFd) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(named) = std::fs::metadata(path) else {
        return false;
    };
    let Ok(held) = rustix::fs::fstat(fd) else {
        return false;
    };
    named.dev() == held.st_dev && named.ino() == held.st_ino
}

/// An exclusive lock on `dir`; `None` if someone else holds it.
fn lock(dir: &Path) -> io::Result<Option<OwnedFd>> {
    let path = CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: open(2) on a NUL-terminated path.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us alone.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let error = io::Error::last_os_error();
        if error.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Ok(None);
        }
        return Err(error);
    }
    Ok(Some(fd))
}

/// The roots of capexec processes that are gone (their lock is free):
/// killed and removed, the second line behind each one's sentinel.
struct StaleRoots {
    parent: PathBuf,
    own_name: String,
    v1_parents: Vec<PathBuf>,
}

impl StaleRoots {
    fn clean(self) {
        let Ok(entries) = std::fs::read_dir(&self.parent) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with("capexec-") || name == self.own_name {
                continue;
            }
            let dir = entry.path();
            // Held while the cleanup runs, so that two servers starting at
            // once do not both clean it.
            let Ok(Some(_lock)) = lock(&dir) else {
                continue;
            };
            // A root with nothing in it may also be a live capexec's
            // between its mkdir and its flock: that one makes another.
            if populated(&dir) {
                tracing::warn!(cgroup = %dir.display(), "removing the cgroup of a capexec process that is gone, with what still runs in it");
            } else {
                tracing::debug!(cgroup = %dir.display(), "removing the empty cgroup of a capexec process that is gone");
            }
            let _ = std::fs::write(dir.join("cgroup.kill"), "1");
            wait_empty_blocking(&dir, Duration::from_secs(5));
            for v1_parent in &self.v1_parents {
                remove_tree(&v1_parent.join(&name));
            }
            remove_tree(&dir);
        }
    }
}

/// Removes `dir` and the cgroups below it (empty ones: rmdir refuses the
/// others).
fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                remove_tree(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Whether the cgroup at `dir` has processes (in it or below); a cgroup
/// that is gone has none.
fn populated(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.events"))
        .map(|events| says_populated(&events))
        .unwrap_or(false)
}

fn says_populated(events: &str) -> bool {
    events.lines().any(|line| line.trim() == "populated 1")
}

/// Waits (blocking, at most `patience`) until the cgroup at `dir` is empty.
fn wait_empty_blocking(dir: &Path, patience: Duration) -> bool {
    let deadline = Instant::now() + patience;
    let Ok(file) = std::fs::File::open(dir.join("cgroup.events")) else {
        return true;
    };
    loop {
        if !populated(dir) {
            return true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let mut pollfd = libc::pollfd {
            fd: file.as_raw_fd(),
            events: libc::POLLPRI,
            revents: 0,
        };
        // Woken by the change, or at least every 100 ms.
        // SAFETY: poll on one descriptor we own.
        unsafe { libc::poll(&mut pollfd, 1, left.as_millis().min(100) as i32) };
    }
}

/// The cgroup of one process (and its mirrors in v1 hierarchies for its
/// limits). Dropping it kills what is left in it and removes it.
pub(crate) struct Leaf {
    dir: PathBuf,
    /// The leaf as `/proc/PID/cgroup` names it.
    path: String,
    /// Its mirrors in v1 hierarchies.
    v1: Vec<PathBuf>,
    /// Where its memory limit is, for the out-of-memory kills.
    memory: Option<Place>,
    /// Its cgroup id, once registered in [`LEAVES`].
    id: Option<u64>,
    removed: AtomicBool,
}

/// A leaf just made: its cgroup2 directory, which the child is cloned
/// into (`CLONE_INTO_CGROUP`, or by writing its `cgroup.procs` where the
/// kernel cannot), and the `cgroup.procs` of its v1 mirrors, which the
/// child writes itself.
pub(crate) struct NewLeaf {
    pub leaf: Leaf,
    pub dir: OwnedFd,
    pub v1_procs: Vec<OwnedFd>,
}

/// A process's leaf as handed to the next binary.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct LeafState {
    dir: PathBuf,
    path: String,
    v1: Vec<PathBuf>,
    memory: Option<Place>,
    id: Option<u64>,
    sandboxed: bool,
}

impl Leaf {
    /// What the next binary needs to take this leaf over.
    pub fn handover_state(&self) -> LeafState {
        LeafState {
            dir: self.dir.clone(),
            path: self.path.clone(),
            v1: self.v1.clone(),
            memory: self.memory.clone(),
            id: self.id,
            sandboxed: self
                .id
                .and_then(|id| held(&LEAVES).get(&id).copied())
                .unwrap_or(false),
        }
    }

    /// The leaf the binary before handed over.
    pub fn taken_over(state: LeafState) -> Leaf {
        if let Some(id) = state.id {
            held(&LEAVES).insert(id, state.sandboxed);
        }
        Leaf {
            dir: state.dir,
            path: state.path,
            v1: state.v1,
            memory: state.memory,
            id: state.id,
            removed: AtomicBool::new(false),
        }
    }

    /// A leaf in `root` for one process (`sandboxed` or not) with `limits`,
    /// each of which must have its controller in `root`.
    pub fn create(root: &CgroupRoot, sandboxed: bool, limits: &Limits) -> io::Result<NewLeaf> {
        let number = root.next.fetch_add(1, Ordering::Relaxed);
        let name = format!("{}-{number}", if sandboxed { "s" } else { "p" });
        let dir = root.dir.join(&name);
        std::fs::create_dir(&dir)?;
        let mut leaf = Leaf {
            dir,
            path: format!("{}/{name}", root.path),
            v1: Vec::new(),
            memory: limits.memory_bytes.and(root.controllers.memory.clone()),
            id: None,
            removed: AtomicBool::new(false),
        };
        let dir = open_dir(&leaf.dir)?;
        let id = rustix::fs::fstat(&dir)?.st_ino;
        held(&LEAVES).insert(id, sandboxed);
        leaf.id = Some(id);
        let mut procs = Vec::new();
        let controllers = &root.controllers;
        let mut files: Vec<(&Option<Place>, &str, String)> = Vec::new();
        if let Some(bytes) = limits.memory_bytes {
            match &controllers.memory {
                Some(Place::V2) => {
                    files.push((&controllers.memory, "memory.max", bytes.to_string()));
                    files.push((&controllers.memory, "memory.swap.max?", "0".into()));
                }
                _ => {
                    files.push((
                        &controllers.memory,
                        "memory.limit_in_bytes",
                        bytes.to_string(),
                    ));
                    files.push((
                        &controllers.memory,
                        "memory.memsw.limit_in_bytes?",
                        bytes.to_string(),
                    ));
                }
            }
        }
        if let Some(pids) = limits.max_pids {
            files.push((&controllers.pids, "pids.max", pids.to_string()));
        }
        if let Some(millis) = limits.cpu_millis {
            let quota = (u64::from(millis) * CPU_PERIOD_MICROS / 1000).max(1000);
            match &controllers.cpu {
                Some(Place::V2) => files.push((
                    &controllers.cpu,
                    "cpu.max",
                    format!("{quota} {CPU_PERIOD_MICROS}"),
                )),
                _ => {
                    files.push((
                        &controllers.cpu,
                        "cpu.cfs_period_us",
                        CPU_PERIOD_MICROS.to_string(),
                    ));
                    files.push((&controllers.cpu, "cpu.cfs_quota_us", quota.to_string()));
                }
            }
        }
        for (place, file, value) in files {
            let dir = match place {
                Some(Place::V2) => leaf.dir.clone(),
                Some(Place::V1(v1_root)) => {
                    root.make_v1_root(v1_root)?;
                    let mirror = v1_root.join(&name);
                    if !leaf.v1.contains(&mirror) {
                        std::fs::create_dir(&mirror)?;
                        leaf.v1.push(mirror.clone());
                        procs.push(open_procs(&mirror)?);
                    }
                    mirror
                }
                None => {
                    return Err(io::Error::new(
                        io::ErrorKind::Unsupported,
                        format!("no controller for {file}"),
                    ));
                }
            };
            // A name ending in '?' is optional (swap accounting may be off).
            let (file, optional) = match file.strip_suffix('?') {
                Some(file) => (file, true),
                None => (file, false),
            };
            if let Err(error) = std::fs::write(dir.join(file), &value)
                && !(optional && error.kind() == io::ErrorKind::NotFound)
            {
                return Err(io::Error::new(
                    error.kind(),
                    format!("cannot set {file} to {value}: {error}"),
                ));
            }
        }
        Ok(NewLeaf {
            leaf,
            dir,
            v1_procs: procs,
        })
    }

    /// Whether processes are in it now.
    pub fn populated(&self) -> bool {
        populated(&self.dir)
    }

    /// Waits until it is empty (or gone): woken by the kernel's
    /// notification on `cgroup.events`.
    pub async fn emptied(&self) {
        if let Ok(file) = std::fs::File::open(self.dir.join("cgroup.events"))
            // SAFETY: the OwnedFd keeps its descriptor open and unchanged for
            // as long as the AsyncFd owns it.
            && let Ok(events) = unsafe {
                AsyncFd::register_with_interest(OwnedFd::from(file), Interest::PRIORITY)
            }
        {
            wait_unpopulated(&events).await;
            return;
        }
        while self.populated() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL to everything in it, at once.
    pub fn kill(&self) {
        if let Err(error) = std::fs::write(self.dir.join("cgroup.kill"), "1")
            && error.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(%error, cgroup = %self.dir.display(), "cannot kill the cgroup");
        }
    }

    /// The pids of the processes in it now.
    pub fn members(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .map(|members| {
                members
                    .lines()
                    .filter_map(|line| line.trim().parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Sends `signal` to each process in it now, each named by a pidfd
    /// that is checked to be in the cgroup (not a later owner of a number).
    pub fn signal_members(&self, signal: i32) {
        for pid in self.members() {
            let Ok(pidfd) = crate::engine::pidfd_open(pid) else {
                continue;
            };
            if self.holds(pid) {
                crate::engine::signal_process(&pidfd, signal);
            }
        }
    }

    /// Whether `pid` is in this cgroup now.
    pub fn holds(&self, pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|memberships| {
            memberships
                .lines()
                .any(|line| line.strip_prefix("0::") == Some(self.path.as_str()))
        })
    }

    /// How many processes the kernel killed in it for its memory limit.
    pub fn memory_limit_kills(&self) -> u64 {
        let file = match &self.memory {
            Some(Place::V2) => self.dir.join("memory.events"),
            Some(Place::V1(_)) => match self
                .v1
                .iter()
                .find(|mirror| mirror.join("memory.oom_control").exists())
            {
                Some(mirror) => mirror.join("memory.oom_control"),
                None => return 0,
            },
            None => return 0,
        };
        std::fs::read_to_string(file)
            .ok()
            .and_then(|text| {
                text.lines()
                    .find_map(|line| line.strip_prefix("oom_kill "))
                    .and_then(|count| count.trim().parse().ok())
            })
            .unwrap_or(0)
    }

    /// Removes it once it is empty; false if something is still in it.
    pub fn remove(&self) -> bool {
        if self.removed.load(Ordering::Acquire) {
            return true;
        }
        let gone = |dir: &Path| match std::fs::remove_dir(dir) {
            Ok(()) => true,
            Err(error) => error.kind() == io::ErrorKind::NotFound,
        };
        let mut all = true;
        for mirror in &self.v1 {
            all &= gone(mirror);
        }
        all &= gone(&self.dir);
        if all {
            self.removed.store(true, Ordering::Release);
        }
        all
    }
}

impl Drop for Leaf {
    fn drop(&mut self) {
        // Its id names it for good, but a cgroup that is gone, or going,
        // is found by walking the hierarchy, or not at all.
        if let Some(id) = self.id {
            held(&LEAVES).remove(&id);
        }
        if self.remove() {
            return;
        }
        self.kill();
        if self.remove() {
            return;
        }
        // Dying takes a moment: remove it off this thread once it is empty.
        let dir = self.dir.clone();
        let v1 = std::mem::take(&mut self.v1);
        let _ = std::thread::Builder::new()
            .name("capexec-cgroup-remove".into())
            .stack_size(64 * 1024)
            .spawn(move || {
                wait_empty_blocking(&dir, Duration::from_secs(10));
                for mirror in &v1 {
                    let _ = std::fs::remove_dir(mirror);
                }
                let _ = std::fs::remove_dir(&dir);
            });
    }
}

fn open_dir(dir: &Path) -> io::Result<OwnedFd> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(dir)?;
    Ok(OwnedFd::from(file))
}

fn open_procs(dir: &Path) -> io::Result<OwnedFd> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("cgroup.procs"))?;
    Ok(OwnedFd::from(file))
}

/// Waits until the `cgroup.events` behind `events` says it is empty.
async fn wait_unpopulated(events: &AsyncFd<OwnedFd>) {
    loop {
        // Read after every wake-up (and before the first wait), so that a
        // change between a read and the wait is never missed.
        if !read_populated(events.get_ref()) {
            return;
        }
        match events.ready(Interest::PRIORITY).await {
            Ok(mut guard) => guard.clear_ready(),
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

fn read_populated(events: &OwnedFd) -> bool {
    let mut buffer = [0u8; 256];
    // SAFETY: pread into a buffer we own.
    let read = unsafe {
        libc::pread(
            events.as_raw_fd(),
            buffer.as_mut_ptr().cast(),
            buffer.len(),
            0,
        )
    };
    if read <= 0 {
        // Gone (the cgroup was removed) or unreadable: nothing to wait for.
        return false;
    }
    says_populated(&String::from_utf8_lossy(&buffer[..read as usize]))
}

/// Whether a process whose `/proc/PID/cgroup` reads `memberships` is in a
/// sandboxed capexec leaf (`.../capexec-<pid>-<random>/s-<n>`).
pub(crate) fn in_sandbox_leaf(memberships: &str) -> bool {
    memberships
        .lines()
        .any(|line| line.strip_prefix("0::").is_some_and(path_in_sandbox_leaf))
}

/// Whether the cgroup2 path `path` is a sandboxed capexec leaf or below one.
fn path_in_sandbox_leaf(path: &str) -> bool {
    let parts: Vec<&str> = path.split('/').collect();
    parts.windows(2).any(|pair| {
        pair[0].starts_with("capexec-")
            && pair[1].strip_prefix("s-").is_some_and(|number| {
                !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit())
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_leaves_are_told_from_others() {
        assert!(in_sandbox_leaf("0::/capexec-12-0a0b0c0d/s-3\n"));
        assert!(in_sandbox_leaf(
            "4:memory:/x\n0::/user.slice/capexec-1-ff/s-12/inner\n"
        ));
        assert!(!in_sandbox_leaf("0::/capexec-12-0a0b0c0d/p-3\n"));
        assert!(!in_sandbox_leaf("0::/s-3\n"));
        assert!(!in_sandbox_leaf("0::/capexec-12/s-x\n"));
        assert!(!in_sandbox_leaf("4:memory:/capexec-1/s-2\n0::/\n"));
    }

    /// A cgroup is told by its id: this process's leaves by their own,
    /// cgroups below them and others by finding them in the hierarchy.
    #[test]
    fn cgroups_are_told_sandboxed_by_their_id() {
        use std::os::unix::fs::MetadataExt;
        let root = root().expect("a cgroup root (CI runs as root, with cgroup v2)");
        let id = |dir: &Path| std::fs::metadata(dir).expect("a cgroup").ino();
        let sandboxed = Leaf::create(root, true, &Limits::default()).expect("a leaf");
        let plain = Leaf::create(root, false, &Limits::default()).expect("a leaf");
        let leaf_id = id(&sandboxed.leaf.dir);
        assert_eq!(root.sandboxed_cgroup(leaf_id), Some(true));
        assert_eq!(root.sandboxed_cgroup(id(&plain.leaf.dir)), Some(false));
        assert_eq!(root.sandboxed_cgroup(id(&root.dir)), Some(false));
        let below = sandboxed.leaf.dir.join("below");
        std::fs::create_dir_all(below.join("deeper")).expect("cgroups below a leaf");
        let below_plain = plain.leaf.dir.join("below");
        std::fs::create_dir(&below_plain).expect("a cgroup below a leaf");
        assert_eq!(root.sandboxed_cgroup(id(&below.join("deeper"))), Some(true));
        assert_eq!(root.sandboxed_cgroup(id(&below)), Some(true));
        assert_eq!(root.sandboxed_cgroup(id(&below_plain)), Some(false));
        // Gone, or never there: nothing to tell by.
        remove_tree(&below);
        remove_tree(&below_plain);
        drop(sandboxed);
        drop(plain);
        assert_eq!(root.sandboxed_cgroup(leaf_id), None);
        assert_eq!(root.sandboxed_cgroup(u64::MAX), None);
    }

    #[test]
    fn kernel_releases_are_compared() {
        assert!(release_at_least("6.18.44-fc-v1252\n", (5, 15)));
        assert!(release_at_least("5.15.0-91-generic", (5, 15)));
        assert!(!release_at_least("5.14.21", (5, 15)));
        assert!(!release_at_least("4.19", (5, 15)));
        assert!(!release_at_least("six", (5, 15)));
    }

    #[test]
    fn v1_groups_are_found_by_controller() {
        let mounts = mounts::parse(
            b"35 23 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
              36 23 0:33 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n",
        );
        let memberships = "4:memory:/process_api/ab\n2:cpu,cpuacct:/\n0::/\n";
        assert_eq!(
            v1_group(&mounts, memberships, "memory"),
            Some(PathBuf::from("/sys/fs/cgroup/memory/process_api/ab"))
        );
        assert_eq!(
            v1_group(&mounts, memberships, "cpu"),
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"))
        );
        assert_eq!(v1_group(&mounts, memberships, "pids"), None);
    }
}
