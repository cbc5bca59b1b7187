//! Bad requests, each with the exact error a client gets, against every
//! backend; the server goes on serving after each.

use crate::common;

use std::time::Duration;

use capexec::capexec_capnp::Signal as WireSignal;
use capexec::client::{self, Command, Error, RemoteProcess, Stdin};
use capexec::model::{ExitStatus, PtySize, RefusalKind, WriteStatus};
use common::{Ctx, sh};

/// The start's structured failure.
async fn start_error(ctx: &Ctx, command: &Command) -> (RefusalKind, String) {
    match command.spawn(&ctx.executor).await {
        Err(Error::Refused(error)) => (error.kind, error.message),
        Err(other) => panic!("expected a start error, got {other}"),
        Ok(_) => panic!("the start succeeded"),
    }
}

/// A refused call's kind and message: every refusal carries its tag.
fn refused<T: std::fmt::Debug>(outcome: Result<T, Error>) -> (RefusalKind, String) {
    match outcome.expect_err("the call was accepted") {
        Error::Refused(refusal) => (refusal.kind, refusal.message),
        other => panic!("an untagged error: {other:?}"),
    }
}

fn invalid(message: &str) -> (RefusalKind, String) {
    (RefusalKind::InvalidArgument, message.to_string())
}

async fn running(ctx: &Ctx, script: &str, stdin: Stdin) -> RemoteProcess {
    let mut command = sh(script);
    command.stdin(stdin);
    command.spawn(&ctx.executor).await.expect("start")
}

async fn starts_are_refused_with_their_reason(ctx: Ctx) {
    let dir = common::data::TempDir::new("bad-requests");
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"").expect("write");
    let missing = dir.path().join("missing");

    let mut nul_arg = Command::new("echo");
    nul_arg.arg("a\0b");
    let mut nul_env = Command::new("true");
    nul_env.env("CAPEXEC_BAD", "x\0y");
    let mut bad_name = Command::new("true");
    bad_name.env("A=B", "c");
    let mut missing_cwd = Command::new("true");
    missing_cwd.current_dir(&missing);
    let mut file_cwd = Command::new("true");
    file_cwd.current_dir(&file);
    let mut huge_env = Command::new("true");
    huge_env.env("CAPEXEC_HUGE", "x".repeat(1 << 20));
    let mut empty_pty = Command::new("true");
    empty_pty.tty(PtySize { rows: 0, cols: 80 });

    let cases: Vec<(&str, Command, RefusalKind, String)> = vec![
        (
            "empty argv",
            Command::new(""),
            RefusalKind::InvalidArgument,
            "argv[0] (the program) must not be empty".into(),
        ),
        (
            "NUL in argv",
            nul_arg,
            RefusalKind::InvalidArgument,
            "argv[1] contains a NUL byte".into(),
        ),
        (
            "NUL in an environment value",
            nul_env,
            RefusalKind::InvalidArgument,
            "the value of environment variable CAPEXEC_BAD contains a NUL byte".into(),
        ),
        (
            "= in an environment name",
            bad_name,
            RefusalKind::InvalidArgument,
            "environment variable name \"A=B\" contains '='".into(),
        ),
        (
            "a cwd that does not exist",
            missing_cwd,
            RefusalKind::BadCwd,
            format!(
                "working directory {}: No such file or directory",
                missing.display()
            ),
        ),
        (
            "a cwd that is a file",
            file_cwd,
            RefusalKind::BadCwd,
            format!("working directory {} is not a directory", file.display()),
        ),
        (
            "argv and environment over the limit",
            huge_env,
            RefusalKind::LimitReached,
            format!(
                "argv and environment take {} bytes; the limit is 1048576",
                5 + "CAPEXEC_HUGE".len() + (1 << 20) + 2
            ),
        ),
        (
            "an empty terminal",
            empty_pty,
            RefusalKind::InvalidArgument,
            "pty size 0x80 is empty; rows and cols must be at least 1".into(),
        ),
        (
            "a program that does not exist",
            Command::new("/nonexistent/capexec-program"),
            RefusalKind::ProgramNotFound,
            "program not found: /nonexistent/capexec-program".into(),
        ),
    ];
    for (what, command, kind, text) in cases {
        assert_eq!(start_error(&ctx, &command).await, (kind, text), "{what}");
    }
    // Still serving.
    let status = Command::new("true").status(&ctx.executor).await;
    assert_eq!(
        status.expect("served after the bad starts"),
        ExitStatus::Code(0)
    );
}

async fn process_calls_are_refused_with_their_reason(ctx: Ctx) {
    let process = running(&ctx, "exec sleep 1000", Stdin::Piped).await;

    let mut unknown = process.capability().signal_request();
    unknown.get().set_signal(WireSignal::Unknown);
    assert_eq!(
        refused(unknown.send().promise.await.map(drop).map_err(Error::from)),
        invalid("signal must name a signal, not `unknown`"),
        "unknown signal"
    );

    assert_eq!(
        refused(process.resize(PtySize { rows: 24, cols: 80 }).await),
        invalid("resize needs a tty process; this one runs on pipes"),
        "resize without a terminal"
    );

    assert_eq!(
        refused(process.read(0, 0, Duration::from_millis(3_600_001)).await),
        invalid("waitMs 3600001 exceeds the maximum of 3600000"),
        "absurd waitMs"
    );

    let newest = process.info().await.expect("info").next_seq - 1;
    let past = newest + 5;
    let ahead = format!("afterSeq {past} is past the newest event of the process ({newest})");
    assert_eq!(
        refused(process.read(past, 0, Duration::ZERO).await),
        invalid(&ahead),
        "read past the newest event"
    );
    assert_eq!(
        refused(process.events(past).await.map(drop)),
        invalid(&ahead),
        "subscribe past the newest event"
    );

    let huge_budget = process.read(0, u32::MAX, Duration::ZERO).await;
    assert!(
        huge_budget.is_ok(),
        "a huge maxBytes is only a budget: {huge_budget:?}"
    );

    assert_eq!(
        refused(process.write(&vec![b'x'; (4 << 20) + 1], "big").await),
        invalid("write of 4194305 bytes exceeds the limit of 4194304 bytes per call"),
        "oversized chunk"
    );
    assert_eq!(
        refused(process.write(b"x", "").await),
        invalid("writeId must not be empty"),
        "empty write id"
    );
    // Ids are remembered whole (the last 4096 per process): bounded.
    let longest = "i".repeat(256);
    assert!(process.write(b"", &longest).await.is_ok(), "a 256-byte id");
    assert_eq!(
        refused(process.write(b"x", &"i".repeat(257)).await),
        invalid("writeId of 257 bytes exceeds the limit of 256 bytes"),
        "a write id over 256 bytes"
    );

    // The client library rounds a zero grace up; the wire takes any.
    for grace in [0, 86_401] {
        let mut request = process.capability().detachable_request();
        request.get().set_grace_secs(grace);
        assert_eq!(
            refused(request.send().promise.await.map(drop).map_err(Error::from)),
            invalid(&format!("graceSecs must be 1 to 86400, got {grace}")),
            "graceSecs {grace}"
        );
    }

    process.close_stdin().await.expect("close stdin");
    assert_eq!(
        process
            .write(b"late\n", "after-close")
            .await
            .expect("answered"),
        WriteStatus::StdinClosed,
        "write after close"
    );

    let (_, forged) = client::restore(&ctx.executor, &"0".repeat(64));
    assert_eq!(
        refused(forged.await).0,
        RefusalKind::UnknownToken,
        "a forged restore token"
    );

    // Calls pipelined on a start that failed carry the start's failure.
    let (doomed, started) =
        Command::new("/nonexistent/capexec-program").spawn_pipelined(&ctx.executor);
    let info = doomed.info().await;
    assert!(started.await.is_err());
    assert_eq!(
        refused(info),
        (
            RefusalKind::ProgramNotFound,
            "program not found: /nonexistent/capexec-program".to_string()
        ),
        "info on a failed start"
    );

    process.terminate().await.expect("terminate");

    let mut tty = Command::new("sleep");
    tty.arg("1000").tty(PtySize { rows: 24, cols: 80 });
    let on_terminal = tty.spawn(&ctx.executor).await.expect("start on a terminal");
    assert_eq!(
        refused(on_terminal.resize(PtySize { rows: 0, cols: 0 }).await),
        invalid("terminal size 0x0 is empty; rows and cols must be at least 1"),
        "a 0x0 terminal"
    );
    on_terminal.terminate().await.expect("terminate");

    if let (common::Backend::Tcp, Some(address)) = (ctx.backend, &ctx.address) {
        let wrong = capexec::net::Token::new("not-the-token");
        let connection = capexec::net::connect(address, Some(&wrong))
            .await
            .expect("the TCP connection itself is accepted");
        assert_eq!(
            refused(Command::new("true").status(&connection.executor()).await),
            (
                RefusalKind::Unauthenticated,
                "login refused: wrong token".to_string()
            ),
            "wrong token"
        );
    }
}

backend_tests!(
    starts_are_refused_with_their_reason,
    process_calls_are_refused_with_their_reason,
);
