//! Listening on an address of this machine, as a rule allows.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::{TcpListener, UnixListener};

use crate::model::{Address, PortConnectionInfo, PortUse, Refusal, RefusalKind, excerpt};
use crate::ports::dial::{listen_target, socket_failure, targets};
use crate::ports::rules::{PortRules, Target};
use crate::sys::Socket;

/// A listening socket. A Unix socket's file is removed when it is
/// dropped (if it is still the one it bound).
pub struct Listening {
    socket: Inner,
    address: Address,
}

enum Inner {
    Tcp(TcpListener),
    /// The file is removed when the listener goes.
    Unix(UnixListener, #[allow(dead_code)] SocketFile),
}

/// The file a Unix listener made, known by its inode.
struct SocketFile {
    path: PathBuf,
    identity: (u64, u64),
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        if let Ok(meta) = std::fs::symlink_metadata(&self.path)
            && (meta.dev(), meta.ino()) == self.identity
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Listening {
    /// Where it listens: a TCP port chosen, a Unix path as bound.
    pub fn address(&self) -> &Address {
        &self.address
    }

    /// The next connection, with its addresses.
    pub async fn accept(&self) -> io::Result<(Socket, PortConnectionInfo)> {
        let (socket, unix) = match &self.socket {
            Inner::Tcp(listener) => (Socket::tcp(listener.accept().await?.0)?, false),
            Inner::Unix(listener, _) => (Socket::Unix(listener.accept().await?.0), true),
        };
        let mut info = socket.info();
        if unix {
            // The kernel names the path the socket was bound at, in the
            // private directory it was moved out of (see `bind_unix`).
            info.local = self.address.to_string();
        }
        Ok((socket, info))
    }
}

/// Listens on `address` (`asked` as the caller wrote it): a host name's
/// first address, a Unix path that must not exist yet (its socket is made
/// mode 0600, as ssh's are).
pub async fn listen(
    address: &Address,
    asked: &str,
    rules: &PortRules,
) -> Result<Listening, Refusal> {
    let target = match address {
        Address::Unix(path) => listen_target(path, rules, asked)?,
        Address::Tcp { .. } => targets(address).await?.into_iter().next().ok_or_else(|| {
            Refusal::new(RefusalKind::SocketFailed, format!("{asked}: no address"))
        })?,
    };
    rules.check(PortUse::Listen, asked, &target)?;
    let failure =
        |error: io::Error| socket_failure(&format!("cannot listen on {}", excerpt(asked)), &error);
    match target {
        Target::Ip(ip) => {
            let listener = TcpListener::bind(ip).await.map_err(failure)?;
            let bound = listener.local_addr().map_err(failure)?;
            Ok(Listening {
                socket: Inner::Tcp(listener),
                address: Address::from_socket_addr(bound),
            })
        }
        Target::Unix(path) => {
            let (listener, file) = bind_unix(&path).map_err(failure)?;
            Ok(Listening {
                socket: Inner::Unix(listener, file),
                address: Address::Unix(path),
            })
        }
    }
}

/// Binds a mode-0600 socket at `path` without ever replacing what is
/// there: bound in a private directory beside it, then moved into place
/// only if the name is still free.
fn bind_unix(path: &Path) -> io::Result<(UnixListener, SocketFile)> {
    if std::fs::symlink_metadata(path).is_ok() {
        return Err(io::Error::from_raw_os_error(libc::EADDRINUSE));
    }
    let parent = path.parent().unwrap_or(Path::new("/"));
    let staging = private_dir_in(parent)?;
    let staged = staging.join("socket");
    let bound = (|| -> io::Result<(UnixListener, SocketFile)> {
        let listener = UnixListener::bind(&staged)?;
        // Before anyone can connect (the name is not in place yet): what
        // connects is read plainly, or spliced (`sys::refuse_descriptors`).
        crate::sys::refuse_descriptors_or_warn(
            std::os::fd::AsFd::as_fd(&listener),
            "a forwarded Unix socket",
        );
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))?;
        rename_no_replace(&staged, path)?;
        let meta = std::fs::symlink_metadata(path)?;
        Ok((
            listener,
            SocketFile {
                path: path.to_path_buf(),
                identity: (meta.dev(), meta.ino()),
            },
        ))
    })();
    let _ = std::fs::remove_file(&staged);
    let _ = std::fs::remove_dir(&staging);
    bound
}

fn private_dir_in(parent: &Path) -> io::Result<PathBuf> {
    for attempt in 0..100u32 {
        let candidate = parent.join(format!(".capexec-port-{}-{attempt}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&candidate) {
            Ok(()) => return Ok(candidate),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(error) => return Err(error),
        }
    }
    Err(io::Error::other(
        "cannot create a private directory to bind in",
    ))
}

/// rename(2) that fails with EEXIST rather than replace `to`.
fn rename_no_replace(from: &Path, to: &Path) -> io::Result<()> {
    let c = |path: &Path| {
        CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
    };
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: two NUL-terminated paths that outlive the call.
    let result = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if result == 0 {
        Ok(())
    } else {
        let error = io::Error::last_os_error();
        Err(if error.raw_os_error() == Some(libc::EEXIST) {
            io::Error::from_raw_os_error(libc::EADDRINUSE)
        } else {
            error
        })
    }
}
