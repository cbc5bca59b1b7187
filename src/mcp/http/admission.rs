//! Who may talk to `capexec mcp --listen`: the checks made on every HTTP
//! request before rmcp sees it, in this order:
//!
//! 1. **`Host`** (DNS rebinding): it must name the listening address with
//!    its port; on a loopback listener `localhost`, `127.0.0.1` and `[::1]`
//!    with the port too; on an unspecified one (`0.0.0.0`, `[::]`) any IP
//!    literal with the port (a rebinding attack needs a name). Else 403.
//! 2. **`Origin`**, when present (a browser sent it): on a loopback
//!    listener a loopback origin (`http(s)://localhost|127.0.0.1|[::1]`,
//!    any port); elsewhere only the listener's own origin. Else 403.
//! 3. **The bearer token**, when the listener has one (required off
//!    loopback): `Authorization: Bearer TOKEN`, compared in constant time
//!    (`Token::matches`). Else 401 with `WWW-Authenticate: Bearer`.
//! 4. **The path** of the URL listened on. Else 404.

use std::net::{IpAddr, SocketAddr};

use crate::net::Token;

/// The address and path `capexec mcp --listen http://HOST:PORT/PATH` asked
/// for (HOST an IP address or `localhost`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenUrl {
    pub address: SocketAddr,
    pub path: String,
}

/// Parses `http://HOST:PORT/PATH` (`localhost` is 127.0.0.1; the path is
/// required, `/mcp` by convention).
pub fn parse_listen_url(url: &str) -> Result<ListenUrl, String> {
    let expected = || {
        format!("--listen {url:?}: expected http://IP:PORT/PATH, such as http://127.0.0.1:0/mcp")
    };
    let rest = url.strip_prefix("http://").ok_or_else(expected)?;
    let (authority, path) = match rest.find('/') {
        Some(slash) => (&rest[..slash], &rest[slash..]),
        None => return Err(expected()),
    };
    if path.contains(['?', '#']) || path.chars().any(char::is_whitespace) {
        return Err(expected());
    }
    let authority = match authority.strip_prefix("localhost:") {
        Some(port) => format!("127.0.0.1:{port}"),
        None => authority.to_string(),
    };
    let address = authority.parse().map_err(|_| expected())?;
    Ok(ListenUrl {
        address,
        path: path.to_string(),
    })
}

/// The URL as printed once bound: the port resolved, IPv6 in brackets.
pub fn shown_url(address: SocketAddr, path: &str) -> String {
    format!("http://{address}{path}")
}

/// The verdict on one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Admit,
    Refuse { status: u16, reason: &'static str },
}

/// The checks of one listener.
pub struct Admission {
    address: SocketAddr,
    path: String,
    token: Option<Token>,
}

impl Admission {
    /// For the listener bound at `address` (its port resolved).
    pub fn new(address: SocketAddr, path: String, token: Option<Token>) -> Admission {
        Admission {
            address,
            path,
            token,
        }
    }

    /// Judges a request by its path and headers (`header(name)` gives a
    /// header's value, names lower-case).
    pub fn judge<'a>(&self, path: &str, header: impl Fn(&str) -> Option<&'a [u8]>) -> Verdict {
        let text = |name: &str| header(name).and_then(|value| std::str::from_utf8(value).ok());
        if !text("host").is_some_and(|host| self.host_allowed(host)) {
            return Verdict::Refuse {
                status: 403,
                reason: "capexec: mcp: the Host header does not name this listener \
                         (DNS rebinding protection)",
            };
        }
        if let Some(origin) = header("origin")
            && !std::str::from_utf8(origin).is_ok_and(|origin| self.origin_allowed(origin))
        {
            return Verdict::Refuse {
                status: 403,
                reason: "capexec: mcp: requests from this Origin are refused",
            };
        }
        if let Some(token) = &self.token {
            let presented = text("authorization").and_then(|value| {
                let (scheme, credential) = value.trim().split_once(' ')?;
                scheme
                    .eq_ignore_ascii_case("bearer")
                    .then(|| credential.trim())
            });
            match presented {
                None => {
                    return Verdict::Refuse {
                        status: 401,
                        reason: "capexec: mcp: a bearer token is required",
                    };
                }
                Some(candidate) if !token.matches(candidate) => {
                    return Verdict::Refuse {
                        status: 401,
                        reason: "capexec: mcp: invalid bearer token",
                    };
                }
                Some(_) => {}
            }
        }
        if path != self.path {
            return Verdict::Refuse {
                status: 404,
                reason: "capexec: mcp: no such path",
            };
        }
        Verdict::Admit
    }

    fn host_allowed(&self, host: &str) -> bool {
        let Some((name, port)) = split_authority(host) else {
            return false;
        };
        if port != Some(self.address.port()) {
            return false;
        }
        let listening = self.address.ip();
        if listening.is_loopback() && name.eq_ignore_ascii_case("localhost") {
            return true;
        }
        let Ok(ip) = name.parse::<IpAddr>() else {
            return false;
        };
        ip == listening
            || (listening.is_loopback() && ip.is_loopback())
            || listening.is_unspecified()
    }

    fn origin_allowed(&self, origin: &str) -> bool {
        let Some((scheme, authority)) = origin.trim().split_once("://") else {
            return false;
        };
        let scheme = scheme.to_ascii_lowercase();
        if scheme != "http" && scheme != "https" {
            return false;
        }
        let Some((name, port)) = split_authority(authority) else {
            return false;
        };
        let listening = self.address.ip();
        if listening.is_loopback() {
            return name.eq_ignore_ascii_case("localhost")
                || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
        }
        // Off loopback: only the listener's own origin.
        scheme == "http"
            && port == Some(self.address.port())
            && name.parse::<IpAddr>().is_ok_and(|ip| ip == listening)
    }
}

/// `NAME[:PORT]` or `[V6][:PORT]`: the name (brackets removed) and port.
fn split_authority(authority: &str) -> Option<(&str, Option<u16>)> {
    let authority = authority.trim();
    if let Some(rest) = authority.strip_prefix('[') {
        let (name, after) = rest.split_once(']')?;
        return match after {
            "" => Some((name, None)),
            port => Some((name, Some(port.strip_prefix(':')?.parse().ok()?))),
        };
    }
    match authority.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') => Some((name, Some(port.parse().ok()?))),
        Some(_) => None,
        None => Some((authority, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "s3cret-token-of-the-listener-0123456789";

    fn judge(admission: &Admission, path: &str, headers: &[(&str, &str)]) -> Verdict {
        admission.judge(path, |name| {
            headers
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.as_bytes())
        })
    }

    fn status(verdict: Verdict) -> u16 {
        match verdict {
            Verdict::Admit => 200,
            Verdict::Refuse { status, .. } => status,
        }
    }

    #[test]
    fn a_loopback_listener_takes_loopback_hosts_and_origins_with_its_port() {
        let admission = Admission::new("127.0.0.1:4100".parse().unwrap(), "/mcp".into(), None);
        for host in [
            "127.0.0.1:4100",
            "localhost:4100",
            "LOCALHOST:4100",
            "[::1]:4100",
        ] {
            assert_eq!(
                judge(&admission, "/mcp", &[("host", host)]),
                Verdict::Admit,
                "{host}"
            );
        }
        for host in [
            "127.0.0.1",
            "localhost",
            "127.0.0.1:4101",
            "evil.example.com:4100",
            "evil.example.com",
            "10.0.0.1:4100",
            "",
        ] {
            assert_eq!(
                status(judge(&admission, "/mcp", &[("host", host)])),
                403,
                "{host}"
            );
        }
        assert_eq!(status(judge(&admission, "/mcp", &[])), 403);
        let host = ("host", "127.0.0.1:4100");
        for origin in [
            "http://127.0.0.1:4100",
            "http://localhost:3000",
            "https://[::1]",
        ] {
            assert_eq!(
                judge(&admission, "/mcp", &[host, ("origin", origin)]),
                Verdict::Admit,
                "{origin}"
            );
        }
        for origin in [
            "http://evil.example.com",
            "null",
            "file://",
            "http://10.0.0.1:4100",
        ] {
            assert_eq!(
                status(judge(&admission, "/mcp", &[host, ("origin", origin)])),
                403,
                "{origin}"
            );
        }
        assert_eq!(status(judge(&admission, "/other", &[host])), 404);
    }

    #[test]
    fn a_token_is_checked_after_host_and_origin() {
        let admission = Admission::new(
            "10.1.2.3:80".parse().unwrap(),
            "/mcp".into(),
            Some(Token::new(TOKEN)),
        );
        let host = ("host", "10.1.2.3:80");
        let bearer = format!("Bearer {TOKEN}");
        assert_eq!(
            judge(&admission, "/mcp", &[host, ("authorization", &bearer)]),
            Verdict::Admit
        );
        assert_eq!(status(judge(&admission, "/mcp", &[host])), 401);
        assert_eq!(
            status(judge(
                &admission,
                "/mcp",
                &[host, ("authorization", "Bearer wrong")]
            )),
            401
        );
        assert_eq!(
            status(judge(
                &admission,
                "/mcp",
                &[host, ("authorization", &format!("Basic {TOKEN}"))]
            )),
            401
        );
        // A rebinding host is refused before its token is looked at.
        assert_eq!(
            status(judge(
                &admission,
                "/mcp",
                &[("host", "evil.example.com:80"), ("authorization", &bearer)]
            )),
            403
        );
        // Off loopback only the listener's own origin.
        assert_eq!(
            judge(
                &admission,
                "/mcp",
                &[
                    host,
                    ("origin", "http://10.1.2.3:80"),
                    ("authorization", &bearer)
                ]
            ),
            Verdict::Admit
        );
        assert_eq!(
            status(judge(
                &admission,
                "/mcp",
                &[
                    host,
                    ("origin", "http://localhost:80"),
                    ("authorization", &bearer)
                ]
            )),
            403
        );
    }

    #[test]
    fn an_unspecified_listener_takes_ip_literals_with_its_port() {
        let admission = Admission::new("0.0.0.0:9000".parse().unwrap(), "/mcp".into(), None);
        assert_eq!(
            judge(&admission, "/mcp", &[("host", "192.168.1.5:9000")]),
            Verdict::Admit
        );
        assert_eq!(
            status(judge(
                &admission,
                "/mcp",
                &[("host", "attacker.example:9000")]
            )),
            403
        );
    }

    #[test]
    fn listen_urls_are_http_with_an_ip_a_port_and_a_path() {
        assert_eq!(
            parse_listen_url("http://127.0.0.1:0/mcp"),
            Ok(ListenUrl {
                address: "127.0.0.1:0".parse().unwrap(),
                path: "/mcp".into()
            })
        );
        assert_eq!(
            parse_listen_url("http://localhost:8080/mcp").map(|url| url.address),
            Ok("127.0.0.1:8080".parse().unwrap())
        );
        assert_eq!(
            parse_listen_url("http://[::1]:9/x/y").map(|url| url.path),
            Ok("/x/y".into())
        );
        for bad in [
            "https://127.0.0.1:1/mcp",
            "http://127.0.0.1:1",
            "http://example.com:1/mcp",
            "127.0.0.1:1/mcp",
            "http://127.0.0.1:1/mcp?x=1",
        ] {
            assert!(parse_listen_url(bad).is_err(), "{bad}");
        }
        assert_eq!(
            shown_url("[::1]:5".parse().unwrap(), "/mcp"),
            "http://[::1]:5/mcp"
        );
    }
}
