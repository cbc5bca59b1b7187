//! `Process`: the capability that owns one child of the engine.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use capnp::Error;
use capnp::capability::Rc;

use crate::capexec_capnp::process;
use crate::engine::ProcessOwner;
use crate::rpc::convert;
use crate::rpc::detach::Held;
use crate::rpc::subscription::SubscriptionImpl;

/// Largest accepted `read.waitMs`: one hour.
pub const MAX_WAIT_MS: u32 = 3_600_000;

/// capnp drops this object when the last client reference to it is
/// released. When the last object for a process goes, the process is
/// terminated (its [`ProcessOwner`] drops), or parked if it is detachable.
pub struct ProcessImpl {
    held: std::rc::Rc<Held>,
}

impl ProcessImpl {
    pub(crate) fn new(held: std::rc::Rc<Held>) -> ProcessImpl {
        held.attach();
        ProcessImpl { held }
    }

    fn owner(&self) -> &ProcessOwner {
        self.held.owner()
    }
}

impl Drop for ProcessImpl {
    fn drop(&mut self) {
        self.held.detach_capability();
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
        let handle = self.owner().handle();
        drop(self);
        let outcome = handle
            .read(
                params.get_after_seq(),
                params.get_max_bytes() as usize,
                Duration::from_millis(u64::from(wait_ms)),
            )
            .await
            .map_err(|error| Error::failed(error.to_string()))?;
        let mut result = results.get().init_result();
        convert::events_to_wire(
            &outcome.events,
            result.reborrow().init_events(outcome.events.len() as u32),
        );
        result.set_next_seq(outcome.next_seq);
        result.set_closed(outcome.closed);
        match &outcome.exit {
            Some(status) => convert::exit_status_to_wire(status, result.get_exit().init_exited()),
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
            self.owner()
                .submit_write(data, write_id)
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
        let ticket = self.owner().submit_close_stdin();
        drop(self);
        async move {
            ticket.done().await;
            Ok(())
        }
    }

    async fn signal(
        self: Rc<Self>,
        params: process::SignalParams,
        _: process::SignalResults,
    ) -> Result<(), Error> {
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
        self.owner()
            .signal(signal)
            .map_err(|error| Error::failed(format!("cannot send {signal}: {error}")))
    }

    async fn terminate(
        self: Rc<Self>,
        _: process::TerminateParams,
        mut results: process::TerminateResults,
    ) -> Result<(), Error> {
        results.get().set_running(self.owner().terminate());
        Ok(())
    }

    async fn subscribe(
        self: Rc<Self>,
        params: process::SubscribeParams,
        mut results: process::SubscribeResults,
    ) -> Result<(), Error> {
        let params = params.get()?;
        let sink = params.get_sink()?;
        let after_seq = params.get_after_seq();
        let newest = self.owner().snapshot().next_seq - 1;
        if after_seq > newest {
            return Err(Error::failed(format!(
                "afterSeq {after_seq} is past the newest event of the process ({newest})"
            )));
        }
        let subscription = SubscriptionImpl::start(self.owner().handle(), sink, after_seq);
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
        let size = params.get()?.get_size()?;
        self.owner()
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
        let token = self.held.make_detachable(grace)?;
        results.get().set_restore_token(&token);
        Ok(())
    }

    async fn info(
        self: Rc<Self>,
        _: process::InfoParams,
        mut results: process::InfoResults,
    ) -> Result<(), Error> {
        convert::snapshot_to_wire(&self.owner().snapshot(), results.get().init_info());
        Ok(())
    }
}
