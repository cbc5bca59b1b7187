//! Codex's sandbox intent, as the Codex bridge confines a start with it,
//! enforced by the kernel: the intent recorded from Codex 0.169.0 in
//! `workspace-write` mode, planned on the executor's machine, and a start
//! under it that tries to write inside the workspace, into its `.git`,
//! outside it, to /tmp, and to reach the network. In process, over a Unix
//! socket and over TCP: the plan lists the workspace through the
//! executor's `Directory`.
//!
//! A binary of its own: the intent makes /tmp writable and every directory
//! of `/` readable, and a server refuses (or, asked to, splits) a root
//! holding its token, so the servers here keep theirs in /dev/shm, which no
//! such root holds, rather than in /tmp among other tests' comings and
//! goings.

mod common;

use std::future::Future;
use std::path::{Path, PathBuf};

use capexec::capexec_capnp::executor;
use capexec::client::Command;
use capexec::codex::sandbox_denied::{DenialScan, sandbox_denied};
use capexec::codex::sandbox_intent::{
    Access, Carving, ExecutorTree, IntentError, Plan, confinement_for,
};
use capexec::engine::Engine;
use capexec::net::Address;
use common::data::TempDir;
use common::server::ServerThread;
use serde_json::Value;

/// The workspace Codex ran in when the fixture was recorded.
const RECORDED_WS: &str = "/tmp/h-cap/ws-workspace-write";

/// Runs `body` against the in-process executor, then a Unix-socket and a
/// TCP server of this process (their directories in /dev/shm).
fn on_every_backend<F, Fut>(name: &str, body: F)
where
    F: Fn(executor::Client) -> Fut,
    Fut: Future<Output = ()>,
{
    common::run_local(async {
        body(capexec::rpc::local_executor(Engine::default())).await;
        for tcp in [false, true] {
            let dir = TempDir(PathBuf::from(format!(
                "/dev/shm/capexec-codex-sandbox-{name}-{}-{tcp}",
                std::process::id()
            )));
            let _ = std::fs::remove_dir_all(&dir.0);
            std::fs::create_dir(&dir.0).expect("server directory in /dev/shm");
            let listen: Address = if tcp {
                "tcp:127.0.0.1:0".parse().expect("address")
            } else {
                Address::Unix(dir.0.join("capexec.sock"))
            };
            let server = ServerThread::start_with(dir, vec![listen]);
            let connection = capexec::net::connect(&server.address, server.token.as_ref())
                .await
                .expect("connect");
            body(connection.executor()).await;
        }
    });
}

/// Landlock and seccomp are what this confinement stands on: a machine
/// without them fails here, loudly, rather than passing unconfined.
fn require_kernel_sandbox() {
    let support = capexec::sandbox::support(&capexec::sandbox::HostConfig::default());
    assert!(
        support.landlock_abi >= 1 && support.seccomp,
        "Codex's sandbox needs Landlock and seccomp; this kernel has Landlock ABI {} and \
         seccomp {}",
        support.landlock_abi,
        support.seccomp
    );
}

/// A directory of its own, outside /tmp (so that /tmp, writable in the
/// intent, need not be split around it).
struct Base(PathBuf);

impl Base {
    fn new(name: &str) -> Base {
        static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let path = common::data::outside_temporary_directories().join(format!(
            "codex-sandbox-{name}-{}-{}",
            std::process::id(),
            MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("base");
        Base(path)
    }
}

impl Drop for Base {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The recorded `process/start` intent, for workspace `ws`.
fn intent_for(ws: &Path, network: &str) -> Value {
    let text = include_str!("codex/fixtures/start-workspace-write.json")
        .replace(RECORDED_WS, ws.to_str().expect("utf-8 path"));
    let mut start: Value = serde_json::from_str(&text).expect("fixture");
    start["sandbox"]["permissions"]["network"] = network.into();
    start["sandbox"].take()
}

/// A workspace with a `.git` (a file to protect in it), `src` and a file.
fn workspace(base: &Base) -> PathBuf {
    let ws = base.0.join("ws");
    std::fs::create_dir_all(ws.join(".git")).expect("mkdir");
    std::fs::create_dir_all(ws.join("src")).expect("mkdir");
    std::fs::create_dir_all(base.0.join("outside")).expect("mkdir");
    std::fs::write(ws.join(".git/config"), "[core]\n").expect("write");
    std::fs::write(ws.join("README"), "readme\n").expect("write");
    ws
}

/// `script` run as Codex runs commands, by bash.
fn bash(script: &str) -> Command {
    let mut command = Command::new("bash");
    command.args(["-c", script]);
    command
}

async fn plan(executor: &executor::Client, ws: &Path, network: &str) -> Plan {
    plan_carving(executor, ws, network, Carving::Split).await
}

async fn plan_carving(
    executor: &executor::Client,
    ws: &Path,
    network: &str,
    carving: Carving,
) -> Plan {
    let intent = intent_for(ws, network);
    let confinement = confinement_for(Some(&intent), ws, false)
        .expect("intent")
        .expect("a restricting intent");
    confinement
        .plan_carving(&ExecutorTree::new(executor.clone()), None, carving)
        .await
        .expect("plan")
}

/// Both ways of keeping `.git` read-only: splitting the workspace (any
/// server; nothing new at its top) and mounting `.git` read-only (a root
/// server, as CI's; the workspace stays writable as a whole).
async fn workspace_write_writes_only_where(executor: executor::Client) {
    for carving in [Carving::Split, Carving::Mount] {
        workspace_write_writes_only_where_carving(&executor, carving).await;
    }
}

async fn workspace_write_writes_only_where_carving(executor: &executor::Client, carving: Carving) {
    let executor = executor.clone();
    require_kernel_sandbox();
    let base = Base::new("write");
    let ws = workspace(&base);
    let plan = plan_carving(&executor, &ws, "restricted", carving).await;
    let in_tmp = Path::new("/tmp").join(base.0.file_name().expect("named"));
    let _ = std::fs::remove_file(&in_tmp);
    let script = format!(
        "echo a > src/new && echo b >> README && echo c > {tmp} && echo inside; \
         if echo x >> .git/config; then echo WROTE-GIT; fi; \
         if echo x > .git/new; then echo MADE-IN-GIT; fi; \
         if mv README .git/README; then echo MOVED-INTO-GIT; fi; \
         if echo x > ../outside/f; then echo WROTE-OUTSIDE; fi; \
         if echo top > top; then echo made-top; fi; echo end",
        tmp = in_tmp.display()
    );
    let mut command = bash(&script);
    command.current_dir(&ws).sandbox(plan.sandbox());
    let output = command.output(&executor).await.expect("start");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let (expected, denied, read_only) = match carving {
        // Landlock's EACCES, as the shell words it, once per attempt; a
        // new entry at the top of the split workspace among them.
        Carving::Split => ("inside\nend\n", 5, 0),
        // The mount's EROFS for `.git`, Landlock's EACCES outside.
        Carving::Mount => ("inside\nmade-top\nend\n", 1, 3),
    };
    assert_eq!(
        (output.exit.status.shell_code(), stdout.as_ref()),
        (0, expected),
        "{carving:?}: {stderr}"
    );
    assert_eq!(
        (
            stderr.matches("Permission denied").count(),
            stderr.matches("Read-only file system").count()
        ),
        (denied, read_only),
        "{carving:?}: {stderr}"
    );
    assert_eq!(ws.join("top").exists(), carving == Carving::Mount);
    assert_eq!(
        std::fs::read_to_string(ws.join("src/new")).expect("new"),
        "a\n"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("README")).expect("readme"),
        "readme\nb\n"
    );
    assert_eq!(std::fs::read_to_string(&in_tmp).expect("tmp"), "c\n");
    std::fs::remove_file(&in_tmp).expect("remove");
    assert_eq!(
        std::fs::read_to_string(ws.join(".git/config")).expect("config"),
        "[core]\n"
    );
    assert!(!ws.join(".git/new").exists());
    assert!(!ws.join(".git/README").exists());
    assert!(!base.0.join("outside/f").exists());
}

async fn a_denied_write_is_reported(executor: executor::Client) {
    require_kernel_sandbox();
    let base = Base::new("denied");
    let ws = workspace(&base);
    let plan = plan(&executor, &ws, "restricted").await;
    let mut command = bash("echo x > .git/config");
    command.current_dir(&ws).sandbox(plan.sandbox());
    let output = command.output(&executor).await.expect("start");
    let code = output.exit.status.shell_code();
    assert_eq!(code, 1, "{}", String::from_utf8_lossy(&output.stderr));
    let (mut stdout, mut stderr) = (DenialScan::new(), DenialScan::new());
    stdout.feed(&output.stdout);
    stderr.feed(&output.stderr);
    assert!(sandbox_denied(code, [&stdout, &stderr]));
}

/// The whole start as the bridge makes it: planned, started, checked.
async fn a_confined_start_runs_where_it_may(executor: executor::Client) {
    require_kernel_sandbox();
    let base = Base::new("start");
    let ws = workspace(&base);
    let intent = intent_for(&ws, "restricted");
    let confinement = confinement_for(Some(&intent), &ws, false)
        .expect("intent")
        .expect("a restricting intent");
    let mut command = bash("echo made > src/made; echo top > top; echo x >> .git/config");
    command.current_dir(&ws);
    let process = confinement
        .start(&executor, &mut command, None, Carving::Mount)
        .await
        .expect("start");
    let mut events = process.events(0).await.expect("events");
    let mut stderr = Vec::new();
    let mut exit = None;
    while let Some(event) = futures::StreamExt::next(&mut events).await {
        match event.expect("event").body {
            capexec::model::EventBody::Output { data, .. } => stderr.extend_from_slice(&data),
            capexec::model::EventBody::Exited(status) => exit = Some(status),
            capexec::model::EventBody::Closed => break,
            _ => {}
        }
    }
    let text = String::from_utf8_lossy(&stderr);
    assert!(
        text.contains(".git/config: Read-only file system"),
        "{text}"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("top")).expect("made at the top"),
        "top\n"
    );
    assert_eq!(exit.map(|exit| exit.status.shell_code()), Some(1), "{text}");
    assert_eq!(
        std::fs::read_to_string(ws.join("src/made")).expect("made"),
        "made\n"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join(".git/config")).expect("config"),
        "[core]\n"
    );
}

#[test]
fn a_confined_start_is_planned_started_and_checked() {
    on_every_backend("start", a_confined_start_runs_where_it_may);
}

async fn what_was_applied_was_planned(executor: executor::Client) {
    require_kernel_sandbox();
    let base = Base::new("applied");
    let ws = workspace(&base);
    let plan = plan(&executor, &ws, "restricted").await;
    let mut command = bash("exec sleep 1000");
    command.current_dir(&ws).sandbox(plan.sandbox());
    let process = command.spawn(&executor).await.expect("start");
    let info = process.info().await.expect("info");
    let applied = info.confinement.sandbox.expect("sandboxed");
    assert_eq!(plan.check_applied(&applied), Ok(()));
    let ws = std::fs::canonicalize(&ws).expect("canonical");
    assert!(applied.writable.contains(&ws.join("src")), "{applied:?}");
    assert!(!applied.writable.contains(&ws), "{applied:?}");
    assert!(
        info.confinement
            .enforced
            .iter()
            .any(|name| name == "filesystem")
    );
    assert!(
        info.confinement
            .enforced
            .iter()
            .any(|name| name == "network-sockets")
    );
    drop(process);

    // Mounted: the workspace writable as a whole, `.git` read-only inside;
    // a sandbox without the mount (an executor that ignored it) is caught.
    let plan = plan_carving(&executor, &ws, "restricted", Carving::Mount).await;
    assert_eq!(plan.read_only_inside, vec![ws.join(".git")]);
    let mut command = bash("exec sleep 1000");
    command.current_dir(&ws).sandbox(plan.sandbox());
    let process = command.spawn(&executor).await.expect("start");
    let info = process.info().await.expect("info");
    let mut applied = info.confinement.sandbox.expect("sandboxed");
    assert_eq!(plan.check_applied(&applied), Ok(()));
    assert!(applied.writable.contains(&ws), "{applied:?}");
    assert_eq!(applied.read_only_inside, vec![ws.join(".git")]);
    applied.read_only_inside.clear();
    assert!(
        matches!(plan.check_applied(&applied), Err(IntentError::Executor(why))
            if why.contains("did not keep") && why.contains(".git")),
        "{applied:?}"
    );
}

/// A TCP connection to a listener of the test's: refused by the sandbox
/// when Codex restricts the network, made when it enables it.
async fn the_network_is_off_when_restricted(executor: executor::Client) {
    require_kernel_sandbox();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let port = listener.local_addr().expect("address").port();
    let base = Base::new("network");
    let ws = workspace(&base);
    let script =
        format!("if exec 3<>/dev/tcp/127.0.0.1/{port}; then echo connected; else echo refused; fi");
    for (network, expected) in [("restricted", "refused\n"), ("enabled", "connected\n")] {
        let plan = plan(&executor, &ws, network).await;
        let mut command = bash(&script);
        command.current_dir(&ws).sandbox(plan.sandbox());
        let output = command.output(&executor).await.expect("start");
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            expected,
            "{network}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// `fs/*` under the intent: a directory beneath the deepest root that
/// allows the call, read-only unless writable; refused elsewhere.
async fn fs_calls_reach_what_the_intent_allows(executor: executor::Client) {
    require_kernel_sandbox();
    let base = Base::new("fs");
    let ws = workspace(&base);
    let plan = plan(&executor, &ws, "restricted").await;
    let (dir, relative) = plan
        .directory_for(&executor, &ws.join("src/new.rs"), Access::Write)
        .await
        .expect("src is writable");
    assert_eq!(relative, Path::new("new.rs"));
    dir.write(&relative, b"fn main() {}\n".to_vec())
        .await
        .expect("write");
    assert_eq!(
        std::fs::read(ws.join("src/new.rs")).expect("written"),
        b"fn main() {}\n"
    );
    let refused = plan
        .directory_for(&executor, &ws.join(".git/config"), Access::Write)
        .await
        .err()
        .expect(".git is not writable");
    assert_eq!(
        refused,
        IntentError::Unenforceable(format!(
            "{} is not writable in the sandbox",
            ws.join(".git/config").display()
        ))
    );
    let (dir, relative) = plan
        .directory_for(&executor, &ws.join(".git/config"), Access::Read)
        .await
        .expect(".git is readable");
    assert_eq!(dir.read(&relative).await.expect("read"), b"[core]\n");
    assert!(dir.write(&relative, b"x".to_vec()).await.is_err());
    assert_eq!(
        std::fs::read_to_string(ws.join(".git/config")).expect("config"),
        "[core]\n"
    );
    assert!(
        plan.directory_for(&executor, &base.0.join("outside/f"), Access::Write)
            .await
            .is_err()
    );
    // An entry at the top of the split workspace: through the workspace,
    // by its one name; a link there is replaced, never followed into
    // `.git`; `.git` itself and what is reached through a link are not.
    std::os::unix::fs::symlink(".git/config", ws.join("to-config")).expect("link");
    std::os::unix::fs::symlink(".git", ws.join("to-git")).expect("link");
    for name in ["new-top", "to-config"] {
        let (dir, relative) = plan
            .directory_for(&executor, &ws.join(name), Access::Write)
            .await
            .expect("an entry at the top is writable");
        assert_eq!(relative, Path::new(name));
        dir.write(&relative, b"top\n".to_vec())
            .await
            .expect("write");
        let meta = std::fs::symlink_metadata(ws.join(name)).expect("written");
        assert!(meta.is_file(), "{name}: {meta:?}");
    }
    for refused in [".git", ".git/config", "to-git/config", "to-git/new"] {
        assert!(
            plan.directory_for(&executor, &ws.join(refused), Access::Write)
                .await
                .is_err(),
            "{refused} was writable"
        );
    }
    assert_eq!(
        std::fs::read_to_string(ws.join(".git/config")).expect("config"),
        "[core]\n"
    );
    let (dir, relative) = plan
        .directory_for(&executor, Path::new("/etc/passwd"), Access::Read)
        .await
        .expect("the system directories are readable");
    assert_eq!(relative, Path::new("passwd"));
    assert_eq!(
        dir.read(&relative).await.expect("read"),
        std::fs::read("/etc/passwd").expect("passwd")
    );
}

#[test]
fn fs_calls_reach_only_what_the_intent_allows() {
    on_every_backend("fs", fs_calls_reach_what_the_intent_allows);
}

#[test]
fn workspace_write_writes_only_where_codex_allows() {
    on_every_backend("write", workspace_write_writes_only_where);
}

#[test]
fn a_denied_write_is_reported_as_codex_reports_it() {
    on_every_backend("denied", a_denied_write_is_reported);
}

#[test]
fn what_the_executor_applied_is_what_was_planned() {
    on_every_backend("applied", what_was_applied_was_planned);
}

#[test]
fn the_network_is_off_when_codex_restricts_it() {
    on_every_backend("network", the_network_is_off_when_restricted);
}

/// `Sandbox.leaveOutSecrets`: a root holding the server's token is split
/// around it (the token out of reach, the rest readable) instead of
/// refused, as it is without.
#[test]
fn a_root_holding_the_servers_token_is_split_around_it() {
    require_kernel_sandbox();
    common::run_local(async {
        let dir = TempDir(PathBuf::from(format!(
            "/dev/shm/capexec-codex-secret-{}",
            std::process::id()
        )));
        let _ = std::fs::remove_dir_all(&dir.0);
        std::fs::create_dir(&dir.0).expect("server directory");
        std::fs::write(dir.0.join("note"), "readable\n").expect("note");
        let root = dir.0.clone();
        let server = ServerThread::start_with(dir, vec![Address::Unix(root.join("capexec.sock"))]);
        let connection = capexec::net::connect(&server.address, server.token.as_ref())
            .await
            .expect("connect");
        let executor = connection.executor();
        let cwd = Base::new("secret");
        let script = format!(
            "cat {root}/note; if cat {root}/token; then echo READ-THE-TOKEN; fi",
            root = root.display()
        );
        let mut sandbox = capexec::model::Sandbox {
            read_only: vec![root.clone()],
            ..capexec::model::Sandbox::default()
        };
        let mut command = bash(&script);
        command.current_dir(&cwd.0).sandbox(sandbox.clone());
        match command.output(&executor).await {
            Err(capexec::client::Error::Refused(refusal)) => {
                assert_eq!(refusal.kind, capexec::model::RefusalKind::NotAllowed);
                assert!(
                    refusal.message.contains("contains a capexec login token"),
                    "{}",
                    refusal.message
                );
            }
            other => panic!(
                "a root holding the token was given: {:?}",
                other.map(|o| o.exit)
            ),
        }
        sandbox.leave_out_secrets = true;
        command.sandbox(sandbox);
        let output = command.output(&executor).await.expect("start");
        assert_eq!(String::from_utf8_lossy(&output.stdout), "readable\n");
        // Landlock's EACCES; on a root server, whose child sees its roots
        // as mounts of their own, the token is not even there.
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("token: Permission denied")
                || stderr.contains("token: No such file or directory"),
            "{stderr}"
        );
        drop(connection);
        drop(server);
    });
}
