//! Waiting costs nothing: every command that runs for a while (`run`
//! waiting for its command, with its stdio handed over or relayed, with
//! forwards or `--resume`; `forward -L` and `-R`) and the server behind
//! them sleep until something happens. A loop that polls a closed channel
//! or a ready future again spins a core for as long as it runs, and no
//! output test notices (`capexec forward` with only `-L` once did).

use crate::common;

use std::time::Duration;

use common::cli::{Served, Watched, kill, text};
use common::procfs;

/// Less than this in [`WINDOW`] is asleep: waking for a keepalive or a
/// periodic check costs microseconds; a spinning process gets a good part
/// of a core even on a loaded machine.
const AWAKE: Duration = Duration::from_millis(100);

/// How long each process is watched.
const WINDOW: Duration = Duration::from_secs(2);

#[test]
fn every_long_running_command_sleeps_while_nothing_happens() {
    let served = Served::start();
    let token = served.token_arg();
    let ready = ["--", "sh", "-c", "echo ready; exec sleep 60"];
    let run = |name, options: &[&str]| {
        let args: Vec<&str> = options.iter().chain(&ready).copied().collect();
        (name, "ready\n", served.command("run", &args))
    };
    let forward = |name, args: &[&str]| (name, "\n", served.command("forward", args));
    let commands = [
        run("run over unix", &["--connect", &served.unix]),
        run(
            "run over unix, stdio relayed",
            &["--connect", &served.unix, "--relay-stdio"],
        ),
        run(
            "run over tcp",
            &["--connect", &served.tcp, "--token-file", &token],
        ),
        run(
            "run --resume",
            &["--connect", &served.unix, "--resume", "30"],
        ),
        run(
            "run with forwards",
            &[
                "--connect",
                &served.unix,
                "--forward",
                "0:127.0.0.1:9",
                "--reverse-forward",
                "0:127.0.0.1:9",
            ],
        ),
        forward(
            "forward -L",
            &["--connect", &served.unix, "-L", "0:127.0.0.1:9"],
        ),
        forward(
            "forward -R",
            &[
                "--connect",
                &served.tcp,
                "--token-file",
                &token,
                "-R",
                "0:127.0.0.1:9",
            ],
        ),
    ];
    let watched: Vec<(&str, Watched)> = commands
        .into_iter()
        .map(|(name, settled, command)| {
            let process = Watched::spawn(command);
            // Settled: its command started, or its forwards listening.
            process.wait_for_stdout(settled);
            (name, process)
        })
        .collect();

    let server = served.child.id();
    let cpu = |pid: u32| procfs::cpu_time(pid).expect("its CPU time");
    let before: Vec<Duration> = watched
        .iter()
        .map(|(_, process)| cpu(process.child.id()))
        .collect();
    let server_before = cpu(server);
    // A window to measure over, not a wait for anything.
    std::thread::sleep(WINDOW);
    let mut awake = Vec::new();
    for ((name, process), before) in watched.iter().zip(before) {
        let used = cpu(process.child.id()) - before;
        if used >= AWAKE {
            awake.push(format!("`capexec {name}` used {used:?}"));
        }
    }
    let used = cpu(server) - server_before;
    if used >= AWAKE {
        awake.push(format!("the server used {used:?}"));
    }
    assert!(
        awake.is_empty(),
        "CPU in {WINDOW:?} of waiting: {}",
        awake.join("; ")
    );

    for (name, process) in watched {
        kill(&process.child, libc::SIGINT);
        let done = process.finish();
        // `run` ends as its command did (SIGINT passed on); `forward`
        // with 0.
        let expected = if name.starts_with("run") { 130 } else { 0 };
        assert_eq!(done.code, expected, "{name}: {}", text(&done.stderr));
    }
}
