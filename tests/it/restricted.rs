//! Restricted executors (`Executor.restrict`): every rule refuses what
//! breaks it with an error naming the rule, accepts what keeps to it, and
//! restricting again only narrows. Every backend (through the chain the
//! policy is resolved and enforced at the far end).

use crate::common;

use std::ffi::OsString;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::Duration;

use capexec::capexec_capnp::executor;
use capexec::client::{self, Command, Error, RemoteProcess};
use capexec::model::Policy;
use capexec::model::{ExitStatus, PtySize, RefusalKind};
use common::data::TempDir;
use common::{Ctx, sh};

fn restricted(ctx: &Ctx, policy: Policy) -> executor::Client {
    client::restrict(&ctx.executor, &policy)
}

fn programs(names: &[&str]) -> Option<Vec<OsString>> {
    Some(names.iter().map(OsString::from).collect())
}

/// The start's structured refusal.
async fn refusal(executor: &executor::Client, command: &Command) -> (RefusalKind, String) {
    match command.spawn(executor).await {
        Err(Error::Refused(error)) => (error.kind, error.message),
        Err(other) => panic!("expected a start error, got {other}"),
        Ok(_) => panic!("the start succeeded"),
    }
}

fn assert_refused_by(refused: &(RefusalKind, String), rule: &str) {
    assert_eq!(refused.0, RefusalKind::NotAllowed, "{}", refused.1);
    assert!(
        refused.1.contains(&format!("policy rule `{rule}`")),
        "the error should name the rule `{rule}`: {}",
        refused.1
    );
}

/// The refusal of a `restrict` call, seen on the executor it returned.
async fn restrict_refusal(executor: &executor::Client) -> (Option<RefusalKind>, String) {
    match client::info(executor).await {
        Ok(_) => panic!("the restriction was accepted"),
        Err(Error::Refused(refused)) => (Some(refused.kind), refused.message),
        Err(other) => (None, other.to_string()),
    }
}

async fn stdout(executor: &executor::Client, command: &Command) -> (ExitStatus, String) {
    let output = command.output(executor).await.expect("run");
    (
        output.exit.status,
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).expect("canonicalize")
}

async fn only_allowed_programs_run(ctx: Ctx) {
    let executor = restricted(
        &ctx,
        Policy {
            programs: programs(&["true", "sh"]),
            settable_env: Some(vec!["PATH".into()]),
            ..Policy::default()
        },
    );
    // By name, and by a path that resolves to the same file.
    let (status, _) = stdout(&executor, &Command::new("true")).await;
    assert_eq!(status, ExitStatus::Code(0));
    let true_path = which("true");
    let (status, _) = stdout(&executor, &Command::new(&true_path)).await;
    assert_eq!(status, ExitStatus::Code(0));
    // The child still sees the argv[0] it was started with.
    let (status, text) = stdout(&executor, &sh("echo \"$0\"")).await;
    assert_eq!((status, text.as_str()), (ExitStatus::Code(0), "sh\n"));

    let refused = refusal(&executor, &Command::new("false")).await;
    assert_refused_by(&refused, "programs");
    assert!(
        refused.1.contains("\"false\""),
        "names the program: {}",
        refused.1
    );
    // A PATH that finds another file of an allowed name is no way around it.
    let dir = TempDir::new("restricted-path");
    let impostor = dir.path().join("true");
    std::fs::write(&impostor, "#!/bin/sh\necho impostor\n").expect("write");
    make_executable(&impostor);
    let mut command = Command::new("true");
    command.env("PATH", dir.path().as_os_str());
    assert_refused_by(&refusal(&executor, &command).await, "programs");
    // Nor is a missing program anything but missing.
    let (kind, _) = refusal(&executor, &Command::new("no-such-program-here")).await;
    assert_eq!(kind, RefusalKind::ProgramNotFound);

    // With programs restricted and nothing said about the environment, no
    // variable may change: LD_PRELOAD would make any program of them run
    // something else.
    let strict = restricted(
        &ctx,
        Policy {
            programs: programs(&["true"]),
            ..Policy::default()
        },
    );
    let mut preloading = Command::new("true");
    preloading.env("LD_PRELOAD", "/tmp/not-a-library.so");
    assert_refused_by(&refusal(&strict, &preloading).await, "settableEnv");
    assert_eq!(
        stdout(&strict, &Command::new("true")).await.0,
        ExitStatus::Code(0)
    );
}

/// A multi-call program (like busybox) does what its name says, so a name
/// allowed for it allows nothing else it can be run as.
async fn multi_call_programs_are_told_apart_by_name(ctx: Ctx) {
    let dir = TempDir::new("restricted-multi-call");
    let multi = dir.path().join("multi");
    std::fs::write(&multi, "#!/bin/sh\necho \"ran as ${0##*/}\"\n").expect("write");
    make_executable(&multi);
    let listing = dir.path().join("listing");
    let shell = dir.path().join("shell");
    symlink(&multi, &listing).expect("symlink");
    symlink(&multi, &shell).expect("symlink");
    let executor = restricted(
        &ctx,
        Policy {
            programs: Some(vec![listing.clone().into_os_string()]),
            ..Policy::default()
        },
    );
    let (status, text) = stdout(&executor, &Command::new(&listing)).await;
    assert_eq!(
        (status, text.as_str()),
        (ExitStatus::Code(0), "ran as listing\n")
    );
    assert_refused_by(&refusal(&executor, &Command::new(&shell)).await, "programs");
    assert_refused_by(&refusal(&executor, &Command::new(&multi)).await, "programs");
    // Nor can it be run as the allowed path under another name.
    let mut renamed = Command::new(&listing);
    renamed.arg0("shell");
    let refused = refusal(&executor, &renamed).await;
    assert_refused_by(&refused, "programs");
    assert!(refused.1.contains("arg0"), "{}", refused.1);
}

async fn the_working_directory_stays_under_the_roots(ctx: Ctx) {
    let dir = TempDir::new("restricted-cwd");
    let root = dir.path().join("root");
    let inside = root.join("inside");
    let outside = dir.path().join("outside");
    for made in [&inside, &outside] {
        std::fs::create_dir_all(made).expect("mkdir");
    }
    symlink(&outside, root.join("escape")).expect("symlink out");
    symlink(&inside, root.join("shortcut")).expect("symlink in");
    let executor = restricted(
        &ctx,
        Policy {
            cwd_roots: Some(vec![root.clone()]),
            ..Policy::default()
        },
    );
    let pwd = |cwd: PathBuf| {
        let mut command = sh("pwd");
        command.current_dir(cwd);
        command
    };
    let (status, text) = stdout(&executor, &pwd(root.clone())).await;
    assert_eq!(status, ExitStatus::Code(0));
    assert_eq!(text, format!("{}\n", canonical(&root).display()));
    // A symlink that stays inside is followed; the child starts in its
    // target.
    let (_, text) = stdout(&executor, &pwd(root.join("shortcut"))).await;
    assert_eq!(text, format!("{}\n", canonical(&inside).display()));

    for escape in [
        root.join("..").join("outside"),
        root.join("inside").join("..").join(".."),
        root.join("escape"),
        outside.clone(),
    ] {
        let refused = refusal(&executor, &pwd(escape.clone())).await;
        assert_refused_by(&refused, "cwdRoots");
        assert!(
            refused.1.contains(&escape.display().to_string()),
            "names the directory asked for: {}",
            refused.1
        );
    }
    // Without a cwd the server's own directory counts, and it is not under
    // the root.
    assert_refused_by(&refusal(&executor, &sh("pwd")).await, "cwdRoots");
}

async fn the_environment_is_fixed_and_only_settable_names_change(ctx: Ctx) {
    let executor = restricted(
        &ctx,
        Policy {
            environment: Some(vec![
                ("PATH".into(), "/usr/bin:/bin".into()),
                ("FIXED".into(), "1".into()),
            ]),
            settable_env: Some(vec!["CHOICE".into()]),
            ..Policy::default()
        },
    );
    let mut command = Command::new("env");
    command.env("CHOICE", "mine");
    let (status, text) = stdout(&executor, &command).await;
    assert_eq!(status, ExitStatus::Code(0));
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["CHOICE=mine", "FIXED=1", "PATH=/usr/bin:/bin"]);

    let mut sets_fixed = Command::new("env");
    sets_fixed.env("FIXED", "2");
    let refused = refusal(&executor, &sets_fixed).await;
    assert_refused_by(&refused, "settableEnv");
    assert!(refused.1.contains("\"FIXED\""), "{}", refused.1);
    let mut unsets = Command::new("env");
    unsets.env_remove("PATH");
    assert_refused_by(&refusal(&executor, &unsets).await, "settableEnv");
    let mut clears = Command::new("env");
    clears.env_clear();
    assert_refused_by(&refusal(&executor, &clears).await, "settableEnv");
}

async fn terminals_can_be_forbidden(ctx: Ctx) {
    let executor = restricted(
        &ctx,
        Policy {
            forbid_tty: true,
            ..Policy::default()
        },
    );
    let mut on_tty = Command::new("true");
    on_tty.tty(PtySize { rows: 24, cols: 80 });
    assert_refused_by(&refusal(&executor, &on_tty).await, "forbidTty");
    let (status, _) = stdout(&executor, &Command::new("true")).await;
    assert_eq!(status, ExitStatus::Code(0));
}

async fn running_processes_are_counted_until_they_exit(ctx: Ctx) {
    let executor = restricted(
        &ctx,
        Policy {
            max_processes: Some(2),
            ..Policy::default()
        },
    );
    let sleeper = sh("exec sleep 1000");
    // A start that fails after passing the rules takes no place.
    for _ in 0..3 {
        let (kind, _) = refusal(&executor, &Command::new("no-such-program-here")).await;
        assert_eq!(kind, RefusalKind::ProgramNotFound);
    }
    let first = sleeper.spawn(&executor).await.expect("first");
    let second = sleeper.spawn(&executor).await.expect("second");
    let refused = refusal(&executor, &sleeper).await;
    assert_refused_by(&refused, "maxProcesses");
    // A process that exited gives its place back, held or not.
    assert!(first.terminate().await.expect("terminate"));
    common::read_until_closed(&first).await;
    let third = sleeper.spawn(&executor).await.expect("a place was free");
    // Other executors of the same server are not limited by it.
    let unlimited = sleeper.spawn(&ctx.executor).await.expect("unrestricted");
    for process in [&second, &third, &unlimited] {
        assert!(process.terminate().await.expect("terminate"));
    }
}

/// Starts a shell that leaves a background job running and exits 0; the
/// process (held) and the job's pid.
async fn start_job_and_exit(executor: &executor::Client) -> (RemoteProcess, u32) {
    let process = sh("sleep 1000 >/dev/null 2>&1 & echo $!")
        .spawn(executor)
        .await
        .expect("start");
    let events = common::read_until_closed(&process).await;
    assert_eq!(common::exit_of(&events), Some(ExitStatus::Code(0)));
    let job = String::from_utf8_lossy(&common::output_bytes(&events, None))
        .trim()
        .parse()
        .expect("the job's pid");
    (process, job)
}

/// A child that exits at once but leaves a job running is still running
/// as far as the limits go.
async fn what_a_child_leaves_running_still_counts(ctx: Ctx) {
    let executor = restricted(
        &ctx,
        Policy {
            max_processes: Some(1),
            ..Policy::default()
        },
    );
    let (process, job) = start_job_and_exit(&executor).await;
    assert!(running(job), "the job runs on");
    assert_refused_by(&refusal(&executor, &sh("exit 0")).await, "maxProcesses");
    // Releasing the process ends the job and gives the place back.
    drop(process);
    wait_dead(job).await;
    start_once_a_place_is_free(&executor).await;

    // So does the job ending by itself, the process still held.
    let (process, job) = start_job_and_exit(&executor).await;
    assert_refused_by(&refusal(&executor, &sh("exit 0")).await, "maxProcesses");
    // SAFETY: kill(2) on the job this test started, known to be alive.
    assert_eq!(unsafe { libc::kill(job as i32, libc::SIGKILL) }, 0);
    start_once_a_place_is_free(&executor).await;
    drop(process);
}

/// Starts `exit 0` once the executor admits it (a place given back is
/// noticed within a second or so), and waits for it to close.
async fn start_once_a_place_is_free(executor: &executor::Client) {
    let next = common::eventually_async("the place is given back", async || {
        match sh("exit 0").spawn(executor).await {
            Ok(next) => Ok(next),
            Err(Error::Refused(error)) if error.kind == RefusalKind::NotAllowed => Err(error),
            Err(other) => panic!("unexpected: {other}"),
        }
    })
    .await;
    common::read_until_closed(&next).await;
}

async fn the_run_time_limit_ends_what_the_child_left_running(ctx: Ctx) {
    let executor = restricted(
        &ctx,
        Policy {
            // Long enough for the shell to exit first on a loaded machine.
            max_run_time: Some(Duration::from_secs(2)),
            ..Policy::default()
        },
    );
    let (process, job) = start_job_and_exit(&executor).await;
    // Still held, yet the job ends at the deadline.
    wait_dead(job).await;
    assert!(!process.info().await.expect("info").timed_out);
}

async fn run_time_is_capped(ctx: Ctx) {
    let executor = restricted(
        &ctx,
        Policy {
            // Long enough for `exit 5` below to finish on a loaded machine.
            max_run_time: Some(Duration::from_millis(1500)),
            ..Policy::default()
        },
    );
    // Asking for longer gets the policy's limit.
    let mut command = sh("exec sleep 1000");
    command.timeout(Duration::from_secs(3600));
    let process = command.spawn(&executor).await.expect("start");
    common::read_until_timed_out(&process).await;
    // What finishes in time is left alone.
    let (status, _) = stdout(&executor, &sh("exit 5")).await;
    assert_eq!(status, ExitStatus::Code(5));
}

async fn restricting_again_only_narrows(ctx: Ctx) {
    let dir = TempDir::new("restricted-narrow");
    let root = dir.path().join("root");
    let sub = root.join("sub");
    std::fs::create_dir_all(&sub).expect("mkdir");
    let outer = restricted(
        &ctx,
        Policy {
            programs: programs(&["true", "sh"]),
            cwd_roots: Some(vec![root.clone()]),
            max_processes: Some(1),
            forbid_tty: true,
            ..Policy::default()
        },
    );
    let inner = client::restrict(
        &outer,
        &Policy {
            programs: programs(&["true"]),
            cwd_roots: Some(vec![sub.clone()]),
            max_processes: Some(5),
            ..Policy::default()
        },
    );
    let mut in_sub = sh("exit 0");
    in_sub.current_dir(&sub);
    let mut in_root = Command::new("true");
    in_root.current_dir(&root);
    // The inner executor keeps the outer's rules and adds its own.
    assert_refused_by(&refusal(&inner, &in_sub).await, "programs");
    assert_refused_by(&refusal(&inner, &in_root).await, "cwdRoots");
    let mut true_in_sub = Command::new("true");
    true_in_sub.current_dir(&sub);
    let mut on_tty = true_in_sub.clone();
    on_tty.tty(PtySize { rows: 24, cols: 80 });
    assert_refused_by(&refusal(&inner, &on_tty).await, "forbidTty");
    assert_eq!(
        stdout(&inner, &true_in_sub).await.0,
        ExitStatus::Code(0),
        "in policy"
    );
    assert_eq!(stdout(&outer, &in_sub).await.0, ExitStatus::Code(0));
    // The outer count covers the inner executor's processes.
    let mut sleeper = sh("exec sleep 1000");
    sleeper.current_dir(&root);
    let held = sleeper.spawn(&outer).await.expect("sleeper");
    assert_refused_by(&refusal(&inner, &true_in_sub).await, "maxProcesses");
    assert!(held.terminate().await.expect("terminate"));

    // Asking for more than the executor allows is refused, naming the rule.
    let wider_program = client::restrict(
        &inner,
        &Policy {
            programs: programs(&["sh"]),
            ..Policy::default()
        },
    );
    let (kind, text) = restrict_refusal(&wider_program).await;
    assert_eq!(kind, Some(RefusalKind::NotAllowed), "{text}");
    assert!(text.contains("policy rule `programs`"), "{text}");
    let wider_root = client::restrict(
        &inner,
        &Policy {
            cwd_roots: Some(vec![root.clone()]),
            ..Policy::default()
        },
    );
    let (kind, text) = restrict_refusal(&wider_root).await;
    assert_eq!(kind, Some(RefusalKind::NotAllowed), "{text}");
    assert!(text.contains("policy rule `cwdRoots`"), "{text}");
}

async fn policies_that_cannot_be_resolved_are_refused(ctx: Ctx) {
    let cases = [
        (
            Policy {
                programs: programs(&["no-such-program-anywhere"]),
                ..Policy::default()
            },
            "policy rule `programs`: \"no-such-program-anywhere\" is not on the server's PATH",
        ),
        (
            Policy {
                programs: programs(&["bin/true"]),
                ..Policy::default()
            },
            "policy rule `programs`: \"bin/true\" is neither an absolute path nor a name",
        ),
        (
            Policy {
                cwd_roots: Some(vec!["relative/root".into()]),
                ..Policy::default()
            },
            "policy rule `cwdRoots`: \"relative/root\" is not an absolute path",
        ),
        (
            Policy {
                environment: Some(vec![("A=B".into(), "x".into())]),
                ..Policy::default()
            },
            "policy rule `environment`: \"A=B\" is not a valid variable",
        ),
    ];
    for (policy, expected) in cases {
        let (kind, text) = restrict_refusal(&restricted(&ctx, policy)).await;
        assert_eq!(kind, Some(RefusalKind::InvalidArgument), "{text}");
        assert!(text.contains(expected), "expected {expected:?} in {text:?}");
    }
    // The server goes on serving.
    let (status, _) = stdout(&ctx.executor, &sh("exit 4")).await;
    assert_eq!(status, ExitStatus::Code(4));
}

async fn a_restricted_executor_offers_no_other_environment(ctx: Ctx) {
    let executor = restricted(
        &ctx,
        Policy {
            programs: programs(&["sh"]),
            ..Policy::default()
        },
    );
    let info = client::info(&executor).await.expect("info");
    assert!(info.features.iter().any(|name| name == "restricted"));
    let environments = client::environments(&executor).await.expect("list");
    let names: Vec<&str> = environments.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["local"]);
    // "local" is the restricted executor itself.
    let local = client::environment(&executor, "local");
    assert_refused_by(&refusal(&local, &Command::new("true")).await, "programs");
    let elsewhere = client::environment(&executor, "b");
    let (kind, text) = restrict_refusal(&elsewhere).await;
    assert_eq!(kind, Some(RefusalKind::NotAllowed), "{text}");
    // What it allows works, with output and exit status as usual.
    let output = sh("echo out; echo err >&2; exit 3")
        .output(&executor)
        .await
        .expect("run");
    assert_eq!(output.exit.status, ExitStatus::Code(3));
    assert_eq!(output.stdout, b"out\n");
    assert_eq!(output.stderr, b"err\n");
}

/// Alive: neither gone nor a zombie (an orphan's zombie waits for whoever
/// reaps orphans here).
fn running(pid: u32) -> bool {
    common::procfs::state(pid).is_some_and(|state| state != 'Z')
}

async fn wait_dead(pid: u32) {
    common::eventually_async(&format!("process {pid} stops running"), async || {
        !running(pid)
    })
    .await
}

fn which(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| panic!("{name} is not on PATH"))
}

fn make_executable(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

backend_tests!(
    only_allowed_programs_run,
    multi_call_programs_are_told_apart_by_name,
    the_working_directory_stays_under_the_roots,
    the_environment_is_fixed_and_only_settable_names_change,
    terminals_can_be_forbidden,
    running_processes_are_counted_until_they_exit,
    run_time_is_capped,
    what_a_child_leaves_running_still_counts,
    the_run_time_limit_ends_what_the_child_left_running,
    restricting_again_only_narrows,
    policies_that_cannot_be_resolved_are_refused,
    a_restricted_executor_offers_no_other_environment,
);

/// Through a chain, the restriction lives at the far end; when the link
/// breaks and reconnects, the forwarder asks for it again, so the
/// executor the client holds stays exactly as restricted.
#[test]
fn a_restriction_through_a_chain_survives_a_broken_link() {
    common::run_local(async {
        let dir = TempDir::new("restricted-relink");
        let far = common::server::ServerThread::start(false);
        let link = common::proxy::Proxy::in_front_of(&far.address, dir.path(), Duration::ZERO)
            .await
            .expect("proxy");
        let front = common::server::ServerThread::start_forwarding(
            TempDir::new("restricted-front"),
            vec![capexec::net::Address::Unix(dir.path().join("front.sock"))],
            vec![capexec::net::UpstreamConfig::new(
                "b",
                link.address().clone(),
                None,
            )],
            Some("b"),
        );
        let connection = capexec::net::connect(&front.address, None)
            .await
            .expect("connect");
        let executor = client::restrict(
            &connection.executor(),
            &Policy {
                programs: programs(&["true"]),
                ..Policy::default()
            },
        );
        assert_eq!(
            stdout(&executor, &Command::new("true")).await.0,
            ExitStatus::Code(0)
        );
        link.cut();
        link.restore();
        // The front notices the break on its own time: until then a start
        // fails as the upstream being unavailable.
        common::eventually_async("the front reconnects", async || {
            match Command::new("true").output(&executor).await {
                Ok(output) => {
                    assert_eq!(output.exit.status, ExitStatus::Code(0));
                    Ok(())
                }
                Err(Error::Refused(error)) if error.kind == RefusalKind::UpstreamUnavailable => {
                    Err(error)
                }
                Err(other) => panic!("unexpected: {other}"),
            }
        })
        .await;
        assert_refused_by(&refusal(&executor, &sh("true")).await, "programs");
    });
}
