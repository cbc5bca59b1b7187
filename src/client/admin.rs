//! The admin capability (`capexec serve --admin`), typed: every process
//! the server holds, a view of any of them, and terminating any of them.

use crate::capexec_capnp::admin;
use crate::client::{Error, RemoteProcess};
use crate::model::ProcessRecord;
use crate::wire;

/// Every process the server holds, in pid order.
pub async fn processes(admin: &admin::Client) -> Result<Vec<ProcessRecord>, Error> {
    let response = admin.list_request().send().promise.await?;
    let list = response.get()?.get_processes()?;
    let mut records = Vec::with_capacity(list.len() as usize);
    for record in list.iter() {
        records.push(wire::process_record_from_wire(record)?);
    }
    Ok(records)
}

/// An observer facet of the process `pid` (read, subscribe, info only).
pub fn observe(admin: &admin::Client, pid: u32) -> RemoteProcess {
    let mut request = admin.observe_request();
    request.get().set_pid(pid);
    RemoteProcess::from_capability(request.send().pipeline.get_view())
}

/// Terminates the process `pid`; whether it was still running.
pub async fn terminate(admin: &admin::Client, pid: u32) -> Result<bool, Error> {
    let mut request = admin.terminate_request();
    request.get().set_pid(pid);
    let response = request.send().promise.await?;
    Ok(response.get()?.get_was_running())
}

/// Asks the server to upgrade in place (see `Admin.upgrade`); `Ok` once
/// the new binary has taken the hand-over, after which this connection is
/// closed.
pub async fn upgrade(admin: &admin::Client) -> Result<(), Error> {
    admin.upgrade_request().send().promise.await?;
    Ok(())
}

/// Why the upgrade that started the server's binary did not execute the
/// new one, if it did not (see `Admin.lastUpgrade`); `Ok(None)` also from
/// a server that predates the question (it answers `unimplemented`).
pub async fn last_upgrade_failure(admin: &admin::Client) -> Result<Option<String>, Error> {
    let response = match admin.last_upgrade_request().send().promise.await {
        Ok(response) => response,
        Err(error) if error.kind == capnp::ErrorKind::Unimplemented => return Ok(None),
        Err(error) => return Err(error.into()),
    };
    let results = response.get()?;
    if !results.has_failure() {
        return Ok(None);
    }
    Ok(Some(
        String::from_utf8_lossy(results.get_failure()?.as_bytes()).into_owned(),
    ))
}
