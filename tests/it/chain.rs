//! Chained executors: servers that forward to upstream servers, named
//! environments, and promise pipelining kept across every hop. (The whole
//! process contract also runs through a chain: see the `chained` backend of
//! `process_contract.rs` and `terminal_contract.rs`.)

use crate::common;

use std::time::{Duration, Instant};

use capexec::capexec_capnp::executor;
use capexec::client::{self, Command, Error, Stdin};
use capexec::model::{EnvironmentState, EventBody, ExitStatus, RefusalKind, WriteStatus};
use capexec::net::{Address, Token, UpstreamConfig};
use common::data::TempDir;
use common::proxy::Proxy;
use common::server::ServerThread;
use common::{pid_after, procfs, read_until_output_contains, sh};
use futures::StreamExt;

fn upstream(name: &str, server: &ServerThread) -> UpstreamConfig {
    UpstreamConfig::new(name, server.address.clone(), server.token.clone())
}

fn unix_server_forwarding_to(
    upstreams: Vec<UpstreamConfig>,
    default_environment: Option<&str>,
) -> ServerThread {
    let dir = TempDir::new("chain");
    let listen = vec![Address::Unix(dir.path().join("capexec.sock"))];
    ServerThread::start_forwarding(dir, listen, upstreams, default_environment)
}

async fn connect(server: &ServerThread) -> capexec::net::Connection {
    capexec::net::connect(&server.address, server.token.as_ref())
        .await
        .expect("connect")
}

/// Starts `sh -c 'echo $$; exec sleep 1000'` and returns it with its pid.
async fn sleeper(executor: &executor::Client) -> (client::RemoteProcess, u32) {
    let process = sh("echo pid-$$-; exec sleep 1000")
        .spawn(executor)
        .await
        .expect("start the sleeper");
    let (_, text) = read_until_output_contains(&process, "-\n").await;
    (process, pid_after(&text, "pid-"))
}

fn start_error(result: Result<client::RemoteProcess, Error>) -> capexec::model::Refusal {
    match result {
        Err(Error::Refused(error)) => error,
        Err(other) => panic!("expected a start error, got {other}"),
        Ok(_) => panic!("expected the start to fail"),
    }
}

/// Waits until the proxy has seen `calls` calls.
async fn wait_for_calls(proxy: &Proxy, calls: u64, what: &str) {
    common::eventually_async(what, async || {
        let seen = proxy.calls();
        if seen >= calls {
            Ok(())
        } else {
            Err(format!(
                "saw {seen} calls of {calls}: a hop waited for an answer"
            ))
        }
    })
    .await
}

fn unix_path(address: &Address) -> std::path::PathBuf {
    match address {
        Address::Unix(path) => path.clone(),
        Address::Tcp { .. } => unreachable!("a unix server"),
    }
}

/// A counting proxy in front of `server`, listening in `dir` as `name`.
fn proxy_to(dir: &TempDir, name: &str, server: &ServerThread) -> Proxy {
    Proxy::start(
        &dir.path().join(name),
        &unix_path(&server.address),
        Duration::ZERO,
    )
    .expect("start a proxy")
}

fn through(name: &str, proxy: &Proxy) -> UpstreamConfig {
    UpstreamConfig::new(name, Address::Unix(proxy.path().to_path_buf()), None)
}

/// Runs start -> write -> closeStdin -> subscribe on `executor` without
/// waiting between the calls, holding every answer back until each link
/// has carried its expected number of calls (which can only happen if no
/// hop waits for an answer), then checks each link took them in one flight.
async fn pipelined_flow(executor: &executor::Client, links: &[(&Proxy, u64, &str)]) {
    let mut cat = Command::new("cat");
    cat.stdin(Stdin::Piped);
    let (process, started) = cat.spawn_pipelined(executor);
    let write = process.write_in_order(b"pipelined\n", "w1");
    let close = tokio::task::spawn_local({
        let process = process.clone();
        async move { process.close_stdin().await }
    });
    let output = tokio::task::spawn_local({
        let process = process.clone();
        async move { collect(&process).await }
    });
    for (proxy, calls, name) in links {
        wait_for_calls(proxy, *calls, name).await;
    }
    for (proxy, calls, name) in links {
        assert_eq!((proxy.calls(), proxy.flights()), (*calls, 1), "{name}");
        proxy.set_open(true);
    }
    started.await.expect("started");
    assert_eq!(write.outcome().await.expect("write"), WriteStatus::Accepted);
    close.await.expect("task").expect("close stdin");
    let (status, bytes) = output.await.expect("task");
    assert_eq!(
        (status, bytes.as_slice()),
        (ExitStatus::Code(0), &b"pipelined\n"[..])
    );
}

fn hold_answers(proxies: &[&Proxy]) {
    for proxy in proxies {
        proxy.reset();
        proxy.set_open(false);
    }
}

/// start -> write -> closeStdin -> subscribe through client -> A -> B with
/// a counting proxy on each link: pipelined, the four calls cross each link
/// in one flight; sequential, each waits for the previous answer.
#[test]
fn pipelining_costs_one_trip_per_hop() {
    common::run_local(async {
        let dir = TempDir::new("proxies");
        let far = ServerThread::start(false);
        let to_far = proxy_to(&dir, "b.sock", &far);
        let middle = unix_server_forwarding_to(vec![through("b", &to_far)], Some("b"));
        let to_middle = proxy_to(&dir, "a.sock", &middle);
        let connection =
            capexec::net::connect(&Address::Unix(to_middle.path().to_path_buf()), None)
                .await
                .expect("connect through the proxy");
        let executor = connection.executor();
        // Connects A to B; the flows below run on warm connections.
        let warm = Command::new("true")
            .status(&executor)
            .await
            .expect("warm up");
        assert_eq!(warm, ExitStatus::Code(0));

        hold_answers(&[&to_middle, &to_far]);
        pipelined_flow(
            &executor,
            &[(&to_middle, 4, "client -> A"), (&to_far, 4, "A -> B")],
        )
        .await;

        // Sequential: every call waits for the answer to the one before.
        to_middle.reset();
        to_far.reset();
        let mut cat = Command::new("cat");
        cat.stdin(Stdin::Piped);
        let process = cat.spawn(&executor).await.expect("start");
        assert_eq!(
            process.write(b"sequential\n", "w1").await.expect("write"),
            WriteStatus::Accepted
        );
        process.close_stdin().await.expect("close stdin");
        let (status, bytes) = collect(&process).await;
        assert_eq!(
            (status, bytes.as_slice()),
            (ExitStatus::Code(0), &b"sequential\n"[..])
        );
        assert_eq!((to_middle.calls(), to_middle.flights()), (4, 4));
        assert_eq!((to_far.calls(), to_far.flights()), (4, 4));
    });
}

/// The same through explicit environments over two hops: the client's
/// `environment("b").environment("c").start(...)...` crosses every link in
/// one flight, including the `environment` call A forwards to B.
#[test]
fn pipelining_through_environment_paths_costs_one_trip_per_hop() {
    common::run_local(async {
        let dir = TempDir::new("proxies");
        let c = ServerThread::start(false);
        let to_c = proxy_to(&dir, "c.sock", &c);
        let b = unix_server_forwarding_to(vec![through("c", &to_c)], None);
        let to_b = proxy_to(&dir, "b.sock", &b);
        let a = unix_server_forwarding_to(vec![through("b", &to_b)], None);
        let to_a = proxy_to(&dir, "a.sock", &a);
        let connection = capexec::net::connect(&Address::Unix(to_a.path().to_path_buf()), None)
            .await
            .expect("connect through the proxy");
        let root = connection.executor();
        let warm = Command::new("true")
            .status(&client::environment(&root, "b/c"))
            .await
            .expect("warm up");
        assert_eq!(warm, ExitStatus::Code(0));

        hold_answers(&[&to_a, &to_b, &to_c]);
        let far = client::environment(&root, "b/c");
        pipelined_flow(
            &far,
            &[
                (&to_a, 6, "client -> A"),
                (&to_b, 5, "A -> B"),
                (&to_c, 4, "B -> C"),
            ],
        )
        .await;
    });
}

/// A directory's executor through a hop keeps pipelining: the client's
/// `directory(p).executor().start(...)` and the calls on its process cross
/// each link in one flight (the far link took two before: A answered the
/// start only once B had).
#[test]
fn pipelining_through_a_directorys_executor_costs_one_trip_per_hop() {
    common::run_local(async {
        let dir = TempDir::new("proxies");
        let work = TempDir::new("direxec-chain");
        let far = ServerThread::start(false);
        let to_far = proxy_to(&dir, "b.sock", &far);
        let middle = unix_server_forwarding_to(vec![through("b", &to_far)], Some("b"));
        let to_middle = proxy_to(&dir, "a.sock", &middle);
        let connection =
            capexec::net::connect(&Address::Unix(to_middle.path().to_path_buf()), None)
                .await
                .expect("connect through the proxy");
        let executor = connection.executor();
        let warm = Command::new("true")
            .status(&executor)
            .await
            .expect("warm up");
        assert_eq!(warm, ExitStatus::Code(0));

        hold_answers(&[&to_middle, &to_far]);
        let confined = capexec::client::Directory::open(&executor, work.path()).executor();
        pipelined_flow(
            &confined,
            &[(&to_middle, 6, "client -> A"), (&to_far, 6, "A -> B")],
        )
        .await;
    });
}

/// Exit status and stdout, from a subscription until `closed`.
async fn collect(process: &client::RemoteProcess) -> (ExitStatus, Vec<u8>) {
    let mut events = process.events(0).await.expect("subscribe");
    let (mut status, mut output) = (None, Vec::new());
    while let Some(event) = events.next().await {
        match event.expect("event").body {
            EventBody::Output { data, .. } => output.extend_from_slice(&data),
            EventBody::Exited(exit) => status = Some(exit),
            EventBody::Closed => break,
            EventBody::Gap { .. } => panic!("lossless output had a gap"),
        }
    }
    (status.expect("exit status").status, output)
}

#[test]
fn dropping_a_process_kills_it_at_the_end_of_a_two_hop_chain() {
    common::run_local(async {
        let c = ServerThread::start(false);
        let b = unix_server_forwarding_to(vec![upstream("c", &c)], Some("c"));
        let a = unix_server_forwarding_to(vec![upstream("b", &b)], Some("b"));
        let connection = connect(&a).await;
        let executor = connection.executor();
        // By default A -> B -> C; by path, the same through A's and B's
        // explicit environments.
        for executor in [executor.clone(), client::environment(&executor, "b/c")] {
            let info = client::info(&executor).await.expect("info");
            assert_eq!(info.environment, "b/c", "starts run at C");
            let (process, pid) = sleeper(&executor).await;
            assert_eq!(process.info().await.expect("info").pid, pid);
            assert_eq!(procfs::state(pid).map(|s| s != 'Z'), Some(true));
            drop(process);
            procfs::wait_gone(pid).await;
        }
    });
}

#[test]
fn losing_the_client_connection_releases_processes_along_the_chain() {
    common::run_local(async {
        let c = ServerThread::start(false);
        let b = unix_server_forwarding_to(vec![upstream("c", &c)], Some("c"));
        let connection = connect(&b).await;
        let (_process, pid) = sleeper(&connection.executor()).await;
        drop(connection);
        procfs::wait_gone(pid).await;
    });
}

#[test]
fn killing_the_middle_server_releases_what_was_started_through_it() {
    common::run_local(async {
        let c = ServerThread::start(false);
        let home = TempDir::new("middle");
        let socket = home.path().join("b.sock");
        let (mut middle, line) = common::cli::spawn_until_first_line({
            let mut command = common::cli::capexec(&["serve", "--listen"]);
            command
                .arg(format!("unix:{}", socket.display()))
                .arg("--upstream")
                .arg(format!("c={}", c.address))
                .args(["--default", "c"])
                .env("HOME", home.path());
            command
        });
        assert_eq!(line.trim(), format!("unix:{}", socket.display()));
        let connection = capexec::net::connect(&Address::Unix(socket), None)
            .await
            .expect("connect to the middle server");
        let (_process, pid) = sleeper(&connection.executor()).await;
        let middle_pid = middle.id();
        middle.kill().expect("SIGKILL the middle server");
        // This test process reaps orphans too, so its reaper thread may reap
        // the child first: wait for it to be gone either way.
        let _ = middle.wait();
        procfs::wait_gone(middle_pid).await;
        procfs::wait_gone(pid).await;
    });
}

#[test]
fn unknown_names_unreachable_upstreams_and_wrong_tokens_are_clear_errors() {
    common::run_local(async {
        let good = ServerThread::start(false);
        let guarded = ServerThread::start(true);
        let nowhere = TempDir::new("nowhere");
        let missing = nowhere.path().join("missing.sock");
        let server = unix_server_forwarding_to(
            vec![
                upstream("good", &good),
                UpstreamConfig::new("gone", Address::Unix(missing.clone()), None),
                UpstreamConfig::new(
                    "guarded",
                    guarded.address.clone(),
                    Some(Token::new("not-the-token")),
                ),
            ],
            None,
        );
        let connection = connect(&server).await;
        let executor = connection.executor();

        let unknown = start_error(
            Command::new("true")
                .spawn(&client::environment(&executor, "nope"))
                .await,
        );
        assert_eq!(unknown.kind, RefusalKind::UnknownEnvironment);
        assert_eq!(
            unknown.message,
            "no environment named \"nope\" (this server has: local, good, gone, guarded)"
        );

        let first_failure = Instant::now();
        let gone = start_error(
            Command::new("true")
                .spawn(&client::environment(&executor, "gone"))
                .await,
        );
        assert_eq!(gone.kind, RefusalKind::UpstreamUnavailable);
        assert_eq!(
            gone.message,
            format!(
                "upstream \"gone\" (unix:{0}) is unavailable: cannot connect to unix:{0}: \
                 No such file or directory",
                missing.display()
            )
        );
        // Until its back-off (0.5 s) has passed, a broken upstream fails at
        // once, saying when it may be tried again.
        let again = start_error(
            Command::new("true")
                .spawn(&client::environment(&executor, "gone"))
                .await,
        );
        assert_eq!(again.kind, RefusalKind::UpstreamUnavailable);
        if first_failure.elapsed() < Duration::from_millis(500) {
            assert!(
                again.message.contains("(next attempt in "),
                "{}",
                again.message
            );
        }

        let refused = start_error(
            Command::new("true")
                .spawn(&client::environment(&executor, "guarded"))
                .await,
        );
        assert_eq!(refused.kind, RefusalKind::UpstreamUnavailable);
        assert!(
            refused.message.starts_with(&format!(
                "upstream \"guarded\" ({}) is unavailable: login refused",
                guarded.address
            )),
            "{}",
            refused.message
        );

        // The other environments are unaffected.
        let good_output = Command::new("echo")
            .arg("fine")
            .output(&client::environment(&executor, "good"))
            .await
            .expect("start on a good upstream");
        assert_eq!(good_output.stdout, b"fine\n");
        let local = Command::new("true").status(&executor).await.expect("local");
        assert_eq!(local, ExitStatus::Code(0));

        let environments = client::environments(&executor).await.expect("list");
        let states: Vec<(&str, &EnvironmentState, bool)> = environments
            .iter()
            .map(|e| (e.name.as_str(), &e.state, e.is_default))
            .collect();
        assert_eq!(states[0], ("local", &EnvironmentState::Local, true));
        assert_eq!(states[1], ("good", &EnvironmentState::Connected, false));
        assert!(
            matches!(states[2].1, EnvironmentState::Failed { reason, .. }
                if reason.contains("No such file or directory")),
            "{:?}",
            states[2]
        );
        assert!(
            matches!(states[3].1, EnvironmentState::Failed { reason, .. }
                if reason.starts_with("login refused")),
            "{:?}",
            states[3]
        );
        assert_eq!(environments[1].address, good.address.to_string());
    });
}

/// Runs `true` on `executor` until the links it crosses are back (starts
/// fail as upstream-unavailable meanwhile).
async fn run_once_reconnected(executor: &executor::Client) {
    common::eventually_async("reconnected", async || {
        match Command::new("true").status(executor).await {
            Ok(status) => {
                assert_eq!(status, ExitStatus::Code(0));
                Ok(())
            }
            Err(Error::Refused(error)) if error.kind == RefusalKind::UpstreamUnavailable => {
                Err(error)
            }
            Err(other) => panic!("unexpected error: {other}"),
        }
    })
    .await
}

#[test]
fn an_upstream_that_comes_back_is_used_again() {
    common::run_local(async {
        let mut far = ServerThread::start(false);
        let server = unix_server_forwarding_to(vec![upstream("b", &far)], Some("b"));
        let connection = connect(&server).await;
        let executor = connection.executor();
        let (process, pid) = sleeper(&executor).await;

        far.stop();
        procfs::wait_gone(pid).await;
        assert!(process.info().await.is_err(), "the far process is gone");
        let lost = start_error(Command::new("true").spawn(&executor).await);
        assert_eq!(lost.kind, RefusalKind::UpstreamUnavailable);

        far.restart();
        run_once_reconnected(&executor).await;
        let environments = client::environments(&executor).await.expect("list");
        assert_eq!(environments[1].state, EnvironmentState::Connected);
    });
}

/// An executor for a path through several hops stays usable after a link
/// it crosses has broken and come back.
#[test]
fn a_held_environment_path_survives_a_reconnection() {
    common::run_local(async {
        let c = ServerThread::start(false);
        let mut b = unix_server_forwarding_to(vec![upstream("c", &c)], None);
        let a = unix_server_forwarding_to(vec![upstream("b", &b)], None);
        let connection = connect(&a).await;
        let far = client::environment(&connection.executor(), "b/c");
        let status = Command::new("true").status(&far).await.expect("first run");
        assert_eq!(status, ExitStatus::Code(0));

        b.restart();
        run_once_reconnected(&far).await;
        assert_eq!(client::info(&far).await.expect("info").environment, "b/c");
    });
}

#[test]
fn info_and_environments_describe_the_far_end() {
    common::run_local(async {
        let c = ServerThread::start(false);
        let b = unix_server_forwarding_to(vec![upstream("c", &c)], None);
        let a = unix_server_forwarding_to(vec![upstream("b", &b)], None);
        let connection = connect(&a).await;
        let executor = connection.executor();

        let here = client::info(&executor).await.expect("info");
        assert_eq!(here.environment, "local");
        assert_eq!(here.version, env!("CARGO_PKG_VERSION"));
        assert_eq!(here.os, "linux");
        assert!(here.features.iter().any(|f| f == "environments"));
        assert_eq!(here.cwd, std::env::current_dir().expect("cwd"));
        let far = client::info(&client::environment(&executor, "b/c"))
            .await
            .expect("info through two hops");
        assert_eq!(far.environment, "b/c");
        assert_eq!(far.features, here.features);

        let names = |list: Vec<capexec::model::EnvironmentStatus>| -> Vec<String> {
            list.into_iter().map(|e| e.name).collect()
        };
        assert_eq!(
            names(client::environments(&executor).await.expect("A's")),
            ["local", "b"]
        );
        assert_eq!(
            names(
                client::environments(&client::environment(&executor, "b"))
                    .await
                    .expect("B's")
            ),
            ["local", "c"]
        );
        let local = client::environment(&executor, "local");
        let output = Command::new("echo")
            .arg("here")
            .output(&local)
            .await
            .expect("local environment");
        assert_eq!(output.stdout, b"here\n");
    });
}

/// A directory reached through a hop whose upstream went away fails as
/// upstream-unavailable, naming the hop, like a forwarded start: not as a
/// lost connection (the client's own connection is fine).
#[test]
fn a_directory_whose_upstream_is_lost_answers_upstream_unavailable() {
    common::run_local(async {
        let mut far = ServerThread::start(false);
        let server = unix_server_forwarding_to(vec![upstream("b", &far)], Some("b"));
        let connection = connect(&server).await;
        let executor = connection.executor();
        let scratch = TempDir::new("lost-directory");
        let dir = client::Directory::open(&executor, scratch.path());
        dir.write("kept", b"written through the hop")
            .await
            .expect("a write through the hop");
        let sub = dir.subdirectory(".");
        assert!(sub.exists("kept").await.expect("a stat through the hop"));

        far.stop();
        for (what, outcome) in [
            ("stat", dir.metadata("kept").await.map(drop)),
            ("read", dir.read("kept").await.map(drop)),
            ("write", dir.write("more", b"x").await.map(drop)),
            ("subdirectory", sub.metadata("kept").await.map(drop)),
            (
                "pipelined subdirectory",
                dir.subdirectory(".").metadata("kept").await.map(drop),
            ),
        ] {
            let error = outcome.expect_err("the upstream is gone");
            assert_eq!(
                error.refusal_kind(),
                Some(RefusalKind::UpstreamUnavailable),
                "{what}: {error}"
            );
            assert!(
                error
                    .to_string()
                    .starts_with("the connection to upstream \"b\" was lost"),
                "{what}: {error}"
            );
        }
        // The client's connection is still there.
        let local = Command::new("true")
            .status(&client::environment(&executor, "local"))
            .await
            .expect("a local start");
        assert_eq!(local, ExitStatus::Code(0));
    });
}

/// A call carrying a capability (subscribe's sink), pipelined on a start
/// the far server refuses, that reaches the front server only after the
/// refusal has: the front's promise for the process is broken by then, and
/// the call must fail with the refusal while the front goes on serving.
/// (capnp-rpc 0.27.3 copied such a call to its new target without its
/// capabilities and panicked on the front's RPC thread; see vendor/.)
#[test]
fn a_call_with_a_capability_pipelined_on_a_refused_start_fails_and_the_front_goes_on() {
    common::run_local(async {
        let dir = TempDir::new("late-call");
        let far = ServerThread::start(false);
        let front = ServerThread::start_in_front_of(&far);
        let proxy = proxy_to(&dir, "front.sock", &front);
        let connection = capexec::net::connect(proxy.address(), front.token.as_ref())
            .await
            .expect("connect");
        let executor = connection.executor().clone();
        // Settled: the bootstrap and the login are answered.
        let echo = Command::new("echo").arg("before").output(&executor).await;
        assert_eq!(echo.expect("echo").stdout, b"before\n");

        proxy.set_open(false);
        let returned = proxy.returns();
        let (process, started) =
            Command::new("/nonexistent/capexec-test-program").spawn_pipelined(&executor);
        common::eventually_async("the front answers the start", async || {
            proxy.returns() != returned
        })
        .await;
        // The front has the far server's refusal; the client does not.
        let calls = proxy.calls();
        let subscribed = tokio::task::spawn_local({
            let process = process.clone();
            async move { process.events(0).await.map(|_| ()) }
        });
        wait_for_calls(&proxy, calls + 1, "the subscribe").await;
        proxy.set_open(true);

        let refused = start_error(started.await.map(|()| process.clone()));
        assert_eq!(refused.kind, RefusalKind::ProgramNotFound, "{refused:?}");
        let subscribed = tokio::time::timeout(Duration::from_secs(30), subscribed)
            .await
            .expect("the subscribe is answered")
            .expect("task");
        match subscribed {
            Err(Error::Refused(error)) => assert_eq!(error.kind, RefusalKind::ProgramNotFound),
            other => panic!("expected the start's refusal, got {other:?}"),
        }
        let echo = tokio::time::timeout(
            Duration::from_secs(30),
            Command::new("echo").arg("after").output(&executor),
        )
        .await
        .expect("the front still answers");
        assert_eq!(echo.expect("echo after").stdout, b"after\n");
    });
}
