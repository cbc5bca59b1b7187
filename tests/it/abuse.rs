//! Attacks on a `capexec serve` replayed in small, bounded form over real
//! sockets, the way a hostile peer sends them (raw frames: see
//! `common::hostile`). Each asserts that the server's RSS stays within a
//! stated bound during the attack and returns near where it started after
//! it, that the attacking connection is closed (told why) or throttled,
//! and that an honest client is served during the attack and after it.

use crate::common;

use std::time::Duration;

use capexec::client::Command;
use capexec::net::{self, Address};
use capnp_rpc::rpc_capnp::exception;

use common::cli::Served;
use common::hostile;
use common::procfs::{self, PeakRss};

/// What any attack here may add to the server's RSS, in KiB.
const ATTACK_BOUND_KIB: u64 = 16 * 1024;
/// How near its RSS before the attack the server returns after it, in KiB.
const SETTLED_KIB: u64 = 4 * 1024;
/// How long the server may take to tell an attacker goodbye.
const GOODBYE: Duration = Duration::from_secs(20);

/// An honest client's short start over TCP, logged in: served as usual.
async fn honest_start(served: &Served) {
    let address: Address = served.tcp.parse().expect("address");
    let connection = net::connect(&address, Some(&served.token()))
        .await
        .expect("the honest client connects");
    let status = Command::new("true")
        .status(&connection.executor())
        .await
        .expect("the honest client is served");
    assert!(status.success());
}

/// Asserts the server said goodbye with an `overloaded` error of `reason`.
async fn told_overloaded(stream: &mut tokio::net::TcpStream, reason: &str) {
    hostile::told(stream, exception::Type::Overloaded, reason, GOODBYE).await;
}

/// 40 connections announce 15 MiB messages. Before login each is refused at
/// its header; after login each holds what actually arrived (100 KiB) and
/// the server waits for the rest, not 15 MiB apiece (600 MiB in all before
/// this was bounded).
#[test]
fn huge_frame_headers_cost_what_arrives_not_what_they_announce() {
    common::run_local(async {
        let served = Served::start();
        honest_start(&served).await;
        let before = procfs::rss_quiet(served.child.id()).await;
        let peak = PeakRss::watch(served.child.id());

        let mut held = hostile::huge_headers(&served.tcp, None, 40).await;
        for stream in &mut held {
            told_overloaded(
                stream,
                "a message of 15728640 bytes exceeds the limit of 4096 bytes per message before \
                 login; closing the connection",
            )
            .await;
        }
        honest_start(&served).await;

        let token = served.token();
        let mut held = hostile::huge_headers(&served.tcp, Some(token.as_str()), 40).await;
        for stream in &mut held {
            assert!(hostile::send(stream, &vec![0u8; 100 << 10]).await);
        }
        let during = procfs::rss_quiet(served.child.id()).await;
        honest_start(&served).await;
        assert!(
            peak.peak_kib() < before + ATTACK_BOUND_KIB,
            "RSS {before} -> {} KiB (settled at {during})",
            peak.peak_kib()
        );
        // Throttled: the server is still waiting for the rest of each.
        let waiting = tokio::time::timeout(
            Duration::from_millis(200),
            hostile::goodbye(&mut held[0], GOODBYE),
        )
        .await;
        assert!(
            waiting.is_err(),
            "a logged-in sender of a slow message was cut off"
        );
        drop(held);
        procfs::rss_settles_below(served.child.id(), before + SETTLED_KIB).await;
        honest_start(&served).await;
    });
}

/// Questions never finished before login: bootstraps, and calls the
/// gatekeeper does not implement. The ninth closes the connection, with
/// the reason; a flood of them costs nothing either.
#[test]
fn questions_never_finished_before_login_close_the_connection() {
    common::run_local(async {
        let served = Served::start();
        honest_start(&served).await;
        let before = procfs::rss_quiet(served.child.id()).await;
        let peak = PeakRss::watch(served.child.id());
        let reason = "more than 8 questions outstanding before login; closing the connection";

        let mut bootstraps = hostile::connect(&served.tcp).await;
        hostile::unfinished_bootstraps(&mut bootstraps, 9).await;
        told_overloaded(&mut bootstraps, reason).await;

        let mut unimplemented = hostile::connect(&served.tcp).await;
        let mut calls = hostile::bootstrap(0);
        for question in 1..=8 {
            calls.extend(hostile::start(question, 0, None, &["true"]));
        }
        assert!(hostile::send(&mut unimplemented, &calls).await);
        told_overloaded(&mut unimplemented, reason).await;

        // A flood: the server stops reading at the ninth; the rest is cut
        // off with the connection.
        let mut flood = hostile::connect(&served.tcp).await;
        hostile::unfinished_bootstraps(&mut flood, 200_000).await;
        honest_start(&served).await;
        assert!(
            hostile::goodbye(&mut flood, GOODBYE).await.is_some(),
            "the flooding connection was not closed"
        );
        assert!(
            peak.peak_kib() < before + ATTACK_BOUND_KIB,
            "RSS {before} -> {} KiB",
            peak.peak_kib()
        );
        procfs::rss_settles_below(served.child.id(), before + SETTLED_KIB).await;
        honest_start(&served).await;
    });
}

/// After login, reads of a full 1 MiB log that are never finished: each
/// answer counts against the call-memory limit (16 MiB here) until its
/// `Finish`, whether the attacker reads it or lets it pile up unread, and
/// past the limit the connection is closed with the limit's name.
#[test]
fn answers_never_finished_count_against_the_call_memory_limit() {
    common::run_local(async {
        let served = Served::start_with(&["--max-call-memory-per-connection", "16"]);
        let dir = common::data::TempDir::new("abuse-answers");
        let file = dir.path().join("output");
        common::data::write_pattern_file(&file, 3, 2 << 20);
        // The log is full once the child sleeps: cat could not finish
        // writing 2 MiB into a pipe of at most 1 MiB before the server had
        // taken in the rest.
        let script = format!("cat {}; exec sleep 1000", file.display());
        let argv = ["sh", "-c", script.as_str()];
        let token = served.token();
        honest_start(&served).await;
        let before = procfs::rss_quiet(served.child.id()).await;
        let peak = PeakRss::watch(served.child.id());
        let reason = "calls and answers not yet finished on one connection hold more than 16 MiB; closing it";

        // Read as they come, never finished.
        let mut reader = hostile::logged_in(&served.tcp, token.as_str()).await;
        started_and_full(&served, &mut reader, &argv).await;
        hostile::unfinished_reads(&mut reader, 40).await;
        told_overloaded(&mut reader, reason).await;
        honest_start(&served).await;

        // Left unread: the answers pile up in the write queue.
        let mut unread = hostile::logged_in(&served.tcp, token.as_str()).await;
        started_and_full(&served, &mut unread, &argv).await;
        hostile::unfinished_reads(&mut unread, 40).await;
        let during = procfs::rss_quiet(served.child.id()).await;
        honest_start(&served).await;
        assert!(
            peak.peak_kib() < before + 16 * 1024 + ATTACK_BOUND_KIB,
            "RSS {before} -> {} KiB (settled at {during} with the answers unread)",
            peak.peak_kib()
        );
        told_overloaded(&mut unread, reason).await;
        drop((reader, unread));
        procfs::rss_settles_below(served.child.id(), before + SETTLED_KIB).await;
        honest_start(&served).await;
    });
}

/// Starts `argv` as question 2 on the logged-in `stream` and waits until
/// its log is full (it runs `sleep`).
async fn started_and_full(served: &Served, stream: &mut tokio::net::TcpStream, argv: &[&str]) {
    let pid = served.child.id();
    common::eventually_async("no sleep left from before", async || {
        !procfs::has_child_named(pid, "sleep")
    })
    .await;
    assert!(hostile::send(stream, &hostile::start(2, 1, Some(0), argv)).await);
    common::eventually_async("the sleep started", async || {
        procfs::has_child_named(pid, "sleep")
    })
    .await;
}

/// Connections that never log in: each costs the server little, one
/// address may hold only so many, the server only so many in all, and one
/// beyond either limit is refused at once, with the reason.
#[test]
fn idle_connections_before_login_are_cheap_and_limited() {
    common::run_local(async {
        let served = Served::start_with(&[
            "--max-pending-logins",
            "60",
            "--max-pending-logins-per-address",
            "50",
        ]);
        honest_start(&served).await;
        let before = procfs::rss_quiet(served.child.id()).await;
        let peak = PeakRss::watch(served.child.id());

        // Attackers at 127.0.0.2 and 127.0.0.3; honest clients at 127.0.0.1.
        let held = hostile::idle_connections("127.0.0.2", &served.tcp, 50).await;
        let mut beyond = hostile::connect_from("127.0.0.2", &served.tcp).await;
        told_overloaded(
            &mut beyond,
            "too many connections from this address have not logged in (the limit is 50); try \
             again later",
        )
        .await;
        let during = procfs::rss_quiet(served.child.id()).await;
        assert!(
            during < before + 50 * 32,
            "50 idle connections cost {} KiB, more than 32 KiB each",
            during.saturating_sub(before)
        );
        honest_start(&served).await;
        // Another address has its own count, up to the server's limit.
        let open = procfs::open_fds(served.child.id());
        let others = hostile::idle_connections("127.0.0.3", &served.tcp, 10).await;
        let mut full = hostile::connect_from("127.0.0.3", &served.tcp).await;
        told_overloaded(
            &mut full,
            "too many connections have not logged in (the server's limit is 60); try again later",
        )
        .await;
        // While the server is full, honest clients log in over Unix; over
        // TCP again once the server has seen a place come free.
        let unix: Address = served.unix.parse().expect("address");
        let connection = net::connect(&unix, None).await.expect("unix");
        let status = Command::new("true").status(&connection.executor()).await;
        assert!(status.expect("served over unix").success());
        drop((others, connection));
        common::eventually_async("the server's descriptors are given back", async || {
            procfs::open_fds(served.child.id()) <= open
        })
        .await;
        honest_start(&served).await;
        assert!(
            peak.peak_kib() < before + ATTACK_BOUND_KIB,
            "RSS {before} -> {} KiB",
            peak.peak_kib()
        );
        drop(held);
        procfs::rss_settles_below(served.child.id(), before + SETTLED_KIB).await;
        honest_start(&served).await;
    });
}

/// Connections beyond `--max-connections` are refused at once, over any
/// listener, logged in or not, each told why; a client whose connection is
/// refused hears the reason from its first call; a place comes free as a
/// connection closes.
#[test]
fn connections_beyond_the_server_s_limit_are_refused_with_the_reason() {
    const REASON: &str = "the server holds its most connections at once (the limit is 8); try \
                          again once others have closed";
    common::run_local(async {
        let served = Served::start_with(&["--max-connections", "8"]);
        let unix: Address = served.unix.parse().expect("address");
        // Held throughout: a connection closed here would come free in
        // the server's own time, maybe while the others connect.
        let first = net::connect(&unix, None).await.expect("connect");
        let status = Command::new("true").status(&first.executor()).await;
        assert!(status.expect("served").success());
        // One listener accepts in the order peers connected: the ninth is
        // accepted once the eight are.
        let mut held = Vec::new();
        for _ in 1..8 {
            let stream = tokio::net::UnixStream::connect(&served.socket).await;
            held.push(stream.expect("connect"));
        }
        let mut ninth = tokio::net::UnixStream::connect(&served.socket)
            .await
            .expect("connect");
        hostile::told(&mut ninth, exception::Type::Overloaded, REASON, GOODBYE).await;
        let mut over_tcp = hostile::connect(&served.tcp).await;
        told_overloaded(&mut over_tcp, REASON).await;
        let refused = match net::connect(&unix, None).await {
            Ok(connection) => Command::new("true")
                .status(&connection.executor())
                .await
                .expect_err("refused")
                .to_string(),
            Err(error) => error.to_string(),
        };
        assert!(refused.contains(REASON), "{refused}");
        held.pop();
        let deadline = std::time::Instant::now() + GOODBYE;
        loop {
            let connection = net::connect(&unix, None).await.expect("connect");
            match Command::new("true").status(&connection.executor()).await {
                Ok(status) => {
                    assert!(status.success());
                    break;
                }
                Err(error) => {
                    assert!(error.to_string().contains(REASON), "{error}");
                    assert!(
                        std::time::Instant::now() < deadline,
                        "no place came free: {error}"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    });
}

/// Logins sent in one go: the first three are checked and refused, the
/// fourth (with the right token) is not checked at all, the connection is
/// closed with the reason, and nothing pipelined on it runs.
#[test]
fn refused_logins_stop_at_three_even_when_pipelined() {
    common::run_local(async {
        let served = Served::start();
        let token = served.token();
        let mut stream = hostile::connect(&served.tcp).await;
        let mut attempt = hostile::bootstrap(0);
        for question in 1..=3 {
            attempt.extend(hostile::login(question, 0, "0123456789abcdef-wrong"));
        }
        attempt.extend(hostile::login(4, 0, token.as_str()));
        let marker = served.home.path().join("ran");
        let touch = format!("touch {}", marker.display());
        attempt.extend(hostile::start(5, 4, Some(0), &["sh", "-c", &touch]));
        assert!(hostile::send(&mut stream, &attempt).await);
        hostile::told(
            &mut stream,
            exception::Type::Failed,
            "3 logins were refused on this connection; closing it [capexec:unauthenticated]",
            GOODBYE,
        )
        .await;
        honest_start(&served).await;
        assert!(
            !marker.exists(),
            "a call pipelined on the unchecked login ran"
        );
    });
}

/// A connection that does not log in within the deadline is told so.
#[test]
fn the_login_deadline_is_the_reason_the_peer_sees() {
    common::run_local(async {
        let dir = common::data::TempDir::new("abuse-deadline");
        let config = capexec::net::ServerConfig {
            listen: vec!["tcp:127.0.0.1:0".parse().expect("address")],
            token_file: Some(dir.path().join("token")),
            login_deadline: Some(Duration::from_millis(300)),
            ..capexec::net::ServerConfig::default()
        };
        let server = common::server::ServerThread::serve(dir, config);
        let mut stream = hostile::connect(&server.address.to_string()).await;
        assert!(hostile::send(&mut stream, &hostile::bootstrap(0)).await);
        hostile::told(
            &mut stream,
            exception::Type::Failed,
            "no login within 0.3s; closing the connection [capexec:unauthenticated]",
            GOODBYE,
        )
        .await;
    });
}

/// What an honest client sends right after its login, pipelined on it
/// before the login is answered, goes through: a start of 200 KiB (over
/// the 4 KiB a message may have before login) and 40 starts at once (over
/// the 8 questions).
#[test]
fn calls_pipelined_on_a_login_wait_for_it_instead_of_closing() {
    common::run_local(async {
        let served = Served::start();
        let address: Address = served.tcp.parse().expect("address");
        let connection = net::connect(&address, Some(&served.token()))
            .await
            .expect("connect");
        let executor = connection.executor();
        let mut big = Command::new("sh");
        big.args(["-c", "exit 0"]);
        big.args((0..4).map(|_| "x".repeat(50 << 10)));
        let true_ = Command::new("true");
        let starts: Vec<_> = (0..40).map(|_| true_.status(&executor)).collect();
        let (big, starts) =
            futures::join!(big.status(&executor), futures::future::join_all(starts));
        assert!(big.expect("the big start").success());
        for status in starts {
            assert!(status.expect("a pipelined start").success());
        }
    });
}

/// The same sent by a raw peer in one write, so it all arrives before the
/// login is answered: a 16 KiB start and 12 more pipelined on the login.
#[test]
fn calls_in_the_same_packet_as_the_login_wait_for_it() {
    common::run_local(async {
        let served = Served::start();
        let token = served.token();
        let dir = served.home.path().join("ran");
        std::fs::create_dir(&dir).expect("dir");
        let mut burst = hostile::bootstrap(0);
        burst.extend(hostile::login(1, 0, token.as_str()));
        let padding = "x".repeat(16 << 10);
        for question in 2..15 {
            let touch = format!("touch {}/{question}", dir.display());
            let script = if question == 2 {
                format!("{touch} # {padding}")
            } else {
                touch
            };
            burst.extend(hostile::start(question, 1, Some(0), &["sh", "-c", &script]));
        }
        let mut stream = hostile::connect(&served.tcp).await;
        assert!(hostile::send(&mut stream, &burst).await);
        common::eventually_async("13 entries in the directory", async || {
            std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0) == 13
        })
        .await;
        let closed = tokio::time::timeout(
            Duration::from_millis(200),
            hostile::goodbye(&mut stream, GOODBYE),
        )
        .await;
        assert!(closed.is_err(), "the connection was closed");
    });
}
