//! The habits of people who live in ssh, docker and kubectl: short flags,
//! durations as timeout(1) takes them, fingerprints as they copy them,
//! names that resolve to loopback, Ctrl-Z, a shell with no program, and
//! `serve` saying what it resolved and when its certificate runs out.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, SystemTime};

use common::cli::{Served, Watched, assert_printed, capexec, finish, kill, text, wait};
use common::data::TempDir;
use common::pki::Authority;

/// `-e` and `-w` are `--env` and `--cwd`, embedded and remote; `-i` is
/// accepted (stdin is always forwarded), and refused with `-n`.
#[test]
fn short_flags_work_as_elsewhere() {
    let served = Served::start();
    let script = ["--", "sh", "-c", "echo \"$GREETING from $(pwd)\"; cat"];
    for connect in [vec![], vec!["--connect", served.unix.as_str()]] {
        let mut args = connect.clone();
        args.extend(["-i", "-e", "GREETING=hello", "-w", "/"]);
        args.extend(script);
        let done = finish(served.run(&args), Some(b"and stdin\n".to_vec()));
        assert_printed(&done, 0, "hello from /\nand stdin\n", "-e -w -i");
    }
    let both = finish(served.run(&["-i", "-n", "--", "true"]), None);
    assert_eq!(
        (both.code, text(&both.stderr)),
        (
            125,
            "capexec: -i cannot be used with -n (see capexec run --help)\n".to_string()
        )
    );
}

/// `--timeout` and `--resume` take fractions and units.
#[test]
fn durations_take_fractions_and_units() {
    let timed_out = finish(
        capexec(&["run", "--timeout", "0.5", "--", "sleep", "100"]),
        None,
    );
    assert_eq!(
        (timed_out.code, text(&timed_out.stderr)),
        (
            124,
            "capexec: the command timed out after 0.5 s\n".to_string()
        )
    );
    for limit in ["5m", "1h", "90s", "0"] {
        let in_time = finish(
            capexec(&["run", "--timeout", limit, "--", "sh", "-c", "exit 3"]),
            None,
        );
        assert_eq!(
            in_time.code,
            3,
            "--timeout {limit}: {}",
            text(&in_time.stderr)
        );
    }
    let served = Served::start();
    for grace in ["1.5", "90s", "5m"] {
        let done = finish(
            served.run(&[
                "--connect",
                &served.unix,
                "--resume",
                grace,
                "--",
                "echo",
                "resumable",
            ]),
            None,
        );
        assert_printed(&done, 0, "resumable\n", &format!("--resume {grace}"));
    }
}

/// `--tls-pin` takes the fingerprint as people copy it: the server's log,
/// openssl's output, with or without colons and labels.
#[test]
fn pins_are_taken_in_every_common_spelling() {
    let dir = TempDir::new("pins");
    let authority = Authority::new(dir.path(), "ca");
    let (cert, key) = authority.server(dir.path(), "server", &["127.0.0.1"], false);
    let hex = capexec::net::TlsServer::from_files(&cert, &key)
        .expect("TLS")
        .fingerprint()
        .to_string();
    let pairs: Vec<String> = (0..32)
        .map(|i| hex[2 * i..2 * i + 2].to_uppercase())
        .collect();
    let colons = pairs.join(":");
    let served = Served::start_with(&[
        "--tls-cert",
        &cert.display().to_string(),
        "--tls-key",
        &key.display().to_string(),
    ]);
    let token = served.token_arg();
    for pin in [
        hex.clone(),
        hex.to_uppercase(),
        colons.clone(),
        format!("sha256:{hex}"),
        format!("SHA256:{colons}"),
        format!("SHA256 Fingerprint={colons}"),
        format!("sha256=\"{hex}\""),
    ] {
        let done = finish(
            served.run(&[
                "--connect",
                &served.tcp,
                "--token-file",
                &token,
                "--tls-pin",
                &pin,
                "--",
                "echo",
                "pinned",
            ]),
            None,
        );
        assert_printed(&done, 0, "pinned\n", &format!("--tls-pin {pin}"));
    }
    // A wrong pin shows the fingerprint the server offered.
    let wrong = finish(
        served.run(&[
            "--connect",
            &served.tcp,
            "--token-file",
            &token,
            "--tls-pin",
            &"ab".repeat(32),
            "--",
            "true",
        ]),
        None,
    );
    assert_eq!(
        (wrong.code, text(&wrong.stderr)),
        (
            125,
            format!(
                "capexec: cannot connect to {}: TLS: the server's certificate does not have the \
                 pinned fingerprint (it offered {hex})\n",
                served.tcp
            )
        )
    );
}

/// The clear-text rule looks at the addresses a name resolves to: a name
/// for loopback (`localhost`, or `127.1`, which only the resolver reads as
/// 127.0.0.1) is as safe as 127.0.0.1, and needs no --insecure-plaintext.
#[test]
fn names_that_resolve_to_loopback_count_as_loopback() {
    let served = Served::start();
    let port = served.tcp.rsplit(':').next().expect("port");
    for host in ["localhost", "127.1"] {
        let address = format!("tcp:{host}:{port}");
        let done = finish(
            served.run(&[
                "--connect",
                &address,
                "--token-file",
                &served.token_arg(),
                "--",
                "echo",
                "loopback",
            ]),
            None,
        );
        assert_printed(&done, 0, "loopback\n", &address);
    }
}

/// `capexec shell` without a terminal reads its commands from stdin, as
/// `ssh HOST` does.
#[test]
fn shell_without_a_terminal_reads_commands_from_stdin() {
    let served = Served::start();
    let done = finish(
        served.command("shell", &["--connect", &served.unix]),
        Some(b"echo piped-$((40+2))\nexit 5\n".to_vec()),
    );
    assert_printed(&done, 5, "piped-42\n", "capexec shell");
}

fn state_of(pid: u32) -> Option<char> {
    common::procfs::state(pid)
}

/// Ctrl-Z stops the remote command's process group with capexec, and
/// `fg` continues both.
#[test]
fn ctrl_z_stops_the_command_too_and_fg_continues_it() {
    let served = Served::start();
    let run = Watched::spawn(served.run_script(
        // A loop of builtins: a shell that forks `sleep` over and over
        // can be caught waiting on a vfork child that the same SIGSTOP
        // stopped before its exec, and then shows as D, not T, until it
        // is continued.
        "trap 'exit 7' TERM; echo \"pid-$$-\"; while :; do :; done",
    ));
    run.wait_for_stdout("-\n");
    let remote = common::pid_after(&run.stdout_text(), "pid-");
    let local = run.child.id();
    kill(&run.child, libc::SIGTSTP);
    common::eventually("both ends are stopped", || {
        state_of(local) == Some('T') && state_of(remote) == Some('T')
    });
    kill(&run.child, libc::SIGCONT);
    common::eventually("both ends run again", || {
        state_of(local) != Some('T') && state_of(remote).is_some_and(|s| s != 'T')
    });
    kill(&run.child, libc::SIGTERM);
    let done = run.finish();
    assert_eq!(done.code, 7, "{}", text(&done.stderr));
}

/// `serve` prints the addresses it listens on as resolved: a relative
/// socket path comes out absolute.
#[test]
fn serve_prints_unix_paths_absolute() {
    let dir = TempDir::new("relative-listen");
    let mut command = capexec(&["serve", "--listen", "unix:rel.sock"]);
    command.current_dir(dir.path()).stderr(Stdio::null());
    let (mut server, line) = common::cli::spawn_reading_first_line(command);
    let canonical = std::fs::canonicalize(dir.path()).expect("canonical");
    assert_eq!(
        line.trim_end(),
        format!("unix:{}", canonical.join("rel.sock").display())
    );
    kill(&server, libc::SIGTERM);
    assert_eq!(wait(&mut server), 0);
}

/// `serve` warns at start about a certificate that has expired or will
/// within 14 days, and serves all the same.
#[test]
fn serve_warns_about_a_certificate_near_its_end() {
    let dir = TempDir::new("expiring");
    let authority = Authority::new(dir.path(), "ca");
    let day = Duration::from_secs(86_400);
    let now = SystemTime::now();
    let cases = [
        (
            now + 5 * day + day / 2,
            "the TLS certificate expires in 5 days: renew it before clients refuse it",
        ),
        (
            now - 3 * day - day / 2,
            "the TLS certificate expired 3 days ago: clients will refuse it; renew it",
        ),
    ];
    for (index, (until, warning)) in cases.into_iter().enumerate() {
        let (cert, key) = authority.server_valid_until(
            dir.path(),
            &format!("server-{index}"),
            &["127.0.0.1"],
            until,
        );
        let mut command = capexec(&[
            "serve",
            "--listen",
            "tcp:127.0.0.1:0",
            "--tls-cert",
            &cert.display().to_string(),
            "--tls-key",
            &key.display().to_string(),
            "--token-file",
            &dir.path().join("token").display().to_string(),
        ]);
        command.stderr(Stdio::piped());
        let mut server = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("serve");
        let mut address = String::new();
        BufReader::new(server.stdout.take().expect("stdout"))
            .read_line(&mut address)
            .expect("address");
        assert!(address.starts_with("tcp:127.0.0.1:"), "{address}");
        kill(&server, libc::SIGTERM);
        let mut log = String::new();
        std::io::Read::read_to_string(&mut server.stderr.take().expect("stderr"), &mut log)
            .expect("log");
        assert_eq!(wait(&mut server), 0);
        assert!(
            log.lines().any(|line| line.contains(warning)
                && line.contains(&format!("certificate={}", cert.display()))),
            "no warning {warning:?} in {log}"
        );
    }
}

/// The log of a `capexec serve` with `extra` arguments under a descriptor
/// limit of `descriptors`, from its start to its SIGTERM.
fn serve_log(extra: &[&str], descriptors: u64) -> String {
    serve_log_with(extra, move || {
        let limit = libc::rlimit {
            rlim_cur: descriptors,
            rlim_max: descriptors,
        };
        // SAFETY: setrlimit is async-signal-safe.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    })
}

/// The log of a `capexec serve` with `extra` arguments, started after
/// `setup` ran in its process (between fork and exec: only
/// async-signal-safe calls), from its start to its SIGTERM.
fn serve_log_with(
    extra: &[&str],
    setup: impl FnMut() -> std::io::Result<()> + Send + Sync + 'static,
) -> String {
    use std::os::unix::process::CommandExt;
    let dir = TempDir::new("serve-log");
    let mut command = capexec(&["serve", "--listen", "tcp:127.0.0.1:0", "--token-file"]);
    command
        .arg(dir.path().join("token"))
        .args(extra)
        .env("HOME", dir.path())
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: `setup` makes only async-signal-safe calls.
    unsafe { command.pre_exec(setup) };
    let mut server = command.spawn().expect("serve");
    let mut address = String::new();
    BufReader::new(server.stdout.take().expect("stdout"))
        .read_line(&mut address)
        .expect("address");
    assert!(address.starts_with("tcp:127.0.0.1:"), "{address}");
    kill(&server, libc::SIGTERM);
    let mut log = String::new();
    std::io::Read::read_to_string(&mut server.stderr.take().expect("stderr"), &mut log)
        .expect("log");
    assert_eq!(wait(&mut server), 0, "{log}");
    log
}

/// On a machine whose descriptor limit carries fewer than the default
/// 10,000 processes, `serve` notes the default it fitted (INFO), and
/// warns only about a value the operator gave and did not get.
#[test]
fn serve_warns_only_about_limits_the_operator_asked_for() {
    let fitted = serve_log(&[], 20_000);
    let line = fitted
        .lines()
        .find(|line| line.contains("--max-processes is "))
        .unwrap_or_else(|| panic!("no line about --max-processes in {fitted}"));
    assert!(
        line.contains(" INFO capexec::cli::serve: --max-processes is ")
            && line.ends_with(
                " instead of 10000: all the descriptor limit carries (raise it with ulimit -n \
                 for more) descriptor_limit=20000"
            ),
        "{line}"
    );
    assert!(!fitted.contains("WARN"), "{fitted}");
    let asked = serve_log(
        &[
            "--max-processes",
            "100",
            "--max-processes-per-connection",
            "500",
        ],
        20_000,
    );
    let warnings: Vec<&str> = asked.lines().filter(|line| line.contains("WARN")).collect();
    assert_eq!(warnings.len(), 1, "{asked}");
    assert!(
        warnings[0].ends_with(
            " WARN capexec::cli::serve: --max-processes-per-connection is 88 instead of 500: at \
             most seven eighths of --max-processes, so that one connection at its quota leaves \
             room for the others descriptor_limit=20000"
        ),
        "{}",
        warnings[0]
    );
}

/// Under a limit too small for the shares kept for what clients send,
/// for direct channels' pipes and for terminal sessions' members, `serve`
/// warns of each at start, naming the limit that keeps all of it; at
/// 20,000 it keeps them all and says nothing.
#[test]
fn serve_warns_of_each_share_a_small_limit_keeps_less_of() {
    let log = serve_log(&[], 4096);
    let warnings: Vec<&str> = log.lines().filter(|line| line.contains(" WARN ")).collect();
    let expected = [("3322", "17384"), ("512", "8192"), ("1024", "12288")];
    assert_eq!(warnings.len(), expected.len(), "{log}");
    for (line, (meant, limit)) in warnings.iter().zip(expected) {
        assert!(
            line.contains(&format!(
                "the descriptor limit keeps 0 of the {meant} descriptors "
            )) && line.contains(&format!("(raise it with ulimit -n to {limit} or more)")),
            "{line}"
        );
    }
    assert!(!serve_log(&[], 20_000).contains(" WARN "));
}

/// In a cgroup whose `pids.max` carries fewer than the default 10,000
/// processes (each is two tasks: the command and the server's thread for
/// its pipes), `serve` fits `--max-processes` to it and says so, naming
/// the limit. The machine must have the pids controller (version 1 or 2).
#[test]
fn serve_fits_its_processes_to_its_cgroups_task_limit() {
    let group = PidsGroup::new(700);
    let procs = std::ffi::CString::new(
        group
            .dir
            .join("cgroup.procs")
            .into_os_string()
            .into_encoded_bytes(),
    )
    .expect("path");
    let log = serve_log_with(&[], move || {
        // SAFETY: open(2), write(2) and close(2) are async-signal-safe;
        // "0" moves the writing process.
        unsafe {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
            if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(fd);
        }
        Ok(())
    });
    let limit = log
        .lines()
        .find(|line| line.contains("capexec::cli::serve: the task limit "))
        .unwrap_or_else(|| panic!("no line about the task limit in {log}"));
    let set_by = format!("set_by=pids.max of {}", group.dir.display());
    assert!(
        limit.contains("task_limit=700") && limit.contains(&set_by),
        "{limit}"
    );
    let carried: u64 = limit
        .split_whitespace()
        .find_map(|field| field.strip_prefix("processes_carried="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{limit}"));
    // 700, less the server's own tasks at start and 64 kept for its
    // threads, two a process.
    assert!((300..=318).contains(&carried), "{limit}");
    let lowered = log
        .lines()
        .find(|line| line.contains("--max-processes is "))
        .unwrap_or_else(|| panic!("no line about --max-processes in {log}"));
    assert!(
        lowered.contains(&format!(
            " INFO capexec::cli::serve: --max-processes is {carried} instead of 10000: all the \
             task limit carries, two tasks a process (the command and the thread for its pipes; \
             raise the limit for more)"
        )),
        "{lowered}"
    );
    assert!(!log.contains("WARN"), "{log}");
}

/// A cgroup of the pids controller with a `pids.max`, removed when
/// dropped (once empty).
struct PidsGroup {
    dir: std::path::PathBuf,
}

impl PidsGroup {
    fn new(max: u64) -> PidsGroup {
        let name = format!("capexec-test-tasks-{}", std::process::id());
        let v1 = std::path::Path::new("/sys/fs/cgroup/pids");
        let v2 = std::path::Path::new("/sys/fs/cgroup");
        let root = if v1.join("cgroup.procs").exists() {
            v1.to_path_buf()
        } else {
            let controllers = std::fs::read_to_string(v2.join("cgroup.controllers"))
                .expect("this machine has no cgroup hierarchy with the pids controller");
            assert!(
                controllers.split_whitespace().any(|c| c == "pids"),
                "this machine's cgroup v2 root has no pids controller: {controllers}"
            );
            std::fs::write(v2.join("cgroup.subtree_control"), "+pids")
                .expect("enable the pids controller for child cgroups");
            v2.to_path_buf()
        };
        let dir = root.join(name);
        std::fs::create_dir(&dir).expect("make a pids cgroup (as root)");
        std::fs::write(dir.join("pids.max"), max.to_string()).expect("pids.max");
        PidsGroup { dir }
    }
}

impl Drop for PidsGroup {
    fn drop(&mut self) {
        common::wait::eventually("the test cgroup empties", || {
            std::fs::remove_dir(&self.dir).is_ok()
        });
    }
}

/// `-v` (before or after the subcommand) says what capexec does, as
/// `capexec: debug: ...` lines on stderr; without it, nothing is said.
#[test]
fn verbose_says_where_it_connects_and_how() {
    let served = Served::start();
    let debug_lines = |done: &common::cli::Finished| -> Vec<String> {
        text(&done.stderr)
            .lines()
            .filter(|line| line.starts_with("capexec: debug: "))
            .map(str::to_string)
            .collect()
    };
    let done = finish(
        served.run(&["-v", "--connect", &served.unix, "--", "echo", "hi"]),
        None,
    );
    assert_printed(&done, 0, "hi\n", "run -v");
    let lines = debug_lines(&done);
    for expected in [
        format!(
            "capexec: debug: connecting to {} (--connect: an address)",
            served.unix
        ),
        "capexec: debug: connected (a Unix socket: no login)".to_string(),
        "capexec: debug: starting echo".to_string(),
        "capexec: debug: exit status 0: the command's".to_string(),
    ] {
        assert!(lines.contains(&expected), "{expected:?} not in {lines:?}");
    }
    let mut command = served.command("-v", &["info", "--token-file", &served.token_arg()]);
    command.env("CAPEXEC_CONNECT", &served.tcp);
    let done = finish(command, None);
    assert_eq!(done.code, 0, "{}", text(&done.stderr));
    let lines = debug_lines(&done);
    assert_eq!(
        lines[..4],
        [
            format!(
                "capexec: debug: connecting to {} (CAPEXEC_CONNECT: an address)",
                served.tcp
            ),
            format!(
                "capexec: debug: the login token: --token-file {}",
                served.token_arg()
            ),
            "capexec: debug: no TLS".to_string(),
            "capexec: debug: connected; the login travels with the first calls".to_string(),
        ]
    );
    let quiet = finish(
        served.run(&["--connect", &served.unix, "--", "echo", "hi"]),
        None,
    );
    assert_eq!(
        (quiet.code, text(&quiet.stdout), text(&quiet.stderr)),
        (0, "hi\n".to_string(), String::new())
    );
}

/// What ssh, scp and kill taught the hands is answered with what capexec
/// takes instead, in one line, exit 125; ssh's -N is accepted and said to
/// be needless; a mistyped server name gets "did you mean".
#[test]
fn ssh_scp_and_kill_habits_are_answered_with_what_capexec_takes() {
    let config = TempDir::new("habits-config");
    std::fs::create_dir_all(config.path().join("capexec")).expect("dir");
    let file = config.path().join("capexec/config.toml");
    std::fs::write(&file, "[servers.build]\naddress = \"unix:/nonexistent\"\n").expect("config");
    let line = |args: &[&str]| {
        let mut command = capexec(args);
        command
            .env("XDG_CONFIG_HOME", config.path())
            .env("HOME", config.path())
            .env_remove("CAPEXEC_CONNECT")
            .env_remove("CAPEXEC_TOKEN");
        let done = finish(command, None);
        assert!(done.stdout.is_empty(), "{args:?}: {}", text(&done.stdout));
        (done.code, text(&done.stderr))
    };
    let cases: [(&[&str], i32, &str); 11] = [
        (
            &["run", "-p", "7000", "--", "true"],
            125,
            "capexec: unknown option -p: the port goes in the address, --connect tcp:HOST:PORT \
             (or HOST:PORT) (see capexec run --help)\n",
        ),
        (
            &["serve", "-p", "7000"],
            125,
            "capexec: unknown option -p: the port goes in the address, --listen tcp:HOST:PORT \
             (see capexec serve --help)\n",
        ),
        (
            &["shell", "root@build"],
            125,
            "capexec: unexpected argument \"root@build\": capexec shell takes the server as \
             --connect build (capexec has no users to log in as: a command runs as the user \
             that runs the server) (see capexec shell --help)\n",
        ),
        (
            &["run", "--connect", "root@build:7000", "--", "true"],
            125,
            "capexec: --connect \"root@build:7000\": capexec has no users to log in as: a \
             command runs as the user that runs the server (start one as that user); write \
             --connect build:7000\n",
        ),
        (
            &["kill", "-9", "4242"],
            125,
            "capexec: unknown option -9: capexec kill takes no signal: it sends SIGTERM to each \
             process's group, then SIGKILL to what is left after a grace (capexec kill PID) \
             (see capexec kill --help)\n",
        ),
        (
            &["kill", "-SIGKILL", "4242"],
            125,
            "capexec: unknown option -S: capexec kill takes no signal: it sends SIGTERM to each \
             process's group, then SIGKILL to what is left after a grace (capexec kill PID) \
             (see capexec kill --help)\n",
        ),
        (
            &["cp", "-r", "build:/etc/ssh", "my copy"],
            125,
            "capexec: \"build:/etc/ssh\" is scp's HOST:PATH: capexec names the server with \
             --connect and writes remote paths :PATH (capexec cp --connect build :/etc/ssh \
             'my copy')\n",
        ),
        (
            &["build"],
            125,
            "capexec: unknown command \"build\": to reach the server build, capexec shell \
             --connect build, or capexec run --connect build -- PROGRAM (see capexec --help)\n",
        ),
        (
            &["run", "build", "make"],
            127,
            "capexec: program not found: build (to run on the server build: capexec run \
             --connect build -- PROGRAM)\n",
        ),
        (
            &["run", "--connect", "biuld", "--", "true"],
            125,
            "", // below: it names the file
        ),
        (&["run", "--connect", "lokal", "--", "true"], 125, ""),
    ];
    for (args, code, expected) in cases {
        let expected = match args.get(2) {
            Some(&typo) if expected.is_empty() => format!(
                "capexec: --connect \"{typo}\": no server of that name in {} (it names build; \
                 did you mean {}?); an address is unix:PATH or tcp:HOST:PORT\n",
                file.display(),
                if typo == "biuld" { "build" } else { "local" }
            ),
            _ => expected.to_string(),
        };
        assert_eq!(line(args), (code, expected), "{args:?}");
    }

    let served = Served::start();
    let forward = served.command(
        "forward",
        &["--connect", &served.unix, "-N", "-L", "0:localhost:1"],
    );
    let forward = Watched::spawn(forward);
    forward.wait_for_stdout("-L tcp:127.0.0.1:");
    kill(&forward.child, libc::SIGTERM);
    let done = forward.finish();
    assert_eq!(
        (done.code, text(&done.stderr)),
        (
            0,
            "capexec: -N is not needed: capexec forward runs no command, it only forwards\n"
                .to_string()
        )
    );
}
