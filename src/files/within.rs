//! What a restricted caller is told about a path it named that could not
//! be resolved. A path that resolves is checked against the caller's
//! roots and refused with `not-allowed` when it lies outside; a path that
//! does not resolve must get the same answer when it lies outside too,
//! or the difference (`not-found` here, `not-allowed` there) tells the
//! caller whether anything outside its roots exists.
//!
//! Outside means: lexically outside every root, or inside one lexically
//! but leading out of it as the kernel resolves it beneath that root
//! (a symlink pointing out to a missing target, `..` past the root).

use std::ffi::OsStr;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// One root of a restricted caller: a canonical path, and whether what
/// lies below it is inside too (a directory) or only the path itself (a
/// socket named by a `unix:PATH` pattern).
#[derive(Clone, Copy, Debug)]
pub struct Root<'a> {
    pub path: &'a Path,
    pub below: bool,
}

impl<'a> Root<'a> {
    /// A directory root: itself and everything below it.
    pub fn directory(path: &'a Path) -> Root<'a> {
        Root { path, below: true }
    }
}

/// After `path` (absolute) failed to resolve: whether it names a place
/// inside one of `roots`, so that the caller may be told why it failed.
/// If not, the caller must be told only that it is not allowed, as for
/// an existing path outside.
pub fn failure_is_inside<'a>(path: &Path, roots: impl IntoIterator<Item = Root<'a>>) -> bool {
    let Some(lexical) = lexical(path) else {
        return false;
    };
    roots.into_iter().any(|root| {
        if !root.below {
            return lexical == root.path;
        }
        match lexical.strip_prefix(root.path) {
            Ok(rest) => stays_beneath(root.path, rest),
            Err(_) => false,
        }
    })
}

/// `path` with `.` components and repeated slashes gone; `None` if it is
/// relative or has a `..` (which only the kernel can follow truthfully).
fn lexical(path: &Path) -> Option<PathBuf> {
    if !path.is_absolute() {
        return None;
    }
    let mut clean = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(name) => clean.push(name),
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    Some(clean)
}

/// Whether resolving `rest` beneath `root` stays beneath it as far as it
/// gets: a failure for a missing component is inside, one for leaving the
/// root (a symlink pointing out) is not.
fn stays_beneath(root: &Path, rest: &Path) -> bool {
    let Ok(base) = rustix::fs::open(
        root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        // The root itself is gone: the failure is about the root, which
        // the caller was given.
        return true;
    };
    let rest = if rest.as_os_str().is_empty() {
        Path::new(OsStr::new("."))
    } else {
        rest
    };
    !matches!(
        crate::files::resolve::open_beneath(
            &base,
            rest,
            OFlags::PATH,
            Mode::empty(),
            ResolveFlags::empty()
        ),
        Err(Errno::XDEV | Errno::LOOP)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_failures_inside_a_root_may_say_why() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = std::fs::canonicalize(dir.path()).expect("canonical");
        std::os::unix::fs::symlink("/nonexistent-capexec-target", root.join("out"))
            .expect("symlink");
        std::os::unix::fs::symlink("../../../..", root.join("up")).expect("symlink");
        let roots = || [Root::directory(&root)];
        assert!(failure_is_inside(&root.join("missing"), roots()));
        assert!(failure_is_inside(&root.join("a/./b"), roots()));
        assert!(!failure_is_inside(&root.join("out"), roots()));
        assert!(!failure_is_inside(&root.join("out/deeper"), roots()));
        assert!(!failure_is_inside(&root.join("up/etc/missing"), roots()));
        assert!(!failure_is_inside(Path::new("/etc/missing"), roots()));
        assert!(!failure_is_inside(&root.join("../missing"), roots()));
        assert!(!failure_is_inside(Path::new("relative"), roots()));
        let socket = root.join("x.sock");
        let exact = [Root {
            path: &socket,
            below: false,
        }];
        assert!(failure_is_inside(&socket, exact));
        assert!(!failure_is_inside(&root.join("y.sock"), exact));
    }
}
