//! A start's working directory is opened once, and the start runs in what
//! was opened: a path swapped for a link out between the check and the
//! child (the race a peer's own command can run against a confined
//! executor) never starts it elsewhere, and never makes the other
//! directory a root of its sandbox.

use std::path::Path;

use capexec::engine::{Engine, GivenStdio, WorkingDir};
use capexec::model::{ExitStatus, RefusalKind, Sandbox, StartSpec};

use crate::common::data::TempDir;

fn current_thread<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(future)
}

/// `inside/d` (holding `secret`) and `outside` (holding its own), `d`
/// opened (its path read too when `checked`, as a cwdRoots check reads
/// it), then moved to `inside/moved` and replaced by a link to `outside`:
/// the state a start meets when the swap wins the race.
fn swapped(temp: &TempDir, checked: bool) -> (WorkingDir, std::path::PathBuf, std::path::PathBuf) {
    let base = std::fs::canonicalize(temp.path()).expect("canonical");
    let (inside, outside) = (base.join("inside"), base.join("outside"));
    std::fs::create_dir_all(inside.join("d")).expect("mkdir");
    std::fs::create_dir(&outside).expect("mkdir");
    std::fs::write(inside.join("d/secret"), b"INSIDE\n").expect("write");
    std::fs::write(outside.join("secret"), b"OUTSIDE\n").expect("write");
    let opened = WorkingDir::open(&inside.join("d")).expect("opened");
    if checked {
        assert_eq!(opened.path().expect("a path"), inside.join("d"));
    }
    std::fs::rename(inside.join("d"), inside.join("moved")).expect("mv");
    std::os::unix::fs::symlink(&outside, inside.join("d")).expect("ln");
    (opened, inside, outside)
}

fn spec_in(cwd: &Path, script: &str) -> StartSpec {
    let mut spec = StartSpec::new(["/bin/sh", "-c", script]);
    spec.cwd = Some(cwd.to_path_buf());
    spec
}

#[test]
fn an_unconfined_start_runs_in_the_directory_that_was_opened() {
    let temp = TempDir::new("cwd-opened");
    let (opened, inside, outside) = swapped(&temp, false);
    current_thread(async {
        let engine = Engine::default();
        let spec = spec_in(&inside.join("d"), "pwd -P > where; cat secret >> where");
        let owner = engine
            .start_in(&spec, GivenStdio::default(), Some(opened))
            .expect("started");
        owner.handle().wait_exited().await;
        assert_eq!(
            owner.handle().exit().map(|exit| exit.status),
            Some(ExitStatus::Code(0))
        );
    });
    let written = std::fs::read_to_string(inside.join("moved/where")).expect("written there");
    assert_eq!(
        written,
        format!("{}\nINSIDE\n", inside.join("moved").display())
    );
    assert!(!outside.join("where").exists());
}

/// A sandboxed start whose directory's path was not read before: the
/// path is read from the opened directory (where it is now), and the
/// sandbox's rule names it.
#[test]
fn a_sandboxed_start_runs_in_the_opened_directory_wherever_it_moved() {
    let temp = TempDir::new("cwd-moved");
    let (opened, inside, outside) = swapped(&temp, false);
    current_thread(async {
        let engine = Engine::default();
        let mut spec = spec_in(
            &inside.join("d"),
            "pwd -P > where; cat secret >> where; cat ../../outside/secret >> where 2>&1; \
             echo PWNED > ../../outside/planted",
        );
        spec.sandbox = Some(Sandbox::default());
        let owner = engine
            .start_in(&spec, GivenStdio::default(), Some(opened))
            .expect("started");
        owner.handle().wait_exited().await;
    });
    let written = std::fs::read_to_string(inside.join("moved/where")).expect("written there");
    assert!(
        written.starts_with(&format!("{}\nINSIDE\n", inside.join("moved").display())),
        "{written}"
    );
    assert!(!written.contains("OUTSIDE"), "{written}");
    assert!(!outside.join("where").exists() && !outside.join("planted").exists());
}

/// A sandboxed start whose directory cwdRoots checked (its path read)
/// and that was swapped since: the sandbox's rule would name another
/// directory, so the start is refused.
#[test]
fn a_sandboxed_start_whose_directory_was_swapped_is_refused_not_run_elsewhere() {
    let temp = TempDir::new("cwd-swapped");
    let (opened, inside, outside) = swapped(&temp, true);
    current_thread(async {
        let engine = Engine::default();
        let mut spec = spec_in(
            &inside.join("d"),
            "cat secret > where; echo PWNED > planted",
        );
        spec.sandbox = Some(Sandbox::default());
        let refused = engine
            .start_in(&spec, GivenStdio::default(), Some(opened))
            .err()
            .expect("refused");
        assert_eq!(refused.kind, RefusalKind::BadCwd, "{refused}");
        assert!(
            refused
                .message
                .contains("it changed while the start was prepared"),
            "{refused}"
        );
    });
    assert!(!outside.join("where").exists() && !outside.join("planted").exists());
    assert!(!inside.join("moved/where").exists());
}
