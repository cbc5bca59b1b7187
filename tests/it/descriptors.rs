//! A server under a small descriptor limit (256): its process limits are
//! what the limit carries, running out is `[capexec:limit]` (never
//! `spawn-failed`), and one connection at its quota leaves room for
//! another's starts and for new connections.

use crate::common;

use capexec::client::{Command, Error, RemoteProcess, Stdin};
use capexec::model::{PtySize, RefusalKind};
use capexec::net::{self, Address, Connection};

use common::cli::Served;
use common::procfs;

const LIMIT: u64 = 256;

async fn unix(served: &Served) -> Connection {
    let address: Address = served.unix.parse().expect("address");
    net::connect(&address, None).await.expect("connect")
}

/// A process holding every descriptor a process can: stdin piped.
fn sleeper() -> Command {
    let mut sleep = Command::new("sleep");
    sleep.arg("1000").stdin(Stdin::Piped);
    sleep
}

/// Starts sleepers on `connection` until a start is refused; returns them
/// and the refusal, which must be a limit.
async fn fill(connection: &Connection) -> (Vec<RemoteProcess>, String) {
    let mut held = Vec::new();
    loop {
        match sleeper().spawn(&connection.executor()).await {
            Ok(process) => held.push(process),
            Err(Error::Refused(error)) => {
                assert_eq!(error.kind, RefusalKind::LimitReached, "{error}");
                return (held, error.message);
            }
            Err(other) => panic!("a start failed otherwise: {other}"),
        }
        assert!(
            held.len() < LIMIT as usize,
            "more processes than descriptors"
        );
    }
}

#[test]
fn a_connection_at_its_quota_leaves_room_for_other_starts_and_connections() {
    common::run_local(async {
        let served = Served::start_limited(&[], Some(LIMIT));
        let pid = served.child.id();
        let first = unix(&served).await;
        let (first_held, refused) = fill(&first).await;
        let quota = first_held.len();
        assert!(
            quota >= 10,
            "only {quota} processes under {LIMIT} descriptors"
        );
        assert_eq!(
            refused,
            format!("this connection already holds its maximum of {quota} processes")
        );

        // Another client starts, then fills what is left of the server.
        let second = unix(&served).await;
        let (second_held, refused) = fill(&second).await;
        assert!(!second_held.is_empty(), "the first connection took it all");
        let max = quota + second_held.len();
        assert_eq!(
            refused,
            format!("the executor already holds its maximum of {max} processes")
        );
        let mut tty = Command::new("true");
        tty.tty(PtySize::default());
        match tty.spawn(&second.executor()).await {
            Err(Error::Refused(error)) => assert_eq!(error.kind, RefusalKind::LimitReached),
            other => panic!("a terminal start at the limit: {:?}", other.map(drop)),
        }
        // The descriptors kept for connections are untouched: a new TCP
        // client connects, logs in and is answered.
        assert!(
            procfs::open_fds(pid) as u64 <= LIMIT - 64,
            "the reserve was used"
        );
        let tcp: Address = served.tcp.parse().expect("address");
        let third = net::connect(&tcp, Some(&served.token()))
            .await
            .expect("tcp");
        capexec::client::info(&third.executor())
            .await
            .expect("a new connection is served");

        // Released processes give their places back once the releases
        // reach the server.
        drop((first_held, second_held));
        common::eventually_async("room again", async || {
            match Command::new("true").status(&first.executor()).await {
                Ok(status) => {
                    assert!(status.success());
                    Ok(())
                }
                Err(Error::Refused(error)) if error.kind == RefusalKind::LimitReached => Err(error),
                Err(other) => panic!("{other}"),
            }
        })
        .await;
    });
}

#[test]
fn running_out_of_descriptors_is_a_limit_not_a_spawn_failure() {
    common::run_local(async {
        let served = Served::start_limited(&[], Some(LIMIT));
        let pid = served.child.id();
        let working = unix(&served).await;
        // Connections (one descriptor each at the server), each handing
        // over descriptors no start takes (kept for one, up to 16 a
        // connection: at this limit the server keeps no share for what
        // clients send, and says so), until only a few descriptors are
        // left: fewer than a start needs. Connections alone no longer can:
        // they stop at the share kept for them.
        let mut connections = Vec::new();
        while (procfs::open_fds(pid) as u64) < LIMIT - 4 {
            // Counted before the connection: the server opens a descriptor
            // for a moment on each accept (the peer check), which a count
            // taken then would include.
            let open = procfs::open_fds(pid);
            let connection = unix(&served).await;
            let left = (LIMIT as usize - 4).saturating_sub(open + 1);
            let handed: Vec<std::os::fd::OwnedFd> = (0..left
                .min(capexec::rpc::MAX_KEPT_DESCRIPTORS))
                .map(|_| std::fs::File::open("/dev/null").expect("/dev/null").into())
                .collect();
            let expected = open + 1 + handed.len();
            connection
                .stdio_route()
                .expect("a Unix connection")
                .hand_over(handed);
            // Sent with the call's bytes.
            capexec::client::info(&connection.executor())
                .await
                .expect("info");
            connections.push(connection);
            common::eventually_async("the server holds the new connection", async || {
                procfs::open_fds(pid) >= expected
            })
            .await;
        }
        match sleeper().spawn(&working.executor()).await {
            Err(Error::Refused(error)) => {
                assert_eq!(error.kind, RefusalKind::LimitReached, "{error}");
                assert_eq!(
                    error.message,
                    "cannot start sleep: the server is out of file descriptors; release \
                     processes or connections and try again"
                );
            }
            other => panic!("a start without descriptors: {:?}", other.map(drop)),
        }
        // Released connections give their descriptors back.
        let open = procfs::open_fds(pid);
        connections.truncate(connections.len() / 2);
        common::eventually_async(
            "the released connections' descriptors are closed",
            async || procfs::open_fds(pid) + 16 <= open,
        )
        .await;
        let status = Command::new("true").status(&working.executor()).await;
        assert!(status.expect("served again").success());
    });
}

/// The processes a terminal session leaves when its leader ends: where
/// the limit keeps no room to follow them (a pidfd each; at 256), they
/// are killed with their leader rather than left to outlive the
/// process's release or to fill the server's table (a review's client
/// left 14,282 of them, each a descriptor of the server's); where it
/// does, one lives on until the process is released. (Its output goes
/// elsewhere: the terminal's output, and so the exit, ends once every
/// holder of the terminal has closed it.)
#[test]
fn a_terminal_session_s_processes_are_followed_only_as_far_as_the_limit_keeps_room() {
    common::run_local(async {
        for (limit, followed) in [(Some(LIMIT), false), (None, true)] {
            let served = Served::start_limited(&[], limit);
            let connection = unix(&served).await;
            let dir = common::data::TempDir::new("session-members");
            let said = dir.path().join("pid");
            let mut shell = Command::new("sh");
            shell
                .arg("-c")
                .arg(format!(
                    "trap '' HUP; sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > {}.new && \
                     mv {0}.new {0}; exit 0",
                    said.display()
                ))
                .tty(PtySize::default());
            let process = shell.spawn(&connection.executor()).await.expect("spawn");
            assert!(process.wait().await.expect("the leader ends").success());
            let straggler: u32 = common::eventually_async("the pid is written", async || {
                std::fs::read_to_string(&said).ok()?.trim().parse().ok()
            })
            .await;
            if followed {
                assert!(
                    procfs::state(straggler).is_some_and(|state| state != 'Z'),
                    "the straggler lives on while the process is held"
                );
                drop(process);
            }
            procfs::wait_gone(straggler).await;
        }
    });
}
