//! `capexec serve`: an executor on Unix sockets and TCP until SIGTERM or
//! SIGINT.

use std::io::Write;

use tokio::signal::unix::{SignalKind, signal};

use crate::cli::{EXIT_CAPEXEC_FAILURE, ServeArgs};
use capexec::engine::{self, Engine};
use capexec::net::{Address, Server, ServerConfig};

pub fn main(args: ServeArgs) -> i32 {
    let mut listen = Vec::new();
    for text in &args.listen {
        match text.parse::<Address>() {
            Ok(address) => listen.push(address),
            Err(error) => {
                eprintln!("capexec: --listen {error}");
                return EXIT_CAPEXEC_FAILURE;
            }
        }
    }
    if let Err(error) = engine::become_subreaper() {
        tracing::warn!(%error, "cannot become a subreaper; orphaned grandchildren will not be reaped here");
    }
    let config = ServerConfig {
        listen,
        token_file: args.token_file,
    };
    crate::cli::run_local(serve(config))
}

async fn serve(config: ServerConfig) -> i32 {
    // Registered before binding, so a signal that arrives as soon as the
    // addresses are printed is not lost.
    let (mut terminate, mut interrupt) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(terminate), Ok(interrupt)) => (terminate, interrupt),
        (Err(error), _) | (_, Err(error)) => {
            eprintln!("capexec: cannot handle signals: {error}");
            return EXIT_CAPEXEC_FAILURE;
        }
    };
    let server = match Server::bind(config, Engine::default()).await {
        Ok(server) => server,
        Err(error) => {
            eprintln!("capexec: {error}");
            return EXIT_CAPEXEC_FAILURE;
        }
    };
    if let Some(path) = server.token_path() {
        tracing::info!(path = %path.display(), "tcp logins use the token in this file");
    }
    let mut stdout = std::io::stdout().lock();
    for address in server.addresses() {
        let _ = writeln!(stdout, "{address}");
    }
    let _ = stdout.flush();
    drop(stdout);
    server
        .serve_until(async move {
            tokio::select! {
                _ = terminate.recv() => tracing::info!("SIGTERM received"),
                _ = interrupt.recv() => tracing::info!("SIGINT received"),
            }
        })
        .await;
    0
}
