//! A server that runs each login as its own Unix user (`--user-map`): a
//! Unix peer's connection is forwarded, as a chain's hop is, to the worker
//! of the account its peer credentials (or the map) name, a `capexec serve
//! --worker` running with that account's ids and groups (see
//! `crate::users` and docs/design/logins-as-users.md). One worker per
//! account, started at its first login and again if it has ended, on a
//! socket in a directory only the server can reach.

use std::cell::RefCell;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::PathBuf;
use std::rc::Rc;

use crate::capexec_capnp::executor;
use crate::net::address::Address;
use crate::net::auth::UNAUTHENTICATED_TAG;
use crate::net::upstream::{UpstreamConfig, UpstreamLink};
use crate::rpc::{self, ServerContext, Upstream};
use crate::users::{Account, UserMap, spawn_worker};

/// What a server that maps logins to users needs.
#[derive(Clone, Debug)]
pub struct UsersConfig {
    pub map: UserMap,
    /// The capexec binary the workers run (the server's own).
    pub program: PathBuf,
    /// Where the workers' sockets go: a directory made for them (mode
    /// 0711: a worker may look its own socket up, nobody may list them),
    /// removed when the server stops. Each socket is root's, mode 0600.
    pub socket_dir: PathBuf,
}

/// The running workers, by uid.
pub(super) struct Workers {
    config: UsersConfig,
    running: RefCell<HashMap<u32, Running>>,
    context: Rc<ServerContext>,
    per_connection: Option<usize>,
    port_limits: rpc::PortLimits,
}

struct Running {
    link: Rc<UpstreamLink>,
    /// Readable once the worker has ended.
    pidfd: OwnedFd,
}

impl Workers {
    /// Makes the sockets' directory.
    pub(super) fn new(
        config: UsersConfig,
        context: Rc<ServerContext>,
        per_connection: Option<usize>,
        port_limits: rpc::PortLimits,
    ) -> std::io::Result<Workers> {
        std::fs::DirBuilder::new()
            .mode(0o711)
            .create(&config.socket_dir)?;
        // Whatever the umask made of it.
        std::fs::set_permissions(&config.socket_dir, std::fs::Permissions::from_mode(0o711))?;
        Ok(Workers {
            config,
            running: RefCell::new(HashMap::new()),
            context,
            per_connection,
            port_limits,
        })
    }

    /// The account a Unix peer of `uid` runs as, or why it has none.
    pub(super) fn account_of_unix_peer(&self, uid: u32) -> Result<Account, String> {
        self.config
            .map
            .by_unix_peer(uid)
            .map_err(|error| format!("this server runs logins as users, and {error}"))
    }

    /// The root executor of a connection of `account`'s: every call goes
    /// to the account's worker, within the connection's own quota.
    pub(super) fn executor(
        &self,
        account: &Result<Account, String>,
        connection: &str,
        received: Option<&rpc::ReceivedDescriptors>,
        direct: Option<&rpc::DirectChannels>,
    ) -> executor::Client {
        let link = match account {
            Ok(account) => self.link(account),
            Err(why) => Err(why.clone()),
        };
        let link = match link {
            Ok(link) => link,
            Err(why) => {
                tracing::warn!(%why, "refusing a login");
                return executor::Client {
                    client: capnp_rpc::new_broken_cap(capnp::Error::failed(format!(
                        "{why} {UNAUTHENTICATED_TAG}"
                    ))),
                };
            }
        };
        let mut allowance =
            rpc::Quota::for_connection(self.per_connection, self.context.holdings())
                .port_limits(self.port_limits)
                .owned_by(connection);
        if let Some(received) = received {
            allowance = allowance.received_descriptors(received.clone());
        }
        if let Some(direct) = direct {
            allowance = allowance.direct_channels(direct.clone());
        }
        rpc::forwarded_root_executor(link, Rc::clone(&self.context), allowance.build())
    }

    /// The link to `account`'s worker, started first if it is not running.
    fn link(&self, account: &Account) -> Result<Rc<UpstreamLink>, String> {
        let uid = account.uid.as_raw();
        let mut running = self.running.borrow_mut();
        if let Some(worker) = running.get(&uid) {
            if !ended(&worker.pidfd) {
                return Ok(Rc::clone(&worker.link));
            }
            tracing::warn!(user = %account.name, "the user's worker had ended; starting another");
            worker.link.close();
            running.remove(&uid);
        }
        let path = self.config.socket_dir.join(format!("{uid}.sock"));
        let failed = |error: std::io::Error| {
            format!(
                "cannot start the worker of user {}: {}",
                account.name,
                crate::model::io_message(&error)
            )
        };
        match std::fs::remove_file(&path) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                return Err(failed(error));
            }
            _ => {}
        }
        let listener = std::os::unix::net::UnixListener::bind(&path).map_err(failed)?;
        // Only the server connects (the worker, not root, cannot).
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(failed)?;
        let child = spawn_worker(account, &self.config.program, &listener)
            .map_err(|error| format!("user {}: {error}", account.name))?;
        drop(listener);
        let pid = rustix::process::Pid::from_raw(child.id() as i32)
            .ok_or_else(|| format!("user {}: the worker has no pid", account.name))?;
        let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
            .map_err(|errno| failed(errno.into()))?;
        tracing::info!(user = %account.name, uid, pid = child.id(), "started the user's worker");
        let link = UpstreamLink::new(UpstreamConfig::new(
            account.name.clone(),
            Address::Unix(path),
            None,
        ));
        running.insert(
            uid,
            Running {
                link: Rc::clone(&link),
                pidfd,
            },
        );
        Ok(link)
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for worker in self.running.get_mut().values() {
            worker.link.close();
        }
        // The workers die with the server (their parent-death signal).
        let _ = std::fs::remove_dir_all(&self.config.socket_dir);
    }
}

/// Whether the process behind `pidfd` has ended (its pidfd is readable).
fn ended(pidfd: &OwnedFd) -> bool {
    use rustix::event::{PollFd, PollFlags, poll};
    let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
    matches!(poll(&mut fds, Some(&rustix::event::Timespec::default())), Ok(n) if n > 0)
}
