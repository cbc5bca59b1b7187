//! Stdin throughput: N bytes written through `write` into `cat` and read
//! back through a subscription, next to the same through local pipes.

use std::collections::VecDeque;
use std::error::Error;
use std::io::{Read, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use capexec::capexec_capnp::executor;
use capexec::client::{Command, Stdin};
use capexec::model::{EventBody, Flow};

use crate::Plan;
use crate::report::{Report, Target};
use crate::servers::Servers;

const SECTION: &str = "stdin";
/// Bytes per `write` call, and calls in flight at once (as `capexec run`
/// forwards its stdin).
const CHUNK: usize = 256 << 10;
const WINDOW: usize = 8;

pub async fn run(
    plan: &Plan,
    servers: &Servers,
    report: &mut Report,
) -> Result<(), Box<dyn Error>> {
    let size = plan.stdin_bytes;
    eprintln!(
        "stdin: {} MiB into cat, {} round(s)",
        size >> 20,
        plan.stdin_rounds
    );
    let direct = servers.connect_direct().await?;
    let (unix, tcp) = (&direct.unix, &direct.tcp);
    let variants = [
        (
            "unix: write -> cat -> subscribe",
            unix,
            Some(Target::AtLeastShare(0.6)),
        ),
        ("tcp: write -> cat -> subscribe", tcp, None),
    ];
    let mut pipe = Vec::new();
    let mut samples = vec![Vec::new(); variants.len()];
    for _ in 0..plan.stdin_rounds {
        pipe.push(local_pipe(size)?);
        for ((_, executor, _), samples) in variants.iter().zip(&mut samples) {
            samples.push(through(executor, size).await?);
        }
    }
    let baseline = report.baseline(
        SECTION,
        "local pipes: writer -> cat -> reader",
        pipe,
        Some(size),
    );
    for ((name, _, target), samples) in variants.iter().zip(samples) {
        report.case(SECTION, *name, samples, baseline, Some(size), *target, "");
    }
    Ok(())
}

fn local_pipe(size: u64) -> Result<Duration, Box<dyn Error>> {
    let started = Instant::now();
    let mut child = std::process::Command::new("cat")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    let mut stdout = child.stdout.take().ok_or("no stdout")?;
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        let chunk = vec![b'x'; CHUNK];
        let mut left = size;
        while left > 0 {
            let n = left.min(CHUNK as u64) as usize;
            stdin.write_all(&chunk[..n])?;
            left -= n as u64;
        }
        Ok(())
    });
    let mut buffer = vec![0u8; 64 << 10];
    let mut total = 0u64;
    loop {
        let read = stdout.read(&mut buffer)?;
        if read == 0 {
            break;
        }
        total += read as u64;
    }
    writer.join().map_err(|_| "writer panicked")??;
    child.wait()?;
    let elapsed = started.elapsed();
    if total != size {
        return Err(format!("local pipe: {total} of {size} bytes").into());
    }
    Ok(elapsed)
}

async fn through(executor: &executor::Client, size: u64) -> Result<Duration, Box<dyn Error>> {
    let mut cat = Command::new("cat");
    cat.stdin(Stdin::Piped).flow(Flow::Lossless);
    let started = Instant::now();
    let (process, spawned) = cat.spawn_pipelined(executor);
    let reading = tokio::task::spawn_local({
        let process = process.clone();
        async move {
            let mut events = process.events(0).await?;
            let mut total = 0u64;
            while let Some(batch) = events.next_batch().await {
                for event in batch? {
                    match event.body {
                        EventBody::Output { data, .. } => total += data.len() as u64,
                        EventBody::Closed => return Ok(total),
                        EventBody::Gap { .. } => return Err("output lost in lossless mode".into()),
                        EventBody::Exited(_) => {}
                    }
                }
            }
            Err::<u64, Box<dyn Error>>("the event stream ended before `closed`".into())
        }
    });
    let writing = async {
        let chunk = Bytes::from(vec![b'x'; CHUNK]);
        let mut in_flight = VecDeque::new();
        let (mut left, mut count) = (size, 0u64);
        while left > 0 {
            if in_flight.len() >= WINDOW
                && let Some(write) = in_flight.pop_front()
            {
                capexec::client::PendingWrite::outcome(write).await?;
            }
            let n = left.min(CHUNK as u64) as usize;
            in_flight.push_back(process.write_in_order(&chunk[..n], &format!("w{count}")));
            left -= n as u64;
            count += 1;
        }
        for write in in_flight {
            write.outcome().await?;
        }
        process.close_stdin().await?;
        spawned.await?;
        Ok::<(), Box<dyn Error>>(())
    };
    let mut reading = reading;
    // A reader that fails stops consuming, and lossless output would then
    // hold `cat`, and the writes, back for ever: stop at once instead.
    tokio::select! {
        written = writing => written?,
        read = &mut reading => {
            let why = match read {
                Ok(Ok(total)) => format!("`closed` after {total} bytes"),
                Ok(Err(error)) => error.to_string(),
                Err(error) => error.to_string(),
            };
            return Err(format!("the reader stopped before stdin was written: {why}").into());
        }
    }
    let total = reading.await??;
    let elapsed = started.elapsed();
    if total != size {
        return Err(format!("cat gave back {total} of {size} bytes").into());
    }
    Ok(elapsed)
}
