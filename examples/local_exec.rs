//! Starts a process on the in-process executor through the client library,
//! streams its output as events arrive, then prints its exit status.
//!
//! ```sh
//! cargo run --example local_exec -- sh -c 'echo out; echo err >&2; exit 3'
//! ```

use futures::StreamExt;

use capexec::client::Command;
use capexec::engine::Engine;
use capexec::model::{EventBody, OutputStream};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let Some((program, args)) = argv.split_first() else {
        return Err("usage: local_exec PROGRAM [ARGS...]".into());
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // capnp-rpc is single-threaded: everything runs inside a LocalSet.
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async {
        let executor = capexec::rpc::local_executor(Engine::default());
        let process = Command::new(program).args(args).spawn(&executor).await?;
        let mut events = process.events(0).await?;
        while let Some(event) = events.next().await {
            let event = event?;
            match event.body {
                EventBody::Output { stream, data } => {
                    let name = if stream == OutputStream::Stderr {
                        "stderr"
                    } else {
                        "stdout"
                    };
                    println!(
                        "#{} {name}: {:?}",
                        event.seq,
                        String::from_utf8_lossy(&data)
                    );
                }
                EventBody::Exited(status) => println!("#{} {status}", event.seq),
                EventBody::Closed => println!("#{} closed", event.seq),
                EventBody::Gap { from_seq } => println!("#{from_seq}..#{} lost", event.seq),
            }
        }
        Ok(())
    })
}
