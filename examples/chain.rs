//! Three executors in a chain, A -> B -> C, in this one process: runs a
//! command on C through A, shows its exit status and output, then drops the
//! process at the client and shows that it died on C.
//!
//! ```sh
//! cargo run --example chain
//! ```
//!
//! A knows B as its upstream environment "b", B knows C as "c", so the
//! client reaches C with `environment("b").environment("c")` (the path
//! "b/c"), all pipelined: the start travels A -> B -> C in one trip per hop.

use std::time::{Duration, Instant};

use capexec::client::{self, Command};
use capexec::engine::Engine;
use capexec::net::{Address, Server, ServerConfig, UpstreamConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async {
        let c = serve(dir.path().join("c.sock"), None).await?;
        let b = serve(dir.path().join("b.sock"), Some(("c", c))).await?;
        let a = serve(dir.path().join("a.sock"), Some(("b", b))).await?;
        println!("A {a}\n  -> B (A's environment \"b\")\n  -> C (B's environment \"c\")");

        let connection = capexec::net::connect(&a, None).await?;
        let on_c = client::environment(&connection.executor(), "b/c");
        let info = client::info(&on_c).await?;
        println!("running on environment {:?} of A", info.environment);

        let mut command = Command::new("sh");
        command.args(["-c", "echo \"hello from pid $$\"; exit 7"]);
        let output = command.output(&on_c).await?;
        print!("output: {}", String::from_utf8_lossy(&output.stdout));
        println!(
            "status: {} (shell code {})",
            output.exit.status,
            output.exit.status.shell_code()
        );

        let process = Command::new("sleep").arg("1000").spawn(&on_c).await?;
        let pid = process.info().await?.pid;
        println!("started sleep 1000 on C as pid {pid}; dropping it at the client");
        drop(process);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::path::Path::new(&format!("/proc/{pid}")).exists() {
            if Instant::now() > deadline {
                return Err(format!("pid {pid} is still alive on C").into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        println!("pid {pid} is gone on C: released through A and B, killed and reaped");
        Ok(())
    })
}

/// Serves an executor on a Unix socket at `path` (forwarding plain starts to
/// `upstream` if given) on this thread's `LocalSet`; returns its address.
async fn serve(
    path: std::path::PathBuf,
    upstream: Option<(&str, Address)>,
) -> Result<Address, Box<dyn std::error::Error>> {
    let config = ServerConfig {
        listen: vec![Address::Unix(path)],
        upstreams: upstream
            .into_iter()
            .map(|(name, address)| UpstreamConfig::new(name, address, None))
            .collect(),
        ..ServerConfig::default()
    };
    let server = Server::bind(config, Engine::default()).await?;
    let address = server.addresses().remove(0);
    tokio::task::spawn_local(server.serve_until(std::future::pending()));
    Ok(address)
}
