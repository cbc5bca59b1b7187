//! Running under a service manager: sockets passed by socket activation
//! (`LISTEN_FDS`, `LISTEN_PID`, `LISTEN_FDNAMES`, as systemd and
//! `systemd-socket-activate` pass them) and readiness reported over
//! `NOTIFY_SOCKET` (`READY=1`, `RELOADING=1`, `STOPPING=1`). Both are the
//! documented protocols (sd_listen_fds(3), sd_notify(3)); a datagram and a
//! few environment variables need no library.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use crate::sys::low_slots::KeepsItsSlot;

/// The first passed descriptor (`SD_LISTEN_FDS_START`).
const FIRST_FD: i32 = 3;

/// A listening socket passed by the service manager, with the name its
/// socket unit gave it (`FileDescriptorName=`; "admin" makes it the admin
/// socket).
#[derive(Clone, Debug)]
pub struct InheritedSocket {
    /// Closed through `sys::low_slots` once copied (it may sit below 64).
    pub fd: Arc<KeepsItsSlot>,
    pub name: String,
    /// The path a Unix socket is known by, when its own address does not
    /// say it (one bound under a temporary name, then renamed: an
    /// upgrade's hand-over); `None`: its address.
    pub path: Option<std::path::PathBuf>,
}

/// The sockets passed to this process, if any; the variables are removed
/// so that no child sees them, and the descriptors are closed on exec.
///
/// # Safety
///
/// Must be called while the process has one thread (it changes the
/// environment), and at most once (it takes ownership of descriptors 3
/// onwards).
pub unsafe fn take_listen_fds() -> Result<Vec<InheritedSocket>, String> {
    let fds = std::env::var("LISTEN_FDS").ok();
    let pid = std::env::var("LISTEN_PID").ok();
    let names = std::env::var("LISTEN_FDNAMES").ok();
    // SAFETY: single-threaded, as the caller promises.
    unsafe {
        std::env::remove_var("LISTEN_FDS");
        std::env::remove_var("LISTEN_PID");
        std::env::remove_var("LISTEN_FDNAMES");
    }
    let Some(fds) = fds else {
        return Ok(Vec::new());
    };
    // Meant for another process (a parent that did not clear them).
    if pid.and_then(|pid| pid.parse::<u32>().ok()) != Some(std::process::id()) {
        return Ok(Vec::new());
    }
    let count: i32 = fds
        .parse()
        .ok()
        .filter(|count| (0..=4096).contains(count))
        .ok_or_else(|| format!("LISTEN_FDS={fds:?} is not a number of descriptors"))?;
    let names: Vec<String> = names
        .map(|names| names.split(':').map(str::to_string).collect())
        .unwrap_or_default();
    let mut sockets = Vec::new();
    for index in 0..count {
        let raw = FIRST_FD + index;
        // SAFETY: F_SETFD on a descriptor the manager passed us.
        if unsafe { libc::fcntl(raw, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
            return Err(format!(
                "LISTEN_FDS={count}, but descriptor {raw} is not open: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: passed to us and open (checked above); owned from now.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let name = names
            .get(index as usize)
            .cloned()
            .unwrap_or_else(|| "unknown".to_string());
        sockets.push(InheritedSocket {
            fd: Arc::new(KeepsItsSlot::new(fd)),
            name,
            path: None,
        });
    }
    Ok(sockets)
}

/// What an inherited descriptor is, checked before it is used.
pub(crate) enum Listening {
    Unix(std::os::unix::net::UnixListener),
    Tcp(std::net::TcpListener),
}

impl InheritedSocket {
    /// The socket as a listener of its kind (a copy of the descriptor).
    pub(crate) fn listener(&self) -> std::io::Result<Listening> {
        use nix::sys::socket::{
            AddressFamily, SockaddrLike, SockaddrStorage, getsockname, sockopt,
        };
        let raw = self.fd.as_raw_fd();
        let invalid = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, why);
        let listening =
            nix::sys::socket::getsockopt(&*self.fd, sockopt::AcceptConn).map_err(|error| {
                invalid(format!(
                    "descriptor {raw} is not a socket ({})",
                    crate::model::io_message(&std::io::Error::from(error))
                ))
            })?;
        if !listening {
            return Err(invalid(format!(
                "descriptor {raw} ({}) is not a listening socket: use ListenStream= in the \
                 socket unit, without Accept=yes",
                self.name
            )));
        }
        let family = getsockname::<SockaddrStorage>(raw)
            .map_err(std::io::Error::from)?
            .family();
        let fd = self.fd.try_clone()?;
        match family {
            Some(AddressFamily::Unix) => {
                let listener = std::os::unix::net::UnixListener::from(fd);
                listener.set_nonblocking(true)?;
                Ok(Listening::Unix(listener))
            }
            Some(AddressFamily::Inet | AddressFamily::Inet6) => {
                let listener = std::net::TcpListener::from(fd);
                listener.set_nonblocking(true)?;
                Ok(Listening::Tcp(listener))
            }
            other => Err(invalid(format!(
                "descriptor {raw} ({}) is a {other:?} socket; capexec serves Unix and TCP \
                 sockets",
                self.name
            ))),
        }
    }
}

/// Where to notify the service manager, taken from the environment once.
static NOTIFY_SOCKET: std::sync::OnceLock<Option<std::ffi::OsString>> = std::sync::OnceLock::new();

/// Takes `NOTIFY_SOCKET` out of the environment (so that no child can
/// speak for the service), for [`notify`].
///
/// # Safety
///
/// Must be called while the process has one thread (it changes the
/// environment).
pub unsafe fn take_notify_socket() {
    let target = std::env::var_os("NOTIFY_SOCKET");
    // SAFETY: single-threaded, as the caller promises.
    unsafe { std::env::remove_var("NOTIFY_SOCKET") };
    let _ = NOTIFY_SOCKET.set(target);
}

/// Tells the service manager `state` (`READY=1`, `STOPPING=1`...), if it
/// asked to be told (`NOTIFY_SOCKET`, see [`take_notify_socket`]);
/// failures are logged, never fatal.
pub fn notify(state: &str) {
    let Some(Some(target)) = NOTIFY_SOCKET.get() else {
        return;
    };
    if let Err(error) = send(target, state) {
        tracing::warn!(%error, socket = ?target, "cannot notify the service manager");
    }
}

fn send(target: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let bytes = target.as_bytes();
    let address = match bytes.strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name)?,
        None => SocketAddr::from_pathname(std::path::Path::new(target))?,
    };
    let socket = UnixDatagram::unbound()?;
    socket.send_to_addr(state.as_bytes(), &address)?;
    Ok(())
}

/// `RELOADING=1` with the monotonic time systemd's notify-reload wants.
pub fn reloading_state() -> String {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|now| now.tv_sec() as u64 * 1_000_000 + now.tv_nsec() as u64 / 1000)
        .unwrap_or(0);
    format!("RELOADING=1\nMONOTONIC_USEC={now}")
}
