//! The command line, as one binary: `capexec run`, `serve` and the other
//! subcommands driven as a user drives them (real processes, real sockets,
//! terminals), each area in a module of its own. This process waits for
//! the children it starts, so it never becomes a subreaper (unlike
//! `tests/it/`).

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod admin;
mod chain;
mod copy;
mod deadlines;
mod errors;
mod forward;
mod habits;
mod idle;
mod local_inputs;
mod metrics;
mod network;
mod operator;
mod output;
mod relayed_stdin;
mod restricted;
mod resume;
mod run;
mod sandbox;
mod security;
mod service;
mod stdio_handoff;
mod tty;
mod upgrade;
mod users;
