//! Socket set-up: TCP tuning and dead-peer detection, and Unix socket files
//! that are private and never clobber what is not ours.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};
use tokio::net::{TcpStream, UnixListener};

/// A peer that stops answering is detected after about
/// `IDLE + INTERVAL * RETRIES` of silence (25 s), or once unacknowledged
/// data has waited `USER_TIMEOUT`.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_RETRIES: u32 = 3;
const USER_TIMEOUT: Duration = Duration::from_secs(30);

/// Low latency for small calls, and dead-peer detection.
pub(crate) fn tune_tcp(stream: &TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let socket = SockRef::from(stream);
    socket.set_tcp_keepalive(
        &TcpKeepalive::new()
            .with_time(KEEPALIVE_IDLE)
            .with_interval(KEEPALIVE_INTERVAL)
            .with_retries(KEEPALIVE_RETRIES),
    )?;
    socket.set_tcp_user_timeout(Some(USER_TIMEOUT))?;
    Ok(())
}

/// A bound Unix socket file and the lock that marks it as a live capexec's.
/// Dropping it removes both files, so every way out of a server (a start
/// that fails after the socket was bound, a clean shutdown) leaves neither
/// behind.
pub(crate) struct UnixSocketFile {
    path: PathBuf,
    lock_path: PathBuf,
    _lock: File,
}

impl UnixSocketFile {
    /// The socket file at `path` whose lock the binary before held at
    /// descriptor `lock` (an upgrade's hand-over).
    pub(crate) fn taken_over(path: PathBuf, lock: std::os::fd::OwnedFd) -> UnixSocketFile {
        UnixSocketFile {
            lock_path: lock_path_of(&path),
            path,
            _lock: File::from(lock),
        }
    }

    /// Its path and its lock's descriptor, for a hand-over.
    pub(crate) fn handover_parts(&self) -> (PathBuf, std::os::fd::RawFd) {
        (self.path.clone(), self._lock.as_raw_fd())
    }
}

impl Drop for UnixSocketFile {
    /// Removes the socket file, then its lock file (while still holding
    /// the lock, so no other capexec takes the path in between).
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
        let _ = fs::remove_file(&self.lock_path);
    }
}

fn lock_path_of(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// Binds `path` as a mode-0600 socket. A socket left there by a capexec that
/// died is replaced; anything else at that path is left alone and reported.
pub(crate) fn bind_unix(path: &Path) -> io::Result<(UnixListener, UnixSocketFile)> {
    let (listener, file) = bind_unix_std(path)?;
    listener.set_nonblocking(true)?;
    Ok((UnixListener::from_std(listener)?, file))
}

/// [`bind_unix`], for a process that has no runtime (yet): the listener
/// as the standard library's, blocking.
pub(crate) fn bind_unix_std(
    path: &Path,
) -> io::Result<(std::os::unix::net::UnixListener, UnixSocketFile)> {
    let lock_path = lock_path_of(path);
    let lock_existed = fs::symlink_metadata(&lock_path).is_ok();
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&lock_path)?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("{} is being served by another capexec", path.display()),
        ));
    }
    let refuse = |why: &str| {
        if !lock_existed {
            let _ = fs::remove_file(&lock_path);
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} {why}; not removing it", path.display()),
        ))
    };
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => return refuse("is a symbolic link"),
        Ok(meta) if !meta.file_type().is_socket() => return refuse("exists and is not a socket"),
        Ok(_) if !lock_existed => return refuse("is a socket that capexec did not create"),
        // A socket whose capexec is gone: ours to replace.
        Ok(_) => fs::remove_file(path)?,
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }

    // Bind inside a private directory, make the socket 0600, then move it
    // into place: nobody can connect before the permissions are right.
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let staging = tempdir_in(parent)?;
    let staged = staging.join("socket");
    let result = (|| -> io::Result<std::os::unix::net::UnixListener> {
        let listener = std::os::unix::net::UnixListener::bind(&staged)?;
        fs::set_permissions(&staged, fs::Permissions::from_mode(0o600))?;
        fs::rename(&staged, path)?;
        Ok(listener)
    })();
    let _ = fs::remove_file(&staged);
    let _ = fs::remove_dir(&staging);
    let listener = result?;
    Ok((
        listener,
        UnixSocketFile {
            path: path.to_path_buf(),
            lock_path,
            _lock: lock,
        },
    ))
}

fn tempdir_in(parent: &Path) -> io::Result<PathBuf> {
    for attempt in 0..100u32 {
        let candidate = parent.join(format!(".capexec-bind-{}-{attempt}", std::process::id()));
        match fs::DirBuilder::new().mode(0o700).create(&candidate) {
            Ok(()) => return Ok(candidate),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(error) => return Err(error),
        }
    }
    Err(io::Error::other(
        "cannot create a private directory to bind in",
    ))
}

/// A Unix socket a server bound for a process of its own to serve (a
/// front that runs as another user): the file goes when this does.
pub struct BoundUnixSocket {
    pub listener: std::os::unix::net::UnixListener,
    _file: UnixSocketFile,
}

/// A bound socket as an upgrade hands it over: the listener's descriptor,
/// the file's path and its lock's descriptor (each to stay open across
/// the exec).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct BoundUnixSocketState {
    pub listener: std::os::fd::RawFd,
    pub path: PathBuf,
    pub lock: std::os::fd::RawFd,
}

impl BoundUnixSocket {
    /// What an upgrade hands over of it (it stays this process's).
    pub fn handover_state(&self) -> BoundUnixSocketState {
        let (path, lock) = self._file.handover_parts();
        BoundUnixSocketState {
            listener: self.listener.as_raw_fd(),
            path,
            lock,
        }
    }

    /// Takes over the socket the binary before handed over as `state`.
    ///
    /// # Safety
    /// Its descriptors must be open, kept across the exec for this
    /// process, and owned by nothing else.
    pub unsafe fn taken_over(state: BoundUnixSocketState) -> BoundUnixSocket {
        use std::os::fd::FromRawFd;
        // SAFETY: as the caller promises; close-on-exec again, so that no
        // child inherits them.
        unsafe {
            libc::fcntl(state.listener, libc::F_SETFD, libc::FD_CLOEXEC);
            libc::fcntl(state.lock, libc::F_SETFD, libc::FD_CLOEXEC);
            BoundUnixSocket {
                listener: std::os::unix::net::UnixListener::from_raw_fd(state.listener),
                _file: UnixSocketFile::taken_over(
                    state.path,
                    std::os::fd::OwnedFd::from_raw_fd(state.lock),
                ),
            }
        }
    }
}

/// Binds `path` as the server binds its own Unix sockets (a socket left
/// by a capexec that died is replaced, anything else refused), then gives
/// it `mode`.
pub fn bind_unix_for_another(path: &Path, mode: u32) -> io::Result<BoundUnixSocket> {
    let (listener, file) = bind_unix_std(path)?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    Ok(BoundUnixSocket {
        listener,
        _file: file,
    })
}
