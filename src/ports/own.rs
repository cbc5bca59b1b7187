//! The sockets this process serves on: a server's Cap'n Proto listeners,
//! its admin socket and its metrics endpoint. No dial ever reaches them.
//! A connection to a server's own Unix socket is greeted as a local
//! client with the unrestricted `Executor` (and on the admin socket with
//! `Admin`), so an executor confined by its rules that could dial its own
//! server would step out of every rule it has; this holds whatever the
//! rules allow, and whatever path names the socket (a symlink, a hard
//! link, `/proc/self/fd/N`): a Unix socket is known by its inode, and a
//! dial connects to the very inode it checked (`dial.rs`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// One socket served on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Endpoint {
    /// A Unix socket's file, by device and inode.
    File { dev: u64, ino: u64 },
    /// A TCP listener's bound address (an unspecified host: every local
    /// address, on that port).
    Tcp(SocketAddr),
}

static SERVED: Mutex<Vec<(u64, Endpoint)>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// A socket registered as served on, until this is dropped.
#[derive(Debug)]
pub struct ServedSocket(u64);

impl Drop for ServedSocket {
    fn drop(&mut self) {
        served().retain(|(id, _)| *id != self.0);
    }
}

fn served() -> std::sync::MutexGuard<'static, Vec<(u64, Endpoint)>> {
    // A panic elsewhere cannot leave the list half-changed.
    SERVED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn register(endpoint: Endpoint) -> ServedSocket {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    served().push((id, endpoint));
    ServedSocket(id)
}

/// Registers the Unix socket file at `path` (following symlinks) as
/// served on.
pub fn serve_unix(path: &Path) -> std::io::Result<ServedSocket> {
    let meta = std::fs::metadata(path)?;
    Ok(register(Endpoint::File {
        dev: meta.dev(),
        ino: meta.ino(),
    }))
}

/// Registers a TCP listener's bound address as served on.
pub fn serve_tcp(bound: SocketAddr) -> ServedSocket {
    register(Endpoint::Tcp(SocketAddr::new(
        bound.ip().to_canonical(),
        bound.port(),
    )))
}

/// Whether the file with this device and inode is a socket served on.
pub(crate) fn is_served_file(dev: u64, ino: u64) -> bool {
    served()
        .iter()
        .any(|(_, endpoint)| *endpoint == Endpoint::File { dev, ino })
}

/// Whether connecting to `target` would reach a TCP listener served on:
/// the same address, or the same port on a listener bound to every
/// address when `target` is an address of this machine.
pub(crate) fn is_served_tcp(target: SocketAddr) -> bool {
    let ip = connected_ip(target.ip());
    let listeners: Vec<SocketAddr> = served()
        .iter()
        .filter_map(|(_, endpoint)| match endpoint {
            Endpoint::Tcp(bound) if bound.port() == target.port() => Some(*bound),
            _ => None,
        })
        .collect();
    listeners.iter().any(|bound| {
        bound.ip() == ip
            || (bound.ip().is_unspecified() && is_local(ip))
            // A dual-stack listener on "::" takes IPv4 too.
            || (bound.ip() == IpAddr::V6(Ipv6Addr::UNSPECIFIED) && is_local(ip))
    })
}

/// The address a connection to `ip` reaches: connecting to the
/// unspecified address reaches this machine's loopback.
fn connected_ip(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        other => other,
    }
}

/// Whether `ip` is an address of this machine: loopback, or one a socket
/// can be bound to.
fn is_local(ip: IpAddr) -> bool {
    ip.is_loopback() || std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_served_tcp_port_is_reached_by_every_local_spelling() {
        let any = serve_tcp("0.0.0.0:47011".parse().expect("address"));
        for reached in [
            "127.0.0.1:47011",
            "127.3.2.1:47011",
            "0.0.0.0:47011",
            "[::ffff:127.0.0.1]:47011",
        ] {
            assert!(is_served_tcp(reached.parse().expect(reached)), "{reached}");
        }
        assert!(!is_served_tcp("127.0.0.1:47012".parse().expect("address")));
        assert!(!is_served_tcp("192.0.2.1:47011".parse().expect("address")));
        drop(any);
        assert!(!is_served_tcp("127.0.0.1:47011".parse().expect("address")));

        let one = serve_tcp("127.0.0.1:47013".parse().expect("address"));
        assert!(is_served_tcp("127.0.0.1:47013".parse().expect("address")));
        assert!(is_served_tcp("0.0.0.0:47013".parse().expect("address")));
        assert!(!is_served_tcp("127.0.0.2:47013".parse().expect("address")));
        drop(one);
    }
}
