//! Restricted executors' rules for ports: which addresses may be dialled
//! and listened on (the schema's `PortPolicy`), resolved when the
//! restriction is made and narrowed by every restriction after it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};

use crate::files::within::Root;
use crate::model::{
    EXCERPT_BYTES, PortPolicy, PortUse, Refusal, RefusalKind, RuleNames, excerpt, io_message,
};

/// Most patterns in one list of a policy.
pub const MAX_PORT_PATTERNS: usize = 1024;

/// What a dial or a listen would use, as its rule sees it: an IP address
/// (a host name already resolved) and port, or a Unix socket's path with
/// its directory's symlinks resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Ip(SocketAddr),
    Unix(PathBuf),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Ip(address) => {
                write!(f, "{}", crate::model::Address::from_socket_addr(*address))
            }
            Target::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// One allowed address pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Pattern {
    Tcp {
        /// `None`: any host.
        hosts: Option<Vec<Block>>,
        ports: (u16, u16),
        /// As written, for messages.
        text: String,
    },
    Unix {
        /// Resolved when the rule was made.
        path: PathBuf,
        /// Any socket in `path` or below.
        below: bool,
        text: String,
    },
}

/// An address block: an address and how many leading bits matter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Block {
    address: IpAddr,
    bits: u8,
}

impl Block {
    fn contains(self, address: IpAddr) -> bool {
        match (self.address, address.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                prefix_equal(&net.octets(), &ip.octets(), self.bits)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                prefix_equal(&net.octets(), &ip.octets(), self.bits)
            }
            _ => false,
        }
    }

    /// Every address of `inner` is in this block.
    fn covers(self, inner: Block) -> bool {
        inner.bits >= self.bits && self.contains(inner.address)
    }
}

fn prefix_equal(a: &[u8], b: &[u8], bits: u8) -> bool {
    let whole = usize::from(bits / 8);
    if a[..whole] != b[..whole] {
        return false;
    }
    let rest = bits % 8;
    if rest == 0 {
        return true;
    }
    let mask = 0xffu8 << (8 - rest);
    (a[whole] & mask) == (b[whole] & mask)
}

impl Pattern {
    fn text(&self) -> &str {
        match self {
            Pattern::Tcp { text, .. } | Pattern::Unix { text, .. } => text,
        }
    }

    fn matches(&self, target: &Target) -> bool {
        match (self, target) {
            (Pattern::Tcp { hosts, ports, .. }, Target::Ip(address)) => {
                (ports.0..=ports.1).contains(&address.port())
                    && hosts.as_ref().is_none_or(|blocks| {
                        blocks.iter().any(|block| block.contains(address.ip()))
                    })
            }
            (Pattern::Unix { path, below, .. }, Target::Unix(target)) => {
                if *below {
                    target.starts_with(path)
                } else {
                    target == path
                }
            }
            _ => false,
        }
    }

    /// Everything `inner` allows, this allows.
    fn covers(&self, inner: &Pattern) -> bool {
        match (self, inner) {
            (
                Pattern::Tcp { hosts, ports, .. },
                Pattern::Tcp {
                    hosts: inner_hosts,
                    ports: inner_ports,
                    ..
                },
            ) => {
                let ports_covered = ports.0 <= inner_ports.0 && inner_ports.1 <= ports.1;
                let hosts_covered = match (hosts, inner_hosts) {
                    (None, _) => true,
                    (Some(_), None) => false,
                    (Some(outer), Some(inner)) => inner
                        .iter()
                        .all(|block| outer.iter().any(|outer| outer.covers(*block))),
                };
                ports_covered && hosts_covered
            }
            (
                Pattern::Unix { path, below, .. },
                Pattern::Unix {
                    path: inner_path,
                    below: inner_below,
                    ..
                },
            ) => {
                if *below {
                    inner_path.starts_with(path)
                } else {
                    !inner_below && inner_path == path
                }
            }
            _ => false,
        }
    }
}

/// One list's rule: `None` allows any address.
#[derive(Clone, Debug, Default)]
struct List {
    patterns: Option<Vec<Pattern>>,
    names: RuleNames,
    /// Why the list is empty when no policy named its patterns.
    implied: Option<Closed>,
}

/// Why a restriction that names no ports allows none: what it confines
/// (its programs, its working directories, a sandbox) would be worth
/// nothing if the executor could still reach any address, its own
/// server's sockets included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closed {
    /// The policy confines this field (a schema field name) and says
    /// nothing of ports.
    By(&'static str),
    /// The policy's sandbox has no network: no dial and no listen either.
    NoNetwork,
}

/// Which addresses dials and listens may use.
#[derive(Clone, Debug, Default)]
pub struct PortRules {
    dial: List,
    listen: List,
}

impl PortRules {
    /// Any address: what an unrestricted executor allows.
    pub fn unrestricted() -> PortRules {
        PortRules::default()
    }

    fn list(&self, use_: PortUse) -> &List {
        match use_ {
            PortUse::Dial => &self.dial,
            PortUse::Listen => &self.listen,
        }
    }

    /// These rules narrowed by `policy` (resolved now), made by a
    /// restriction that `closes` ports or not: such a restriction allows
    /// no address its policy does not name, and one with
    /// [`Closed::NoNetwork`] none at all (a policy that names some is
    /// refused rather than silently allowed less).
    pub fn narrowed(
        &self,
        policy: Option<&PortPolicy>,
        closes: Option<Closed>,
        names: RuleNames,
    ) -> Result<PortRules, Refusal> {
        let mut rules = self.clone();
        for use_ in [PortUse::Dial, PortUse::Listen] {
            let asked = policy.and_then(|policy| match use_ {
                PortUse::Dial => policy.dial.as_ref(),
                PortUse::Listen => policy.listen.as_ref(),
            });
            if closes == Some(Closed::NoNetwork)
                && let Some(first) = asked.and_then(|patterns| patterns.first())
            {
                return Err(Refusal::new(
                    RefusalKind::InvalidArgument,
                    format!(
                        "{}: {:?} names an address, but {} has no network, which allows no \
                         dial and no listen; give the sandbox network all to name addresses",
                        names.setup(use_.rule()),
                        excerpt(first),
                        names.setup("sandbox"),
                    ),
                ));
            }
            let narrowed = match asked {
                Some(patterns) => Some(List {
                    patterns: Some(self.narrowed_list(use_, patterns, names)?),
                    names,
                    implied: None,
                }),
                None if closes.is_some() => Some(List {
                    patterns: Some(Vec::new()),
                    names,
                    implied: closes,
                }),
                None => None,
            };
            if let Some(list) = narrowed {
                match use_ {
                    PortUse::Dial => rules.dial = list,
                    PortUse::Listen => rules.listen = list,
                }
            }
        }
        Ok(rules)
    }

    fn narrowed_list(
        &self,
        use_: PortUse,
        texts: &[String],
        names: RuleNames,
    ) -> Result<Vec<Pattern>, Refusal> {
        let rule = names.setup(use_.rule());
        if texts.len() > MAX_PORT_PATTERNS {
            return Err(Refusal::new(
                RefusalKind::InvalidArgument,
                format!(
                    "{rule}: {} patterns; at most {MAX_PORT_PATTERNS}",
                    texts.len()
                ),
            ));
        }
        let current = self.list(use_);
        let mut patterns = Vec::with_capacity(texts.len());
        for text in texts {
            let pattern = parse_pattern(text).map_err(|why| {
                Refusal::new(RefusalKind::InvalidArgument, format!("{rule}: {why}"))
            })?;
            if let Some(allowed) = &current.patterns
                && !allowed.iter().any(|outer| outer.covers(&pattern))
            {
                return Err(Refusal::new(
                    RefusalKind::NotAllowed,
                    format!(
                        "{rule}: {:?} is not within this executor's patterns ({})",
                        excerpt(text),
                        listed(allowed)
                    ),
                ));
            }
            patterns.push(pattern);
        }
        Ok(patterns)
    }

    /// Whether the rules say anything about `use_` (an unrestricted
    /// executor's do not).
    pub fn restricts(&self, use_: PortUse) -> bool {
        self.list(use_).patterns.is_some()
    }

    /// About how many bytes the rules keep in memory.
    pub fn approximate_bytes(&self) -> usize {
        [&self.dial, &self.listen]
            .iter()
            .flat_map(|list| list.patterns.iter().flatten())
            .map(|pattern| match pattern {
                Pattern::Tcp { hosts, text, .. } => {
                    text.len()
                        + hosts
                            .as_ref()
                            .map_or(0, |blocks| blocks.len() * std::mem::size_of::<Block>())
                        + std::mem::size_of::<Pattern>()
                }
                Pattern::Unix { path, text, .. } => {
                    text.len() + path.as_os_str().len() + std::mem::size_of::<Pattern>()
                }
            })
            .sum()
    }

    /// The Unix paths the rules allow for `use_`, as roots for telling a
    /// path that does not resolve (see `files::within`); `None` when any
    /// address is allowed.
    pub(crate) fn unix_roots(&self, use_: PortUse) -> Option<Vec<Root<'_>>> {
        let patterns = self.list(use_).patterns.as_ref()?;
        Some(
            patterns
                .iter()
                .filter_map(|pattern| match pattern {
                    Pattern::Unix { path, below, .. } => Some(Root {
                        path,
                        below: *below,
                    }),
                    Pattern::Tcp { .. } => None,
                })
                .collect(),
        )
    }

    /// Refuses `target` for `use_` (asked as `asked`) unless a pattern
    /// allows it.
    pub fn check(&self, use_: PortUse, asked: &str, target: &Target) -> Result<(), Refusal> {
        let list = self.list(use_);
        let Some(patterns) = &list.patterns else {
            return Ok(());
        };
        if patterns.iter().any(|pattern| pattern.matches(target)) {
            return Ok(());
        }
        Err(self.refusal(use_, asked, target))
    }

    /// The refusal of `target` for `use_` (asked as `asked`) by these
    /// rules, whether or not a pattern would match it (for a path that
    /// does not resolve, which must be refused as one outside is).
    pub(crate) fn refusal(&self, use_: PortUse, asked: &str, target: &Target) -> Refusal {
        let list = self.list(use_);
        let patterns = list.patterns.as_deref().unwrap_or_default();
        let mut rule = list.names.refusal(use_.rule());
        if let Some(closed) = list.implied {
            rule.push_str(&closed.note(list.names));
        }
        let resolved = if asked == target.to_string() {
            String::new()
        } else {
            format!(" ({target})")
        };
        let verb = match use_ {
            PortUse::Dial => "dialled",
            PortUse::Listen => "listened on",
        };
        Refusal::new(
            RefusalKind::NotAllowed,
            format!(
                "{rule}: {:?}{resolved} may not be {verb} (allowed: {})",
                excerpt(asked),
                listed(patterns)
            ),
        )
    }
}

impl Closed {
    /// Why the list is empty, as a refusal says it after the rule's name.
    fn note(self, names: RuleNames) -> String {
        match (self, names) {
            (Closed::By(field), RuleNames::ServeFlags) => {
                format!(" (none by default with {})", names.setup(field))
            }
            (Closed::By(field), RuleNames::Schema) => {
                format!(" (none when a policy sets `{field}` and not `ports`)")
            }
            (Closed::NoNetwork, _) => {
                format!(" (none: {} has no network)", names.setup("sandbox"))
            }
        }
    }
}

/// Patterns for a message; a long list is cut with how many it left out.
fn listed(patterns: &[Pattern]) -> String {
    if patterns.is_empty() {
        return "none".to_string();
    }
    let mut text = String::new();
    let mut left_out = 0;
    for pattern in patterns {
        if text.len() >= EXCERPT_BYTES {
            left_out += 1;
            continue;
        }
        if !text.is_empty() {
            text.push_str(", ");
        }
        text.push_str(&excerpt(pattern.text()));
    }
    if left_out > 0 {
        text.push_str(&format!(" and {left_out} more"));
    }
    text
}

/// Reads one pattern (see the schema's `PortPolicy`).
fn parse_pattern(text: &str) -> Result<Pattern, String> {
    let quoted = || format!("{:?}", excerpt(text));
    if let Some(path) = text.strip_prefix("unix:") {
        let below = path.ends_with('/');
        let path = Path::new(path);
        if !path.is_absolute() {
            return Err(format!("{}: a Unix socket path must be absolute", quoted()));
        }
        let resolved = std::fs::canonicalize(path)
            .map_err(|error| format!("{}: {}", quoted(), io_message(&error)))?;
        return Ok(Pattern::Unix {
            path: resolved,
            below,
            text: text.to_string(),
        });
    }
    let Some(rest) = text.strip_prefix("tcp:") else {
        return Err(format!(
            "{} is not a pattern: use tcp:HOSTS:PORTS or unix:PATH",
            quoted()
        ));
    };
    let (hosts, ports) = rest
        .rsplit_once(':')
        .ok_or_else(|| format!("{}: expected tcp:HOSTS:PORTS", quoted()))?;
    let ports = parse_ports(ports).ok_or_else(|| {
        format!(
            "{}: ports are \"*\", a port (1 to 65535) or a range such as 8000-8999",
            quoted()
        )
    })?;
    let hosts = parse_hosts(hosts).map_err(|why| format!("{}: {why}", quoted()))?;
    Ok(Pattern::Tcp {
        hosts,
        ports,
        text: text.to_string(),
    })
}

fn parse_ports(text: &str) -> Option<(u16, u16)> {
    if text == "*" {
        return Some((0, u16::MAX));
    }
    let port = |text: &str| text.parse::<u16>().ok().filter(|&port| port > 0);
    match text.split_once('-') {
        Some((low, high)) => {
            let (low, high) = (port(low)?, port(high)?);
            (low <= high).then_some((low, high))
        }
        None => port(text).map(|port| (port, port)),
    }
}

fn parse_hosts(text: &str) -> Result<Option<Vec<Block>>, String> {
    if text == "*" {
        return Ok(None);
    }
    if text == "localhost" {
        return Ok(Some(vec![
            Block {
                address: IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0)),
                bits: 8,
            },
            Block {
                address: IpAddr::V6(Ipv6Addr::LOCALHOST),
                bits: 128,
            },
        ]));
    }
    let inner = match text
        .strip_prefix('[')
        .and_then(|text| text.strip_suffix(']'))
    {
        Some(inside) => inside,
        // As in an address: "::1:80" would be read two ways.
        None if text.contains(':') => {
            return Err(
                "an IPv6 address or block goes in brackets (\"[::1]\", \"[fd00::/8]\")".into(),
            );
        }
        None => text,
    };
    let (address, bits) = match inner.split_once('/') {
        Some((address, bits)) => (address, Some(bits)),
        None => (inner, None),
    };
    let address: IpAddr = address.parse().map_err(|_| {
        "hosts are \"*\", \"localhost\", an IP address or a block such as 10.0.0.0/8 \
         (not a host name: what a name resolves to can change)"
            .to_string()
    })?;
    let address = address.to_canonical();
    let most = if address.is_ipv4() { 32 } else { 128 };
    let bits = match bits {
        None => most,
        Some(bits) => bits
            .parse::<u8>()
            .ok()
            .filter(|&bits| bits <= most)
            .ok_or_else(|| format!("a block's prefix length is 0 to {most}"))?,
    };
    Ok(Some(vec![Block { address, bits }]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(dial: &[&str], listen: Option<&[&str]>) -> PortPolicy {
        PortPolicy {
            dial: Some(dial.iter().map(|s| s.to_string()).collect()),
            listen: listen.map(|list| list.iter().map(|s| s.to_string()).collect()),
        }
    }

    fn ip(text: &str) -> Target {
        Target::Ip(text.parse().expect("socket address"))
    }

    #[test]
    fn tcp_patterns_match_hosts_blocks_and_port_ranges() {
        let rules = PortRules::unrestricted()
            .narrowed(
                Some(&policy(
                    &[
                        "tcp:localhost:5432",
                        "tcp:10.0.0.0/8:8000-8999",
                        "tcp:[fd00::/8]:*",
                    ],
                    None,
                )),
                None,
                RuleNames::Schema,
            )
            .expect("narrow");
        for allowed in [
            "127.0.0.1:5432",
            "127.9.9.9:5432",
            "[::1]:5432",
            "10.1.2.3:8080",
            "[fd12::1]:22",
            "[::ffff:127.0.0.1]:5432",
        ] {
            rules
                .check(PortUse::Dial, allowed, &ip(allowed))
                .unwrap_or_else(|error| panic!("{allowed}: {error}"));
        }
        for refused in [
            "127.0.0.1:5433",
            "10.1.2.3:9000",
            "11.0.0.1:8080",
            "[fe80::1]:22",
        ] {
            let error = rules
                .check(PortUse::Dial, refused, &ip(refused))
                .expect_err(refused);
            assert_eq!(error.kind, RefusalKind::NotAllowed);
            assert!(
                error.message.starts_with("policy rule `ports.dial`"),
                "{error}"
            );
        }
        // Listening was not restricted.
        rules
            .check(PortUse::Listen, "x", &ip("0.0.0.0:80"))
            .expect("no listen rule");
    }

    #[test]
    fn restricting_programs_allows_no_address_it_does_not_name() {
        let rules = PortRules::unrestricted()
            .narrowed(None, Some(Closed::By("programs")), RuleNames::ServeFlags)
            .expect("narrow");
        let error = rules
            .check(PortUse::Listen, "tcp:127.0.0.1:0", &ip("127.0.0.1:0"))
            .expect_err("none");
        assert!(
            error
                .message
                .starts_with("the server's --allow-listen (none by default with --allow-program)"),
            "{error}"
        );
    }

    #[test]
    fn confining_starts_closes_ports_unless_the_policy_names_them() {
        for field in ["cwdRoots", "sandbox"] {
            let rules = PortRules::unrestricted()
                .narrowed(None, Some(Closed::By(field)), RuleNames::Schema)
                .expect("narrow");
            for use_ in [PortUse::Dial, PortUse::Listen] {
                let error = rules
                    .check(use_, "tcp:127.0.0.1:80", &ip("127.0.0.1:80"))
                    .expect_err("none");
                assert_eq!(error.kind, RefusalKind::NotAllowed);
                assert!(
                    error.message.contains(&format!(
                        "(none when a policy sets `{field}` and not `ports`)"
                    )),
                    "{error}"
                );
            }
        }
        let named = PortRules::unrestricted()
            .narrowed(
                Some(&policy(&["tcp:localhost:80"], None)),
                Some(Closed::By("cwdRoots")),
                RuleNames::Schema,
            )
            .expect("narrow");
        named
            .check(PortUse::Dial, "x", &ip("127.0.0.1:80"))
            .expect("named");
        assert!(
            named
                .check(PortUse::Listen, "x", &ip("127.0.0.1:80"))
                .is_err()
        );
    }

    #[test]
    fn a_sandbox_without_network_allows_no_port_and_refuses_a_policy_naming_one() {
        let rules = PortRules::unrestricted()
            .narrowed(None, Some(Closed::NoNetwork), RuleNames::ServeFlags)
            .expect("narrow");
        let error = rules
            .check(
                PortUse::Dial,
                "unix:/run/x.sock",
                &Target::Unix("/run/x.sock".into()),
            )
            .expect_err("none");
        assert!(
            error
                .message
                .starts_with("the server's --allow-dial (none: --sandbox has no network)"),
            "{error}"
        );
        let error = PortRules::unrestricted()
            .narrowed(
                Some(&policy(&["tcp:localhost:80"], None)),
                Some(Closed::NoNetwork),
                RuleNames::Schema,
            )
            .expect_err("contradiction");
        assert_eq!(error.kind, RefusalKind::InvalidArgument);
        assert!(error.message.contains("has no network"), "{error}");
        // An empty list says the same as the sandbox: no contradiction.
        assert!(
            PortRules::unrestricted()
                .narrowed(
                    Some(&policy(&[], Some(&[]))),
                    Some(Closed::NoNetwork),
                    RuleNames::Schema,
                )
                .is_ok()
        );
    }

    #[test]
    fn a_narrower_policy_must_lie_within_the_current_one() {
        let outer = PortRules::unrestricted()
            .narrowed(
                Some(&policy(&["tcp:10.0.0.0/8:*"], None)),
                None,
                RuleNames::Schema,
            )
            .expect("outer");
        assert!(
            outer
                .narrowed(
                    Some(&policy(&["tcp:10.1.0.0/16:80-90"], None)),
                    None,
                    RuleNames::Schema
                )
                .is_ok()
        );
        for wider in [
            "tcp:*:80",
            "tcp:0.0.0.0/0:80",
            "tcp:11.0.0.1:80",
            "unix:/tmp/",
        ] {
            let error = outer
                .narrowed(Some(&policy(&[wider], None)), None, RuleNames::Schema)
                .expect_err(wider);
            assert_eq!(error.kind, RefusalKind::NotAllowed, "{wider}");
        }
    }

    #[test]
    fn unix_patterns_resolve_symlinks_and_cover_directories() {
        let dir = std::env::temp_dir().join(format!("capexec-rules-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("real")).expect("dir");
        let link = dir.join("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(dir.join("real"), &link).expect("symlink");
        let pattern = format!("unix:{}/", link.display());
        let rules = PortRules::unrestricted()
            .narrowed(Some(&policy(&[&pattern], None)), None, RuleNames::Schema)
            .expect("narrow");
        let real = std::fs::canonicalize(dir.join("real")).expect("canonical");
        rules
            .check(PortUse::Dial, "x", &Target::Unix(real.join("a.sock")))
            .expect("inside");
        assert!(
            rules
                .check(PortUse::Dial, "x", &Target::Unix(dir.join("a.sock")))
                .is_err()
        );
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn malformed_patterns_are_refused_with_a_reason() {
        for bad in [
            "tcp:db.internal:5432",
            "tcp:127.0.0.1:0",
            "tcp:127.0.0.1:9-1",
            "tcp:10.0.0.0/33:1",
            "tcp:::1:80",
            "tcp:fd00::/8:*",
            "unix:relative",
            "udp:1.2.3.4:5",
        ] {
            let error = PortRules::unrestricted()
                .narrowed(Some(&policy(&[bad], None)), None, RuleNames::Schema)
                .expect_err(bad);
            assert_eq!(error.kind, RefusalKind::InvalidArgument, "{bad}: {error}");
        }
    }
}
