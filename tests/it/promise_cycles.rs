//! A peer that resolves a promise it exported to itself, directly or
//! through another of its promises. Nothing in Cap'n Proto's wire forbids
//! sending it; capnp-rpc 0.27.3 took it, and every later walk along the
//! promise's resolutions spun on the connection's thread: a chained front
//! server that had passed the promise on (a `subscribe`'s sink) froze at
//! 100 % CPU for every client. The server now breaks such a promise, the
//! way it breaks one that resolves to an error, and goes on.

use crate::common;

use std::time::Duration;

use capexec::client::Command;
use capexec::net::{self, Address};
use tokio::net::UnixStream;

use common::hostile;
use common::server::ServerThread;

/// How long anything here may take on a loaded machine.
const DEADLINE: Duration = Duration::from_secs(20);

/// The cycles a peer can make: each list resolves its promise `i` to its
/// promise `list[i]`.
const CYCLES: [&[u32]; 2] = [&[0], &[1, 0]];

/// Starts `sleep` on a fresh connection to `address` (bootstrap 0, start
/// 1), subscribes to it once per promise of `cycle` (sink promise `i`),
/// resolves them into the cycle, and waits for the answer to a call sent
/// after that: the server has read the cycle by then.
async fn resolve_into_a_cycle(address: &Address, cycle: &[u32]) -> UnixStream {
    let Address::Unix(path) = address else {
        panic!("the attack is made over a Unix socket (no login), not {address}")
    };
    let mut stream = UnixStream::connect(path).await.expect("connect");
    let mut frames = hostile::bootstrap(0);
    frames.extend(hostile::start(1, 0, None, &["sleep", "60"]));
    for promise in 0..cycle.len() as u32 {
        frames.extend(hostile::subscribe_to_promise(2 + promise, 1, promise));
    }
    for (promise, to) in cycle.iter().enumerate() {
        frames.extend(hostile::resolve_to_promise(promise as u32, *to));
    }
    let last = 10;
    frames.extend(hostile::bootstrap(last));
    assert!(hostile::send(&mut stream, &frames).await);
    assert!(
        hostile::answered(&mut stream, last, DEADLINE).await,
        "the server answers the peer that made the cycle"
    );
    stream
}

/// Whether a client of `address` runs `true` within the deadline.
async fn served(address: &Address) -> bool {
    let run = async {
        let connection = net::connect(address, None).await.expect("connect");
        Command::new("true")
            .status(&connection.executor())
            .await
            .expect("start")
    };
    match tokio::time::timeout(DEADLINE, run).await {
        Ok(status) => status.success(),
        Err(_) => false,
    }
}

/// Makes each cycle at `attacked` and has another client served after it.
/// A server whose thread spins is left behind (forgotten), so that the
/// test fails instead of waiting for it forever.
async fn attack_then_serve(attacked: &Address, servers: Vec<ServerThread>) {
    for cycle in CYCLES {
        let _attacker = resolve_into_a_cycle(attacked, cycle).await;
        if !served(attacked).await {
            std::mem::forget(servers);
            panic!("no client is served within {DEADLINE:?} after the cycle {cycle:?}");
        }
    }
}

#[test]
fn a_promise_resolved_to_itself_leaves_a_server_serving() {
    common::run_local(async {
        let server = ServerThread::start(false);
        attack_then_serve(&server.address.clone(), vec![server]).await;
    });
}

#[test]
fn a_promise_resolved_to_itself_leaves_a_chained_front_serving() {
    common::run_local(async {
        let upstream = ServerThread::start(true);
        let front = ServerThread::start_in_front_of(&upstream);
        attack_then_serve(&front.address.clone(), vec![front, upstream]).await;
    });
}
