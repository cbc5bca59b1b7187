//! Arbitrary and mutated Cap'n Proto byte streams fed to a served
//! connection: the connection may fail, but nothing panics or hangs, nothing
//! it started outlives it, and other clients keep working. The mutations
//! start from a recorded real session (bootstrap, start, subscribe, write,
//! closeStdin), so many of them get past the framing into the RPC layer.
//! `fuzz/` holds the cargo-fuzz target that does the same without bound.

use crate::common;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use capexec::capexec_capnp::executor;
use capexec::client::{Command, Stdin};
use capexec::engine::Engine;
use capexec::net::{CallLimits, serve_stream};
use capnp_rpc::rpc_twoparty_capnp::Side;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

const CASES: u64 = 2000;
/// How long a connection may take to end once its input has.
const DEADLINE: Duration = Duration::from_secs(20);

/// A deterministic source of noise (xorshift64*).
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// A client over one end of `stream`, and the task of its connection
/// (aborting it closes the stream).
fn client_on(stream: DuplexStream) -> (executor::Client, tokio::task::JoinHandle<()>) {
    let (reader, writer) = tokio::io::split(stream);
    let mut system = common::raw_client_system(reader, writer);
    let executor: executor::Client = system.bootstrap(Side::Server);
    let task = tokio::task::spawn_local(async move {
        let _ = system.await;
    });
    (executor, task)
}

/// Serves `executor` on one end of a fresh pipe and returns the other end
/// and the connection's task.
fn serve(executor: &executor::Client) -> (DuplexStream, tokio::task::JoinHandle<()>) {
    let (near, far) = tokio::io::duplex(1 << 20);
    let (reader, writer) = tokio::io::split(far);
    let served = tokio::task::spawn_local(serve_stream(
        reader,
        writer,
        executor.clone(),
        CallLimits::default(),
    ));
    (near, served)
}

/// The bytes a real client sends for a short session.
async fn recorded_session(executor: &executor::Client) -> Vec<u8> {
    let (to_server, served) = serve(executor);
    let (client_end, recorder_end) = tokio::io::duplex(1 << 20);
    let recorded = Rc::new(RefCell::new(Vec::new()));
    let (mut from_client, mut to_client) = tokio::io::split(recorder_end);
    let (mut from_server, mut into_server) = tokio::io::split(to_server);
    let tap = {
        let recorded = Rc::clone(&recorded);
        tokio::task::spawn_local(async move {
            let mut buffer = vec![0u8; 64 << 10];
            loop {
                let read = from_client.read(&mut buffer).await.unwrap_or(0);
                if read == 0 {
                    let _ = into_server.shutdown().await;
                    return;
                }
                recorded.borrow_mut().extend_from_slice(&buffer[..read]);
                if into_server.write_all(&buffer[..read]).await.is_err() {
                    return;
                }
            }
        })
    };
    tokio::task::spawn_local(async move {
        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
    });
    let (client, connection) = client_on(client_end);
    {
        let mut cat = Command::new("cat");
        cat.stdin(Stdin::Piped);
        let (process, started) = cat.spawn_pipelined(&client);
        process.write(b"recorded\n", "w1").await.expect("write");
        process.close_stdin().await.expect("close");
        started.await.expect("start");
        assert_eq!(
            process.wait().await.expect("wait"),
            capexec::model::ExitStatus::Code(0)
        );
        let status = Command::new("true").status(&client).await.expect("true");
        assert!(status.success());
    }
    drop(client);
    connection.abort();
    let _ = tokio::time::timeout(DEADLINE, tap).await;
    let _ = tokio::time::timeout(DEADLINE, served).await;
    let bytes = recorded.borrow().clone();
    assert!(bytes.len() > 64, "recorded only {} bytes", bytes.len());
    bytes
}

fn mutate(noise: &mut Noise, session: &[u8]) -> Vec<u8> {
    let mut bytes = session.to_vec();
    match noise.below(6) {
        0 => {
            for _ in 0..=noise.below(3) {
                let at = noise.below(bytes.len());
                bytes[at] ^= 1 << noise.below(8);
            }
        }
        1 => bytes.truncate(noise.below(bytes.len())),
        2 => {
            let at = noise.below(bytes.len());
            let extra: Vec<u8> = (0..=noise.below(16)).map(|_| noise.next() as u8).collect();
            bytes.splice(at..at, extra);
        }
        3 => {
            bytes = (0..=noise.below(4096))
                .map(|_| noise.next() as u8)
                .collect();
        }
        4 => {
            let at = noise.below(bytes.len());
            let len = noise.below(bytes.len() - at);
            let slice = bytes[at..at + len].to_vec();
            bytes.splice(at..at, slice);
        }
        _ => {
            // A word of all ones: huge segment counts, sizes and offsets.
            let at = noise.below(bytes.len() / 8) * 8;
            let end = (at + 8).min(bytes.len());
            bytes[at..end].fill(0xff);
        }
    }
    bytes
}

#[test]
fn mutated_and_random_streams_fail_cleanly() {
    common::run_local(async {
        let engine = Engine::default();
        let executor = capexec::rpc::local_executor(engine.clone());
        let session = recorded_session(&executor).await;
        let mut noise = Noise(0x9e37_79b9_7f4a_7c15);
        for case in 0..CASES {
            let input = mutate(&mut noise, &session);
            let (peer, served) = serve(&executor);
            let (mut replies, mut requests) = tokio::io::split(peer);
            let drain = tokio::task::spawn_local(async move {
                let mut sink = vec![0u8; 64 << 10];
                while matches!(replies.read(&mut sink).await, Ok(n) if n > 0) {}
            });
            let _ = requests.write_all(&input).await;
            let _ = requests.shutdown().await;
            match tokio::time::timeout(DEADLINE, served).await {
                Ok(Ok(())) => {}
                Ok(Err(panic)) => panic!("case {case}: the connection task failed: {panic}"),
                Err(_) => panic!("case {case}: the connection did not end with its input"),
            }
            drop(requests);
            drain.abort();
        }
        // Nothing the hostile connections started is left, and a normal
        // client is served as before.
        common::eventually_async(
            "nothing the hostile connections started is left",
            async || engine.live_count() == 0,
        )
        .await;
        let (peer, _served) = serve(&executor);
        let (client, _connection) = client_on(peer);
        let output = Command::new("echo")
            .arg("still serving")
            .output(&client)
            .await;
        assert_eq!(output.expect("served").stdout, b"still serving\n");
    });
}
