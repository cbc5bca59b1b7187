//! `capexec mcp` driven as an MCP client drives it: newline-delimited
//! JSON-RPC on its stdin and stdout (initialize, tools/list, tools/call,
//! notifications), with its processes on the embedded executor and on a
//! real `capexec serve` over a Unix socket. Exact bytes, exit statuses
//! and the processes' own fate are checked, not just the answers' shape.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

// Codex as the client, with the pieces tests/codex runs it with.
#[allow(dead_code)]
#[path = "../codex/codex_home.rs"]
mod codex_home;
#[allow(dead_code)]
#[path = "../codex/scripted_model.rs"]
mod scripted_model;

mod bad_input;
mod client;
mod codex;
mod confinement;
mod conformance;
mod files;
mod hostile;
mod hostile_http;
mod http;
mod http_bad_input;
mod process;
mod python;
mod schema;
mod tools;

/// Each body as one test per backend: `embedded::NAME` and `unix::NAME`.
macro_rules! mcp_backend_tests {
    ($module:ident: $($name:ident),* $(,)?) => {
        mod embedded {
            $(#[test] fn $name() { crate::$module::$name(crate::client::Backend::Embedded) })*
        }
        mod unix {
            $(#[test] fn $name() { crate::$module::$name(crate::client::Backend::Unix) })*
        }
    };
}
pub(crate) use mcp_backend_tests;
