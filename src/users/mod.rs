//! Logins as Unix users: the accounts, the `--user-map` that names them,
//! and the worker process that serves one user's logins with that user's
//! credentials, so that the kernel applies the user's rights to every
//! file, signal and port (see docs/design/logins-as-users.md).
//!
//! Plain code on the operating system's databases and calls: nothing here
//! knows Cap'n Proto.

mod account;
mod map;
mod monitor;
mod worker;

pub use self::account::{Account, AccountError};
pub use self::map::{Evidence, UserMap};
pub use self::monitor::{
    Granted, Handed, MonitorSetup, MonitorUpgrade, TokenCheck, WorkerRecord, ask_for_certificate,
    ask_for_token, ask_for_upgrade, handle_monitor_signals, receive_handed, serve_monitor,
    worker_admin_socket,
};
pub use self::worker::{
    Program, WorkerError, log_label, relay_from, relay_stderr, spawn_as, spawn_worker,
};
