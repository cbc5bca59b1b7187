//! Calls on the tree beneath a directory: making and removing
//! directories, renaming, copying, symlinks, permissions, times and
//! canonical paths. Every final component is acted on relative to its
//! parent's descriptor (see `resolve.rs`).

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, Dir, Mode, OFlags, RenameFlags, ResolveFlags};
use rustix::io::Errno;

use crate::files::Writable;
use crate::files::error::{failed, refused};
use crate::files::resolve::{checked, entry, locate, open_beneath, path_of, proc_path, split};
use crate::files::stat::from_stat;
use crate::files::write::{PendingFile, set_times as set_fd_times};
use crate::model::{CopyOptions, Refusal, RefusalKind, WriteOptions};

/// `mkdir -p`: `path` and its missing parents, each made relative to the
/// parent resolved beneath `dir`. One level after the other, never by
/// recursion: a path of thousands of parts (4 KiB of `a/`) is made without
/// a stack frame per part.
pub fn make_dirs(op: &str, dir: Writable<'_>, path: &[u8], mode: u32) -> Result<(), Refusal> {
    let checked_path = checked(op, path)?;
    if split(checked_path).is_none() {
        // ".", "..", "": exists already, or leaves (which resolving says).
        return locate(dir, checked_path, false)
            .map(drop)
            .map_err(|errno| failed(op, path, errno));
    }
    // Most often only the last part is missing: one resolution.
    match make_one(op, dir, path, mode) {
        Err(refusal) if refusal.kind == RefusalKind::NotFound => {}
        other => return other,
    }
    // Each prefix ending at a part, from the top: its parent exists once
    // the prefix before it is made.
    let bytes = checked_path.as_os_str().as_bytes();
    let ends = bytes
        .iter()
        .enumerate()
        .filter(|&(at, &byte)| byte == b'/' && at > 0 && bytes[at - 1] != b'/')
        .map(|(at, _)| at)
        .chain(std::iter::once(bytes.len()));
    for end in ends {
        let prefix = &bytes[..end];
        if split(Path::new(OsStr::from_bytes(prefix))).is_none() {
            continue;
        }
        make_one(op, dir, prefix, mode)?;
    }
    Ok(())
}

/// Makes directory `path` (its parent existing), or finds one there.
fn make_one(op: &str, dir: Writable<'_>, path: &[u8], mode: u32) -> Result<(), Refusal> {
    let Some((_, name)) = split(Path::new(OsStr::from_bytes(path))) else {
        return Ok(());
    };
    let target = entry(op, dir, path)?;
    match rustix::fs::mkdirat(&target.parent, name, Mode::from_raw_mode(mode)) {
        Ok(()) => Ok(()),
        Err(Errno::EXIST) => {
            let stat = rustix::fs::statat(&target.parent, name, AtFlags::empty())
                .map_err(|errno| failed(op, path, errno))?;
            if from_stat(&stat).is_dir() {
                Ok(())
            } else {
                Err(failed(op, path, Errno::NOTDIR))
            }
        }
        Err(errno) => Err(failed(op, path, errno)),
    }
}

pub fn mkdir(dir: Writable<'_>, path: &[u8], recursive: bool, mode: u32) -> Result<(), Refusal> {
    const OP: &str = "mkdir";
    if recursive {
        return make_dirs(OP, dir, path, mode & 0o7777);
    }
    let target = entry(OP, dir, path)?;
    rustix::fs::mkdirat(
        &target.parent,
        &target.name,
        Mode::from_raw_mode(mode & 0o7777),
    )
    .map_err(|errno| failed(OP, path, errno))
}

/// `remove`: how many entries went.
pub fn remove(
    dir: Writable<'_>,
    path: &[u8],
    recursive: bool,
    missing_ok: bool,
) -> Result<u64, Refusal> {
    const OP: &str = "remove";
    let target = match entry(OP, dir, path) {
        Ok(target) => target,
        Err(refusal) if missing_ok && refusal.kind == RefusalKind::NotFound => return Ok(0),
        Err(refusal) => return Err(refusal),
    };
    let fail = |errno| failed(OP, path, errno);
    let stat = match rustix::fs::statat(&target.parent, &target.name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => from_stat(&stat),
        Err(Errno::NOENT) if missing_ok => return Ok(0),
        Err(errno) => return Err(fail(errno)),
    };
    if !stat.is_dir() {
        rustix::fs::unlinkat(&target.parent, &target.name, AtFlags::empty()).map_err(fail)?;
        return Ok(1);
    }
    let mut removed = 0;
    if recursive {
        let inner = open_dir_entry(&target.parent, &target.name).map_err(fail)?;
        removed += empty_dir(inner).map_err(fail)?;
    }
    rustix::fs::unlinkat(&target.parent, &target.name, AtFlags::REMOVEDIR).map_err(fail)?;
    Ok(removed + 1)
}

/// Opens directory `name` of `parent` for reading, refusing a symlink put
/// there meanwhile.
pub fn open_dir_entry(parent: impl AsFd, name: &OsStr) -> Result<OwnedFd, Errno> {
    open_entry(parent, name, OFlags::RDONLY | OFlags::DIRECTORY)
}

/// Opens entry `name` of `parent` with `flags`, never through a symlink
/// (one put there meanwhile fails with ELOOP).
fn open_entry(parent: impl AsFd, name: &OsStr, flags: OFlags) -> Result<OwnedFd, Errno> {
    open_beneath(
        parent,
        Path::new(name),
        flags | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS,
    )
}

/// Removes everything in directory `fd`, never following symlinks; how
/// many entries went. Depth first without recursion and with one
/// directory open at a time (the way back up is `..`, checked to be the
/// directory it came from): a tree thousands of levels deep takes neither
/// a stack frame nor a descriptor per level.
fn empty_dir(fd: OwnedFd) -> Result<u64, Errno> {
    // The directories entered below `fd`: each one's name in its parent,
    // and the parent's identity, to check the way back up.
    let mut entered: Vec<(std::ffi::CString, (u64, u64))> = Vec::new();
    let mut current = fd;
    let mut removed = 0;
    'directory: loop {
        // Names first, then removals: a directory is not read while it
        // changes. Batches bound the memory a huge directory takes.
        let names = first_names(&current, 1024)?;
        if names.is_empty() {
            let Some((name, parent_id)) = entered.pop() else {
                return Ok(removed);
            };
            // `..` is above `current`, which resolving beneath it refuses:
            // a plain open, whose result is checked instead.
            let parent = rustix::fs::openat(
                &current,
                "..",
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            if identity(&parent)? != parent_id {
                // Moved meanwhile: not a tree to go on removing blindly.
                return Err(Errno::STALE);
            }
            rustix::fs::unlinkat(&parent, name.as_c_str(), AtFlags::REMOVEDIR)?;
            removed += 1;
            current = parent;
            continue;
        }
        for name in names {
            match rustix::fs::unlinkat(&current, name.as_c_str(), AtFlags::empty()) {
                Ok(()) => removed += 1,
                Err(Errno::ISDIR | Errno::PERM) => {
                    let inner = open_dir_entry(&current, OsStr::from_bytes(name.to_bytes()))?;
                    entered.push((name, identity(&current)?));
                    current = inner;
                    continue 'directory;
                }
                Err(Errno::NOENT) => {}
                Err(errno) => return Err(errno),
            }
        }
    }
}

/// Up to `most` names of directory `fd`'s entries, `.` and `..` left out.
fn first_names(fd: &OwnedFd, most: usize) -> Result<Vec<std::ffi::CString>, Errno> {
    let mut dir = Dir::read_from(fd)?;
    let mut names = Vec::new();
    while let Some(entry) = dir.read() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        names.push(entry.file_name().to_owned());
        if names.len() >= most {
            break;
        }
    }
    Ok(names)
}

/// A directory's device and inode.
fn identity(fd: &OwnedFd) -> Result<(u64, u64), Errno> {
    let stat = rustix::fs::fstat(fd)?;
    Ok((stat.st_dev, stat.st_ino))
}

pub fn rename(dir: Writable<'_>, from: &[u8], to: &[u8], no_replace: bool) -> Result<(), Refusal> {
    const OP: &str = "rename";
    let source = entry(OP, dir.as_fd(), from)?;
    let target = entry(OP, dir.as_fd(), to)?;
    let flags = if no_replace {
        RenameFlags::NOREPLACE
    } else {
        RenameFlags::empty()
    };
    rustix::fs::renameat_with(
        &source.parent,
        &source.name,
        &target.parent,
        &target.name,
        flags,
    )
    .map_err(|errno| match errno {
        Errno::EXIST | Errno::NOTEMPTY | Errno::ISDIR | Errno::NOTDIR => failed(OP, to, errno),
        Errno::XDEV => refused(
            RefusalKind::Unsupported,
            OP,
            from,
            format!(
                "{} is on another file system",
                crate::files::error::shown(to)
            ),
        ),
        Errno::INVAL => refused(
            RefusalKind::InvalidArgument,
            OP,
            from,
            "a directory cannot be moved into itself",
        ),
        errno => failed(OP, from, errno),
    })
}

pub fn symlink(dir: Writable<'_>, target: &[u8], path: &[u8]) -> Result<(), Refusal> {
    const OP: &str = "symlink";
    checked(OP, target)?;
    if target.is_empty() {
        return Err(refused(
            RefusalKind::InvalidArgument,
            OP,
            path,
            "an empty target",
        ));
    }
    let link = entry(OP, dir, path)?;
    rustix::fs::symlinkat(OsStr::from_bytes(target), &link.parent, &link.name)
        .map_err(|errno| failed(OP, path, errno))
}

pub fn readlink(dir: impl AsFd, path: &[u8]) -> Result<Vec<u8>, Refusal> {
    const OP: &str = "readlink";
    let link = entry(OP, dir, path)?;
    match rustix::fs::readlinkat(&link.parent, &link.name, Vec::new()) {
        Ok(target) => Ok(target.into_bytes()),
        Err(Errno::INVAL) => Err(refused(
            RefusalKind::InvalidArgument,
            OP,
            path,
            "not a symlink",
        )),
        Err(errno) => Err(failed(OP, path, errno)),
    }
}

/// The permission bits of what `path` leads to (within the directory).
pub fn set_permissions(dir: Writable<'_>, path: &[u8], mode: u32) -> Result<(), Refusal> {
    const OP: &str = "chmod";
    let fail = |errno| failed(OP, path, errno);
    let fd = locate(dir, checked(OP, path)?, false).map_err(fail)?;
    rustix::fs::chmod(proc_path(&fd).as_str(), Mode::from_raw_mode(mode & 0o7777)).map_err(fail)
}

pub fn set_times(
    dir: Writable<'_>,
    path: &[u8],
    accessed_ns: i64,
    modified_ns: i64,
) -> Result<(), Refusal> {
    const OP: &str = "set times of";
    let fail = |errno| failed(OP, path, errno);
    let fd = locate(dir, checked(OP, path)?, false).map_err(fail)?;
    set_fd_times(&fd, accessed_ns, modified_ns).map_err(fail)
}

/// `path` resolved, relative to `dir`.
pub fn canonicalize(dir: impl AsFd, path: &[u8]) -> Result<Vec<u8>, Refusal> {
    const OP: &str = "canonicalize";
    let fail = |errno| failed(OP, path, errno);
    let fd = locate(dir.as_fd(), checked(OP, path)?, false).map_err(fail)?;
    let root = path_of(dir.as_fd()).map_err(fail)?;
    let resolved = path_of(&fd).map_err(fail)?;
    let relative = resolved.strip_prefix(&root).map_err(|_| {
        refused(
            RefusalKind::Internal,
            OP,
            path,
            "the directory was moved while the path was resolved",
        )
    })?;
    Ok(relative.as_os_str().as_bytes().to_vec())
}

/// `copy`: how many entries were copied.
pub fn copy(
    dir: Writable<'_>,
    from: &[u8],
    to: &[u8],
    options: CopyOptions,
) -> Result<u64, Refusal> {
    const OP: &str = "copy";
    let tmpfile = dir.tmpfile();
    let dir = dir.as_fd();
    let source = entry(OP, dir, from)?;
    let stat = rustix::fs::statat(&source.parent, &source.name, AtFlags::SYMLINK_NOFOLLOW)
        .map_err(|errno| failed(OP, from, errno))?;
    let stat = from_stat(&stat);
    if stat.is_dir() {
        if !options.recursive {
            return Err(refused(
                RefusalKind::IsADirectory,
                OP,
                from,
                "is a directory (copy it with `recursive`)",
            ));
        }
        let source_dir = open_dir_entry(&source.parent, &source.name)
            .map_err(|errno| failed(OP, from, errno))?;
        let target = entry(OP, dir, to)?;
        if inside(&source_dir, &target.parent).map_err(|errno| failed(OP, to, errno))? {
            return Err(refused(
                RefusalKind::InvalidArgument,
                OP,
                from,
                format!(
                    "cannot copy a directory into itself ({})",
                    crate::files::error::shown(to)
                ),
            ));
        }
        let mut copier = Copier {
            options,
            tmpfile,
            copied: 0,
            depth: 0,
        };
        copier.copy_dir(source_dir, &stat, &target.parent, &target.name, from, to)?;
        return Ok(copier.copied);
    }
    let target = entry(OP, dir, to)?;
    let mut copier = Copier {
        options,
        tmpfile,
        copied: 0,
        depth: 0,
    };
    copier.copy_one(
        &source.parent,
        &source.name,
        &stat,
        &target.parent,
        &target.name,
        from,
        to,
    )?;
    Ok(copier.copied)
}

/// Whether `dir` is `ancestor` or beneath it.
fn inside(ancestor: &OwnedFd, dir: &OwnedFd) -> Result<bool, Errno> {
    let wanted = rustix::fs::fstat(ancestor)?;
    let mut current = open_beneath(
        dir,
        Path::new("."),
        OFlags::PATH | OFlags::DIRECTORY,
        Mode::empty(),
        ResolveFlags::empty(),
    )?;
    loop {
        let here = rustix::fs::fstat(&current)?;
        if here.st_dev == wanted.st_dev && here.st_ino == wanted.st_ino {
            return Ok(true);
        }
        // Unconfined on purpose: only identities are compared, nothing is
        // opened for use. The root of the file system ends the climb.
        let up = rustix::fs::openat(
            &current,
            "..",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let above = rustix::fs::fstat(&up)?;
        if above.st_dev == here.st_dev && above.st_ino == here.st_ino {
            return Ok(false);
        }
        current = up;
    }
}

struct Copier {
    options: CopyOptions,
    /// Whether files may stage in unnamed files (see [`Writable::tmpfile`]).
    tmpfile: bool,
    copied: u64,
    /// Directories entered below the source: a copy goes a stack frame
    /// and two descriptors deeper per level, so its depth is bounded.
    depth: usize,
}

/// The deepest tree `copy` copies (directories below the source); deeper
/// is refused with `[capexec:limit]` rather than overflowing the stack
/// of the thread that copies (a peer can make a tree of any depth).
pub const MAX_COPY_DEPTH: usize = 256;

impl Copier {
    #[allow(clippy::too_many_arguments)]
    fn copy_one(
        &mut self,
        from_parent: &OwnedFd,
        from_name: &OsStr,
        stat: &crate::model::FileStat,
        to_parent: &OwnedFd,
        to_name: &OsStr,
        from: &[u8],
        to: &[u8],
    ) -> Result<(), Refusal> {
        const OP: &str = "copy";
        if stat.is_symlink() {
            let target = rustix::fs::readlinkat(from_parent, from_name, Vec::new())
                .map_err(|errno| failed(OP, from, errno))?;
            if !self.options.no_replace {
                match rustix::fs::unlinkat(to_parent, to_name, AtFlags::empty()) {
                    Ok(()) | Err(Errno::NOENT) => {}
                    Err(errno) => return Err(failed(OP, to, errno)),
                }
            }
            rustix::fs::symlinkat(target.as_c_str(), to_parent, to_name)
                .map_err(|errno| failed(OP, to, errno))?;
            self.copied += 1;
            return Ok(());
        }
        if !stat.is_file() {
            return Err(refused(
                RefusalKind::InvalidArgument,
                OP,
                from,
                format!(
                    "not a regular file (a {})",
                    crate::files::read::kind_name(stat.kind)
                ),
            ));
        }
        let source = open_entry(from_parent, from_name, OFlags::RDONLY | OFlags::NONBLOCK)
            .map_err(|errno| failed(OP, from, errno))?;
        let options = WriteOptions {
            exclusive: self.options.no_replace,
            permissions: Some(if self.options.preserve {
                stat.permissions
            } else {
                stat.permissions & 0o777 & !umask()
            }),
            modified_ns: self.options.preserve.then_some(stat.modified_ns),
            ..WriteOptions::default()
        };
        let target = crate::files::resolve::Entry {
            parent: to_parent.try_clone().map_err(|error| {
                refused(
                    RefusalKind::LimitReached,
                    OP,
                    to,
                    crate::model::io_message(&error),
                )
            })?,
            name: to_name.to_os_string(),
        };
        let mut pending = PendingFile::begin_entry(OP, to, target, &options, self.tmpfile)?;
        loop {
            match rustix::fs::copy_file_range(&source, None, pending.fd(), None, 1 << 30) {
                Ok(0) => break,
                Ok(n) => pending.add_written(n as u64),
                Err(Errno::INTR) => {}
                Err(Errno::XDEV | Errno::NOSYS | Errno::OPNOTSUPP | Errno::INVAL) => {
                    copy_by_reading(&source, &mut pending)?;
                    break;
                }
                Err(errno) => return Err(failed(OP, to, errno)),
            }
        }
        pending.commit(None)?;
        self.copied += 1;
        Ok(())
    }

    fn copy_dir(
        &mut self,
        source: OwnedFd,
        stat: &crate::model::FileStat,
        to_parent: &OwnedFd,
        to_name: &OsStr,
        from: &[u8],
        to: &[u8],
    ) -> Result<(), Refusal> {
        const OP: &str = "copy";
        match rustix::fs::mkdirat(to_parent, to_name, Mode::from_raw_mode(0o777)) {
            Ok(()) => {}
            Err(Errno::EXIST) if !self.options.no_replace => {}
            Err(errno) => return Err(failed(OP, to, errno)),
        }
        let target = open_entry(to_parent, to_name, OFlags::PATH | OFlags::DIRECTORY)
            .map_err(|errno| failed(OP, to, errno))?;
        self.copied += 1;
        let source_path = open_beneath(
            &source,
            Path::new("."),
            OFlags::PATH | OFlags::DIRECTORY,
            Mode::empty(),
            ResolveFlags::empty(),
        )
        .map_err(|errno| failed(OP, from, errno))?;
        let mut dir = Dir::new(source).map_err(|errno| failed(OP, from, errno))?;
        while let Some(item) = dir.read() {
            let item = item.map_err(|errno| failed(OP, from, errno))?;
            let name = OsStr::from_bytes(item.file_name().to_bytes()).to_os_string();
            if name == "." || name == ".." {
                continue;
            }
            let child_from = joined(from, name.as_bytes());
            let child_to = joined(to, name.as_bytes());
            let child_stat = rustix::fs::statat(&source_path, &name, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|errno| failed(OP, &child_from, errno))?;
            let child_stat = from_stat(&child_stat);
            if child_stat.is_dir() {
                if self.depth >= MAX_COPY_DEPTH {
                    return Err(refused(
                        RefusalKind::LimitReached,
                        OP,
                        &child_from,
                        format!("the tree is deeper than {MAX_COPY_DEPTH} directories"),
                    ));
                }
                let inner = open_dir_entry(&source_path, &name)
                    .map_err(|errno| failed(OP, &child_from, errno))?;
                self.depth += 1;
                let copied =
                    self.copy_dir(inner, &child_stat, &target, &name, &child_from, &child_to);
                self.depth -= 1;
                copied?;
            } else {
                self.copy_one(
                    &source_path,
                    &name,
                    &child_stat,
                    &target,
                    &name,
                    &child_from,
                    &child_to,
                )?;
            }
        }
        if self.options.preserve {
            let fail = |errno| failed(OP, to, errno);
            rustix::fs::chmod(
                proc_path(&target).as_str(),
                Mode::from_raw_mode(stat.permissions),
            )
            .map_err(fail)?;
            set_fd_times(&target, stat.accessed_ns, stat.modified_ns).map_err(fail)?;
        }
        Ok(())
    }
}

fn copy_by_reading(source: &OwnedFd, pending: &mut PendingFile) -> Result<(), Refusal> {
    let mut buf = vec![0; 256 * 1024];
    loop {
        let offset = pending.written();
        let n = crate::files::read::read_at(source, &mut buf, offset)
            .map_err(|errno| failed("copy", b"", errno))?;
        if n == 0 {
            return Ok(());
        }
        pending.write_all(&buf[..n])?;
    }
}

/// `parent/name` as a path for messages and walks.
pub fn joined(parent: &[u8], name: &[u8]) -> Vec<u8> {
    if parent.is_empty() || parent == b"." {
        return name.to_vec();
    }
    let mut path = parent.to_vec();
    if !path.ends_with(b"/") {
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}

/// The server's umask, as /proc tells it (setting it to read it back
/// would race with files other threads create meanwhile).
pub fn umask() -> u32 {
    static UMASK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *UMASK.get_or_init(|| {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|status| {
                status
                    .lines()
                    .find_map(|line| line.strip_prefix("Umask:"))
                    .and_then(|value| u32::from_str_radix(value.trim(), 8).ok())
            })
            .unwrap_or(0o022)
    })
}
