//! Connecting to an address from this machine, as a rule allows.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::{TcpStream, UnixStream};

use crate::model::{Address, PortUse, Refusal, RefusalKind, excerpt, io_message};
use crate::ports::rules::{PortRules, Target};
use crate::ports::socket::Socket;

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

/// `address` as its rule sees it: a host name resolved to its addresses
/// (in the resolver's order), a Unix path with its symlinks resolved.
pub(crate) async fn targets(address: &Address, use_: PortUse) -> Result<Vec<Target>, Refusal> {
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
        Address::Unix(path) => Ok(vec![Target::Unix(unix_target(path, use_)?)]),
    }
}

/// A Unix socket path with symlinks resolved: the whole path for a dial
/// (the socket must exist), the directory for a listen (it must not).
fn unix_target(path: &Path, use_: PortUse) -> Result<PathBuf, Refusal> {
    let shown = || format!("unix:{}", excerpt(&path.display().to_string()));
    let failure = |error: io::Error| socket_failure(&shown(), &error);
    match use_ {
        PortUse::Dial => std::fs::canonicalize(path).map_err(failure),
        PortUse::Listen => {
            let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
                return Err(Refusal::new(
                    RefusalKind::InvalidArgument,
                    format!("{}: not a path to a socket file", shown()),
                ));
            };
            Ok(std::fs::canonicalize(parent).map_err(failure)?.join(name))
        }
    }
}

/// Connects to `address` (`asked` as the caller wrote it) within
/// [`DIAL_TIMEOUT`]: each of its addresses that `rules` allow, in turn,
/// until one accepts. What was checked is what is connected to.
pub async fn dial(address: &Address, asked: &str, rules: &PortRules) -> Result<Socket, Refusal> {
    let attempt = async {
        let targets = targets(address, PortUse::Dial).await?;
        let mut allowed = Vec::new();
        let mut refusal = None;
        for target in targets {
            match rules.check(PortUse::Dial, asked, &target) {
                Ok(()) => allowed.push(target),
                Err(error) => refusal = refusal.or(Some(error)),
            }
        }
        if allowed.is_empty() {
            return Err(refusal.unwrap_or_else(|| {
                Refusal::new(RefusalKind::SocketFailed, format!("{asked}: no address"))
            }));
        }
        let mut last = None;
        for target in &allowed {
            match connect(target).await {
                Ok(socket) => return Ok(socket),
                Err(error) => last = Some((target, error)),
            }
        }
        let (target, error) = last.expect("an address was tried");
        let doing = if target.to_string() == asked {
            format!("cannot connect to {}", excerpt(asked))
        } else {
            format!("cannot connect to {} ({target})", excerpt(asked))
        };
        Err(socket_failure(&doing, &error))
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

async fn connect(target: &Target) -> io::Result<Socket> {
    match target {
        Target::Ip(address) => Socket::tcp(TcpStream::connect(address).await?),
        Target::Unix(path) => Ok(Socket::Unix(UnixStream::connect(path).await?)),
    }
}
