//! What `--connect` names: an address (`unix:PATH`, `tcp:HOST:PORT`, or as
//! people type them, `HOST:PORT` and `/path/to.sock`), `local` (the
//! default socket of `capexec serve`), or a server named in the
//! configuration file (see `cli::config`). `CAPEXEC_CONNECT` gives the
//! default, as `DOCKER_HOST` does.

use std::path::PathBuf;

use capexec::net::Address;

use crate::cli::config::{self, Config, Lookup};

/// A server to connect to, with what the configuration file says about it
/// (flags given on the command line win).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    pub address: Address,
    pub token_file: Option<PathBuf>,
    pub tls_ca: Option<PathBuf>,
    pub tls_pin: Option<String>,
    /// The client's certificate and key, presented when the server asks.
    pub tls_client: Option<(PathBuf, PathBuf)>,
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

/// The variable that gives `--connect` when the flag is not given.
pub const CONNECT_VARIABLE: &str = "CAPEXEC_CONNECT";

/// What a `--connect` value (or a configuration file's address) is, by
/// its shape.
#[derive(Debug, PartialEq, Eq)]
pub enum Typed {
    Address(Address),
    /// An address that is wrong: why.
    Invalid(String),
    /// HOST:PORT whose PORT is not a number.
    NotAPort {
        text: String,
        port: String,
    },
    /// No address: a server's name.
    Name,
}

/// An address as people type them: `unix:PATH`, `tcp:HOST:PORT`, a path
/// (anything with a `/`) or `HOST:PORT`.
pub fn typed(text: &str) -> Typed {
    if text.starts_with("unix:") || text.starts_with("tcp:") {
        return match text.parse::<Address>() {
            Ok(address) => Typed::Address(address),
            Err(why) => Typed::Invalid(why),
        };
    }
    if text.contains('/') {
        return Typed::Address(Address::Unix(PathBuf::from(text)));
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Typed::Name;
    };
    match format!("tcp:{text}").parse::<Address>() {
        Ok(address) if !host.is_empty() => Typed::Address(address),
        // A port, but a host the parser refused (an unbracketed IPv6).
        Err(why) if !host.is_empty() && port.parse::<u16>().is_ok() => Typed::Invalid(why),
        _ => Typed::NotAPort {
            text: text.to_string(),
            port: port.to_string(),
        },
    }
}

/// Resolves `text` as `--connect` takes it.
pub fn resolve(text: &str) -> Result<Named, String> {
    resolve_given(text, "--connect")
}

/// Resolves `text` as `--connect` takes it, given by `given` (the flag, or
/// the variable), which errors name.
pub fn resolve_given(text: &str, given: &str) -> Result<Named, String> {
    let named = |why: String| {
        if given == CONNECT_VARIABLE {
            format!("{given}={why}")
        } else {
            format!("{given} {why}")
        }
    };
    if let Some(hint) = crate::cli::habits::user_at_host(text, given) {
        return Err(hint);
    }
    match typed(text) {
        Typed::Address(address) => return Ok(at(address)),
        Typed::Invalid(why) => return Err(named(why)),
        Typed::NotAPort { text, port } => {
            return Err(named(format!(
                "{text:?}: {port:?} is not a port number; write tcp:HOST:PORT, unix:PATH or the \
                 name of a server in the configuration file"
            )));
        }
        Typed::Name => {}
    }
    let config = Config::load()?;
    match config.lookup(text) {
        Lookup::Found(entry) => return Ok(entry.server.clone()),
        Lookup::Broken(why) => return Err(why.to_string()),
        Lookup::Unknown => {}
    }
    if text == LOCAL {
        let path = capexec::net::default_socket_path()
            .map_err(|why| named(format!("{}: {why}", LOCAL)))?;
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
    let mut listed = if known.is_empty() {
        "it names none".to_string()
    } else {
        format!("it names {}", known.join(", "))
    };
    let mut candidates = known.clone();
    if config.get(LOCAL).is_none() {
        candidates.push(LOCAL);
    }
    if let Some(close) = crate::cli::habits::did_you_mean(text, &candidates) {
        listed.push_str(&format!("; did you mean {close}?"));
    }
    Err(named(format!(
        "{text:?}: no server of that name {place} ({listed}); an address is unix:PATH or \
         tcp:HOST:PORT"
    )))
}

/// A bare address: nothing more is known of the server.
pub fn at(address: Address) -> Named {
    Named {
        address,
        token_file: None,
        tls_ca: None,
        tls_pin: None,
        tls_client: None,
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
