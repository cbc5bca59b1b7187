//! The smallest useful client: connect to a server, start a command, stream
//! its output as it arrives, print its exit status.
//!
//! ```sh
//! capexec serve --listen unix:/tmp/capexec.sock &
//! cargo run --example minimal_client -- unix:/tmp/capexec.sock sh -c 'echo out; echo err >&2; exit 3'
//! ```
//! (For `tcp:` addresses the login token comes from `$CAPEXEC_TOKEN`.)

use std::io::Write;

use capexec::client::Command;
use capexec::model::{EventBody, OutputStream};
use futures::StreamExt;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let address = args
        .next()
        .ok_or("usage: minimal_client ADDR PROGRAM [ARGS...]")?;
    let program = args
        .next()
        .ok_or("usage: minimal_client ADDR PROGRAM [ARGS...]")?;
    let token = std::env::var("CAPEXEC_TOKEN")
        .ok()
        .map(capexec::net::Token::new);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    tokio::task::LocalSet::new().block_on(&runtime, async {
        let connection = capexec::net::connect(&address.parse()?, token.as_ref()).await?;
        let process = Command::new(program)
            .args(args)
            .spawn(&connection.executor())
            .await?;
        let mut events = process.events(0).await?;
        while let Some(event) = events.next().await {
            match event?.body {
                EventBody::Output {
                    stream: OutputStream::Stderr,
                    data,
                } => std::io::stderr().write_all(&data)?,
                EventBody::Output { data, .. } => std::io::stdout().write_all(&data)?,
                EventBody::Exited(status) => eprintln!("[{status}]"),
                EventBody::Closed => break,
                EventBody::Gap { from_seq } => eprintln!("[output lost from #{from_seq}]"),
            }
        }
        Ok(())
    })
}
