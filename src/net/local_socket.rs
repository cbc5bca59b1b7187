//! The default Unix socket: where `capexec serve` listens without
//! `--listen`, and what `--connect local` reaches.
//! `$XDG_RUNTIME_DIR/capexec/capexec.sock`, else, for root,
//! `/run/capexec/capexec.sock`; the admin socket (`serve --admin` without
//! a path) sits beside it as `admin.sock`.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The directory of the default sockets.
pub fn default_socket_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|dir| !dir.is_empty()) {
        return Ok(PathBuf::from(dir).join("capexec"));
    }
    if nix::unistd::geteuid().is_root() {
        return Ok(PathBuf::from("/run/capexec"));
    }
    Err(
        "there is no default socket: XDG_RUNTIME_DIR is not set (and only root uses \
         /run/capexec); give unix:PATH"
            .to_string(),
    )
}

/// `capexec serve`'s socket when no `--listen` is given.
pub fn default_socket_path() -> Result<PathBuf, String> {
    default_socket_dir().map(|dir| dir.join("capexec.sock"))
}

/// `capexec serve --admin`'s socket when no path is given.
pub fn default_admin_socket_path() -> Result<PathBuf, String> {
    default_socket_dir().map(|dir| dir.join("admin.sock"))
}

/// Makes `dir` (and its parents) if missing, private (0700) when made
/// here, and refuses one that another user owns or others may write to:
/// whoever controls the directory could put a socket of their own there.
pub fn ensure_private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let meta = std::fs::metadata(dir)?;
    let euid = nix::unistd::geteuid().as_raw();
    if meta.uid() != euid || meta.permissions().mode() & 0o022 != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a private directory of this user (owner {}, mode {:o})",
                dir.display(),
                meta.uid(),
                meta.permissions().mode() & 0o7777
            ),
        ));
    }
    Ok(())
}
