//! Measures the round trip of running a short command to completion through
//! an executor (embedded, or `--connect ADDR`), next to spawning the same
//! command directly, without counting either client's own startup.
//!
//! ```sh
//! cargo run --release --example start_latency -- [--connect unix:/tmp/x.sock] [-r 500] [PROGRAM ARGS...]
//! ```

use std::time::{Duration, Instant};

use capexec::client::Command;
use capexec::engine::Engine;
use capexec::net::{Address, Token};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1).peekable();
    let (mut address, mut runs) = (None::<Address>, 500usize);
    while let Some(flag) = args.next_if(|arg| arg.starts_with('-')) {
        match flag.as_str() {
            "--connect" => address = Some(args.next().ok_or("--connect ADDR")?.parse()?),
            "-r" => runs = args.next().ok_or("-r RUNS")?.parse()?,
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    let argv: Vec<String> = args.collect();
    let argv = if argv.is_empty() {
        vec!["true".to_string()]
    } else {
        argv
    };

    let direct = measure(runs, || {
        std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(std::process::Stdio::null())
            .output()
            .map(drop)
    })?;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    let through = local.block_on(&runtime, async {
        let (executor, _connection) = match &address {
            Some(address) => {
                let token = match address {
                    Address::Tcp { .. } => Some(token()?),
                    Address::Unix(_) => None,
                };
                let connection = capexec::net::connect(address, token.as_ref()).await?;
                (connection.executor(), Some(connection))
            }
            None => (capexec::rpc::local_executor(Engine::default()), None),
        };
        let mut command = Command::new(&argv[0]);
        command.args(&argv[1..]);
        let mut samples = Vec::with_capacity(runs);
        for _ in 0..runs {
            let started = Instant::now();
            command.output(&executor).await?;
            samples.push(started.elapsed());
        }
        Ok::<_, Box<dyn std::error::Error>>(samples)
    })?;

    let target = address.map_or("embedded".to_string(), |a| a.to_string());
    report("direct spawn+wait", direct);
    report(&format!("capexec ({target})"), through);
    Ok(())
}

/// `$CAPEXEC_TOKEN`, else the default token file.
fn token() -> Result<Token, Box<dyn std::error::Error>> {
    if let Ok(secret) = std::env::var("CAPEXEC_TOKEN") {
        return Ok(Token::new(secret));
    }
    let path = capexec::net::default_token_path().ok_or("no token: set CAPEXEC_TOKEN")?;
    Ok(Token::load(&path)?)
}

fn measure(
    runs: usize,
    mut once: impl FnMut() -> std::io::Result<()>,
) -> std::io::Result<Vec<Duration>> {
    (0..runs)
        .map(|_| {
            let started = Instant::now();
            once().map(|()| started.elapsed())
        })
        .collect()
}

fn report(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    println!(
        "{name:<32} median {:>8.1?}  p90 {:>8.1?}  p99 {:>8.1?}",
        at(0.5),
        at(0.9),
        at(0.99)
    );
}
