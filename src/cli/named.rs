//! What `--connect` names: an address (`unix:PATH`, `tcp:HOST:PORT`, or as
//! people type them, `HOST:PORT` and `/path/to.sock`), `local` (the
//! default socket of `capexec serve`), or a server named in the
//! configuration file (see `cli::config`). `CAPEXEC_CONNECT` gives the
//! default, as `DOCKER_HOST` does.

use std::path::PathBuf;

use capexec::net::Address;

use crate::cli::config::{self, Config};

/// A server to connect to, with what the configuration file says about it
/// (flags given on the command line win).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    pub address: Address,
    pub token_file: Option<PathBuf>,
    pub tls_ca: Option<PathBuf>,
    pub tls_pin: Option<String>,
    pub tls: bool,
    pub insecure_plaintext: bool,
    pub environment: Option<String>,
    /// Where the configuration file says this, for errors about what it
    /// names (a token file or CA file that cannot be read).
    pub origin: Option<Origin>,
}

/// A server's entry in the configuration file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    pub file: PathBuf,
    pub server: String,
    /// The line of each key given.
    pub lines: Vec<(&'static str, usize)>,
}

impl Origin {
    /// "FILE:LINE: [servers.NAME]: KEY", the place of `key` in the file.
    pub fn of(&self, key: &str) -> String {
        let line = self
            .lines
            .iter()
            .find(|(name, _)| *name == key)
            .map_or(1, |(_, line)| *line);
        format!(
            "{}:{line}: [servers.{}]: {key}",
            self.file.display(),
            self.server
        )
    }
}

/// The name `--connect local` gives the default socket.
pub const LOCAL: &str = "local";

/// Resolves `text` as `--connect` takes it.
pub fn resolve(text: &str) -> Result<Named, String> {
    if text.starts_with("unix:") || text.starts_with("tcp:") {
        let address = text
            .parse::<Address>()
            .map_err(|error| format!("--connect {error}"))?;
        return Ok(at(address));
    }
    if text.contains('/') {
        // A path, as people type one: a Unix socket.
        return Ok(at(Address::Unix(PathBuf::from(text))));
    }
    if let Some((host, port)) = text.rsplit_once(':') {
        return match (format!("tcp:{text}")).parse::<Address>() {
            Ok(address) if !host.is_empty() => Ok(at(address)),
            // A port, but a host the parser refused (an unbracketed IPv6).
            Err(error) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                Err(format!("--connect {error}"))
            }
            _ => Err(format!(
                "--connect {text:?}: {port:?} is not a port number; write tcp:HOST:PORT, \
                 unix:PATH or the name of a server in the configuration file"
            )),
        };
    }
    let config = Config::load()?;
    if let Some(entry) = config.get(text) {
        return Ok(entry.server.clone());
    }
    if text == LOCAL {
        let path =
            capexec::net::default_socket_path().map_err(|why| format!("--connect local: {why}"))?;
        return Ok(at(Address::Unix(path)));
    }
    let place = match config::path() {
        Some(file) => format!("in {}", file.display()),
        None => "(there is no configuration file: HOME is not set)".to_string(),
    };
    let known = config
        .servers
        .iter()
        .map(|entry| entry.name.as_str())
        .collect::<Vec<_>>();
    let listed = if known.is_empty() {
        "it names none".to_string()
    } else {
        format!("it names {}", known.join(", "))
    };
    Err(format!(
        "--connect {text:?}: no server of that name {place} ({listed}); an address is \
         unix:PATH or tcp:HOST:PORT"
    ))
}

/// A bare address: nothing more is known of the server.
pub fn at(address: Address) -> Named {
    Named {
        address,
        token_file: None,
        tls_ca: None,
        tls_pin: None,
        tls: false,
        insecure_plaintext: false,
        environment: None,
        origin: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_taken_the_way_people_type_them() {
        let address = |text: &str| resolve(text).map(|named| Some(named.address.to_string()));
        assert_eq!(address("tcp:h:7"), Ok(Some("tcp:h:7".into())));
        assert_eq!(address("unix:/s"), Ok(Some("unix:/s".into())));
        assert_eq!(
            address("build-box:7000"),
            Ok(Some("tcp:build-box:7000".into()))
        );
        assert_eq!(address("[::1]:7000"), Ok(Some("tcp:[::1]:7000".into())));
        assert_eq!(address("/run/x.sock"), Ok(Some("unix:/run/x.sock".into())));
        assert_eq!(address("./x.sock"), Ok(Some("unix:./x.sock".into())));
        let error = resolve("host:http").expect_err("not a port");
        assert!(error.contains("write tcp:HOST:PORT"), "{error}");
        let error = resolve("::1:7000").expect_err("unbracketed IPv6");
        assert!(
            error.contains("an IPv6 address goes in brackets"),
            "{error}"
        );
    }
}
