//! `capexec forward`'s `-L` and `-R` arguments, in ssh's syntax plus
//! `unix:` paths on either side:
//!
//!   [BIND_ADDRESS:]PORT:HOST:HOSTPORT     as ssh
//!   [BIND_ADDRESS:]PORT:unix:PATH         to a Unix socket
//!   unix:PATH:HOST:HOSTPORT               listening on a Unix socket
//!   unix:PATH:unix:PATH                   both
//!
//! BIND_ADDRESS is an IP address ("[::1]" for IPv6), a host name, or "*"
//! (every interface); without it, loopback only (127.0.0.1), as ssh does
//! by default. A path cannot contain ':'.

/// One forward: where to listen, and where each connection goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForwardSpec {
    /// As an address (`tcp:HOST:PORT` or `unix:PATH`).
    pub listen: String,
    pub target: String,
}

/// Splits at ':' outside brackets.
fn fields(text: &str) -> Vec<&str> {
    let mut fields = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (index, ch) in text.char_indices() {
        match ch {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ':' if depth == 0 => {
                fields.push(&text[start..index]);
                start = index + 1;
            }
            _ => {}
        }
    }
    fields.push(&text[start..]);
    fields
}

fn port(text: &str, what: &str, zero: bool) -> Result<u16, String> {
    match text.parse::<u16>() {
        Ok(0) if !zero => Err(format!("{what} 0 cannot be connected to")),
        Ok(port) => Ok(port),
        Err(_) => Err(format!("{what} {text:?} is not a port (0 to 65535)")),
    }
}

fn host(text: &str) -> Result<String, String> {
    if text.is_empty() {
        return Err("an empty host".to_string());
    }
    Ok(text.to_string())
}

fn unix(path: &str) -> Result<String, String> {
    if path.is_empty() {
        return Err("unix: needs a path".to_string());
    }
    Ok(format!("unix:{path}"))
}

/// Reads one `-L` or `-R` argument.
pub fn parse(text: &str) -> Result<ForwardSpec, String> {
    const SHAPE: &str = "expected [BIND_ADDRESS:]PORT:HOST:HOSTPORT (either side may be unix:PATH)";
    let fields = fields(text);
    let n = fields.len();
    if n < 3 {
        return Err(SHAPE.to_string());
    }
    let (target, rest) = if fields[n - 2] == "unix" {
        (unix(fields[n - 1])?, &fields[..n - 2])
    } else {
        let hostport = port(fields[n - 1], "HOSTPORT", false)?;
        let target_host = host(fields[n - 2])?;
        let target_host = if target_host.contains(':') && !target_host.starts_with('[') {
            format!("[{target_host}]")
        } else {
            target_host
        };
        (format!("tcp:{target_host}:{hostport}"), &fields[..n - 2])
    };
    let listen = match rest {
        ["unix", path] => unix(path)?,
        [listen_port] => format!("tcp:127.0.0.1:{}", port(listen_port, "PORT", true)?),
        [bind, listen_port] => {
            let bind = match *bind {
                "*" | "" => "0.0.0.0".to_string(),
                "localhost" => "127.0.0.1".to_string(),
                other => host(other)?,
            };
            format!("tcp:{bind}:{}", port(listen_port, "PORT", true)?)
        }
        _ => return Err(SHAPE.to_string()),
    };
    Ok(ForwardSpec { listen, target })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(listen: &str, target: &str) -> ForwardSpec {
        ForwardSpec {
            listen: listen.into(),
            target: target.into(),
        }
    }

    #[test]
    fn ssh_syntax_and_unix_paths_are_read() {
        for (text, expected) in [
            (
                "8080:localhost:80",
                spec("tcp:127.0.0.1:8080", "tcp:localhost:80"),
            ),
            ("0:db:5432", spec("tcp:127.0.0.1:0", "tcp:db:5432")),
            (
                "*:8080:10.0.0.2:80",
                spec("tcp:0.0.0.0:8080", "tcp:10.0.0.2:80"),
            ),
            (
                "[::1]:8080:[::1]:80",
                spec("tcp:[::1]:8080", "tcp:[::1]:80"),
            ),
            (
                "9000:unix:/run/app.sock",
                spec("tcp:127.0.0.1:9000", "unix:/run/app.sock"),
            ),
            ("unix:/tmp/l.sock:h:1", spec("unix:/tmp/l.sock", "tcp:h:1")),
            (
                "unix:/a.sock:unix:/b.sock",
                spec("unix:/a.sock", "unix:/b.sock"),
            ),
        ] {
            assert_eq!(parse(text), Ok(expected), "{text}");
        }
    }

    #[test]
    fn malformed_specs_say_what_is_wrong() {
        for (text, needle) in [
            ("8080", "expected"),
            ("8080:host", "expected"),
            ("x:host:80", "PORT \"x\""),
            ("8080:host:0", "HOSTPORT 0"),
            ("8080:host:99999", "HOSTPORT \"99999\""),
            ("a:b:8080:host:80", "expected"),
            ("8080:unix:", "unix: needs a path"),
        ] {
            let error = parse(text).expect_err(text);
            assert!(error.contains(needle), "{text}: {error}");
        }
    }
}
