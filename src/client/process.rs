//! A handle on a started process, wherever it runs.

use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use tokio::task::JoinHandle;

use crate::capexec_capnp::process;
use crate::client::{Error, EventStream, OutgoingBytes, PortListener, PortStream, events, ports};
use crate::model::{
    Event, EventBody, ExitStatus, OutputStream, ProcessSnapshot, PtySize, ReadOutcome, Signal,
    WriteStatus,
};
use crate::wire;

/// Owns a process through its capability: dropping the last clone (of this
/// handle or of the capability) terminates the process on its server.
#[derive(Clone)]
pub struct RemoteProcess {
    cap: process::Client,
}

/// Sends a call on its way now. A call on an in-process capability is only
/// dispatched when its promise is first polled; spawning every call makes
/// them dispatch in the order they were made, as remote calls do.
fn dispatch<T>(
    promise: capnp::capability::Promise<T, capnp::Error>,
) -> impl std::future::Future<Output = Result<T, capnp::Error>>
where
    T: 'static,
{
    let task = tokio::task::spawn_local(promise);
    async move {
        task.await.unwrap_or_else(|error| {
            Err(capnp::Error::failed(format!(
                "a call's task failed: {error}"
            )))
        })
    }
}

/// A call already on its way (a stdin write, an end-of-file); await it
/// for the outcome.
pub struct Pending<T>(JoinHandle<Result<T, Error>>);

/// A stdin write on its way.
pub type PendingWrite = Pending<WriteStatus>;

impl<T: 'static> Pending<T> {
    /// The outcome of `call`, which runs on its own from now on.
    pub(crate) fn spawn(call: impl Future<Output = Result<T, Error>> + 'static) -> Pending<T> {
        Pending(tokio::task::spawn_local(call))
    }

    pub async fn outcome(self) -> Result<T, Error> {
        self.0.await?
    }
}

impl RemoteProcess {
    pub fn from_capability(cap: process::Client) -> RemoteProcess {
        RemoteProcess { cap }
    }

    pub fn capability(&self) -> &process::Client {
        &self.cap
    }

    /// A connection to `address` opened from the process's machine, as
    /// [`crate::client::dial`] opens one, that also ends (is reset) when
    /// the process's capability is released: a forward that cannot
    /// outlive the work it serves.
    pub async fn dial(&self, address: &str) -> Result<PortStream, Error> {
        ports::dial_with(self.cap.dial_request(), address, None).await
    }

    /// [`RemoteProcess::dial`] through a direct channel on `route` if the
    /// server grants one, as [`crate::client::dial_via`].
    pub async fn dial_via(
        &self,
        address: &str,
        route: Option<&crate::net::DirectRoute>,
    ) -> Result<PortStream, Error> {
        ports::dial_with(self.cap.dial_request(), address, route).await
    }

    /// Listens on `address` on the process's machine, as
    /// [`crate::client::listen`] does, until the process's capability is
    /// released (or the listener is dropped).
    pub async fn listen(&self, address: &str) -> Result<PortListener, Error> {
        ports::listen_with(self.cap.listen_request(), address).await
    }

    /// Events after `after_seq`; waits up to `wait` for the first one.
    pub async fn read(
        &self,
        after_seq: u64,
        max_bytes: u32,
        wait: Duration,
    ) -> Result<ReadOutcome, Error> {
        let mut request = self.cap.read_request();
        request.get().set_after_seq(after_seq);
        request.get().set_max_bytes(max_bytes);
        request.get().set_wait_ms(wire::millis_u32(wait));
        let response = dispatch(request.send().promise).await?;
        Ok(wire::read_outcome_from_wire(response.get()?.get_result()?)?)
    }

    /// Writes to the child's stdin; a retry with the same `write_id` is
    /// applied once.
    pub async fn write(&self, data: &[u8], write_id: &str) -> Result<WriteStatus, Error> {
        self.write_in_order(data, write_id).outcome().await
    }

    /// Sends a write now without waiting for its outcome. Writes sent this
    /// way reach the child in the order of the calls, so several can be in
    /// flight at once. Must be called inside a `LocalSet`.
    pub fn write_in_order(&self, data: &[u8], write_id: &str) -> PendingWrite {
        let mut request = self.cap.write_request();
        request.get().set_data(data);
        request.get().set_write_id(write_id);
        Self::answered(request.send())
    }

    /// [`Self::write_in_order`] of bytes that may leave as a segment of
    /// their own, without being copied into the message (see
    /// `net/outgoing_bytes.rs`); copied as any others when they cannot.
    pub fn write_outgoing_in_order(&self, data: &OutgoingBytes, write_id: &str) -> PendingWrite {
        Self::answered(crate::net::send_write(&self.cap, data, write_id))
    }

    /// The answer to a `write` sent.
    fn answered(
        sent: capnp::capability::RemotePromise<process::write_results::Owned>,
    ) -> PendingWrite {
        let response = dispatch(sent.promise);
        Pending::spawn(async move {
            let response = response.await?;
            Ok(wire::write_status_from_wire(response.get()?.get_status()?))
        })
    }

    /// Sends end-of-file for the child now (after every write sent before
    /// it) without waiting; the handle reports the outcome.
    pub fn close_stdin_in_order(&self) -> Pending<()> {
        let answer = dispatch(self.cap.close_stdin_request().send().promise);
        Pending::spawn(async move {
            answer.await?;
            Ok(())
        })
    }

    /// End-of-file for the child after every earlier write.
    pub async fn close_stdin(&self) -> Result<(), Error> {
        dispatch(self.cap.close_stdin_request().send().promise).await?;
        Ok(())
    }

    pub async fn signal(&self, signal: Signal) -> Result<(), Error> {
        let mut request = self.cap.signal_request();
        request.get().set_signal(wire::signal_to_wire(signal));
        dispatch(request.send().promise).await?;
        Ok(())
    }

    /// Stops reading the child's `stream` for good, as a reader that goes
    /// away in a local pipeline: its next write there gets SIGPIPE.
    pub async fn close_output(&self, stream: OutputStream) -> Result<(), Error> {
        let mut request = self.cap.close_output_request();
        request.get().set_stream(wire::stream_to_wire(stream));
        dispatch(request.send().promise).await?;
        Ok(())
    }

    /// SIGTERM, then SIGKILL after a grace; false if it had already exited.
    pub async fn terminate(&self) -> Result<bool, Error> {
        let response = dispatch(self.cap.terminate_request().send().promise).await?;
        Ok(response.get()?.get_running())
    }

    /// Changes the terminal size of a tty process.
    pub async fn resize(&self, size: PtySize) -> Result<(), Error> {
        let mut request = self.cap.resize_request();
        wire::pty_size_to_wire(size, request.get().init_size());
        dispatch(request.send().promise).await?;
        Ok(())
    }

    /// Lets the process outlive the loss of every reference to it for
    /// `grace` (rounded up to whole seconds, 1 s to a day) and returns the token that
    /// [`restore`] takes to get it back. See [`crate::client::ResilientProcess`]
    /// for a handle that does the recovering.
    ///
    /// The request is sent when this is called, not when the future is
    /// first polled, so it travels pipelined with the calls made before it.
    pub fn detachable(
        &self,
        grace: Duration,
    ) -> impl Future<Output = Result<String, Error>> + 'static + use<> {
        let mut request = self.cap.detachable_request();
        request
            .get()
            .set_grace_secs(grace.as_secs_f64().ceil().clamp(1.0, f64::from(u32::MAX)) as u32);
        let response = dispatch(request.send().promise);
        async move {
            let response = response.await?;
            let token = response.get()?.get_restore_token()?;
            Ok(token
                .to_str()
                .map_err(|_| capnp::Error::failed("the restore token is not UTF-8".to_string()))?
                .to_string())
        }
    }

    /// A read-only view of this process to hand out (read, subscribe, info
    /// and more views; everything else is refused with
    /// `[capexec:forbidden]`). It does not keep the process alive. Usable at
    /// once: pipelined on this capability.
    pub fn observer(&self) -> RemoteProcess {
        RemoteProcess::from_capability(self.cap.observer_request().send().pipeline.get_view())
    }

    /// A capability that may only write to and close the process's stdin
    /// (and ask for info), for a feeder. Only the owner's capability can
    /// make one. It does not keep the process alive. Usable at once.
    pub fn stdin_writer(&self) -> RemoteProcess {
        RemoteProcess::from_capability(self.cap.stdin_writer_request().send().pipeline.get_writer())
    }

    pub async fn info(&self) -> Result<ProcessSnapshot, Error> {
        let response = dispatch(self.cap.info_request().send().promise).await?;
        Ok(wire::snapshot_from_wire(response.get()?.get_info()?)?)
    }

    /// Every event after `after_seq`, then live ones, until `closed`.
    pub async fn events(&self, after_seq: u64) -> Result<EventStream, Error> {
        let (sink, feed) = events::sink();
        let mut request = self.cap.subscribe_request();
        request.get().set_sink(sink);
        request.get().set_after_seq(after_seq);
        let response = dispatch(request.send().promise).await?;
        let subscription = response.get()?.get_subscription()?;
        Ok(EventStream::new(feed, subscription))
    }

    /// Waits for the process to close and returns its exit status, discarding
    /// output that was not read.
    pub async fn wait(&self) -> Result<ExitStatus, Error> {
        let status = exit_from(self.events(0).await?).await;
        self.explain(status).await
    }

    /// `result`, with an end of its events before `closed` explained: a
    /// cheap call on the same capability fails with the connection's own
    /// reason (closed by the server, lost, silent), which says more than
    /// the end of a stream. [`Error::EventsEnded`] stays if the call
    /// succeeds, or says nothing within [`PROBE_WAIT`].
    pub(crate) async fn explain<T>(&self, result: Result<T, Error>) -> Result<T, Error> {
        match result {
            Err(Error::EventsEnded) => Err(self.why_events_ended().await),
            other => other,
        }
    }

    /// Why this capability's events ended early (see [`Self::explain`]).
    pub(crate) async fn why_events_ended(&self) -> Error {
        match tokio::time::timeout(PROBE_WAIT, self.info()).await {
            Ok(Err(error)) if error.is_transport_loss() => error,
            _ => Error::EventsEnded,
        }
    }
}

/// How long a call that asks why events ended may take: a connection that
/// is gone fails it at once, a silent one is given this long.
pub(crate) const PROBE_WAIT: Duration = Duration::from_secs(5);

/// The exit status from `events`, once they reach `closed`.
pub(crate) async fn exit_from(
    mut events: impl futures::Stream<Item = Result<Event, Error>> + Unpin,
) -> Result<ExitStatus, Error> {
    let mut status = None;
    while let Some(event) = events.next().await {
        match event?.body {
            EventBody::Exited(exit) => status = Some(exit.status),
            EventBody::Closed => break,
            _ => {}
        }
    }
    status.ok_or(Error::EventsEnded)
}

/// The process that `token` (from [`RemoteProcess::detachable`]) belongs to,
/// on `executor` (the one it was started on, or the same server through
/// another connection). Pipelined like [`crate::client::Command::spawn_pipelined`]:
/// the handle can be used at once; the future says whether the restore
/// worked ([`crate::model::RefusalKind::UnknownToken`] if the token is
/// unknown or expired).
pub fn restore(
    executor: &crate::capexec_capnp::executor::Client,
    token: &str,
) -> (
    RemoteProcess,
    impl std::future::Future<Output = Result<(), Error>> + 'static,
) {
    let mut request = executor.restore_request();
    request.get().set_token(token);
    let sent = request.send();
    let process = RemoteProcess::from_capability(sent.pipeline.get_process());
    let answer = sent.promise;
    (process, async move {
        answer.await.map(drop).map_err(Error::from)
    })
}
