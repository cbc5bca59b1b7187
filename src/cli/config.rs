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
//! Every problem is one line naming the file and the line, and breaks only
//! the names it affects: a wrong `[servers.NAME]` table breaks NAME (the
//! others, and `local`, still work); text TOML cannot read outside such a
//! table breaks every name it may define.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use capexec::net::parse_fingerprint;

use crate::cli::named::{Named, Typed};

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

/// A part of the file that could not be read: the names it affects and
/// its one line ("FILE:LINE: ...").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Broken {
    pub scope: Scope,
    pub message: String,
}

/// The servers a broken part of the file may define.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The one its `[servers.NAME]` header names.
    Server(String),
    /// Any: text before the first table, or a `[servers]` table.
    Any,
    /// None: another table.
    Nothing,
}

/// What the file says of a name.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup<'a> {
    Found(&'a ServerEntry),
    /// The part of the file that defines it, or may, is wrong: its line.
    Broken(&'a str),
    Unknown,
}

/// The servers of a configuration file, in name order, and the parts of
/// it that could not be read: a wrong entry breaks its own name only.
#[derive(Debug, Default)]
pub struct Config {
    pub servers: Vec<ServerEntry>,
    pub broken: Vec<Broken>,
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
            Ok(text) => Ok(Config::parse(file, &text)),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Config::default()),
            Err(error) => Err(format!(
                "{}: {}",
                file.display(),
                capexec::model::io_message(&error)
            )),
        }
    }

    /// Linear in the file's size: lines are found from one index of the
    /// file's line starts, headers from one pass over its lines. A file
    /// that TOML cannot read as a whole is read a table at a time, so that
    /// what is wrong in one server's table leaves the others usable.
    pub fn parse(file: &Path, text: &str) -> Config {
        let mut config = Config::default();
        match toml::from_str::<RawFile>(text) {
            Ok(raw) => {
                let lines = LineIndex::of(text);
                let line_of = |offset: usize| lines.line_of(offset);
                let headers = header_lines(text);
                for (name, entry) in raw.servers {
                    let header = headers.get(name.as_str()).copied();
                    config.add(file, &line_of, header, name, entry);
                }
            }
            Err(_) => {
                for section in sections(text) {
                    config.add_section(file, &section);
                }
            }
        }
        config.servers.sort_by(|a, b| a.name.cmp(&b.name));
        config
    }

    /// One table of a file TOML could not read as a whole.
    fn add_section(&mut self, file: &Path, section: &Section<'_>) {
        let lines = LineIndex::of(section.text);
        let line_of = |offset: usize| lines.line_of(offset) + section.first_line - 1;
        match toml::from_str::<RawFile>(section.text) {
            Ok(raw) => {
                for (name, entry) in raw.servers {
                    let header = matches!(&section.scope, Scope::Server(named) if *named == name)
                        .then_some(section.first_line);
                    self.add(file, &line_of, header, name, entry);
                }
            }
            Err(error) => {
                let line = error
                    .span()
                    .map_or(section.first_line, |span| line_of(span.start));
                self.broken.push(Broken {
                    scope: section.scope.clone(),
                    message: format!("{}:{line}: {}", file.display(), one_line(error.message())),
                });
            }
        }
    }

    /// Checks one server's entry, and keeps it or what is wrong with it.
    fn add(
        &mut self,
        file: &Path,
        line_of: &dyn Fn(usize) -> usize,
        header: Option<usize>,
        name: String,
        entry: Spanned<RawEntry>,
    ) {
        let header_line = header.unwrap_or_else(|| line_of(entry.span().start));
        let defined_at = self
            .servers
            .iter()
            .find(|server| server.name == name)
            .map(|server| server.line);
        if let Some(first) = defined_at {
            self.servers.retain(|server| server.name != name);
            self.broken.push(Broken {
                scope: Scope::Server(name.clone()),
                message: format!(
                    "{}:{header_line}: [servers.{name}]: defined again (first at line {first})",
                    file.display()
                ),
            });
            return;
        }
        match checked(file, line_of, header_line, &name, entry.into_inner()) {
            Ok(server) => self.servers.push(ServerEntry {
                name,
                server,
                line: header_line,
            }),
            Err(message) => self.broken.push(Broken {
                scope: Scope::Server(name),
                message,
            }),
        }
    }

    pub fn get(&self, name: &str) -> Option<&ServerEntry> {
        match self.lookup(name) {
            Lookup::Found(entry) => Some(entry),
            _ => None,
        }
    }

    /// What the file says of `name`: its entry, or the line of what is
    /// wrong with it (its own table, or a part of the file that may
    /// define it).
    pub fn lookup(&self, name: &str) -> Lookup<'_> {
        let broken = |wanted: &dyn Fn(&Scope) -> bool| {
            self.broken
                .iter()
                .find(|broken| wanted(&broken.scope))
                .map(|broken| Lookup::Broken(broken.message.as_str()))
        };
        if let Some(own) = broken(&|scope| matches!(scope, Scope::Server(named) if named == name)) {
            return own;
        }
        // In name order (the file's table is a BTreeMap).
        if let Ok(index) = self
            .servers
            .binary_search_by(|entry| entry.name.as_str().cmp(name))
        {
            return Lookup::Found(&self.servers[index]);
        }
        broken(&|scope| *scope == Scope::Any).unwrap_or(Lookup::Unknown)
    }
}

/// One server's entry, checked: its address and trust, the files it names
/// (beside the file unless absolute, `~/` for the home directory).
fn checked(
    file: &Path,
    line_of: &dyn Fn(usize) -> usize,
    header_line: usize,
    name: &str,
    entry: RawEntry,
) -> Result<Named, String> {
    let in_entry = |span: std::ops::Range<usize>, why: String| {
        format!(
            "{}:{}: [servers.{name}]: {why}",
            file.display(),
            line_of(span.start)
        )
    };
    if !valid_name(name) {
        return Err(format!(
            "{}:{header_line}: [servers.{name}]: a server name is letters, digits, '-', '_' and \
             '.'",
            file.display()
        ));
    }
    let address = match crate::cli::named::typed(entry.address.get_ref()) {
        Typed::Address(address) => address,
        Typed::Invalid(why) => {
            return Err(in_entry(entry.address.span(), format!("address {why}")));
        }
        Typed::NotAPort { text, port } => {
            return Err(in_entry(
                entry.address.span(),
                format!(
                    "address {text:?}: {port:?} is not a port number; write tcp:HOST:PORT, \
                     HOST:PORT, unix:PATH or /PATH"
                ),
            ));
        }
        Typed::Name => {
            return Err(in_entry(
                entry.address.span(),
                format!(
                    "address {:?}: an address is tcp:HOST:PORT, HOST:PORT, unix:PATH or /PATH",
                    entry.address.get_ref()
                ),
            ));
        }
    };
    if let (Some(_), Some(ca)) = (&entry.tls_pin, &entry.tls_ca) {
        return Err(in_entry(
            ca.span(),
            "give tls-pin or tls-ca, not both".to_string(),
        ));
    }
    match (&entry.tls_client_cert, &entry.tls_client_key) {
        (Some(given), None) => {
            return Err(in_entry(
                given.span(),
                "tls-client-cert needs tls-client-key, its private key".to_string(),
            ));
        }
        (None, Some(given)) => {
            return Err(in_entry(
                given.span(),
                "tls-client-key needs tls-client-cert, its certificate".to_string(),
            ));
        }
        _ => {}
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
            (
                "tls-client-cert",
                entry.tls_client_cert.as_ref().map(Spanned::span),
            ),
        ];
        if let Some((key, Some(span))) = tcp_only.into_iter().find(|(_, s)| s.is_some()) {
            return Err(in_entry(
                span,
                format!(
                    "{key} is for tcp: addresses: a Unix socket needs no token and no TLS (its \
                     file permissions protect it)"
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
                "environment {:?} is not an environment name (letters, digits, '-', '_' and \
                 '.', hops joined by '/')",
                environment.get_ref()
            ),
        ));
    }
    let base = file.parent().unwrap_or(Path::new("."));
    let path_of = |value: &Spanned<String>| expand(value.get_ref(), base);
    let mut value_lines = Vec::new();
    for (key, value) in [
        ("token-file", &entry.token_file),
        ("tls-ca", &entry.tls_ca),
        ("tls-pin", &entry.tls_pin),
        ("tls-client-cert", &entry.tls_client_cert),
    ] {
        if let Some(value) = value {
            value_lines.push((key, line_of(value.span().start)));
        }
    }
    if let Some(tls) = &entry.tls {
        value_lines.push(("tls", line_of(tls.span().start)));
    }
    let origin = crate::cli::named::Origin {
        file: file.to_path_buf(),
        server: name.to_string(),
        lines: value_lines,
    };
    Ok(Named {
        address,
        token_file: entry.token_file.as_ref().map(path_of),
        tls_ca: entry.tls_ca.as_ref().map(path_of),
        tls_pin: entry.tls_pin.map(Spanned::into_inner),
        tls_client: entry
            .tls_client_cert
            .as_ref()
            .map(path_of)
            .zip(entry.tls_client_key.as_ref().map(path_of)),
        tls: entry.tls.is_some_and(Spanned::into_inner),
        insecure_plaintext: entry.insecure_plaintext.unwrap_or(false),
        environment: entry.environment.map(Spanned::into_inner),
        origin: Some(origin),
    })
}

/// A table of the file (or the text before the first one), read on its
/// own when the file as a whole is not TOML.
struct Section<'a> {
    text: &'a str,
    first_line: usize,
    scope: Scope,
}

/// The file cut before each line that opens a table (`[...]`).
fn sections(text: &str) -> Vec<Section<'_>> {
    let mut sections = Vec::new();
    let mut start = 0;
    let mut first_line = 1;
    let mut scope = Scope::Any;
    let mut offset = 0;
    for (index, line) in text.split_inclusive('\n').enumerate() {
        if index > 0 && line.trim_start().starts_with('[') {
            sections.push(Section {
                text: &text[start..offset],
                first_line,
                scope: std::mem::replace(&mut scope, Scope::Nothing),
            });
            start = offset;
            first_line = index + 1;
        }
        if line.trim_start().starts_with('[') {
            scope = match header_name(line) {
                Some(name) => Scope::Server(name),
                None if line.split('#').next().unwrap_or("").trim() == "[servers]" => Scope::Any,
                None => Scope::Nothing,
            };
        }
        offset += line.len();
    }
    sections.push(Section {
        text: &text[start..],
        first_line,
        scope,
    });
    sections
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
    tls_client_cert: Option<Spanned<String>>,
    tls_client_key: Option<Spanned<String>>,
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
        if let Some(name) = header_name(line) {
            headers.entry(name).or_insert(index + 1);
        }
    }
    headers
}

/// NAME, if `line` is a `[servers.NAME]` header (NAME bare or quoted).
fn header_name(line: &str) -> Option<String> {
    let line = line.split('#').next().unwrap_or("").trim().replace(' ', "");
    let name = line
        .strip_prefix("[servers.")
        .and_then(|rest| rest.strip_suffix(']'))?;
    let name = ['"', '\'']
        .iter()
        .find_map(|&quote| {
            name.strip_prefix(quote)
                .and_then(|inner| inner.strip_suffix(quote))
        })
        .unwrap_or(name);
    Some(name.to_string())
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

    const FILE: &str = "/home/u/.config/capexec/config.toml";

    fn parse(text: &str) -> Config {
        Config::parse(Path::new(FILE), text)
    }

    #[test]
    fn servers_are_read_in_the_documented_form() {
        let config = parse(
            "# mine\n[servers.build]\naddress = \"tcp:build-box:7000\"\n\
             token-file = \"~/.config/capexec/build.token\"\n\
             tls-pin = \"3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c\"   # pin\n\
             environment = \"gpu\"\n\n[servers.box]\naddress = \"unix:/run/capexec/capexec.sock\"\n\
             [servers.ca]\naddress = \"tcp:ca-box:7000\"\ntls-ca = \"ca.pem\"\ntoken-file = \"/etc/t\"\n\
             [servers.typed]\naddress = \"typed-box:7000\"\n",
        );
        assert_eq!(config.broken, []);
        let names: Vec<&str> = config.servers.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["box", "build", "ca", "typed"]);
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
        // HOST:PORT, as --connect takes it.
        assert_eq!(
            config.get("typed").map(|t| t.server.address.to_string()),
            Some("tcp:typed-box:7000".to_string())
        );
    }

    #[test]
    fn a_client_certificate_is_a_certificate_and_its_key() {
        let config = parse(
            "[servers.mine]\naddress = \"tcp:box:7000\"\ntls-pin = \"3f1c3f1c3f1c3f1c3f1c3f1c3f1c\
             3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c\"\ntls-client-cert = \"me.pem\"\n\
             tls-client-key = \"/keys/me.key\"\n\
             [servers.half]\naddress = \"tcp:box:7000\"\ntls-client-cert = \"me.pem\"\n\
             [servers.unix]\naddress = \"unix:/s\"\ntls-client-cert = \"me.pem\"\n\
             tls-client-key = \"me.key\"\n",
        );
        assert_eq!(
            config.get("mine").and_then(|m| m.server.tls_client.clone()),
            Some((
                PathBuf::from("/home/u/.config/capexec/me.pem"),
                PathBuf::from("/keys/me.key")
            ))
        );
        let problems: Vec<String> = config.broken.iter().map(|b| b.message.clone()).collect();
        assert_eq!(
            problems,
            [
                format!(
                    "{FILE}:8: [servers.half]: tls-client-cert needs tls-client-key, its private key"
                ),
                format!(
                    "{FILE}:11: [servers.unix]: tls-client-cert is for tcp: addresses: a Unix \
                     socket needs no token and no TLS (its file permissions protect it)"
                ),
            ]
        );
    }

    #[test]
    fn every_problem_names_the_file_and_the_line_and_breaks_only_its_server() {
        let good = "[servers.good]\naddress = \"tcp:g:1\"\n";
        for (text, broken, expected) in [
            (
                "[servers.a]\naddress = \"tcp:a:1\"\ntokn-file = \"x\"\n",
                Scope::Server("a".into()),
                format!("{FILE}:3: unknown field `tokn-file`"),
            ),
            (
                "[servers.a]\naddress = \"a:http\"\n",
                Scope::Server("a".into()),
                format!(
                    "{FILE}:2: [servers.a]: address \"a:http\": \"http\" is not a port number; \
                     write tcp:HOST:PORT, HOST:PORT, unix:PATH or /PATH"
                ),
            ),
            (
                "[servers.a]\naddress = \"a-box\"\n",
                Scope::Server("a".into()),
                format!(
                    "{FILE}:2: [servers.a]: address \"a-box\": an address is tcp:HOST:PORT, \
                     HOST:PORT, unix:PATH or /PATH"
                ),
            ),
            (
                "[servers.a]\ntoken-file = \"x\"\n",
                Scope::Server("a".into()),
                format!("{FILE}:1: missing field `address`"),
            ),
            (
                "[servers.a]\naddress = \"tcp:a:1\"\ntls-pin = \"abc\"\n",
                Scope::Server("a".into()),
                format!("{FILE}:3: [servers.a]: tls-pin \"abc\" is not a SHA-256"),
            ),
            (
                "\n[servers.a]\naddress = \"unix:/s\"\ntoken-file = \"t\"\n",
                Scope::Server("a".into()),
                format!("{FILE}:4: [servers.a]: token-file is for tcp: addresses"),
            ),
            (
                "[servers.a]\naddress = \"tcp:a:1\"\n[servers.a]\naddress = \"tcp:a:2\"\n",
                Scope::Server("a".into()),
                format!("{FILE}:3: [servers.a]: defined again (first at line "),
            ),
            (
                "[servers.a\naddress = \"tcp:a:1\"\n",
                Scope::Nothing,
                format!("{FILE}:1: "),
            ),
            ("address = 7\n", Scope::Any, format!("{FILE}:1: ")),
            (
                "[sever.a]\naddress = \"tcp:a:1\"\n",
                Scope::Nothing,
                format!("{FILE}:1: "),
            ),
        ] {
            // Before and after a good server, which stays usable (text
            // outside a table can only come first).
            let after = text.starts_with('[').then(|| format!("{good}{text}"));
            for text in [Some(format!("{text}{good}")), after].into_iter().flatten() {
                let config = parse(&text);
                assert_eq!(config.broken.len(), 1, "{text:?}: {:?}", config.broken);
                let problem = &config.broken[0];
                let offset = if text.starts_with(good) { 2 } else { 0 };
                let expected = match expected.split_once(':').and_then(|(file, rest)| {
                    let (line, rest) = rest.split_once(':')?;
                    Some(format!(
                        "{file}:{}:{rest}",
                        line.parse::<usize>().ok()? + offset
                    ))
                }) {
                    Some(shifted) => shifted,
                    None => expected.clone(),
                };
                assert!(
                    problem.message.starts_with(&expected),
                    "{text:?}: {} (expected {expected})",
                    problem.message
                );
                assert!(!problem.message.contains('\n'), "{}", problem.message);
                assert_eq!(problem.scope, broken, "{text:?}");
                assert!(config.get("good").is_some(), "{text:?}");
                let a = config.lookup("a");
                match &broken {
                    Scope::Server(_) | Scope::Any => {
                        assert_eq!(a, Lookup::Broken(&problem.message), "{text:?}")
                    }
                    Scope::Nothing => assert_eq!(a, Lookup::Unknown, "{text:?}"),
                }
                let local = config.lookup("local");
                if broken == Scope::Any {
                    assert_eq!(local, Lookup::Broken(&problem.message), "{text:?}");
                } else {
                    assert_eq!(local, Lookup::Unknown, "{text:?}");
                }
            }
        }
    }
}
