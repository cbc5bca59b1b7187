//! Whether a TCP peer is a sandboxed process of this machine.
//!
//! A Unix socket names its peer (SO_PEERCRED); a TCP connection does not.
//! A confined command given the network (`--network all`) and a token
//! could otherwise log into a capexec server of the same machine over TCP
//! and start what its sandbox forbids. So a TCP peer from an address of
//! this machine is looked up: the kernel's socket diagnostics
//! (NETLINK_SOCK_DIAG, as `ss` uses) name the peer's socket by its four
//! addresses, with its inode and (Linux 5.9) its cgroup
//! (`INET_DIAG_CGROUP_ID`): the cgroup2 group of the process that made
//! the socket, which the socket keeps whoever holds it later.
//!
//! A server that tracks its processes by cgroup, where a sandboxed process
//! is one in a sandboxed capexec leaf or below one (see
//! [`super::is_sandboxed_process`]), decides by that cgroup, in the one
//! round trip: it knows its own leaves by id, and looks another cgroup up
//! in the hierarchy once (`CgroupRoot::sandboxed_cgroup`). Where the
//! cgroup says nothing (no attribute, a kernel before 5.9; a cgroup gone
//! or out of this server's sight; the hierarchy's root on a kernel that
//! names it for sockets it did not attribute), and on a server without
//! cgroups (which tells sandboxed processes by no_new_privs and a seccomp
//! filter), the processes are looked through instead: a sandboxed process
//! that holds the socket (one of its descriptors is `socket:[inode]`)
//! makes the peer sandboxed.
//!
//! A peer socket already closed (no inode: nothing holds it, but what it
//! sent before may be waiting) or that cannot be looked up (no answer, a
//! malformed one) counts as sandboxed, as for Unix peers; a socket held by
//! no process this server can see (another pid namespace) is nothing
//! capexec sandboxed.
//!
//! # When a socket's maker is not its holder
//!
//! A socket changes hands (passed over a Unix socket, inherited by a
//! child) and keeps its maker's cgroup, so the cgroup and the lookup
//! through processes can differ:
//!
//! - Made in a sandbox, held outside: refused, where the lookup through
//!   processes let it in once no sandboxed process held it. Stricter, and
//!   nothing is lost: the connection is the sandboxed process's, and an
//!   unconfined process makes its own.
//! - Made outside, handed into a sandbox before this server looked it up
//!   (the maker closing its own): let in, where the lookup through
//!   processes refused it. This takes an unconfined process on the
//!   sandbox's side that makes connections for it and hands them in, and
//!   such a process gets the same by handing a connection in after the
//!   lookup (which runs once, at accept, either way) or by carrying the
//!   sandbox's bytes itself; so the lookup through processes only won a
//!   race that process chooses to lose. A sandboxed process alone cannot
//!   make a socket outside its leaf: what it forks stays in the leaf or
//!   below, and it may not write the cgroup files that would move it out
//!   (no writable root of a sandbox holds a kernel file system, and a
//!   cgroup namespace keeps it in where the server can make one); one
//!   that moved out anyway is outside for the lookup through processes
//!   too. The descriptors a start inherits from its server are
//!   close-on-exec.
//! - Made in a sandbox leaf since removed (its processes gone, the socket
//!   held outside): refused if this server had already found that cgroup
//!   (its id names a sandbox leaf for good), else it is not found and the
//!   processes decide, as before.
//!
//! Connections made for a sandbox by a process that holds them itself (a
//! proxy on loopback) are that process's, for either lookup.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::HostConfig;

/// Whether the connection from `peer` to `local` (this server's end) comes
/// from a sandboxed process of this machine, as a server on `host` tells
/// them. Blocking: may walk the cgroup hierarchy or read `/proc`.
pub fn tcp_peer_is_sandboxed(host: &HostConfig, local: SocketAddr, peer: SocketAddr) -> bool {
    let (local, peer) = (unmapped(local), unmapped(peer));
    if !is_this_machine(local.ip(), peer.ip()) {
        return false;
    }
    match peer_socket(peer, local) {
        Ok(Some(socket)) if socket.inode != 0 => {
            if let Ok(root) = super::cgroup_root(host)
                && let Some(cgroup) = socket.cgroup
                && let Some(sandboxed) = root.sandboxed_cgroup(cgroup)
            {
                return sandboxed;
            }
            held_by_a_sandboxed_process(host, socket.inode)
        }
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
/// The attribute of an answer that carries the socket's cgroup id (a u64).
const INET_DIAG_CGROUP_ID: u16 = 21;
/// An attribute type's bits (the others are the nested and byte-order
/// flags).
const NLA_TYPE_MASK: u16 = 0x3fff;
/// The sequence number of the one request.
const SEQUENCE: u32 = 1;

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

/// What the kernel says of a TCP socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PeerSocket {
    /// Its inode; 0 once nothing holds it.
    inode: u32,
    /// The id of the cgroup its maker was in, if the kernel says it.
    cgroup: Option<u64>,
}

/// The TCP socket bound to `source` and connected to `destination`, `None`
/// if there is none.
fn peer_socket(source: SocketAddr, destination: SocketAddr) -> std::io::Result<Option<PeerSocket>> {
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
            nlmsg_seq: SEQUENCE,
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
    // SAFETY: receives into `buffer`, at most its size; MSG_TRUNC makes
    // the result the answer's whole length, to tell a truncated one.
    let received = unsafe {
        libc::recv(
            socket.as_raw_fd(),
            buffer.as_mut_ptr().cast(),
            std::mem::size_of_val(&buffer),
            libc::MSG_TRUNC,
        )
    };
    if received < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let bytes = words_as_bytes(&buffer);
    match bytes.get(..received as usize) {
        Some(answer) => parse_answer(answer),
        None => Err(std::io::Error::other(format!(
            "an answer from sock_diag longer than {} bytes ({received})",
            bytes.len()
        ))),
    }
}

fn malformed(what: &str) -> std::io::Error {
    std::io::Error::other(format!("a malformed answer from sock_diag: {what}"))
}

/// The socket a sock_diag answer (`bytes`, as received) names, `None` if
/// the kernel found none; an error for an error the kernel reports or an
/// answer that is not whole and well formed.
fn parse_answer(bytes: &[u8]) -> std::io::Result<Option<PeerSocket>> {
    let header_size = std::mem::size_of::<libc::nlmsghdr>();
    if bytes.len() < header_size {
        return Err(malformed("shorter than a header"));
    }
    // SAFETY: at least a header's bytes; read unaligned.
    let header: libc::nlmsghdr = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
    let length = header.nlmsg_len as usize;
    if length < header_size || length > bytes.len() {
        return Err(malformed("its length is not what was received"));
    }
    if header.nlmsg_seq != SEQUENCE {
        return Err(malformed("the answer to another request"));
    }
    let body = &bytes[header_size..length];
    match header.nlmsg_type {
        SOCK_DIAG_BY_FAMILY => {
            let size = std::mem::size_of::<InetDiagMsg>();
            if body.len() < size {
                return Err(malformed("shorter than a socket's description"));
            }
            // SAFETY: a whole inet_diag_msg's bytes; read unaligned.
            let message: InetDiagMsg = unsafe { std::ptr::read_unaligned(body.as_ptr().cast()) };
            let cgroup = attribute_u64(&body[align(size)..], INET_DIAG_CGROUP_ID)?;
            Ok(Some(PeerSocket {
                inode: message.inode,
                cgroup,
            }))
        }
        kind if kind == libc::NLMSG_ERROR as u16 => {
            let Some(&[a, b, c, d]) = body.get(..4) else {
                return Err(malformed("an error without its number"));
            };
            match -i32::from_ne_bytes([a, b, c, d]) {
                libc::ENOENT => Ok(None),
                errno if errno > 0 => Err(std::io::Error::from_raw_os_error(errno)),
                errno => Err(malformed(&format!("an error numbered {errno}"))),
            }
        }
        kind => Err(std::io::Error::other(format!(
            "an unexpected answer from sock_diag (type {kind})"
        ))),
    }
}

/// `size` rounded up to netlink's alignment (4 bytes).
fn align(size: usize) -> usize {
    size.div_ceil(4) * 4
}

/// The u64 in the attribute of type `wanted` among the netlink
/// `attributes`, `None` if there is none; an error if they do not fill
/// their bytes exactly, or the attribute is there twice or is not 8 bytes.
fn attribute_u64(attributes: &[u8], wanted: u16) -> std::io::Result<Option<u64>> {
    let mut value = None;
    let mut rest = attributes;
    while !rest.is_empty() {
        let Some(&[l0, l1, t0, t1]) = rest.get(..4) else {
            return Err(malformed("a partial attribute header"));
        };
        let length = usize::from(u16::from_ne_bytes([l0, l1]));
        let kind = u16::from_ne_bytes([t0, t1]) & NLA_TYPE_MASK;
        if length < 4 || length > rest.len() {
            return Err(malformed("an attribute's length overruns the answer"));
        }
        if kind == wanted {
            let Ok(payload) = <[u8; 8]>::try_from(&rest[4..length]) else {
                return Err(malformed(&format!("attribute {kind} is not 8 bytes")));
            };
            if value.replace(u64::from_ne_bytes(payload)).is_some() {
                return Err(malformed(&format!("attribute {kind} twice")));
            }
        }
        rest = rest.get(align(length)..).unwrap_or_default();
    }
    Ok(value)
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
    use std::net::TcpStream;
    use std::os::unix::fs::MetadataExt;

    /// A loopback TCP connection made by this process: its client's and
    /// server's sockets (both open), the client's address as the server
    /// sees it, and the server's address.
    fn loopback_pair() -> (TcpStream, TcpStream, SocketAddr, SocketAddr) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server, peer) = listener.accept().expect("accept");
        let local = server.local_addr().expect("local");
        (client, server, peer, local)
    }

    #[test]
    fn a_connection_of_this_process_is_found_and_not_sandboxed() {
        let (client, _server, peer, local) = loopback_pair();
        let socket = peer_socket(peer, local)
            .expect("sock_diag answers")
            .expect("the client's socket is found");
        let meta = std::fs::metadata(format!("/proc/self/fd/{}", client.as_raw_fd())).expect("fd");
        assert_eq!(u64::from(socket.inode), meta.ino());
        assert!(!tcp_peer_is_sandboxed(&HostConfig::default(), local, peer));
        // Addresses the other way round name no socket.
        assert_eq!(
            peer_socket(SocketAddr::new(peer.ip(), 1), local).expect("answers"),
            None
        );
    }

    #[test]
    fn a_closed_local_peer_counts_as_sandboxed_and_a_remote_one_is_not_looked_up() {
        let (client, _server, peer, local) = loopback_pair();
        drop(client);
        let host = HostConfig::default();
        assert!(tcp_peer_is_sandboxed(&host, local, peer));
        let remote: SocketAddr = "192.0.2.1:40000".parse().expect("addr");
        assert!(!tcp_peer_is_sandboxed(&host, local, remote));
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:1".parse().expect("addr");
        assert_eq!(unmapped(mapped), "127.0.0.1:1".parse().expect("addr"));
    }

    /// The kernel names the cgroup of a socket's maker (Linux 5.9, with
    /// cgroup2 socket data, which CI's kernels have): here, this process's.
    #[test]
    fn a_sockets_cgroup_is_the_directory_of_its_makers_cgroup() {
        let (_client, _server, peer, local) = loopback_pair();
        let socket = peer_socket(peer, local)
            .expect("sock_diag answers")
            .expect("the client's socket is found");
        let cgroup = socket
            .cgroup
            .expect("the kernel names the socket's cgroup (INET_DIAG_CGROUP_ID)");
        let memberships = std::fs::read_to_string("/proc/self/cgroup").expect("memberships");
        let own = memberships
            .lines()
            .find_map(|line| line.strip_prefix("0::"))
            .expect("this process is in a cgroup2 group");
        let mounts = super::super::mounts::mounts();
        let v2 = mounts
            .iter()
            .find(|mount| mount.fstype == "cgroup2")
            .expect("a cgroup2 hierarchy is mounted");
        let dir = super::super::cgroup::inside(v2, own);
        assert_eq!(cgroup, std::fs::metadata(&dir).expect("own cgroup").ino());
    }

    /// The cost of one lookup with 1,000 sandboxed processes running (each
    /// in a leaf of its own, as a server starts them), by the socket's
    /// cgroup and through the processes, and of a walk of the hierarchy
    /// that finds nothing; printed, not asserted:
    /// `cargo test --lib tcp_peer -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement: runs 1,000 processes"]
    fn the_cost_of_a_lookup_among_a_thousand_sandboxed_processes() {
        use std::time::{Duration, Instant};
        let host = HostConfig::default();
        let root = super::super::cgroup_root(&host).expect("cgroups");
        // Cgroups made before the processes' leaves (as a login's usually
        // is), each looked for once below.
        let early = super::super::Leaf::create(root, false, &crate::model::Limits::default())
            .expect("a leaf");
        let early_ids: Vec<u64> = (0..20)
            .map(|n| {
                let dir = format!("/proc/self/fd/{}/early-{n}", early.dir.as_raw_fd());
                std::fs::create_dir(&dir).expect("a cgroup");
                std::fs::metadata(&dir).expect("a cgroup").ino()
            })
            .collect();
        let mut running = Vec::new();
        for _ in 0..1000 {
            let new = super::super::Leaf::create(root, true, &crate::model::Limits::default())
                .expect("a leaf");
            let child = std::process::Command::new("sleep")
                .arg("600")
                .spawn()
                .expect("sleep");
            std::fs::write(
                format!("/proc/self/fd/{}/cgroup.procs", new.dir.as_raw_fd()),
                child.id().to_string(),
            )
            .expect("into the leaf");
            running.push((child, new));
        }
        let (_client, _server, peer, local) = loopback_pair();
        let socket = peer_socket(peer, local).expect("answers").expect("found");
        let each = |times: u32, lookup: &dyn Fn() -> bool| -> Duration {
            let start = Instant::now();
            for _ in 0..times {
                assert!(!lookup());
            }
            start.elapsed() / times
        };
        let scan = each(20, &|| held_by_a_sandboxed_process(&host, socket.inode));
        let by_cgroup = each(1000, &|| tcp_peer_is_sandboxed(&host, local, peer));
        let next = std::cell::Cell::new(0);
        let first = each(20, &|| {
            next.set(next.get() + 1);
            root.sandboxed_cgroup(early_ids[next.get() - 1]) != Some(false)
        });
        let nowhere = each(20, &|| {
            next.set(next.get() + 1);
            root.sandboxed_cgroup(u64::MAX - next.get() as u64)
                .is_some()
        });
        println!(
            "one lookup among 1,000 sandboxed processes: through the processes {scan:?}, by \
             the socket's cgroup {by_cgroup:?}; the first of a cgroup made before them (a walk) \
             {first:?}; of one not there (a walk of everything) {nowhere:?}"
        );
        for (mut child, new) in running {
            let _ = child.kill();
            let _ = child.wait();
            drop(new);
        }
        for n in 0..20 {
            let _ =
                std::fs::remove_dir(format!("/proc/self/fd/{}/early-{n}", early.dir.as_raw_fd()));
        }
    }

    /// An answer as the kernel writes it: a header, a socket's
    /// description with `inode`, then `attributes`.
    fn answer(inode: u32, attributes: &[u8]) -> Vec<u8> {
        let size = 16 + std::mem::size_of::<InetDiagMsg>() + attributes.len();
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&(size as u32).to_ne_bytes());
        bytes.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        bytes.extend_from_slice(&0u16.to_ne_bytes());
        bytes.extend_from_slice(&SEQUENCE.to_ne_bytes());
        bytes.extend_from_slice(&0u32.to_ne_bytes());
        bytes.extend_from_slice(&[0u8; 68]);
        bytes.extend_from_slice(&inode.to_ne_bytes());
        bytes.extend_from_slice(attributes);
        bytes
    }

    fn attribute(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&(4 + payload.len() as u16).to_ne_bytes());
        bytes.extend_from_slice(&kind.to_ne_bytes());
        bytes.extend_from_slice(payload);
        bytes.resize(align(bytes.len()), 0);
        bytes
    }

    fn error_answer(errno: i32) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&36u32.to_ne_bytes());
        bytes.extend_from_slice(&(libc::NLMSG_ERROR as u16).to_ne_bytes());
        bytes.extend_from_slice(&0u16.to_ne_bytes());
        bytes.extend_from_slice(&SEQUENCE.to_ne_bytes());
        bytes.extend_from_slice(&0u32.to_ne_bytes());
        bytes.extend_from_slice(&(-errno).to_ne_bytes());
        bytes.extend_from_slice(&[0u8; 16]);
        bytes
    }

    /// `bytes` cut to `length`, which its header says.
    fn cut(mut bytes: Vec<u8>, length: usize) -> Vec<u8> {
        bytes.truncate(length);
        bytes[..4].copy_from_slice(&(length as u32).to_ne_bytes());
        bytes
    }

    #[test]
    fn answers_are_read_whole_and_bounded() {
        // What this kernel sends (Linux 6.18, as root): shutdown, mark,
        // cgroup id, socket options.
        let cgroup = 3_985_294u64.to_ne_bytes();
        let sent = [
            attribute(8, &[0]),
            attribute(15, &[0; 4]),
            attribute(21, &cgroup),
            attribute(22, &[0x52, 0]),
        ]
        .concat();
        assert_eq!(
            parse_answer(&answer(77, &sent)).expect("parsed"),
            Some(PeerSocket {
                inode: 77,
                cgroup: Some(3_985_294)
            })
        );
        // No attribute (before Linux 5.9): no cgroup; flags bits ignored.
        assert_eq!(
            parse_answer(&answer(5, &[])).expect("parsed"),
            Some(PeerSocket {
                inode: 5,
                cgroup: None
            })
        );
        let flagged = attribute(21 | 0x4000, &cgroup);
        assert_eq!(
            parse_answer(&answer(5, &flagged))
                .expect("parsed")
                .and_then(|s| s.cgroup),
            Some(3_985_294)
        );
        // The last attribute unpadded is whole.
        let unpadded = [attribute(21, &cgroup), attribute(8, &[1])].concat();
        let mut bytes = answer(5, &unpadded[..unpadded.len() - 3]);
        assert_eq!(
            parse_answer(&bytes).expect("parsed").and_then(|s| s.cgroup),
            Some(3_985_294)
        );
        // No socket: none; another error: an error.
        assert_eq!(
            parse_answer(&error_answer(libc::ENOENT)).expect("parsed"),
            None
        );
        assert_eq!(
            parse_answer(&error_answer(libc::EPERM))
                .expect_err("an error")
                .raw_os_error(),
            Some(libc::EPERM)
        );
        // Malformed: each is an error.
        let twice = [attribute(21, &cgroup), attribute(21, &cgroup)].concat();
        let short_id = attribute(21, &[1, 2, 3, 4]);
        let overrun = {
            let mut attr = attribute(21, &cgroup);
            attr[0] = 200;
            attr
        };
        let undersized = {
            let mut attr = attribute(8, &[0]);
            attr[0] = 3;
            attr
        };
        let partial_header = [attribute(8, &[0]), vec![8, 0]].concat();
        for (what, bytes) in [
            ("twice", answer(5, &twice)),
            ("short id", answer(5, &short_id)),
            ("overrun", answer(5, &overrun)),
            ("undersized", answer(5, &undersized)),
            ("partial header", answer(5, &partial_header)),
            ("no header", vec![0; 8]),
            ("short description", cut(answer(5, &[]), 60)),
            ("no error number", cut(error_answer(libc::ENOENT), 18)),
            ("error zero", error_answer(0)),
        ] {
            assert!(parse_answer(&bytes).is_err(), "{what}");
        }
        // A length beyond what was received, or another request's answer.
        bytes = answer(5, &[]);
        bytes[0] = 200;
        assert!(parse_answer(&bytes).is_err());
        bytes = answer(5, &[]);
        bytes[8] = 2;
        assert!(parse_answer(&bytes).is_err());
    }
}
