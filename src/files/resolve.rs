//! Resolving paths beneath a directory, by the kernel: `openat2` with
//! `RESOLVE_BENEATH | RESOLVE_NO_XDEV | RESOLVE_NO_MAGICLINKS` from the
//! directory's descriptor, so `..` past it, absolute paths and symlinks
//! pointing out (also ones swapped in during the call) fail with EXDEV or
//! ELOOP instead of escaping, and so does a path through a mount point
//! beneath it: a bind mount there may lead anywhere, so every call stays
//! on the directory's own mount. Calls that create, remove or rename act
//! on the final component relative to its parent's descriptor, opened the
//! same way; no path is ever joined into a string.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::files::error::{failed, refused};
use crate::model::{MAX_PATH_BYTES, Refusal, RefusalKind};

/// The resolution every path of a directory gets.
const CONFINED: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_XDEV)
    .union(ResolveFlags::NO_MAGICLINKS);

/// What [`open_beneath`] fails with for a path that crosses a mount point
/// beneath the directory, told apart from one that leaves it (both are
/// EXDEV to openat2). An error number the kernel never returns; it never
/// leaves the file engine: `error.rs` words it.
pub const CROSSES_MOUNT: Errno = Errno::from_raw_os_error(4000);

/// `path` as a path of the directory, or why it cannot be one.
pub fn checked<'a>(op: &str, path: &'a [u8]) -> Result<&'a Path, Refusal> {
    if path.contains(&0) {
        return Err(refused(
            RefusalKind::InvalidArgument,
            op,
            path,
            "a path may not contain NUL",
        ));
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(refused(
            RefusalKind::InvalidArgument,
            op,
            path,
            format!("longer than {MAX_PATH_BYTES} bytes"),
        ));
    }
    Ok(if path.is_empty() {
        Path::new(".")
    } else {
        Path::new(OsStr::from_bytes(path))
    })
}

/// Opens `path` beneath `dir` with `flags` (and `extra` resolve flags),
/// retrying the EAGAIN a concurrent rename can cause.
pub fn open_beneath(
    dir: impl AsFd,
    path: &Path,
    flags: OFlags,
    mode: Mode,
    extra: ResolveFlags,
) -> Result<OwnedFd, Errno> {
    // openat2 refuses O_PATH with any flag but these (EINVAL).
    let flags = if flags.contains(OFlags::PATH) {
        flags | OFlags::CLOEXEC
    } else {
        flags | OFlags::CLOEXEC | OFlags::NOCTTY
    };
    let mut attempts = 0;
    loop {
        match rustix::fs::openat2(dir.as_fd(), path, flags, mode, CONFINED | extra) {
            Err(Errno::AGAIN) if attempts < 16 => attempts += 1,
            Err(Errno::INTR) => {}
            Err(Errno::XDEV) if passes_a_mount(dir.as_fd(), path, flags, extra) => {
                return Err(CROSSES_MOUNT);
            }
            other => return other,
        }
    }
}

/// Whether `path`, which failed with EXDEV, failed at a mount point rather
/// than by leaving the directory: resolved again as a handle without
/// `RESOLVE_NO_XDEV` (nothing is created or opened for use), it gets
/// further than an EXDEV.
fn passes_a_mount(dir: BorrowedFd<'_>, path: &Path, flags: OFlags, extra: ResolveFlags) -> bool {
    let probe = OFlags::PATH | OFlags::CLOEXEC | (flags & OFlags::NOFOLLOW);
    let resolve = (CONFINED | extra).difference(ResolveFlags::NO_XDEV);
    loop {
        match rustix::fs::openat2(dir, path, probe, Mode::empty(), resolve) {
            Err(Errno::AGAIN | Errno::INTR) => {}
            Err(Errno::XDEV) => return false,
            _ => return true,
        }
    }
}

/// A handle on `path` (O_PATH), following a final symlink within the
/// directory unless `no_follow`.
pub fn locate(dir: impl AsFd, path: &Path, no_follow: bool) -> Result<OwnedFd, Errno> {
    let mut flags = OFlags::PATH;
    if no_follow {
        flags |= OFlags::NOFOLLOW;
    }
    open_beneath(dir, path, flags, Mode::empty(), ResolveFlags::empty())
}

/// The parent directory of `path` (an O_PATH descriptor) and its final
/// component: what calls that create, remove or rename act on.
pub struct Entry {
    pub parent: OwnedFd,
    pub name: std::ffi::OsString,
}

/// The [`Entry`] `path` names, for `op`. A path whose last component is
/// not a name (".", "..", the directory itself) names no entry.
pub fn entry(op: &str, dir: impl AsFd, raw: &[u8]) -> Result<Entry, Refusal> {
    let path = checked(op, raw)?;
    let (parent, name) = split(path).ok_or_else(|| {
        refused(
            RefusalKind::InvalidArgument,
            op,
            raw,
            "names no entry of the directory (it ends in \".\" or \"..\", or is the directory \
             itself)",
        )
    })?;
    let parent = open_beneath(
        dir,
        parent,
        OFlags::PATH | OFlags::DIRECTORY,
        Mode::empty(),
        ResolveFlags::empty(),
    )
    .map_err(|errno| failed(op, raw, errno))?;
    Ok(Entry {
        parent,
        name: name.to_os_string(),
    })
}

/// `path`'s parent (lexically: "." for a single name) and its last
/// component, if that is a name.
pub fn split(path: &Path) -> Option<(&Path, &OsStr)> {
    let bytes = path.as_os_str().as_bytes();
    let trimmed = {
        let mut end = bytes.len();
        while end > 1 && bytes[end - 1] == b'/' {
            end -= 1;
        }
        &bytes[..end]
    };
    let (parent, name) = match trimmed.iter().rposition(|&b| b == b'/') {
        Some(at) => (&trimmed[..at.max(1)], &trimmed[at + 1..]),
        None => (&b"."[..], trimmed),
    };
    if name.is_empty() || name == b"." || name == b".." {
        return None;
    }
    let parent = if parent.is_empty() { &b"."[..] } else { parent };
    Some((
        Path::new(OsStr::from_bytes(parent)),
        OsStr::from_bytes(name),
    ))
}

/// The path the kernel gives an open descriptor now (through /proc).
pub fn path_of(fd: impl AsFd) -> Result<std::path::PathBuf, Errno> {
    let link = format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&fd.as_fd())
    );
    let target = rustix::fs::readlink(link.as_str(), Vec::new())?;
    Ok(std::path::PathBuf::from(OsStr::from_bytes(
        target.as_bytes(),
    )))
}

/// The name through which system calls that take only paths (chmod,
/// utimensat, linkat of an unnamed file) reach what `fd` already is.
pub fn proc_path(fd: impl AsFd) -> String {
    format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&fd.as_fd())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_into_parent_and_name() {
        let parts = |p: &str| split(Path::new(p)).map(|(a, b)| (a.to_owned(), b.to_owned()));
        assert_eq!(parts("a"), Some((".".into(), "a".into())));
        assert_eq!(parts("a/b/"), Some(("a".into(), "b".into())));
        assert_eq!(parts("/x"), Some(("/".into(), "x".into())));
        assert_eq!(parts("a/.."), None);
        assert_eq!(parts("."), None);
        assert_eq!(parts("a//b"), Some(("a/".into(), "b".into())));
    }
}
