//! A start's working directory, resolved once.
//!
//! A path can name another directory a moment later: a peer's own command
//! can swap a directory for a symbolic link out while a start is checked.
//! So the path is opened once, and everything after uses what was opened:
//! the cwdRoots check reads the opened directory's path from the kernel,
//! the sandbox's rule for the working directory must name the opened
//! inode, and the child enters it by descriptor (`fchdir`), or, when its
//! trees are mounted again, by path and then proves it is the same inode.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::model::{Refusal, RefusalKind, StartSpec, excerpt, io_message};

/// An opened working directory and where it is.
#[derive(Debug)]
pub struct WorkingDir {
    fd: OwnedFd,
    /// What refusals call it ("working directory NAME").
    name: String,
    /// Its canonical path, as the kernel names the opened directory: read
    /// when first asked for (a sandbox or cwdRoots needs it; a plain start
    /// only enters the directory).
    path: std::sync::OnceLock<PathBuf>,
    /// Its (device, inode).
    identity: (u64, u64),
}

impl WorkingDir {
    /// The working directory `spec` asks for, or the server's own.
    pub fn of_spec(spec: &StartSpec) -> Result<WorkingDir, Refusal> {
        match spec.effective_cwd() {
            Some(cwd) => WorkingDir::open(cwd),
            None => WorkingDir::open_named(Path::new("."), "the server's working directory".into()),
        }
    }

    /// Opens `path` (symbolic links followed, as chdir follows them): a
    /// refusal tagged `bad-cwd` naming `path` if it is not a directory
    /// that exists.
    pub fn open(path: &Path) -> Result<WorkingDir, Refusal> {
        let name = format!("working directory {}", excerpt(&path.display().to_string()));
        WorkingDir::open_named(path, name)
    }

    /// [`WorkingDir::open`], its refusals saying `name`.
    fn open_named(path: &Path, name: String) -> Result<WorkingDir, Refusal> {
        let refused = |why: &str| Refusal::new(RefusalKind::BadCwd, format!("{name}: {why}"));
        let fd = rustix::fs::open(
            path,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|errno| refused(&io_message(&errno.into())))?;
        let stat = rustix::fs::fstat(&fd).map_err(|errno| refused(&io_message(&errno.into())))?;
        if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::Directory {
            return Err(Refusal::new(
                RefusalKind::BadCwd,
                format!("{name} is not a directory"),
            ));
        }
        if stat.st_nlink == 0 {
            return Err(refused("it was removed"));
        }
        Ok(WorkingDir {
            fd,
            name,
            path: std::sync::OnceLock::new(),
            identity: (stat.st_dev, stat.st_ino),
        })
    }

    /// The canonical path of the directory that was opened (the path it
    /// had when this was first asked), or why it has none.
    pub fn path(&self) -> Result<&Path, Refusal> {
        if let Some(path) = self.path.get() {
            return Ok(path);
        }
        let path = opened_path(&self.fd).map_err(|error| {
            Refusal::new(
                RefusalKind::BadCwd,
                format!("{}: {}", self.name, io_message(&error)),
            )
        })?;
        Ok(self.path.get_or_init(|| path))
    }

    /// The (device, inode) of the directory that was opened.
    pub fn identity(&self) -> (u64, u64) {
        self.identity
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for WorkingDir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The path the kernel gives the directory `fd` names (its dentry's path
/// in this mount namespace), checked to name that directory still.
fn opened_path(fd: &OwnedFd) -> std::io::Result<PathBuf> {
    let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let path = std::fs::read_link(&link)?;
    // A path the kernel could not reach from our root (another mount
    // namespace's, or one made unreachable) is not a path: refuse it
    // rather than name some other directory.
    let meta = std::fs::metadata(&path)?;
    let stat = rustix::fs::fstat(fd)?;
    if !path.is_absolute() || (meta.dev(), meta.ino()) != (stat.st_dev, stat.st_ino) {
        return Err(std::io::Error::other(
            "it moved while it was opened (its path names another directory now)",
        ));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_named_by_its_canonical_path_through_links() {
        let temp = tempfile::tempdir().expect("tempdir");
        let canonical = std::fs::canonicalize(temp.path()).expect("canonical");
        std::fs::create_dir(canonical.join("real")).expect("mkdir");
        std::os::unix::fs::symlink("real", canonical.join("link")).expect("symlink");
        let dir = WorkingDir::open(&canonical.join("link")).expect("opened");
        assert_eq!(dir.path().expect("a path"), canonical.join("real"));
        let meta = std::fs::metadata(canonical.join("real")).expect("meta");
        assert_eq!(dir.identity(), (meta.dev(), meta.ino()));
    }

    #[test]
    fn what_is_not_a_directory_is_refused_by_name() {
        let temp = tempfile::tempdir().expect("tempdir");
        let file = temp.path().join("file");
        std::fs::write(&file, b"x").expect("write");
        let refusal = WorkingDir::open(&file).expect_err("a file");
        assert_eq!(refusal.kind, RefusalKind::BadCwd);
        assert!(refusal.message.ends_with("is not a directory"), "{refusal}");
        let refusal = WorkingDir::open(&temp.path().join("missing")).expect_err("missing");
        assert_eq!(refusal.kind, RefusalKind::BadCwd);
        assert!(refusal.message.contains("missing"), "{refusal}");
    }

    #[test]
    fn the_opened_directory_stays_the_one_entered_when_its_path_is_swapped() {
        let temp = tempfile::tempdir().expect("tempdir");
        let canonical = std::fs::canonicalize(temp.path()).expect("canonical");
        std::fs::create_dir(canonical.join("d")).expect("mkdir");
        std::fs::create_dir(canonical.join("outside")).expect("mkdir");
        let dir = WorkingDir::open(&canonical.join("d")).expect("opened");
        assert_eq!(dir.path().expect("a path"), canonical.join("d"));
        std::fs::rename(canonical.join("d"), canonical.join("moved")).expect("mv");
        std::os::unix::fs::symlink("outside", canonical.join("d")).expect("symlink");
        let meta = std::fs::metadata(canonical.join("moved")).expect("meta");
        assert_eq!(dir.identity(), (meta.dev(), meta.ino()));
        assert_eq!(
            dir.path().expect("a path"),
            canonical.join("d"),
            "the path it had when first asked"
        );
    }
}
