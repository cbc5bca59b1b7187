//! `Process`: the capability that owns one child of the engine, and its
//! attenuated facets (a read-only view, a stdin writer), which speak the
//! same interface but may do less and do not keep the process alive.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use capnp::Error;
use capnp::capability::Rc;

use crate::capexec_capnp::process;
use crate::engine::Process;
use crate::rpc::convert;
use crate::rpc::detach::Held;
use crate::rpc::quota::Ticket;
use crate::rpc::subscription::SubscriptionImpl;

/// Largest accepted `read.waitMs`: one hour.
pub const MAX_WAIT_MS: u32 = 3_600_000;

/// capnp drops this object when the last client reference to it is
/// released. When the last owner's object for a process goes, the process
/// is terminated (its owner drops), or parked if it is detachable; facets
/// never keep it alive.
pub struct ProcessImpl {
    access: Access,
}

/// What a `Process` capability may do.
enum Access {
    /// Everything; shares the process's ownership.
    Owner(std::rc::Rc<Held>),
    /// `read`, `subscribe`, `info` and `observer`.
    Observer(Facet),
    /// `write`, `closeStdin` and `info`; its write ids are its own.
    StdinWriter(Facet, u64),
}

/// What a facet holds: the engine's non-owning handle (which keeps the
/// process's record, not the process), and the owner's place in its
/// connection's quota, so records kept by facets still count there.
struct Facet {
    process: Process,
    quota: std::rc::Rc<Ticket>,
}

/// Numbers stdin writers, so their write ids never meet the owner's or
/// each other's.
static WRITERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl ProcessImpl {
    pub(crate) fn new(held: std::rc::Rc<Held>) -> ProcessImpl {
        held.attach();
        ProcessImpl {
            access: Access::Owner(held),
        }
    }

    /// The engine's handle, whatever the facet (does not keep the process
    /// alive).
    fn process(&self) -> &Process {
        match &self.access {
            Access::Owner(held) => held.owner(),
            Access::Observer(facet) | Access::StdinWriter(facet, _) => &facet.process,
        }
    }

    fn facet(&self) -> Option<&'static str> {
        match self.access {
            Access::Owner(_) => None,
            Access::Observer(_) => {
                Some("an observer, which may only read, subscribe, ask for info and make observers")
            }
            Access::StdinWriter(..) => {
                Some("a stdin writer, which may only write, close stdin and ask for info")
            }
        }
    }

    /// The owner's share, or the refusal of `call` on a facet.
    fn owner(&self, call: &str) -> Result<&std::rc::Rc<Held>, Error> {
        match &self.access {
            Access::Owner(held) => Ok(held),
            _ => Err(self.forbidden(call)),
        }
    }

    /// The process, if this capability may `call` reads.
    fn reader(&self, call: &str) -> Result<&Process, Error> {
        match &self.access {
            Access::StdinWriter(..) => Err(self.forbidden(call)),
            _ => Ok(self.process()),
        }
    }

    /// The process, if this capability may `call` stdin.
    fn feeder(&self, call: &str) -> Result<&Process, Error> {
        match &self.access {
            Access::Observer(_) => Err(self.forbidden(call)),
            _ => Ok(self.process()),
        }
    }

    /// The quota place this capability's process holds.
    fn quota_share(&self) -> std::rc::Rc<Ticket> {
        match &self.access {
            Access::Owner(held) => held.quota_share(),
            Access::Observer(facet) | Access::StdinWriter(facet, _) => {
                std::rc::Rc::clone(&facet.quota)
            }
        }
    }

    fn forbidden(&self, call: &str) -> Error {
        let facet = self.facet().unwrap_or("the owner");
        Error::failed(format!(
            "`{call}` is not allowed: this capability is {facet} [capexec:forbidden]"
        ))
    }
}

impl Drop for ProcessImpl {
    fn drop(&mut self) {
        if let Access::Owner(held) = &self.access {
            held.detach_capability();
        }
    }
}

impl process::Server for ProcessImpl {
    async fn read(
        self: Rc<Self>,
        params: process::ReadParams,
        mut results: process::ReadResults,
    ) -> Result<(), Error> {
        let params = params.get()?;
        let wait_ms = params.get_wait_ms();
        if wait_ms > MAX_WAIT_MS {
            return Err(Error::failed(format!(
                "waitMs {wait_ms} exceeds the maximum of {MAX_WAIT_MS}"
            )));
        }
        // A long poll must not keep the process alive after its owner let go.
        let handle = self.reader("read")?.clone();
        let owner = matches!(self.access, Access::Owner(_));
        drop(self);
        let (after_seq, max_bytes) = (params.get_after_seq(), params.get_max_bytes() as usize);
        let wait = Duration::from_millis(u64::from(wait_ms));
        // Only the owner's reads consume (lossless mode): an observer must
        // not make the owner lose output.
        let outcome = if owner {
            handle.read(after_seq, max_bytes, wait).await
        } else {
            handle.watch(after_seq, max_bytes, wait).await
        }
        .map_err(|error| Error::failed(error.to_string()))?;
        let details = convert::ExitDetails::of(&handle);
        let mut result = results.get().init_result();
        convert::events_to_wire(
            &outcome.events,
            result.reborrow().init_events(outcome.events.len() as u32),
            details,
        );
        result.set_next_seq(outcome.next_seq);
        result.set_closed(outcome.closed);
        match &outcome.exit {
            Some(status) => {
                convert::exit_to_wire(status, details, result.get_exit().init_exited());
            }
            None => result.get_exit().set_running(()),
        }
        Ok(())
    }

    // Not `async fn`: the write is queued while the call is dispatched, so
    // writes reach stdin in the order the calls arrived.
    fn write(
        self: Rc<Self>,
        params: process::WriteParams,
        mut results: process::WriteResults,
    ) -> impl Future<Output = Result<(), Error>> + 'static {
        let ticket = (|| {
            let params = params.get()?;
            let data = Bytes::copy_from_slice(params.get_data()?);
            let write_id = params
                .get_write_id()?
                .to_str()
                .map_err(|_| Error::failed("writeId is not valid UTF-8".to_string()))?;
            // Each capability has its own write ids: a writer cannot make the
            // owner's writes (or another writer's) look like repeats.
            if write_id.is_empty() {
                return Err(Error::failed(
                    crate::engine::WriteError::EmptyWriteId.to_string(),
                ));
            }
            let write_id = match &self.access {
                Access::StdinWriter(_, number) => format!("w{number}:{write_id}"),
                _ => format!("o:{write_id}"),
            };
            self.feeder("write")?
                .submit_write(data, &write_id)
                .map_err(|error| Error::failed(error.to_string()))
        })();
        drop(self);
        async move {
            let status = ticket?.outcome().await;
            results
                .get()
                .set_status(convert::write_status_to_wire(status));
            Ok(())
        }
    }

    fn close_stdin(
        self: Rc<Self>,
        _: process::CloseStdinParams,
        _: process::CloseStdinResults,
    ) -> impl Future<Output = Result<(), Error>> + 'static {
        let ticket = self.feeder("closeStdin").map(Process::submit_close_stdin);
        drop(self);
        async move {
            ticket?.done().await;
            Ok(())
        }
    }

    async fn signal(
        self: Rc<Self>,
        params: process::SignalParams,
        _: process::SignalResults,
    ) -> Result<(), Error> {
        let owner = self.owner("signal")?;
        let signal = match params.get()?.get_signal() {
            Ok(signal) => convert::signal_from_wire(signal),
            Err(capnp::NotInSchema(ordinal)) => {
                return Err(Error::failed(format!(
                    "unknown signal (ordinal {ordinal} is not in this server's schema)"
                )));
            }
        };
        let Some(signal) = signal else {
            return Err(Error::failed(
                "signal must name a signal, not `unknown`".to_string(),
            ));
        };
        owner
            .owner()
            .signal(signal)
            .map_err(|error| Error::failed(format!("cannot send {signal}: {error}")))
    }

    async fn terminate(
        self: Rc<Self>,
        _: process::TerminateParams,
        mut results: process::TerminateResults,
    ) -> Result<(), Error> {
        results
            .get()
            .set_running(self.owner("terminate")?.owner().terminate());
        Ok(())
    }

    async fn subscribe(
        self: Rc<Self>,
        params: process::SubscribeParams,
        mut results: process::SubscribeResults,
    ) -> Result<(), Error> {
        let process = self.reader("subscribe")?;
        let params = params.get()?;
        let sink = params.get_sink()?;
        let after_seq = params.get_after_seq();
        let newest = process.snapshot().next_seq - 1;
        if after_seq > newest {
            return Err(Error::failed(format!(
                "afterSeq {after_seq} is past the newest event of the process ({newest})"
            )));
        }
        let owner = matches!(self.access, Access::Owner(_));
        let subscription = SubscriptionImpl::start(process.clone(), sink, after_seq, owner);
        results
            .get()
            .set_subscription(capnp_rpc::new_client(subscription));
        Ok(())
    }

    async fn resize(
        self: Rc<Self>,
        params: process::ResizeParams,
        _: process::ResizeResults,
    ) -> Result<(), Error> {
        let owner = self.owner("resize")?;
        let size = params.get()?.get_size()?;
        owner
            .owner()
            .resize(crate::model::PtySize {
                rows: size.get_rows(),
                cols: size.get_cols(),
            })
            .map_err(|error| Error::failed(error.to_string()))
    }

    async fn detachable(
        self: Rc<Self>,
        params: process::DetachableParams,
        mut results: process::DetachableResults,
    ) -> Result<(), Error> {
        let grace = Duration::from_secs(params.get()?.get_grace_secs().into());
        let token = self.owner("detachable")?.make_detachable(grace)?;
        results.get().set_restore_token(&token);
        Ok(())
    }

    async fn info(
        self: Rc<Self>,
        _: process::InfoParams,
        mut results: process::InfoResults,
    ) -> Result<(), Error> {
        convert::snapshot_to_wire(&self.process().snapshot(), results.get().init_info());
        Ok(())
    }

    async fn observer(
        self: Rc<Self>,
        _: process::ObserverParams,
        mut results: process::ObserverResults,
    ) -> Result<(), Error> {
        let facet = Facet {
            process: self.reader("observer")?.clone(),
            quota: self.quota_share(),
        };
        let view = ProcessImpl {
            access: Access::Observer(facet),
        };
        results.get().set_view(capnp_rpc::new_client(view));
        Ok(())
    }

    async fn stdin_writer(
        self: Rc<Self>,
        _: process::StdinWriterParams,
        mut results: process::StdinWriterResults,
    ) -> Result<(), Error> {
        let owner = self.owner("stdinWriter")?;
        let facet = Facet {
            process: owner.owner().handle(),
            quota: owner.quota_share(),
        };
        let number = WRITERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let writer = ProcessImpl {
            access: Access::StdinWriter(facet, number),
        };
        results.get().set_writer(capnp_rpc::new_client(writer));
        Ok(())
    }
}
