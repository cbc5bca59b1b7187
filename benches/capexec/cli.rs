//! The `capexec` binary as people and scripts use it: whole processes and
//! whole shell pipelines, each next to the same work done locally in the
//! same run. Start-up (`--version`, `run -n -- true`), output through
//! `capexec run ... | wc -c`, input through `... | capexec run -- cat |
//! wc -c` and into `wc -c`, and 100 concurrent `run -- sleep 1`. Over a
//! Unix socket the pipelines' pipes are handed to the command; the
//! `--relay-stdio` rows keep the relay through the server measured.

use std::error::Error;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::Plan;
use crate::report::{Report, Target};
use crate::servers::{CAPEXEC, Serve, Servers};
use crate::wall::{prepared, time_process};

const SECTION: &str = "cli";

/// How many `capexec run -- sleep 1` run at once.
const CONCURRENT_SLEEPS: usize = 100;

pub fn run(plan: &Plan, servers: &Servers, report: &mut Report) -> Result<(), Box<dyn Error>> {
    start_up(plan, servers, report)?;
    stdout(plan, servers, report)?;
    stdin(plan, servers, report)?;
    concurrent(plan, servers, report)
}

/// `capexec run --connect ADDR` as words for a shell line, and the token
/// it needs in its environment.
fn remote(serve: &Serve) -> (String, Option<(&'static str, String)>) {
    let (connect, token) = serve.cli_args();
    (format!("{CAPEXEC} run {}", connect.join(" ")), token)
}

/// A start-up case: its name, the program and its arguments, the token it
/// needs, and its target.
type StartUp = (
    &'static str,
    &'static str,
    Vec<String>,
    Option<(&'static str, String)>,
    Option<Target>,
);

fn start_up(plan: &Plan, servers: &Servers, report: &mut Report) -> Result<(), Box<dyn Error>> {
    eprintln!("cli: {} start-up runs per variant", plan.cli_runs);
    let mut variants: Vec<StartUp> = vec![
        ("`true` as a process", "true", vec![], None, None),
        // The floor of any `run`: a small C program that starts `true` as
        // its child and waits for it (two processes, one fork and exec).
        (
            "`timeout 10 true` (a C supervisor of `true`: the floor)",
            "timeout",
            vec!["10".into(), "true".into()],
            None,
            None,
        ),
        (
            "`capexec --version`",
            CAPEXEC,
            vec!["--version".into()],
            None,
            None,
        ),
    ];
    for (name, serve, target) in [
        (
            "`capexec run --connect unix:… -n -- true`",
            &servers.unix,
            Some(Target::AtMost(2.5)),
        ),
        (
            "`capexec run --connect tcp:… -n -- true`",
            &servers.tcp,
            None,
        ),
    ] {
        let (connect, token) = serve.cli_args();
        let mut args = vec!["run".to_string()];
        args.extend(connect);
        args.extend(["-n", "--", "true"].map(String::from));
        variants.push((name, CAPEXEC, args, token, target));
    }
    variants.push((
        "`capexec run -n -- true` (embedded)",
        CAPEXEC,
        ["run", "-n", "--", "true"].map(String::from).to_vec(),
        None,
        Some(Target::AtMost(2.0)),
    ));
    let mut samples = vec![Vec::new(); variants.len()];
    let warmup = plan.warmup_runs.min(20);
    for round in 0..plan.cli_runs + warmup {
        for ((_, program, args, token, _), samples) in variants.iter().zip(&mut samples) {
            let took = time_process(program, args, token.as_ref())?;
            if round >= warmup {
                samples.push(took);
            }
        }
    }
    let mut samples = samples.into_iter();
    let bare = samples.next().ok_or("no samples")?;
    let baseline = report.baseline(SECTION, "`true` as a process", bare, None);
    for ((name, _, _, _, target), samples) in variants.iter().skip(1).zip(samples) {
        report.case(SECTION, *name, samples, baseline, None, *target, "");
    }
    Ok(())
}

fn stdout(plan: &Plan, servers: &Servers, report: &mut Report) -> Result<(), Box<dyn Error>> {
    let size = plan.output_bytes;
    eprintln!("cli: {} MiB of stdout into wc -c", size >> 20);
    let local = format!("head -c {size} /dev/zero | wc -c");
    let (unix, unix_token) = remote(&servers.unix);
    let (tcp, tcp_token) = remote(&servers.tcp);
    let variants = [
        (
            "`capexec run --connect unix:… -- head -c N /dev/zero | wc -c`",
            format!("{unix} -- head -c {size} /dev/zero | wc -c"),
            unix_token.clone(),
            Some(Target::AtLeastShare(0.75)),
        ),
        (
            "`capexec run --connect unix:… --relay-stdio -- head -c N /dev/zero | wc -c`",
            format!("{unix} --relay-stdio -- head -c {size} /dev/zero | wc -c"),
            unix_token.clone(),
            None,
        ),
        (
            "`capexec run --connect tcp:… -- head -c N /dev/zero | wc -c`",
            format!("{tcp} -- head -c {size} /dev/zero | wc -c"),
            tcp_token,
            Some(Target::AtLeastShare(0.7)),
        ),
    ];
    pipelines(
        report,
        "`head -c N /dev/zero | wc -c`",
        &local,
        &variants,
        size,
        plan.output_rounds,
    )
}

fn stdin(plan: &Plan, servers: &Servers, report: &mut Report) -> Result<(), Box<dyn Error>> {
    let size = plan.stdin_bytes;
    eprintln!("cli: {} MiB of stdin", size >> 20);
    let (unix, unix_token) = remote(&servers.unix);
    let (tcp, tcp_token) = remote(&servers.tcp);
    let through_cat = [
        (
            "`head -c N /dev/zero | capexec run --connect unix:… -- cat | wc -c`",
            format!("head -c {size} /dev/zero | {unix} -- cat | wc -c"),
            unix_token.clone(),
            Some(Target::AtLeastShare(0.6)),
        ),
        (
            "`head -c N /dev/zero | capexec run --connect unix:… --relay-stdio -- cat | wc -c`",
            format!("head -c {size} /dev/zero | {unix} --relay-stdio -- cat | wc -c"),
            unix_token.clone(),
            None,
        ),
        (
            "`head -c N /dev/zero | capexec run --connect tcp:… -- cat | wc -c`",
            format!("head -c {size} /dev/zero | {tcp} -- cat | wc -c"),
            tcp_token.clone(),
            None,
        ),
    ];
    pipelines(
        report,
        "`head -c N /dev/zero | cat | wc -c`",
        &format!("head -c {size} /dev/zero | cat | wc -c"),
        &through_cat,
        size,
        plan.stdin_rounds,
    )?;
    let into_wc = [
        (
            "`head -c N /dev/zero | capexec run --connect unix:… -- wc -c`",
            format!("head -c {size} /dev/zero | {unix} -- wc -c"),
            unix_token.clone(),
            Some(Target::AtLeastShare(0.6)),
        ),
        (
            "`head -c N /dev/zero | capexec run --connect unix:… --relay-stdio -- wc -c`",
            format!("head -c {size} /dev/zero | {unix} --relay-stdio -- wc -c"),
            unix_token,
            None,
        ),
        (
            "`head -c N /dev/zero | capexec run --connect tcp:… -- wc -c`",
            format!("head -c {size} /dev/zero | {tcp} -- wc -c"),
            tcp_token,
            None,
        ),
    ];
    pipelines(
        report,
        "`head -c N /dev/zero | wc -c`",
        &format!("head -c {size} /dev/zero | wc -c"),
        &into_wc,
        size,
        plan.stdin_rounds,
    )
}

type Variant = (
    &'static str,
    String,
    Option<(&'static str, String)>,
    Option<Target>,
);

/// Times the `local` shell line and each variant, round by round; every
/// line must print `size` (the count `wc -c` makes), or the run fails.
fn pipelines(
    report: &mut Report,
    local_name: &'static str,
    local: &str,
    variants: &[Variant],
    size: u64,
    rounds: usize,
) -> Result<(), Box<dyn Error>> {
    let mut bare = Vec::new();
    let mut samples = vec![Vec::new(); variants.len()];
    for _ in 0..rounds {
        bare.push(time_counted(local, None, size)?);
        for ((_, line, token, _), samples) in variants.iter().zip(&mut samples) {
            samples.push(time_counted(line, token.as_ref(), size)?);
        }
    }
    let baseline = report.baseline(SECTION, local_name, bare, Some(size));
    for ((name, _, _, target), samples) in variants.iter().zip(samples) {
        report.case(SECTION, *name, samples, baseline, Some(size), *target, "");
    }
    Ok(())
}

/// Runs `line` under `sh -c` and times it; it must succeed and print
/// exactly `size`.
fn time_counted(
    line: &str,
    env: Option<&(&'static str, String)>,
    size: u64,
) -> Result<Duration, Box<dyn Error>> {
    let mut command = prepared("sh", &["-c", line], env, Stdio::piped());
    let started = Instant::now();
    let output = command.output()?;
    let took = started.elapsed();
    let printed = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() || printed.trim() != size.to_string() {
        return Err(format!("`{line}`: {}, printed {printed:?}", output.status).into());
    }
    Ok(took)
}

/// 100 `capexec run --connect unix:… -n -- sleep 1` started at once, until
/// the last has exited, next to 100 local `sleep 1`.
fn concurrent(plan: &Plan, servers: &Servers, report: &mut Report) -> Result<(), Box<dyn Error>> {
    eprintln!("cli: {CONCURRENT_SLEEPS} concurrent `run -- sleep 1`");
    let (connect, token) = servers.unix.cli_args();
    let mut remote = vec!["run".to_string()];
    remote.extend(connect);
    remote.extend(["-n", "--", "sleep", "1"].map(String::from));
    let rounds = if plan.quick { 1 } else { 3 };
    let (mut bare, mut through) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        bare.push(all_at_once("sleep", &["1".to_string()], None)?);
        through.push(all_at_once(CAPEXEC, &remote, token.as_ref())?);
    }
    let baseline = report.baseline(SECTION, "100 concurrent `sleep 1`", bare, None);
    report.case(
        SECTION,
        "100 concurrent `capexec run --connect unix:… -- sleep 1`",
        through,
        baseline,
        None,
        // The target: all done within 1.2 s of wall time.
        Some(Target::Within(Duration::from_millis(1200))),
        "",
    );
    Ok(())
}

/// Starts [`CONCURRENT_SLEEPS`] copies of `program args` and waits for all;
/// any failing copy fails the run.
fn all_at_once(
    program: &str,
    args: &[String],
    env: Option<&(&'static str, String)>,
) -> Result<Duration, Box<dyn Error>> {
    let started = Instant::now();
    let mut children: Vec<Child> = Vec::with_capacity(CONCURRENT_SLEEPS);
    for _ in 0..CONCURRENT_SLEEPS {
        children.push(prepared(program, args, env, Stdio::null()).spawn()?);
    }
    for mut child in children {
        let status = child.wait()?;
        if !status.success() {
            return Err(format!("{program} {args:?}: {status}").into());
        }
    }
    Ok(started.elapsed())
}
