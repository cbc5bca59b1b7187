//! `capexec serve --worker FD`: one user's worker. A server that maps
//! logins to users starts it with the user's credentials (see
//! `capexec::users::spawn_worker`) and hands it, at FD, a stream socket
//! whose peer has logged in already; it serves the executor there, with
//! the server's limits, until that peer goes.

use std::os::fd::{FromRawFd, OwnedFd};

use crate::cli::{EXIT_CAPEXEC_FAILURE, ServeArgs, serve};

pub fn main(fd: i32, args: &ServeArgs) -> i32 {
    // Only a descriptor this process was given: 0-2 are stdio.
    // SAFETY: F_GETFD reads a flag, and fails cleanly on a closed number.
    if fd < 3 || unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
        eprintln!("capexec: --worker {fd}: no open descriptor {fd} was inherited");
        return EXIT_CAPEXEC_FAILURE;
    }
    // SAFETY: checked open above, and nothing else in this process owns it.
    let socket = std::os::unix::net::UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
    if let Err(error) = socket.set_nonblocking(true) {
        eprintln!("capexec: --worker {fd}: {error}");
        return EXIT_CAPEXEC_FAILURE;
    }
    if let Err(error) = capexec::engine::become_subreaper() {
        tracing::warn!(%error, "cannot become a subreaper; orphaned grandchildren will not be reaped here");
    }
    let descriptor_limit = serve::raise_descriptor_limit();
    let capacity = match serve::descriptor_capacity(args) {
        Ok(capacity) => capacity,
        Err(error) => {
            eprintln!("capexec: {error}");
            return EXIT_CAPEXEC_FAILURE;
        }
    };
    let engine = serve::engine(args, &capacity, descriptor_limit);
    let call_limits = capexec::net::CallLimits {
        max_calls: args.max_calls_per_connection,
        max_bytes: args.max_call_memory_per_connection << 20,
    };
    crate::cli::run_local(async move {
        let stream = match tokio::net::UnixStream::from_std(socket) {
            Ok(stream) => stream,
            Err(error) => {
                eprintln!("capexec: --worker {fd}: {error}");
                return EXIT_CAPEXEC_FAILURE;
            }
        };
        let (reader, writer) = stream.into_split();
        let executor = capexec::rpc::local_executor(engine);
        capexec::net::serve_stream(reader, writer, executor, call_limits).await;
        0
    })
}
