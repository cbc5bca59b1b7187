//! A user's worker (`capexec serve --worker FD`, started by
//! `capexec::users::spawn_worker`) acts as its user and nothing more: the
//! ids, groups and environment of a login, files made with the user as
//! owner, other users' files and processes out of reach, as the kernel
//! decides for that user. Needs root and the shadow tools (`useradd`,
//! `groupadd`), as CI has: without them these tests fail, never skip.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command as Std;

use capexec::capexec_capnp::executor;
use capexec::client::Command;
use capexec::model::ExitStatus;
use capexec::net::Address;
use capexec::users::{Account, spawn_worker};

use crate::common::cli::BIN;
use crate::common::data::TempDir;
use crate::common::{run_on_runtime, sh};

const TEAM: &str = "capexec-test-team";

/// The account `name`, made (with a home of its own under /home) if the
/// machine does not have it yet; in [`TEAM`] if `in_team`.
fn test_account(name: &str, in_team: bool) -> Account {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the tests of logins as users need root, as CI has"
    );
    if Std::new("getent")
        .args(["group", TEAM])
        .output()
        .expect("getent")
        .stdout
        .is_empty()
    {
        let made = Std::new("groupadd").arg(TEAM).status().expect("groupadd");
        assert!(made.success() || group_exists(), "groupadd {TEAM}");
    }
    if Account::by_name(name).is_err() {
        let mut useradd = Std::new("useradd");
        useradd.args(["--no-create-home", "--shell", "/bin/sh", "--home-dir"]);
        useradd.arg(format!("/home/{name}"));
        if in_team {
            useradd.args(["--groups", TEAM]);
        }
        let made = useradd
            .arg(name)
            .status()
            .expect("useradd (the shadow tools)");
        // Another test may have made it meanwhile.
        assert!(
            made.success() || Account::by_name(name).is_ok(),
            "useradd {name}"
        );
    }
    let account = Account::by_name(name).expect("the account just made");
    let home = Path::new("/home").join(name);
    std::fs::create_dir_all(&home).expect("home");
    nix::unistd::chown(&home, Some(account.uid), Some(account.gid)).expect("chown home");
    account
}

fn group_exists() -> bool {
    !Std::new("getent")
        .args(["group", TEAM])
        .output()
        .expect("getent")
        .stdout
        .is_empty()
}

/// `body` with an executor served by a worker of `account` on a socket
/// only root may reach, and the worker's pid.
async fn with_worker<F, Fut>(account: &Account, body: F)
where
    F: FnOnce(executor::Client, u32) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let dir = TempDir::new("users-worker");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let path = dir.path().join("worker.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    let mut child = spawn_worker(account, Path::new(BIN), &listener).expect("a worker");
    drop(listener);
    let connection = capexec::net::connect(&Address::Unix(path), None)
        .await
        .expect("connect to the worker");
    body(connection.executor(), child.id()).await;
    drop(connection);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("join")
        .expect("wait");
    assert_eq!(status.code(), Some(0), "the worker's exit");
}

async fn stdout_of(executor: &executor::Client, script: &str) -> (i32, String, String) {
    let output = sh(script).output(executor).await.expect("run");
    (
        match output.exit.status {
            ExitStatus::Code(code) => code,
            killed => panic!("{script:?} ended by {killed:?}"),
        },
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn numbers(ids: impl IntoIterator<Item = u32>) -> String {
    ids.into_iter()
        .map(|id| id.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn a_worker_runs_commands_with_the_ids_groups_and_environment_of_a_login() {
    let alice = test_account("capexec-alice", true);
    let team = nix::unistd::Group::from_name(TEAM)
        .expect("group database")
        .expect("the team");
    assert!(alice.groups.contains(&team.gid), "{alice:?} is in {TEAM}");
    run_on_runtime(async {
        let alice = &alice;
        with_worker(alice, |executor, worker| async move {
            let (code, out, err) = stdout_of(
                &executor,
                "id -u; id -g; id -G; \
                 echo \"$HOME|$USER|$LOGNAME|$SHELL|$PATH\"; pwd; \
                 grep -E '^(Uid|Gid):' /proc/self/status",
            )
            .await;
            assert_eq!(code, 0, "{err}");
            let uid = alice.uid.as_raw();
            let gid = alice.gid.as_raw();
            let mut groups: Vec<u32> = alice.groups.iter().map(|g| g.as_raw()).collect();
            groups.sort_unstable();
            let lines: Vec<&str> = out.lines().collect();
            assert_eq!(lines[0], uid.to_string());
            assert_eq!(lines[1], gid.to_string());
            let mut said: Vec<u32> = lines[2]
                .split(' ')
                .map(|g| g.parse().expect("a gid"))
                .collect();
            said.sort_unstable();
            assert_eq!(numbers(said), numbers(groups), "id -G");
            assert_eq!(
                lines[3],
                "/home/capexec-alice|capexec-alice|capexec-alice|/bin/sh|/usr/local/bin:/usr/bin:/bin"
            );
            assert_eq!(lines[4], "/home/capexec-alice");
            // Real, effective, saved and filesystem ids: all the user's.
            assert_eq!(lines[5], format!("Uid:\t{uid}\t{uid}\t{uid}\t{uid}"));
            assert_eq!(lines[6], format!("Gid:\t{gid}\t{gid}\t{gid}\t{gid}"));
            // The worker itself, which parses the login's messages, is the
            // user, not root.
            let status = std::fs::read_to_string(format!("/proc/{worker}/status"))
                .expect("the worker's status");
            assert!(
                status.contains(&format!("\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")),
                "{status}"
            );
            assert!(status.contains("\nCapEff:\t0000000000000000\n"), "{status}");
        })
        .await;
    });
}

#[test]
fn a_worker_makes_files_as_its_user_and_cannot_read_what_the_modes_refuse() {
    let alice = test_account("capexec-alice", true);
    let bob = test_account("capexec-bob", false);
    let dir = TempDir::new("users-files");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let bobs = dir.path().join("bobs-secret");
    std::fs::write(&bobs, "bob only\n").expect("write");
    std::fs::set_permissions(&bobs, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    nix::unistd::chown(&bobs, Some(bob.uid), Some(bob.gid)).expect("chown");
    let made = dir.path().join("made-by-alice");
    let script = format!(
        "touch {made}; cat {bobs}; echo \"cat: $?\"; cat /etc/shadow; echo \"shadow: $?\"",
        made = made.display(),
        bobs = bobs.display()
    );
    run_on_runtime(async {
        with_worker(&alice, |executor, _| async move {
            let (code, out, err) = stdout_of(&executor, &script).await;
            assert_eq!(code, 0, "{err}");
            assert_eq!(out, "cat: 1\nshadow: 1\n", "{err}");
            assert!(err.contains("bobs-secret: Permission denied"), "{err}");
            assert!(err.contains("/etc/shadow: Permission denied"), "{err}");
        })
        .await;
        // And bob, the owner, reads it.
        with_worker(&bob, |executor, _| {
            let bobs = bobs.clone();
            async move {
                let (code, out, _) = stdout_of(&executor, &format!("cat {}", bobs.display())).await;
                assert_eq!((code, out.as_str()), (0, "bob only\n"));
            }
        })
        .await;
    });
    let metadata = std::fs::metadata(&made).expect("alice's file");
    assert_eq!(
        (metadata.uid(), metadata.gid()),
        (alice.uid.as_raw(), alice.gid.as_raw())
    );
}

#[test]
fn a_worker_cannot_signal_another_users_processes() {
    let alice = test_account("capexec-alice", true);
    let bob = test_account("capexec-bob", false);
    // Bob's process, run by bob's worker; alice tries to signal it.
    run_on_runtime(async {
        with_worker(&bob, |bobs_executor, _| async move {
            let sleeper = Command::new("sleep")
                .arg("100")
                .spawn(&bobs_executor)
                .await
                .expect("bob's sleep");
            let pid = sleeper.info().await.expect("info").pid;
            with_worker(&alice, |executor, _| async move {
                let (code, out, err) = stdout_of(
                    &executor,
                    &format!(
                        "kill -TERM {pid}; echo \"kill: $?\"; kill -0 {pid}; echo \"alive: $?\""
                    ),
                )
                .await;
                assert_eq!(code, 0, "{err}");
                assert_eq!(out, "kill: 1\nalive: 1\n", "{err}");
                assert!(err.contains("Operation not permitted"), "{err}");
            })
            .await;
            // Still running: alice's signal did not reach it.
            let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
                .expect("bob's sleep is still there");
            assert!(
                status.contains(&format!("\nUid:\t{}\t", bob.uid)),
                "{status}"
            );
            assert!(sleeper.terminate().await.expect("terminate"));
        })
        .await;
    });
}

#[test]
fn a_worker_without_its_socket_says_so() {
    let output = Std::new(BIN)
        .args(["serve", "--worker", "9"])
        .output()
        .expect("capexec");
    assert_eq!(output.status.code(), Some(125));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "capexec: --worker 9: no open descriptor 9 was inherited\n"
    );
    // It serves its one socket: no listener besides.
    let output = Std::new(BIN)
        .args(["serve", "--worker", "3", "--listen", "unix:/nonexistent/s"])
        .output()
        .expect("capexec");
    assert_eq!(output.status.code(), Some(125));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "capexec: --worker cannot be used with --listen (see capexec serve --help)\n"
    );
}
