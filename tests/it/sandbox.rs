//! `StartParams.sandbox` and `limits`: real escape attempts from inside a
//! sandbox (files outside its roots, the network, the server's socket,
//! token and process), the kernel's view of a sandboxed child, trees
//! tracked by their cgroup through `setsid`, and limits. Every backend
//! where it applies; CI runs as root on a kernel with Landlock ABI 6 or
//! later and writable cgroups (`.ci/run` checks), so nothing here is
//! skipped.

use crate::common;

use std::time::Duration;

use capexec::client::Command;
use capexec::model::{ExitStatus, Limits, Network, Policy, RefusalKind, Sandbox, Signal, Tracking};
use common::data::TempDir;
use common::{Ctx, sh};

/// Runs `script` with `sh -c` in `cwd`, sandboxed as `sandbox` says;
/// its exit status, stdout and stderr.
async fn sandboxed(
    ctx: &Ctx,
    cwd: &TempDir,
    sandbox: Sandbox,
    script: &str,
) -> (i32, String, String) {
    let mut command = sh(script);
    command.current_dir(cwd.path()).sandbox(sandbox);
    let output = command.output(&ctx.executor).await.expect("start");
    (
        output.exit.status.shell_code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

async fn writes_outside_the_writable_roots_fail_and_inside_succeed(ctx: Ctx) {
    let cwd = TempDir::new("sandbox-cwd");
    let extra = TempDir::new("sandbox-extra");
    let outside = TempDir::new("sandbox-outside");
    let script = format!(
        "echo in > here && cat here; echo extra > {extra}/f && cat {extra}/f; \
         if echo out > {outside}/f; then echo wrote; fi; \
         if mkdir {outside}/d; then echo made; fi; echo end",
        extra = extra.path().display(),
        outside = outside.path().display()
    );
    let sandbox = Sandbox {
        writable: vec![extra.path().to_path_buf()],
        ..Sandbox::default()
    };
    let (code, stdout, stderr) = sandboxed(&ctx, &cwd, sandbox, &script).await;
    assert_eq!((code, stdout.as_str()), (0, "in\nextra\nend\n"), "{stderr}");
    // EACCES, as the shell words it, for both.
    assert_eq!(stderr.matches("Permission denied").count(), 2, "{stderr}");
    assert!(!outside.path().join("f").exists());
    assert!(!outside.path().join("d").exists());
}

async fn reads_outside_the_read_roots_fail(ctx: Ctx) {
    let cwd = TempDir::new("sandbox-cwd");
    let data = TempDir::new("sandbox-data");
    let secret = TempDir::new("sandbox-secret");
    std::fs::write(data.path().join("f"), "data\n").expect("write");
    std::fs::write(secret.path().join("f"), "secret\n").expect("write");
    let script = format!(
        "cat {data}/f; cat {secret}/f; ls {secret} >/dev/null && echo listed; \
         echo no > {data}/g || echo read-only",
        data = data.path().display(),
        secret = secret.path().display()
    );
    let sandbox = Sandbox {
        read_only: vec![data.path().to_path_buf()],
        ..Sandbox::default()
    };
    let (code, stdout, stderr) = sandboxed(&ctx, &cwd, sandbox, &script).await;
    assert_eq!(
        (code, stdout.as_str()),
        (0, "data\nread-only\n"),
        "{stderr}"
    );
    assert_eq!(stderr.matches("Permission denied").count(), 3, "{stderr}");
    assert!(!data.path().join("g").exists());
}

/// A python3 one-liner's output: `ok` or the errno's name.
const NETWORK_PROBE: &str = r#"
import errno, socket, sys
def attempt(what, make):
    try:
        make()
        print(what, "ok")
    except OSError as error:
        print(what, errno.errorcode[error.errno])
port = int(sys.argv[1])
attempt("tcp", lambda: socket.create_connection(("127.0.0.1", port), timeout=5))
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
attempt("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW))
def pair():
    a, b = socket.socketpair()
    a.sendall(b"x")
    assert b.recv(1) == b"x"
attempt("unix-pair", pair)
"#;

async fn without_network_only_unix_sockets_work(ctx: Ctx) {
    let cwd = TempDir::new("sandbox-cwd");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let port = listener.local_addr().expect("address").port().to_string();
    let run = |network: Network| {
        let mut command = Command::new("/usr/bin/python3");
        command
            .args(["-c", NETWORK_PROBE, &port])
            .current_dir(cwd.path())
            .sandbox(Sandbox {
                network,
                ..Sandbox::default()
            });
        command
    };
    let output = run(Network::None)
        .output(&ctx.executor)
        .await
        .expect("start");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "tcp EPERM\nudp EPERM\nnetlink EPERM\nunix-pair ok\n",
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The same probe with the network on: the listener was reachable.
    let output = run(Network::All)
        .output(&ctx.executor)
        .await
        .expect("start");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "tcp ok\nudp ok\nnetlink ok\nunix-pair ok\n"
    );
}

async fn abstract_sockets_made_outside_are_out_of_reach(ctx: Ctx) {
    use std::os::linux::net::SocketAddrExt;
    let cwd = TempDir::new("sandbox-cwd");
    let name = format!(
        "capexec-test-abstract-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    );
    let address =
        std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("name");
    let _listener = std::os::unix::net::UnixListener::bind_addr(&address).expect("listen");
    let probe = r#"
import errno, socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect("\0" + sys.argv[1])
    print("ok")
except OSError as error:
    print(errno.errorcode[error.errno])
"#;
    let mut command = Command::new("/usr/bin/python3");
    command.args(["-c", probe, &name]).current_dir(cwd.path());
    let output = command.output(&ctx.executor).await.expect("start");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "ok\n");
    command.sandbox(Sandbox::default());
    let output = command.output(&ctx.executor).await.expect("start");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "EPERM\n",
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

async fn a_sandboxed_terminal_works(ctx: Ctx) {
    let cwd = TempDir::new("sandbox-cwd");
    // Its own terminal, opened again by name.
    let mut command = sh("t=$(tty) && printf '' > \"$t\" && echo on-a-terminal; exit 4");
    command
        .current_dir(cwd.path())
        .sandbox(Sandbox::default())
        .tty(capexec::model::PtySize { rows: 24, cols: 80 });
    let process = command.spawn(&ctx.executor).await.expect("start");
    let events = common::read_until_closed(&process).await;
    assert_eq!(common::exit_of(&events), Some(ExitStatus::Code(4)));
    assert_eq!(common::output_bytes(&events, None), b"on-a-terminal\r\n");
}

async fn a_root_child_has_no_capabilities_and_is_filtered(ctx: Ctx) {
    let cwd = TempDir::new("sandbox-cwd");
    let (code, stdout, stderr) = sandboxed(
        &ctx,
        &cwd,
        Sandbox::default(),
        "grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status",
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout,
        "CapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n\
         CapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n"
    );
}

/// This process's dumpable flag (servers of the tests run in it).
fn dumpable() -> i32 {
    // SAFETY: prctl(PR_GET_DUMPABLE) only reads the flag.
    unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) }
}

async fn a_root_servers_sandbox_runs_as_nobody_and_reads_no_root_secret(ctx: Ctx) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    // A root-owned checkout below a directory only root may enter.
    let closed = TempDir::new("sandbox-closed");
    let cwd = closed.path().join("work");
    std::fs::create_dir(&cwd).expect("mkdir");
    std::fs::write(cwd.join("own"), "secret\n").expect("write");
    std::fs::write(closed.path().join("beside"), "beside\n").expect("write");
    for (path, mode) in [(closed.path(), 0o700), (&cwd.join("own"), 0o600)] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    assert_eq!(
        std::fs::metadata(closed.path()).expect("stat").uid(),
        0,
        "the tests run as root, as CI does"
    );
    let run = |keep_root: bool, script: &str| {
        let mut command = sh(script);
        command.current_dir(&cwd).sandbox(Sandbox {
            keep_root,
            ..Sandbox::default()
        });
        command
    };
    let script = format!(
        "id -u; id -G; cat own; cat {cwd}/own; echo made > made && mkdir dir && echo wrote; \
         cat {closed}/beside || echo beside-denied; head -c 5 /etc/shadow || echo shadow-denied",
        cwd = cwd.display(),
        closed = closed.path().display()
    );
    let process = run(false, &script)
        .spawn(&ctx.executor)
        .await
        .expect("start");
    let events = common::read_until_closed(&process).await;
    assert_eq!(
        String::from_utf8_lossy(&common::output_bytes(
            &events,
            Some(capexec::model::OutputStream::Stdout)
        )),
        "65534\n65534\nsecret\nsecret\nwrote\nbeside-denied\nshadow-denied\n"
    );
    assert_eq!(
        String::from_utf8_lossy(&common::output_bytes(
            &events,
            Some(capexec::model::OutputStream::Stderr)
        ))
        .matches("Permission denied")
        .count(),
        2
    );
    // What it made is root's on disk.
    for made in ["made", "dir"] {
        let meta = std::fs::metadata(cwd.join(made)).expect("made");
        assert_eq!((meta.uid(), meta.gid()), (0, 0), "{made}");
    }
    let info = process.info().await.expect("info");
    assert!(
        info.confinement
            .enforced
            .iter()
            .any(|name| name == "unprivileged-user"),
        "{:?}",
        info.confinement.enforced
    );
    // The server, whose memory the child shared until its exec, is made
    // dumpable again after the start (other tests' starts in this process
    // drop the flag for a moment too: wait for it, within a deadline).
    common::eventually_async("the server is dumpable again", async || dumpable() == 1).await;
    // keepRoot: root without capabilities, which reads /etc/shadow.
    let output = run(true, "id -u; head -c 5 /etc/shadow")
        .output(&ctx.executor)
        .await
        .expect("start");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "0\nroot:");
}

/// Tries to make namespaces (user alone, and with network, mount, ipc and
/// pid ones), then `setns` and `clone3` by hand (argv: their numbers; an
/// invalid descriptor and an empty struct, so that only a filter answers
/// EPERM or ENOSYS), then makes a thread, a fork and a background job.
const NAMESPACE_PROBE: &str = r#"
import ctypes, errno, os, subprocess, sys, threading
for flags in ["-U", "-Un", "-Um", "-Ui", "-Upf"]:
    done = subprocess.run(["unshare", flags, "true"], capture_output=True, text=True)
    print(flags, done.returncode, done.stderr.strip())
libc = ctypes.CDLL(None, use_errno=True)
for name, number, args in [("setns", int(sys.argv[1]), (-1, 0)), ("clone3", int(sys.argv[2]), (None, 0))]:
    result = libc.syscall(number, *args)
    print(name, "ok" if result >= 0 else errno.errorcode[ctypes.get_errno()])
seen = []
thread = threading.Thread(target=seen.append, args=("thread",))
thread.start()
thread.join()
print(*seen)
pid = os.fork()
if pid == 0:
    os._exit(7)
print("fork", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
print("background", subprocess.run(["sh", "-c", "true & wait"]).returncode)
"#;

async fn a_sandbox_makes_no_namespaces_unless_allowed(ctx: Ctx) {
    let cwd = TempDir::new("sandbox-cwd");
    let probe = |allow_namespaces: bool| {
        let mut command = Command::new("/usr/bin/python3");
        command
            .args([
                "-c",
                NAMESPACE_PROBE,
                &libc::SYS_setns.to_string(),
                &libc::SYS_clone3.to_string(),
            ])
            .current_dir(cwd.path())
            .sandbox(Sandbox {
                allow_namespaces,
                ..Sandbox::default()
            });
        command
    };
    let process = probe(false).spawn(&ctx.executor).await.expect("start");
    let events = common::read_until_closed(&process).await;
    let denied = "unshare: unshare failed: Operation not permitted";
    assert_eq!(
        String::from_utf8_lossy(&common::output_bytes(&events, None)),
        format!(
            "-U 1 {denied}\n-Un 1 {denied}\n-Um 1 {denied}\n-Ui 1 {denied}\n-Upf 1 {denied}\n\
             setns EPERM\nclone3 ENOSYS\nthread\nfork 7\nbackground 0\n"
        )
    );
    let info = process.info().await.expect("info");
    assert!(
        info.confinement.enforced.iter().any(|n| n == "namespaces"),
        "{:?}",
        info.confinement.enforced
    );
    // Allowed: the kernel decides (a user namespace, and a network one in
    // it; Landlock still refuses the mount namespace its propagation).
    let process = probe(true).spawn(&ctx.executor).await.expect("start");
    let events = common::read_until_closed(&process).await;
    let output = String::from_utf8_lossy(&common::output_bytes(&events, None)).into_owned();
    assert!(
        output.starts_with("-U 0 \n-Un 0 \n-Um 1 unshare: cannot change root filesystem"),
        "{output}"
    );
    assert!(
        output.ends_with("setns EBADF\nclone3 EINVAL\nthread\nfork 7\nbackground 0\n"),
        "{output}"
    );
    let info = process.info().await.expect("info");
    assert!(
        info.confinement
            .sandbox
            .expect("sandboxed")
            .allow_namespaces
    );
    assert!(
        !info.confinement.enforced.iter().any(|n| n == "namespaces"),
        "{:?}",
        info.confinement.enforced
    );
}

/// A python3 probe that connects with `$connect` (which leaves the socket
/// in `s`), sends a Cap'n Proto bootstrap message and prints whether the
/// server answered it (`answered`) or hung up (`refused`).
macro_rules! bootstrap_probe {
    ($connect:literal) => {
        concat!(
            "import socket, sys\n",
            $connect,
            r#"
s.settimeout(10)
# A Cap'n Proto bootstrap message; a server that serves us answers it.
message = bytes.fromhex("00000000 05000000 00000000 01000100 08000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000".replace(" ", ""))
try:
    s.sendall(message)
    print("answered" if s.recv(1) else "refused")
except (BrokenPipeError, ConnectionResetError):
    print("refused")
"#
        )
    };
}

/// Connects to the Unix socket at argv[1] (`EACCES` if its mode refuses)
/// and says whether the server answered a bootstrap request or hung up.
pub(crate) const SOCKET_PROBE: &str = bootstrap_probe!(
    r#"s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except PermissionError:
    print("EACCES")
    sys.exit()"#
);

/// Connects to the TCP server at argv[1]:argv[2] and says whether it
/// answered a bootstrap request or hung up.
const TCP_PROBE: &str =
    bootstrap_probe!(r#"s = socket.create_connection((sys.argv[1], int(sys.argv[2])))"#);

async fn a_sandboxed_child_cannot_reach_the_server(ctx: Ctx) {
    let cwd = TempDir::new("sandbox-cwd");
    let server = ctx.server_pid;
    // Signals: scoped to the sandbox.
    let (code, stdout, stderr) = sandboxed(
        &ctx,
        &cwd,
        Sandbox::default(),
        &format!("kill -0 {server} && echo signalled; echo end"),
    )
    .await;
    assert_eq!((code, stdout.as_str()), (0, "end\n"));
    assert!(stderr.contains("Operation not permitted"), "{stderr}");
    // Its socket: every connection from inside is refused.
    if let Some(capexec::net::Address::Unix(socket)) = &ctx.address {
        let socket = socket.display().to_string();
        let mut probe = Command::new("/usr/bin/python3");
        probe.args(["-c", SOCKET_PROBE, &socket]);
        let output = probe.output(&ctx.executor).await.expect("start");
        assert_eq!(String::from_utf8_lossy(&output.stdout), "answered\n");
        // As the unprivileged user a root server's sandbox runs as, the
        // kernel refuses it the socket (mode 0600, root's); as root (its
        // capabilities dropped) the server does.
        for (keep_root, said) in [(false, "EACCES\n"), (true, "refused\n")] {
            probe.current_dir(cwd.path()).sandbox(Sandbox {
                keep_root,
                ..Sandbox::default()
            });
            let output = probe.output(&ctx.executor).await.expect("start");
            assert_eq!(
                String::from_utf8_lossy(&output.stdout),
                said,
                "{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        // And the server still serves everyone else.
        let again = ctx.connect_again().await.expect("connect");
        capexec::client::info(&again.executor())
            .await
            .expect("info");
    }
    // Its TCP port, from this machine: a sandboxed process's connection is
    // closed before a byte is read (its socket's cgroup is a sandbox
    // leaf), whatever its network allows; an unsandboxed one is answered.
    if let Some(capexec::net::Address::Tcp { host, port }) = &ctx.address {
        let mut probe = Command::new("/usr/bin/python3");
        probe.args(["-c", TCP_PROBE, host, &port.to_string()]);
        let output = probe.output(&ctx.executor).await.expect("start");
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            "answered\n",
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        for keep_root in [false, true] {
            probe.current_dir(cwd.path()).sandbox(Sandbox {
                network: Network::All,
                keep_root,
                ..Sandbox::default()
            });
            let output = probe.output(&ctx.executor).await.expect("start");
            assert_eq!(
                String::from_utf8_lossy(&output.stdout),
                "refused\n",
                "keep_root {keep_root}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let again = ctx.connect_again().await.expect("connect");
        capexec::client::info(&again.executor())
            .await
            .expect("info");
    }
}

async fn no_sandbox_may_read_the_login_token(ctx: Ctx) {
    let cwd = TempDir::new("sandbox-cwd");
    let token = ctx.token_file().expect("a tcp server has a token file");
    let token_dir = token.parent().expect("token dir").to_path_buf();
    // Asked for by name: refused before anything starts.
    let mut command = sh("cat token");
    command.current_dir(cwd.path()).sandbox(Sandbox {
        read_only: vec![token_dir.clone()],
        ..Sandbox::default()
    });
    let error = command.output(&ctx.executor).await.expect_err("refused");
    assert_eq!(
        error.refusal_kind(),
        Some(RefusalKind::NotAllowed),
        "{error}"
    );
    assert!(error.to_string().contains("login token"), "{error}");
    // Not in the roots: unreadable.
    let (_, stdout, stderr) = sandboxed(
        &ctx,
        &cwd,
        Sandbox::default(),
        &format!("cat {}", token.display()),
    )
    .await;
    assert_eq!(stdout, "");
    assert!(stderr.contains("Permission denied"), "{stderr}");
}

async fn process_info_says_what_was_enforced(ctx: Ctx) {
    let cwd = TempDir::new("sandbox-cwd");
    let mut command = Command::new("true");
    command.current_dir(cwd.path()).sandbox(Sandbox::default());
    command.limits(Limits {
        max_pids: Some(50),
        ..Limits::default()
    });
    let process = command.spawn(&ctx.executor).await.expect("start");
    common::read_until_closed(&process).await;
    let info = process.info().await.expect("info");
    let confinement = info.confinement;
    assert_eq!(confinement.tracking, Tracking::Cgroup);
    assert_eq!(confinement.not_enforced, Vec::<String>::new());
    for name in [
        "cgroup",
        "filesystem",
        "network-tcp",
        "network-sockets",
        "scope-signals",
        "scope-abstract-sockets",
        "no-new-privs",
        "capabilities",
        "io-uring",
        "kernel-calls",
        "namespaces",
        "server-isolation",
        "limit-pids",
    ] {
        assert!(
            confinement.enforced.iter().any(|n| n == name),
            "{name}: {:?}",
            confinement.enforced
        );
    }
    assert_eq!(confinement.limits.max_pids, Some(50));
    let sandbox = confinement.sandbox.expect("sandboxed");
    let canonical = std::fs::canonicalize(cwd.path()).expect("canonical");
    assert!(sandbox.writable.contains(&canonical), "{sandbox:?}");
    assert!(sandbox.read_only.contains(&"/usr".into()), "{sandbox:?}");
    assert!(sandbox.no_system_roots && sandbox.read_only_cwd);
    // Unsandboxed: tracked by a cgroup all the same.
    let process = Command::new("true")
        .spawn(&ctx.executor)
        .await
        .expect("start");
    common::read_until_closed(&process).await;
    let info = process.info().await.expect("info");
    assert_eq!(info.confinement.tracking, Tracking::Cgroup);
    assert_eq!(info.confinement.sandbox, None);
    assert_eq!(
        info.confinement.enforced,
        vec!["cgroup".to_string(), "cgroup-namespace".to_string()]
    );
    assert!(!info.tree_running);
}

fn alive(pid: u32) -> bool {
    common::procfs::state(pid).is_some_and(|state| state != 'Z')
}

/// Starts a child that leaves `setsid sleep 300` behind and exits; the
/// process, and the pid of what it left.
async fn leave_a_session_behind(
    ctx: &Ctx,
    timeout: Option<Duration>,
) -> (capexec::client::RemoteProcess, u32) {
    let mut command = sh("setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!");
    if let Some(timeout) = timeout {
        command.timeout(timeout);
    }
    let process = command.spawn(&ctx.executor).await.expect("start");
    let events = common::read_until_closed(&process).await;
    let text = String::from_utf8_lossy(&common::output_bytes(&events, None)).into_owned();
    let pid: u32 = text.trim().parse().expect("pid");
    assert!(alive(pid));
    (process, pid)
}

/// Where the cgroup2 hierarchy is mounted.
fn cgroup2_mount() -> std::path::PathBuf {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let mount = mounts
        .lines()
        .find(|line| line.contains(" - cgroup2 "))
        .and_then(|line| line.split(' ').nth(4))
        .expect("a cgroup2 mount");
    std::path::PathBuf::from(mount)
}

/// The cgroup2 directory process `pid` is in.
fn cgroup_dir(pid: u32) -> std::path::PathBuf {
    let memberships = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
    let path = memberships
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .expect("a cgroup2 membership");
    std::path::PathBuf::from(format!("{}{path}", cgroup2_mount().display()))
}

/// A cgroup of the test's own at the top of the cgroup2 hierarchy (not
/// named `capexec-`, which servers sweep), emptied and removed when
/// dropped, whatever got into it.
struct SiblingCgroup(std::path::PathBuf);

impl SiblingCgroup {
    fn new() -> SiblingCgroup {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let name = format!(
            "test-sibling-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let dir = cgroup2_mount().join(name);
        std::fs::create_dir(&dir).expect("make a cgroup (the tests run as root)");
        SiblingCgroup(dir)
    }
}

impl Drop for SiblingCgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0.join("cgroup.kill"), "1");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::fs::remove_dir(&self.0).is_err() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// SIGKILLs `pid` when dropped if it still runs (what escaped a test).
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if alive(self.0) {
            // SAFETY: kill(2) of a process this test started.
            unsafe { libc::kill(self.0 as i32, libc::SIGKILL) };
        }
    }
}

/// A child and then its parent try to move themselves into the cgroups
/// argv[1] and argv[2] (the hierarchy's root and a sibling of the
/// server's), each saying how it went; then both sleep, the child in a
/// session of its own.
const CGROUP_ESCAPE: &str = r#"
import errno, os, sys
def leave(who):
    for name, group in zip(["root", "sibling"], sys.argv[1:3]):
        try:
            with open(os.path.join(group, "cgroup.procs"), "w") as procs:
                procs.write("0")
            result = "moved"
        except OSError as error:
            result = errno.errorcode[error.errno]
        print(who, name, result, flush=True)
ready, told = os.pipe()
child = os.fork()
if child == 0:
    os.setsid()
    leave("child")
    os.write(told, b"x")
    os.execvp("sleep", ["sleep", "300"])
os.read(ready, 1)
leave("leader")
os.write(1, f"pid {child}\n".encode())
os.execvp("sleep", ["sleep", "300"])
"#;

async fn an_unsandboxed_child_cannot_move_out_of_its_cgroup(ctx: Ctx) {
    let sibling = SiblingCgroup::new();
    let root = cgroup2_mount();
    let mut command = Command::new("/usr/bin/python3");
    command.args([
        "-c",
        CGROUP_ESCAPE,
        &root.display().to_string(),
        &sibling.0.display().to_string(),
    ]);
    let process = command.spawn(&ctx.executor).await.expect("start");
    let info = process.info().await.expect("info");
    let leader = KillOnDrop(info.pid);
    let (_, output) = common::read_until_output_contains(&process, "pid ").await;
    let output = output.trim_end().to_string();
    let (moves, child) = output.rsplit_once('\n').expect("lines");
    let child = child
        .strip_prefix("pid ")
        .and_then(|pid| pid.parse().ok())
        .map(KillOnDrop);
    assert_eq!(
        moves,
        "child root ENOENT\nchild sibling ENOENT\nleader root ENOENT\nleader sibling ENOENT"
    );
    let child = child.unwrap_or_else(|| panic!("the child's pid in {output:?}"));
    assert!(
        info.confinement
            .enforced
            .iter()
            .any(|name| name == "cgroup-namespace"),
        "{:?}",
        info.confinement.enforced
    );
    let leaf = cgroup_dir(leader.0);
    assert!(
        leaf.file_name()
            .is_some_and(|name| name.to_string_lossy().starts_with("p-")),
        "{}",
        leaf.display()
    );
    assert_eq!(cgroup_dir(child.0), leaf);
    // Released, nothing it started survives.
    drop(process);
    common::eventually_async("the leader and its child end", async || {
        !alive(leader.0) && !alive(child.0)
    })
    .await;
    assert_eq!(
        std::fs::read_to_string(sibling.0.join("cgroup.procs")).expect("procs"),
        ""
    );
}

async fn what_leaves_with_setsid_stays_counted_and_dies_with_terminate(ctx: Ctx) {
    let (process, pid) = leave_a_session_behind(&ctx, None).await;
    let leaf = cgroup_dir(pid);
    assert!(
        leaf.file_name()
            .is_some_and(|name| name.to_string_lossy().starts_with("p-"))
    );
    let info = process.info().await.expect("info");
    assert!(info.exit.is_some());
    assert!(info.tree_running, "the session it left is part of its tree");
    process.terminate().await.expect("terminate");
    common::eventually_async("the session it left ends", async || !alive(pid)).await;
    common::eventually_async("its tree is no longer running", async || {
        !process.info().await.expect("info").tree_running
    })
    .await;
    // Nothing of it is left once it is released: not even its cgroup.
    drop(process);
    common::eventually_async("its cgroup is removed", async || !leaf.exists()).await;
}

async fn what_leaves_with_setsid_dies_with_release(ctx: Ctx) {
    let (process, pid) = leave_a_session_behind(&ctx, None).await;
    let leaf = cgroup_dir(pid);
    assert!(leaf.exists());
    drop(process);
    common::eventually_async("the session it left ends", async || !alive(pid)).await;
    common::eventually_async("its cgroup is removed", async || !leaf.exists()).await;
}

async fn what_leaves_with_setsid_dies_at_the_timeout(ctx: Ctx) {
    // Long enough for the start and its output to come back (and the
    // session to be seen running) on a loaded machine first.
    let (_process, pid) = leave_a_session_behind(&ctx, Some(Duration::from_secs(3))).await;
    common::eventually_async("the session it left ends", async || !alive(pid)).await;
}

async fn a_pids_limit_stops_a_fork_bomb(ctx: Ctx) {
    // Forks until it cannot (dash then gives up with "Cannot fork").
    let mut command = sh(
        "n=0; while [ $n -lt 200 ]; do sleep 300 </dev/null >/dev/null 2>&1 & n=$((n+1)); done; echo never",
    );
    command.limits(Limits {
        max_pids: Some(16),
        ..Limits::default()
    });
    let output = command.output(&ctx.executor).await.expect("start");
    assert_eq!(output.exit.status, ExitStatus::Code(2));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("Cannot fork"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

async fn a_memory_hog_is_reported_as_killed_by_the_memory_limit(ctx: Ctx) {
    let mut command = sh("head -c 300M /dev/zero | tail > /dev/null");
    command.limits(Limits {
        memory_bytes: Some(32 << 20),
        ..Limits::default()
    });
    let output = command.output(&ctx.executor).await.expect("start");
    assert!(output.exit.killed_by_memory_limit, "{:?}", output.exit);
    assert_eq!(output.exit.status.shell_code(), 137);
    // Killed by SIGKILL without a memory limit: not a memory-limit kill.
    let output = sh("kill -9 $$").output(&ctx.executor).await.expect("start");
    assert!(!output.exit.killed_by_memory_limit);
    assert_eq!(
        output.exit.status,
        ExitStatus::Killed {
            signal: Some(Signal::Kill),
            number: libc::SIGKILL,
            core_dumped: false
        }
    );
}

/// The CPU quota of process `pid`'s cgroup, per 100 ms period, in
/// microseconds: cgroup2's `cpu.max` or v1's `cpu.cfs_quota_us`.
fn cpu_quota(pid: u32) -> Option<String> {
    let memberships = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount_of = |v2: bool| {
        mounts.lines().find_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let separator = fields.iter().position(|field| *field == "-")?;
            let (kind, options) = (fields[separator + 1], fields[separator + 3]);
            let wanted = if v2 {
                kind == "cgroup2"
            } else {
                kind == "cgroup" && options.split(',').any(|option| option == "cpu")
            };
            wanted.then(|| fields[4].to_string())
        })
    };
    for line in memberships.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.split(',').any(|controller| controller == "cpu") {
            let dir = format!("{}{path}", mount_of(false)?);
            return std::fs::read_to_string(format!("{dir}/cpu.cfs_quota_us"))
                .ok()
                .map(|quota| quota.trim().to_string());
        }
        if controllers.is_empty()
            && let Some(mount) = mount_of(true)
            && let Ok(max) = std::fs::read_to_string(format!("{mount}{path}/cpu.max"))
            && !max.starts_with("max")
        {
            return max.split_whitespace().next().map(str::to_string);
        }
    }
    None
}

async fn a_cpu_limit_sets_the_quota_of_the_tree(ctx: Ctx) {
    let mut command = Command::new("sleep");
    command.arg("60").limits(Limits {
        cpu_millis: Some(500),
        ..Limits::default()
    });
    let process = command.spawn(&ctx.executor).await.expect("start");
    let pid = process.info().await.expect("info").pid;
    // Half a CPU: 50 ms in every 100 ms.
    assert_eq!(cpu_quota(pid).as_deref(), Some("50000"));
    assert_eq!(
        process
            .info()
            .await
            .expect("info")
            .confinement
            .limits
            .cpu_millis,
        Some(500)
    );
    process.terminate().await.expect("terminate");
}

async fn a_restricted_executor_with_a_sandbox_refuses_to_widen_it(ctx: Ctx) {
    let cwd = TempDir::new("sandbox-cwd");
    let allowed = TempDir::new("sandbox-allowed");
    let other = TempDir::new("sandbox-other");
    let policy = Policy {
        sandbox: Some(Sandbox {
            writable: vec![allowed.path().to_path_buf()],
            ..Sandbox::default()
        }),
        limits: Limits {
            max_pids: Some(40),
            ..Limits::default()
        },
        ..Policy::default()
    };
    let restricted = capexec::client::restrict(&ctx.executor, &policy);
    // A start without a sandbox gets the policy's.
    let mut command = sh(&format!(
        "echo a > {}/f && echo allowed; echo b > {}/f || echo refused",
        allowed.path().display(),
        other.path().display()
    ));
    command.current_dir(cwd.path());
    let process = command.spawn(&restricted).await.expect("start");
    let events = common::read_until_closed(&process).await;
    assert_eq!(
        String::from_utf8_lossy(&common::output_bytes(
            &events,
            Some(capexec::model::OutputStream::Stdout)
        )),
        "allowed\nrefused\n"
    );
    let info = process.info().await.expect("info");
    assert_eq!(info.confinement.limits.max_pids, Some(40));
    // Asking for more than the policy allows is refused, naming it.
    for sandbox in [
        Sandbox {
            writable: vec![other.path().to_path_buf()],
            ..Sandbox::default()
        },
        Sandbox {
            network: Network::All,
            ..Sandbox::default()
        },
        Sandbox {
            allow_namespaces: true,
            ..Sandbox::default()
        },
        Sandbox {
            keep_root: true,
            ..Sandbox::default()
        },
    ] {
        let mut command = Command::new("true");
        command.current_dir(cwd.path()).sandbox(sandbox);
        let error = command.output(&restricted).await.expect_err("wider");
        assert_eq!(
            error.refusal_kind(),
            Some(RefusalKind::NotAllowed),
            "{error}"
        );
    }
    // Restricting again cannot widen it either.
    let wider = Policy {
        sandbox: Some(Sandbox {
            network: Network::All,
            ..Sandbox::default()
        }),
        ..Policy::default()
    };
    let error = capexec::client::info(&capexec::client::restrict(&restricted, &wider))
        .await
        .expect_err("wider");
    assert_eq!(
        error.refusal_kind(),
        Some(RefusalKind::NotAllowed),
        "{error}"
    );
    // Limits only get smaller.
    let smaller = Policy {
        limits: Limits {
            max_pids: Some(1000),
            ..Limits::default()
        },
        ..Policy::default()
    };
    let narrower = capexec::client::restrict(&restricted, &smaller);
    let mut command = Command::new("true");
    command.current_dir(cwd.path());
    let process = command.spawn(&narrower).await.expect("start");
    common::read_until_closed(&process).await;
    assert_eq!(
        process
            .info()
            .await
            .expect("info")
            .confinement
            .limits
            .max_pids,
        Some(40)
    );
}

/// A program outside the sandbox's readable roots is refused before the
/// exec (which would say only "Permission denied"), naming the file as
/// resolved and the directory that would admit it; with that directory a
/// read-only root, it runs.
async fn a_program_outside_the_roots_is_refused_naming_its_directory(ctx: Ctx) {
    use std::os::unix::fs::PermissionsExt;
    let cwd = TempDir::new("sandbox-cwd");
    let tools = TempDir::new("sandbox-tools");
    let tools = std::fs::canonicalize(tools.path()).expect("tools");
    let hello = tools.join("hello");
    std::fs::write(&hello, "#!/bin/sh\necho hello\n").expect("write");
    std::fs::set_permissions(&hello, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let mut command = Command::new(&hello);
    command.current_dir(cwd.path()).sandbox(Sandbox::default());
    let refused = command
        .spawn(&ctx.executor)
        .await
        .map(drop)
        .expect_err("outside the roots");
    let capexec::client::Error::Refused(refusal) = refused else {
        panic!("not a refusal: {refused}");
    };
    assert_eq!(
        (refusal.kind, refusal.message),
        (
            RefusalKind::PermissionDenied,
            format!(
                "cannot execute {hello}: {hello} is outside the sandbox's readable roots (add its \
                 directory as a read-only root: {tools})",
                hello = hello.display(),
                tools = tools.display()
            )
        )
    );
    let mut command = Command::new(&hello);
    command.current_dir(cwd.path()).sandbox(Sandbox {
        read_only: vec![tools.clone()],
        ..Sandbox::default()
    });
    let output = command.output(&ctx.executor).await.expect("start");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "hello\n");
}

/// `Limits.cpuMillis` below 10 cannot be enforced as asked (the kernel's
/// least quota is 1 ms in each 100 ms period): refused, by a start and by
/// a policy; 10 is in force as asked.
async fn a_cpu_limit_below_ten_thousandths_is_refused(ctx: Ctx) {
    for millis in [1, 5, 9] {
        let mut command = Command::new("true");
        command.limits(Limits {
            cpu_millis: Some(millis),
            ..Limits::default()
        });
        let error = command.output(&ctx.executor).await.expect_err("refused");
        assert_eq!(
            error.refusal_kind(),
            Some(RefusalKind::InvalidArgument),
            "{error}"
        );
        assert!(
            error.to_string().contains(&format!(
                "limits: cpuMillis {millis} is below the least CPU limit, 10"
            )),
            "{error}"
        );
    }
    let policy = Policy {
        limits: Limits {
            cpu_millis: Some(5),
            ..Limits::default()
        },
        ..Policy::default()
    };
    let error = capexec::client::info(&capexec::client::restrict(&ctx.executor, &policy))
        .await
        .expect_err("refused");
    assert_eq!(
        error.refusal_kind(),
        Some(RefusalKind::InvalidArgument),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .contains("policy rule `limits`: cpuMillis 5 is below the least CPU limit, 10"),
        "{error}"
    );
    let mut command = Command::new("sleep");
    command.arg("60").limits(Limits {
        cpu_millis: Some(10),
        ..Limits::default()
    });
    let process = command.spawn(&ctx.executor).await.expect("start");
    let info = process.info().await.expect("info");
    assert_eq!(info.confinement.limits.cpu_millis, Some(10));
    // A hundredth of a CPU: 1 ms in every 100 ms.
    assert_eq!(cpu_quota(info.pid).as_deref(), Some("1000"));
    process.terminate().await.expect("terminate");
}

/// A policy whose sandbox lists writable roots confines every start's
/// writes to them: a working directory outside them is readable, not
/// writable; one inside them is writable; asking for it is refused.
async fn a_policy_with_writable_roots_confines_writes_whatever_the_cwd(ctx: Ctx) {
    let allowed = TempDir::new("policy-writable");
    let elsewhere = TempDir::new("policy-cwd");
    std::fs::write(elsewhere.path().join("seen"), b"seen\n").expect("write");
    let policy = Policy {
        sandbox: Some(Sandbox {
            writable: vec![allowed.path().to_path_buf()],
            ..Sandbox::default()
        }),
        ..Policy::default()
    };
    let restricted = capexec::client::restrict(&ctx.executor, &policy);
    let mut command = sh(&format!(
        "cat seen; if echo x > here; then echo wrote; else echo refused; fi; \
         echo y > {}/f && echo allowed",
        allowed.path().display()
    ));
    command.current_dir(elsewhere.path());
    let process = command.spawn(&restricted).await.expect("start");
    let events = common::read_until_closed(&process).await;
    assert_eq!(
        String::from_utf8_lossy(&common::output_bytes(
            &events,
            Some(capexec::model::OutputStream::Stdout)
        )),
        "seen\nrefused\nallowed\n"
    );
    assert!(!elsewhere.path().join("here").exists());
    let applied = process
        .info()
        .await
        .expect("info")
        .confinement
        .sandbox
        .expect("sandboxed");
    let cwd = std::fs::canonicalize(elsewhere.path()).expect("canonical");
    let root = std::fs::canonicalize(allowed.path()).expect("canonical");
    assert!(applied.read_only.contains(&cwd), "{applied:?}");
    assert!(!applied.writable.contains(&cwd), "{applied:?}");
    assert!(applied.writable.contains(&root), "{applied:?}");

    // A working directory inside a writable root is writable.
    std::fs::create_dir(allowed.path().join("sub")).expect("mkdir");
    let mut command = sh("echo x > here && echo wrote");
    command.current_dir(allowed.path().join("sub"));
    let output = command.output(&restricted).await.expect("start");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "wrote\n");

    // Asking for the working directory as a writable root is refused.
    let mut command = Command::new("true");
    command.current_dir(elsewhere.path()).sandbox(Sandbox {
        writable: vec![elsewhere.path().to_path_buf()],
        ..Sandbox::default()
    });
    let error = command.output(&restricted).await.expect_err("wider");
    assert_eq!(
        error.refusal_kind(),
        Some(RefusalKind::NotAllowed),
        "{error}"
    );
}

/// `terminate` after the child exited, while what it left in its group
/// and cgroup runs: it answers `running` true, ends what was left, and
/// leaves the child's exit as it was; once nothing runs it answers false.
async fn terminate_after_the_exit_ends_what_the_child_left_and_answers_running(ctx: Ctx) {
    let process = sh("sleep 300 </dev/null >/dev/null 2>&1 & echo $!")
        .spawn(&ctx.executor)
        .await
        .expect("start");
    let events = common::read_until_closed(&process).await;
    let text = String::from_utf8_lossy(&common::output_bytes(&events, None)).into_owned();
    let pid: u32 = text.trim().parse().expect("pid");
    let info = process.info().await.expect("info");
    let exit = info.exit.expect("exited");
    assert_eq!(exit.status, ExitStatus::Code(0));
    assert!(info.tree_running, "the background sleep runs");
    assert!(alive(pid));
    assert!(process.terminate().await.expect("terminate"), "running");
    common::eventually_async("the background sleep ends", async || !alive(pid)).await;
    let info = common::eventually_async("its tree is no longer running", async || {
        let info = process.info().await.expect("info");
        (!info.tree_running).then_some(info)
    })
    .await;
    let after = info.exit.expect("exited");
    assert_eq!(
        (after.status, after.timed_out),
        (ExitStatus::Code(0), false)
    );
    assert!(
        !process.terminate().await.expect("terminate"),
        "nothing runs"
    );
}

/// Where the cgroup hierarchies are mounted on this host (cgroup2, or the
/// v1 controllers of a hybrid host).
fn cgroup_mount_points() -> Vec<String> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let points: Vec<String> = mounts
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let separator = fields.iter().position(|field| *field == "-")?;
            matches!(fields[separator + 1], "cgroup" | "cgroup2").then(|| fields[4].to_string())
        })
        .collect();
    assert!(!points.is_empty(), "no cgroup hierarchy is mounted");
    points
}

/// The kernel's interface file systems are no writable roots: a root that
/// contains a cgroup hierarchy, lies on one, or is any other file of
/// devtmpfs is refused with `not-allowed` naming it (by a start and by a
/// policy); read-only, they are fine.
async fn a_writable_root_on_a_kernel_file_system_is_not_allowed(ctx: Ctx) {
    let cwd = TempDir::new("sandbox-cwd");
    let mut refused = vec!["/sys".to_string(), "/sys/fs/cgroup".to_string()];
    refused.extend(cgroup_mount_points());
    refused.extend(["/dev/random".to_string(), "/dev".to_string()]);
    for root in &refused {
        let mut command = Command::new("true");
        command.current_dir(cwd.path()).sandbox(Sandbox {
            writable: vec![root.into()],
            ..Sandbox::default()
        });
        let error = command.output(&ctx.executor).await.expect_err(root);
        assert_eq!(
            error.refusal_kind(),
            Some(RefusalKind::NotAllowed),
            "{root}: {error}"
        );
        assert!(
            error
                .to_string()
                .contains(&format!("sandbox: the writable root \"{root}\" would make")),
            "{root}: {error}"
        );
    }
    let policy = Policy {
        sandbox: Some(Sandbox {
            writable: vec!["/sys/fs/cgroup".into()],
            ..Sandbox::default()
        }),
        ..Policy::default()
    };
    let error = capexec::client::info(&capexec::client::restrict(&ctx.executor, &policy))
        .await
        .expect_err("refused");
    assert_eq!(
        error.refusal_kind(),
        Some(RefusalKind::NotAllowed),
        "{error}"
    );
    let mut command = Command::new("true");
    command.current_dir(cwd.path()).sandbox(Sandbox {
        read_only: vec!["/sys/fs/cgroup".into()],
        ..Sandbox::default()
    });
    let output = command
        .output(&ctx.executor)
        .await
        .expect("read-only is fine");
    assert_eq!(output.exit.status, ExitStatus::Code(0));
}

/// Devices are roots like any file: the default ones are listed among a
/// sandbox's writable and readable roots, one given as a writable root is
/// one (and alone, with `noSystemRoots`), and a tmpfs below /dev is no
/// device.
async fn devices_count_among_a_sandboxs_roots(ctx: Ctx) {
    let cwd = TempDir::new("sandbox-cwd");
    let existing = |paths: &[&str]| -> Vec<std::path::PathBuf> {
        paths
            .iter()
            .filter_map(|path| std::fs::canonicalize(path).ok())
            .collect()
    };
    let mut command = Command::new("true");
    command.current_dir(cwd.path()).sandbox(Sandbox::default());
    let process = command.spawn(&ctx.executor).await.expect("start");
    common::read_until_closed(&process).await;
    let applied = process
        .info()
        .await
        .expect("info")
        .confinement
        .sandbox
        .expect("sandboxed");
    let writable = existing(&[
        "/dev/null",
        "/dev/zero",
        "/dev/full",
        "/dev/tty",
        "/dev/ptmx",
        "/dev/pts",
    ]);
    assert!(writable.len() >= 4, "{writable:?}");
    for device in &writable {
        assert!(applied.writable.contains(device), "{device:?}: {applied:?}");
    }
    for device in existing(&["/dev/random", "/dev/urandom"]) {
        assert!(
            applied.read_only.contains(&device),
            "{device:?}: {applied:?}"
        );
    }

    // Without the system roots, /dev/null given as a writable root is the
    // only device there is.
    let system = existing(&["/usr", "/bin", "/lib", "/lib64", "/etc"]);
    let mut command = sh(
        "echo x > /dev/null && echo null; if echo x > /dev/zero; then echo zero; fi 2>/dev/null",
    );
    command.current_dir(cwd.path()).sandbox(Sandbox {
        read_only: system,
        writable: vec!["/dev/null".into()],
        no_system_roots: true,
        ..Sandbox::default()
    });
    let process = command.spawn(&ctx.executor).await.expect("start");
    let events = common::read_until_closed(&process).await;
    assert_eq!(
        String::from_utf8_lossy(&common::output_bytes(
            &events,
            Some(capexec::model::OutputStream::Stdout)
        )),
        "null\n"
    );
    let applied = process
        .info()
        .await
        .expect("info")
        .confinement
        .sandbox
        .expect("sandboxed");
    let canonical_cwd = std::fs::canonicalize(cwd.path()).expect("canonical");
    let mut writable = applied.writable.clone();
    writable.sort();
    let mut expected = vec![std::path::PathBuf::from("/dev/null"), canonical_cwd];
    expected.sort();
    assert_eq!(writable, expected);

    // /dev/shm is a tmpfs, not a device: it may be writable.
    let shm = std::path::Path::new("/dev/shm");
    assert!(shm.is_dir(), "this host has no /dev/shm");
    let mut command = Command::new("true");
    command.current_dir(cwd.path()).sandbox(Sandbox {
        writable: vec![shm.into()],
        ..Sandbox::default()
    });
    let output = command.output(&ctx.executor).await.expect("start");
    assert_eq!(output.exit.status, ExitStatus::Code(0));
}

backend_tests!(
    writes_outside_the_writable_roots_fail_and_inside_succeed,
    a_program_outside_the_roots_is_refused_naming_its_directory,
    reads_outside_the_read_roots_fail,
    without_network_only_unix_sockets_work,
    abstract_sockets_made_outside_are_out_of_reach,
    a_sandboxed_terminal_works,
    a_root_child_has_no_capabilities_and_is_filtered,
    a_root_servers_sandbox_runs_as_nobody_and_reads_no_root_secret,
    a_sandbox_makes_no_namespaces_unless_allowed,
    a_sandboxed_child_cannot_reach_the_server,
    process_info_says_what_was_enforced,
    what_leaves_with_setsid_stays_counted_and_dies_with_terminate,
    what_leaves_with_setsid_dies_with_release,
    what_leaves_with_setsid_dies_at_the_timeout,
    an_unsandboxed_child_cannot_move_out_of_its_cgroup,
    a_pids_limit_stops_a_fork_bomb,
    a_memory_hog_is_reported_as_killed_by_the_memory_limit,
    a_cpu_limit_sets_the_quota_of_the_tree,
    a_restricted_executor_with_a_sandbox_refuses_to_widen_it,
    a_cpu_limit_below_ten_thousandths_is_refused,
    a_policy_with_writable_roots_confines_writes_whatever_the_cwd,
    terminate_after_the_exit_ends_what_the_child_left_and_answers_running,
    a_writable_root_on_a_kernel_file_system_is_not_allowed,
    devices_count_among_a_sandboxs_roots,
);

/// Only TCP servers have a login token.
mod token {
    use super::no_sandbox_may_read_the_login_token;
    backend_tests!(on [tcp]: no_sandbox_may_read_the_login_token);
}
