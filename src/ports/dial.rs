//! Connecting to an address from this machine, as a rule allows.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio::net::TcpStream;

use crate::model::{Address, PortUse, Refusal, RefusalKind, excerpt, io_message};
use crate::ports::rules::{PortRules, Target};
use crate::sys::Socket;

/// How long a dial may take in all: resolving, and trying each address.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(30);

/// A socket operation's failure, tagged: out of descriptors is a limit,
/// anything else the socket's own failure.
pub fn socket_failure(doing: &str, error: &io::Error) -> Refusal {
    let kind = match error.raw_os_error() {
        Some(libc::EMFILE | libc::ENFILE) => RefusalKind::LimitReached,
        _ => RefusalKind::SocketFailed,
    };
    Refusal::new(kind, format!("{doing}: {}", io_message(error)))
}

/// A TCP address as its rule sees it: a host name resolved to its
/// addresses (in the resolver's order).
pub(crate) async fn targets(address: &Address) -> Result<Vec<Target>, Refusal> {
    match address {
        Address::Tcp { host, port } => {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), *port))
                .await
                .map_err(|error| {
                    socket_failure(&format!("cannot resolve {:?}", excerpt(host)), &error)
                })?
                .collect();
            if found.is_empty() {
                return Err(Refusal::new(
                    RefusalKind::SocketFailed,
                    format!("{:?} resolves to no address", excerpt(host)),
                ));
            }
            Ok(found.into_iter().map(Target::Ip).collect())
        }
        Address::Unix(path) => Ok(vec![Target::Unix(path.clone())]),
    }
}

/// A Unix socket path to listen on with its directory's symlinks resolved
/// (the socket must not exist yet). Where the rules restrict listening, a
/// directory that does not resolve is refused as one outside them is,
/// unless it lies within them.
pub(crate) fn listen_target(
    path: &Path,
    rules: &PortRules,
    asked: &str,
) -> Result<Target, Refusal> {
    let shown = || format!("unix:{}", excerpt(&path.display().to_string()));
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(Refusal::new(
            RefusalKind::InvalidArgument,
            format!("{}: not a path to a socket file", shown()),
        ));
    };
    match std::fs::canonicalize(parent) {
        Ok(parent) => Ok(Target::Unix(parent.join(name))),
        Err(_)
            if rules
                .unix_roots(PortUse::Listen)
                .is_some_and(|roots| !crate::files::within::failure_is_inside(path, roots)) =>
        {
            Err(rules.refusal(PortUse::Listen, asked, &Target::Unix(path.into())))
        }
        Err(error) => Err(socket_failure(&shown(), &error)),
    }
}

/// Connects to `address` (`asked` as the caller wrote it) within
/// [`DIAL_TIMEOUT`]: each of its addresses that `rules` allow, in turn,
/// until one accepts. What was checked is what is connected to, and never
/// a socket this process serves on (see `own.rs`).
pub async fn dial(address: &Address, asked: &str, rules: &PortRules) -> Result<Socket, Refusal> {
    let attempt = async {
        match address {
            Address::Unix(path) => dial_unix(path, asked, rules).await,
            Address::Tcp { .. } => dial_tcp(address, asked, rules).await,
        }
    };
    match tokio::time::timeout(DIAL_TIMEOUT, attempt).await {
        Ok(result) => result,
        Err(_) => Err(Refusal::new(
            RefusalKind::SocketFailed,
            format!(
                "cannot connect to {}: no answer within {}",
                excerpt(asked),
                crate::model::show_duration(DIAL_TIMEOUT)
            ),
        )),
    }
}

async fn dial_tcp(address: &Address, asked: &str, rules: &PortRules) -> Result<Socket, Refusal> {
    let targets = targets(address).await?;
    let mut allowed = Vec::new();
    let mut refusal = None;
    for target in targets {
        let checked = rules
            .check(PortUse::Dial, asked, &target)
            .and_then(|()| refuse_served(asked, &target));
        match checked {
            Ok(()) => allowed.push(target),
            Err(error) => refusal = refusal.or(Some(error)),
        }
    }
    let mut last = None;
    for target in &allowed {
        let Target::Ip(ip) = target else { continue };
        match TcpStream::connect(ip).await.and_then(Socket::tcp) {
            Ok(socket) => return Ok(socket),
            Err(error) => last = Some((target, error)),
        }
    }
    let Some((target, error)) = last else {
        return Err(refusal.unwrap_or_else(|| {
            Refusal::new(RefusalKind::SocketFailed, format!("{asked}: no address"))
        }));
    };
    let doing = if target.to_string() == asked {
        format!("cannot connect to {}", excerpt(asked))
    } else {
        format!("cannot connect to {} ({target})", excerpt(asked))
    };
    Err(socket_failure(&doing, &error))
}

/// Connects to the Unix socket at `path` through a descriptor of its file
/// (`O_PATH`, symlinks followed): the rule checks the path that descriptor
/// has, the served-socket check its inode, and the connection is made to
/// that inode (`/proc/self/fd/N`), so a file swapped in meanwhile is
/// never reached.
async fn dial_unix(path: &Path, asked: &str, rules: &PortRules) -> Result<Socket, Refusal> {
    let shown = || format!("unix:{}", excerpt(&path.display().to_string()));
    let file = match rustix::fs::open(
        path,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) {
        Ok(file) => file,
        Err(errno) => {
            // Outside the rules the answer does not say whether the path
            // exists.
            if let Some(roots) = rules.unix_roots(PortUse::Dial)
                && !crate::files::within::failure_is_inside(path, roots)
            {
                return Err(rules.refusal(PortUse::Dial, asked, &Target::Unix(path.into())));
            }
            return Err(socket_failure(&shown(), &io::Error::from(errno)));
        }
    };
    let resolved = crate::files::path_of(&file)
        .map_err(|errno| socket_failure(&shown(), &io::Error::from(errno)))?;
    let target = Target::Unix(resolved);
    rules.check(PortUse::Dial, asked, &target)?;
    let meta = rustix::fs::fstat(&file)
        .map_err(|errno| socket_failure(&shown(), &io::Error::from(errno)))?;
    if crate::ports::own::is_served_file(meta.st_dev, meta.st_ino) {
        return Err(served_refusal(asked, &target));
    }
    let through = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&file));
    // Refusing descriptors before the connect: the peer is whatever
    // listens there, and what it sends is read plainly, or spliced
    // (`sys::refuse_descriptors`).
    let connecting = tokio::net::UnixSocket::new_stream().inspect(|socket| {
        crate::sys::refuse_descriptors_or_warn(
            std::os::fd::AsFd::as_fd(socket),
            "a dialled Unix socket",
        );
    });
    let connected = match connecting {
        Ok(socket) => socket.connect(&through).await,
        Err(error) => Err(error),
    };
    let stream = connected.map_err(|error| {
        let doing = if target.to_string() == asked {
            format!("cannot connect to {}", excerpt(asked))
        } else {
            format!("cannot connect to {} ({target})", excerpt(asked))
        };
        socket_failure(&doing, &error)
    })?;
    Ok(Socket::Unix(stream))
}

/// Refuses a TCP target that a listener this process serves on would
/// accept.
fn refuse_served(asked: &str, target: &Target) -> Result<(), Refusal> {
    match target {
        Target::Ip(ip) if crate::ports::own::is_served_tcp(*ip) => {
            Err(served_refusal(asked, target))
        }
        _ => Ok(()),
    }
}

fn served_refusal(asked: &str, target: &Target) -> Refusal {
    let resolved = if target.to_string() == asked {
        String::new()
    } else {
        format!(" ({target})")
    };
    Refusal::new(
        RefusalKind::NotAllowed,
        format!(
            "{:?}{resolved} is a socket this server itself serves on; no dial may reach the \
             server it is made through",
            excerpt(asked)
        ),
    )
}
