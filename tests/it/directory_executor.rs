//! `Directory.executor`: a directory handed to an agent confines what it
//! runs. Processes start in the directory, write only there (nowhere for a
//! read-only directory), have no network, cannot be moved outside it with
//! `cwd`, and the executor's own directories stay beneath it. Real escape
//! attempts, on every backend (through a chain too, pipelined).

use crate::common;

use capexec::client::{Command, Directory};
use capexec::model::RefusalKind;
use common::data::TempDir;
use common::{Ctx, sh};

/// Runs `script` with `sh -c` on `executor`: exit status, stdout, stderr.
async fn run(
    executor: &capexec::capexec_capnp::executor::Client,
    command: &Command,
) -> (i32, String, String) {
    let output = command.output(executor).await.expect("start");
    (
        output.exit.status.shell_code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

async fn a_directorys_executor_runs_and_writes_only_inside_it(ctx: Ctx) {
    let outer = TempDir::new("direxec");
    let work = outer.path().join("work");
    std::fs::create_dir(&work).expect("mkdir");
    let canonical = work.canonicalize().expect("canonical");
    let outside = TempDir::new("direxec-outside");
    // Pipelined: the directory, its executor and the start in one go.
    let executor = Directory::open(&ctx.executor, &work).executor();
    let script = format!(
        "pwd; echo in > here && cat here; mkdir -p sub/deeper && echo ok; \
         if echo out > ../escaped; then echo wrote-parent; fi; \
         if echo out > {outside}/f; then echo wrote-outside; fi; \
         if ln -s / sub/root && echo out > sub/root/tmp/direxec-$$; then echo wrote-via-link; fi; \
         echo end",
        outside = outside.path().display()
    );
    let (code, stdout, stderr) = run(&executor, &sh(&script)).await;
    assert_eq!(
        (code, stdout.as_str()),
        (
            0,
            format!("{}\nin\nok\nend\n", canonical.display()).as_str()
        ),
        "{stderr}"
    );
    assert_eq!(stderr.matches("Permission denied").count(), 3, "{stderr}");
    assert_eq!(std::fs::read(work.join("here")).expect("here"), b"in\n");
    assert!(!outer.path().join("escaped").exists());
    assert!(!outside.path().join("f").exists());

    // A relative working directory is taken from the directory.
    let mut command = sh("pwd");
    command.current_dir("sub/deeper");
    let (code, stdout, stderr) = run(&executor, &command).await;
    assert_eq!(
        (code, stdout),
        (0, format!("{}\n", canonical.join("sub/deeper").display())),
        "{stderr}"
    );
}

async fn a_directorys_executor_cannot_leave_it(ctx: Ctx) {
    let outer = TempDir::new("direxec");
    let work = outer.path().join("work");
    std::fs::create_dir(&work).expect("mkdir");
    let executor = Directory::open(&ctx.executor, &work).executor();
    for cwd in [outer.path().to_path_buf(), "..".into(), "/".into()] {
        let mut command = sh("pwd");
        command.current_dir(&cwd);
        let error = command.output(&executor).await.expect_err("refused");
        assert_eq!(
            error.refusal_kind(),
            Some(RefusalKind::NotAllowed),
            "cwd {cwd:?}: {error}"
        );
    }
    // Its own directories stay beneath the directory.
    let error = Directory::open(&executor, "..")
        .metadata("")
        .await
        .expect_err("refused");
    assert_eq!(
        error.refusal_kind(),
        Some(RefusalKind::NotAllowed),
        "{error}"
    );
    let inner = Directory::open(&executor, ".").info().await.expect("info");
    assert_eq!(inner.path, work.canonicalize().expect("canonical"));
    // No network: a TCP listener of ours is out of reach.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let script =
        format!("if exec 3<>/dev/tcp/127.0.0.1/{port}; then echo connected; else echo refused; fi");
    let mut command = Command::new("bash");
    command.args(["-c", &script]);
    let (code, stdout, stderr) = run(&executor, &command).await;
    assert_eq!((code, stdout.as_str()), (0, "refused\n"), "{stderr}");
}

async fn a_read_only_directorys_executor_writes_nowhere(ctx: Ctx) {
    let work = TempDir::new("direxec-ro");
    std::fs::write(work.path().join("f"), "data\n").expect("write");
    let executor = Directory::open(&ctx.executor, work.path())
        .read_only()
        .executor();
    let (code, stdout, stderr) = run(
        &executor,
        &sh("cat f; if echo x > g; then echo wrote; fi; if rm f; then echo removed; fi; echo end"),
    )
    .await;
    assert_eq!((code, stdout.as_str()), (0, "data\nend\n"), "{stderr}");
    assert!(!work.path().join("g").exists());
    assert!(work.path().join("f").exists());
}

backend_tests!(
    a_directorys_executor_runs_and_writes_only_inside_it,
    a_directorys_executor_cannot_leave_it,
    a_read_only_directorys_executor_writes_nowhere,
);
