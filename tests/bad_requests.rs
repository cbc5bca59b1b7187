//! Bad requests, each with the exact error a client gets, against every
//! backend; the server goes on serving after each.

mod common;

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

/// The text of a failed call's error, without capnp's "remote exception: "
/// prefixes that forwarding hops add.
fn message(error: &Error) -> String {
    let text = error.to_string();
    text.rsplit("remote exception: ")
        .next()
        .unwrap_or(&text)
        .to_string()
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
    let refused = unknown.send().promise.await.map(drop).map_err(Error::Rpc);
    assert_eq!(
        refused.as_ref().map_err(message),
        Err("signal must name a signal, not `unknown`".to_string()),
        "unknown signal"
    );

    let resized = process.resize(PtySize { rows: 24, cols: 80 }).await;
    assert_eq!(
        resized.as_ref().map_err(message),
        Err("resize needs a tty process; this one runs on pipes".to_string()),
        "resize without a terminal"
    );

    let absurd_wait = process.read(0, 0, Duration::from_millis(3_600_001)).await;
    assert_eq!(
        absurd_wait.as_ref().map(drop).map_err(message),
        Err("waitMs 3600001 exceeds the maximum of 3600000".to_string()),
        "absurd waitMs"
    );

    let huge_budget = process.read(0, u32::MAX, Duration::ZERO).await;
    assert!(
        huge_budget.is_ok(),
        "a huge maxBytes is only a budget: {huge_budget:?}"
    );

    let oversized = process.write(&vec![b'x'; (4 << 20) + 1], "big").await;
    assert_eq!(
        oversized.as_ref().map_err(message),
        Err("write of 4194305 bytes exceeds the limit of 4194304 bytes per call".to_string()),
        "oversized chunk"
    );

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
    match forged.await {
        Err(Error::Refused(error)) => assert_eq!(error.kind, RefusalKind::UnknownToken),
        other => panic!("a forged restore token was accepted: {other:?}"),
    }

    // Calls pipelined on a start that failed carry the start's failure.
    let (doomed, started) =
        Command::new("/nonexistent/capexec-program").spawn_pipelined(&ctx.executor);
    let info = doomed.info().await;
    assert!(started.await.is_err());
    let info_error = info.expect_err("info on a failed start");
    assert!(
        message(&info_error).contains("program not found: /nonexistent/capexec-program"),
        "{info_error}"
    );

    process.terminate().await.expect("terminate");

    if let (common::Backend::Tcp, Some(address)) = (ctx.backend, &ctx.address) {
        let wrong = capexec::net::Token::new("not-the-token");
        let connection = capexec::net::connect(address, Some(&wrong))
            .await
            .expect("the TCP connection itself is accepted");
        let refused = Command::new("true").status(&connection.executor()).await;
        assert_eq!(
            refused.as_ref().map_err(message),
            Err("login refused: wrong token".to_string()),
            "wrong token"
        );
    }
}

backend_tests!(
    starts_are_refused_with_their_reason,
    process_calls_are_refused_with_their_reason,
);
