//! Terminal processes: the same contract, on a pseudo-terminal, for every
//! backend.

mod common;

use capexec::client::Command;
use capexec::model::{EventBody, ExitStatus, PtySize};
use common::{
    Ctx, exit_of, output_bytes, read_from, read_until_closed, read_until_output_contains,
};

fn tty(script: &str, rows: u16, cols: u16) -> Command {
    let mut command = Command::new("sh");
    command.args(["-c", script]).tty(PtySize { rows, cols });
    command
}

async fn child_sees_a_terminal_of_the_start_size(ctx: Ctx) {
    let process = tty("test -t 0 && test -t 1 && stty size", 31, 97)
        .spawn(&ctx.executor)
        .await
        .expect("spawn");
    let events = read_until_closed(&process).await;
    assert_eq!(output_bytes(&events, None), b"31 97\r\n");
    assert_eq!(exit_of(&events), Some(ExitStatus::Code(0)));
    assert!(events.iter().all(|e| !matches!(
        &e.body,
        EventBody::Output { stream, .. } if *stream != capexec::model::OutputStream::Pty
    )));
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

backend_tests!(
    child_sees_a_terminal_of_the_start_size,
    resize_changes_the_size_and_signals_winch,
);
