//! `Sandbox.readOnlyInside`: a `.git` kept read-only inside a writable
//! working directory by a read-only mount, with real escape attempts from
//! the sandboxed child (writing through a link, renaming, removing,
//! unmounting, remounting), while new entries beside it can be made. As
//! the unprivileged user (idmapped) and with `keepRoot`. CI runs as root
//! with CAP_SYS_ADMIN on a kernel with `open_tree` and `mount_setattr`,
//! so nothing here is skipped.

use crate::common;

use capexec::client::Command;
use capexec::model::{RefusalKind, Sandbox};
use common::data::TempDir;
use common::{Ctx, sh};

/// A workspace with a root-owned `.git` (a 0600 file in it) and `src`.
fn workspace() -> TempDir {
    use std::os::unix::fs::PermissionsExt;
    let ws = TempDir::new("read-only-inside");
    std::fs::create_dir_all(ws.path().join(".git/hooks")).expect("mkdir");
    std::fs::create_dir_all(ws.path().join("src")).expect("mkdir");
    std::fs::write(ws.path().join(".git/config"), "[core]\n").expect("write");
    std::fs::set_permissions(
        ws.path().join(".git/config"),
        std::fs::Permissions::from_mode(0o600),
    )
    .expect("chmod");
    ws
}

fn sandbox(ws: &TempDir, keep_root: bool) -> Sandbox {
    Sandbox {
        read_only_cwd: false,
        keep_root,
        read_only_inside: vec![ws.path().join(".git")],
        ..Sandbox::default()
    }
}

/// One line per attempt: what the child did, or `denied:` and why.
const ATTEMPTS: &str = "try() { if out=$(\"$@\" 2>&1); then echo \"done: $*\"; \
                        else echo \"denied: $* (${out##*: })\"; fi; }; \
    try sh -c 'echo top > new-top'; \
    try mkdir new-dir; \
    try sh -c 'echo src > src/file'; \
    try cat .git/config; \
    try sh -c 'echo x >> .git/config'; \
    try sh -c 'echo x > .git/hooks/pre-commit'; \
    try mv .git moved; \
    try rm -rf .git; \
    try sh -c 'ln -s .git link && echo x > link/config'; \
    try sh -c 'mv new-top .git/new-top'";

/// Unmounting `.git`, or mounting it writable again, by the system calls
/// themselves (the programs refuse non-root users before calling); then,
/// where the sandbox allows namespaces, the same from a new user and
/// mount namespace, where the process has every capability: the mount is
/// locked there. Then a write.
const MOUNT_PROBE: &str = r#"
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def said(name, result):
    print(name, "ok" if result == 0 else errno.errorcode[ctypes.get_errno()])
def attempts(where):
    said(where + " umount", libc.umount2(b".git", 2))
    said(where + " remount-rw", libc.mount(None, b".git", None, 32 | 4096, None))
    try:
        with open(".git/config", "a") as config:
            config.write("x")
        print(where, "write ok")
    except OSError as error:
        print(where, "write", errno.errorcode[error.errno])
attempts("here")
if sys.argv[1] == "namespaces":
    said("unshare", libc.unshare(0x10000000 | 0x00020000))
    attempts("inside")
"#;

async fn a_path_inside_a_writable_root_stays_read_only(ctx: Ctx) {
    for keep_root in [false, true] {
        let ws = workspace();
        let mut command = sh(ATTEMPTS);
        command
            .current_dir(ws.path())
            .sandbox(sandbox(&ws, keep_root));
        let output = command.output(&ctx.executor).await.expect("start");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(
            stdout,
            "done: sh -c echo top > new-top\n\
             done: mkdir new-dir\n\
             done: sh -c echo src > src/file\n\
             done: cat .git/config\n\
             denied: sh -c echo x >> .git/config (Read-only file system)\n\
             denied: sh -c echo x > .git/hooks/pre-commit (Read-only file system)\n\
             denied: mv .git moved (Device or resource busy)\n\
             denied: rm -rf .git (Read-only file system)\n\
             denied: sh -c ln -s .git link && echo x > link/config (Read-only file system)\n\
             denied: sh -c mv new-top .git/new-top (Read-only file system)\n",
            "keepRoot {keep_root}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(
            std::fs::read_to_string(ws.path().join(".git/config")).expect("config"),
            "[core]\n"
        );
        assert!(!ws.path().join(".git/hooks/pre-commit").exists());
        assert_eq!(
            std::fs::read_to_string(ws.path().join("new-top")).expect("made beside"),
            "top\n"
        );
    }
}

async fn the_read_only_mount_cannot_be_undone(ctx: Ctx) {
    for (keep_root, allow_namespaces) in [(false, false), (true, false), (false, true)] {
        let ws = workspace();
        let mut command = Command::new("/usr/bin/python3");
        command
            .args([
                "-c",
                MOUNT_PROBE,
                if allow_namespaces { "namespaces" } else { "-" },
            ])
            .current_dir(ws.path())
            .sandbox(Sandbox {
                allow_namespaces,
                ..sandbox(&ws, keep_root)
            });
        let output = command.output(&ctx.executor).await.expect("start");
        let mut expected =
            "here umount EPERM\nhere remount-rw EPERM\nhere write EROFS\n".to_string();
        if allow_namespaces {
            // A root server's children cannot mount or unmount at all (its
            // seccomp filter, "kernel-calls"), and the mount would be locked
            // in the new namespace anyway (made in a more privileged one).
            expected += "unshare ok\ninside umount EPERM\ninside remount-rw EPERM\n\
                         inside write EROFS\n";
        }
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            expected,
            "keepRoot {keep_root}, allowNamespaces {allow_namespaces}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(
            std::fs::read_to_string(ws.path().join(".git/config")).expect("config"),
            "[core]\n"
        );
    }
}

/// What the process was given says it, by name and path.
async fn process_info_names_the_read_only_paths(ctx: Ctx) {
    let ws = workspace();
    let mut command = Command::new("sleep");
    command
        .arg("1000")
        .current_dir(ws.path())
        .sandbox(sandbox(&ws, false));
    let process = command.spawn(&ctx.executor).await.expect("start");
    let info = process.info().await.expect("info");
    let git = std::fs::canonicalize(ws.path().join(".git")).expect("canonical");
    assert!(
        info.confinement
            .enforced
            .iter()
            .any(|name| name == "read-only-inside"),
        "{:?}",
        info.confinement
    );
    assert_eq!(
        info.confinement
            .sandbox
            .expect("sandboxed")
            .read_only_inside,
        vec![git]
    );
    process.terminate().await.expect("terminate");
    let features = capexec::client::info(&ctx.executor)
        .await
        .expect("info")
        .features;
    assert!(
        features
            .iter()
            .any(|name| name == "sandbox-read-only-inside"),
        "{features:?}"
    );
}

async fn a_missing_read_only_path_is_refused(ctx: Ctx) {
    let ws = workspace();
    let mut command = Command::new("true");
    command.current_dir(ws.path()).sandbox(Sandbox {
        read_only_cwd: false,
        read_only_inside: vec![ws.path().join(".agents")],
        ..Sandbox::default()
    });
    let error = command.output(&ctx.executor).await.expect_err("refused");
    assert_eq!(
        error.refusal_kind(),
        Some(RefusalKind::InvalidArgument),
        "{error}"
    );
    assert!(
        error.to_string().contains(&format!(
            "sandbox: readOnlyInside {}: No such file or directory",
            ws.path().join(".agents").display()
        )),
        "{error}"
    );
}

backend_tests!(
    a_path_inside_a_writable_root_stays_read_only,
    the_read_only_mount_cannot_be_undone,
    process_info_names_the_read_only_paths,
    a_missing_read_only_path_is_refused,
);
