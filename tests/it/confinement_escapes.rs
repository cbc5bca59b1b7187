//! Escapes from a confined executor, tried the way its holder would try
//! them: dialling the server's own sockets (where it would be greeted with
//! the unrestricted `Executor`, or `Admin`) by every spelling of their
//! address, reaching the admin socket from a sandbox, ports left open by a
//! restriction that confines starts, and telling what exists outside the
//! roots from the difference between `not-found` and `not-allowed`.

use crate::common;

use capexec::capexec_capnp::executor;
use capexec::client::{self, Command, Directory};
use capexec::model::{Network, Policy, PortPolicy, RefusalKind, Sandbox};
use capexec::net::Address;
use common::Ctx;
use common::data::TempDir;
use common::server::ServerThread;

use crate::ports::refusal;
use crate::sandbox::SOCKET_PROBE;

/// Asserts `result` is the refusal of a dial into the server's own socket.
async fn refused_as_own(result: Result<impl Sized, client::Error>, asked: &str) {
    let (kind, message) = refusal(result).await;
    assert_eq!(kind, RefusalKind::NotAllowed, "{asked}: {message}");
    assert!(
        message.contains("is a socket this server itself serves on"),
        "{asked}: {message}"
    );
}

/// Every address that names the socket the executor's server serves on
/// (ctx.address): by its path, a symlink, a hard link and a path through
/// /proc for a Unix socket; by loopback, the unspecified address and a
/// name for a TCP one. Refused whatever the executor's rules allow.
async fn no_executor_dials_the_socket_of_its_own_server(ctx: Ctx) {
    let Some(address) = ctx.address.clone() else {
        // In process: there is no socket to dial.
        return;
    };
    let links = TempDir::new("own-socket");
    let spellings = match &address {
        Address::Unix(path) => {
            let symlink = links.path().join("symlink.sock");
            std::os::unix::fs::symlink(path, &symlink).expect("symlink");
            let hard = links.path().join("hard.sock");
            std::fs::hard_link(path, &hard).expect("hard link");
            vec![
                format!("unix:{}", path.display()),
                format!("unix:{}", symlink.display()),
                format!("unix:{}", hard.display()),
                format!("unix:/proc/{}/root{}", std::process::id(), path.display()),
            ]
        }
        Address::Tcp { port, .. } => vec![
            format!("tcp:127.0.0.1:{port}"),
            format!("tcp:0.0.0.0:{port}"),
            format!("tcp:localhost:{port}"),
        ],
    };
    // An executor whose rules allow every address still may not.
    let everywhere = client::restrict(
        &ctx.executor,
        &Policy {
            ports: Some(PortPolicy {
                dial: Some(vec!["tcp:*:*".into(), "unix:/".into()]),
                listen: None,
            }),
            ..Policy::default()
        },
    );
    for asked in &spellings {
        for executor in [&ctx.executor, &everywhere] {
            refused_as_own(client::dial(executor, asked).await, asked).await;
        }
    }
    // Nothing else was refused: the server serves on.
    assert!(
        client::info(&ctx.executor).await.is_ok(),
        "the server still answers"
    );
}

/// A directory's executor (read-only or not) has no network: it dials
/// and listens on nothing, not even loopback.
async fn a_directorys_executor_dials_and_listens_on_nothing(ctx: Ctx) {
    let (listener, service) = crate::ports::peer().await;
    let work = TempDir::new("direxec-ports");
    let directory = Directory::open(&ctx.executor, work.path());
    for (executor, what) in [
        (directory.executor(), "writable"),
        (directory.read_only().executor(), "read-only"),
    ] {
        for result in [
            client::dial(&executor, &service).await.map(drop),
            client::listen(&executor, "tcp:127.0.0.1:0").await.map(drop),
            client::listen(
                &executor,
                &format!("unix:{}", work.path().join("l.sock").display()),
            )
            .await
            .map(drop),
        ] {
            let (kind, message) = refusal(result).await;
            assert_eq!(kind, RefusalKind::NotAllowed, "{what}: {message}");
            assert!(
                message.contains("(none: policy rule `sandbox` has no network)"),
                "{what}: {message}"
            );
        }
    }
    drop(listener);
}

/// A restriction that confines starts (`cwdRoots`, a sandbox with
/// network) closes the ports it does not name; a sandbox without network
/// refuses a policy that names some.
async fn a_restriction_that_confines_starts_closes_ports(ctx: Ctx) {
    let (listener, service) = crate::ports::peer().await;
    let root = TempDir::new("confining");
    let cases = [
        (
            Policy {
                cwd_roots: Some(vec![root.path().to_path_buf()]),
                ..Policy::default()
            },
            "(none when a policy sets `cwdRoots` and not `ports`)",
        ),
        (
            Policy {
                sandbox: Some(Sandbox {
                    network: Network::All,
                    ..Sandbox::default()
                }),
                ..Policy::default()
            },
            "(none when a policy sets `sandbox` and not `ports`)",
        ),
        (
            Policy {
                sandbox: Some(Sandbox::default()),
                ..Policy::default()
            },
            "(none: policy rule `sandbox` has no network)",
        ),
    ];
    for (policy, note) in cases {
        let restricted = client::restrict(&ctx.executor, &policy);
        let (kind, message) = refusal(client::dial(&restricted, &service).await).await;
        assert_eq!(kind, RefusalKind::NotAllowed, "{message}");
        assert!(message.contains(note), "{message}");
        let (kind, message) = refusal(client::listen(&restricted, "tcp:127.0.0.1:0").await).await;
        assert_eq!(kind, RefusalKind::NotAllowed, "{message}");
    }
    // Named, they are open.
    let named = client::restrict(
        &ctx.executor,
        &Policy {
            cwd_roots: Some(vec![root.path().to_path_buf()]),
            ports: Some(PortPolicy {
                dial: Some(vec![service.clone()]),
                listen: None,
            }),
            ..Policy::default()
        },
    );
    client::dial(&named, &service)
        .await
        .expect("a named address");
    // A sandbox without network and an address: a contradiction, refused.
    let contradiction = client::restrict(
        &ctx.executor,
        &Policy {
            sandbox: Some(Sandbox::default()),
            ports: Some(PortPolicy {
                dial: Some(vec![service.clone()]),
                listen: None,
            }),
            ..Policy::default()
        },
    );
    let (kind, message) = refusal(client::info(&contradiction).await).await;
    assert_eq!(kind, RefusalKind::InvalidArgument, "{message}");
    assert!(message.contains("has no network"), "{message}");
    drop(listener);
}

/// The answer for a path outside a restricted executor's roots is
/// `not-allowed` whether or not it exists; a missing path inside gets its
/// own reason. Directories, working directories and Unix dials alike.
async fn what_exists_outside_the_roots_is_not_told(ctx: Ctx) {
    let root = TempDir::new("probe-root");
    let inside = root.path().canonicalize().expect("canonical");
    std::os::unix::fs::symlink("/nonexistent-capexec-probe", inside.join("out")).expect("symlink");
    let restricted = client::restrict(
        &ctx.executor,
        &Policy {
            cwd_roots: Some(vec![inside.clone()]),
            ports: Some(PortPolicy {
                dial: Some(vec![format!("unix:{}/", inside.display())]),
                listen: Some(vec![format!("unix:{}/", inside.display())]),
            }),
            ..Policy::default()
        },
    );
    let directory_executor = Directory::open(&ctx.executor, &inside).executor();
    let outside = [
        "/etc",
        "/nonexistent-capexec-probe",
        "/etc/nonexistent-capexec-probe",
    ];
    for path in outside
        .iter()
        .map(std::path::PathBuf::from)
        .chain([inside.join("out"), inside.join("out/deeper")])
    {
        let shown = path.display().to_string();
        for executor in [&restricted, &directory_executor] {
            let opened = Directory::open(executor, &path);
            let (kind, message) = refusal(opened.info().await).await;
            assert_eq!(
                kind,
                RefusalKind::NotAllowed,
                "directory {shown}: {message}"
            );
            let mut start = Command::new("true");
            start.current_dir(&path);
            let (kind, message) = refusal(start.status(executor).await).await;
            assert_eq!(kind, RefusalKind::NotAllowed, "cwd {shown}: {message}");
        }
        let (kind, message) =
            refusal(client::dial(&restricted, &format!("unix:{shown}")).await).await;
        assert_eq!(kind, RefusalKind::NotAllowed, "dial {shown}: {message}");
        let (kind, message) =
            refusal(client::listen(&restricted, &format!("unix:{shown}/l.sock")).await).await;
        assert_eq!(kind, RefusalKind::NotAllowed, "listen {shown}: {message}");
    }
    // Inside, a missing path says what is wrong with it.
    let missing = inside.join("missing");
    for executor in [&restricted, &directory_executor] {
        let (kind, message) = refusal(Directory::open(executor, &missing).info().await).await;
        assert_eq!(kind, RefusalKind::NotFound, "{message}");
        let mut start = Command::new("true");
        start.current_dir(&missing);
        let (kind, message) = refusal(start.status(executor).await).await;
        assert_eq!(kind, RefusalKind::BadCwd, "{message}");
    }
    let (kind, message) =
        refusal(client::dial(&restricted, &format!("unix:{}", missing.display())).await).await;
    assert_eq!(kind, RefusalKind::SocketFailed, "{message}");
}

backend_tests!(
    no_executor_dials_the_socket_of_its_own_server,
    a_directorys_executor_dials_and_listens_on_nothing,
    a_restriction_that_confines_starts_closes_ports,
    what_exists_outside_the_roots_is_not_told,
);

/// A server with an admin socket, and a connection to its main socket.
async fn served_with_admin() -> (ServerThread, std::path::PathBuf, capexec::net::Connection) {
    let (server, admin) = ServerThread::with_admin("admin-reach");
    let connection = capexec::net::connect(&server.address, None)
        .await
        .expect("connect");
    (server, admin, connection)
}

/// The admin socket answers the server's user, but neither a sandboxed
/// process (mode 0600 admits it: same uid) nor a dial through the server.
#[test]
fn the_admin_socket_is_out_of_reach_of_sandboxes_and_dials() {
    common::run_local(async {
        let (_server, admin, connection) = served_with_admin().await;
        let executor: executor::Client = connection.executor();
        let socket = admin.display().to_string();
        let mut probe = Command::new("/usr/bin/python3");
        probe.args(["-c", SOCKET_PROBE, &socket]);
        let output = probe.output(&executor).await.expect("start");
        assert_eq!(String::from_utf8_lossy(&output.stdout), "answered\n");
        let cwd = TempDir::new("admin-probe");
        // As the unprivileged user a root server's sandbox runs as, the
        // kernel refuses it the socket (mode 0600); as root with its
        // capabilities dropped, the server's own peer check does.
        for (keep_root, said) in [(false, "EACCES\n"), (true, "refused\n")] {
            probe.current_dir(cwd.path()).sandbox(Sandbox {
                keep_root,
                ..Sandbox::default()
            });
            let output = probe.output(&executor).await.expect("start");
            assert_eq!(
                String::from_utf8_lossy(&output.stdout),
                said,
                "keep_root {keep_root}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        refused_as_own(
            client::dial(&executor, &format!("unix:{socket}")).await,
            &socket,
        )
        .await;
        // The operator still gets in.
        let operator = capexec::net::connect_admin(&Address::Unix(admin.clone()))
            .await
            .expect("admin");
        capexec::client::admin::processes(&operator.admin())
            .await
            .expect("list");
    });
}
