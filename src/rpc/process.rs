//! `Process`: the capability that owns one child of the engine, and its
//! attenuated facets (a read-only view, a stdin writer), which speak the
//! same interface but may do less and do not keep the process alive.

use std::future::Future;
use std::time::Duration;

use std::rc::Rc;

use capnp::Error;

use crate::capexec_capnp::process;
use crate::engine::Process;
use crate::model::{PtySize, Refusal, RefusalKind};
use crate::rpc::detach::Held;
use crate::rpc::ports::{DialParams, DialResults, ListenParams, ListenResults, ProcessPorts};
use crate::rpc::quota::Ticket;
use crate::rpc::subscription::SubscriptionImpl;
use crate::wire;

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
    /// Everything; shares the process's ownership, and ends the forwards
    /// made through it when it goes.
    Owner(Rc<Held>, ProcessPorts),
    /// [`OBSERVER_CALLS`].
    Observer(Facet),
    /// [`STDIN_WRITER_CALLS`]; its write ids are its own.
    StdinWriter(Facet, u64),
}

/// The features of the schema this server's processes implement (see
/// `ExecutorInfo.features`); a new `Process` method adds its name here.
pub(crate) const PROCESS_FEATURES: &[&str] = &[
    "read",
    "write",
    "write-id",
    "close-stdin",
    "signal",
    "terminate",
    "subscribe",
    "lossless",
    "tty",
    "resize",
    "process-info",
    "detach",
    "facets",
    "timeout",
    "usage",
    "process-ports",
    "close-output",
    "shutdown-reason",
];

/// What an observer may call (the schema's `Process.observer`).
const OBSERVER_CALLS: &[&str] = &["read", "subscribe", "info", "observer"];
/// What a stdin writer may call (the schema's `Process.stdinWriter`).
const STDIN_WRITER_CALLS: &[&str] = &["write", "closeStdin", "info"];

/// A call as a refusal names it, for people.
fn call_in_words(call: &str) -> &str {
    match call {
        "info" => "ask for info",
        "observer" => "make observers",
        "closeStdin" => "close stdin",
        "closeOutput" => "close output",
        other => other,
    }
}

/// "a, b and c".
fn in_words(calls: &[&str]) -> String {
    let words: Vec<&str> = calls.iter().map(|call| call_in_words(call)).collect();
    match words.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => words.join(""),
    }
}

/// What a facet holds: the engine's non-owning handle (which keeps the
/// process's record, not the process), and the owner's place in its
/// connection's quota, so records kept by facets still count there.
struct Facet {
    process: Process,
    quota: Rc<Ticket>,
}

/// Numbers stdin writers, so their write ids never meet the owner's or
/// each other's.
static WRITERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl ProcessImpl {
    pub(crate) fn new(held: Rc<Held>, ports: ProcessPorts) -> ProcessImpl {
        held.capability_made();
        ProcessImpl {
            access: Access::Owner(held, ports),
        }
    }

    /// An observer facet of `held`'s process, as `observer` makes one (for
    /// the admin capability).
    pub(crate) fn observer_of(held: &Held) -> ProcessImpl {
        ProcessImpl {
            access: Access::Observer(Facet {
                process: held.owner().handle(),
                quota: held.quota_share(),
            }),
        }
    }

    /// The engine's handle, whatever the facet (does not keep the process
    /// alive).
    fn process(&self) -> &Process {
        match &self.access {
            Access::Owner(held, _) => held.owner(),
            Access::Observer(facet) | Access::StdinWriter(facet, _) => &facet.process,
        }
    }

    /// The refusal of `call` if this capability may not make it.
    fn check(&self, call: &str) -> Result<(), Refusal> {
        let (facet, allowed) = match &self.access {
            Access::Owner(..) => return Ok(()),
            Access::Observer(_) => ("an observer", OBSERVER_CALLS),
            Access::StdinWriter(..) => ("a stdin writer", STDIN_WRITER_CALLS),
        };
        if allowed.contains(&call) {
            return Ok(());
        }
        Err(Refusal::new(
            RefusalKind::Forbidden,
            format!(
                "`{call}` is not allowed: this capability is {facet}, which may only {}",
                in_words(allowed)
            ),
        ))
    }

    /// The owner's share, if this capability may make `call`.
    fn owner(&self, call: &str) -> Result<&Rc<Held>, Refusal> {
        self.owned(call).map(|(held, _)| held)
    }

    /// The owner's share and forwards, if this capability may make `call`.
    fn owned(&self, call: &str) -> Result<(&Rc<Held>, &ProcessPorts), Refusal> {
        self.check(call)?;
        match &self.access {
            Access::Owner(held, ports) => Ok((held, ports)),
            _ => unreachable!("only owners may make calls beyond the facets'"),
        }
    }

    /// The process, if this capability may make `call`.
    fn allowed(&self, call: &str) -> Result<&Process, Refusal> {
        self.check(call)?;
        Ok(self.process())
    }

    /// The quota place this capability's process holds.
    fn quota_share(&self) -> Rc<Ticket> {
        match &self.access {
            Access::Owner(held, _) => held.quota_share(),
            Access::Observer(facet) | Access::StdinWriter(facet, _) => Rc::clone(&facet.quota),
        }
    }
}

fn invalid(message: String) -> Refusal {
    Refusal::new(RefusalKind::InvalidArgument, message)
}

impl Drop for ProcessImpl {
    fn drop(&mut self) {
        if let Access::Owner(held, _) = &self.access {
            held.capability_released();
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
            return Err(invalid(format!(
                "waitMs {wait_ms} exceeds the maximum of {MAX_WAIT_MS}"
            ))
            .into());
        }
        // A long poll must not keep the process alive after its owner let go.
        let handle = self.allowed("read")?.clone();
        let owner = matches!(self.access, Access::Owner(..));
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
        .map_err(Refusal::from)?;
        wire::read_outcome_to_wire(&outcome, results.get().init_result());
        Ok(())
    }

    // Not `async fn`: the write is queued while the call is dispatched, so
    // writes reach stdin in the order the calls arrived.
    fn write(
        self: Rc<Self>,
        params: process::WriteParams,
        mut results: process::WriteResults,
    ) -> impl Future<Output = Result<(), Error>> + 'static {
        let ticket = (|| -> Result<_, Error> {
            let process = self.allowed("write")?;
            let params = params.get()?;
            // A slice of its message if that holds at most twice the data:
            // the stdin queue counts the data's bytes
            // (`engine::MAX_QUEUED_STDIN_BYTES`).
            let data =
                wire::received::bytes_of(params.get_data()?, wire::received::COUNTED_HELD_PER_BYTE);
            let write_id = params
                .get_write_id()?
                .to_str()
                .map_err(|_| invalid("writeId is not valid UTF-8".to_string()))?;
            // Each capability has its own write ids: a writer cannot make the
            // owner's writes (or another writer's) look like repeats.
            if write_id.is_empty() {
                return Err(Refusal::from(crate::engine::WriteError::EmptyWriteId).into());
            }
            if write_id.len() > crate::engine::MAX_WRITE_ID_BYTES {
                return Err(Refusal::from(crate::engine::WriteError::LongWriteId {
                    len: write_id.len(),
                })
                .into());
            }
            let write_id = match &self.access {
                Access::StdinWriter(_, number) => format!("w{number}:{write_id}"),
                _ => format!("o:{write_id}"),
            };
            Ok(process
                .submit_write(data, &write_id)
                .map_err(Refusal::from)?)
        })();
        drop(self);
        async move {
            let status = ticket?.outcome().await;
            results.get().set_status(wire::write_status_to_wire(status));
            Ok(())
        }
    }

    fn close_stdin(
        self: Rc<Self>,
        _: process::CloseStdinParams,
        _: process::CloseStdinResults,
    ) -> impl Future<Output = Result<(), Error>> + 'static {
        let ticket = self.allowed("closeStdin").map(Process::submit_close_stdin);
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
            Ok(signal) => wire::signal_from_wire(signal),
            Err(capnp::NotInSchema(ordinal)) => {
                return Err(invalid(format!(
                    "unknown signal (ordinal {ordinal} is not in this server's schema)"
                ))
                .into());
            }
        };
        let Some(signal) = signal else {
            return Err(invalid("signal must name a signal, not `unknown`".to_string()).into());
        };
        owner.owner().signal(signal).map_err(|error| {
            Refusal::new(
                RefusalKind::Internal,
                format!("cannot send {signal}: {error}"),
            )
            .into()
        })
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
        let process = self.allowed("subscribe")?;
        let params = params.get()?;
        let sink = params.get_sink()?;
        let after_seq = params.get_after_seq();
        process.check_after_seq(after_seq).map_err(Refusal::from)?;
        let owner = matches!(self.access, Access::Owner(..));
        let subscription = SubscriptionImpl::start(process.clone(), sink, after_seq, owner);
        results
            .get()
            .set_subscription(capnp_rpc::new_client(subscription));
        Ok(())
    }

    async fn close_output(
        self: Rc<Self>,
        params: process::CloseOutputParams,
        _: process::CloseOutputResults,
    ) -> Result<(), Error> {
        let owner = self.owner("closeOutput")?;
        let stream = match params.get()?.get_stream() {
            Ok(stream) => wire::stream_from_wire(stream),
            Err(capnp::NotInSchema(ordinal)) => {
                return Err(invalid(format!(
                    "unknown output stream (ordinal {ordinal} is not in this server's schema)"
                ))
                .into());
            }
        };
        Ok(owner.owner().close_output(stream).map_err(Refusal::from)?)
    }

    async fn resize(
        self: Rc<Self>,
        params: process::ResizeParams,
        _: process::ResizeResults,
    ) -> Result<(), Error> {
        let owner = self.owner("resize")?;
        let size: PtySize = wire::pty_size_from_wire(params.get()?.get_size()?);
        Ok(owner.owner().resize(size).map_err(Refusal::from)?)
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
        let process = self.allowed("info")?;
        wire::snapshot_to_wire(&process.snapshot(), results.get().init_info());
        Ok(())
    }

    async fn observer(
        self: Rc<Self>,
        _: process::ObserverParams,
        mut results: process::ObserverResults,
    ) -> Result<(), Error> {
        let facet = Facet {
            process: self.allowed("observer")?.clone(),
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

    // Not `async fn`: the call must not hold this capability while it
    // connects (a release meanwhile ends the forward at once).
    fn dial(
        self: Rc<Self>,
        params: DialParams,
        results: DialResults,
    ) -> impl Future<Output = Result<(), Error>> + 'static {
        let call = self
            .owned("dial")
            .map(|(_, ports)| ports.dial(params, results));
        drop(self);
        async move { call?.await }
    }

    fn listen(
        self: Rc<Self>,
        params: ListenParams,
        results: ListenResults,
    ) -> impl Future<Output = Result<(), Error>> + 'static {
        let call = self
            .owned("listen")
            .map(|(_, ports)| ports.listen(params, results));
        drop(self);
        async move { call?.await }
    }
}
