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
use capexec::users::{Account, Program, spawn_worker};

use crate::common::cli::{BIN, finish, kill, spawn_until_first_line, text, wait};
use crate::common::data::TempDir;
use crate::common::{run_on_runtime, sh};

const TEAM: &str = "capexec-test-team";
/// The front's user in these tests (`--privsep-user`).
const FRONT: &str = "capexec-test-front";

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
/// only root may connect to (as the server makes them), and the worker's
/// pid.
async fn with_worker<F, Fut>(account: &Account, body: F)
where
    F: FnOnce(executor::Client, u32) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let dir = TempDir::new("users-worker");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).expect("chmod");
    let path = dir.path().join("worker.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let admin_path = capexec::users::worker_admin_socket(&path);
    let admin = std::os::unix::net::UnixListener::bind(&admin_path).expect("bind");
    std::fs::set_permissions(&admin_path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let mut child = spawn_worker(
        account,
        &Program::at(Path::new(BIN)),
        &listener,
        &admin,
        None,
    )
    .expect("a worker");
    drop((listener, admin));
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

/// A user's commands run with their worker's uid, but the worker holds
/// what the user's own processes must not reach: its listener, on which
/// the front forwards every login of the user, and its connections. The
/// kernel keeps a process of the same uid out of a non-dumpable one's
/// descriptors, memory and environment (ptrace and /proc need root then).
#[test]
fn a_workers_own_commands_cannot_reach_its_descriptors_or_memory() {
    let alice = test_account("capexec-alice", true);
    run_on_runtime(async {
        with_worker(&alice, |executor, worker| async move {
            let (code, out, err) = stdout_of(
                &executor,
                &format!(
                    "if ls /proc/{worker}/fd >/dev/null 2>&1; then echo 'fd: listed'; \
                     else echo 'fd: refused'; fi; \
                     for what in environ mem; do \
                       if (exec 3</proc/{worker}/$what) 2>/dev/null; \
                       then echo \"$what: opened\"; else echo \"$what: refused\"; fi; \
                     done; stat -c %u /proc/{worker}/fd"
                ),
            )
            .await;
            assert_eq!(code, 0, "{err}");
            assert_eq!(
                out, "fd: refused\nenviron: refused\nmem: refused\n0\n",
                "{err}"
            );
        })
        .await;
    });
}

/// A user's worker keeps its first 64 descriptor slots for its own, as
/// any `capexec serve` does: the sockets its monitor passed it are copied
/// and their slots filled again before it takes a login in, so nothing a
/// client sends lands where its spawner's table starts from.
#[test]
fn a_workers_first_64_descriptor_slots_are_its_own() {
    let alice = test_account("capexec-alice", true);
    run_on_runtime(async {
        with_worker(&alice, |executor, worker| async move {
            // Serving (the connection alone may sit in the listener's
            // queue before the worker has started).
            let (code, _, err) = stdout_of(&executor, "true").await;
            assert_eq!(code, 0, "{err}");
            let open: Vec<i32> = std::fs::read_dir(format!("/proc/{worker}/fd"))
                .expect("the worker's descriptors (the test runs as root)")
                .flatten()
                .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
                .collect();
            let limits =
                std::fs::read_to_string(format!("/proc/{worker}/limits")).unwrap_or_default();
            assert_eq!(
                open.iter().filter(|&&fd| fd < 64).count(),
                64,
                "{open:?}\n{limits}"
            );
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

/// `capexec serve --user-map MAP --privsep-user FRONT` with `listen`, as
/// root; its first printed address.
fn serve_users(listen: &[String], map: &Path) -> (Server, String) {
    serve_users_with(listen, map, &[])
}

/// A server a test started: killed if the test ends (or fails) with it
/// still running, so that a failing test leaves no server, front or
/// worker behind.
struct Server(std::process::Child);

impl std::ops::Deref for Server {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for Server {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// [`serve_users`] with more of `capexec serve`'s arguments.
fn serve_users_with(listen: &[String], map: &Path, extra: &[&str]) -> (Server, String) {
    let mut server = Std::new(BIN);
    server.arg("serve").args(extra);
    for address in listen {
        server.args(["--listen", address]);
    }
    server
        .arg("--user-map")
        .arg(map)
        .args(["--privsep-user", FRONT]);
    let (server, line) = spawn_until_first_line(server);
    (Server(server), line.trim().to_string())
}

/// `capexec run` on `socket` as the user `uid` (its own HOME, no token).
fn run_as(uid: u32, gid: u32, home: &str, socket: &str, script: &str) -> Std {
    use std::os::unix::process::CommandExt;
    let mut command = Std::new(BIN);
    command
        .args(["run", "--connect", socket, "-n", "--", "sh", "-c", script])
        .env("HOME", home)
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("CAPEXEC_TOKEN")
        .uid(uid)
        .gid(gid);
    command
}

#[test]
fn a_server_with_a_user_map_runs_each_unix_peer_as_its_user_or_the_mapped_one() {
    let alice = test_account("capexec-alice", true);
    let bob = test_account("capexec-bob", false);
    let dir = TempDir::new("users-serve");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let map = dir.path().join("users");
    std::fs::write(
        &map,
        format!(
            "# bob's logins run as alice\nunix {} capexec-alice\n",
            bob.uid
        ),
    )
    .expect("map");
    let socket = dir.path().join("s.sock");
    let front = test_account(FRONT, false);
    let (mut server, address) = serve_users(&[format!("unix:{}", socket.display())], &map);
    assert_eq!(address, format!("unix:{}", socket.display()));
    // Open to every local user: the kernel tells them apart.
    let mode = std::fs::metadata(&socket).expect("socket").mode() & 0o777;
    assert_eq!(mode, 0o666);
    // What reads the peers' messages, the front, is not root and has no
    // capability; the root monitor only starts workers.
    let fronts = processes_of(front.uid.as_raw(), server.id(), b"--front");
    assert_eq!(fronts.len(), 1, "one front");
    let status = std::fs::read_to_string(format!("/proc/{}/status", fronts[0])).expect("status");
    let (uid, gid) = (front.uid.as_raw(), front.gid.as_raw());
    assert!(
        status.contains(&format!("\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")),
        "{status}"
    );
    assert!(
        status.contains(&format!("\nGid:\t{gid}\t{gid}\t{gid}\t{gid}\n")),
        "{status}"
    );
    assert!(status.contains("\nCapEff:\t0000000000000000\n"), "{status}");
    assert!(status.contains("\nCapPrm:\t0000000000000000\n"), "{status}");
    let script = "id -un; echo \"$HOME $USER\"; id -u";
    let cases = [
        (alice.uid.as_raw(), alice.gid.as_raw(), &alice),
        (bob.uid.as_raw(), bob.gid.as_raw(), &alice),
    ];
    for (uid, gid, runs_as) in cases {
        let done = finish(run_as(uid, gid, "/", &address, script), None);
        assert_eq!(
            (done.code, text(&done.stdout)),
            (
                0,
                format!(
                    "{name}\n/home/{name} {name}\n{uid}\n",
                    name = runs_as.name,
                    uid = runs_as.uid
                )
            ),
            "uid {uid}: {}",
            text(&done.stderr)
        );
    }
    // Root does not log in: a front taken over could reach its worker.
    let done = finish(run_as(0, 0, "/root", &address, "id -un"), None);
    assert_eq!(done.code, 125, "{}", text(&done.stdout));
    assert!(
        text(&done.stderr).contains(
            "login refused: logins do not run as root (uid 0) on a server that runs logins as \
             users; root uses a server of its own"
        ),
        "{}",
        text(&done.stderr)
    );
    assert!(workers_of(0, server.id()).is_empty());
    // A uid with no account is refused, and told why.
    let done = finish(run_as(3_999_999, 3_999_999, "/", &address, "id -un"), None);
    assert_ne!(done.code, 0);
    assert!(
        text(&done.stderr).contains("no user with uid 3999999 in the password database"),
        "{}",
        text(&done.stderr)
    );
    // A worker that ends is started again at its user's next login.
    let server_pid = server.id();
    let workers = workers_of(alice.uid.as_raw(), server_pid);
    assert_eq!(
        workers.len(),
        1,
        "one worker for alice (and bob, mapped to her)"
    );
    // Neither the front nor a worker holds the server's stderr (root's
    // terminal, when started from a shell): each writes to a pipe the
    // monitor relays.
    let stderr_of = |pid: u32| {
        std::fs::read_link(format!("/proc/{pid}/fd/2"))
            .expect("stderr")
            .display()
            .to_string()
    };
    assert_eq!(stderr_of(server_pid), "/dev/null");
    for pid in [fronts[0], workers[0]] {
        assert!(stderr_of(pid).starts_with("pipe:["), "{}", stderr_of(pid));
    }
    kill_pid(workers[0], libc::SIGKILL);
    wait_until(|| !alive(workers[0]));
    let done = finish(
        run_as(
            alice.uid.as_raw(),
            alice.gid.as_raw(),
            "/",
            &address,
            "id -un",
        ),
        None,
    );
    assert_eq!(
        (done.code, text(&done.stdout)),
        (0, "capexec-alice\n".to_string()),
        "{}",
        text(&done.stderr)
    );
    let again = workers_of(alice.uid.as_raw(), server_pid);
    assert_eq!(again.len(), 1);
    assert_ne!(again, workers);
    // The workers end with the server (a reparented one would have left
    // the list, so each is watched by its pid).
    kill(&server, libc::SIGTERM);
    assert_eq!(wait(&mut server), 0);
    wait_until(|| again.iter().all(|pid| !alive(*pid)));
}

/// The pids of `capexec serve --worker` processes of `uid` that `parent`
/// started (other tests start workers of the same users).
fn workers_of(uid: u32, parent: u32) -> Vec<u32> {
    processes_of(uid, parent, b"--worker")
}

/// The pids of processes of `uid` that `parent` started whose command
/// line holds `flag`.
fn processes_of(uid: u32, parent: u32, flag: &[u8]) -> Vec<u32> {
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            status.contains(&format!("\nUid:\t{uid}\t"))
                && status.contains(&format!("\nPPid:\t{parent}\n"))
                && cmdline.windows(flag.len()).any(|w| w == flag)
                && !status.contains("\nState:\tZ")
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// Whether `pid` is a process that has not ended (a zombie has).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .is_ok_and(|status| !status.contains("\nState:\tZ"))
}

fn kill_pid(pid: u32, signal: libc::c_int) {
    // SAFETY: kill(2) on a process this test made.
    assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0);
}

/// Polls `done` until it holds, within a deadline.
fn wait_until(done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "not within 20 s");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn a_user_map_is_refused_where_it_cannot_be_kept() {
    let alice = test_account("capexec-alice", true);
    let dir = TempDir::new("users-refused");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let map = dir.path().join("users");
    std::fs::write(&map, "unix 4000 capexec-alice\n").expect("map");
    std::fs::set_permissions(&map, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let socket = format!("unix:{}", dir.path().join("s.sock").display());
    let serve = |args: &[&str], uid: u32| {
        use std::os::unix::process::CommandExt;
        let mut command = Std::new(BIN);
        command
            .arg("serve")
            .args(args)
            .env("HOME", "/")
            .uid(uid)
            .gid(alice.gid.as_raw());
        finish(command, None)
    };
    let map_arg = map.display().to_string();
    // Not as root: a sentence, and exit 125.
    let done = serve(
        &["--listen", &socket, "--user-map", &map_arg],
        alice.uid.as_raw(),
    );
    assert_eq!(done.code, 125);
    assert_eq!(
        text(&done.stderr),
        format!(
            "capexec: --user-map needs a server started as root: it starts each login's \
             processes as that login's user, which only root can do, and this server runs as \
             uid {}\n",
            alice.uid
        )
    );
    // A TCP listener needs a token line: no other token logs in.
    let done = serve(&["--listen", "tcp:127.0.0.1:0", "--user-map", &map_arg], 0);
    assert_eq!(done.code, 125);
    assert_eq!(
        text(&done.stderr),
        format!(
            "capexec: --user-map {map_arg}: a tcp: listener, and no `token FILE USER` or `cert \
             SHA256 USER` line: no TCP login could log in\n"
        )
    );
    // Nor does a server's own token: --token-file has no place here.
    let done = serve(
        &[
            "--listen",
            &socket,
            "--user-map",
            &map_arg,
            "--token-file",
            "/x",
        ],
        0,
    );
    assert_eq!(done.code, 125);
    assert!(
        text(&done.stderr).contains("--user-map cannot be used with --token-file"),
        "{}",
        text(&done.stderr)
    );
    // A certificate line needs TLS to be asked for.
    std::fs::write(
        &map,
        format!("cert sha256:{} capexec-alice\n", "ab".repeat(32)),
    )
    .expect("map");
    let done = serve(&["--listen", &socket, "--user-map", &map_arg], 0);
    assert_eq!(done.code, 125);
    assert_eq!(
        text(&done.stderr),
        format!(
            "capexec: --user-map {map_arg}: a `cert` line (for capexec-alice) maps a TLS client \
             certificate, and this server serves no TLS: give --tls-cert and --tls-key (or \
             --tls-self-signed)\n"
        )
    );
    // A map others may write is refused: they could map themselves to
    // anyone.
    std::fs::write(&map, "unix 4000 capexec-alice\n").expect("map");
    std::fs::set_permissions(&map, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let done = serve(&["--listen", &socket, "--user-map", &map_arg], 0);
    assert_eq!(done.code, 125);
    assert_eq!(
        text(&done.stderr),
        format!(
            "capexec: --user-map {map_arg}: it is uid 0's with mode 0666: whoever may write it \
             may log in as any user; make it root's and writable by root only\n"
        )
    );
    std::fs::set_permissions(&map, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    // No line maps logins to root.
    std::fs::write(&map, "unix 4000 root\n").expect("map");
    let done = serve(&["--listen", &socket, "--user-map", &map_arg], 0);
    assert_eq!(done.code, 125);
    assert_eq!(
        text(&done.stderr),
        format!(
            "capexec: --user-map {map_arg}: a line maps logins to root (uid 0): no login runs \
             as root on a server that runs logins as users (a front taken over could reach its \
             worker); root uses a server of its own\n"
        )
    );
    // The front needs a user of its own, never root.
    std::fs::write(&map, "unix 4000 capexec-alice\n").expect("map");
    let front_as = |user: &str| {
        let done = serve(
            &[
                "--listen",
                &socket,
                "--user-map",
                &map_arg,
                "--privsep-user",
                user,
            ],
            0,
        );
        assert_eq!(done.code, 125);
        text(&done.stderr)
    };
    assert_eq!(
        front_as("capexec-no-such-user"),
        "capexec: --privsep-user capexec-no-such-user: no such user for the front, the part \
         that reads every peer's messages: make one of its own (`useradd --system \
         --no-create-home --shell /usr/sbin/nologin capexec-no-such-user`) or name another\n"
    );
    assert_eq!(
        front_as("root"),
        "capexec: --privsep-user root: the front must not run as root\n"
    );
    // And a map's mistakes name the file and the line.
    std::fs::write(&map, "\nunix 4000 capexec-no-such-user\n").expect("map");
    let done = serve(&["--listen", &socket, "--user-map", &map_arg], 0);
    assert_eq!(done.code, 125);
    assert_eq!(
        text(&done.stderr),
        format!("capexec: {map_arg}:2: no user `capexec-no-such-user` in the password database\n")
    );
}

#[test]
fn a_server_with_a_user_map_killed_leaves_no_front_worker_or_command() {
    let alice = test_account("capexec-alice", true);
    test_account(FRONT, false);
    let dir = TempDir::new("users-killed");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let map = dir.path().join("users");
    std::fs::write(&map, "# every peer as itself\n").expect("map");
    let socket = dir.path().join("s.sock");
    let (mut server, address) = serve_users(&[format!("unix:{}", socket.display())], &map);
    let server_pid = server.id();
    let mut client = run_as(
        alice.uid.as_raw(),
        alice.gid.as_raw(),
        "/",
        &address,
        "exec sleep 100",
    )
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .spawn()
    .expect("capexec run");
    // The worker, and the command below it.
    wait_until(|| workers_of(alice.uid.as_raw(), server_pid).len() == 1);
    let worker = workers_of(alice.uid.as_raw(), server_pid)[0];
    wait_until(|| !processes_of(alice.uid.as_raw(), worker, b"sleep").is_empty());
    let command = processes_of(alice.uid.as_raw(), worker, b"sleep")[0];
    let front = processes_of(
        Account::by_name(FRONT).expect("front").uid.as_raw(),
        server_pid,
        b"--front",
    );
    assert_eq!(front.len(), 1);
    // Its workers' directory, which SIGKILL leaves behind. (Checked before
    // the kill: any other server that starts meanwhile, as tests running
    // beside this one do, may remove it as soon as its server is dead.)
    let dead = std::path::PathBuf::from(format!("/run/capexec/workers.{server_pid}"));
    assert!(dead.exists());
    kill(&server, libc::SIGKILL);
    let _ = server.wait();
    for pid in [front[0], worker, command] {
        wait_until(|| !alive(pid));
    }
    let _ = client.kill();
    let _ = client.wait();
    // The next server removes what the killed one could not: its workers'
    // directory (its cgroups went with its sentinel).
    let next_socket = dir.path().join("next.sock");
    let (mut next, _) = serve_users(&[format!("unix:{}", next_socket.display())], &map);
    assert!(!dead.exists(), "{} is left", dead.display());
    kill(&next, libc::SIGTERM);
    assert_eq!(wait(&mut next), 0);
}

/// SIGTERM the moment the server says where it listens, many times over:
/// one that came while the monitor was between looking for a signal and
/// blocking in poll(2) used to be held until the next one (a hang).
#[test]
fn a_server_with_a_user_map_ends_on_sigterm_however_soon_it_comes() {
    test_account(FRONT, false);
    let dir = TempDir::new("users-sigterm");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let map = dir.path().join("users");
    std::fs::write(&map, "# every peer as itself\n").expect("map");
    for round in 0..20 {
        let socket = dir.path().join(format!("s{round}.sock"));
        let (mut server, _) = serve_users(&[format!("unix:{}", socket.display())], &map);
        kill(&server, libc::SIGTERM);
        assert_eq!(wait(&mut server), 0, "round {round}");
    }
}

#[test]
fn a_tcp_login_runs_as_the_user_its_token_file_maps_to() {
    test_account("capexec-alice", true);
    test_account("capexec-bob", false);
    test_account(FRONT, false);
    let dir = TempDir::new("users-tcp");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let tokens = dir.path().join("tokens");
    std::fs::create_dir(&tokens).expect("tokens");
    for (name, secret) in [
        ("alice", "alice-secret-0123456789"),
        ("bob", "bob-secret-9876543210"),
    ] {
        let file = tokens.join(name);
        std::fs::write(&file, format!("{secret}\n")).expect("token");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    }
    let map = dir.path().join("users");
    // Token files relative to the map.
    std::fs::write(
        &map,
        "token tokens/alice capexec-alice\ntoken tokens/bob capexec-bob\n",
    )
    .expect("map");
    let socket = dir.path().join("s.sock");
    let (mut server, address) = serve_users(
        &[
            "tcp:127.0.0.1:0".to_string(),
            format!("unix:{}", socket.display()),
        ],
        &map,
    );
    assert!(
        address.starts_with("tcp:127.0.0.1:") && !address.ends_with(":0"),
        "{address}"
    );
    let run = |token_file: &Path| {
        let mut command = Std::new(BIN);
        command
            .args(["run", "--connect", &address, "--token-file"])
            .arg(token_file)
            .args(["-n", "--", "sh", "-c", "id -un; echo $HOME"])
            .env("HOME", "/root")
            .env_remove("CAPEXEC_TOKEN");
        finish(command, None)
    };
    for (file, name) in [("alice", "capexec-alice"), ("bob", "capexec-bob")] {
        let done = run(&tokens.join(file));
        assert_eq!(
            (done.code, text(&done.stdout)),
            (0, format!("{name}\n/home/{name}\n")),
            "{}",
            text(&done.stderr)
        );
    }
    // Any other token is refused, the server's own included (it has none).
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "not-a-mapped-token\n").expect("token");
    let done = run(&wrong);
    assert_eq!(done.code, 125);
    assert!(
        text(&done.stderr).contains("login refused: wrong token"),
        "{}",
        text(&done.stderr)
    );
    kill(&server, libc::SIGTERM);
    assert_eq!(wait(&mut server), 0);
}

/// An upgrade in place is not built for a server with a user map: SIGUSR2
/// to its monitor reaches the front, which refuses it (neither dies of
/// it), and `capexec upgrade` says why; the users' commands run on. Its
/// admin socket lists them with their users, and ends them.
#[test]
fn the_admin_of_a_server_with_a_user_map_sees_and_ends_the_users_processes() {
    let alice = test_account("capexec-alice", true);
    test_account(FRONT, false);
    let dir = TempDir::new("users-admin");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let map = dir.path().join("users");
    std::fs::write(&map, "# every peer as itself\n").expect("map");
    let socket = dir.path().join("s.sock");
    let admin = dir.path().join("admin.sock");
    let mut server = Std::new(BIN);
    server
        .args(["serve", "--listen"])
        .arg(format!("unix:{}", socket.display()))
        .arg("--admin")
        .arg(format!("unix:{}", admin.display()))
        .arg("--user-map")
        .arg(&map)
        .args(["--privsep-user", FRONT]);
    let (server, address) = spawn_until_first_line(server);
    let mut server = Server(server);
    let address = address.trim().to_string();
    let server_pid = server.id();
    let mut client = run_as(
        alice.uid.as_raw(),
        alice.gid.as_raw(),
        "/",
        &address,
        "exec sleep 100",
    )
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .spawn()
    .expect("capexec run");
    wait_until(|| workers_of(alice.uid.as_raw(), server_pid).len() == 1);
    let worker = workers_of(alice.uid.as_raw(), server_pid)[0];
    wait_until(|| !processes_of(alice.uid.as_raw(), worker, b"sleep").is_empty());
    let command = processes_of(alice.uid.as_raw(), worker, b"sleep")[0];
    assert!(alive(command) && alive(worker));
    assert!(client.try_wait().expect("try_wait").is_none());
    // The admin socket sees the users' processes, each owner with its
    // user, and ends them.
    let admin_arg = format!("unix:{}", admin.display());
    let listed = finish(
        {
            let mut ps = Std::new(BIN);
            ps.args(["ps", "--json", "--connect", &admin_arg]);
            ps
        },
        None,
    );
    assert_eq!(listed.code, 0, "{}", text(&listed.stderr));
    let records: serde_json::Value = serde_json::from_slice(&listed.stdout).expect("json");
    let record = records
        .as_array()
        .expect("an array")
        .iter()
        .find(|record| record["pid"] == command)
        .unwrap_or_else(|| panic!("alice's command is not listed: {records}"));
    assert!(
        record["owner"]
            .as_str()
            .is_some_and(|owner| owner.starts_with("capexec-alice ")),
        "{record}"
    );
    let killed = finish(
        {
            let mut kill = Std::new(BIN);
            kill.args(["kill", "--connect", &admin_arg, &command.to_string()]);
            kill
        },
        None,
    );
    assert_eq!(killed.code, 0, "{}", text(&killed.stderr));
    wait_until(|| !alive(command));
    kill(&server, libc::SIGTERM);
    assert_eq!(wait(&mut server), 0);
    let _ = client.kill();
    let _ = client.wait();
}

/// A connection to the Unix socket at `path` made by a process of `uid`
/// (so its peer credentials are that user's), for this test to use; the
/// process that made it stays until the returned one is dropped (a server
/// refuses a peer whose process has gone, since it cannot check it).
struct ConnectedAs {
    stream: Option<std::os::unix::net::UnixStream>,
    /// Dropped, it lets the connecting process end.
    _carrier: std::os::unix::net::UnixStream,
    /// The RPC system serving the connection, if one does: stopped (the
    /// connection closed) when this is dropped.
    system: Option<tokio::task::AbortHandle>,
}

impl Drop for ConnectedAs {
    fn drop(&mut self) {
        if let Some(system) = &self.system {
            system.abort();
        }
    }
}

fn connect_as(uid: u32, gid: u32, path: &Path) -> ConnectedAs {
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::process::CommandExt;
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("pair");
    // SAFETY: an all-zero sockaddr_un is valid; the path fits (tests' paths
    // are short).
    let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    address.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    assert!(bytes.len() < address.sun_path.len(), "a short socket path");
    for (to, from) in address.sun_path.iter_mut().zip(bytes) {
        *to = *from as libc::c_char;
    }
    let carrier = theirs.as_raw_fd();
    let mut child = Std::new("/bin/true");
    child.uid(uid).gid(gid);
    // SAFETY: between fork and exec only system calls on values prepared
    // before the fork. The process spawned forks once more and ends: its
    // child, with the user's ids, connects, sends the connection, closes
    // every other descriptor (the pipe `spawn` waits on among them) and
    // stays until the test lets go of the carrier, so the server can still
    // look at the peer. (Blocking here instead would keep `spawn` waiting.)
    unsafe {
        child.pre_exec(move || {
            if libc::fork() != 0 {
                libc::_exit(0);
            }
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            let connected = fd >= 0
                && libc::connect(
                    fd,
                    (&raw const address).cast::<libc::sockaddr>(),
                    std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
                ) == 0;
            if !connected {
                libc::_exit(3);
            }
            let mut byte = [0u8; 1];
            let mut iov = libc::iovec {
                iov_base: byte.as_mut_ptr().cast(),
                iov_len: 1,
            };
            let mut control = [0u64; 4];
            let mut message: libc::msghdr = std::mem::zeroed();
            message.msg_iov = &mut iov;
            message.msg_iovlen = 1;
            message.msg_control = control.as_mut_ptr().cast();
            message.msg_controllen = libc::CMSG_SPACE(4) as usize;
            let header = libc::CMSG_FIRSTHDR(&message);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(4) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<libc::c_int>(), fd);
            if libc::sendmsg(carrier, &message, 0) != 1 {
                libc::_exit(4);
            }
            let last = u32::MAX;
            let carrier = carrier as u32;
            if carrier > 0 {
                libc::syscall(libc::SYS_close_range, 0u32, carrier - 1, 0u32);
            }
            libc::syscall(libc::SYS_close_range, carrier + 1, last, 0u32);
            libc::read(carrier as i32, byte.as_mut_ptr().cast(), 1);
            libc::_exit(0);
        });
    }
    let mut maker = child.spawn().expect("the connecting process");
    assert_eq!(wait(&mut maker), 0);
    drop(theirs);
    let mut byte = [0u8; 1];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let message = nix::sys::socket::recvmsg::<()>(
        ours.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        nix::sys::socket::MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .expect("recvmsg");
    let fd = message
        .cmsgs()
        .expect("control messages")
        .find_map(|control| match control {
            nix::sys::socket::ControlMessageOwned::ScmRights(fds) => fds.first().copied(),
            _ => None,
        })
        .expect("the connection");
    ConnectedAs {
        // SAFETY: the kernel just installed it for us.
        stream: Some(unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) }),
        _carrier: ours,
        system: None,
    }
}

/// The executor of a connection to a server that runs logins as users,
/// made as `uid` (by the process kept in the returned value).
fn executor_as(uid: u32, gid: u32, path: &Path) -> (executor::Client, ConnectedAs) {
    let mut connected = connect_as(uid, gid, path);
    let stream = connected.stream.take().expect("the stream");
    stream.set_nonblocking(true).expect("nonblocking");
    let (reader, writer) = tokio::net::UnixStream::from_std(stream)
        .expect("stream")
        .into_split();
    let mut system = crate::common::raw_client_system(reader, writer);
    let executor: executor::Client = system.bootstrap(capnp_rpc::rpc_twoparty_capnp::Side::Server);
    connected.system = Some(tokio::task::spawn_local(system).abort_handle());
    (executor, connected)
}

#[test]
fn a_user_cannot_restore_another_users_detached_process() {
    let alice = test_account("capexec-alice", true);
    let bob = test_account("capexec-bob", false);
    test_account(FRONT, false);
    let dir = TempDir::new("users-restore");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let map = dir.path().join("users");
    std::fs::write(&map, "# every peer as itself\n").expect("map");
    let socket = dir.path().join("s.sock");
    let (mut server, _) = serve_users(&[format!("unix:{}", socket.display())], &map);
    run_on_runtime(async {
        let (bobs, _bob) = executor_as(bob.uid.as_raw(), bob.gid.as_raw(), &socket);
        let sleeper = Command::new("sleep")
            .arg("100")
            .spawn(&bobs)
            .await
            .expect("bob's sleep");
        let token = sleeper
            .detachable(std::time::Duration::from_secs(60))
            .await
            .expect("detachable");
        let pid = sleeper.info().await.expect("info").pid;
        // Alice holds bob's token: her worker has no such process.
        let (alices, _alice) = executor_as(alice.uid.as_raw(), alice.gid.as_raw(), &socket);
        let (_, restored) = capexec::client::restore(&alices, &token);
        let error = restored.await.expect_err("alice restores bob's process");
        match &error {
            capexec::client::Error::Refused(refusal) => assert_eq!(
                (refusal.kind, refusal.message.as_str()),
                (
                    capexec::model::RefusalKind::UnknownToken,
                    "no process has this restore token (it never existed, it was not restored \
                     within its grace period, or it finished longer ago than the server keeps \
                     finished processes)"
                )
            ),
            other => panic!("alice's restore failed otherwise: {other}"),
        }
        // Nor can she signal it: the kernel refuses her worker.
        let signalled = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .output(&alices)
            .await
            .expect("alice's kill");
        assert_eq!(signalled.exit.status, ExitStatus::Code(1));
        assert!(alive(pid));
        // Bob, on another connection, gets it back.
        let (again, _bob_again) = executor_as(bob.uid.as_raw(), bob.gid.as_raw(), &socket);
        let (process, restored) = capexec::client::restore(&again, &token);
        restored.await.expect("bob restores his process");
        assert_eq!(process.info().await.expect("info").pid, pid);
        assert!(process.terminate().await.expect("terminate"));
    });
    kill(&server, libc::SIGTERM);
    assert_eq!(wait(&mut server), 0);
}

/// A self-signed certificate and its key in `dir` (0644: the front reads
/// the server's), and the certificate's SHA-256 as the map names it.
fn certificate(dir: &Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let made = rcgen::generate_simple_self_signed(vec![format!("{name}.test")]).expect("cert");
    let (cert, key) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&cert, made.cert.pem()).expect("cert");
    std::fs::write(&key, made.signing_key.serialize_pem()).expect("key");
    for file in [&cert, &key] {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    }
    let sha256 = capexec::net::TlsServer::certificate_fingerprint(&cert).expect("fingerprint");
    (cert, key, sha256)
}

#[test]
fn a_tls_client_certificate_logs_in_as_the_user_its_cert_line_maps_to() {
    test_account("capexec-alice", true);
    test_account("capexec-bob", false);
    test_account(FRONT, false);
    let dir = TempDir::new("users-certs");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let (server_cert, server_key, server_sha256) = certificate(dir.path(), "server");
    let (alice_cert, alice_key, alice_sha256) = certificate(dir.path(), "alice");
    let (bob_cert, bob_key, bob_sha256) = certificate(dir.path(), "bob");
    let (stray_cert, stray_key, stray_sha256) = certificate(dir.path(), "stray");
    let token = dir.path().join("bob-token");
    std::fs::write(&token, "bob-secret-9876543210\n").expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let map = dir.path().join("users");
    std::fs::write(
        &map,
        format!(
            "cert sha256:{alice_sha256} capexec-alice\ncert {bob_sha256} capexec-bob\n\
             token bob-token capexec-bob\n"
        ),
    )
    .expect("map");
    let mut server = Std::new(BIN);
    server
        .args(["serve", "--listen", "tcp:127.0.0.1:0", "--tls-cert"])
        .arg(&server_cert)
        .arg("--tls-key")
        .arg(&server_key)
        .arg("--user-map")
        .arg(&map)
        .args(["--privsep-user", FRONT]);
    let (server, address) = spawn_until_first_line(server);
    let mut server = Server(server);
    let address = address.trim().to_string();
    let run = |login: &[&str]| {
        let mut command = Std::new(BIN);
        command
            .args(["run", "--connect", &address, "--tls-pin", &server_sha256])
            .args(login)
            .args(["-n", "--", "id", "-un"])
            .env("HOME", "/root")
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("CAPEXEC_TOKEN");
        finish(command, None)
    };
    let path = |file: &Path| file.display().to_string();
    for (cert, key, name) in [
        (&alice_cert, &alice_key, "capexec-alice"),
        (&bob_cert, &bob_key, "capexec-bob"),
    ] {
        let done = run(&[
            "--tls-client-cert",
            &path(cert),
            "--tls-client-key",
            &path(key),
        ]);
        assert_eq!(
            (done.code, text(&done.stdout)),
            (0, format!("{name}\n")),
            "{}",
            text(&done.stderr)
        );
    }
    // A token in the environment is not tried instead of the certificate.
    let mut with_token = Std::new(BIN);
    with_token
        .args(["run", "--connect", &address, "--tls-pin", &server_sha256])
        .args([
            "--tls-client-cert",
            &path(&alice_cert),
            "--tls-client-key",
            &path(&alice_key),
        ])
        .args(["-n", "--", "id", "-un"])
        .env("HOME", "/root")
        .env_remove("XDG_CONFIG_HOME")
        .env("CAPEXEC_TOKEN", "some-other-servers-token-0123456789");
    let done = finish(with_token, None);
    assert_eq!(
        (done.code, text(&done.stdout).as_str()),
        (0, "capexec-alice\n")
    );
    // A certificate the map does not name logs in as nobody.
    let done = run(&[
        "--tls-client-cert",
        &path(&stray_cert),
        "--tls-client-key",
        &path(&stray_key),
    ]);
    assert_eq!(done.code, 125);
    assert!(
        text(&done.stderr).contains(&format!(
            "login refused: no user is mapped to the client certificate {stray_sha256}"
        )),
        "{}",
        text(&done.stderr)
    );
    // A certificate with another's key is refused before anything is sent.
    let done = run(&[
        "--tls-client-cert",
        &path(&alice_cert),
        "--tls-client-key",
        &path(&bob_key),
    ]);
    assert_eq!(done.code, 125);
    assert_eq!(
        text(&done.stderr),
        format!(
            "capexec: --tls-client-cert: {} is not the private key of the certificate in {}\n",
            bob_key.display(),
            alice_cert.display()
        )
    );
    // Tokens log in beside certificates; no certificate and no token does
    // not.
    let done = run(&["--token-file", &path(&token)]);
    assert_eq!(
        (done.code, text(&done.stdout).as_str()),
        (0, "capexec-bob\n")
    );
    let done = run(&[]);
    assert_eq!(done.code, 125, "{}", text(&done.stdout));
    kill(&server, libc::SIGTERM);
    assert_eq!(wait(&mut server), 0);
}

/// A token file maps its TCP logins to a user: whoever reads it logs in
/// as that user, whoever writes it makes a token of theirs do so. One
/// that another user could read or write is refused at start, as sshd
/// refuses such an authorized_keys.
#[test]
fn a_token_file_another_user_could_read_or_write_is_refused() {
    let alice = test_account("capexec-alice", true);
    let bob = test_account("capexec-bob", false);
    test_account(FRONT, false);
    let dir = TempDir::new("users-token-modes");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let token = dir.path().join("alice.token");
    std::fs::write(&token, "alice-secret-0123456789\n").expect("token");
    let map = dir.path().join("users");
    std::fs::write(&map, "token alice.token capexec-alice\n").expect("map");
    let map_arg = map.display().to_string();
    let serve = || {
        let mut command = Std::new(BIN);
        command
            .args([
                "serve",
                "--listen",
                "tcp:127.0.0.1:0",
                "--user-map",
                &map_arg,
            ])
            .args(["--privsep-user", FRONT])
            .env("HOME", "/root");
        finish(command, None)
    };
    // Readable by everyone: any local user could log in as alice.
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let done = serve();
    assert_eq!(done.code, 125);
    assert_eq!(
        text(&done.stderr),
        format!(
            "capexec: --user-map {map_arg}: the token file {} (for capexec-alice) has mode \
             0644: another user could read or write it and log in as capexec-alice; chmod 600 \
             it\n",
            token.display()
        )
    );
    // Private, but bob's: bob could write a token of his in it.
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    std::os::unix::fs::chown(&token, Some(bob.uid.as_raw()), None).expect("chown");
    let done = serve();
    assert_eq!(done.code, 125);
    assert_eq!(
        text(&done.stderr),
        format!(
            "capexec: --user-map {map_arg}: the token file {} (for capexec-alice) is uid {}'s: \
             that user could write a token of theirs in it and log in as capexec-alice; make it \
             root's or capexec-alice's\n",
            token.display(),
            bob.uid
        )
    );
    // Alice's own, 0600: served.
    std::os::unix::fs::chown(&token, Some(alice.uid.as_raw()), None).expect("chown");
    let (mut server, address) = serve_users(&["tcp:127.0.0.1:0".to_string()], &map);
    assert!(address.starts_with("tcp:127.0.0.1:"), "{address}");
    kill(&server, libc::SIGKILL);
    let _ = server.wait();
}

#[test]
fn one_user_cannot_hold_every_connection_of_the_unix_listener() {
    let alice = test_account("capexec-alice", true);
    let bob = test_account("capexec-bob", false);
    test_account(FRONT, false);
    let dir = TempDir::new("users-per-user");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let map = dir.path().join("users");
    std::fs::write(&map, "# every peer as itself\n").expect("map");
    let socket = dir.path().join("s.sock");
    let (mut server, _) = serve_users_with(
        &[format!("unix:{}", socket.display())],
        &map,
        &["--max-connections-per-user", "2"],
    );
    let (alice_ids, bob_ids) = (
        (alice.uid.as_raw(), alice.gid.as_raw()),
        (bob.uid.as_raw(), bob.gid.as_raw()),
    );
    run_on_runtime(async {
        let (first, first_holder) = executor_as(alice_ids.0, alice_ids.1, &socket);
        let (second, _second_holder) = executor_as(alice_ids.0, alice_ids.1, &socket);
        for executor in [&first, &second] {
            assert_eq!(
                stdout_of(executor, "id -u").await.1,
                format!("{}\n", alice_ids.0)
            );
        }
        // Her third is turned away, saying why; the server serves on.
        let (third, _third_holder) = executor_as(alice_ids.0, alice_ids.1, &socket);
        let refused = sh("id -u").output(&third).await.expect_err("alice's third");
        assert!(
            refused.to_string().contains(&format!(
                "too many connections from uid {} (the limit is 2 per user); close some and \
                 try again",
                alice_ids.0
            )),
            "{refused}"
        );
        // Bob's share is his own.
        let (bobs, _bob) = executor_as(bob_ids.0, bob_ids.1, &socket);
        assert_eq!(
            stdout_of(&bobs, "id -u").await.1,
            format!("{}\n", bob_ids.0)
        );
        // Once she closes one, she may open another (the server sees the
        // close in its own time).
        drop((first, first_holder));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let (again, _holder) = executor_as(alice_ids.0, alice_ids.1, &socket);
            match sh("id -u").output(&again).await {
                Ok(output) => {
                    assert_eq!(output.stdout, format!("{}\n", alice_ids.0).into_bytes());
                    break;
                }
                Err(error) => {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "alice's connection after closing one: {error}"
                    );
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
        assert_eq!(
            stdout_of(&second, "id -u").await.1,
            format!("{}\n", alice_ids.0)
        );
    });
    kill(&server, libc::SIGTERM);
    assert_eq!(wait(&mut server), 0);
}

/// Where the cgroup2 hierarchy is mounted.
fn cgroup2_mount() -> std::path::PathBuf {
    let mounts = std::fs::read_to_string("/proc/mounts").expect("/proc/mounts");
    let point = mounts
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.get(2) == Some(&"cgroup2")).then(|| fields[1].to_string())
        })
        .expect("this machine has a cgroup2 hierarchy, as CI's has");
    std::path::PathBuf::from(point)
}

#[test]
fn a_users_processes_are_tracked_in_a_cgroup_delegated_to_that_user_alone() {
    let alice = test_account("capexec-alice", true);
    let bob = test_account("capexec-bob", false);
    test_account(FRONT, false);
    let dir = TempDir::new("users-cgroups");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let map = dir.path().join("users");
    std::fs::write(&map, "# every peer as itself\n").expect("map");
    let socket = dir.path().join("s.sock");
    let (mut server, address) = serve_users(&[format!("unix:{}", socket.display())], &map);
    let (uid, gid) = (alice.uid.as_raw(), alice.gid.as_raw());
    // A command that leaves a process behind in a session of its own,
    // out of reach of its process group.
    let done = finish(
        run_as(
            uid,
            gid,
            "/",
            &address,
            "sed -n 's/^0:://p' /proc/self/cgroup; setsid sleep 1000 >/dev/null 2>&1 & echo $!",
        ),
        None,
    );
    assert_eq!(done.code, 0, "{}", text(&done.stderr));
    let stdout = text(&done.stdout);
    let mut lines = stdout.lines();
    let (group, escaped) = (
        lines.next().expect("the cgroup").to_string(),
        lines
            .next()
            .and_then(|pid| pid.parse::<u32>().ok())
            .expect("the escaped pid"),
    );
    // The monitor's root, the group it gave alice, her worker's root, the
    // command's leaf.
    let workers = workers_of(uid, server.id());
    assert_eq!(workers.len(), 1, "alice's worker");
    let segments: Vec<&str> = group.rsplit('/').take(4).collect();
    assert!(
        segments.len() == 4
            && segments[0].starts_with("p-")
            && segments[1].starts_with(&format!("capexec-{}-", workers[0]))
            && segments[2].starts_with(&format!("u-{uid}-"))
            && segments[3].starts_with(&format!("capexec-{}-", server.id())),
        "{group}"
    );
    // What the command left behind ends with it: the worker kills its
    // cgroup when the command is released (its client has gone).
    wait_until(|| !alive(escaped));
    // Alice's group is hers; what holds it is root's, and bob's is his.
    let mount = cgroup2_mount();
    // (Leaf and worker root are gone once the command has been released.)
    let cut = |path: &str, levels: usize| {
        let mut path = std::path::PathBuf::from(path);
        for _ in 0..levels {
            path.pop();
        }
        mount.join(path.strip_prefix("/").unwrap_or(&path))
    };
    let users_group = cut(&group, 2);
    let monitors_root = cut(&group, 3);

    let owner = |path: &Path| std::fs::metadata(path).expect("cgroup").uid();
    assert_eq!(owner(&users_group), uid);
    assert_eq!(owner(&monitors_root), 0);
    assert_eq!(owner(&monitors_root.join("cgroup.procs")), 0);
    // Alice cannot move her commands out of her group, into the monitor's
    // root or into bob's.
    let bobs = finish(
        run_as(
            bob.uid.as_raw(),
            bob.gid.as_raw(),
            "/",
            &address,
            "sed -n 's/^0:://p' /proc/self/cgroup",
        ),
        None,
    );
    assert_eq!(bobs.code, 0, "{}", text(&bobs.stderr));
    let bobs_group = cut(text(&bobs.stdout).trim(), 2);
    for target in [
        monitors_root.clone(),
        users_group.join("worker"),
        bobs_group,
    ] {
        let moved = finish(
            run_as(
                uid,
                gid,
                "/",
                &address,
                &format!("echo $$ > {}/cgroup.procs", target.display()),
            ),
            None,
        );
        assert_ne!(moved.code, 0, "alice moved into {}", target.display());
        assert!(
            text(&moved.stderr).contains("Permission denied"),
            "{}: {}",
            target.display(),
            text(&moved.stderr)
        );
    }
    kill(&server, libc::SIGTERM);
    assert_eq!(wait(&mut server), 0);
    // Nothing is left of the monitor's cgroups.
    wait_until(|| !monitors_root.exists());
}

/// The inode of the executable `pid` runs (after an upgrade, the new
/// binary's).
fn exe_inode(pid: u32) -> u64 {
    std::fs::metadata(format!("/proc/{pid}/exe"))
        .expect("exe")
        .ino()
}

/// Asserts that `uid:gid` runs `id -un` through `address` as `name`.
fn logs_in_as(uid: u32, gid: u32, address: &str, name: &str) {
    let done = finish(run_as(uid, gid, "/", address, "id -un"), None);
    assert_eq!(
        (done.code, text(&done.stdout)),
        (0, format!("{name}\n")),
        "{}",
        text(&done.stderr)
    );
}

/// `capexec upgrade` on the admin socket at `admin`.
fn upgrade_via(admin: &Path) -> crate::common::cli::Finished {
    let mut upgrade = Std::new(BIN);
    upgrade
        .args(["upgrade", "--connect"])
        .arg(format!("unix:{}", admin.display()))
        .env_remove("XDG_CONFIG_HOME");
    finish(upgrade, None)
}

/// A server that runs logins as users (every peer as itself), started
/// from a copy of the binary in `dir` (which a test may replace), with a
/// Unix listener and an admin socket, logging to `dir/serve.log`: the
/// server, its address, the admin socket and the binary's path.
fn upgradable_users_server(dir: &Path) -> (Server, String, std::path::PathBuf, std::path::PathBuf) {
    let map = dir.join("users");
    std::fs::write(&map, "# every peer as itself\n").expect("map");
    let (socket, admin) = (dir.join("s.sock"), dir.join("admin.sock"));
    let exe = dir.join("capexec");
    crate::upgrade::put_binary(&exe, None);
    let log = std::fs::File::create(dir.join("serve.log")).expect("log");
    let mut server = Std::new(&exe);
    server
        .args(["serve", "--listen"])
        .arg(format!("unix:{}", socket.display()))
        .arg("--admin")
        .arg(format!("unix:{}", admin.display()))
        .arg("--user-map")
        .arg(&map)
        .args(["--privsep-user", FRONT])
        .env("RUST_LOG", "info")
        .stderr(log);
    let (server, address) = crate::common::cli::spawn_reading_first_line(server);
    let address = address.trim().to_string();
    (Server(server), address, admin, exe)
}

#[test]
fn a_server_with_a_user_map_upgrades_in_place_and_ends_nothing() {
    use std::io::{Read, Write};
    let alice = test_account("capexec-alice", true);
    let front = test_account(FRONT, false);
    let dir = TempDir::new("users-upgrade");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).expect("mkdir");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let (mut server, address, admin, exe) = upgradable_users_server(dir.path());
    let monitor = server.id();
    let (uid, gid) = (alice.uid.as_raw(), alice.gid.as_raw());
    // Alice's command echoes its stdin's first line, then waits for `go`
    // and copies the rest.
    let (ready, go) = (shared.join("ready"), shared.join("go"));
    let script = format!(
        "read first; echo \"got $first\"; : > {ready}; \
         while [ ! -e {go} ]; do sleep 0.01; done; cat; exit 4",
        ready = ready.display(),
        go = go.display()
    );
    let mut client = {
        use std::os::unix::process::CommandExt;
        let mut command = Std::new(BIN);
        command
            .args(["run", "--connect", &address, "--resume", "60", "--"])
            .args(["sh", "-c", &script])
            .env("HOME", "/")
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("CAPEXEC_TOKEN")
            .uid(uid)
            .gid(gid)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        command.spawn().expect("alice's capexec run")
    };
    let mut stdin = client.stdin.take().expect("stdin");
    let mut stdout = client.stdout.take().expect("stdout");
    let output = std::thread::spawn(move || {
        let mut all = Vec::new();
        let _ = stdout.read_to_end(&mut all);
        all
    });
    stdin.write_all(b"one\n").expect("write");
    wait_until(|| ready.exists());
    let worker = workers_of(uid, monitor)[0];
    let old_front = processes_of(front.uid.as_raw(), monitor, b"--front")[0];
    let command = processes_of(uid, worker, b"read first")[0];
    let old = exe_inode(monitor);
    assert_eq!(exe_inode(worker), old);

    // A binary that cannot take over: nothing happens, by either way in.
    crate::upgrade::put_binary(&exe, Some("#!/bin/sh\necho nope\nexit 3\n"));
    let refused = upgrade_via(&admin);
    assert_eq!(refused.code, 125, "{}", text(&refused.stderr));
    assert!(
        text(&refused.stderr)
            .starts_with("capexec: the server was not upgraded and serves as before: ")
            && text(&refused.stderr).contains(
                "ended with exit code 3 and said \"nope\" (expected \"capexec-handover-1\")"
            ),
        "{}",
        text(&refused.stderr)
    );
    kill(&server, libc::SIGUSR2);
    logs_in_as(uid, gid, &address, "capexec-alice");
    assert_eq!(
        processes_of(front.uid.as_raw(), monitor, b"--front"),
        [old_front]
    );
    assert_eq!(exe_inode(worker), old);

    // The real one: the monitor, the worker and the front run it, the
    // command goes on, and alice's client carries on where it was.
    crate::upgrade::put_binary(&exe, None);
    let new = std::fs::metadata(&exe).expect("exe").ino();
    assert_ne!(new, old);
    let upgraded = upgrade_via(&admin);
    assert_eq!(upgraded.code, 0, "{}", text(&upgraded.stderr));
    assert_eq!(
        text(&upgraded.stderr),
        "capexec: upgraded: the server serves from the new binary\n"
    );
    assert!(server.try_wait().expect("try_wait").is_none());
    // What answered `capexec upgrade` was the new front, started by the
    // new monitor: both run the new binary already.
    assert_eq!(exe_inode(monitor), new);
    assert!(
        processes_of(front.uid.as_raw(), monitor, b"--front")
            .iter()
            .any(|pid| *pid != old_front && exe_inode(*pid) == new)
    );
    wait_until(|| alive(worker) && exe_inode(worker) == new);
    assert!(alive(command));
    // (The exec sets the new executable before the new command line: for
    // a moment the worker's /proc/PID/cmdline reads empty.)
    wait_until(|| workers_of(uid, monitor) == [worker]);
    stdin.write_all(b"two\n").expect("write");
    std::fs::write(&go, "").expect("go");
    drop(stdin);
    let code = wait(&mut client);
    assert_eq!(text(&output.join().expect("stdout")), "got one\ntwo\n");
    assert_eq!(code, 4);
    // A second upgrade, by signal, takes over what the first took over.
    crate::upgrade::put_binary(&exe, None);
    let newer = std::fs::metadata(&exe).expect("exe").ino();
    kill(&server, libc::SIGUSR2);
    wait_until(|| exe_inode(monitor) == newer && exe_inode(worker) == newer);
    logs_in_as(uid, gid, &address, "capexec-alice");
    wait_until(|| workers_of(uid, monitor) == [worker]);
    kill(&server, libc::SIGTERM);
    assert_eq!(wait(&mut server), 0);
    wait_until(|| !alive(worker));
}

#[test]
fn a_server_with_a_user_map_starts_workers_of_its_own_binary_once_the_file_is_replaced() {
    let alice = test_account("capexec-alice", true);
    test_account(FRONT, false);
    let dir = TempDir::new("users-replaced");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let (mut server, address, _admin, exe) = upgradable_users_server(dir.path());
    let monitor = server.id();
    let old = exe_inode(monitor);
    // A package manager renames a new binary into place; no upgrade yet.
    crate::upgrade::put_binary(&exe, None);
    assert_ne!(std::fs::metadata(&exe).expect("exe").ino(), old);
    // Alice's first login starts her worker: of the binary the monitor
    // runs, which speaks its protocol, not of the file now at the path.
    let (uid, gid) = (alice.uid.as_raw(), alice.gid.as_raw());
    logs_in_as(uid, gid, &address, "capexec-alice");
    let worker = workers_of(uid, monitor)[0];
    assert_eq!(exe_inode(worker), old);
    kill(&server, libc::SIGTERM);
    assert_eq!(wait(&mut server), 0);
    wait_until(|| !alive(worker));
}

#[test]
fn a_server_with_a_user_map_whose_new_binary_is_gone_by_its_exec_says_so_and_serves_on() {
    let alice = test_account("capexec-alice", true);
    let front = test_account(FRONT, false);
    let dir = TempDir::new("users-upgrade-gone");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let (mut server, address, admin, exe) = upgradable_users_server(dir.path());
    let monitor = server.id();
    let (uid, gid) = (alice.uid.as_raw(), alice.gid.as_raw());
    logs_in_as(uid, gid, &address, "capexec-alice");
    let worker = workers_of(uid, monitor)[0];
    let old_front = processes_of(front.uid.as_raw(), monitor, b"--front")[0];
    let old = exe_inode(monitor);
    // The monitor's exec after the check finds nothing at the path.
    crate::upgrade::put_binary_gone_by_its_exec(&exe);
    let upgraded = upgrade_via(&admin);
    assert_eq!(
        (upgraded.code, text(&upgraded.stderr)),
        (125, crate::upgrade::gone_by_its_exec_said(&exe))
    );
    // The monitor runs the binary it ran, with a new front of it, and its
    // worker serves on.
    assert!(server.try_wait().expect("try_wait").is_none());
    assert_eq!(exe_inode(monitor), old);
    assert!(
        processes_of(front.uid.as_raw(), monitor, b"--front")
            .iter()
            .any(|pid| *pid != old_front && exe_inode(*pid) == old)
    );
    logs_in_as(uid, gid, &address, "capexec-alice");
    assert_eq!(workers_of(uid, monitor), [worker]);
    assert_eq!(exe_inode(worker), old);
    kill(&server, libc::SIGTERM);
    assert_eq!(wait(&mut server), 0);
    wait_until(|| !alive(worker));
}

#[test]
fn an_upgrade_of_a_server_with_a_user_map_in_the_middle_of_256_mib_loses_and_repeats_no_byte() {
    use std::io::Read;
    let alice = test_account("capexec-alice", true);
    test_account(FRONT, false);
    let dir = TempDir::new("users-upgrade-bulk");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let (mut server, address, _admin, exe) = upgradable_users_server(dir.path());
    // seq 1 30000000: 258,888,897 bytes (more than 256 MiB).
    let mut client = {
        use std::os::unix::process::CommandExt;
        let mut command = Std::new(BIN);
        command
            .args(["run", "--connect", &address, "--resume", "60", "-n", "--"])
            .args(["sh", "-c", "seq 1 30000000; exit 3"])
            .env("HOME", "/")
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("CAPEXEC_TOKEN")
            .uid(alice.uid.as_raw())
            .gid(alice.gid.as_raw())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        command.spawn().expect("alice's capexec run")
    };
    let mut stdout = client.stdout.take().expect("stdout");
    let mut stderr = client.stderr.take().expect("stderr");
    let errors = std::thread::spawn(move || {
        let mut all = String::new();
        let _ = stderr.read_to_string(&mut all);
        all
    });
    crate::upgrade::put_binary(&exe, None);
    let expected =
        crate::upgrade::read_seq_signalling(&mut stdout, || kill(&server, libc::SIGUSR2));
    let code = wait(&mut client);
    let errors = errors.join().expect("stderr");
    assert_eq!(expected.compared, 258_888_897, "{errors}");
    assert_eq!(expected.pending, b"", "the last line is whole");
    assert_eq!(code, 3, "{errors}");
    assert!(
        errors.contains("connection lost: the server is upgrading")
            && errors.contains("reconnected; the command carries on"),
        "{errors}"
    );
    let log = std::fs::read_to_string(dir.path().join("serve.log")).unwrap_or_default();
    assert!(
        log.contains("took over the processes of the binary before processes=1 taken=1"),
        "{log}"
    );
    kill(&server, libc::SIGTERM);
    assert_eq!(wait(&mut server), 0);
}
