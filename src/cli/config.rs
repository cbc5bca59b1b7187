//! The client's configuration file: named servers, as ssh's config names
//! hosts. `$XDG_CONFIG_HOME/capexec/config.toml`, else
//! `~/.config/capexec/config.toml`:
//!
//! ```toml
//! [servers.build]
//! address = "tcp:build-box:7000"
//! token-file = "~/.config/capexec/build.token"
//! tls-pin = "3f1c...64 hex digits"   # or tls-ca = "/path/ca.pem"
//! environment = "gpu"                # optional
//! ```
//!
//! Every problem is one line naming the file and the line.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use capexec::net::{Address, parse_fingerprint};

use crate::cli::named::Named;

/// Where the configuration file is looked for.
pub fn path() -> Option<PathBuf> {
    config_dir().map(|dir| dir.join("config.toml"))
}

/// `$XDG_CONFIG_HOME/capexec`, else `~/.config/capexec`.
pub fn config_dir() -> Option<PathBuf> {
    capexec::net::default_token_path().and_then(|token| token.parent().map(Path::to_path_buf))
}

/// The largest configuration file read (some 150,000 servers).
pub const MAX_CONFIG_BYTES: u64 = 16 * 1024 * 1024;

/// One named server, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerEntry {
    pub name: String,
    /// What `--connect NAME` gives.
    pub server: Named,
    /// Where it is defined: the line of its `[servers.NAME]` header.
    pub line: usize,
}

/// The servers of a configuration file, in name order.
#[derive(Debug, Default)]
pub struct Config {
    pub servers: Vec<ServerEntry>,
}

impl Config {
    /// The file at [`path`]; an empty configuration if there is none.
    pub fn load() -> Result<Config, String> {
        match path() {
            Some(file) => Config::load_from(&file),
            None => Ok(Config::default()),
        }
    }

    /// The file at `file`; an empty configuration if it does not exist.
    /// It must be a regular file of at most [`MAX_CONFIG_BYTES`].
    pub fn load_from(file: &Path) -> Result<Config, String> {
        match capexec::local_file::read_regular_text(file, MAX_CONFIG_BYTES) {
            Ok(text) => Config::parse(file, &text),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Config::default()),
            Err(error) => Err(format!(
                "{}: {}",
                file.display(),
                capexec::model::io_message(&error)
            )),
        }
    }

    /// Linear in the file's size: lines are found from one index of the
    /// file's line starts, headers from one pass over its lines.
    pub fn parse(file: &Path, text: &str) -> Result<Config, String> {
        let lines = LineIndex::of(text);
        let at = |span: std::ops::Range<usize>, message: &str| {
            format!(
                "{}:{}: {message}",
                file.display(),
                lines.line_of(span.start)
            )
        };
        let raw: RawFile = toml::from_str(text).map_err(|error| {
            let line = error.span().map_or(1, |span| lines.line_of(span.start));
            format!("{}:{line}: {}", file.display(), one_line(error.message()))
        })?;
        let headers = header_lines(text);
        let base = file.parent().unwrap_or(Path::new("."));
        let mut servers = Vec::new();
        for (name, entry) in raw.servers {
            let span = entry.span();
            let entry = entry.into_inner();
            let header_line = headers
                .get(name.as_str())
                .copied()
                .unwrap_or_else(|| lines.line_of(span.start));
            let in_entry = |span: std::ops::Range<usize>, why: String| {
                at(span, &format!("[servers.{name}]: {why}"))
            };
            if !valid_name(&name) {
                return Err(format!(
                    "{}:{header_line}: [servers.{name}]: a server name is letters, digits, '-', \
                     '_' and '.'",
                    file.display()
                ));
            }
            let address = entry
                .address
                .get_ref()
                .parse::<Address>()
                .map_err(|why| in_entry(entry.address.span(), format!("address {why}")))?;
            if let (Some(_), Some(ca)) = (&entry.tls_pin, &entry.tls_ca) {
                return Err(in_entry(
                    ca.span(),
                    "give tls-pin or tls-ca, not both".to_string(),
                ));
            }
            if let Some(pin) = &entry.tls_pin {
                parse_fingerprint(pin.get_ref())
                    .map_err(|why| in_entry(pin.span(), format!("tls-pin {why}")))?;
            }
            if !address.is_tcp() {
                let tcp_only = [
                    ("token-file", entry.token_file.as_ref().map(Spanned::span)),
                    ("tls-pin", entry.tls_pin.as_ref().map(Spanned::span)),
                    ("tls-ca", entry.tls_ca.as_ref().map(Spanned::span)),
                ];
                if let Some((key, Some(span))) = tcp_only.into_iter().find(|(_, s)| s.is_some()) {
                    return Err(in_entry(
                        span,
                        format!(
                            "{key} is for tcp: addresses: a Unix socket needs no token and no \
                             TLS (its file permissions protect it)"
                        ),
                    ));
                }
            }
            if let Some(environment) = &entry.environment
                && environment.get_ref() != capexec::model::LOCAL_ENVIRONMENT
                && !environment
                    .get_ref()
                    .split('/')
                    .all(capexec::model::valid_environment_name)
            {
                return Err(in_entry(
                    environment.span(),
                    format!(
                        "environment {:?} is not an environment name (letters, digits, '-', '_' \
                         and '.', hops joined by '/')",
                        environment.get_ref()
                    ),
                ));
            }
            let path_of = |value: &Spanned<String>| expand(value.get_ref(), base);
            let mut value_lines = Vec::new();
            for (key, value) in [
                ("token-file", &entry.token_file),
                ("tls-ca", &entry.tls_ca),
                ("tls-pin", &entry.tls_pin),
            ] {
                if let Some(value) = value {
                    value_lines.push((key, lines.line_of(value.span().start)));
                }
            }
            if let Some(tls) = &entry.tls {
                value_lines.push(("tls", lines.line_of(tls.span().start)));
            }
            let origin = crate::cli::named::Origin {
                file: file.to_path_buf(),
                server: name.clone(),
                lines: value_lines,
            };
            servers.push(ServerEntry {
                server: Named {
                    address,
                    token_file: entry.token_file.as_ref().map(path_of),
                    tls_ca: entry.tls_ca.as_ref().map(path_of),
                    tls_pin: entry.tls_pin.map(Spanned::into_inner),
                    tls: entry.tls.is_some_and(Spanned::into_inner),
                    insecure_plaintext: entry.insecure_plaintext.unwrap_or(false),
                    environment: entry.environment.map(Spanned::into_inner),
                    origin: Some(origin),
                },
                line: header_line,
                name,
            });
        }
        Ok(Config { servers })
    }

    pub fn get(&self, name: &str) -> Option<&ServerEntry> {
        // In name order (the file's table is a BTreeMap).
        self.servers
            .binary_search_by(|entry| entry.name.as_str().cmp(name))
            .ok()
            .map(|index| &self.servers[index])
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    servers: BTreeMap<String, Spanned<RawEntry>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawEntry {
    address: Spanned<String>,
    token_file: Option<Spanned<String>>,
    tls_pin: Option<Spanned<String>>,
    tls_ca: Option<Spanned<String>>,
    tls: Option<Spanned<bool>>,
    insecure_plaintext: Option<bool>,
    environment: Option<Spanned<String>>,
}

/// A server name: what `--connect NAME` can be without looking like an
/// address.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// `~/x` under the home directory; a relative path beside the file.
fn expand(value: &str, base: &Path) -> PathBuf {
    if let Some(rest) = value.strip_prefix("~/")
        && let Some(home) = std::env::var_os("HOME")
    {
        return PathBuf::from(home).join(rest);
    }
    let path = PathBuf::from(value);
    if path.is_absolute() {
        path
    } else {
        base.join(path)
    }
}

/// Where each line of a text starts, to find the line of any offset.
struct LineIndex {
    /// The offset just after each newline.
    starts: Vec<usize>,
}

impl LineIndex {
    fn of(text: &str) -> LineIndex {
        LineIndex {
            starts: text
                .bytes()
                .enumerate()
                .filter(|&(_, b)| b == b'\n')
                .map(|(index, _)| index + 1)
                .collect(),
        }
    }

    /// The 1-based line of byte `offset`.
    fn line_of(&self, offset: usize) -> usize {
        self.starts.partition_point(|&start| start <= offset) + 1
    }
}

/// The line of each `[servers.NAME]` header (NAME bare or quoted), the
/// first where a name has several.
fn header_lines(text: &str) -> HashMap<String, usize> {
    let mut headers = HashMap::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim().replace(' ', "");
        let Some(name) = line
            .strip_prefix("[servers.")
            .and_then(|rest| rest.strip_suffix(']'))
        else {
            continue;
        };
        let name = ['"', '\'']
            .iter()
            .find_map(|&quote| {
                name.strip_prefix(quote)
                    .and_then(|inner| inner.strip_suffix(quote))
            })
            .unwrap_or(name);
        headers.entry(name.to_string()).or_insert(index + 1);
    }
    headers
}

/// toml's messages may run over several lines.
fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(Path::new("/home/u/.config/capexec/config.toml"), text)
    }

    #[test]
    fn servers_are_read_in_the_documented_form() {
        let config = parse(
            "# mine\n[servers.build]\naddress = \"tcp:build-box:7000\"\n\
             token-file = \"~/.config/capexec/build.token\"\n\
             tls-pin = \"3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c\"   # pin\n\
             environment = \"gpu\"\n\n[servers.box]\naddress = \"unix:/run/capexec/capexec.sock\"\n\
             [servers.ca]\naddress = \"tcp:ca-box:7000\"\ntls-ca = \"ca.pem\"\ntoken-file = \"/etc/t\"\n",
        )
        .expect("parses");
        let names: Vec<&str> = config.servers.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["box", "build", "ca"]);
        let build = &config.get("build").expect("build").server;
        assert_eq!(build.address.to_string(), "tcp:build-box:7000");
        assert_eq!(build.environment.as_deref(), Some("gpu"));
        assert_eq!(config.get("build").map(|b| b.line), Some(2));
        assert!(
            build
                .token_file
                .as_ref()
                .is_some_and(|p| p.ends_with(".config/capexec/build.token"))
        );
        assert_eq!(
            config.get("ca").and_then(|ca| ca.server.tls_ca.clone()),
            Some(PathBuf::from("/home/u/.config/capexec/ca.pem"))
        );
        assert_eq!(config.get("box").map(|b| b.line), Some(8));
    }

    #[test]
    fn every_problem_names_the_file_and_the_line() {
        let file = "/home/u/.config/capexec/config.toml";
        for (text, expected) in [
            (
                "[servers.a]\naddress = \"tcp:a:1\"\ntokn-file = \"x\"\n",
                format!("{file}:3: unknown field `tokn-file`"),
            ),
            (
                "[servers.a]\naddress = \"a:7000\"\n",
                format!("{file}:2: [servers.a]: address \"a:7000\""),
            ),
            (
                "[servers.a]\ntoken-file = \"x\"\n",
                format!("{file}:1: missing field `address`"),
            ),
            (
                "[servers.a]\naddress = \"tcp:a:1\"\ntls-pin = \"abc\"\n",
                format!("{file}:3: [servers.a]: tls-pin \"abc\" is not a SHA-256"),
            ),
            (
                "\n[servers.a]\naddress = \"unix:/s\"\ntoken-file = \"t\"\n",
                format!("{file}:4: [servers.a]: token-file is for tcp: addresses"),
            ),
            (
                "[servers.a]\naddress = \"tcp:a:1\"\n[servers.a]\n",
                format!("{file}:3: "),
            ),
            ("[servers.a\n", format!("{file}:1: ")),
        ] {
            let error = parse(text).expect_err(text);
            assert!(error.starts_with(&expected), "{text:?}: {error}");
            assert!(!error.contains('\n'), "{error}");
        }
    }
}
