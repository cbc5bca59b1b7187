//! Writing files so that readers see the old content or the new, never a
//! mix: the content goes to a file without a name (O_TMPFILE) that is
//! linked into place and renamed over the target in one step when it is
//! committed. A file system without O_TMPFILE gets a hidden temporary in
//! the same directory, removed on every failure path (and when a
//! [`PendingFile`] is dropped uncommitted). Conditions on the target
//! (exclusive, must exist, `ifVersion`) are checked when the write begins
//! and again under one commit lock, so of two writers holding the same
//! version exactly one succeeds.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::Mutex;

use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags, ResolveFlags, Timespec, Timestamps};
use rustix::io::Errno;

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
    Named(OsString),
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
    committed: bool,
}

/// The prefix of hidden temporaries (see the schema's `writeFile`).
pub const TEMP_PREFIX: &str = ".capexec-";

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
        dir: impl AsFd,
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
            make_dirs(op, dir.as_fd(), parent.as_os_str().as_bytes(), 0o777)?;
        }
        let target = entry(op, dir, path)?;
        PendingFile::begin_entry(op, path, target, options)
    }

    /// [`PendingFile::begin`] for an entry already resolved; `path` names
    /// it in messages.
    pub fn begin_entry(
        op: &'static str,
        path: &[u8],
        target: Entry,
        options: &WriteOptions,
    ) -> Result<PendingFile, Refusal> {
        let existing = check_target(op, path, &target, options)?;
        let permissions = options
            .permissions
            .or_else(|| existing.as_ref().map(|stat| stat.permissions));
        let (file, staging) = if options.in_place {
            let mut flags = OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::NOFOLLOW;
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
            (file, Staging::InPlace)
        } else {
            open_staging(&target.parent).map_err(|errno| failed(op, path, errno))?
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
            if !matches!(self.staging, Staging::InPlace) {
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
            Staging::Named(temp) => {
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
                    let temp = temp_name();
                    link_unnamed(&self.file, parent, &temp)?;
                    rename(parent, &temp, name, false).inspect_err(|_| {
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
        if let (false, Staging::Named(temp)) = (self.committed, &self.staging) {
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

/// A new file without a name in `parent`, or a hidden temporary there.
fn open_staging(parent: &OwnedFd) -> Result<(OwnedFd, Staging), Errno> {
    let dot = std::path::Path::new(".");
    match open_beneath(
        parent,
        dot,
        OFlags::TMPFILE | OFlags::WRONLY,
        Mode::from_raw_mode(0o666),
        ResolveFlags::empty(),
    ) {
        Ok(fd) => return Ok((fd, Staging::Unnamed)),
        Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL | Errno::NOENT) => {}
        Err(errno) => return Err(errno),
    }
    loop {
        let temp = temp_name();
        match open_beneath(
            parent,
            std::path::Path::new(&temp),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
            Mode::from_raw_mode(0o600),
            ResolveFlags::NO_SYMLINKS,
        ) {
            Ok(fd) => return Ok((fd, Staging::Named(temp))),
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
    dir: impl AsFd,
    path: &[u8],
    data: &[u8],
    options: &WriteOptions,
) -> Result<FileStat, Refusal> {
    let mut pending = PendingFile::begin("write", dir, path, options)?;
    pending.write_all(data)?;
    pending.commit(None)
}
