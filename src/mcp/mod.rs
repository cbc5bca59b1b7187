//! `capexec mcp`: processes (and files) of a capexec executor as the tools
//! of a Model Context Protocol server, for coding agents.
//!
//! Like the CLI and the Codex bridge, this is a client of the
//! capabilities: commands start on an `Executor` (by default the confined
//! one of the root `Directory`, `Directory.executor`), their output is
//! read from each `Process`'s seq-numbered log, files go through the
//! root's `Directory`.
//!
//! Two threads (see `seam`): rmcp serves MCP on a runtime of its own, its
//! handlers `Send` ([`McpSession`]); every capability lives on the
//! capability thread, in a `LocalSet`, whose state is `local::Local`.
//! The [`Mcp`] factory makes one [`McpSession`] per MCP session, so a
//! transport with many sessions (Streamable HTTP) makes one per session
//! from the same factory; stdio has one ([`serve_stdio`]).

pub mod files;
pub mod http;
mod local;
mod output;
mod process;
pub mod seam;
mod server;
mod tools;
pub mod types;

use std::path::PathBuf;
use std::rc::Rc;

use tokio::sync::mpsc;

use crate::capexec_capnp::executor;
use crate::client::Directory;
use crate::model::{Network, Policy, Sandbox};

pub use server::{Mcp, McpSession};
pub use tools::Confinement;

/// How `capexec mcp` serves.
#[derive(Clone, Debug)]
pub struct Options {
    /// The root: an absolute path on the executor's machine.
    pub root: PathBuf,
    /// Commands start through the root's confined executor (else the
    /// plain one: --unconfined).
    pub confined: bool,
    /// The network of confined commands.
    pub network: Network,
    /// A session's processes outlive it (detached on the executor for a
    /// day) instead of ending with it.
    pub keep_processes: bool,
}

/// The capability thread's half, to run there with
/// [`Capabilities::serve`].
pub struct Capabilities {
    local: Rc<local::Local>,
    jobs: seam::Jobs<local::Local>,
    ends: mpsc::UnboundedReceiver<u64>,
}

impl Capabilities {
    /// Serves the sessions' calls until every [`Mcp`] and [`McpSession`]
    /// is gone, then ends what their sessions left. Inside a `LocalSet`.
    pub async fn serve(self) {
        self.local.clone().serve(self.jobs, self.ends).await;
    }
}

/// The two halves of a server on `executor`: the [`Mcp`] factory (`Send`,
/// for the MCP thread) and the [`Capabilities`] it calls. Called on the
/// capability thread.
pub fn prepare(executor: &executor::Client, options: &Options) -> (Mcp, Capabilities) {
    let directory = Directory::open(executor, &options.root);
    let commands = if !options.confined {
        executor.clone()
    } else if options.network == Network::None {
        // Writes only beneath the root, starts only in it, no network.
        directory.executor()
    } else {
        // `Directory.executor` has no network and restricting only
        // narrows: the same policy, with the network, on the executor.
        crate::client::restrict(
            executor,
            &Policy {
                cwd_roots: Some(vec![options.root.clone()]),
                sandbox: Some(Sandbox {
                    writable: vec![options.root.clone()],
                    network: Network::All,
                    ..Sandbox::default()
                }),
                ..Policy::default()
            },
        )
    };
    let confinement = Confinement {
        root: options.root.clone(),
        confined: options.confined,
        network: options.network == Network::All,
        keep_processes: options.keep_processes,
    };
    let (seam, jobs) = seam::channel();
    let (ends, ended) = mpsc::unbounded_channel();
    let local = local::Local::new(
        commands,
        directory,
        options.root.clone(),
        options.keep_processes,
    );
    (
        Mcp::new(seam, ends, &confinement),
        Capabilities {
            local,
            jobs,
            ends: ended,
        },
    )
}

/// Serves one MCP session on stdin and stdout, on a thread of its own
/// (the MCP thread), until the client closes stdin. The thread's result
/// says why the session ended, if not by that.
pub fn serve_stdio(mcp: Mcp) -> std::io::Result<std::thread::JoinHandle<Result<(), String>>> {
    std::thread::Builder::new()
        .name("mcp-stdio".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|error| format!("cannot start the MCP runtime: {error}"))?;
            let served = runtime.block_on(async move {
                use rmcp::ServiceExt as _;
                let session = mcp.session();
                // The factory goes: once the session ends, nothing holds
                // the capability thread's queue open.
                drop(mcp);
                let running = session
                    .serve(rmcp::transport::stdio())
                    .await
                    .map_err(|error| format!("the MCP session did not start: {error}"))?;
                running
                    .waiting()
                    .await
                    .map(drop)
                    .map_err(|error| format!("the MCP session failed: {error}"))
            });
            // rmcp's stdin reader may still be blocked in read(2): it is
            // not waited for.
            runtime.shutdown_background();
            served
        })
}
