//! Writing files so that readers see the old content or the new, never a
//! mix: the content goes to a file without a name (O_TMPFILE) that is
//! linked into place and renamed over the target in one step when it is
//! committed. A file system without O_TMPFILE gets a hidden temporary in
//! the same directory, removed on every failure path (and when a
//! [`PendingFile`] is dropped uncommitted). A server that dies (killed,
//! or the machine lost power) cannot remove its temporaries: the first
//! write of a server into a directory sweeps those of writers that are
//! gone. A writer holds an exclusive `flock` on its temporary for as
//! long as it lives (the kernel drops it when the process dies, however
//! it dies), so a temporary nobody holds, and nobody changed for a
//! while, is an orphan; and this process never sweeps its own writes in
//! progress. Conditions on the target
//! (exclusive, must exist, `ifVersion`) are checked when the write begins
//! and again under one commit lock, so of two writers holding the same
//! version exactly one succeeds.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::Mutex;

use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags, ResolveFlags, Timespec, Timestamps};
use rustix::io::Errno;

use crate::files::Writable;
use crate::files::error::{failed, refused};
use crate::files::resolve::{Entry, entry, open_beneath, proc_path};
use crate::files::stat::{from_stat, of_fd};
use crate::files::tree::make_dirs;
use crate::model::{FileStat, Refusal, RefusalKind, WriteOptions};

/// Held while a commit checks its target and renames over it.
static COMMIT_LOCK: Mutex<()> = Mutex::new(());

/// What a commit does to bring the content into place.
enum Staging {
    /// O_TMPFILE: linked into place at commit; nothing to clean up.
    Unnamed,
    /// A hidden temporary of this name in the target's directory.
    Named(LiveTemp),
    /// The target itself (`inPlace`).
    InPlace,
}

/// A write that has begun and is not committed yet.
pub struct PendingFile {
    op: &'static str,
    path: Vec<u8>,
    target: Entry,
    file: OwnedFd,
    staging: Staging,
    options: WriteOptions,
    /// The permission bits to give the file before it becomes visible.
    permissions: Option<u32>,
    written: u64,
    /// Bytes up to which write-back was started (see [`WRITE_BEHIND_BYTES`]),
    /// or `None` when the commit will not wait for the disk.
    written_back: Option<u64>,
    committed: bool,
}

/// How far behind the write position write-back is started, when the
/// commit is going to wait for the content to reach the disk: with
/// `sync` (its fsync), and when an existing file is replaced (ext4 starts
/// writing the whole new file back at the rename that replaces one, so
/// that a crash cannot leave it empty, and the rename waits for that).
/// Started as the content streams in, that work overlaps the transfer
/// instead of stalling the commit (a second or more per GiB on a busy
/// disk).
const WRITE_BEHIND_BYTES: u64 = 8 * 1024 * 1024;

/// The prefix of hidden temporaries (see the schema's `writeFile`).
pub const TEMP_PREFIX: &str = ".capexec-";

/// The suffix of hidden temporaries.
const TEMP_SUFFIX: &str = ".tmp";

/// The hidden temporaries of this process's writes in progress, entered
/// before the name exists: never swept.
static LIVE_TEMPS: Mutex<Vec<OsString>> = Mutex::new(Vec::new());

/// The directories (device, inode) this process has swept.
static SWEPT: Mutex<Option<std::collections::HashSet<(u64, u64)>>> = Mutex::new(None);

/// Past this many directories the record starts again (memory stays
/// bounded; a directory swept twice costs one more listing).
const MAX_SWEPT: usize = 65_536;

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A name in [`LIVE_TEMPS`] for as long as it lives.
struct LiveTemp(OsString);

impl LiveTemp {
    fn enter() -> LiveTemp {
        let name = temp_name();
        lock(&LIVE_TEMPS).push(name.clone());
        LiveTemp(name)
    }
}

impl Drop for LiveTemp {
    fn drop(&mut self) {
        let mut live = lock(&LIVE_TEMPS);
        if let Some(at) = live.iter().position(|name| *name == self.0) {
            live.swap_remove(at);
        }
    }
}

/// Removes the orphaned hidden temporaries of directory `parent`, the
/// first time this process writes into it (and again at later writes
/// while young ones are left): temporaries whose writer is gone (nobody
/// holds their lock, nobody changed them for [`ORPHAN_MIN_AGE`], and the
/// process their name records is not running, or is this one and not
/// writing it). Best effort: a directory that cannot be listed is left as
/// it is.
fn sweep_once(parent: &OwnedFd) {
    let Ok(stat) = rustix::fs::fstat(parent) else {
        return;
    };
    {
        let mut swept = lock(&SWEPT);
        let swept = swept.get_or_insert_with(Default::default);
        if swept.len() >= MAX_SWEPT {
            swept.clear();
        }
        if !swept.insert((stat.st_dev, stat.st_ino)) {
            return;
        }
    }
    // Young orphans are left for a later write to look at again.
    if matches!(sweep(parent), Ok(Swept::YoungOnesLeft)) {
        lock(&SWEPT)
            .get_or_insert_with(Default::default)
            .remove(&(stat.st_dev, stat.st_ino));
    }
}

/// An unlocked temporary is an orphan only once it is this old: a writer
/// creates its temporary and locks it at once, and a sweeper that cannot
/// tell whether the writer is running (its pid is in another pid
/// namespace) must not take one in that instant.
const ORPHAN_MIN_AGE: std::time::Duration = std::time::Duration::from_secs(10);

/// What a sweep left behind.
enum Swept {
    All,
    /// Unlocked temporaries younger than [`ORPHAN_MIN_AGE`].
    YoungOnesLeft,
}

/// The pid a temporary's name records (see [`temp_name`]).
fn temp_pid(name: &[u8]) -> Option<i32> {
    let rest = name.strip_prefix(TEMP_PREFIX.as_bytes())?;
    let rest = rest.strip_suffix(TEMP_SUFFIX.as_bytes())?;
    let pid = rest.split(|&b| b == b'-').next()?;
    i32::from_str_radix(std::str::from_utf8(pid).ok()?, 16).ok()
}

fn sweep(parent: &OwnedFd) -> Result<Swept, Errno> {
    let listed = open_beneath(
        parent,
        std::path::Path::new("."),
        OFlags::RDONLY | OFlags::DIRECTORY,
        Mode::empty(),
        ResolveFlags::empty(),
    )?;
    let own = std::process::id() as i32;
    let mut orphans = Vec::new();
    for entry in rustix::fs::Dir::read_from(&listed)? {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        let Some(pid) = temp_pid(name) else { continue };
        let name = OsStr::from_bytes(name).to_os_string();
        if pid == own {
            if lock(&LIVE_TEMPS).contains(&name) {
                continue;
            }
        } else if pid > 0
            && !matches!(
                rustix::process::test_kill_process(
                    rustix::process::Pid::from_raw(pid).ok_or(Errno::INVAL)?
                ),
                Err(Errno::SRCH)
            )
        {
            // Its writer may be running (and in the instant between
            // creating the temporary and locking it).
            continue;
        }
        orphans.push(name);
    }
    let mut outcome = Swept::All;
    for name in orphans {
        let Ok(file) = open_beneath(
            parent,
            std::path::Path::new(&name),
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK,
            Mode::empty(),
            ResolveFlags::NO_SYMLINKS,
        ) else {
            continue;
        };
        let Ok(stat) = rustix::fs::fstat(&file) else {
            continue;
        };
        let unlocked = rustix::fs::FileType::from_raw_mode(stat.st_mode).is_file()
            && rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive)
                .is_ok();
        if !unlocked {
            continue;
        }
        if !old_enough(&stat) {
            outcome = Swept::YoungOnesLeft;
            continue;
        }
        tracing::info!(name = ?name, "removed a temporary left by a writer that is gone");
        let _ = rustix::fs::unlinkat(parent, name.as_os_str(), AtFlags::empty());
    }
    Ok(outcome)
}

/// Last modified at least [`ORPHAN_MIN_AGE`] ago (a time in the future,
/// from a skewed clock, is young).
fn old_enough(stat: &rustix::fs::Stat) -> bool {
    let modified = std::time::UNIX_EPOCH
        + std::time::Duration::new(
            u64::try_from(stat.st_mtime).unwrap_or(0),
            u32::try_from(stat.st_mtime_nsec).unwrap_or(0),
        );
    std::time::SystemTime::now()
        .duration_since(modified)
        .is_ok_and(|age| age >= ORPHAN_MIN_AGE)
}

fn temp_name() -> OsString {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.subsec_nanos());
    OsString::from(format!(
        "{TEMP_PREFIX}{:x}-{:x}-{nanos:x}.tmp",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ))
}

impl PendingFile {
    /// Begins writing `path` beneath `dir` as `options` say.
    pub fn begin(
        op: &'static str,
        dir: Writable<'_>,
        path: &[u8],
        options: &WriteOptions,
    ) -> Result<PendingFile, Refusal> {
        if options.exclusive && (options.must_exist || !options.if_version.is_empty()) {
            return Err(refused(
                RefusalKind::InvalidArgument,
                op,
                path,
                "`exclusive` contradicts `mustExist` and `ifVersion`",
            ));
        }
        if options.create_parents
            && let Some((parent, _)) =
                crate::files::resolve::split(crate::files::resolve::checked(op, path)?)
        {
            make_dirs(op, dir, parent.as_os_str().as_bytes(), 0o777)?;
        }
        let target = entry(op, dir, path)?;
        PendingFile::begin_entry(op, path, target, options, dir.tmpfile())
    }

    /// [`PendingFile::begin`] for an entry already resolved; `path` names
    /// it in messages; `tmpfile`: whether it may stage in an unnamed file
    /// (see [`Writable::tmpfile`]).
    pub fn begin_entry(
        op: &'static str,
        path: &[u8],
        target: Entry,
        options: &WriteOptions,
        tmpfile: bool,
    ) -> Result<PendingFile, Refusal> {
        sweep_once(&target.parent);
        let existing = check_target(op, path, &target, options)?;
        let permissions = options
            .permissions
            .or_else(|| existing.as_ref().map(|stat| stat.permissions))
            .or_else(|| {
                options
                    .new_file_permissions
                    .map(|bits| bits & 0o777 & !crate::files::tree::umask())
            });
        let (file, staging) = if options.in_place {
            // O_NONBLOCK: a FIFO swapped in since the check cannot hold the
            // call in open(2) (it fails, or is refused by its type below).
            let mut flags = OFlags::WRONLY
                | OFlags::CREATE
                | OFlags::TRUNC
                | OFlags::NOFOLLOW
                | OFlags::NONBLOCK;
            if options.exclusive {
                flags |= OFlags::EXCL;
            }
            let file = open_beneath(
                &target.parent,
                std::path::Path::new(&target.name),
                flags,
                Mode::from_raw_mode(0o666),
                ResolveFlags::NO_SYMLINKS,
            )
            .map_err(|errno| failed(op, path, errno))?;
            let opened =
                from_stat(&rustix::fs::fstat(&file).map_err(|errno| failed(op, path, errno))?);
            if !opened.is_file() {
                return Err(not_a_regular_file(op, path, opened.kind));
            }
            (file, Staging::InPlace)
        } else {
            open_staging(&target.parent, tmpfile).map_err(|errno| failed(op, path, errno))?
        };
        Ok(PendingFile {
            op,
            path: path.to_vec(),
            target,
            file,
            staging,
            options: options.clone(),
            permissions,
            written: 0,
            written_back: (options.sync || existing.is_some()).then_some(0),
            committed: false,
        })
    }

    /// The file being written (for copy_file_range).
    pub fn fd(&self) -> &OwnedFd {
        &self.file
    }

    pub fn written(&self) -> u64 {
        self.written
    }

    /// Counts bytes written to [`PendingFile::fd`] by someone else.
    pub fn add_written(&mut self, bytes: u64) {
        self.written += bytes;
    }

    /// Appends `data`.
    pub fn write_all(&mut self, mut data: &[u8]) -> Result<(), Refusal> {
        while !data.is_empty() {
            match rustix::io::write(&self.file, data) {
                Ok(0) => return Err(failed(self.op, &self.path, Errno::IO)),
                Ok(n) => {
                    data = &data[n..];
                    self.written += n as u64;
                }
                Err(Errno::INTR) => {}
                Err(errno) => return Err(failed(self.op, &self.path, errno)),
            }
        }
        if let Some(from) = self.written_back
            && self.written - from >= WRITE_BEHIND_BYTES
        {
            // SAFETY: a plain system call on a descriptor this owns; it
            // only starts write-back of the range (failures are harmless:
            // the commit writes back whatever is left).
            unsafe {
                libc::sync_file_range(
                    std::os::fd::AsRawFd::as_raw_fd(&self.file),
                    from as libc::off64_t,
                    (self.written - from) as libc::off64_t,
                    libc::SYNC_FILE_RANGE_WRITE,
                );
            }
            self.written_back = Some(self.written);
        }
        Ok(())
    }

    /// Makes the content visible as the target (checking its conditions
    /// once more) and returns the new file's stat. With `expected` the
    /// content must have exactly that many bytes.
    pub fn commit(mut self, expected: Option<u64>) -> Result<FileStat, Refusal> {
        let (op, path) = (self.op, self.path.clone());
        let fail = |errno| failed(op, &path, errno);
        if let Some(expected) = expected
            && expected != self.written
        {
            return Err(refused(
                RefusalKind::InvalidArgument,
                op,
                &path,
                format!(
                    "{} bytes arrived, {expected} were announced; the file was left as it was",
                    self.written
                ),
            ));
        }
        if let Some(modified) = self.options.modified_ns {
            let omit = Timespec {
                tv_sec: 0,
                tv_nsec: rustix::fs::UTIME_OMIT,
            };
            let times = Timestamps {
                last_access: omit,
                last_modification: timespec(modified),
            };
            rustix::fs::futimens(&self.file, &times).map_err(fail)?;
        }
        if let Some(bits) = self.permissions {
            rustix::fs::fchmod(&self.file, Mode::from_raw_mode(bits & 0o7777)).map_err(fail)?;
        }
        if self.options.sync {
            rustix::fs::fsync(&self.file).map_err(fail)?;
        }
        {
            let _lock = COMMIT_LOCK
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            // Only conditions need the target looked at again: placing
            // the file refuses a directory, and `exclusive` is decided by
            // the link or rename itself (it fails if the name exists).
            let conditional = self.options.must_exist || !self.options.if_version.is_empty();
            if conditional && !matches!(self.staging, Staging::InPlace) {
                check_target(op, &path, &self.target, &self.options)?;
            }
            self.place().map_err(fail)?;
        }
        self.committed = true;
        if self.options.sync {
            sync_dir(&self.target.parent).map_err(fail)?;
        }
        of_fd(&self.file).map_err(fail)
    }

    /// Brings the content into place. A new target is linked (created
    /// whole, in one step); an existing one is replaced by a rename, so a
    /// watcher sees a creation or a replacement, never a temporary's
    /// comings and goings.
    fn place(&mut self) -> Result<(), Errno> {
        let parent = &self.target.parent;
        let name = self.target.name.as_os_str();
        let exclusive = self.options.exclusive;
        match &self.staging {
            Staging::InPlace => Ok(()),
            Staging::Named(LiveTemp(temp)) => {
                if exclusive {
                    return rename(parent, temp, name, true);
                }
                match rustix::fs::linkat(parent, temp.as_os_str(), parent, name, AtFlags::empty()) {
                    Ok(()) => {
                        let _ = rustix::fs::unlinkat(parent, temp.as_os_str(), AtFlags::empty());
                        Ok(())
                    }
                    Err(_) => rename(parent, temp, name, false),
                }
            }
            Staging::Unnamed => match link_unnamed(&self.file, parent, name) {
                Err(Errno::EXIST) if !exclusive => {
                    // Named for an instant, locked before it has the name.
                    let LiveTemp(temp) = &LiveTemp::enter();
                    rustix::fs::flock(&self.file, rustix::fs::FlockOperation::LockExclusive)?;
                    link_unnamed(&self.file, parent, temp)?;
                    rename(parent, temp, name, false).inspect_err(|_| {
                        let _ = rustix::fs::unlinkat(parent, temp.as_os_str(), AtFlags::empty());
                    })
                }
                other => other,
            },
        }
    }
}

impl Drop for PendingFile {
    fn drop(&mut self) {
        if let (false, Staging::Named(LiveTemp(temp))) = (self.committed, &self.staging) {
            let _ = rustix::fs::unlinkat(&self.target.parent, temp.as_os_str(), AtFlags::empty());
        }
    }
}

fn timespec(ns: i64) -> Timespec {
    Timespec {
        tv_sec: ns.div_euclid(1_000_000_000),
        tv_nsec: ns.rem_euclid(1_000_000_000) as _,
    }
}

/// Sets the access and modification times (ns since the epoch) of what
/// `fd` is.
pub fn set_times(fd: impl AsFd, accessed_ns: i64, modified_ns: i64) -> Result<(), Errno> {
    let times = Timestamps {
        last_access: timespec(accessed_ns),
        last_modification: timespec(modified_ns),
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        proc_path(fd).as_str(),
        &times,
        AtFlags::empty(),
    )
}

/// The target as it is now, if it exists, after checking the write's
/// conditions on it.
fn check_target(
    op: &str,
    path: &[u8],
    target: &Entry,
    options: &WriteOptions,
) -> Result<Option<FileStat>, Refusal> {
    let existing = match rustix::fs::statat(
        &target.parent,
        target.name.as_os_str(),
        AtFlags::SYMLINK_NOFOLLOW,
    ) {
        Ok(stat) => Some(from_stat(&stat)),
        Err(Errno::NOENT) => None,
        Err(errno) => return Err(failed(op, path, errno)),
    };
    match &existing {
        Some(stat) if stat.is_dir() => return Err(failed(op, path, Errno::ISDIR)),
        Some(stat) if is_special(stat.kind) => return Err(not_a_regular_file(op, path, stat.kind)),
        Some(_) if options.exclusive => return Err(failed(op, path, Errno::EXIST)),
        None if options.must_exist => return Err(failed(op, path, Errno::NOENT)),
        _ => {}
    }
    if !options.if_version.is_empty() {
        match &existing {
            Some(stat) if stat.version == options.if_version => {}
            Some(_) => {
                return Err(refused(
                    RefusalKind::Conflict,
                    op,
                    path,
                    "the file changed since the version given (somebody else wrote it)",
                ));
            }
            None => {
                return Err(refused(
                    RefusalKind::Conflict,
                    op,
                    path,
                    "the file no longer exists (a version was given)",
                ));
            }
        }
    }
    Ok(existing.filter(|stat| stat.is_file()))
}

/// A FIFO, socket or device: never opened, written, replaced or removed
/// where a regular file is meant (opening a FIFO blocks until a reader
/// comes; a device is the whole machine's).
fn is_special(kind: crate::model::FileKind) -> bool {
    use crate::model::FileKind;
    !matches!(
        kind,
        FileKind::File | FileKind::Directory | FileKind::Symlink
    )
}

fn not_a_regular_file(op: &str, path: &[u8], kind: crate::model::FileKind) -> Refusal {
    refused(
        RefusalKind::InvalidArgument,
        op,
        path,
        format!(
            "not a regular file (a {}); only regular files are written",
            crate::files::read::kind_name(kind)
        ),
    )
}

/// A new file without a name in `parent` (unless `tmpfile` is false), or a
/// hidden temporary there. A named temporary is locked (see [`sweep`]) as
/// soon as it exists, and entered in [`LIVE_TEMPS`] before.
fn open_staging(parent: &OwnedFd, tmpfile: bool) -> Result<(OwnedFd, Staging), Errno> {
    let dot = std::path::Path::new(".");
    let unnamed = if !tmpfile {
        Err(Errno::OPNOTSUPP)
    } else {
        open_beneath(
            parent,
            dot,
            OFlags::TMPFILE | OFlags::WRONLY,
            Mode::from_raw_mode(0o666),
            ResolveFlags::empty(),
        )
    };
    match unnamed {
        Ok(fd) => return Ok((fd, Staging::Unnamed)),
        Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL | Errno::NOENT) => {}
        Err(errno) => return Err(errno),
    }
    loop {
        let temp = LiveTemp::enter();
        match open_beneath(
            parent,
            std::path::Path::new(&temp.0),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
            Mode::from_raw_mode(0o600),
            ResolveFlags::NO_SYMLINKS,
        ) {
            Ok(fd) => {
                let staging = Staging::Named(temp);
                if let Err(errno) =
                    rustix::fs::flock(&fd, rustix::fs::FlockOperation::LockExclusive)
                {
                    if let Staging::Named(LiveTemp(name)) = &staging {
                        let _ = rustix::fs::unlinkat(parent, name.as_os_str(), AtFlags::empty());
                    }
                    return Err(errno);
                }
                return Ok((fd, staging));
            }
            Err(Errno::EXIST) => {}
            Err(errno) => return Err(errno),
        }
    }
}

/// Gives the unnamed file `file` the name `name` in `parent` (failing if
/// it exists): through /proc, which needs no privilege, else with
/// AT_EMPTY_PATH (which needs CAP_DAC_READ_SEARCH).
fn link_unnamed(file: &OwnedFd, parent: &OwnedFd, name: &OsStr) -> Result<(), Errno> {
    match rustix::fs::linkat(
        rustix::fs::CWD,
        proc_path(file).as_str(),
        parent,
        name,
        AtFlags::SYMLINK_FOLLOW,
    ) {
        Err(Errno::NOENT) => rustix::fs::linkat(file, "", parent, name, AtFlags::EMPTY_PATH),
        other => other,
    }
}

fn rename(parent: &OwnedFd, from: &OsStr, to: &OsStr, no_replace: bool) -> Result<(), Errno> {
    let flags = if no_replace {
        RenameFlags::NOREPLACE
    } else {
        RenameFlags::empty()
    };
    rustix::fs::renameat_with(parent, from, parent, to, flags)
}

/// fsync of a directory (an O_PATH descriptor cannot be synced).
pub fn sync_dir(dir: &OwnedFd) -> Result<(), Errno> {
    let readable = open_beneath(
        dir,
        std::path::Path::new("."),
        OFlags::RDONLY | OFlags::DIRECTORY,
        Mode::empty(),
        ResolveFlags::empty(),
    )?;
    rustix::fs::fsync(readable)
}

/// `writeFile`: `data` as the content of `path`.
pub fn write_file(
    dir: Writable<'_>,
    path: &[u8],
    data: &[u8],
    options: &WriteOptions,
) -> Result<FileStat, Refusal> {
    let mut pending = PendingFile::begin("write", dir, path, options)?;
    pending.write_all(data)?;
    pending.commit(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, Write};

    fn scratch(name: &str) -> (std::path::PathBuf, OwnedFd) {
        let dir = std::env::temp_dir().join(format!("capexec-sweep-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        let fd = rustix::fs::open(&dir, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
            .expect("open the scratch directory");
        (dir, fd)
    }

    fn names(dir: &std::path::Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("list")
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .into_string()
                    .expect("utf-8")
            })
            .collect();
        names.sort();
        names
    }

    fn forget_swept() {
        lock(&SWEPT).take();
    }

    /// Makes `path` look last changed an hour ago.
    fn backdate(path: &std::path::Path) {
        let file = std::fs::File::options()
            .write(true)
            .open(path)
            .expect("open");
        let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        file.set_modified(hour_ago)
            .expect("set the modification time");
    }

    /// A pid no process has: one that has exited and been reaped.
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        child.wait().expect("reap true");
        child.id()
    }

    #[test]
    fn a_gone_writers_temporary_is_swept_by_the_next_write_into_its_directory() {
        let (dir, fd) = scratch("gone");
        let orphan = format!("{TEMP_PREFIX}{:x}-7-1f{TEMP_SUFFIX}", dead_pid());
        std::fs::write(dir.join(&orphan), b"half an upload").expect("orphan");
        backdate(&dir.join(&orphan));
        // Not temporaries of this shape: kept.
        std::fs::write(dir.join(".capexec-notes"), b"mine").expect("lookalike");
        std::fs::write(dir.join("kept"), b"data").expect("a file");
        forget_swept();
        write_file(
            Writable::of_own(fd.as_fd(), true),
            b"new",
            b"content",
            &WriteOptions::default(),
        )
        .expect("write");
        assert_eq!(names(&dir), [".capexec-notes", "kept", "new"]);
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn a_live_uploads_temporary_is_never_swept() {
        let (dir, fd) = scratch("live");
        // Staged in named temporaries, as without O_TMPFILE.
        let mut live = PendingFile::begin(
            "upload",
            Writable::of_own(fd.as_fd(), false),
            b"big",
            &WriteOptions::default(),
        )
        .expect("begin an upload");
        live.write_all(b"first half, ").expect("write");
        let temps = names(&dir);
        assert_eq!(temps.len(), 1, "{temps:?}");
        assert!(temps[0].starts_with(TEMP_PREFIX), "{temps:?}");
        // Another write into the directory sweeps it (again).
        forget_swept();
        write_file(
            Writable::of_own(fd.as_fd(), false),
            b"other",
            b"x",
            &WriteOptions::default(),
        )
        .expect("write");
        assert!(
            names(&dir).contains(&temps[0]),
            "the live temporary was swept"
        );
        live.write_all(b"second half").expect("write");
        live.commit(None).expect("commit");
        assert_eq!(
            std::fs::read(dir.join("big")).expect("read"),
            b"first half, second half"
        );
        assert_eq!(names(&dir), ["big", "other"]);
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn a_temporary_another_process_holds_is_kept() {
        let (dir, fd) = scratch("held");
        // The name records a gone pid, but a running process holds its
        // lock (as a writer does from the moment the temporary exists).
        let held = format!("{TEMP_PREFIX}{:x}-0-0{TEMP_SUFFIX}", dead_pid());
        let path = dir.join(&held);
        std::fs::write(&path, b"in progress").expect("temporary");
        let mut holder = std::process::Command::new("flock")
            .arg("-x")
            .arg(&path)
            .args(["-c", "echo locked; read line"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("flock(1) (util-linux)");
        let mut line = String::new();
        std::io::BufReader::new(holder.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read");
        assert_eq!(line, "locked\n");
        forget_swept();
        write_file(
            Writable::of_own(fd.as_fd(), true),
            b"new",
            b"x",
            &WriteOptions::default(),
        )
        .expect("write");
        assert!(names(&dir).contains(&held), "a held temporary was swept");
        let mut stdin = holder.stdin.take().expect("stdin");
        stdin.write_all(b"\n").expect("release");
        drop(stdin);
        assert!(holder.wait().expect("wait").success());
        // Released (its writer gone): the next sweep takes it.
        backdate(&path);
        forget_swept();
        write_file(
            Writable::of_own(fd.as_fd(), true),
            b"new",
            b"y",
            &WriteOptions::default(),
        )
        .expect("write");
        assert_eq!(names(&dir), ["new"]);
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn a_fresh_unlocked_temporary_is_kept_until_it_is_old() {
        let (dir, fd) = scratch("young");
        // A writer whose pid this process cannot see (another pid
        // namespace), in the instant between creating its temporary and
        // locking it.
        let young = format!("{TEMP_PREFIX}{:x}-3-3{TEMP_SUFFIX}", dead_pid());
        let path = dir.join(&young);
        std::fs::write(&path, b"just created").expect("temporary");
        forget_swept();
        write_file(
            Writable::of_own(fd.as_fd(), true),
            b"new",
            b"x",
            &WriteOptions::default(),
        )
        .expect("write");
        assert!(names(&dir).contains(&young), "a fresh temporary was swept");
        // Left young, the directory is looked at again by the next write.
        backdate(&path);
        write_file(
            Writable::of_own(fd.as_fd(), true),
            b"new",
            b"y",
            &WriteOptions::default(),
        )
        .expect("write");
        assert_eq!(names(&dir), ["new"]);
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
