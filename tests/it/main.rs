//! The integration tests of the library and the server, as one binary:
//! every area of the contract in a module of its own, most of them run
//! against every backend (see `common::backend_tests!`). The process is a
//! subreaper, as `capexec` is, so tests that wait for child processes of
//! their own are elsewhere: `tests/cli/` (the command line), and
//! `tests/pid_reuse.rs` and `tests/per_child_mode.rs` (other reaping modes).

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod abuse;
mod admin;
mod bad_requests;
mod call_order;
mod chain;
mod confinement_escapes;
mod descriptors;
mod direct_channels;
mod directory_executor;
mod exhaustion;
mod facets;
mod files;
mod forwarding_fields;
mod handles;
mod hostile_bytes;
mod hostile_rpc;
mod layering;
mod mcp_files;
mod method_table;
mod network;
mod ports;
mod process_contract;
mod process_ports;
mod read_only_inside;
mod recovery;
mod resource_usage;
mod restricted;
mod sandbox;
mod sandbox_fallback;
mod soak;
mod stdio_handoff;
mod terminal_contract;
mod timeouts;
mod tls;
mod working_dir;
