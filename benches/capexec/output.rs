//! Output throughput: `head -c N /dev/zero` read to the end through a read
//! loop and through a subscription, in retain and lossless modes, over Unix
//! and TCP, next to the same command into a local pipe (`capexec run` as a
//! whole process is in the `cli` section).

use std::error::Error;
use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use capexec::capexec_capnp::executor;
use capexec::client::{Command, RemoteProcess};
use capexec::model::{EventBody, Flow};

use crate::Plan;
use crate::report::{Report, Target};
use crate::servers::Servers;

const SECTION: &str = "output";
const WAIT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy)]
enum Consumer {
    ReadLoop,
    Subscribe,
}

/// Bytes received, and `gap` events: output the server evicted before it
/// was read (retain mode lets a slow reader lose output, by design).
#[derive(Default)]
struct Received {
    bytes: u64,
    lost_events: u64,
}

pub async fn run(
    plan: &Plan,
    servers: &Servers,
    report: &mut Report,
) -> Result<(), Box<dyn Error>> {
    let size = plan.output_bytes;
    eprintln!(
        "output: {} MiB, {} round(s)",
        size >> 20,
        plan.output_rounds
    );
    let direct = servers.connect_direct().await?;
    let (unix, tcp) = (&direct.unix, &direct.tcp);
    let mut variants = Vec::new();
    for (transport, executor) in [("unix", unix), ("tcp", tcp)] {
        for (consumer_name, consumer) in [
            ("read loop", Consumer::ReadLoop),
            ("subscribe", Consumer::Subscribe),
        ] {
            for (flow_name, flow) in [("retain", Flow::Retain), ("lossless", Flow::Lossless)] {
                let name = format!("{transport}, {consumer_name}, {flow_name}");
                let target = (transport == "unix").then_some(Target::AtLeastShare(0.6));
                variants.push((name, executor, consumer, flow, target));
            }
        }
    }
    let mut pipe = Vec::new();
    let mut samples = vec![Vec::new(); variants.len()];
    let mut lost = vec![0u64; variants.len()];
    let mut delivered = vec![0u64; variants.len()];
    for _ in 0..plan.output_rounds {
        pipe.push(local_pipe(size)?);
        for (i, (_, executor, consumer, flow, _)) in variants.iter().enumerate() {
            let (elapsed, received) = through(executor, size, *consumer, *flow).await?;
            if received.lost_events == 0 && received.bytes != size {
                return Err(format!("received {} of {size} bytes", received.bytes).into());
            }
            lost[i] += received.lost_events;
            delivered[i] += received.bytes;
            samples[i].push(elapsed);
        }
    }
    let baseline = report.baseline(SECTION, "local pipe, 64 KiB reads", pipe, Some(size));
    let rounds = plan.output_rounds as u64;
    for (i, ((name, _, _, _, target), samples)) in variants.iter().zip(samples).enumerate() {
        // Rates count what reached the client: retain mode may drop output
        // a slow reader misses, and that is not throughput.
        let bytes = delivered[i] / rounds;
        let note = if lost[i] > 0 {
            format!(
                "{} gaps, {:.0} % delivered",
                lost[i],
                100.0 * bytes as f64 / size as f64
            )
        } else {
            String::new()
        };
        report.case(
            SECTION,
            name.as_str(),
            samples,
            baseline,
            Some(bytes),
            *target,
            note,
        );
    }
    Ok(())
}

fn head(size: u64) -> Command {
    let mut head = Command::new("head");
    head.args(["-c", &size.to_string(), "/dev/zero"]);
    head
}

/// The baseline: the same command, its stdout a pipe read in 64 KiB reads.
fn local_pipe(size: u64) -> Result<Duration, Box<dyn Error>> {
    let started = Instant::now();
    let mut child = std::process::Command::new("head")
        .args(["-c", &size.to_string(), "/dev/zero"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut stdout = child.stdout.take().ok_or("no stdout")?;
    let mut buffer = vec![0u8; 64 << 10];
    let mut total = 0u64;
    loop {
        let read = stdout.read(&mut buffer)?;
        if read == 0 {
            break;
        }
        total += read as u64;
    }
    child.wait()?;
    let elapsed = started.elapsed();
    if total != size {
        return Err(format!("local pipe: {total} of {size} bytes").into());
    }
    Ok(elapsed)
}

async fn through(
    executor: &executor::Client,
    size: u64,
    consumer: Consumer,
    flow: Flow,
) -> Result<(Duration, Received), Box<dyn Error>> {
    let mut command = head(size);
    command.flow(flow);
    let started = Instant::now();
    let (process, spawned) = command.spawn_pipelined(executor);
    let received = match consumer {
        Consumer::ReadLoop => read_loop(&process).await?,
        Consumer::Subscribe => subscribe(&process).await?,
    };
    spawned.await?;
    Ok((started.elapsed(), received))
}

async fn read_loop(process: &RemoteProcess) -> Result<Received, Box<dyn Error>> {
    let (mut after, mut received) = (0, Received::default());
    loop {
        let outcome = process.read(after, 0, WAIT).await?;
        count(&outcome.events, &mut received);
        after = outcome.next_seq - 1;
        if outcome.closed {
            return Ok(received);
        }
    }
}

async fn subscribe(process: &RemoteProcess) -> Result<Received, Box<dyn Error>> {
    let mut events = process.events(0).await?;
    let mut received = Received::default();
    while let Some(batch) = events.next_batch().await {
        let batch = batch?;
        count(&batch, &mut received);
        if matches!(batch.last().map(|e| &e.body), Some(EventBody::Closed)) {
            return Ok(received);
        }
    }
    Err("the event stream ended before `closed`".into())
}

fn count(events: &[capexec::model::Event], received: &mut Received) {
    for event in events {
        match &event.body {
            EventBody::Output { data, .. } => received.bytes += data.len() as u64,
            EventBody::Gap { .. } => received.lost_events += 1,
            _ => {}
        }
    }
}
