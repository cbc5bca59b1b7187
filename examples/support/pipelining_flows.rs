//! The flow the `pipelining` example and the benchmarks time: start `cat`,
//! write a line, close stdin, read every event until `closed`; made one
//! call after another, or all at once.

use capexec::capexec_capnp::executor;
use capexec::client::{Command, Error, RemoteProcess, Stdin};
use capexec::model::EventBody;
use futures::StreamExt;

fn cat() -> Command {
    let mut cat = Command::new("cat");
    cat.stdin(Stdin::Piped);
    cat
}

/// Each call waits for the answer to the one before: four round trips.
pub async fn sequential(executor: &executor::Client, line: &[u8]) -> Result<String, Error> {
    let process = cat().spawn(executor).await?;
    process.write(line, "w1").await?;
    process.close_stdin().await?;
    read_until_closed(&process).await
}

/// The write, closeStdin and subscribe name the process the start has not
/// returned yet, so everything goes out in one flight.
pub async fn pipelined(executor: &executor::Client, line: &[u8]) -> Result<String, Error> {
    let (process, spawned) = cat().spawn_pipelined(executor);
    let write = process.write_in_order(line, "w1");
    let (spawned, closed, output) =
        tokio::join!(spawned, process.close_stdin(), read_until_closed(&process));
    spawned?;
    write.outcome().await?;
    closed?;
    output
}

/// Every output byte until the `closed` event, from one subscription.
pub async fn read_until_closed(process: &RemoteProcess) -> Result<String, Error> {
    let mut events = process.events(0).await?;
    let mut output = Vec::new();
    while let Some(event) = events.next().await {
        match event?.body {
            EventBody::Output { data, .. } => output.extend_from_slice(&data),
            EventBody::Closed => break,
            _ => {}
        }
    }
    Ok(String::from_utf8_lossy(&output).into_owned())
}
