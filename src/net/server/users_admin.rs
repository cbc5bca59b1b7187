//! The admin socket of a server that runs logins as users: the operator
//! still sees every process. The front holds none itself; each user's
//! worker serves `Admin` on a socket beside its own (only the front may
//! connect to either), and this asks the workers a login has reached:
//! `list` is every worker's records, each owner prefixed with its user;
//! `observe` and `terminate` go to the worker that holds the pid.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::PathBuf;
use std::rc::Rc;

use crate::capexec_capnp::admin;
use crate::model::{ProcessRecord, Refusal, RefusalKind};
use crate::net::address::Address;
use crate::net::admin::{AdminConnection, connect_admin};
use crate::net::server::users::Workers;

pub(super) struct UsersAdmin {
    workers: Rc<Workers>,
    /// One connection per worker's admin socket, made at first use.
    connections: RefCell<HashMap<PathBuf, Rc<AdminConnection>>>,
    /// The front's accept loops, stopped once an upgrade is granted.
    accepting: Accepting,
}

/// The accept loops of a server (filled once they are spawned).
pub(super) type Accepting = Rc<RefCell<Vec<tokio::task::AbortHandle>>>;

impl UsersAdmin {
    pub(super) fn new(workers: Rc<Workers>, accepting: Accepting) -> UsersAdmin {
        UsersAdmin {
            workers,
            connections: RefCell::new(HashMap::new()),
            accepting,
        }
    }

    async fn connection(&self, socket: &PathBuf) -> Result<Rc<AdminConnection>, String> {
        if let Some(connection) = self.connections.borrow().get(socket)
            && !connection.is_closed()
        {
            return Ok(Rc::clone(connection));
        }
        let connection = Rc::new(
            connect_admin(&Address::Unix(socket.clone()))
                .await
                .map_err(|error| error.to_string())?,
        );
        self.connections
            .borrow_mut()
            .insert(socket.clone(), Rc::clone(&connection));
        Ok(connection)
    }

    /// Every worker's records, each with the worker's admin socket, and
    /// each owner prefixed with its user's name.
    async fn records(&self) -> Vec<(PathBuf, ProcessRecord)> {
        let mut all = Vec::new();
        for (uid, socket) in self.workers.admin_sockets() {
            let user = crate::users::Account::by_uid(uid)
                .map(|account| account.name)
                .unwrap_or_else(|_| format!("uid {uid}"));
            let listed = match self.connection(&socket).await {
                Ok(connection) => list(&connection.admin())
                    .await
                    .map_err(|error| error.to_string()),
                Err(error) => Err(error),
            };
            match listed {
                Ok(records) => all.extend(records.into_iter().map(|mut record| {
                    let owner = record.owner.take().unwrap_or_else(|| "detached".into());
                    record.owner = Some(format!("{user} {owner}"));
                    (socket.clone(), record)
                })),
                // A worker that ended holds nothing any more.
                Err(error) => {
                    tracing::info!(user, %error, "a worker's admin socket did not answer")
                }
            }
        }
        all.sort_by_key(|(_, record)| record.pid);
        all
    }

    /// The worker's admin that holds `pid`.
    async fn holder(&self, pid: u32) -> Result<admin::Client, capnp::Error> {
        let held = self
            .records()
            .await
            .into_iter()
            .find(|(_, record)| record.pid == pid);
        let Some((socket, _)) = held else {
            return Err(Refusal::new(
                RefusalKind::InvalidArgument,
                format!("this server holds no process {pid}"),
            )
            .into());
        };
        let connection = self
            .connection(&socket)
            .await
            .map_err(capnp::Error::failed)?;
        Ok(connection.admin())
    }
}

/// A worker's records.
async fn list(admin: &admin::Client) -> Result<Vec<ProcessRecord>, capnp::Error> {
    let response = admin.list_request().send().promise.await?;
    let list = response.get()?.get_processes()?;
    let mut records = Vec::with_capacity(list.len() as usize);
    for record in list.iter() {
        records.push(crate::wire::process_record_from_wire(record)?);
    }
    Ok(records)
}

impl admin::Server for UsersAdmin {
    async fn list(
        self: Rc<Self>,
        _: admin::ListParams,
        mut results: admin::ListResults,
    ) -> Result<(), capnp::Error> {
        let records = self.records().await;
        let mut list = results.get().init_processes(records.len() as u32);
        for (index, (_, record)) in records.iter().enumerate() {
            crate::wire::process_record_to_wire(record, list.reborrow().get(index as u32));
        }
        Ok(())
    }

    async fn observe(
        self: Rc<Self>,
        params: admin::ObserveParams,
        mut results: admin::ObserveResults,
    ) -> Result<(), capnp::Error> {
        let pid = params.get()?.get_pid();
        let holder = self.holder(pid).await?;
        let mut request = holder.observe_request();
        request.get().set_pid(pid);
        let answer = request.send().promise.await?;
        results.get().set_view(answer.get()?.get_view()?);
        Ok(())
    }

    async fn terminate(
        self: Rc<Self>,
        params: admin::TerminateParams,
        mut results: admin::TerminateResults,
    ) -> Result<(), capnp::Error> {
        let pid = params.get()?.get_pid();
        let holder = self.holder(pid).await?;
        let mut request = holder.terminate_request();
        request.get().set_pid(pid);
        let answer = request.send().promise.await?;
        results
            .get()
            .set_was_running(answer.get()?.get_was_running());
        Ok(())
    }

    async fn upgrade(
        self: Rc<Self>,
        _: admin::UpgradeParams,
        _: admin::UpgradeResults,
    ) -> Result<(), capnp::Error> {
        // The monitor asks the new binary and answers; then it upgrades
        // the workers and this front goes. The client confirms by
        // reconnecting, so this front accepts nothing from now on: what
        // connects waits in the backlog for the new one.
        self.workers
            .upgrade()
            .await
            .map_err(|why| Refusal::new(RefusalKind::Unavailable, why))?;
        for task in self.accepting.borrow().iter() {
            task.abort();
        }
        Ok(())
    }

    /// What the monitor said when it started this front (`--failed-upgrade`).
    async fn last_upgrade(
        self: Rc<Self>,
        _: admin::LastUpgradeParams,
        mut results: admin::LastUpgradeResults,
    ) -> Result<(), capnp::Error> {
        if let Some(failure) = self.workers.failed_upgrade() {
            results.get().set_failure(&failure);
        }
        Ok(())
    }
}
