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

/// The calls every handle makes the same way, delegated to its own
/// methods of the same names.
macro_rules! delegate_process_calls {
    ($handle:ident) => {
        fn read(
            &self,
            after_seq: u64,
            max_bytes: u32,
            wait: Duration,
        ) -> impl Future<Output = Result<ReadOutcome, Error>> {
            $handle::read(self, after_seq, max_bytes, wait)
        }
        fn write(
            &self,
            data: &[u8],
            write_id: &str,
        ) -> impl Future<Output = Result<WriteStatus, Error>> {
            $handle::write(self, data, write_id)
        }
        fn write_in_order(&self, data: &[u8], write_id: &str) -> PendingWrite {
            $handle::write_in_order(self, data, write_id)
        }
        fn close_stdin(&self) -> impl Future<Output = Result<(), Error>> {
            $handle::close_stdin(self)
        }
        fn signal(&self, signal: Signal) -> impl Future<Output = Result<(), Error>> {
            $handle::signal(self, signal)
        }
        fn terminate(&self) -> impl Future<Output = Result<bool, Error>> {
            $handle::terminate(self)
        }
        fn resize(&self, size: PtySize) -> impl Future<Output = Result<(), Error>> {
            $handle::resize(self, size)
        }
        fn info(&self) -> impl Future<Output = Result<ProcessSnapshot, Error>> {
            $handle::info(self)
        }
        fn wait(&self) -> impl Future<Output = Result<ExitStatus, Error>> {
            $handle::wait(self)
        }
        fn observer(&self) -> RemoteProcess {
            $handle::observer(self)
        }
        fn stdin_writer(&self) -> RemoteProcess {
            $handle::stdin_writer(self)
        }
    };
}

impl ProcessHandle for RemoteProcess {
    type Events = EventStream;

    delegate_process_calls!(RemoteProcess);

    fn events(&self, after_seq: u64) -> impl Future<Output = Result<EventStream, Error>> {
        RemoteProcess::events(self, after_seq)
    }
}

impl ProcessHandle for ResilientProcess {
    type Events = ResilientEvents;

    delegate_process_calls!(ResilientProcess);

    /// Subscribes at the first poll of the stream (see
    /// [`ResilientEvents::subscribe_now`] to subscribe at once).
    fn events(&self, after_seq: u64) -> impl Future<Output = Result<ResilientEvents, Error>> {
        let events = ResilientProcess::events(self, after_seq);
        async move { Ok(events) }
    }
}
