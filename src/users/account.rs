//! A Unix account as a login would see it: its ids, its groups, its home
//! and its shell, from the password and group databases (NSS, as `id` and
//! `login` read them).

use std::ffi::CString;
use std::path::PathBuf;

use nix::unistd::{Gid, Uid, User};

/// One account of the password database, with its supplementary groups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: Uid,
    /// The primary group (the password entry's).
    pub gid: Gid,
    /// Every group the account is in: the primary one and those the group
    /// database lists it in, as `initgroups(3)` would set them.
    pub groups: Vec<Gid>,
    pub home: PathBuf,
    pub shell: PathBuf,
}

/// Why an account could not be looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccountError {
    /// No such name in the password database.
    NoSuchName(String),
    /// No such uid in the password database.
    NoSuchUid(u32),
    /// The database could not be read (NSS failed).
    Database(String),
}

impl std::fmt::Display for AccountError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AccountError::NoSuchName(name) => {
                write!(f, "no user `{name}` in the password database")
            }
            AccountError::NoSuchUid(uid) => {
                write!(f, "no user with uid {uid} in the password database")
            }
            AccountError::Database(why) => {
                write!(f, "cannot read the password or group database: {why}")
            }
        }
    }
}

impl std::error::Error for AccountError {}

impl Account {
    /// The account named `name`.
    pub fn by_name(name: &str) -> Result<Account, AccountError> {
        match User::from_name(name) {
            Ok(Some(user)) => Account::from_user(user),
            Ok(None) => Err(AccountError::NoSuchName(name.to_string())),
            Err(errno) => Err(AccountError::Database(errno.desc().to_string())),
        }
    }

    /// The account whose uid is `uid` (a Unix peer's, from `SO_PEERCRED`).
    pub fn by_uid(uid: u32) -> Result<Account, AccountError> {
        match User::from_uid(Uid::from_raw(uid)) {
            Ok(Some(user)) => Account::from_user(user),
            Ok(None) => Err(AccountError::NoSuchUid(uid)),
            Err(errno) => Err(AccountError::Database(errno.desc().to_string())),
        }
    }

    fn from_user(user: User) -> Result<Account, AccountError> {
        let name = CString::new(user.name.as_bytes())
            .map_err(|_| AccountError::Database("a user name holds a NUL byte".to_string()))?;
        let mut groups = nix::unistd::getgrouplist(&name, user.gid)
            .map_err(|errno| AccountError::Database(errno.desc().to_string()))?;
        // getgrouplist puts the primary group in; keep the list as a set.
        groups.sort_by_key(|gid| gid.as_raw());
        groups.dedup();
        Ok(Account {
            name: user.name,
            uid: user.uid,
            gid: user.gid,
            groups,
            home: user.dir,
            shell: user.shell,
        })
    }

    /// The variables a login of this account finds set.
    pub fn login_environment(&self) -> [(&'static str, String); 4] {
        [
            ("HOME", self.home.to_string_lossy().into_owned()),
            ("USER", self.name.clone()),
            ("LOGNAME", self.name.clone()),
            ("SHELL", self.shell.to_string_lossy().into_owned()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_found_by_name_and_by_uid() {
        let by_name = Account::by_name("root").expect("root has an entry");
        assert_eq!(by_name.uid.as_raw(), 0);
        assert_eq!(by_name.gid.as_raw(), 0);
        assert!(by_name.groups.contains(&Gid::from_raw(0)));
        assert_eq!(Account::by_uid(0), Ok(by_name));
    }

    #[test]
    fn unknown_names_and_uids_are_said_as_such() {
        assert_eq!(
            Account::by_name("capexec-no-such-user").map(|_| ()),
            Err(AccountError::NoSuchName("capexec-no-such-user".into()))
        );
        assert_eq!(
            Account::by_name("capexec-no-such-user")
                .unwrap_err()
                .to_string(),
            "no user `capexec-no-such-user` in the password database"
        );
        assert_eq!(
            Account::by_uid(3_999_999_999).map(|_| ()),
            Err(AccountError::NoSuchUid(3_999_999_999))
        );
    }
}
