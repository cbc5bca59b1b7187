//! `capexec mcp` driven as an MCP client drives it: newline-delimited
//! JSON-RPC on its stdin and stdout (initialize, tools/list, tools/call,
//! notifications), with its processes on the embedded executor and on a
//! real `capexec serve` over a Unix socket. Exact bytes, exit statuses
//! and the processes' own fate are checked, not just the answers' shape.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod client;
mod confinement;
mod files;
mod hostile;
mod process;
mod schema;

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
