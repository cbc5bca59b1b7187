//! What every handle on a process can do, whichever handle it is: a plain
//! [`RemoteProcess`] or a [`ResilientProcess`], which recovers from broken
//! connections. The one trait keeps their surfaces from drifting apart.

use std::future::Future;
use std::time::Duration;

use futures::Stream;

use crate::client::{
    Error, EventStream, PendingWrite, RemoteProcess, ResilientEvents, ResilientProcess,
};
use crate::model::{Event, ExitStatus, ProcessSnapshot, PtySize, ReadOutcome, Signal, WriteStatus};

/// The calls of the schema's `Process`, as every handle makes them (see
/// [`RemoteProcess`] for what each does).
pub trait ProcessHandle {
    /// The process's events, in seq order until `closed`.
    type Events: Stream<Item = Result<Event, Error>> + Unpin;

    fn read(
        &self,
        after_seq: u64,
        max_bytes: u32,
        wait: Duration,
    ) -> impl Future<Output = Result<ReadOutcome, Error>>;
    fn write(
        &self,
        data: &[u8],
        write_id: &str,
    ) -> impl Future<Output = Result<WriteStatus, Error>>;
    fn write_in_order(&self, data: &[u8], write_id: &str) -> PendingWrite;
    fn close_stdin(&self) -> impl Future<Output = Result<(), Error>>;
    fn signal(&self, signal: Signal) -> impl Future<Output = Result<(), Error>>;
    fn terminate(&self) -> impl Future<Output = Result<bool, Error>>;
    fn resize(&self, size: PtySize) -> impl Future<Output = Result<(), Error>>;
    fn info(&self) -> impl Future<Output = Result<ProcessSnapshot, Error>>;
    /// Every event after `after_seq`, then live ones.
    fn events(&self, after_seq: u64) -> impl Future<Output = Result<Self::Events, Error>>;
    /// The exit status, once the process has closed.
    fn wait(&self) -> impl Future<Output = Result<ExitStatus, Error>>;
    /// A read-only facet.
    fn observer(&self) -> RemoteProcess;
    /// A facet that may only feed stdin.
    fn stdin_writer(&self) -> RemoteProcess;
}

impl ProcessHandle for RemoteProcess {
    type Events = EventStream;

    fn read(
        &self,
        after_seq: u64,
        max_bytes: u32,
        wait: Duration,
    ) -> impl Future<Output = Result<ReadOutcome, Error>> {
        RemoteProcess::read(self, after_seq, max_bytes, wait)
    }
    fn write(
        &self,
        data: &[u8],
        write_id: &str,
    ) -> impl Future<Output = Result<WriteStatus, Error>> {
        RemoteProcess::write(self, data, write_id)
    }
    fn write_in_order(&self, data: &[u8], write_id: &str) -> PendingWrite {
        RemoteProcess::write_in_order(self, data, write_id)
    }
    fn close_stdin(&self) -> impl Future<Output = Result<(), Error>> {
        RemoteProcess::close_stdin(self)
    }
    fn signal(&self, signal: Signal) -> impl Future<Output = Result<(), Error>> {
        RemoteProcess::signal(self, signal)
    }
    fn terminate(&self) -> impl Future<Output = Result<bool, Error>> {
        RemoteProcess::terminate(self)
    }
    fn resize(&self, size: PtySize) -> impl Future<Output = Result<(), Error>> {
        RemoteProcess::resize(self, size)
    }
    fn info(&self) -> impl Future<Output = Result<ProcessSnapshot, Error>> {
        RemoteProcess::info(self)
    }
    fn events(&self, after_seq: u64) -> impl Future<Output = Result<EventStream, Error>> {
        RemoteProcess::events(self, after_seq)
    }
    fn wait(&self) -> impl Future<Output = Result<ExitStatus, Error>> {
        RemoteProcess::wait(self)
    }
    fn observer(&self) -> RemoteProcess {
        RemoteProcess::observer(self)
    }
    fn stdin_writer(&self) -> RemoteProcess {
        RemoteProcess::stdin_writer(self)
    }
}

impl ProcessHandle for ResilientProcess {
    type Events = ResilientEvents;

    fn read(
        &self,
        after_seq: u64,
        max_bytes: u32,
        wait: Duration,
    ) -> impl Future<Output = Result<ReadOutcome, Error>> {
        ResilientProcess::read(self, after_seq, max_bytes, wait)
    }
    fn write(
        &self,
        data: &[u8],
        write_id: &str,
    ) -> impl Future<Output = Result<WriteStatus, Error>> {
        ResilientProcess::write(self, data, write_id)
    }
    fn write_in_order(&self, data: &[u8], write_id: &str) -> PendingWrite {
        ResilientProcess::write_in_order(self, data, write_id)
    }
    fn close_stdin(&self) -> impl Future<Output = Result<(), Error>> {
        ResilientProcess::close_stdin(self)
    }
    fn signal(&self, signal: Signal) -> impl Future<Output = Result<(), Error>> {
        ResilientProcess::signal(self, signal)
    }
    fn terminate(&self) -> impl Future<Output = Result<bool, Error>> {
        ResilientProcess::terminate(self)
    }
    fn resize(&self, size: PtySize) -> impl Future<Output = Result<(), Error>> {
        ResilientProcess::resize(self, size)
    }
    fn info(&self) -> impl Future<Output = Result<ProcessSnapshot, Error>> {
        ResilientProcess::info(self)
    }
    /// Subscribes at the first poll of the stream (see
    /// [`ResilientEvents::subscribe_now`] to subscribe at once).
    fn events(&self, after_seq: u64) -> impl Future<Output = Result<ResilientEvents, Error>> {
        let events = ResilientProcess::events(self, after_seq);
        async move { Ok(events) }
    }
    fn wait(&self) -> impl Future<Output = Result<ExitStatus, Error>> {
        ResilientProcess::wait(self)
    }
    fn observer(&self) -> RemoteProcess {
        ResilientProcess::observer(self)
    }
    fn stdin_writer(&self) -> RemoteProcess {
        ResilientProcess::stdin_writer(self)
    }
}
