//! Test harness: runs one test body against each executor backend.
#![allow(dead_code)]

pub mod cli;
pub mod data;
pub mod hostile;
pub mod pipe_lock;
pub mod pki;
pub mod procfs;
pub mod proxy;
pub mod server;
pub mod wait;

// Each test binary uses one or both.
#[allow(unused_imports)]
pub use wait::{eventually, eventually_async};

use std::future::Future;
use std::sync::Once;
use std::time::Duration;

use capexec::capexec_capnp::executor;
use capexec::client::{Command, RemoteProcess};
use capexec::engine::{self, Engine};
use capexec::model::ReadOutcome;
use capexec::model::{Event, EventBody, ExitStatus, OutputStream};
use capexec::net::{Address, Connection, Token};
use capexec::rpc;

/// Upper bound for any single test, far above what a loaded machine needs.
pub const TEST_DEADLINE: Duration = Duration::from_secs(120);

/// Where the executor under test runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The engine in this process, through local capabilities.
    InProcess,
    /// A server (on its own thread of this process) over a Unix socket.
    Unix,
    /// The same over TCP on loopback, logged in with a token.
    Tcp,
    /// A Unix-socket server that forwards every start to a second one
    /// (A -> B): processes run at B, the client talks to A.
    Chained,
}

/// What a test body gets.
pub struct Ctx {
    pub executor: executor::Client,
    pub backend: Backend,
    /// The process that hosts the engine (and so parents the children).
    pub server_pid: u32,
    /// The served address, for network backends.
    pub address: Option<Address>,
    pub token: Option<Token>,
    /// Where this client hands its descriptors for a start's stdio: the
    /// in-process executor's, or a Unix socket's.
    pub stdio_route: Option<rpc::StdioRoute>,
    /// Where dials open direct channels: set only by [`run_direct`], so
    /// the same test bodies run through the sinks and through channels.
    pub dial_route: Option<capexec::net::DirectRoute>,
    connection: Option<Connection>,
    server: Option<server::ServerThread>,
    /// The server at the far end of a chain, stopped after `server`.
    far_server: Option<server::ServerThread>,
}

impl Ctx {
    /// The login token file of a TCP server.
    pub fn token_file(&self) -> Option<std::path::PathBuf> {
        self.token.as_ref()?;
        Some(self.server.as_ref()?.dir.path().join("token"))
    }

    /// A second, independent client connection to the same server.
    pub async fn connect_again(&self) -> Option<Connection> {
        let address = self.address.as_ref()?;
        Some(
            capexec::net::connect(address, self.token.as_ref())
                .await
                .expect("connect again"),
        )
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // Close the client side before stopping the server.
        self.connection.take();
        self.server.take();
        self.far_server.take();
    }
}

static SUBREAPER: Once = Once::new();

pub fn init_process() {
    SUBREAPER.call_once(|| engine::become_subreaper().expect("become a subreaper"));
}

/// Runs `body` inside a `LocalSet` on a fresh two-thread runtime, within
/// the test deadline, in a process that reaps orphans (as `capexec` does).
pub fn run_local<Fut: Future<Output = ()>>(body: Fut) {
    init_process();
    run_on_runtime(body);
}

/// The same, leaving the process's reaping mode alone.
pub fn run_on_runtime<Fut: Future<Output = ()>>(body: Fut) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let local = tokio::task::LocalSet::new();
    runtime.block_on(local.run_until(async move {
        tokio::time::timeout(TEST_DEADLINE, body)
            .await
            .expect("test exceeded its deadline")
    }));
}

/// Runs `body` against `backend` on a fresh runtime.
pub fn run<F, Fut>(backend: Backend, body: F)
where
    F: FnOnce(Ctx) -> Fut,
    Fut: Future<Output = ()>,
{
    run_with(backend, false, body)
}

/// [`run`], with the client's dials asking for direct channels.
pub fn run_direct<F, Fut>(backend: Backend, body: F)
where
    F: FnOnce(Ctx) -> Fut,
    Fut: Future<Output = ()>,
{
    run_with(backend, true, body)
}

fn run_with<F, Fut>(backend: Backend, direct: bool, body: F)
where
    F: FnOnce(Ctx) -> Fut,
    Fut: Future<Output = ()>,
{
    run_local(async move {
        let ctx = match backend {
            Backend::InProcess => {
                let (executor, route) = rpc::local_executor_with_stdio_route(Engine::default());
                Ctx {
                    executor,
                    backend,
                    server_pid: std::process::id(),
                    address: None,
                    token: None,
                    stdio_route: Some(route),
                    dial_route: None,
                    connection: None,
                    server: None,
                    far_server: None,
                }
            }
            Backend::Unix | Backend::Tcp | Backend::Chained => {
                let (server, far_server) = if backend == Backend::Chained {
                    let far = server::ServerThread::start(false);
                    (server::ServerThread::start_in_front_of(&far), Some(far))
                } else {
                    (server::ServerThread::start(backend == Backend::Tcp), None)
                };
                let address = server.address.clone();
                let token = server.token.clone();
                let connection = capexec::net::connect(&address, token.as_ref())
                    .await
                    .expect("connect to the test server");
                if backend == Backend::Chained {
                    // Processes run at the far end, not at the front server.
                    let info = capexec::client::info(&connection.executor())
                        .await
                        .expect("info");
                    assert_eq!(info.environment, "b");
                }
                Ctx {
                    executor: connection.executor(),
                    backend,
                    server_pid: std::process::id(),
                    address: Some(address),
                    token,
                    stdio_route: connection.stdio_route(),
                    dial_route: connection.direct_route().filter(|_| direct),
                    connection: Some(connection),
                    server: Some(server),
                    far_server,
                }
            }
        };
        body(ctx).await;
    });
}

/// The backends by the names of the test modules that run on them.
#[allow(non_upper_case_globals)]
pub mod backend {
    use super::Backend;
    pub const in_process: Backend = Backend::InProcess;
    pub const unix: Backend = Backend::Unix;
    pub const tcp: Backend = Backend::Tcp;
    pub const chained: Backend = Backend::Chained;
}

/// Instantiates each named `async fn(Ctx)` once per backend: every backend
/// (`backend_tests!(a, b)`), or those listed
/// (`backend_tests!(on [unix, tcp]: a, b)`), each in a module named after
/// it, so that a test reads `unix::a_write_retried_after_a_cut_lands_once`.
#[macro_export]
macro_rules! backend_tests {
    (with $runner:ident on [$backend:ident $(, $rest:ident)* $(,)?]: $($name:ident),* $(,)?) => {
        mod $backend {
            $(
                #[test]
                fn $name() {
                    $crate::common::$runner($crate::common::backend::$backend, super::$name);
                }
            )*
        }
        $crate::backend_tests!(with $runner on [$($rest),*]: $($name),*);
    };
    (with $runner:ident on []: $($name:ident),* $(,)?) => {};
    (on [$($backend:ident),* $(,)?]: $($name:ident),* $(,)?) => {
        $crate::backend_tests!(with run on [$($backend),*]: $($name),*);
    };
    ($($name:ident),* $(,)?) => {
        $crate::backend_tests!(on [in_process, unix, tcp, chained]: $($name),*);
    };
}

pub fn sh(script: &str) -> Command {
    let mut command = Command::new("sh");
    command.args(["-c", script]);
    command
}

pub async fn spawn(ctx: &Ctx, command: &Command) -> RemoteProcess {
    command
        .spawn(&ctx.executor)
        .await
        .expect("start the process")
}

/// Reads (long-polling) until the close event, returning every event.
pub async fn read_until_closed(process: &RemoteProcess) -> Vec<Event> {
    read_from(process, 0).await
}

pub async fn read_from(process: &RemoteProcess, mut after: u64) -> Vec<Event> {
    let mut events = Vec::new();
    loop {
        let outcome = process
            .read(after, 0, Duration::from_secs(10))
            .await
            .expect("read");
        let done = outcome
            .events
            .iter()
            .any(|event| matches!(event.body, EventBody::Closed));
        after = outcome.next_seq - 1;
        events.extend(outcome.events);
        if done {
            return events;
        }
    }
}

/// Reads until the concatenated output contains `needle`; returns the seq
/// of the last event read.
pub async fn read_until_output_contains(process: &RemoteProcess, needle: &str) -> (u64, String) {
    let mut after = 0;
    let mut text = String::new();
    loop {
        let outcome: ReadOutcome = process
            .read(after, 0, Duration::from_secs(10))
            .await
            .expect("read");
        after = outcome.next_seq - 1;
        text.push_str(&String::from_utf8_lossy(&output_bytes(
            &outcome.events,
            None,
        )));
        if text.contains(needle) {
            return (after, text);
        }
        assert!(
            !outcome.closed,
            "closed without printing {needle:?}; got {text:?}"
        );
    }
}

/// Waits for the close without consuming anything (reads at the head).
pub async fn wait_closed_at_head(process: &RemoteProcess) {
    loop {
        let info = process.info().await.expect("info");
        if info.closed {
            return;
        }
        process
            .read(info.next_seq - 1, 1, Duration::from_secs(1))
            .await
            .expect("read");
    }
}

/// Output payload of `events`, optionally of one stream only.
pub fn output_bytes(events: &[Event], only: Option<OutputStream>) -> Vec<u8> {
    let mut bytes = Vec::new();
    for event in events {
        if let EventBody::Output { stream, data } = &event.body
            && only.is_none_or(|only| only == *stream)
        {
            bytes.extend_from_slice(data);
        }
    }
    bytes
}

/// Reads until the close, asserting that the process's timeout ended it:
/// SIGTERM, and `timed_out` in its info.
pub async fn read_until_timed_out(process: &RemoteProcess) {
    let events = read_until_closed(process).await;
    assert!(
        matches!(
            exit_of(&events),
            Some(ExitStatus::Killed {
                signal: Some(capexec::model::Signal::Term),
                ..
            })
        ),
        "{events:?}"
    );
    assert!(process.info().await.expect("info").timed_out);
}

/// `events` with the resource usage of their exit events cleared, for
/// comparing whole event sequences (usage differs from run to run).
pub fn without_usage(events: impl IntoIterator<Item = Event>) -> Vec<Event> {
    events
        .into_iter()
        .map(|mut event| {
            if let EventBody::Exited(exit) = &mut event.body {
                exit.usage = None;
            }
            event
        })
        .collect()
}

pub fn exit_of(events: &[Event]) -> Option<ExitStatus> {
    events.iter().find_map(|event| match event.body {
        EventBody::Exited(exit) => Some(exit.status),
        _ => None,
    })
}

/// Asserts the seqs are 1, 2, 3... with gaps covering exactly their ranges.
pub fn assert_contiguous(events: &[Event]) {
    let mut expected = 1;
    for event in events {
        let first = match event.body {
            EventBody::Gap { from_seq } => from_seq,
            _ => event.seq,
        };
        assert_eq!(first, expected, "seqs must be contiguous; at {event:?}");
        expected = event.seq + 1;
    }
}

/// The number printed right after `marker` and before the next `-`, as in
/// `echo "job-$!-"`.
pub fn pid_after(text: &str, marker: &str) -> u32 {
    text.rsplit(marker)
        .next()
        .and_then(|rest| rest.split('-').next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no pid after {marker:?} in {text:?}"))
}

/// A plain two-party client system over `reader` and `writer`, with none
/// of capexec's own connection set-up (for tests that play a raw peer).
pub fn raw_client_system<R, W>(
    reader: R,
    writer: W,
) -> capnp_rpc::RpcSystem<capnp_rpc::rpc_twoparty_capnp::Side>
where
    R: tokio::io::AsyncRead + Unpin + 'static,
    W: tokio::io::AsyncWrite + Unpin + 'static,
{
    use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};
    let network = capnp_rpc::twoparty::VatNetwork::new(
        futures::io::BufReader::new(reader.compat()),
        writer.compat_write(),
        capnp_rpc::rpc_twoparty_capnp::Side::Client,
        Default::default(),
    );
    capnp_rpc::RpcSystem::new(Box::new(network), None)
}
