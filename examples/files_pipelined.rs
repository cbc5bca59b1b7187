//! What pipelining saves on files: `executor.directory(p).subdirectory(q)
//! .readFile(r)` made one call after another, then all at once, against
//! one server and against a chain A -> B, with a proxy delaying every
//! message by 25 ms each way on every link.
//!
//! ```sh
//! cargo run --example files_pipelined
//! ```
//!
//! Sequentially each call waits for the answer before it: three round
//! trips per link. Pipelined, `subdirectory` names the directory
//! `directory` has not returned yet and `readFile` the one `subdirectory`
//! has not: all three go out in one flight, one round trip per link (the
//! proxies count them causally, see `tests/common/proxy.rs`).

#[path = "../tests/common/proxy.rs"]
mod proxy;

use std::path::Path;
use std::time::{Duration, Instant};

use capexec::capexec_capnp::executor;
use capexec::client::Directory;
use capexec::engine::Engine;
use capexec::net::{Address, Server, ServerConfig, UpstreamConfig};

const DELAY: Duration = Duration::from_millis(25);

async fn serve(config: ServerConfig) -> Result<(), Box<dyn std::error::Error>> {
    let server = Server::bind(config, Engine::default()).await?;
    tokio::task::spawn_local(server.serve_until(std::future::pending()));
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("src"))?;
    std::fs::write(tree.join("src/main.rs"), b"fn main() {}\n")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async {
        let socket = |name: &str| dir.path().join(name);
        serve(ServerConfig {
            listen: vec![Address::Unix(socket("b.sock"))],
            ..ServerConfig::default()
        })
        .await?;
        let to_b = proxy::Proxy::start(&socket("to-b.sock"), &socket("b.sock"), DELAY)?;
        serve(ServerConfig {
            listen: vec![Address::Unix(socket("a.sock"))],
            upstreams: vec![UpstreamConfig::new(
                "b",
                Address::Unix(socket("to-b.sock")),
                None,
            )],
            default_environment: Some("b".to_string()),
            ..ServerConfig::default()
        })
        .await?;
        let to_a = proxy::Proxy::start(&socket("to-a.sock"), &socket("a.sock"), DELAY)?;
        let single = proxy::Proxy::start(&socket("single.sock"), &socket("b.sock"), DELAY)?;
        println!(
            "proxies adding {} ms each way on every link (one round trip = {} ms)",
            DELAY.as_millis(),
            2 * DELAY.as_millis()
        );
        for (name, address, links) in [
            ("one server", socket("single.sock"), vec![&single]),
            ("chain A -> B", socket("to-a.sock"), vec![&to_a, &to_b]),
        ] {
            let connection = capexec::net::connect(&Address::Unix(address), None).await?;
            let executor = connection.executor();
            // Warm up: the bootstrap, and the chain's upstream connection.
            Directory::open(&executor, &tree).info().await?;
            let flows = measure(&executor, &tree, &links).await?;
            println!("{name}:");
            for (flow, elapsed, trips, content) in &flows {
                println!(
                    "  {flow:>10}: {:>4} ms, round trips per link {trips:?}, read {:?}",
                    elapsed.as_millis(),
                    String::from_utf8_lossy(content)
                );
            }
            if flows[1].2.iter().any(|&trips| trips != 1) {
                return Err(format!(
                    "{name}: the pipelined read took more than one round trip per link"
                )
                .into());
            }
        }
        Ok(())
    })
}

type Flow = (&'static str, Duration, Vec<u64>, Vec<u8>);

async fn measure(
    executor: &executor::Client,
    tree: &Path,
    links: &[&proxy::Proxy],
) -> Result<Vec<Flow>, Box<dyn std::error::Error>> {
    let reset = || links.iter().for_each(|link| link.reset());
    let trips = || links.iter().map(|link| link.flights()).collect::<Vec<_>>();
    reset();
    let started = Instant::now();
    let root = Directory::open(executor, tree);
    root.info().await?;
    let src = root.subdirectory("src");
    src.info().await?;
    let sequential = src.read("main.rs").await?;
    let sequential = ("sequential", started.elapsed(), trips(), sequential);
    reset();
    let started = Instant::now();
    let pipelined = Directory::open(executor, tree)
        .subdirectory("src")
        .read("main.rs")
        .await?;
    let pipelined = ("pipelined", started.elapsed(), trips(), pipelined);
    if pipelined.3 != sequential.3 {
        return Err("the two reads differ".into());
    }
    Ok(vec![sequential, pipelined])
}
