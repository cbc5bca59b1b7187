//! `capexec serve --user-map FILE`: which Unix account each login runs as.
//!
//! One entry a line, `#` to the end of a line a comment:
//!
//! ```text
//! token /etc/capexec/tokens/ci   builder   # a token file's login runs as builder
//! cert  sha256:3f0c…e1           alice     # a TLS client certificate's SHA-256
//! unix  1000                     alice     # a Unix peer's uid, instead of itself
//! ```
//!
//! A Unix peer the map does not name runs as its own uid. Every error names
//! the file and the line, as a compiler would: `FILE:3: no user `bulider`
//! in the password database`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::users::account::Account;

/// What a login presents that the map can name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Evidence {
    /// The token in this file (a relative path is taken from the map's
    /// directory).
    TokenFile(PathBuf),
    /// A TLS client certificate with this SHA-256.
    Certificate([u8; 32]),
    /// A Unix-socket peer with this uid (`SO_PEERCRED`).
    UnixUid(u32),
}

/// The map as read: each piece of evidence and the account it runs as.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserMap {
    entries: Vec<(Evidence, Account)>,
}

impl UserMap {
    /// Reads and checks the map in `file`.
    pub fn read(file: &Path) -> Result<UserMap, String> {
        let text = std::fs::read_to_string(file).map_err(|error| {
            format!(
                "--user-map {}: {}",
                file.display(),
                crate::model::io_message(&error)
            )
        })?;
        UserMap::parse(file, &text, &Account::by_name)
    }

    /// Parses `text`, read from `file`, with `lookup` for the accounts.
    pub fn parse(
        file: &Path,
        text: &str,
        lookup: &dyn Fn(&str) -> Result<Account, crate::users::AccountError>,
    ) -> Result<UserMap, String> {
        let base = file.parent().unwrap_or(Path::new("."));
        let mut entries = Vec::new();
        let mut seen: HashMap<Evidence, usize> = HashMap::new();
        for (index, line) in text.lines().enumerate() {
            let number = index + 1;
            let at = |why: String| format!("{}:{number}: {why}", file.display());
            let code = line.split('#').next().unwrap_or("");
            let words: Vec<&str> = code.split_whitespace().collect();
            let [kind, value, user] = words[..] else {
                if words.is_empty() {
                    continue;
                }
                return Err(at(format!(
                    "expected `token FILE USER`, `cert SHA256 USER` or `unix UID USER`, \
                     found {} word{}",
                    words.len(),
                    if words.len() == 1 { "" } else { "s" }
                )));
            };
            let evidence = match kind {
                "token" => Evidence::TokenFile(base.join(value)),
                "cert" => {
                    Evidence::Certificate(crate::model::parse_fingerprint(value).map_err(at)?)
                }
                // (uid_t)-1 is no uid: to setresuid(2) it means "unchanged".
                "unix" => Evidence::UnixUid(
                    value
                        .parse::<u32>()
                        .ok()
                        .filter(|&uid| uid != u32::MAX)
                        .ok_or_else(|| {
                            at(format!(
                                "`{value}` is not a uid (a number from 0 to 4294967294)"
                            ))
                        })?,
                ),
                other => {
                    return Err(at(format!(
                        "unknown kind `{other}`: each line starts with `token`, `cert` or `unix`"
                    )));
                }
            };
            let account = lookup(user).map_err(|error| at(error.to_string()))?;
            if let Some(first) = seen.insert(evidence.clone(), number) {
                return Err(at(format!(
                    "`{kind} {value}` is already mapped on line {first}"
                )));
            }
            entries.push((evidence, account));
        }
        Ok(UserMap { entries })
    }

    /// Every entry, in the file's order.
    pub fn entries(&self) -> &[(Evidence, Account)] {
        &self.entries
    }

    /// The account a certificate's login runs as, if the map names it.
    pub fn by_certificate(&self, sha256: &[u8; 32]) -> Option<&Account> {
        self.find(&Evidence::Certificate(*sha256))
    }

    /// The account a Unix peer of `uid` runs as: the map's, if it names the
    /// uid, else the peer's own.
    pub fn by_unix_peer(&self, uid: u32) -> Result<Account, crate::users::AccountError> {
        match self.find(&Evidence::UnixUid(uid)) {
            Some(account) => Ok(account.clone()),
            None => Account::by_uid(uid),
        }
    }

    fn find(&self, evidence: &Evidence) -> Option<&Account> {
        self.entries
            .iter()
            .find(|(known, _)| known == evidence)
            .map(|(_, account)| account)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::users::AccountError;
    use nix::unistd::{Gid, Uid};

    fn account(name: &str) -> Result<Account, AccountError> {
        let uid = match name {
            "alice" => 1001,
            "builder" => 1002,
            _ => return Err(AccountError::NoSuchName(name.to_string())),
        };
        Ok(Account {
            name: name.to_string(),
            uid: Uid::from_raw(uid),
            gid: Gid::from_raw(uid),
            groups: vec![Gid::from_raw(uid)],
            home: PathBuf::from(format!("/home/{name}")),
            shell: PathBuf::from("/bin/sh"),
        })
    }

    fn parse(text: &str) -> Result<UserMap, String> {
        UserMap::parse(Path::new("/etc/capexec/users"), text, &account)
    }

    #[test]
    fn each_kind_of_line_maps_to_its_account() {
        let pin = "ab".repeat(32);
        let map = parse(&format!(
            "# who runs as whom\n\
             token tokens/ci builder   # relative to the map\n\
             \n\
             cert  sha256:{pin} alice\n\
             unix 1000 alice\n"
        ))
        .expect("a good map");
        let evidence: Vec<&Evidence> = map.entries().iter().map(|(e, _)| e).collect();
        assert_eq!(
            evidence,
            [
                &Evidence::TokenFile(PathBuf::from("/etc/capexec/tokens/ci")),
                &Evidence::Certificate([0xab; 32]),
                &Evidence::UnixUid(1000),
            ]
        );
        assert_eq!(map.entries()[0].1.name, "builder");
        assert_eq!(
            map.by_certificate(&[0xab; 32]).map(|a| a.uid.as_raw()),
            Some(1001)
        );
        assert_eq!(map.by_certificate(&[0xcd; 32]), None);
        assert_eq!(
            map.by_unix_peer(1000).map(|a| a.name),
            Ok("alice".to_string())
        );
        // A uid the map does not name is the peer's own account.
        assert_eq!(map.by_unix_peer(0).map(|a| a.name), Ok("root".to_string()));
    }

    #[test]
    fn errors_name_the_file_and_the_line() {
        let cases = [
            (
                "unix 1000 bulider\n",
                "/etc/capexec/users:1: no user `bulider` in the password database",
            ),
            (
                "\n\ntoken ci\n",
                "/etc/capexec/users:3: expected `token FILE USER`, `cert SHA256 USER` or \
                 `unix UID USER`, found 2 words",
            ),
            (
                "key /x alice\n",
                "/etc/capexec/users:1: unknown kind `key`: each line starts with `token`, \
                 `cert` or `unix`",
            ),
            (
                "unix -1 alice\n",
                "/etc/capexec/users:1: `-1` is not a uid (a number from 0 to 4294967294)",
            ),
            (
                "unix 4294967295 alice\n",
                "/etc/capexec/users:1: `4294967295` is not a uid (a number from 0 to 4294967294)",
            ),
            (
                "unix 7 alice\nunix 7 builder\n",
                "/etc/capexec/users:2: `unix 7` is already mapped on line 1",
            ),
        ];
        for (text, error) in cases {
            assert_eq!(parse(text), Err(error.to_string()), "{text:?}");
        }
        let bad_pin = parse("cert abcd alice\n").expect_err("not a fingerprint");
        assert!(
            bad_pin.starts_with("/etc/capexec/users:1: \"abcd\" is not a SHA-256 fingerprint"),
            "{bad_pin}"
        );
    }

    #[test]
    fn an_unreadable_map_is_named() {
        let error = UserMap::read(Path::new("/nonexistent/capexec-users")).expect_err("missing");
        assert!(
            error.starts_with("--user-map /nonexistent/capexec-users: "),
            "{error}"
        );
    }
}
