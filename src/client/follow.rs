//! A path on the executor's machine with its final symlinks followed, as
//! `cp` and Codex's bridge need when they name a file by an absolute (or
//! executor-relative) path: a link may lead anywhere the executor may read
//! (`/etc/os-release` to `/usr/lib/os-release`), which the directory of the
//! link cannot name, so each link is read and the walk starts again from
//! the directory it leads to.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::capexec_capnp::executor;
use crate::client::{Directory, Error};
use crate::model::{FileKind, Refusal, RefusalKind};

/// Most symlinks followed in one path, as the kernel's own limit.
pub const MAX_LINKS_FOLLOWED: usize = 40;

/// `path` with its final symlinks followed, one directory at a time.
pub async fn follow_links(executor: &executor::Client, path: &Path) -> Result<PathBuf, Error> {
    let mut path = path.to_path_buf();
    for _ in 0..MAX_LINKS_FOLLOWED {
        let (parent, name) = parent_and_name(&path);
        let directory = Directory::open(executor, &parent);
        let stat = directory.symlink_metadata(&name).await?;
        if stat.kind != FileKind::Symlink {
            return Ok(path);
        }
        let target = PathBuf::from(OsStr::from_bytes(&directory.read_link(&name).await?));
        path = if target.is_absolute() {
            target
        } else {
            parent.join(target)
        };
    }
    Err(Error::Refused(Refusal::new(
        RefusalKind::InvalidArgument,
        format!("more than {MAX_LINKS_FOLLOWED} symlinks to follow"),
    )))
}

/// The directory that holds `path` and its name there (`/` and `.` for
/// the root; `.` for a bare name, the executor's working directory).
pub fn parent_and_name(path: &Path) -> (PathBuf, PathBuf) {
    let name = path
        .file_name()
        .map_or_else(|| PathBuf::from("."), PathBuf::from);
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ if path.has_root() && path.file_name().is_none() => path.to_path_buf(),
        _ => PathBuf::from("."),
    };
    (parent, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_into_their_directory_and_name() {
        let split = |path: &str| {
            let (parent, name) = parent_and_name(Path::new(path));
            (parent.display().to_string(), name.display().to_string())
        };
        assert_eq!(split("/"), ("/".into(), ".".into()));
        assert_eq!(split("/etc"), ("/".into(), "etc".into()));
        assert_eq!(split("/a/b"), ("/a".into(), "b".into()));
        assert_eq!(split("f"), (".".into(), "f".into()));
        assert_eq!(split("d/f"), ("d".into(), "f".into()));
    }
}
