//! Serving over sockets: authentication, socket files, many clients,
//! connection loss and shutdown. (The process contract itself runs against
//! these backends in `process_contract.rs`.)

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use capnp_rpc::rpc_twoparty_capnp::Side;
use futures::future::join_all;
use tokio::io::AsyncWriteExt;

use capexec::capexec_capnp::{executor, gatekeeper};
use capexec::client::{Command, Error};
use capexec::engine::Engine;
use capexec::model::{ExitStatus, RefusalKind};
use capexec::net::{self, Address, ConnectError, Server, ServerConfig, Token};
use common::data::TempDir;
use common::server::ServerThread;
use common::{procfs, read_until_output_contains, sh};

/// A raw two-party connection to `address`, bootstrapping a Gatekeeper.
async fn raw_gatekeeper(address: &Address) -> gatekeeper::Client {
    let Address::Tcp { host, port } = address else {
        panic!("not tcp: {address}");
    };
    let stream = tokio::net::TcpStream::connect((host.as_str(), *port))
        .await
        .expect("connect");
    let (reader, writer) = stream.into_split();
    let mut system = common::raw_client_system(reader, writer);
    let gatekeeper: gatekeeper::Client = system.bootstrap(Side::Server);
    tokio::task::spawn_local(system);
    gatekeeper
}

async fn login(gatekeeper: &gatekeeper::Client, token: &str) -> Result<(), capnp::Error> {
    let mut request = gatekeeper.login_request();
    request.get().set_token(token);
    request.send().promise.await.map(drop)
}

#[test]
fn tcp_needs_the_token_and_exposes_nothing_else() {
    common::run_local(async {
        let server = ServerThread::start(true);
        let token = server.token.clone().expect("token");

        let refused = net::connect(&server.address, None).await;
        assert!(matches!(refused, Err(ConnectError::TokenRequired(_))));

        let wrong = net::connect(&server.address, Some(&Token::new("not-the-token")))
            .await
            .expect("the connection itself succeeds");
        match Command::new("true").spawn(&wrong.executor()).await {
            Err(Error::Refused(refusal)) => {
                assert_eq!(refusal.message, "login refused: wrong token");
                assert_eq!(refusal.kind, RefusalKind::Unauthenticated);
            }
            other => panic!("expected the login refusal, got {:?}", other.map(|_| ())),
        }

        // The bootstrap capability only knows `login`.
        let gatekeeper = raw_gatekeeper(&server.address).await;
        let as_executor: executor::Client =
            capnp::capability::FromClientHook::new(gatekeeper.client.hook.clone());
        let mut start = as_executor.start_request();
        start.get().init_params().init_argv(1).set(0, b"true");
        let error = start.send().promise.await.err().expect("not an executor");
        assert_eq!(error.kind, capnp::ErrorKind::Unimplemented, "{error}");

        // Three refusals close the connection, and the peer is told why.
        for attempt in 1..=2 {
            let error = login(&gatekeeper, "wrong").await.expect_err("refused");
            assert!(
                error.extra.contains("login refused"),
                "attempt {attempt}: {error}"
            );
        }
        let _ = login(&gatekeeper, "wrong").await;
        let after = login(&gatekeeper, token.as_str())
            .await
            .expect_err("closed");
        match Error::from(after) {
            Error::Refused(refusal) => {
                assert_eq!(refusal.kind, RefusalKind::Unauthenticated);
                assert_eq!(
                    refusal.message,
                    "3 logins were refused on this connection; closing it"
                );
            }
            other => panic!("not the reason of the close: {other:?}"),
        }

        // A fresh connection with the right token works.
        let good = net::connect(&server.address, Some(&token))
            .await
            .expect("connect");
        let status = Command::new("true")
            .status(&good.executor())
            .await
            .expect("status");
        assert_eq!(status, ExitStatus::Code(0));
    });
}

#[test]
fn unix_socket_is_private_and_never_clobbers_what_is_not_ours() {
    common::run_local(async {
        let server = ServerThread::start(false);
        let Address::Unix(path) = &server.address else {
            panic!("unix")
        };
        let mode = std::fs::metadata(path)
            .expect("socket")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);

        // A live server's socket is not taken over.
        let second = Server::bind(
            ServerConfig {
                listen: vec![server.address.clone()],
                ..ServerConfig::default()
            },
            Engine::default(),
        )
        .await;
        let error = second.err().expect("in use").to_string();
        assert!(
            error.contains("is being served by another capexec"),
            "{error}"
        );

        let dir = TempDir::new("clobber");
        let bind = |path: std::path::PathBuf| {
            Server::bind(
                ServerConfig {
                    listen: vec![Address::Unix(path)],
                    ..ServerConfig::default()
                },
                Engine::default(),
            )
        };
        // A regular file stays.
        let file = dir.path().join("file");
        std::fs::write(&file, b"keep me").expect("write");
        let error = bind(file.clone()).await.err().expect("refused").to_string();
        assert!(error.contains("exists and is not a socket"), "{error}");
        assert_eq!(std::fs::read(&file).expect("still there"), b"keep me");
        // Someone else's socket stays.
        let foreign = dir.path().join("foreign.sock");
        let _foreign = std::os::unix::net::UnixListener::bind(&foreign).expect("bind");
        let error = bind(foreign.clone())
            .await
            .err()
            .expect("refused")
            .to_string();
        assert!(
            error.contains("a socket that capexec did not create"),
            "{error}"
        );
        assert!(foreign.exists());
        // A socket left behind by a capexec that died is replaced.
        let stale = dir.path().join("stale.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).expect("bind"));
        let mut lock = stale.as_os_str().to_owned();
        lock.push(".lock");
        std::fs::write(&lock, b"").expect("lock file");
        let revived = bind(stale.clone()).await.expect("stale socket replaced");
        assert_eq!(revived.addresses(), vec![Address::Unix(stale)]);
    });
}

#[test]
fn a_hundred_concurrent_clients_get_exactly_their_own_results() {
    common::run_local(async {
        let mut server = ServerThread::start_with(
            TempDir::new("hundred"),
            vec![
                Address::Unix(
                    std::env::temp_dir()
                        .join(format!("capexec-hundred-{}.sock", std::process::id())),
                ),
                "tcp:127.0.0.1:0".parse().expect("address"),
            ],
        );
        let addresses = server.addresses.clone();
        let token = server.token.clone();
        let clients = (0..100u32).map(|n| {
            let address = addresses[(n % 2) as usize].clone();
            let token = token.clone();
            async move {
                let connection = net::connect(&address, token.as_ref())
                    .await
                    .expect("connect");
                let mut command = sh(
                    "printf 'client-%s\\n' \"$1\"; printf 'err-%s' \"$1\" >&2; exit $(($1 % 50))",
                );
                command.args(["sh", &n.to_string()]);
                let output = command
                    .output(&connection.executor())
                    .await
                    .expect("output");
                (n, output)
            }
        });
        for (n, output) in join_all(clients).await {
            assert_eq!(output.stdout, format!("client-{n}\n").into_bytes());
            assert_eq!(output.stderr, format!("err-{n}").into_bytes());
            assert_eq!(output.exit.status, ExitStatus::Code((n % 50) as i32));
        }
        server.stop();
    });
}

/// A client whose connection drops loses its processes; other clients keep
/// theirs, and a stalled or garbage-sending client slows nobody.
#[test]
fn losing_a_connection_releases_only_that_clients_processes() {
    common::run_local(async {
        let server = ServerThread::start(false);
        let doomed = net::connect(&server.address, None).await.expect("connect");
        let survivor = net::connect(&server.address, None).await.expect("connect");
        let sleeper = |connection: &net::Connection| {
            let executor = connection.executor();
            async move {
                let process = sh("echo $$; exec sleep 1000")
                    .spawn(&executor)
                    .await
                    .expect("spawn");
                let (_, text) = read_until_output_contains(&process, "\n").await;
                (process, text.trim().parse::<u32>().expect("pid"))
            }
        };
        let (doomed_process, doomed_pid) = sleeper(&doomed).await;
        let (survivor_process, survivor_pid) = sleeper(&survivor).await;

        // A client that sends garbage, and one whose sink never acknowledges.
        let Address::Unix(path) = &server.address else {
            panic!("unix")
        };
        let mut garbage = tokio::net::UnixStream::connect(path)
            .await
            .expect("connect");
        garbage
            .write_all(&[0xff; 4096])
            .await
            .expect("write garbage");
        let stalled = net::connect(&server.address, None).await.expect("connect");
        let noisy = Command::new("yes")
            .spawn(&stalled.executor())
            .await
            .expect("spawn");
        let _never_read = noisy.events(0).await.expect("subscribe");

        drop(doomed);
        procfs::wait_gone(doomed_pid).await;
        // Capabilities still held on a dropped connection fail at once
        // rather than wait forever.
        let lost = doomed_process.info().await.expect_err("connection dropped");
        assert!(
            matches!(&lost, capexec::client::Error::Rpc(e) if e.kind == capnp::ErrorKind::Disconnected),
            "{lost}"
        );
        assert!(
            procfs::state(survivor_pid).is_some(),
            "the other client's process died"
        );
        let output = Command::new("echo")
            .arg("still served")
            .output(&survivor.executor())
            .await
            .expect("the server still serves");
        assert_eq!(output.stdout, b"still served\n");
        assert!(survivor_process.terminate().await.expect("terminate"));
    });
}

#[test]
fn shutdown_terminates_processes_and_removes_socket_files() {
    common::run_local(async {
        let dir = TempDir::new("shutdown");
        let socket_path = dir.path().join("s.sock");
        let mut server = ServerThread::start_with(
            TempDir::new("shutdown-server"),
            vec![
                Address::Unix(socket_path.clone()),
                "tcp:127.0.0.1:0".parse().expect("address"),
            ],
        );
        let connection = net::connect(&server.address, None).await.expect("connect");
        let process = sh("trap '' TERM; echo $$; exec sleep 1000")
            .spawn(&connection.executor())
            .await
            .expect("spawn");
        let (_, text) = read_until_output_contains(&process, "\n").await;
        let pid: u32 = text.trim().parse().expect("pid");
        // A finished process whose leftover ignores SIGTERM goes too.
        let finished = sh("(trap '' TERM; exec sleep 1000) >/dev/null 2>&1 & echo $!")
            .spawn(&connection.executor())
            .await
            .expect("spawn");
        let (_, text) = read_until_output_contains(&finished, "\n").await;
        let leftover: u32 = text.trim().parse().expect("leftover pid");
        finished.wait().await.expect("the leader exits at once");
        server.stop();
        // The client hears of it without polling.
        tokio::time::timeout(Duration::from_secs(20), connection.closed())
            .await
            .expect("closed() resolves once the server has gone");
        assert!(connection.is_closed());
        procfs::wait_gone(pid).await;
        procfs::wait_gone(leftover).await;
        assert!(!socket_path.exists(), "socket file left behind");
        let mut lock = socket_path.as_os_str().to_owned();
        lock.push(".lock");
        assert!(
            !std::path::Path::new(&lock).exists(),
            "lock file left behind"
        );
        let _ = tokio::time::timeout(Duration::from_secs(5), process.wait()).await;
    });
}

/// A client that piles up calls past the connection's limit is cut off
/// with the reason (its processes are released with it), and the server
/// goes on serving everyone else.
#[test]
fn a_flood_of_outstanding_calls_closes_that_connection_only() {
    common::run_local(async {
        let server = unix_server(
            "flood",
            ServerConfig {
                call_limits: net::CallLimits {
                    max_calls: 50,
                    max_bytes: 64 << 20,
                },
                ..ServerConfig::default()
            },
        );
        let flooder = net::connect(&server.address, None).await.expect("connect");
        let process = sh("echo pid-$$-; exec sleep 1000")
            .spawn(&flooder.executor())
            .await
            .expect("start");
        let (seq, text) = read_until_output_contains(&process, "-\n").await;
        let pid = common::pid_after(&text, "pid-");
        // Long polls for what comes next: each stays outstanding.
        let polls: Vec<_> = (0..60)
            .map(|_| process.read(seq, 0, Duration::from_secs(600)))
            .collect();
        let outcomes = join_all(polls).await;
        let refused = outcomes
            .iter()
            .find_map(|outcome| outcome.as_ref().err())
            .expect("the flood was refused");
        assert!(
            refused
                .to_string()
                .contains("more than 50 calls outstanding on one connection"),
            "{refused}"
        );
        procfs::wait_gone(pid).await;

        let other = net::connect(&server.address, None).await.expect("connect");
        let status = Command::new("true").status(&other.executor()).await;
        assert_eq!(status.expect("served"), ExitStatus::Code(0));
    });
}

/// A connection's starts hold at most its quota of processes (another
/// connection has its own), a released one frees its place, and the
/// server's own limit holds across connections.
#[test]
fn process_limits_per_connection_and_per_server() {
    common::run_local(async {
        let server = unix_server(
            "quota",
            ServerConfig {
                max_processes_per_connection: Some(2),
                ..ServerConfig::default()
            },
        );
        let first = net::connect(&server.address, None).await.expect("connect");
        let sleep = sh("exec sleep 1000");
        let held = [
            sleep.spawn(&first.executor()).await.expect("first"),
            sleep.spawn(&first.executor()).await.expect("second"),
        ];
        match sleep.spawn(&first.executor()).await {
            Err(Error::Refused(error)) => {
                assert_eq!(error.kind, capexec::model::RefusalKind::LimitReached);
                assert_eq!(
                    error.message,
                    "this connection already holds its maximum of 2 processes"
                );
            }
            other => panic!("a third process was started: {:?}", other.map(drop)),
        }
        let second = net::connect(&server.address, None).await.expect("connect");
        let other = sleep
            .spawn(&second.executor())
            .await
            .expect("its own quota");
        drop(other);

        let [one, two] = held;
        drop(one);
        // The release travels to the server: poll until the place is free.
        let again = spawn_when_there_is_room(&sleep, &first.executor()).await;
        drop((again, two));
    });

    common::run_local(async {
        let limits = capexec::engine::ProcessLimits {
            max_processes: Some(1),
            ..Default::default()
        };
        let executor = capexec::rpc::local_executor(Engine::new(limits));
        let sleep = sh("exec sleep 1000");
        let _held = sleep.spawn(&executor).await.expect("first");
        match sleep.spawn(&executor).await {
            Err(Error::Refused(error)) => {
                assert_eq!(error.kind, capexec::model::RefusalKind::LimitReached);
                assert_eq!(
                    error.message,
                    "the executor already holds its maximum of 1 processes"
                );
            }
            other => panic!("a second process was started: {:?}", other.map(drop)),
        }
    });
}

/// A TCP peer that never logs in loses its connection at the deadline; one
/// that logged in keeps it.
#[test]
fn a_connection_that_never_logs_in_is_closed_at_the_deadline() {
    common::run_local(async {
        let dir = TempDir::new("login-deadline");
        let config = ServerConfig {
            listen: vec!["tcp:127.0.0.1:0".parse().expect("address")],
            token_file: Some(dir.path().join("token")),
            login_deadline: Some(Duration::from_millis(300)),
            ..ServerConfig::default()
        };
        let server = ServerThread::serve(dir, config);
        let token = server.token.clone().expect("token");
        let Address::Tcp { host, port } = &server.address else {
            panic!("not tcp");
        };
        // Logged in before the idle one connects: the deadline is short,
        // and a loaded machine must not make the member miss it too.
        let member = net::connect(&server.address, Some(&token))
            .await
            .expect("connect");
        Command::new("true")
            .status(&member.executor())
            .await
            .expect("logged in");
        let stream = tokio::net::TcpStream::connect((host.as_str(), *port))
            .await
            .expect("connect");
        let (reader, writer) = stream.into_split();
        let mut idle = common::raw_client_system(reader, writer);
        let _gatekeeper: gatekeeper::Client = idle.bootstrap(Side::Server);
        // The idle connection's system ends when the server closes it.
        // Whether it ended cleanly or with an error does not matter: it ended.
        let _ended = tokio::time::timeout(Duration::from_secs(30), idle)
            .await
            .expect("the idle connection was closed");
        let still = Command::new("true").status(&member.executor()).await;
        assert_eq!(
            still.expect("the logged-in connection lives"),
            ExitStatus::Code(0)
        );
    });
}

/// A restore counts against the restoring connection's quota; refused, it
/// leaves the process parked for someone else to restore.
#[test]
fn restores_count_against_the_restoring_connection() {
    common::run_local(async {
        let server = unix_server(
            "restore-quota",
            ServerConfig {
                max_processes_per_connection: Some(1),
                ..ServerConfig::default()
            },
        );
        let sleep = sh("exec sleep 1000");
        let owner = net::connect(&server.address, None).await.expect("connect");
        let detached = sleep.spawn(&owner.executor()).await.expect("start");
        let token = detached
            .detachable(Duration::from_secs(60))
            .await
            .expect("detachable");
        drop((detached, owner));

        let full = net::connect(&server.address, None).await.expect("connect");
        let _held = sleep
            .spawn(&full.executor())
            .await
            .expect("its one process");
        let (_, refused) = capexec::client::restore(&full.executor(), &token);
        match refused.await {
            Err(Error::Refused(error)) => {
                assert_eq!(error.kind, capexec::model::RefusalKind::LimitReached)
            }
            other => panic!("the restore went over the quota: {other:?}"),
        }
        let other = net::connect(&server.address, None).await.expect("connect");
        let (process, restored) = capexec::client::restore(&other.executor(), &token);
        restored.await.expect("still parked, restorable");
        process.terminate().await.expect("terminate");
    });
}

/// A view keeps the process's record, so it keeps the process's place in
/// its connection's quota until the view goes too.
#[test]
fn a_view_keeps_its_process_counted() {
    common::run_local(async {
        let server = unix_server(
            "view-quota",
            ServerConfig {
                max_processes_per_connection: Some(1),
                ..ServerConfig::default()
            },
        );
        let connection = net::connect(&server.address, None).await.expect("connect");
        let sleep = sh("exec sleep 1000");
        let process = sleep.spawn(&connection.executor()).await.expect("start");
        let view = process.observer();
        view.info().await.expect("the view works");
        drop(process);
        common::wait_closed_at_head(&view).await;
        assert!(matches!(
            sleep.spawn(&connection.executor()).await,
            Err(Error::Refused(error)) if error.kind == capexec::model::RefusalKind::LimitReached
        ));
        drop(view);
        spawn_when_there_is_room(&sleep, &connection.executor()).await;
    });
}

/// A Unix-socket server with `config` (its listener filled in).
fn unix_server(name: &str, mut config: ServerConfig) -> ServerThread {
    let dir = TempDir::new(name);
    config.listen = vec![Address::Unix(dir.path().join("capexec.sock"))];
    ServerThread::serve(dir, config)
}

/// Starts `command` once a released process's place has come back (the
/// release travels to the server).
async fn spawn_when_there_is_room(
    command: &Command,
    executor: &executor::Client,
) -> capexec::client::RemoteProcess {
    common::eventually_async("the released place comes back", async || {
        command.spawn(executor).await
    })
    .await
}

/// A clean shutdown (what `capexec serve` does on SIGTERM), over both
/// transports: the exit of each process it terminated says so and reaches
/// its subscriber, then every call of the connection fails with the
/// reason, which the connection names.
#[test]
fn a_clean_shutdown_delivers_the_exits_then_says_why() {
    common::run_local(async {
        for tcp in [false, true] {
            let mut server = ServerThread::start(tcp);
            let connection = net::connect(&server.address, server.token.as_ref())
                .await
                .expect("connect");
            let process = sh("echo ready; exec sleep 1000")
                .spawn(&connection.executor())
                .await
                .expect("spawn");
            let (after, _) = read_until_output_contains(&process, "ready\n").await;
            let mut events = process.events(after).await.expect("subscribe");
            // Stopping joins the server's thread: not on this one, which
            // acknowledges the pushes.
            let stopped = tokio::task::spawn_blocking(move || server.stop());
            let mut exit = None;
            while let Some(batch) = events.next_batch().await {
                for event in batch.expect("events before the close") {
                    match event.body {
                        capexec::model::EventBody::Exited(exited) => exit = Some(exited),
                        capexec::model::EventBody::Closed => break,
                        _ => {}
                    }
                }
                if exit.is_some() {
                    break;
                }
            }
            let exit = exit.expect("the exit was delivered");
            assert!(exit.server_shutdown, "{exit}");
            assert_eq!(
                exit.status.shell_code(),
                128 + libc::SIGTERM,
                "tcp={tcp}: {exit}"
            );
            stopped.await.expect("the server stopped");
            assert_eq!(
                connection.abort_reason().await.as_deref(),
                Some(net::SHUTDOWN_REASON),
                "tcp={tcp}"
            );
        }
    });
}

/// A client that reads none of its events cannot hold a clean shutdown
/// (its subscription's window stays full): the server closes its
/// connection after the delivery bound all the same, and says why.
#[test]
fn a_clean_shutdown_is_not_held_by_a_client_that_does_not_read() {
    common::run_local(async {
        let mut server = ServerThread::start(false);
        let stalled = net::connect(&server.address, None).await.expect("connect");
        let mut noisy = Command::new("yes");
        noisy.flow(capexec::model::Flow::Lossless);
        let noisy = noisy.spawn(&stalled.executor()).await.expect("spawn");
        let _never_read = noisy.events(0).await.expect("subscribe");
        let stopped = tokio::task::spawn_blocking(move || server.stop());
        stopped.await.expect("the server stopped");
        assert_eq!(
            stalled.abort_reason().await.as_deref(),
            Some(net::SHUTDOWN_REASON)
        );
    });
}

/// The socket file at `path` and its lock file, whichever exist.
fn socket_files_at(path: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut lock = path.as_os_str().to_owned();
    lock.push(".lock");
    [path.to_path_buf(), std::path::PathBuf::from(lock)]
        .into_iter()
        .filter(|file| std::fs::symlink_metadata(file).is_ok())
        .collect()
}

/// A start that fails after the admin socket was bound (here: a passed
/// socket named "admin" that is TCP, refused once the admin socket file is
/// there) leaves neither the socket file nor its lock behind.
#[test]
fn a_start_that_fails_after_binding_the_admin_socket_leaves_no_socket_file() {
    common::run_local(async {
        let dir = TempDir::new("admin-fails");
        let admin = dir.path().join("admin.sock");
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let passed = net::activation::InheritedSocket {
            fd: std::sync::Arc::new(capexec::sys::low_slots::KeepsItsSlot::new(
                std::os::fd::OwnedFd::from(tcp),
            )),
            name: "admin".into(),
            path: None,
        };
        let started = Server::bind(
            ServerConfig {
                admin: Some(admin.clone()),
                inherited: vec![passed],
                token_file: Some(dir.path().join("token")),
                ..ServerConfig::default()
            },
            Engine::default(),
        )
        .await;
        let error = started.err().expect("refused").to_string();
        assert_eq!(
            error,
            "socket activation: the socket \"admin\": the admin socket must be a Unix socket \
             (ListenStream=/PATH)"
        );
        assert_eq!(socket_files_at(&admin), Vec::<std::path::PathBuf>::new());
    });
}

/// A clean shutdown removes every socket file the server made: each
/// listener's and the admin socket's, with their lock files.
#[test]
fn a_clean_shutdown_removes_every_socket_file_it_made() {
    common::run_local(async {
        let dir = TempDir::new("shutdown-files");
        let listen = dir.path().join("serve.sock");
        let admin = dir.path().join("admin.sock");
        let server = Server::bind(
            ServerConfig {
                listen: vec![Address::Unix(listen.clone())],
                admin: Some(admin.clone()),
                ..ServerConfig::default()
            },
            Engine::default(),
        )
        .await
        .expect("bind");
        for path in [&listen, &admin] {
            assert_eq!(socket_files_at(path).len(), 2, "{}", path.display());
        }
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::task::spawn_local(server.serve_until(async move {
            let _ = stopped.await;
        }));
        let connection = net::connect(&Address::Unix(listen.clone()), None)
            .await
            .expect("connect");
        let status = Command::new("true")
            .status(&connection.executor())
            .await
            .expect("status");
        assert_eq!(status, ExitStatus::Code(0));
        stop.send(()).expect("serving");
        tokio::time::timeout(Duration::from_secs(30), serving)
            .await
            .expect("shut down")
            .expect("serve_until");
        for path in [&listen, &admin] {
            assert_eq!(socket_files_at(path), Vec::<std::path::PathBuf>::new());
        }
    });
}
