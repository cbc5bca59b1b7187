//! Terminal processes: the process contract on a pseudo-terminal, for every
//! backend.

use crate::common;

use std::time::Duration;

use capexec::client::{Command, RemoteProcess};
use capexec::model::{EventBody, ExitStatus, OutputStream, PtySize, WriteStatus};
use common::{
    Ctx, exit_of, output_bytes, procfs, read_from, read_until_closed, read_until_output_contains,
};

fn tty(script: &str, rows: u16, cols: u16) -> Command {
    let mut command = Command::new("sh");
    command.args(["-c", script]).tty(PtySize { rows, cols });
    command
}

/// An interactive shell with job control and a plain prompt.
fn interactive_shell() -> Command {
    let mut command = Command::new("sh");
    command
        .arg("-i")
        .env("PS1", "$ ")
        .env("ENV", "/dev/null")
        .tty(PtySize { rows: 24, cols: 80 });
    command
}

async fn type_line(process: &RemoteProcess, line: &str, id: &str) {
    assert_eq!(
        process.write(line.as_bytes(), id).await.expect("write"),
        WriteStatus::Accepted
    );
}

/// Process-table fields of `pid`: (comm, state, pgrp, session, tpgid).
fn stat(pid: u32) -> Option<(String, String, i32, i32, i32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text[open + 1..close].to_string();
    let fields: Vec<&str> = text[close + 1..].split_whitespace().collect();
    Some((
        comm,
        fields[0].to_string(),
        fields[2].parse().ok()?,
        fields[3].parse().ok()?,
        fields[5].parse().ok()?,
    ))
}

/// Waits until a process named `comm` runs in the foreground of session
/// `sid`'s terminal.
async fn wait_for_foreground(sid: u32, comm: &str) -> u32 {
    let what = format!("a foreground {comm} in session {sid}");
    common::eventually_async(&what, async || {
        std::fs::read_dir("/proc")
            .expect("/proc")
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
            .find(|&pid| {
                stat(pid).is_some_and(|(name, state, pgrp, session, tpgid)| {
                    name == comm && state != "Z" && session == sid as i32 && pgrp == tpgid
                })
            })
    })
    .await
}

async fn child_sees_a_terminal_of_the_start_size(ctx: Ctx) {
    let process = tty("test -t 0 && test -t 1 && test -t 2 && stty size", 31, 97)
        .spawn(&ctx.executor)
        .await
        .expect("spawn");
    let events = read_until_closed(&process).await;
    assert_eq!(output_bytes(&events, None), b"31 97\r\n");
    assert_eq!(exit_of(&events), Some(ExitStatus::Code(0)));
    assert!(events.iter().all(|e| !matches!(
        &e.body,
        EventBody::Output { stream, .. } if *stream != OutputStream::Pty
    )));
    assert!(process.info().await.expect("info").tty);
}

async fn resize_changes_the_size_and_signals_winch(ctx: Ctx) {
    let script = "trap 'stty size; exit 3' WINCH; stty size; while :; do sleep 0.01; done";
    let process = tty(script, 24, 80)
        .spawn(&ctx.executor)
        .await
        .expect("spawn");
    let (after, _) = read_until_output_contains(&process, "24 80\r\n").await;
    process
        .resize(PtySize {
            rows: 50,
            cols: 132,
        })
        .await
        .expect("resize");
    let events = read_from(&process, after).await;
    assert_eq!(output_bytes(&events, None), b"50 132\r\n");
    assert_eq!(exit_of(&events), Some(ExitStatus::Code(3)));
}

async fn resize_is_refused_for_pipes_and_empty_sizes(ctx: Ctx) {
    let pipes = Command::new("sleep")
        .arg("1000")
        .spawn(&ctx.executor)
        .await
        .expect("spawn");
    let error = pipes
        .resize(PtySize { rows: 10, cols: 10 })
        .await
        .expect_err("not a terminal");
    assert_eq!(
        error.to_string(),
        "resize needs a tty process; this one runs on pipes"
    );
    let terminal = tty("sleep 1000", 24, 80)
        .spawn(&ctx.executor)
        .await
        .expect("spawn");
    let error = terminal
        .resize(PtySize { rows: 0, cols: 80 })
        .await
        .expect_err("empty");
    assert!(error.to_string().contains("is empty"), "{error}");
}

async fn a_typed_line_is_echoed_and_read(ctx: Ctx) {
    let process = tty("IFS= read -r line; echo \"got:$line\"", 24, 80)
        .spawn(&ctx.executor)
        .await
        .expect("spawn");
    type_line(&process, "hello\n", "w1").await;
    let events = read_until_closed(&process).await;
    assert_eq!(output_bytes(&events, None), b"hello\r\ngot:hello\r\n");
    assert_eq!(exit_of(&events), Some(ExitStatus::Code(0)));
}

async fn close_stdin_sends_end_of_file(ctx: Ctx) {
    let process = tty("cat; echo \"done-$?\"", 24, 80)
        .spawn(&ctx.executor)
        .await
        .expect("spawn");
    type_line(&process, "abc\n", "w1").await;
    process.close_stdin().await.expect("close stdin");
    let events = read_until_closed(&process).await;
    // The terminal echoes the line, cat repeats it, then reads end-of-file.
    assert_eq!(output_bytes(&events, None), b"abc\r\nabc\r\ndone-0\r\n");
}

/// Ctrl-C typed into an interactive shell interrupts its foreground job, not
/// the shell; the shell's own exit code comes through.
async fn ctrl_c_interrupts_the_foreground_job(ctx: Ctx) {
    let process = interactive_shell()
        .spawn(&ctx.executor)
        .await
        .expect("spawn");
    let sid = process.info().await.expect("info").pid;
    type_line(&process, "sleep 1000\n", "w1").await;
    let sleep = wait_for_foreground(sid, "sleep").await;
    type_line(&process, "\x03", "w2").await;
    procfs::wait_gone(sleep).await;
    // The shell survived and saw its job die of SIGINT (128 + 2).
    type_line(&process, "echo \"status-$?\"\n", "w3").await;
    read_until_output_contains(&process, "status-130\r\n").await;
    type_line(&process, "exit 5\n", "w4").await;
    let events = read_from(&process, 0).await;
    assert_eq!(exit_of(&events), Some(ExitStatus::Code(5)));
}

/// Dropping the Process ends the whole session: also a background job that
/// job control moved into a process group of its own.
async fn dropping_the_process_kills_the_session(ctx: Ctx) {
    let process = interactive_shell()
        .spawn(&ctx.executor)
        .await
        .expect("spawn");
    let shell = process.info().await.expect("info").pid;
    type_line(&process, "sleep 1000 & echo \"bg-$!-\"\n", "w1").await;
    let (_, text) = read_until_output_contains(&process, "-\r\n").await;
    let background = common::pid_after(&text, "bg-");
    let (_, _, pgrp, session, _) = stat(background).expect("background job");
    assert_eq!(session, shell as i32);
    assert_ne!(
        pgrp, shell as i32,
        "job control gives the job its own group"
    );
    drop(process);
    procfs::wait_gone(shell).await;
    procfs::wait_gone(background).await;
}

/// Releasing a terminal process ends every job of its session, also one
/// in a group of its own that ignores SIGTERM.
async fn dropping_the_process_kills_session_jobs_that_ignore_sigterm(ctx: Ctx) {
    let script = "set -m; sh -c 'trap \"\" TERM; exec sleep 1000' & echo \"job-$!-\"; wait";
    let process = tty(script, 24, 80)
        .spawn(&ctx.executor)
        .await
        .expect("spawn");
    let shell = process.info().await.expect("info").pid;
    let (_, text) = read_until_output_contains(&process, "-\r\n").await;
    let job = common::pid_after(&text, "job-");
    let (_, _, pgrp, _, _) = stat(job).expect("job");
    assert_ne!(pgrp, shell as i32, "the job has a group of its own");
    drop(process);
    procfs::wait_gone(shell).await;
    procfs::wait_gone(job).await;
}

/// On a terminal too, the exit event follows the child's last output.
async fn exit_follows_the_last_output(ctx: Ctx) {
    for _ in 0..300 {
        let process = tty("printf 'last words'; exit 3", 24, 80)
            .spawn(&ctx.executor)
            .await
            .expect("spawn");
        let events = read_until_closed(&process).await;
        let kinds: Vec<&str> = events
            .iter()
            .map(|event| match event.body {
                EventBody::Output { .. } => "output",
                EventBody::Exited(_) => "exited",
                EventBody::Closed => "closed",
                EventBody::Gap { .. } => "gap",
            })
            .collect();
        assert_eq!(kinds, ["output", "exited", "closed"], "{events:?}");
    }
}

async fn exit_codes_and_signals_come_through(ctx: Ctx) {
    let process = tty("printf 'last words'; exit 42", 24, 80)
        .spawn(&ctx.executor)
        .await
        .expect("spawn");
    let events = read_until_closed(&process).await;
    assert_eq!(output_bytes(&events, None), b"last words");
    assert_eq!(exit_of(&events), Some(ExitStatus::Code(42)));
    let killed = tty("kill -TERM $$", 24, 80)
        .spawn(&ctx.executor)
        .await
        .expect("spawn");
    assert!(matches!(
        killed.wait().await.expect("wait"),
        ExitStatus::Killed { number, .. } if number == libc::SIGTERM
    ));
}

/// Lossless mode holds for terminals too: 3 MiB through a raw terminal
/// and a slow reader arrive intact.
async fn lossless_output_through_a_terminal(ctx: Ctx) {
    let dir = common::data::TempDir::new("tty-lossless");
    let file = dir.path().join("data");
    let len = 3 << 20;
    common::data::write_pattern_file(&file, 77, len);
    let mut command = tty("stty raw -echo; cat \"$1\"", 24, 80);
    command
        .arg("sh")
        .arg(&file)
        .flow(capexec::model::Flow::Lossless);
    let process = command.spawn(&ctx.executor).await.expect("spawn");
    let mut checker = common::data::PatternChecker::new(77);
    let mut after = 0;
    loop {
        let outcome = process
            .read(after, 16 * 1024, Duration::from_secs(10))
            .await
            .expect("read");
        for event in &outcome.events {
            match &event.body {
                EventBody::Output { data, .. } => checker.check(data),
                EventBody::Gap { .. } => panic!("lossless mode lost {event:?}"),
                _ => {}
            }
        }
        after = outcome.next_seq - 1;
        if outcome.events.iter().any(|e| e.body == EventBody::Closed) {
            break;
        }
    }
    assert_eq!(checker.checked, len as u64);
}

backend_tests!(
    child_sees_a_terminal_of_the_start_size,
    resize_changes_the_size_and_signals_winch,
    resize_is_refused_for_pipes_and_empty_sizes,
    a_typed_line_is_echoed_and_read,
    close_stdin_sends_end_of_file,
    ctrl_c_interrupts_the_foreground_job,
    dropping_the_process_kills_the_session,
    exit_codes_and_signals_come_through,
    lossless_output_through_a_terminal,
    dropping_the_process_kills_session_jobs_that_ignore_sigterm,
    exit_follows_the_last_output,
);
