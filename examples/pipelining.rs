//! What promise pipelining saves: the same four calls (start, write,
//! closeStdin, then reading every event until `closed` through a
//! subscription) made one after another, then all at once, against a server
//! behind a proxy that delays every message by 25 ms each way.
//!
//! ```sh
//! cargo run --example pipelining
//! ```
//!
//! The proxy counts round trips causally: a call opens a new one only if an
//! answer reached the client since the previous one began (see
//! `tests/common/proxy.rs`). Sequentially each call waits for the answer
//! before it, so the flow takes four round trips; pipelined, the write,
//! closeStdin and subscribe name the process the start has not returned
//! yet, so everything goes out in one flight and the flow takes about one
//! round trip (plus the time `cat` itself needs).

#[path = "support/pipelining_flows.rs"]
mod flows;
#[path = "../tests/common/proxy.rs"]
mod proxy;

use std::time::{Duration, Instant};

use capexec::client::Command;
use capexec::engine::Engine;
use capexec::net::{Address, Server, ServerConfig};

const DELAY: Duration = Duration::from_millis(25);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async {
        let config = ServerConfig {
            listen: vec![Address::Unix(dir.path().join("server.sock"))],
            ..ServerConfig::default()
        };
        let server = Server::bind(config, Engine::default()).await?;
        tokio::task::spawn_local(server.serve_until(std::future::pending()));
        let proxy = proxy::Proxy::start(
            &dir.path().join("proxy.sock"),
            &dir.path().join("server.sock"),
            DELAY,
        )?;
        let connection =
            capexec::net::connect(&Address::Unix(proxy.path().to_path_buf()), None).await?;
        let executor = connection.executor();
        println!(
            "server behind a proxy adding {} ms each way (one round trip = {} ms)",
            DELAY.as_millis(),
            2 * DELAY.as_millis()
        );
        // The first call also sends the connection's bootstrap: warm it up.
        Command::new("true").status(&executor).await?;

        proxy.reset();
        let started = Instant::now();
        let output = flows::sequential(&executor, b"sequential\n").await?;
        report("sequential", started, &proxy, &output);

        proxy.reset();
        let started = Instant::now();
        let output = flows::pipelined(&executor, b"pipelined\n").await?;
        report("pipelined", started, &proxy, &output);
        if proxy.flights() != 1 {
            return Err("the pipelined flow took more than one round trip".into());
        }
        Ok(())
    })
}

fn report(name: &str, started: Instant, proxy: &proxy::Proxy, output: &str) {
    println!(
        "{name:>10}: {:>4} ms, {} calls in {} round trip(s), output {output:?}",
        started.elapsed().as_millis(),
        proxy.calls(),
        proxy.flights()
    );
}
