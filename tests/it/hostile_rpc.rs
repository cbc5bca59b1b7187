//! Cap'n Proto RPC used against the server by a hostile peer, in raw
//! frames: capability graphs built on purpose, and calls and answers out of
//! the usual order. capnp-rpc 0.27.3 took each of these; the fixes are in
//! `vendor/capnp-rpc` (its `CAPEXEC.md`).
//!
//! - A promise the peer exported, resolved to itself directly or through
//!   another of its promises: every later walk along the promise's
//!   resolutions spun on the connection's thread, and a chained front that
//!   had passed the promise on (a `subscribe`'s sink) froze at 100 % CPU for
//!   every client. Such a promise is now broken, as one that resolves to an
//!   error is.
//! - A chain of promises, each resolved to a fresh one: walked and dropped
//!   one stack frame per link, 50,000 links overflowed the server's stack and
//!   aborted the process. A peer may hold at most 1,024 promises, and chains
//!   are walked and dropped in loops.
//! - A call finished before it returned stayed in the answer table for the
//!   connection's life, its id never free again; a call whose results go to
//!   "yourself" (a tail call) was never started nor answered, and leaked
//!   even after the connection ended. Both are answered now.
//! - A call of the server's answered `canceled` (or "results sent
//!   elsewhere") by the peer waited forever; it fails now.

use crate::common;

use std::time::Duration;

use capexec::client::Command;
use capexec::net::{self, Address};
use tokio::net::UnixStream;

use capnp_rpc::rpc_capnp::exception;
use common::hostile::{self, Answered, Heard};
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
    let mut stream = connect(address).await;
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

/// A Unix-socket connection to `address`.
async fn connect(address: &Address) -> UnixStream {
    let Address::Unix(path) = address else {
        panic!("the attack is made over a Unix socket (no login), not {address}")
    };
    UnixStream::connect(path).await.expect("connect")
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

/// Starts `cat` (bootstrap 0, start 1), subscribes to it with the sink
/// promise 0 (question 2), and resolves promise `i` to promise `i + 1` for
/// every `i` below `links`: a chain of `links + 1` promises.
fn a_chain_of_promises(links: u32) -> Vec<u8> {
    let mut frames = hostile::bootstrap(0);
    frames.extend(hostile::start_with_stdin(1, 0, None, &["cat"], true));
    frames.extend(hostile::subscribe_to_promise(2, 1, 0));
    for promise in 0..links {
        frames.extend(hostile::resolve_to_promise(promise, promise + 1));
    }
    frames
}

#[test]
fn a_chain_of_as_many_promises_as_a_peer_may_hold_is_walked_and_dropped() {
    common::run_local(async {
        let server = ServerThread::start(false);
        let mut stream = connect(&server.address).await;
        let mut frames = a_chain_of_promises(1023);
        // `cat` echoes a line once the chain is whole: the event pushed to
        // the sink is a call sent along all 1,024 links.
        frames.extend(hostile::write_stdin(3, 1, b"hi\n"));
        assert!(hostile::send(&mut stream, &frames).await);
        assert!(
            hostile::called(&mut stream, 1023, DEADLINE).await,
            "the server pushes the echoed line to the chain's last promise"
        );
        assert!(served(&server.address).await, "served with the chain held");
        drop(stream);
        assert!(
            served(&server.address).await,
            "served after the chain's drop"
        );
    });
}

#[test]
fn one_promise_more_than_a_peer_may_hold_closes_its_connection_with_the_reason() {
    common::run_local(async {
        let server = ServerThread::start(false);
        let mut stream = connect(&server.address).await;
        assert!(hostile::send(&mut stream, &a_chain_of_promises(1024)).await);
        hostile::told(
            &mut stream,
            exception::Type::Overloaded,
            "the peer holds more than 1024 promises on this connection; closing it",
            DEADLINE,
        )
        .await;
        assert!(served(&server.address).await);
    });
}

#[test]
fn a_call_finished_before_it_returns_is_answered_canceled_and_its_id_is_free_again() {
    common::run_local(async {
        let server = ServerThread::start(false);
        let mut stream = connect(&server.address).await;
        let mut frames = hostile::bootstrap(0);
        frames.extend(hostile::start(1, 0, None, &["sleep", "60"]));
        assert!(hostile::send(&mut stream, &frames).await);
        // A read that would wait a minute for output, finished at once, the
        // same question id each time.
        for round in 0..3 {
            let mut frames = hostile::read_waiting(5, 1, 60_000);
            frames.extend(hostile::finish(5));
            assert!(hostile::send(&mut stream, &frames).await);
            assert!(
                hostile::answered(&mut stream, 5, DEADLINE).await,
                "round {round}: the finished read is answered"
            );
        }
        assert!(served(&server.address).await);
    });
}

#[test]
fn results_kept_for_the_caller_are_answered_sent_elsewhere_and_their_id_is_free_again() {
    common::run_local(async {
        let server = ServerThread::start(false);
        let mut stream = connect(&server.address).await;
        assert!(hostile::send(&mut stream, &hostile::bootstrap(0)).await);
        // A start whose results the caller would take for another question
        // of its own (a tail call), the same question id each round.
        for round in 0..3 {
            let mut frames = hostile::results_to_yourself(&hostile::start(5, 0, None, &["true"]));
            frames.extend(hostile::finish(5));
            assert!(hostile::send(&mut stream, &frames).await);
            let answered = hostile::answered_as(&mut stream, 5, DEADLINE).await;
            // The Finish may come before the start ends, or after.
            assert!(
                matches!(
                    answered,
                    Some(Answered::ResultsSentElsewhere | Answered::Canceled)
                ),
                "round {round}: {answered:?}"
            );
        }
        let mut frames = hostile::results_to_yourself(&hostile::start(6, 0, None, &["true"]));
        frames.extend(hostile::bootstrap(7));
        assert!(hostile::send(&mut stream, &frames).await);
        assert_eq!(
            hostile::answered_as(&mut stream, 6, DEADLINE).await,
            Some(Answered::ResultsSentElsewhere),
            "a call not finished is answered when it ends"
        );
        assert!(served(&server.address).await);
    });
}

#[test]
fn a_push_the_peer_answers_canceled_fails_and_ends_the_subscription() {
    common::run_local(async {
        let server = ServerThread::start(false);
        let mut stream = connect(&server.address).await;
        let mut frames = hostile::bootstrap(0);
        frames.extend(hostile::start(1, 0, None, &["echo", "hi"]));
        frames.extend(hostile::subscribe_to_export(2, 1, 7));
        assert!(hostile::send(&mut stream, &frames).await);
        let push = tokio::time::timeout(DEADLINE, async {
            loop {
                if let Heard::Called {
                    question,
                    export: 7,
                } = hostile::hear(&mut stream).await
                {
                    return question;
                }
            }
        })
        .await
        .expect("the server pushes the process's events to the sink");
        assert!(hostile::send(&mut stream, &hostile::returned_canceled(push)).await);
        // The failed push ends the subscription, which lets the sink go.
        assert!(
            hostile::released(&mut stream, 7, DEADLINE).await,
            "the sink is released"
        );
        assert!(served(&server.address).await);
    });
}
