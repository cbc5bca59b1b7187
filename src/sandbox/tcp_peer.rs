//! Whether a TCP peer is a sandboxed process of this machine.
//!
//! A Unix socket names its peer (SO_PEERCRED); a TCP connection does not.
//! A confined command given the network (`--network all`) and a token
//! could otherwise log into a capexec server of the same machine over TCP
//! and start what its sandbox forbids. So a TCP peer from an address of
//! this machine is looked up: the kernel's socket diagnostics
//! (NETLINK_SOCK_DIAG, as `ss` uses) name the peer's socket by its four
//! addresses and give its inode, and a sandboxed process (see
//! [`super::is_sandboxed_process`]) that holds that socket makes the peer
//! sandboxed. A peer socket already closed (no inode: nothing holds it,
//! but what it sent before may be waiting) or that cannot be looked up
//! counts as sandboxed, as for Unix peers; a socket held by no process
//! this server can see (another pid namespace) is nothing capexec
//! sandboxed.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::HostConfig;

/// Whether the connection from `peer` to `local` (this server's end) comes
/// from a sandboxed process of this machine, as a server on `host` tells
/// them. Blocking: reads `/proc`.
pub fn tcp_peer_is_sandboxed(host: &HostConfig, local: SocketAddr, peer: SocketAddr) -> bool {
    let (local, peer) = (unmapped(local), unmapped(peer));
    if !is_this_machine(local.ip(), peer.ip()) {
        return false;
    }
    match peer_socket_inode(peer, local) {
        Ok(Some(inode)) if inode != 0 => held_by_a_sandboxed_process(host, inode),
        Ok(_) => true,
        Err(error) => {
            tracing::warn!(%error, %peer, "cannot look up a local TCP peer's socket: refused");
            true
        }
    }
}

/// An IPv4 address a dual-stack listener sees as `::ffff:a.b.c.d`: the
/// peer's socket is an IPv4 one.
fn unmapped(address: SocketAddr) -> SocketAddr {
    match address.ip() {
        IpAddr::V6(ip) => match ip.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), address.port()),
            None => address,
        },
        IpAddr::V4(_) => address,
    }
}

/// Whether `peer` is an address of this machine: loopback, the address
/// the connection reached, or one of its interfaces'.
fn is_this_machine(local: IpAddr, peer: IpAddr) -> bool {
    peer.is_loopback() || peer == local || interface_addresses().contains(&peer)
}

fn interface_addresses() -> Vec<IpAddr> {
    let mut addresses = Vec::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs allocates the list it returns, freed below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return addresses;
    }
    let mut entry = list;
    while !entry.is_null() {
        // SAFETY: a node of the list getifaddrs returned, not freed yet.
        let node = unsafe { &*entry };
        if !node.ifa_addr.is_null() {
            // SAFETY: ifa_addr points to a sockaddr of the family it says.
            match i32::from(unsafe { (*node.ifa_addr).sa_family }) {
                libc::AF_INET => {
                    // SAFETY: an AF_INET address is a sockaddr_in.
                    let address = unsafe { &*node.ifa_addr.cast::<libc::sockaddr_in>() };
                    addresses.push(IpAddr::from(address.sin_addr.s_addr.to_ne_bytes()));
                }
                libc::AF_INET6 => {
                    // SAFETY: an AF_INET6 address is a sockaddr_in6.
                    let address = unsafe { &*node.ifa_addr.cast::<libc::sockaddr_in6>() };
                    addresses.push(IpAddr::from(address.sin6_addr.s6_addr));
                }
                _ => {}
            }
        }
        entry = node.ifa_next;
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(list) };
    addresses
}

const NETLINK_SOCK_DIAG: libc::c_int = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const INET_DIAG_NOCOOKIE: u32 = !0;

/// `struct inet_diag_sockid` (<linux/inet_diag.h>): ports and addresses
/// in network order.
#[repr(C)]
#[derive(Clone, Copy)]
struct InetDiagSockId {
    sport: [u8; 2],
    dport: [u8; 2],
    src: [u8; 16],
    dst: [u8; 16],
    interface: u32,
    cookie: [u32; 2],
}

/// `struct inet_diag_req_v2`.
#[repr(C)]
struct InetDiagReqV2 {
    family: u8,
    protocol: u8,
    ext: u8,
    pad: u8,
    states: u32,
    id: InetDiagSockId,
}

/// A netlink header and the request, as sent.
#[repr(C)]
struct Request {
    header: libc::nlmsghdr,
    request: InetDiagReqV2,
}

/// The start of `struct inet_diag_msg`, up to its inode.
#[repr(C)]
#[derive(Clone, Copy)]
struct InetDiagMsg {
    family: u8,
    state: u8,
    timer: u8,
    retrans: u8,
    id: InetDiagSockId,
    expires: u32,
    rqueue: u32,
    wqueue: u32,
    uid: u32,
    inode: u32,
}

fn address_bytes(ip: IpAddr) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    match ip {
        IpAddr::V4(ip) => bytes[..4].copy_from_slice(&ip.octets()),
        IpAddr::V6(ip) => bytes = ip.octets(),
    }
    bytes
}

/// The inode of the TCP socket bound to `source` and connected to
/// `destination` (0 once nothing holds it), `None` if there is none.
fn peer_socket_inode(source: SocketAddr, destination: SocketAddr) -> std::io::Result<Option<u32>> {
    // SAFETY: socket(2) with constant arguments; the result is checked.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            NETLINK_SOCK_DIAG,
        )
    };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor socket(2) just returned, owned from here.
    let socket = unsafe { OwnedFd::from_raw_fd(raw) };
    let family = match source.ip() {
        IpAddr::V4(_) => libc::AF_INET,
        IpAddr::V6(_) => libc::AF_INET6,
    };
    let request = Request {
        header: libc::nlmsghdr {
            nlmsg_len: std::mem::size_of::<Request>() as u32,
            nlmsg_type: SOCK_DIAG_BY_FAMILY,
            nlmsg_flags: libc::NLM_F_REQUEST as u16,
            nlmsg_seq: 1,
            nlmsg_pid: 0,
        },
        request: InetDiagReqV2 {
            family: family as u8,
            protocol: libc::IPPROTO_TCP as u8,
            ext: 0,
            pad: 0,
            states: !0,
            id: InetDiagSockId {
                sport: source.port().to_be_bytes(),
                dport: destination.port().to_be_bytes(),
                src: address_bytes(source.ip()),
                dst: address_bytes(destination.ip()),
                interface: 0,
                cookie: [INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE],
            },
        },
    };
    // SAFETY: sends the bytes of `request`, which outlives the call.
    let sent = unsafe {
        libc::send(
            socket.as_raw_fd(),
            (&request as *const Request).cast(),
            std::mem::size_of::<Request>(),
            0,
        )
    };
    if sent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut buffer = [0u64; 1024];
    // SAFETY: receives into `buffer`, at most its size.
    let received = unsafe {
        libc::recv(
            socket.as_raw_fd(),
            buffer.as_mut_ptr().cast(),
            std::mem::size_of_val(&buffer),
            0,
        )
    };
    if received < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let bytes: &[u8] = &words_as_bytes(&buffer)[..received as usize];
    let header_size = std::mem::size_of::<libc::nlmsghdr>();
    if bytes.len() < header_size {
        return Err(std::io::Error::other("a short answer from sock_diag"));
    }
    // SAFETY: at least a header's bytes; read unaligned.
    let header: libc::nlmsghdr = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
    let body = &bytes[header_size..];
    match header.nlmsg_type {
        SOCK_DIAG_BY_FAMILY if body.len() >= std::mem::size_of::<InetDiagMsg>() => {
            // SAFETY: a whole inet_diag_msg's bytes; read unaligned.
            let message: InetDiagMsg = unsafe { std::ptr::read_unaligned(body.as_ptr().cast()) };
            Ok(Some(message.inode))
        }
        kind if kind == libc::NLMSG_ERROR as u16 && body.len() >= 4 => {
            let errno = -i32::from_ne_bytes([body[0], body[1], body[2], body[3]]);
            if errno == libc::ENOENT {
                Ok(None)
            } else {
                Err(std::io::Error::from_raw_os_error(errno))
            }
        }
        kind => Err(std::io::Error::other(format!(
            "an unexpected answer from sock_diag (type {kind})"
        ))),
    }
}

/// The bytes of a buffer of words (aligned for the headers read from it).
fn words_as_bytes(words: &[u64]) -> &[u8] {
    // SAFETY: any u64 is 8 initialised bytes; the length is in bytes.
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast(), std::mem::size_of_val(words)) }
}

/// Whether a sandboxed process holds the socket `inode` (one of its open
/// descriptors is `socket:[inode]`).
fn held_by_a_sandboxed_process(host: &HostConfig, inode: u32) -> bool {
    let wanted = format!("socket:[{inode}]");
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return true;
    };
    for process in processes.flatten() {
        let name = process.file_name();
        let Some(pid) = name.to_str().and_then(|name| name.parse::<i32>().ok()) else {
            continue;
        };
        if !super::is_sandboxed_process(host, pid) {
            continue;
        }
        let Ok(descriptors) = std::fs::read_dir(process.path().join("fd")) else {
            continue;
        };
        let holds = descriptors.flatten().any(|descriptor| {
            std::fs::read_link(descriptor.path())
                .is_ok_and(|target| target.as_os_str() == wanted.as_str())
        });
        if holds {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_of_this_process_is_found_and_not_sandboxed() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let client =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server, peer) = listener.accept().expect("accept");
        let local = server.local_addr().expect("local");
        let inode = peer_socket_inode(peer, local)
            .expect("sock_diag answers")
            .expect("the client's socket is found");
        let meta = std::fs::metadata(format!("/proc/self/fd/{}", client.as_raw_fd())).expect("fd");
        assert_eq!(u64::from(inode), std::os::unix::fs::MetadataExt::ino(&meta));
        assert!(!tcp_peer_is_sandboxed(&HostConfig::default(), local, peer));
        // Addresses the other way round name no socket.
        assert_eq!(
            peer_socket_inode(SocketAddr::new(peer.ip(), 1), local).expect("answers"),
            None
        );
    }

    #[test]
    fn a_closed_local_peer_counts_as_sandboxed_and_a_remote_one_is_not_looked_up() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let client =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server, peer) = listener.accept().expect("accept");
        drop(client);
        let local = server.local_addr().expect("local");
        let host = HostConfig::default();
        assert!(tcp_peer_is_sandboxed(&host, local, peer));
        let remote: SocketAddr = "192.0.2.1:40000".parse().expect("addr");
        assert!(!tcp_peer_is_sandboxed(&host, local, remote));
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:1".parse().expect("addr");
        assert_eq!(unmapped(mapped), "127.0.0.1:1".parse().expect("addr"));
    }
}
