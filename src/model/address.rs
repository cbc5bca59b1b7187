//! Addresses of sockets: `unix:PATH` or `tcp:HOST:PORT`, as servers listen
//! on them, clients connect to them, and ports are dialled and listened on
//! through an executor.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    Unix(PathBuf),
    /// `host` is a name or an IP address (an IPv6 address without brackets).
    Tcp {
        host: String,
        port: u16,
    },
}

impl Address {
    pub fn from_socket_addr(addr: SocketAddr) -> Address {
        Address::Tcp {
            host: addr.ip().to_string(),
            port: addr.port(),
        }
    }

    pub fn is_tcp(&self) -> bool {
        matches!(self, Address::Tcp { .. })
    }
}

impl FromStr for Address {
    type Err = String;

    fn from_str(text: &str) -> Result<Address, String> {
        if let Some(path) = text.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(format!("{text:?}: unix: needs a socket path"));
            }
            return Ok(Address::Unix(PathBuf::from(path)));
        }
        if let Some(rest) = text.strip_prefix("tcp:") {
            let (host, port) = rest
                .rsplit_once(':')
                .ok_or_else(|| format!("{text:?}: expected tcp:HOST:PORT"))?;
            let port = port
                .parse::<u16>()
                .map_err(|_| format!("{text:?}: {port:?} is not a port number"))?;
            let host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
                Some(inside) => inside,
                // Unbracketed, "::1:80" could be ::1 port 80 or ::1:80
                // with no port: which one is never guessed.
                None if host.contains(':') => {
                    return Err(format!(
                        "{text:?}: an IPv6 address goes in brackets (tcp:[::1]:80)"
                    ));
                }
                None => host,
            };
            if host.is_empty() {
                return Err(format!("{text:?}: expected tcp:HOST:PORT"));
            }
            return Ok(Address::Tcp {
                host: host.to_string(),
                port,
            });
        }
        Err(format!(
            "{text:?}: an address is unix:PATH or tcp:HOST:PORT"
        ))
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Unix(path) => write!(f, "unix:{}", path.display()),
            Address::Tcp { host, port } if host.contains(':') => write!(f, "tcp:[{host}]:{port}"),
            Address::Tcp { host, port } => write!(f, "tcp:{host}:{port}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_both_kinds() {
        for text in [
            "unix:/run/capexec.sock",
            "tcp:127.0.0.1:0",
            "tcp:[::1]:4000",
            "tcp:build-box:22",
        ] {
            let address: Address = text.parse().expect(text);
            assert_eq!(address.to_string(), text);
        }
        assert_eq!(
            "tcp:[::1]:7".parse::<Address>(),
            Ok(Address::Tcp {
                host: "::1".into(),
                port: 7
            })
        );
        for bad in [
            "unix:",
            "tcp:host",
            "tcp::80",
            "tcp:host:http",
            "tcp:host:70000",
            "tcp:::1:80",
            "tcp:[::1:80",
            "tcp:fe80::1:22",
            "/tmp/sock",
        ] {
            assert!(bad.parse::<Address>().is_err(), "{bad}");
        }
    }
}
