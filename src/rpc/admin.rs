//! `Admin`: the operator's view of every process the server holds (list,
//! observe, terminate), served only on the admin socket. The table records
//! each local start with what the engine does not know: its argv (cut
//! short), when it started and, through its quota ticket, the connection
//! that holds it.

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};
use std::time::SystemTime;

use crate::capexec_capnp::admin;
use crate::engine::proc_stat;
use crate::model::{LOCAL_ENVIRONMENT, ProcessRecord, Refusal, RefusalKind, StartSpec};
use crate::rpc::ServerContext;
use crate::rpc::detach::Held;
use crate::rpc::process::ProcessImpl;
use crate::wire;

/// The processes a server's connections hold, weakly: an entry goes when
/// its process is released (dead entries are swept as the table grows).
#[derive(Default)]
pub struct ProcessTable {
    entries: RefCell<Vec<Entry>>,
    /// Sweep when the table reaches this many entries.
    sweep_at: Cell<usize>,
}

struct Entry {
    held: Weak<Held>,
    argv: Vec<Vec<u8>>,
    started: SystemTime,
}

/// The table is swept no more often than every this many starts.
const MIN_SWEEP: usize = 64;

impl ProcessTable {
    pub(crate) fn add(&self, held: &Rc<Held>, spec: &StartSpec) {
        use std::os::unix::ffi::OsStrExt;
        let mut entries = self.entries.borrow_mut();
        if entries.len() >= self.sweep_at.get().max(MIN_SWEEP) {
            entries.retain(|entry| entry.held.strong_count() > 0);
            self.sweep_at.set(entries.len() * 2);
        }
        entries.push(Entry {
            held: Rc::downgrade(held),
            argv: crate::model::recorded_argv(spec.argv.iter().map(|a| a.as_bytes())),
            started: SystemTime::now(),
        });
    }

    /// What the table says of `held`: its recorded argv and start.
    pub(crate) fn described(&self, held: &Rc<Held>) -> Option<(Vec<Vec<u8>>, SystemTime)> {
        let entries = self.entries.borrow();
        let entry = entries
            .iter()
            .find(|entry| std::ptr::eq(entry.held.as_ptr(), Rc::as_ptr(held)))?;
        Some((entry.argv.clone(), entry.started))
    }

    /// Lists a process handed over by the binary before, as it was listed
    /// there.
    pub(crate) fn add_described(&self, held: &Rc<Held>, argv: Vec<Vec<u8>>, started: SystemTime) {
        self.entries.borrow_mut().push(Entry {
            held: Rc::downgrade(held),
            argv,
            started,
        });
    }

    /// Every process still held, in pid order (running before exited for
    /// a pid met twice).
    pub fn records(&self) -> Vec<ProcessRecord> {
        let entries = self.entries.borrow();
        let mut records: Vec<ProcessRecord> = entries
            .iter()
            .filter_map(|entry| {
                let held = entry.held.upgrade()?;
                let process = held.owner();
                let exit = process.exit();
                let (cpu_ms, memory_bytes) = match exit {
                    None => proc_stat::cpu_and_memory(process.pid()).unwrap_or_default(),
                    Some(_) => (0, 0),
                };
                Some(ProcessRecord {
                    pid: process.pid(),
                    argv: entry.argv.clone(),
                    environment: LOCAL_ENVIRONMENT.to_string(),
                    started: entry.started,
                    exit,
                    owner: held.connection().map(|connection| connection.to_string()),
                    cpu_ms,
                    memory_bytes,
                })
            })
            .collect();
        records.sort_by_key(|record| (record.pid, record.exit.is_some()));
        records
    }

    /// The process with `pid` (the running one if the pid was reused).
    fn find(&self, pid: u32) -> Result<Rc<Held>, Refusal> {
        let entries = self.entries.borrow();
        let mut found: Vec<Rc<Held>> = entries
            .iter()
            .filter_map(|entry| entry.held.upgrade())
            .filter(|held| held.owner().pid() == pid)
            .collect();
        found.sort_by_key(|held| held.owner().exit().is_some());
        found.into_iter().next().ok_or_else(|| {
            Refusal::new(
                RefusalKind::InvalidArgument,
                format!("this server holds no process {pid}"),
            )
        })
    }
}

/// The admin socket's bootstrap.
pub struct AdminImpl {
    context: Rc<ServerContext>,
}

impl AdminImpl {
    pub fn new(context: Rc<ServerContext>) -> AdminImpl {
        AdminImpl { context }
    }
}

impl admin::Server for AdminImpl {
    async fn list(
        self: Rc<Self>,
        _: admin::ListParams,
        mut results: admin::ListResults,
    ) -> Result<(), capnp::Error> {
        let records = self.context.processes().records();
        let mut list = results.get().init_processes(records.len() as u32);
        for (index, record) in records.iter().enumerate() {
            wire::process_record_to_wire(record, list.reborrow().get(index as u32));
        }
        Ok(())
    }

    async fn observe(
        self: Rc<Self>,
        params: admin::ObserveParams,
        mut results: admin::ObserveResults,
    ) -> Result<(), capnp::Error> {
        let held = self.context.processes().find(params.get()?.get_pid())?;
        let view = ProcessImpl::observer_of(&held);
        results.get().set_view(capnp_rpc::new_client(view));
        Ok(())
    }

    async fn upgrade(
        self: Rc<Self>,
        _: admin::UpgradeParams,
        _: admin::UpgradeResults,
    ) -> Result<(), capnp::Error> {
        Ok(self.context.upgrade().await?)
    }

    async fn last_upgrade(
        self: Rc<Self>,
        _: admin::LastUpgradeParams,
        mut results: admin::LastUpgradeResults,
    ) -> Result<(), capnp::Error> {
        if let Some(failure) = self.context.failed_upgrade() {
            results.get().set_failure(&failure);
        }
        Ok(())
    }

    async fn terminate(
        self: Rc<Self>,
        params: admin::TerminateParams,
        mut results: admin::TerminateResults,
    ) -> Result<(), capnp::Error> {
        let pid = params.get()?.get_pid();
        let held = self.context.processes().find(pid)?;
        let was_running = held.owner().terminate();
        tracing::info!(pid, was_running, "terminated by the admin");
        results.get().set_was_running(was_running);
        Ok(())
    }
}
