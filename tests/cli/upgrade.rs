//! Upgrades that end nothing: `capexec serve` re-executes into the binary
//! now at its path (SIGUSR2, `capexec upgrade`), and a client that resumes
//! loses no byte and repeats none; a binary that cannot take over leaves
//! the old server serving; a SIGKILL after an upgrade still leaves nothing.

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::cli::{BIN, finish, text};
use common::data::TempDir;

const DEADLINE: Duration = Duration::from_secs(120);

/// A `capexec serve` started from a copy of the binary, which a test may
/// replace, with a Unix socket and an admin socket.
pub struct Upgradable {
    pub child: Child,
    pub dir: TempDir,
    pub exe: PathBuf,
    pub unix: String,
    pub admin: String,
}

impl Upgradable {
    pub fn start() -> Upgradable {
        Upgradable::start_with(&[])
    }

    /// The same with `extra` arguments for `capexec serve`, which may name
    /// files in the directory `prepare` fills first.
    pub fn start_with_files(prepare: impl FnOnce(&Path) -> Vec<String>) -> Upgradable {
        let dir = TempDir::new("upgrade");
        let extra = prepare(dir.path());
        Upgradable::start_in(dir, &extra)
    }

    pub fn start_with(extra: &[String]) -> Upgradable {
        Upgradable::start_in(TempDir::new("upgrade"), extra)
    }

    fn start_in(dir: TempDir, extra: &[String]) -> Upgradable {
        Upgradable::start_limited(dir, extra, None)
    }

    /// The same under a descriptor limit of `descriptors`, if given.
    fn start_limited(dir: TempDir, extra: &[String], descriptors: Option<u64>) -> Upgradable {
        let exe = dir.path().join("capexec");
        std::fs::copy(BIN, &exe).expect("copy the binary");
        let socket = dir.path().join("capexec.sock");
        let admin = dir.path().join("admin.sock");
        let log = std::fs::File::create(dir.path().join("serve.log")).expect("log");
        let mut command = Command::new(&exe);
        command
            .args(["serve", "--listen"])
            .arg(format!("unix:{}", socket.display()))
            .arg("--admin")
            .arg(format!("unix:{}", admin.display()))
            .args(extra)
            .env("HOME", dir.path())
            .env("RUST_LOG", "info")
            .env_remove("XDG_CONFIG_HOME")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log);
        if let Some(descriptors) = descriptors {
            common::cli::limit_descriptors(&mut command, descriptors);
        }
        // The copy was just written: a child another test forks meanwhile
        // holds its write descriptor until that child's exec (ETXTBSY).
        let deadline = Instant::now() + DEADLINE;
        let mut child = loop {
            match command.spawn() {
                Err(error)
                    if error.raw_os_error() == Some(libc::ETXTBSY) && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                spawned => break spawned.expect("start capexec serve"),
            }
        };
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let unix = lines.next().expect("unix line").expect("read");
        assert_eq!(unix, format!("unix:{}", socket.display()));
        // The upgraded server prints its addresses again: read on.
        std::thread::spawn(move || lines.for_each(drop));
        Upgradable {
            child,
            exe,
            unix,
            admin: format!("unix:{}", admin.display()),
            dir,
        }
    }

    /// A `capexec` subcommand with this server's clean environment.
    pub fn command(&self, subcommand: &str, args: &[&str]) -> Command {
        let mut command = Command::new(BIN);
        command
            .arg(subcommand)
            .args(args)
            .env("HOME", self.dir.path())
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("CAPEXEC_TOKEN");
        command
    }

    /// `capexec upgrade` over the admin socket, to its end.
    pub fn upgrade(&self) -> common::cli::Finished {
        finish(self.command("upgrade", &["--connect", &self.admin]), None)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("serve.log")).unwrap_or_default()
    }

    /// Asserts that the server runs a new command: `echo WORD` prints it.
    pub fn answers_echo(&self, word: &str) {
        let done = finish(
            self.command("run", &["--connect", &self.unix, "-n", "--", "echo", word]),
            None,
        );
        assert_eq!(
            (done.code, text(&done.stdout)),
            (0, format!("{word}\n")),
            "{}",
            text(&done.stderr)
        );
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Drop for Upgradable {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `seq 1 N`'s output, as the test expects it, compared as it comes.
pub(crate) struct Expected {
    next: u64,
    pub(crate) pending: Vec<u8>,
    pub(crate) compared: u64,
}

impl Expected {
    fn new() -> Expected {
        Expected {
            next: 1,
            pending: Vec::new(),
            compared: 0,
        }
    }

    /// Checks `bytes`, the stream's next ones; panics at the first that
    /// differs (a byte lost or repeated).
    fn check(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            if self.pending.is_empty() {
                self.pending = format!("{}\n", self.next).into_bytes();
                self.pending.reverse();
                self.next += 1;
            }
            let want = self.pending.pop().expect("a byte");
            assert_eq!(
                byte,
                want,
                "byte {} of the stream differs (while writing {})",
                self.compared,
                self.next - 1
            );
            self.compared += 1;
        }
    }
}

/// Reads `seq`'s output from `stdout` to its end, checking every byte as
/// it comes, and calls `upgrade` once 64 MiB have arrived.
pub(crate) fn read_seq_signalling(stdout: &mut impl Read, upgrade: impl FnOnce()) -> Expected {
    let mut expected = Expected::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut upgrade = Some(upgrade);
    loop {
        let n = stdout.read(&mut buf).expect("read stdout");
        if n == 0 {
            return expected;
        }
        expected.check(&buf[..n]);
        if expected.compared >= 64 << 20
            && let Some(upgrade) = upgrade.take()
        {
            upgrade();
        }
    }
}

/// Running (a zombie is dead too).
fn alive(pid: i32) -> bool {
    common::procfs::state(pid as u32).is_some_and(|state| state != 'Z')
}

#[test]
fn sigusr2_in_the_middle_of_256_mib_loses_and_repeats_no_byte() {
    let served = Upgradable::start();
    // seq 1 30000000: 258,888,897 bytes (more than 256 MiB).
    let mut child = served
        .command(
            "run",
            &[
                "--connect",
                &served.unix,
                "--resume",
                "60",
                "-n",
                "--",
                "sh",
                "-c",
                "seq 1 30000000; exit 3",
            ],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("capexec run");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let errors = std::thread::spawn(move || {
        let mut all = String::new();
        let _ = stderr.read_to_string(&mut all);
        all
    });
    let expected = read_seq_signalling(&mut stdout, || {
        // SAFETY: kill(2) of our own child.
        assert_eq!(unsafe { libc::kill(served.pid(), libc::SIGUSR2) }, 0);
    });
    let code = common::cli::wait(&mut child);
    let errors = errors.join().expect("stderr");
    assert_eq!(expected.compared, 258_888_897, "{errors}");
    assert_eq!(expected.pending, b"", "the last line is whole");
    assert_eq!(code, 3, "{errors}");
    assert!(
        errors.contains("connection lost: the server is upgrading")
            && errors.contains("reconnected; the command carries on"),
        "{errors}"
    );
    assert!(
        served
            .log()
            .contains("took over the processes of the binary before processes=1 taken=1"),
        "{}",
        served.log()
    );
}

#[test]
fn capexec_upgrade_carries_stdin_output_and_the_operators_view_over() {
    let served = Upgradable::start();
    let dir = served.dir.path();
    let (go, ready) = (dir.join("go"), dir.join("ready"));
    // Echoes its stdin line by line; says when the first line came back.
    let script = format!(
        "read first; echo \"got $first\"; : > {ready}; \
         while [ ! -e {go} ]; do sleep 0.01; done; cat; exit 4",
        ready = ready.display(),
        go = go.display()
    );
    let mut child = served
        .command(
            "run",
            &[
                "--connect",
                &served.unix,
                "--resume",
                "60",
                "--",
                "sh",
                "-c",
                &script,
            ],
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("capexec run");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = child.stdout.take().expect("stdout");
    let output = std::thread::spawn(move || {
        let mut all = Vec::new();
        let _ = stdout.read_to_end(&mut all);
        all
    });
    stdin.write_all(b"one\n").expect("write");
    common::wait::eventually("the first line", || ready.exists());
    let upgraded = served.upgrade();
    assert_eq!(upgraded.code, 0, "{}", text(&upgraded.stderr));
    assert_eq!(
        text(&upgraded.stderr),
        "capexec: upgraded: the server serves from the new binary\n"
    );
    // The operator still sees it, as detached until the client restores.
    let listed = finish(served.command("ps", &["--connect", &served.admin]), None);
    assert_eq!(listed.code, 0, "{}", text(&listed.stderr));
    assert!(
        text(&listed.stdout).contains("read first; echo"),
        "{}",
        text(&listed.stdout)
    );
    // Written while the client reconnects, and after; a second upgrade
    // takes over what the first one took over.
    stdin.write_all(b"two\n").expect("write");
    let again = served.upgrade();
    assert_eq!(again.code, 0, "{}", text(&again.stderr));
    stdin.write_all(b"three\n").expect("write");
    std::fs::write(&go, "").expect("go");
    drop(stdin);
    let code = common::cli::wait(&mut child);
    assert_eq!(
        text(&output.join().expect("stdout")),
        "got one\ntwo\nthree\n"
    );
    assert_eq!(code, 4);
}

#[test]
fn a_process_nobody_can_restore_ends_at_an_upgrade_as_on_a_lost_connection() {
    let served = Upgradable::start();
    let (mut running, pid) = sleeping(&served, false);
    let upgraded = served.upgrade();
    assert_eq!(upgraded.code, 0, "{}", text(&upgraded.stderr));
    common::wait::eventually("the process to end", || !alive(pid));
    let mut stderr = String::new();
    running
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    assert_eq!(common::cli::wait(&mut running), 125, "{stderr}");
    assert_eq!(
        stderr,
        "capexec: lost the command: the server is upgrading\n"
    );
}

/// The inode of a file, or of what `/proc/PID/exe` runs.
fn inode(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).expect("stat").ino()
}

#[test]
fn an_idle_server_upgrades_into_the_binary_now_at_its_path() {
    let served = Upgradable::start();
    // A new file at the path (a package manager renames one into place).
    put_binary(&served.exe, None);
    let before = inode(Path::new(&format!("/proc/{}/exe", served.pid())));
    assert_ne!(before, inode(&served.exe));
    let upgraded = served.upgrade();
    assert_eq!(
        (upgraded.code, text(&upgraded.stderr).as_str()),
        (
            0,
            "capexec: upgraded: the server serves from the new binary\n"
        )
    );
    assert_eq!(
        inode(Path::new(&format!("/proc/{}/exe", served.pid()))),
        inode(&served.exe)
    );
    served.answers_echo("new");
}

#[test]
fn the_new_binary_reads_the_servers_arguments_before_it_takes_over() {
    // A server whose TLS key has gone since it started: the new binary
    // could not serve with these arguments, so nothing is handed over.
    let served = Upgradable::start_with_files(|dir| {
        let made = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("cert");
        std::fs::write(dir.join("cert.pem"), made.cert.pem()).expect("cert");
        std::fs::write(dir.join("key.pem"), made.signing_key.serialize_pem()).expect("key");
        vec![
            "--listen".into(),
            "tcp:127.0.0.1:0".into(),
            "--tls-cert".into(),
            dir.join("cert.pem").display().to_string(),
            "--tls-key".into(),
            dir.join("key.pem").display().to_string(),
        ]
    });
    let key = served.dir.path().join("key.pem");
    std::fs::remove_file(&key).expect("remove the key");
    let refused = served.upgrade();
    assert_eq!(refused.code, 125, "{}", text(&refused.stderr));
    let message = text(&refused.stderr);
    assert!(
        message.starts_with("capexec: the server was not upgraded and serves as before: ")
            && message.contains(&format!("--tls-key {}", key.display())),
        "{message}"
    );
    served.answers_echo("still");
}

/// At `exe`, a new binary that answers its check (`--handover-check`, as
/// a copy of the binary beside it) and removes itself as it does so: the
/// upgrade's exec that follows finds nothing at the path.
pub fn put_binary_gone_by_its_exec(exe: &Path) {
    let real = exe.with_file_name("real-capexec");
    put_binary(&real, None);
    put_binary(
        exe,
        Some(&format!(
            "#!/bin/sh\nfor arg; do [ \"$arg\" = --handover-check ] && rm -f \"$0\"; done\n\
             exec {} \"$@\"\n",
            real.display()
        )),
    );
}

/// What `capexec upgrade` says when the new binary at `exe` was gone by
/// the exec.
pub fn gone_by_its_exec_said(exe: &Path) -> String {
    format!(
        "capexec: the server was not upgraded: cannot execute {}: No such file or directory \
         (os error 2); it serves from the binary before, which took everything back\n",
        exe.display()
    )
}

/// A copy of the binary (or the script `content`) at `path`, a new file
/// (a new inode), once no process holds it open.
pub fn put_binary(path: &Path, content: Option<&str>) {
    use std::os::unix::fs::PermissionsExt;
    let new = path.with_extension("new");
    match content {
        Some(content) => std::fs::write(&new, content).expect("write"),
        None => {
            std::fs::copy(BIN, &new).expect("copy the binary");
        }
    }
    std::fs::set_permissions(&new, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::rename(&new, path).expect("replace");
    // A child another test forked while the copy was being written holds
    // its descriptor until its own exec, and an exec of the copy fails
    // meanwhile (ETXTBSY): wait until no process has it open.
    let held = |path: &Path| {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .any(|process| {
                std::fs::read_dir(process.path().join("fd"))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == path))
            })
    };
    common::wait::eventually("no process to hold the new binary open", || !held(path));
}

#[test]
fn an_upgrade_to_a_binary_that_cannot_take_over_leaves_the_old_one_serving() {
    let served = Upgradable::start();
    let (mut running, pid) = sleeping(&served, true);
    for (content, said) in [
        (
            Some("#!/bin/sh\necho nope\nexit 3\n"),
            "ended with exit code 3 and said \"nope\" (expected \"capexec-handover-1\")",
        ),
        (None, "cannot run"),
    ] {
        match content {
            Some(content) => put_binary(&served.exe, Some(content)),
            None => std::fs::remove_file(&served.exe).expect("remove the binary"),
        }
        let refused = served.upgrade();
        assert_eq!(refused.code, 125, "{}", text(&refused.stderr));
        let message = text(&refused.stderr);
        assert!(
            message.starts_with("capexec: the server was not upgraded and serves as before: ")
                && message.contains(said),
            "{message}"
        );
    }
    // Nothing was touched: the process runs, its client is connected, and
    // the server serves.
    assert!(alive(pid));
    assert!(running.try_wait().expect("try_wait").is_none());
    served.answers_echo("still");
    let _ = running.kill();
    let _ = running.wait();
}

#[test]
fn a_new_binary_gone_by_its_exec_leaves_the_old_one_serving_and_capexec_upgrade_says_so() {
    let served = Upgradable::start();
    let (mut running, pid) = sleeping(&served, true);
    let exe = Path::new(&format!("/proc/{}/exe", served.pid())).to_path_buf();
    let before = inode(&exe);
    put_binary_gone_by_its_exec(&served.exe);
    let upgraded = served.upgrade();
    assert_eq!(
        (upgraded.code, text(&upgraded.stderr)),
        (125, gone_by_its_exec_said(&served.exe))
    );
    assert!(!served.exe.exists(), "the script removed itself");
    // The same server, the same binary, everything taken back: the
    // process runs on with its client, and new commands run.
    assert_eq!(inode(&exe), before);
    assert!(alive(pid), "the failed upgrade ended the process");
    assert!(running.try_wait().expect("try_wait").is_none());
    served.answers_echo("still");
    assert!(
        served
            .log()
            .contains("the upgrade did not execute the new binary (cannot execute"),
        "{}",
        served.log()
    );
    let _ = running.kill();
    let _ = running.wait();
}

#[test]
fn a_sigkill_after_an_upgrade_still_leaves_nothing_behind() {
    let mut served = Upgradable::start();
    let (mut running, pid) = sleeping(&served, true);
    let upgraded = served.upgrade();
    assert_eq!(upgraded.code, 0, "{}", text(&upgraded.stderr));
    assert!(alive(pid), "the upgrade ended the process");
    served.child.kill().expect("SIGKILL");
    let _ = served.child.wait();
    common::wait::eventually("the process to end with its server", || !alive(pid));
    let _ = running.kill();
    let _ = running.wait();
}

/// A `capexec run` (with `--resume` if `resume`) of a shell that prints
/// its pid and sleeps; the client and that pid.
fn sleeping(served: &Upgradable, resume: bool) -> (Child, i32) {
    let mut args = vec!["--connect", &served.unix];
    if resume {
        args.extend(["--resume", "60"]);
    }
    args.extend(["-n", "--", "sh", "-c", "echo $$; exec sleep 600"]);
    let child = served
        .command("run", &args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("capexec run");
    let (child, first) = read_first_line(child);
    (child, first.trim().parse().expect("pid"))
}

fn read_first_line(mut child: Child) -> (Child, String) {
    let stdout = child.stdout.take().expect("stdout");
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    reader.read_line(&mut line).expect("first line");
    std::thread::spawn(move || {
        let mut rest = Vec::new();
        let _ = reader.read_to_end(&mut rest);
    });
    (child, line)
}

/// A process whose pipe is held locked from outside the server's reach
/// (the command sent its stdout to a process of its own, which splices a
/// silent socket into it) would keep the exec waiting for as long as that
/// lasts: execve waits for the process's I/O thread, asleep on the lock,
/// and ending the command's tree does not end the holder. The upgrade is
/// refused up front, naming the process, and the server serves on; once
/// the holder ends, the same upgrade goes through.
#[test]
fn an_upgrade_is_refused_while_a_process_s_pipe_is_held_locked_from_outside() {
    use common::pipe_lock::{self, KillOnDrop};
    let served = Upgradable::start();
    let (socket, ready) = (
        served.dir.path().join("holder.sock"),
        served.dir.path().join("ready"),
    );
    let mut holder = pipe_lock::outside_holder(&socket, &ready);
    let output = served.dir.path().join("output");
    let mut running = running_into(&served, &pipe_lock::sender_argv(&socket, None), &output);
    let killer = KillOnDrop::always(holding(&ready));
    common::eventually("the process's I/O thread waits on the lock", || {
        pipe_lock::io_thread_states(served.child.id()).contains(&'D')
    });
    let refused = served.upgrade();
    assert_eq!(refused.code, 125, "{}", text(&refused.stderr));
    let message = text(&refused.stderr);
    assert!(
        message.starts_with("capexec: the server was not upgraded and serves as before: process ")
            && message.contains(", `/usr/bin/python3`) holds a pipe of its own locked")
            && message.contains("end it or what holds the pipe, and try again"),
        "{message}"
    );
    served.answers_echo("still");
    assert!(running.try_wait().expect("try_wait").is_none());
    // The lock goes with the holder: the command's output ends, its
    // client with it, and the upgrade goes through.
    drop(killer);
    let _ = holder.kill();
    let _ = holder.wait();
    let done = running.wait_with_output().expect("capexec run");
    assert_eq!(done.status.code(), Some(0), "{}", text(&done.stderr));
    assert_eq!(std::fs::read(&output).expect("output"), b"");
    let upgraded = served.upgrade();
    assert_eq!(upgraded.code, 0, "{}", text(&upgraded.stderr));
    served.answers_echo("after");
}

/// The same holder, while the process runs on and its I/O thread waits on
/// nothing: the upgrade goes through. It freezes every process before the
/// connections' ends let them go, so nothing in the old binary touches
/// the pipe (the command's end would have had its pump ask the pipe what
/// it still holds, asleep on the lock, and the exec wait for it); the new
/// binary ends the process, nobody's to restore, as on a lost connection.
#[test]
fn an_upgrade_touches_no_pipe_a_process_s_holder_may_keep_locked() {
    use common::pipe_lock::{self, KillOnDrop};
    let served = Upgradable::start();
    let path = |name: &str| served.dir.path().join(name);
    let (socket, ready, sender) = (path("holder.sock"), path("ready"), path("sender"));
    let mut holder = pipe_lock::outside_holder(&socket, &ready);
    let argv = pipe_lock::sender_argv(&socket, Some(&sender));
    let mut running = running_into(&served, &argv, &path("output"));
    let killer = KillOnDrop::always(holding(&ready));
    let sender = common::eventually("the command sent its stdout", || {
        pipe_lock::holder_pid(&sender)
    });
    let upgraded = served.upgrade();
    assert_eq!(upgraded.code, 0, "{}", text(&upgraded.stderr));
    served.answers_echo("after");
    common::eventually("the command ended", || !alive(sender));
    let _ = running.wait();
    drop(killer);
    let _ = holder.kill();
    let _ = holder.wait();
    common::eventually("no I/O thread is left", || {
        pipe_lock::io_thread_states(served.child.id()).is_empty()
    });
}

/// `capexec run` of `argv` with its stdout into the file `output`, which
/// the server relays through a pipe of its own (a pipe of ours the
/// command would get as it is).
fn running_into(served: &Upgradable, argv: &[String], output: &Path) -> Child {
    let mut args = vec!["--connect", served.unix.as_str(), "-n", "--"];
    args.extend(argv.iter().map(String::as_str));
    served
        .command("run", &args)
        .stdout(std::fs::File::create(output).expect("output file"))
        .stderr(Stdio::piped())
        .spawn()
        .expect("capexec run")
}

/// The pid of the holder once `ready` says it holds the pipe locked.
fn holding(ready: &Path) -> i32 {
    common::eventually("the holder holds stdout locked", || {
        common::pipe_lock::holder_pid(ready)
    })
}

/// A server whose `--max-processes` is all its descriptor limit carries
/// upgrades with processes running: the new binary counts the
/// descriptors they hold as theirs, not as its own (which made it refuse
/// that value and end, and every process with it).
#[test]
fn an_upgrade_at_the_descriptor_limit_s_max_processes_goes_through() {
    const LIMIT: u64 = 1024;
    // What the limit carries, as the same server says at its start.
    let probe = Upgradable::start_limited(TempDir::new("upgrade"), &[], Some(LIMIT));
    let log = common::eventually("the probe says what its limit carries", || {
        let log = probe.log();
        log.contains("process and connection limits").then_some(log)
    });
    drop(probe);
    let most: usize = log
        .split("--max-processes is ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{log}"));
    let served = Upgradable::start_limited(
        TempDir::new("upgrade"),
        &["--max-processes".to_string(), most.to_string()],
        Some(LIMIT),
    );
    let running: Vec<(Child, i32)> = (0..3).map(|_| sleeping(&served, true)).collect();
    upgrades_and_answers(&served);
    for (mut client, pid) in running {
        assert!(alive(pid), "{}", served.log());
        let _ = client.kill();
        let _ = client.wait();
    }
}

/// A client that sent the server a pipe it holds locked (and never used
/// it in a start) does not hold the upgrade up: its connection's end
/// would close that descriptor, asleep on the lock, and the exec wait for
/// that thread; the descriptor goes to the new binary instead, which
/// closes it off its serving thread. It comes under its number, above
/// the first 64 slots (the server keeps those for its own), so the new
/// binary still clones its children on the spawner, whose table starts
/// with copies of those slots.
#[test]
fn a_pipe_a_client_sent_and_holds_locked_does_not_hold_the_upgrade_up() {
    use common::pipe_lock::{self, KillOnDrop};
    let served = Upgradable::start();
    let ready = served.dir.path().join("ready");
    let socket = served.unix.trim_start_matches("unix:");
    let _client = pipe_lock::ChildKilledOnDrop(pipe_lock::client_sending_a_locked_pipe(
        Path::new(socket),
        &ready,
        0,
    ));
    let _holder = KillOnDrop::always(holding(&ready));
    upgrades_and_answers(&served);
    let log = served.log();
    assert!(
        !log.contains("children are cloned from the server's own descriptor table"),
        "{log}"
    );
    common::eventually("the new binary's spawner runs", || {
        pipe_lock::thread_names(served.child.id())
            .iter()
            .any(|name| name == "capexec-spawn")
            .then_some(())
    });
}

/// `capexec serve` keeps its first 64 descriptor slots for its own from
/// its start, so that nothing it takes in later (a client's) lands where
/// the spawner's table starts from: every number below 64 is open, and
/// what the server opens for a connection lands above.
#[test]
fn a_server_keeps_its_first_64_descriptor_slots_for_its_own() {
    let served = Upgradable::start();
    let open = || -> Vec<i32> {
        let mut open: Vec<i32> = std::fs::read_dir(format!("/proc/{}/fd", served.child.id()))
            .expect("the server's descriptors")
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
            .collect();
        open.sort_unstable();
        open
    };
    let before = open();
    assert_eq!(
        before.iter().filter(|&&fd| fd < 64).count(),
        64,
        "{before:?}"
    );
    let socket = served.unix.trim_start_matches("unix:");
    let client = std::os::unix::net::UnixStream::connect(socket).expect("connect");
    let after = common::eventually("the server takes the connection in", || {
        let after = open();
        (after.len() > before.len()).then_some(after)
    });
    let new: Vec<&i32> = after.iter().filter(|fd| !before.contains(fd)).collect();
    assert!(new.iter().all(|&&fd| fd >= 64), "{new:?}");
    drop(client);
}

/// A close that already sleeps on a pipe's lock (a client sent a pipe it
/// holds locked, then enough descriptors for the server to close it)
/// would keep the exec waiting for its thread for as long as the client
/// likes: the upgrade is refused, saying so, and the server serves on;
/// once the holder lets go, the same upgrade goes through.
#[test]
fn an_upgrade_is_refused_while_a_close_sleeps_on_a_pipe_s_lock() {
    use common::pipe_lock::{self, KillOnDrop};
    let served = Upgradable::start();
    let ready = served.dir.path().join("ready");
    let socket = served.unix.trim_start_matches("unix:");
    let _client = pipe_lock::ChildKilledOnDrop(pipe_lock::client_sending_locked_pipes(
        Path::new(socket),
        &ready,
        1,
        capexec::rpc::MAX_KEPT_DESCRIPTORS,
    ));
    let holders = common::eventually("the pipe is sent", || pipe_lock::holder_pids(&ready));
    let holders: Vec<KillOnDrop> = holders.into_iter().map(KillOnDrop::always).collect();
    common::eventually("a close sleeps on the pipe's lock", || {
        (pipe_lock::threads_asleep(served.child.id()) == ["capexec-close"]).then_some(())
    });
    let refused = served.upgrade();
    assert_eq!(refused.code, 125, "{}", text(&refused.stderr));
    let message = text(&refused.stderr);
    assert!(
        message.starts_with("capexec: the server was not upgraded and serves as before: 1 close of descriptors sleeps on a lock held elsewhere")
            && message.contains("end what holds it, and try again"),
        "{message}"
    );
    served.answers_echo("still");
    drop(holders);
    common::eventually("the close goes through", || {
        pipe_lock::threads_asleep(served.child.id())
            .is_empty()
            .then_some(())
    });
    upgrades_and_answers(&served);
}

/// `capexec upgrade` of `served` succeeds, and the new binary runs a
/// command.
fn upgrades_and_answers(served: &Upgradable) {
    let upgraded = served.upgrade();
    assert_eq!(
        upgraded.code,
        0,
        "{}\n{}",
        text(&upgraded.stderr),
        served.log()
    );
    served.answers_echo("after");
}
