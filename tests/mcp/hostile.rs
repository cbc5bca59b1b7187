//! The agent as the adversary: every way out of the root that a tool call
//! can try (paths, symlinks and hard links a command makes, a symlink
//! swapped in mid-write, FIFOs, the root itself, /proc, sockets, other
//! sessions' processes, the capexec server's own socket), each asserting
//! that the attempt fails and that nothing outside the root changed
//! (byte-identical, no file created); and the attempts to exhaust or
//! mislead the server (daemonized and many processes, huge output, closed
//! streams, nested JSON, thousands of calls), each asserting that it stays
//! up, bounded and truthful.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::client::{Backend, Mcp, bytes, gone, pid_in};
use crate::common::cli::{BIN, Served};
use crate::common::data::TempDir;
use crate::common::eventually;

crate::mcp_backend_tests!(hostile:
    paths_outside_the_root_are_refused_by_every_file_tool,
    symlinks_a_command_makes_lead_no_file_tool_out,
    a_symlink_swapped_in_during_writes_never_lets_one_out,
    a_working_directory_swapped_for_a_link_writes_nothing_outside,
    hard_links_out_cannot_be_made_and_one_found_is_replaced_not_written_through,
    the_root_cannot_be_moved_or_removed,
    fifos_in_the_root_do_not_hang_the_server,
    deep_and_wide_trees_give_bounded_answers,
    confined_commands_cannot_write_read_or_signal_outside,
    confined_commands_reach_no_socket_outside,
    confined_commands_cannot_reach_a_capexec_server,
    another_sessions_processes_are_out_of_reach,
    daemonized_and_many_processes_end_with_the_session,
    huge_output_keeps_the_server_bounded_and_its_loss_said,
    closed_streams_and_exited_processes_tell_the_truth,
    protocol_abuse_leaves_the_server_serving,
    long_write_ids_cannot_grow_the_executor,
);

/// Every entry beneath `dir`: its kind and its bytes (a file's content, a
/// symlink's target), to compare before and after an attempt.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (String, Vec<u8>)> {
    fn walk(base: &Path, dir: &Path, into: &mut BTreeMap<PathBuf, (String, Vec<u8>)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .expect("read_dir")
            .map(|entry| entry.expect("entry").path())
            .collect();
        entries.sort();
        for path in entries {
            let meta = std::fs::symlink_metadata(&path).expect("lstat");
            let relative = path.strip_prefix(base).expect("beneath").to_path_buf();
            let kind = meta.file_type();
            let mode = meta.permissions().mode();
            if kind.is_symlink() {
                let target = std::fs::read_link(&path).expect("readlink");
                into.insert(
                    relative,
                    (
                        "symlink".into(),
                        target.as_os_str().as_encoded_bytes().to_vec(),
                    ),
                );
            } else if kind.is_dir() {
                into.insert(relative, (format!("dir {mode:o}"), Vec::new()));
                walk(base, &path, into);
            } else if kind.is_file() {
                let content = std::fs::read(&path).expect("read");
                into.insert(relative, (format!("file {mode:o}"), content));
            } else {
                into.insert(relative, ("other".into(), Vec::new()));
            }
        }
    }
    let mut into = BTreeMap::new();
    walk(dir, dir, &mut into);
    into
}

/// A directory outside the root with a secret file, a secret directory
/// and a file only root can read, as the agent must never reach them.
struct Outside {
    dir: TempDir,
    before: BTreeMap<PathBuf, (String, Vec<u8>)>,
}

impl Outside {
    fn new() -> Outside {
        let dir = TempDir::new("mcp-hostile-outside");
        // Readable by anyone: only the sandbox stands between the agent
        // and these files, not their permissions.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
            .expect("chmod");
        std::fs::write(dir.path().join("secret"), b"SECRET-OUTSIDE\n").expect("write");
        std::fs::set_permissions(
            dir.path().join("secret"),
            std::fs::Permissions::from_mode(0o666),
        )
        .expect("chmod");
        std::fs::create_dir(dir.path().join("dir")).expect("mkdir");
        std::fs::set_permissions(
            dir.path().join("dir"),
            std::fs::Permissions::from_mode(0o777),
        )
        .expect("chmod");
        std::fs::write(dir.path().join("dir/inner"), b"SECRET-INNER\n").expect("write");
        let before = snapshot(dir.path());
        Outside { dir, before }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn text(&self) -> String {
        self.dir.path().display().to_string()
    }

    /// Nothing outside changed: every file byte-identical, none made.
    fn unchanged(&self, after: &str) {
        assert_eq!(
            snapshot(self.dir.path()),
            self.before,
            "the directory outside the root changed after {after}"
        );
    }
}

/// A root for the agent, with a file of its own.
fn root() -> TempDir {
    let root = TempDir::new("mcp-hostile-root");
    std::fs::write(root.path().join("own.txt"), b"own\n").expect("write");
    root
}

/// Runs `command` through `sh -c` and returns (exit code, stdout, stderr).
fn sh(mcp: &mut Mcp, command: &str) -> (i64, String, String) {
    let result = mcp.call("exec", json!({"command": command, "yield_ms": 60000}));
    assert_eq!(result["running"], false, "{result}");
    (
        result["exit"]["code"].as_i64().unwrap_or(-1),
        String::from_utf8_lossy(&bytes(&result["stdout"])).into_owned(),
        String::from_utf8_lossy(&bytes(&result["stderr"])).into_owned(),
    )
}

/// A file tool call that must fail with capexec's tag for a path outside
/// the root, or (`tags` names others) one of those.
fn refused(mcp: &mut Mcp, tool: &str, arguments: Value, tags: &[&str]) -> String {
    let text = mcp.call_error(tool, arguments.clone());
    assert!(
        text.starts_with(&format!("capexec: {tool}: ")),
        "{tool} {arguments}: {text}"
    );
    assert!(
        tags.iter()
            .any(|tag| text.ends_with(&format!("[capexec:{tag}]"))),
        "{tool} {arguments}: expected one of {tags:?}: {text}"
    );
    text
}

const OUT: &[&str] = &["outside-directory"];

pub fn paths_outside_the_root_are_refused_by_every_file_tool(backend: Backend) {
    let root = root();
    let outside = Outside::new();
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    let o = outside.text();
    let root_text = root.path().display().to_string();
    // A sibling whose name starts with the root's: a prefix of text is
    // not a parent.
    let sibling = PathBuf::from(format!("{root_text}-sibling"));
    std::fs::create_dir(&sibling).expect("mkdir sibling");
    std::fs::write(sibling.join("f"), b"sibling\n").expect("write");
    let escapes = [
        "../x".to_string(),
        "a/../../x".to_string(),
        "./../../../../../../etc/passwd".to_string(),
        "/etc/passwd".to_string(),
        format!("{o}/secret"),
        format!("{o}/dir/inner"),
        format!(
            "{root_text}/../{}/secret",
            outside.path().file_name().unwrap().to_string_lossy()
        ),
        format!("{root_text}-sibling/f"),
        format!("{root_text}/a/../../x"),
        "/".to_string(),
    ];
    for path in &escapes {
        refused(&mut mcp, "read_file", json!({"path": path}), OUT);
        refused(
            &mut mcp,
            "write_file",
            json!({"path": path, "content": "X"}),
            OUT,
        );
        refused(
            &mut mcp,
            "edit_file",
            json!({"path": path, "edits": [{"old_text": "SECRET", "new_text": "X"}]}),
            OUT,
        );
        refused(&mut mcp, "list_directory", json!({"path": path}), OUT);
        refused(
            &mut mcp,
            "search_files",
            json!({"pattern": "SECRET", "path": path}),
            OUT,
        );
        refused(&mut mcp, "file_info", json!({"path": path}), OUT);
        refused(&mut mcp, "make_directory", json!({"path": path}), OUT);
        refused(
            &mut mcp,
            "remove_path",
            json!({"path": path, "recursive": true}),
            OUT,
        );
        refused(
            &mut mcp,
            "move_path",
            json!({"from": path, "to": "stolen"}),
            OUT,
        );
        refused(
            &mut mcp,
            "move_path",
            json!({"from": "own.txt", "to": path, "overwrite": true}),
            OUT,
        );
    }
    outside.unchanged("paths outside the root");
    assert_eq!(std::fs::read(sibling.join("f")).expect("f"), b"sibling\n");
    assert_eq!(std::fs::read_dir(&sibling).expect("ls").count(), 1);
    let _ = std::fs::remove_dir_all(&sibling);
    // `..` that stays inside is fine, and the file is the agent's own.
    let read = mcp.call("read_file", json!({"path": "a/../own.txt"}));
    assert_eq!(read["content"], "own\n");
    assert_eq!(read["path"], "own.txt");
}

pub fn symlinks_a_command_makes_lead_no_file_tool_out(backend: Backend) {
    let root = root();
    let outside = Outside::new();
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    let o = outside.text();
    let (code, _, stderr) = sh(
        &mut mcp,
        &format!(
            "set -e; ln -s {o}/secret link; ln -s {o}/dir dlink; ln -s {o} olink; \
             ln -s ../{name} rel; ln -s / slash; ln -s /proc/self/root proot; \
             ln -s /proc/self/cwd pcwd; ln -s link chain; mkdir sub; ln -s ../../ sub/up; \
             ln -s {o}/dir/new dangling",
            name = outside.path().file_name().unwrap().to_string_lossy()
        ),
    );
    assert_eq!(code, 0, "{stderr}");
    let through = [
        "link",
        "chain",
        "dlink/inner",
        "olink/secret",
        "rel/secret",
        "slash/etc/passwd",
        "proot/etc/passwd",
        "sub/up/x",
    ];
    for path in through {
        refused(&mut mcp, "read_file", json!({"path": path}), OUT);
        refused(
            &mut mcp,
            "file_info",
            json!({"path": path, "follow_symlinks": true}),
            OUT,
        );
    }
    for path in [
        "link",
        "chain",
        "dlink/inner",
        "olink/secret",
        "rel/new",
        "dangling",
        "dlink/new",
    ] {
        let text = mcp.call_error("write_file", json!({"path": path, "content": "PWNED"}));
        assert!(
            text.ends_with("[capexec:outside-directory]"),
            "{path}: {text}"
        );
        let text = mcp.call_error(
            "edit_file",
            json!({"path": path, "edits": [{"old_text": "SECRET", "new_text": "PWNED"}]}),
        );
        assert!(
            text.ends_with("[capexec:outside-directory]") || text.contains("[capexec:not-found]"),
            "{path}: {text}"
        );
    }
    for path in ["dlink", "olink", "rel", "slash", "proot", "pcwd", "sub/up"] {
        refused(
            &mut mcp,
            "list_directory",
            json!({"path": path, "depth": 3}),
            OUT,
        );
        refused(
            &mut mcp,
            "search_files",
            json!({"pattern": "SECRET", "path": path}),
            OUT,
        );
        refused(
            &mut mcp,
            "make_directory",
            json!({"path": format!("{path}/made")}),
            OUT,
        );
        refused(
            &mut mcp,
            "remove_path",
            json!({"path": format!("{path}/secret"), "recursive": true}),
            OUT,
        );
        refused(
            &mut mcp,
            "move_path",
            json!({"from": format!("{path}/secret"), "to": "stolen"}),
            OUT,
        );
        refused(
            &mut mcp,
            "move_path",
            json!({"from": "own.txt", "to": format!("{path}/planted")}),
            OUT,
        );
    }
    // Nothing follows a link out when walking the root.
    let search = mcp.call("search_files", json!({"pattern": "SECRET"}));
    assert_eq!(search["matches"], json!([]), "{search}");
    let listing = mcp.call("list_directory", json!({"depth": 16}));
    for entry in listing["entries"].as_array().expect("entries") {
        let path = entry["path"].as_str().expect("path");
        assert!(
            !path.contains("inner") && !path.contains("passwd"),
            "a listing followed a link out: {listing}"
        );
    }
    // A cwd through a link out is refused.
    for cwd in ["dlink", "proot", "pcwd", "sub/up", "slash/tmp"] {
        let text = mcp.call_error("exec", json!({"argv": ["touch", "planted"], "cwd": cwd}));
        assert!(text.ends_with("[capexec:not-allowed]"), "{cwd}: {text}");
    }
    // Commands cannot write or read through the links either.
    let (code, stdout, _) = sh(
        &mut mcp,
        "echo PWNED > link; echo PWNED > dlink/new; echo PWNED > olink/new; \
         echo PWNED > proot/tmp/pwned; cat link dlink/inner rel/secret; exit 0",
    );
    assert_eq!(code, 0);
    assert!(!stdout.contains("SECRET"), "{stdout}");
    // Removing a link (alone or in a tree) removes the link, never what it
    // points to; moving one moves the link.
    let moved = mcp.call("move_path", json!({"from": "dlink", "to": "sub/dlink2"}));
    assert_eq!(moved["to"], "sub/dlink2");
    let removed = mcp.call("remove_path", json!({"path": "sub", "recursive": true}));
    assert_eq!(removed["removed"], 3, "{removed}");
    let removed = mcp.call("remove_path", json!({"path": "olink/", "recursive": true}));
    assert_eq!(removed["removed"], 1, "{removed}");
    mcp.call("remove_path", json!({"path": "link"}));
    outside.unchanged("symlinks made by a command");
    assert_eq!(
        std::fs::read(root.path().join("own.txt")).expect("own"),
        b"own\n"
    );
}

pub fn a_symlink_swapped_in_during_writes_never_lets_one_out(backend: Backend) {
    let root = root();
    let outside = Outside::new();
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    let o = outside.text();
    // `d` flips between a directory of the root and a link to the
    // outside directory, each flip one atomic rename, for as long as the
    // writes below go on.
    let flipper = mcp.call(
        "exec",
        json!({
            "command": format!(
                "mkdir -p real && echo SECRET > real/f && ln -s {o}/dir evil && \
                 cp -P evil evil2 && mkdir real2 && \
                 while :; do mv -T real d; mv -T d real; mv -T evil d; mv -T d evil; \
                 mv -T evil2 d; mv -T d evil2; done"
            ),
            "yield_ms": 0,
        }),
    );
    let flipper_id = flipper["process_id"].as_str().expect("id").to_string();
    eventually("the flipper runs", || {
        root.path().join("evil2").exists() || root.path().join("d").exists()
    });
    let (mut wrote, mut refused_count) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(8);
    let mut round = 0;
    while Instant::now() < deadline {
        round += 1;
        let attempts = [
            (
                "write_file",
                json!({"path": "d/f", "content": format!("PWNED {round}\n")}),
            ),
            (
                "write_file",
                json!({"path": "d/inner", "content": "PWNED\n"}),
            ),
            (
                "edit_file",
                json!({"path": "d/inner", "edits": [{"old_text": "SECRET", "new_text": "PWNED"}]}),
            ),
            (
                "edit_file",
                json!({"path": "d/f", "edits": [{"old_text": "SECRET", "new_text": "SECRET"}]}),
            ),
            ("make_directory", json!({"path": format!("d/made{round}")})),
            ("move_path", json!({"from": "own.txt", "to": "d/own.txt"})),
            ("move_path", json!({"from": "d/own.txt", "to": "own.txt"})),
            ("remove_path", json!({"path": "d/inner"})),
            ("read_file", json!({"path": "d/inner"})),
        ];
        for (tool, arguments) in attempts {
            let answer = mcp.call_raw(tool, arguments);
            if answer["result"]["isError"] == true {
                refused_count += 1;
                let text = answer["result"]["content"][0]["text"]
                    .as_str()
                    .unwrap_or("");
                assert!(!text.contains("SECRET-INNER"), "{text}");
            } else {
                wrote += 1;
                assert!(
                    !answer["result"].to_string().contains("SECRET-INNER"),
                    "read outside the root: {answer}"
                );
            }
        }
    }
    mcp.call("process_terminate", json!({"process_id": flipper_id}));
    outside.unchanged("a symlink swapped in during writes");
    // The race was run: some calls went through the directory, some
    // were refused through the link.
    assert!(
        wrote > 0 && refused_count > 0,
        "wrote {wrote}, refused {refused_count}"
    );
}

/// Starts commands in `d` while a command flips `d` between a directory
/// of the root (holding a file `secret` of its own) and a link to the
/// outside directory, for `how_long`: between the cwdRoots check, the
/// sandbox's resolving of the working directory (made a readable root
/// wherever it is) and the child's chdir, the link may be there. Returns
/// (commands started, started outside the root, outside files read);
/// asserts that nothing outside was written.
fn swapped_working_directory(backend: Backend, how_long: Duration) -> (usize, usize, usize) {
    let root = root();
    let outside = Outside::new();
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    let o = outside.text();
    let flipper = mcp.call(
        "exec",
        json!({
            "command": format!(
                "mkdir real && echo INSIDE > real/secret && ln -s {o} evil && echo ready > ready && \
                 while :; do mv -T real d; mv -T d real; mv -T evil d; mv -T d evil; done"
            ),
            "yield_ms": 0,
        }),
    );
    let flipper_id = flipper["process_id"].as_str().expect("id").to_string();
    eventually("the flipper runs", || root.path().join("ready").exists());
    let (mut started, mut outside_cwd, mut read) = (0, 0, 0);
    let deadline = Instant::now() + how_long;
    while Instant::now() < deadline {
        let answer = mcp.call_raw(
            "exec",
            json!({
                "command": format!(
                    "pwd -P; cat secret {o}/secret; echo PWNED > planted; echo PWNED > {o}/planted"
                ),
                "cwd": "d",
            }),
        );
        if answer["result"]["isError"] == true {
            continue;
        }
        started += 1;
        let result = &answer["result"]["structuredContent"];
        let stdout = String::from_utf8_lossy(&bytes(&result["stdout"])).into_owned();
        if stdout.starts_with(&format!("{o}\n")) {
            outside_cwd += 1;
        }
        if stdout.contains("SECRET-OUTSIDE") {
            read += 1;
        }
    }
    mcp.call("process_terminate", json!({"process_id": flipper_id}));
    outside.unchanged("a working directory swapped for a link");
    (started, outside_cwd, read)
}

/// The working directory is opened once (`src/engine/working_dir.rs`): a
/// start runs in the directory cwdRoots checked, by descriptor, and its
/// sandbox's rule names that inode, or it is refused. Before, 2 commands
/// in 92,000 read a file outside and many started there; the
/// deterministic form of the race is `tests/it/working_dir.rs`, so this
/// attack runs 10 s on each backend.
pub fn a_working_directory_swapped_for_a_link_writes_nothing_outside(backend: Backend) {
    let (started, outside_cwd, read) = swapped_working_directory(backend, Duration::from_secs(10));
    assert!(started > 0);
    assert_eq!(
        (outside_cwd, read),
        (0, 0),
        "of {started} commands, {outside_cwd} started outside the root and {read} read a file there"
    );
}

pub fn hard_links_out_cannot_be_made_and_one_found_is_replaced_not_written_through(
    backend: Backend,
) {
    let root = root();
    let outside = Outside::new();
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    let o = outside.text();
    let (code, _, stderr) = sh(
        &mut mcp,
        &format!("ln {o}/secret hard || ln {o}/dir/inner hard2 || ln -P {o}/secret hard3"),
    );
    assert_ne!(code, 0, "a confined command linked a file from outside");
    assert!(stderr.contains("hard link"), "{stderr}");
    assert!(!root.path().join("hard").exists());
    // A hard link already in the root (the same file system) is replaced
    // by an atomic write, never written through.
    let secret = outside.path().join("secret");
    let link = root.path().join("hard");
    if std::fs::hard_link(&secret, &link).is_ok() {
        mcp.call("write_file", json!({"path": "hard", "content": "mine\n"}));
        assert_eq!(std::fs::read(&link).expect("hard"), b"mine\n");
        std::fs::remove_file(&link).expect("rm");
        std::fs::hard_link(&secret, &link).expect("link");
        mcp.call(
            "edit_file",
            json!({"path": "hard", "edits": [{"old_text": "OUTSIDE", "new_text": "EDITED"}]}),
        );
        assert_eq!(std::fs::read(&link).expect("hard"), b"SECRET-EDITED\n");
        std::fs::remove_file(&link).expect("rm");
    }
    outside.unchanged("hard links");
}

pub fn the_root_cannot_be_moved_or_removed(backend: Backend) {
    let root = root();
    let outside = Outside::new();
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    std::fs::create_dir(root.path().join("a")).expect("mkdir");
    let root_text = root.path().display().to_string();
    let canonical = std::fs::canonicalize(root.path()).expect("canonical");
    let names = [
        ".".to_string(),
        "a/..".to_string(),
        "./".to_string(),
        root_text.clone(),
        format!("{root_text}/"),
        format!("{root_text}/a/.."),
        canonical.display().to_string(),
    ];
    for name in &names {
        let text = mcp.call_error("remove_path", json!({"path": name, "recursive": true}));
        assert!(text.contains("root itself"), "{name}: {text}");
        let text = mcp.call_error("move_path", json!({"from": name, "to": "a/moved"}));
        assert!(
            text.ends_with("[capexec:invalid-argument]"),
            "{name}: {text}"
        );
        let text = mcp.call_error(
            "move_path",
            json!({"from": "a", "to": name, "overwrite": true}),
        );
        assert!(
            text.ends_with("[capexec:invalid-argument]"),
            "{name}: {text}"
        );
        let text = mcp.call_error("write_file", json!({"path": name, "content": "X"}));
        assert!(text.contains("[capexec:"), "{name}: {text}");
    }
    refused(
        &mut mcp,
        "move_path",
        json!({"from": ".", "to": format!("{}/moved", outside.text())}),
        OUT,
    );
    // A command cannot move or remove it either (its parent is not
    // writable).
    let (code, _, _) = sh(
        &mut mcp,
        &format!("mv {root_text} {root_text}.moved || rmdir {root_text}"),
    );
    assert_ne!(code, 0);
    assert!(root.path().join("own.txt").exists() && root.path().join("a").is_dir());
    assert!(!PathBuf::from(format!("{root_text}.moved")).exists());
    outside.unchanged("moving and removing the root");
}

pub fn fifos_in_the_root_do_not_hang_the_server(backend: Backend) {
    let root = root();
    let outside = Outside::new();
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    let (code, _, stderr) = sh(
        &mut mcp,
        "mkfifo fifo && mkdir tree && mkfifo tree/fifo && echo findme > tree/file && \
         ln -s /dev/zero zero && ln -s /dev/stdin in && \
         perl -MSocket -e 'socket(S, PF_UNIX, SOCK_STREAM, 0); bind(S, pack_sockaddr_un(\"sock\")) or die'",
    );
    assert_eq!(code, 0, "{stderr}");
    let started = Instant::now();
    let text = mcp.call_error("read_file", json!({"path": "fifo"}));
    assert!(text.contains("FIFO"), "{text}");
    let text = mcp.call_error(
        "read_file",
        json!({"path": "fifo", "byte_offset": 0, "byte_length": 10}),
    );
    assert!(text.contains("FIFO"), "{text}");
    let text = mcp.call_error("write_file", json!({"path": "fifo", "content": "X"}));
    assert!(text.contains("FIFO"), "{text}");
    let text = mcp.call_error(
        "edit_file",
        json!({"path": "fifo", "edits": [{"old_text": "a", "new_text": "b"}]}),
    );
    assert!(text.contains("FIFO"), "{text}");
    for path in ["sock", "tree"] {
        let text = mcp.call_error("read_file", json!({"path": path}));
        assert!(text.contains("[capexec:"), "{text}");
        let text = mcp.call_error("write_file", json!({"path": path, "content": "X"}));
        assert!(text.contains("[capexec:"), "{text}");
    }
    let info = mcp.call("file_info", json!({"path": "fifo"}));
    assert_eq!(info["type"], "other");
    let search = mcp.call("search_files", json!({"pattern": "findme"}));
    assert_eq!(
        search["matches"].as_array().map(Vec::len),
        Some(1),
        "{search}"
    );
    for path in ["zero", "in"] {
        refused(&mut mcp, "read_file", json!({"path": path}), OUT);
        refused(
            &mut mcp,
            "write_file",
            json!({"path": path, "content": "X"}),
            OUT,
        );
    }
    // Within the test deadline (read_file on a FIFO with no writer would
    // block forever if opened for reading without O_NONBLOCK).
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    assert!(
        std::fs::symlink_metadata(root.path().join("fifo"))
            .expect("fifo")
            .file_type()
            .is_fifo(),
        "the FIFO was replaced"
    );
    outside.unchanged("FIFOs");
}

pub fn deep_and_wide_trees_give_bounded_answers(backend: Backend) {
    let root = root();
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    // 60 levels deep and 6,000 files wide; a symlink loop.
    let (code, _, stderr) = sh(
        &mut mcp,
        "set -e; d=deep; for i in $(seq 60); do d=$d/d; done; mkdir -p $d; echo match > $d/f; \
         mkdir wide; cd wide; seq 6000 | xargs touch; cd ..; ln -s . loop; ln -s loop loop2",
    );
    assert_eq!(code, 0, "{stderr}");
    let listing = mcp.call("list_directory", json!({"depth": 16, "max_entries": 5000}));
    let entries = listing["entries"].as_array().expect("entries");
    assert_eq!(entries.len(), 5000, "{}", listing["truncation"]);
    assert_eq!(listing["truncated"], true);
    let text = mcp.call_error("list_directory", json!({"depth": 17}));
    assert!(text.starts_with("capexec: list_directory: "), "{text}");
    let text = mcp.call_error("list_directory", json!({"max_entries": 5001}));
    assert!(text.starts_with("capexec: list_directory: "), "{text}");
    let deep = mcp.call("list_directory", json!({"path": "deep", "depth": 16}));
    let deepest = deep["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|entry| entry["path"].as_str().expect("path").matches('/').count())
        .max();
    assert_eq!(deepest, Some(16), "{deep}");
    // A search finds the deep file (the walk is not cut at 16) and does
    // not loop through the links.
    let search = mcp.call("search_files", json!({"pattern": "^match$"}));
    assert_eq!(
        search["matches"].as_array().map(Vec::len),
        Some(1),
        "{search}"
    );
    let text = mcp.call_error("search_files", json!({"pattern": "x", "max_matches": 1001}));
    assert!(text.starts_with("capexec: search_files: "), "{text}");
    let text = mcp.call_error("search_files", json!({"pattern": "a".repeat(4097)}));
    assert!(text.starts_with("capexec: search_files: "), "{text}");
    // A pattern that blows up compiled is refused, not compiled.
    let text = mcp.call_error("search_files", json!({"pattern": "(\\w{100}){100}"}));
    assert!(text.starts_with("capexec: search_files: "), "{text}");
}

pub fn confined_commands_cannot_write_read_or_signal_outside(backend: Backend) {
    let root = root();
    let outside = Outside::new();
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    let o = outside.text();
    // The process that holds the executor: capexec mcp, or capexec serve.
    let holder = match mcp.served() {
        Some(served) => served.child.id(),
        None => mcp.child.id(),
    };
    let mcp_pid = mcp.child.id();
    let (_, stdout, stderr) = sh(
        &mut mcp,
        &format!(
            "for t in {o}/new {o}/secret {o}/dir/new /proc/self/root{o}/new \
             /proc/{holder}/root{o}/new /proc/{holder}/cwd/pwned /proc/{mcp_pid}/root{o}/new \
             /proc/1/root{o}/new; do (echo PWNED >> $t) 2>/dev/null && echo WROTE $t; done; \
             mkdir {o}/made 2>/dev/null && echo MADE; \
             touch -d 2000-01-01 {o}/secret 2>/dev/null && echo TOUCHED; \
             chmod 777 {o}/secret 2>/dev/null && echo CHMOD; \
             rm -f {o}/secret 2>/dev/null; mv {o}/secret ./stolen 2>/dev/null && echo MOVED; \
             cat {o}/secret {o}/dir/inner /proc/{holder}/root{o}/secret /proc/{holder}/environ \
             /proc/1/root{o}/secret 2>/dev/null; \
             ls /proc/{holder}/fd 2>/dev/null && echo FDS; \
             kill -0 {holder} 2>/dev/null && echo SIGNAL; kill -STOP {mcp_pid} 2>/dev/null && echo STOPPED; \
             ls -l /proc/self/fd/ | awk 'NR>1 {{print $9, $11}}'; exit 0"
        ),
    );
    for said in [
        "WROTE", "MADE", "TOUCHED", "CHMOD", "MOVED", "SECRET", "FDS", "SIGNAL", "STOPPED",
    ] {
        assert!(!stdout.contains(said), "{said}: {stdout} {stderr}");
    }
    // Nothing but stdio (and ls's own directory) is inherited: no
    // descriptor of the server to write through (/proc/self/fd/N).
    let descriptors: Vec<&str> = stdout.lines().collect();
    assert_eq!(descriptors.len(), 4, "{stdout}");
    assert!(descriptors[0].starts_with("0 /dev/null"), "{stdout}");
    assert!(descriptors[1].starts_with("1 pipe:"), "{stdout}");
    assert!(descriptors[2].starts_with("2 pipe:"), "{stdout}");
    assert!(descriptors[3].starts_with("3 /proc/"), "{stdout}");
    // The server's token, for a served executor.
    if let Some(served) = mcp.served() {
        let token_file = served.token_file.display().to_string();
        let token = std::fs::read_to_string(&served.token_file).expect("token");
        let (_, stdout, _) = sh(&mut mcp, &format!("cat {token_file}; exit 0"));
        assert!(!stdout.contains(token.trim()), "read the server's token");
        let text = mcp.call_error("read_file", json!({"path": token_file}));
        assert!(text.ends_with("[capexec:outside-directory]"), "{text}");
    }
    // LD_PRELOAD and the like are the agent's own process's business:
    // they change nothing outside.
    let result = mcp.call(
        "exec",
        json!({"command": format!("echo PWNED > {o}/env"), "env": {"LD_PRELOAD": "", "HOME": o, "TMPDIR": o}}),
    );
    assert_ne!(result["exit"]["code"], 0, "{result}");
    outside.unchanged("confined commands writing outside");
    assert!(!gone(holder as i32), "the executor's process is alive");
}

/// A perl one-liner (perl is in the system directories, which the
/// sandbox reads) that connects to `address` and says CONNECTED.
fn perl_connect(address: &str) -> String {
    format!("perl -MSocket -e '{address} or die \"no: $!\\n\"; print \"CONNECTED\\n\"'")
}

pub fn confined_commands_reach_no_socket_outside(backend: Backend) {
    use std::os::linux::net::SocketAddrExt;
    let root = root();
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    // UDP to a socket of this test.
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
    udp.set_nonblocking(true).expect("nonblocking");
    let port = udp.local_addr().expect("address").port();
    let (_, stdout, stderr) = sh(
        &mut mcp,
        &format!(
            "{}; exit 0",
            perl_connect(&format!(
                "socket(S, PF_INET, SOCK_DGRAM, 0) && send(S, \"hi\", 0, pack_sockaddr_in({port}, inet_aton(\"127.0.0.1\")))"
            ))
        ),
    );
    assert!(!stdout.contains("CONNECTED"), "UDP: {stdout}");
    assert!(stderr.contains("Operation not permitted"), "{stderr}");
    let mut buffer = [0; 16];
    assert!(udp.recv(&mut buffer).is_err(), "a datagram came");
    // IPv6, raw, netlink and packet sockets.
    for (family, kind) in [
        ("PF_INET6", "SOCK_STREAM"),
        ("PF_INET", "SOCK_RAW"),
        ("16", "SOCK_RAW"),
        ("17", "SOCK_RAW"),
    ] {
        let (_, stdout, _) = sh(
            &mut mcp,
            &format!(
                "{}; exit 0",
                perl_connect(&format!("socket(S, {family}, {kind}, 0)"))
            ),
        );
        assert!(!stdout.contains("CONNECTED"), "{family} {kind}: {stdout}");
    }
    // An abstract Unix socket of this test.
    let name = format!("capexec-hostile-{}-{backend:?}", std::process::id());
    let address =
        std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("name");
    let listener = std::os::unix::net::UnixListener::bind_addr(&address).expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let (_, stdout, stderr) = sh(
        &mut mcp,
        &format!(
            "{}; exit 0",
            perl_connect(&format!(
                "socket(S, PF_UNIX, SOCK_STREAM, 0) && connect(S, pack_sockaddr_un(\"\\0{name}\"))"
            ))
        ),
    );
    assert!(!stdout.contains("CONNECTED"), "abstract socket: {stdout}");
    assert!(stderr.contains("Operation not permitted"), "{stderr}");
    assert!(
        listener.accept().is_err(),
        "the abstract socket was reached"
    );
}

pub fn confined_commands_cannot_reach_a_capexec_server(backend: Backend) {
    let root = root();
    let outside = Outside::new();
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    // The server to reach: the one running these processes, else another
    // one of this machine.
    let other = (backend == Backend::Embedded).then(Served::start);
    let served = other.as_ref().or(mcp.served()).expect("a server");
    let (socket, token_file, tcp) = (
        served.socket.clone(),
        served.token_file.clone(),
        served.tcp.clone(),
    );
    // The worst case: the socket's permissions let anyone connect, and
    // the agent knows the token; only capexec's own check is left.
    std::fs::set_permissions(served.home.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    std::fs::copy(&token_file, root.path().join("token")).expect("copy token");
    std::fs::copy(BIN, root.path().join("capexec")).expect("copy capexec");
    let target = outside.path().join("dir/via-server");
    for connect in [format!("unix:{}", socket.display()), tcp] {
        let (code, stdout, stderr) = sh(
            &mut mcp,
            &format!(
                "./capexec run --connect {connect} --token-file token -- sh -c 'echo PWNED > {t}; echo RAN'",
                t = target.display()
            ),
        );
        assert_ne!(code, 0, "{connect}: {stdout} {stderr}");
        assert!(!stdout.contains("RAN"), "{connect}: {stdout} {stderr}");
        assert!(stderr.starts_with("capexec: "), "{connect}: {stderr}");
    }
    // The raw socket too: connected, it is closed at once, unanswered.
    let (_, stdout, _) = sh(
        &mut mcp,
        &format!(
            "{}; exit 0",
            perl_connect(&format!(
                "socket(S, PF_UNIX, SOCK_STREAM, 0) && connect(S, pack_sockaddr_un(\"{}\")) && \
                 send(S, \"\\0\\0\\0\\0\\1\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\", 0) && \
                 (sysread(S, $b, 1) // 0) > 0",
                socket.display()
            ))
        ),
    );
    assert!(
        !stdout.contains("CONNECTED"),
        "the server answered: {stdout}"
    );
    outside.unchanged("reaching a capexec server");
}

pub fn another_sessions_processes_are_out_of_reach(backend: Backend) {
    let root_a = root();
    let root_b = root();
    let mut a = Mcp::start(backend, root_a.path(), &[]);
    let mut b = Mcp::start(backend, root_b.path(), &[]);
    let victim = b.call(
        "exec",
        json!({"command": "echo $$ > pid; exec sleep 300", "yield_ms": 0}),
    );
    let victim_id = victim["process_id"].as_str().expect("id").to_string();
    let pid = pid_in(&root_b.path().join("pid"));
    let (_, stdout, stderr) = sh(
        &mut a,
        &format!(
            "kill -0 {pid} 2>/dev/null && echo SIGNAL; kill -KILL {pid} 2>/dev/null && echo KILLED; \
             cat /proc/{pid}/environ 2>/dev/null && echo ENVIRON; ls /proc/{pid}/cwd/ 2>/dev/null && echo CWD; \
             echo PWNED > /proc/{pid}/cwd/pwned 2>/dev/null && echo WROTE; \
             strace -p {pid} -e trace=none -o /dev/null & s=$!; sleep 1; kill $s 2>/dev/null; wait $s; \
             timeout 20 gdb -nx -batch -p {pid} -ex 'call (int)kill({pid}, 9)' >/dev/null 2>&1; exit 0"
        ),
    );
    for said in ["SIGNAL", "KILLED", "ENVIRON", "CWD", "WROTE"] {
        assert!(!stdout.contains(said), "{said}: {stdout} {stderr}");
    }
    assert!(stderr.contains("ptrace"), "{stderr}");
    assert!(!root_b.path().join("pwned").exists());
    assert!(!gone(pid), "another session's process was ended");
    // Process ids are the session's own: B's "p1" names A's own p1 (the
    // ended shell above) in A, never B's process; an id A never gave is
    // unknown.
    assert_eq!(victim_id, "p1");
    let answer = a.call("process_terminate", json!({"process_id": victim_id}));
    assert_eq!(answer["running"], false, "{answer}");
    let answer = a.call(
        "process_signal",
        json!({"process_id": victim_id, "signal": "KILL"}),
    );
    assert_eq!(answer["running"], false, "{answer}");
    for tool in ["process_terminate", "process_output"] {
        let text = a.call_error(tool, json!({"process_id": "p2"}));
        assert!(text.contains("no process"), "{text}");
    }
    let text = a.call_error("process_input", json!({"process_id": "p2", "close": true}));
    assert!(text.contains("no process"), "{text}");
    let listed = b.call("process_list", json!({}));
    assert_eq!(listed["processes"][0]["running"], true, "{listed}");
    assert!(!gone(pid));
    // Ending A's session leaves B's process running.
    assert_eq!(a.finish(), 0);
    assert!(!gone(pid), "ending one session ended another's process");
    b.call("process_terminate", json!({"process_id": victim_id}));
    eventually("B's process ends when B terminates it", || gone(pid));
}

pub fn daemonized_and_many_processes_end_with_the_session(backend: Backend) {
    let root = root();
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    // A daemon: a new session, its parent gone, its stdio closed.
    let (code, _, stderr) = sh(
        &mut mcp,
        "setsid sh -c 'sleep 300 </dev/null >/dev/null 2>&1 & echo $! > daemon' </dev/null >/dev/null 2>&1 & \
         wait; nohup sh -c 'echo $$ > nohup; exec sleep 300' </dev/null >/dev/null 2>&1 & exit 0",
    );
    assert_eq!(code, 0, "{stderr}");
    let daemon = pid_in(&root.path().join("daemon"));
    let nohup = pid_in(&root.path().join("nohup"));
    // Two hundred processes of a tree, each in a process group of its
    // own, handed back as one running process.
    let many = mcp.call(
        "exec",
        json!({
            "command": "for i in $(seq 200); do setsid sleep 300 & echo $! >> many; done; \
                        echo done > many.done; exec sleep 300",
            "yield_ms": 0,
        }),
    );
    assert_eq!(many["running"], true, "{many}");
    eventually("200 processes started", || {
        root.path().join("many.done").exists()
    });
    let pids: Vec<i32> = std::fs::read_to_string(root.path().join("many"))
        .expect("many")
        .lines()
        .map(|line| line.parse().expect("pid"))
        .collect();
    assert_eq!(pids.len(), 200);
    assert!(!gone(daemon) && !gone(nohup));
    // The server still answers while they run.
    let listed = mcp.call("process_list", json!({}));
    assert_eq!(
        listed["processes"].as_array().map(Vec::len),
        Some(2),
        "{listed}"
    );
    assert_eq!(mcp.finish(), 0);
    let mut left: Vec<i32>;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        left = [daemon, nohup]
            .into_iter()
            .chain(pids.iter().copied())
            .filter(|&pid| !gone(pid))
            .collect();
        if left.is_empty() || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Clean up what escaped before failing (they are this test's).
    for &pid in &left {
        // SAFETY: kill(2) on a pid this test's commands started and
        // wrote down, which has not been reaped (a zombie counts as gone).
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    assert!(
        left.is_empty(),
        "finding: processes outlived their session: {left:?} (daemon {daemon}, nohup {nohup})"
    );
}

/// Resident memory of `pid` in KiB.
fn resident_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("status")
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

pub fn huge_output_keeps_the_server_bounded_and_its_loss_said(backend: Backend) {
    let root = root();
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    let holder = mcp
        .served()
        .map_or(mcp.child.id(), |served| served.child.id());
    let mcp_pid = mcp.child.id();
    let before = (resident_kib(mcp_pid), resident_kib(holder));
    // 256 MiB on each stream, nobody reading until it ended.
    let total: u64 = 256 << 20;
    let result = mcp.call(
        "exec",
        json!({
            "command": format!("head -c {total} /dev/zero & head -c {total} /dev/zero >&2; wait"),
            "yield_ms": 120000,
            "max_output_bytes": 1048576,
        }),
    );
    assert_eq!(result["running"], false, "{result}");
    assert_eq!(result["exit"]["code"], 0, "{result}");
    let id = result["process_id"].as_str().expect("id").to_string();
    // Read it all back from seq 0: what is missing is said as gaps.
    let (mut got, mut gaps, mut after) = (0u64, 0usize, 0u64);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answer = mcp.call(
            "process_output",
            json!({"process_id": id, "after_seq": after, "max_bytes": 1048576}),
        );
        for stream in ["stdout", "stderr"] {
            got += answer[stream]["bytes"].as_u64().expect("bytes");
        }
        gaps += answer["gaps"].as_array().map_or(0, Vec::len);
        after = answer["next_seq"].as_u64().expect("next_seq");
        if answer["closed"] == true {
            break;
        }
        assert!(Instant::now() < deadline, "never closed: {answer}");
    }
    assert!(got <= 2 * total, "more bytes than were written: {got}");
    assert!(
        got == 2 * total || gaps > 0,
        "{} bytes lost and no gap said",
        2 * total - got
    );
    let after_kib = (resident_kib(mcp_pid), resident_kib(holder));
    assert!(
        after_kib.0 < before.0 + 96 * 1024 && after_kib.1 < before.1 + 96 * 1024,
        "resident memory grew from {before:?} to {after_kib:?} KiB"
    );
    // A line of output that never ends, still bounded.
    let result = mcp.call(
        "exec",
        json!({"command": "head -c 50000000 /dev/zero | tr '\\0' a", "yield_ms": 120000}),
    );
    assert_eq!(result["exit"]["code"], 0, "{result}");
    let stdout = &result["stdout"];
    let counted = stdout["bytes"].as_u64().expect("bytes");
    // What the retained log evicted before exec read it is said as gaps.
    assert!(
        counted == 50_000_000 || (counted < 50_000_000 && result["gaps"] != json!([])),
        "{counted} bytes counted of 50000000, gaps {}",
        result["gaps"]
    );
    let kept =
        stdout["text"].as_str().expect("text").len() + stdout["tail"].as_str().expect("tail").len();
    assert_eq!(
        kept as u64 + stdout["cut_bytes"].as_u64().expect("cut"),
        counted
    );
    assert!(kept <= 65536, "{kept}");
}

pub fn closed_streams_and_exited_processes_tell_the_truth(backend: Backend) {
    let root = root();
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    // Closes stdout and stderr, goes on, then exits 3.
    let result = mcp.call(
        "exec",
        json!({"command": "echo before; exec >&- 2>&-; sleep 1; exit 3", "yield_ms": 60000}),
    );
    assert_eq!(result["running"], false, "{result}");
    assert_eq!(result["exit"]["code"], 3, "{result}");
    assert_eq!(bytes(&result["stdout"]), b"before\n");
    // Closed streams, still running: handed back as running.
    let result = mcp.call(
        "exec",
        json!({"command": "exec >&- 2>&- </dev/null; exec sleep 300", "yield_ms": 500}),
    );
    assert_eq!(result["running"], true, "{result}");
    assert_eq!(result["exit"], Value::Null);
    let id = result["process_id"].as_str().expect("id").to_string();
    let answer = mcp.call("process_output", json!({"process_id": id, "wait_ms": 300}));
    assert_eq!(answer["running"], true, "{answer}");
    assert_eq!(answer["closed"], false, "{answer}");
    mcp.call(
        "process_signal",
        json!({"process_id": id, "signal": "KILL"}),
    );
    let (_, _, end) = mcp.read_to_end(&id);
    assert_eq!(end["exit"]["signal"], "KILL", "{end}");
    assert_eq!(end["exit"]["shell_code"], 137, "{end}");
    // Killed by a signal it sent itself.
    let result = mcp.call(
        "exec",
        json!({"command": "kill -SEGV $$", "yield_ms": 60000}),
    );
    assert_eq!(result["exit"]["signal"], "SEGV", "{result}");
    assert_eq!(result["exit"]["code"], Value::Null, "{result}");
    // stdin written after the exit is refused as such, not accepted.
    let result = mcp.call(
        "exec",
        json!({"argv": ["true"], "keep_stdin_open": true, "yield_ms": 60000}),
    );
    assert_eq!(result["running"], false, "{result}");
    let id = result["process_id"].as_str().expect("id").to_string();
    for _ in 0..3 {
        let input = mcp.call(
            "process_input",
            json!({"process_id": id, "data": "x".repeat(100_000), "write_id": "w"}),
        );
        assert_ne!(input["status"], "accepted", "{input}");
    }
    let input = mcp.call("process_input", json!({"process_id": id, "close": true}));
    assert_ne!(input["status"], "accepted", "{input}");
    // A process that ignores TERM still ends on process_terminate.
    let result = mcp.call(
        "exec",
        json!({"command": "trap '' TERM; echo $$ > stubborn; while :; do sleep 1; done", "yield_ms": 0}),
    );
    let id = result["process_id"].as_str().expect("id").to_string();
    let pid = pid_in(&root.path().join("stubborn"));
    mcp.call("process_terminate", json!({"process_id": id}));
    let (_, _, end) = mcp.read_to_end(&id);
    assert_eq!(end["exit"]["signal"], "KILL", "{end}");
    assert!(gone(pid));
}

pub fn protocol_abuse_leaves_the_server_serving(backend: Backend) {
    let root = root();
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    // A progress token on every tool's call.
    let calls = [
        ("exec", json!({"argv": ["echo", "hi"]})),
        ("process_list", json!({})),
        ("process_output", json!({"process_id": "p1"})),
        ("process_input", json!({"process_id": "p1", "close": true})),
        (
            "process_signal",
            json!({"process_id": "p1", "signal": "TERM"}),
        ),
        ("process_terminate", json!({"process_id": "p1"})),
        ("write_file", json!({"path": "f", "content": "x"})),
        ("read_file", json!({"path": "f"})),
        (
            "edit_file",
            json!({"path": "f", "edits": [{"old_text": "x", "new_text": "y"}]}),
        ),
        ("list_directory", json!({})),
        ("search_files", json!({"pattern": "y"})),
        ("file_info", json!({"path": "f"})),
        ("make_directory", json!({"path": "d"})),
        ("move_path", json!({"from": "f", "to": "d/f"})),
        ("remove_path", json!({"path": "d", "recursive": true})),
    ];
    for (index, (tool, arguments)) in calls.into_iter().enumerate() {
        let answer = mcp.request(
            "tools/call",
            json!({"name": tool, "arguments": arguments, "_meta": {"progressToken": index}}),
        );
        assert_eq!(answer["result"]["isError"], false, "{tool}: {answer}");
    }
    // Cancelling requests that are not in flight, or not requests at all.
    for id in [
        json!(1),
        json!(999),
        json!("p1"),
        json!(null),
        json!({"x": 1}),
    ] {
        mcp.send_line(
            &json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": id}})
                .to_string(),
        );
    }
    // Deeply nested arguments: refused, nothing recursed to death.
    let depth = 100_000;
    let nested = format!(
        r#"{{"jsonrpc":"2.0","id":5000,"method":"tools/call","params":{{"name":"exec","arguments":{{"argv":{}{}}}}}}}"#,
        "[".repeat(depth),
        "]".repeat(depth)
    );
    mcp.send_line(&nested);
    let nested_object = format!(
        r#"{{"jsonrpc":"2.0","id":5001,"method":"tools/call","params":{{"name":"exec","arguments":{{"env":{}1{}}}}}}}"#,
        r#"{"a":"#.repeat(depth),
        "}".repeat(depth)
    );
    mcp.send_line(&nested_object);
    let alive = mcp.send_request(
        "tools/call",
        json!({"name": "exec", "arguments": {"argv": ["echo", "alive"]}}),
    );
    loop {
        let message = mcp.next_message();
        match message["id"].as_u64() {
            Some(id) if id == alive => {
                assert_eq!(message["result"]["isError"], false, "{message}");
                break;
            }
            // An answer to the nested calls, if any, is an error.
            Some(5000 | 5001) => assert!(
                message["error"].is_object() || message["result"]["isError"] == true,
                "{message}"
            ),
            _ => assert!(message.get("id").is_none(), "{message}"),
        }
    }
    assert_eq!(
        mcp.child.try_wait().expect("wait"),
        None,
        "capexec mcp ended"
    );
    // Thousands of calls at once: each answered (a result, or the
    // in-flight bound's error), the server up after.
    let count = 3000;
    let first = mcp.send_request(
        "tools/call",
        json!({"name": "file_info", "arguments": {"path": "."}}),
    );
    for _ in 1..count {
        mcp.send_request(
            "tools/call",
            json!({"name": "file_info", "arguments": {"path": "."}}),
        );
    }
    let mut answered = std::collections::HashSet::new();
    while answered.len() < count {
        let message = mcp.next_message();
        let Some(id) = message["id"].as_u64() else {
            continue;
        };
        assert!(
            message["result"]["isError"] == false || message["error"]["code"] == -32600,
            "{message}"
        );
        assert!(id >= first && id < first + count as u64, "{message}");
        answered.insert(id);
    }
    let result = mcp.call("exec", json!({"argv": ["echo", "alive"]}));
    assert_eq!(bytes(&result["stdout"]), b"alive\n");
    assert_eq!(mcp.finish(), 0);
}

/// A hard link to a file outside, put in the root by someone other than
/// the agent (its commands cannot make one: see above), is a way out for
/// the agent's commands: Landlock allows by the path opened, and the link
/// is beneath the root. The file tools replace such a file, but `exec`
/// writes through it.
#[test]
#[ignore = "a limit of Landlock, said in docs/MCP.md (What Landlock cannot see): a hard \
            link in the root to a file outside, made by someone else, is written through by \
            a confined command (Landlock checks the path, and the link's is beneath the root)"]
fn a_hard_link_placed_in_the_root_is_written_through_by_commands() {
    let root = root();
    let outside = Outside::new();
    let link = root.path().join("hard");
    std::fs::hard_link(outside.path().join("secret"), &link).expect("same file system");
    let mut mcp = Mcp::start(Backend::Embedded, root.path(), &[]);
    let (code, _, _) = sh(&mut mcp, "echo PWNED > hard");
    std::fs::remove_file(&link).expect("rm");
    assert_ne!(code, 0, "a confined command wrote through a hard link");
    outside.unchanged("a command writing through a hard link");
}

/// The executor remembers the last 4096 write ids of each process whole:
/// ids as long as a JSON-RPC line allows (16 MiB) made it hold gigabytes
/// (40 ids of 4 MiB grew capexec mcp by 356 MiB). They are refused past
/// 256 bytes, and the memory stays where it was.
pub fn long_write_ids_cannot_grow_the_executor(backend: Backend) {
    let root = root();
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    let holder = mcp
        .served()
        .map_or(mcp.child.id(), |served| served.child.id());
    let reader = mcp.call(
        "exec",
        json!({"command": "cat > got", "keep_stdin_open": true, "yield_ms": 0}),
    );
    let id = reader["process_id"].as_str().expect("id").to_string();
    let accepted = mcp.call(
        "process_input",
        json!({"process_id": id, "data": "a", "write_id": "w".repeat(256)}),
    );
    assert_eq!(accepted["status"], "accepted", "{accepted}");
    let before = resident_kib(holder);
    for n in 0..40 {
        let text = mcp.call_error(
            "process_input",
            json!({"process_id": id, "data": "b", "write_id": format!("{n}{}", "w".repeat(4 << 20))}),
        );
        assert_eq!(
            text,
            format!(
                "capexec: process_input: write_id is {} bytes; at most 256",
                (4 << 20) + n.to_string().len()
            )
        );
    }
    let after = resident_kib(holder);
    assert!(
        after < before + 64 * 1024,
        "resident memory grew from {before} to {after} KiB"
    );
    let closed = mcp.call("process_input", json!({"process_id": id, "close": true}));
    assert_eq!(closed["closed"], true);
    let (_, _, end) = mcp.read_to_end(&id);
    assert_eq!(end["exit"]["code"], 0, "{end}");
    assert_eq!(std::fs::read(root.path().join("got")).expect("got"), b"a");
}

/// A tree deeper than the executor's stack, in the root:
/// `remove_path` with `recursive` once emptied directories recursively, a
/// frame and a descriptor per level, and aborted the whole executor
/// (capexec mcp, or the `capexec serve` every client runs on). It is
/// removed, whole, and the executor goes on.
fn deep_tree_removal(backend: Backend) {
    /// Removes the deep tree with rm(1) (which walks it without
    /// recursion) before the root's TempDir goes, whose remove_dir_all
    /// recurses and would overflow this thread's stack too.
    struct RemoveDeep(PathBuf);
    impl Drop for RemoveDeep {
        fn drop(&mut self) {
            let _ = std::process::Command::new("rm")
                .arg("-rf")
                .arg(&self.0)
                .status();
        }
    }
    let root = root();
    let _remove = RemoveDeep(root.path().join("deep"));
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    let server = mcp.served().map(|served| served.child.id());
    // Made by this process (see make_tower for why not by a command).
    crate::common::data::make_tower(root.path(), "deep", "d", 20000);
    let answer = mcp.call_raw("remove_path", json!({"path": "deep", "recursive": true}));
    assert!(answer["result"].is_object(), "{answer}");
    assert_eq!(answer["result"]["isError"], false, "{answer}");
    assert!(!root.path().join("deep").exists(), "the tree was removed");
    // The executor is still there: capexec mcp answers, and runs.
    let (code, _, _) = sh(&mut mcp, "rm -rf deep");
    assert_eq!(code, 0);
    if let Some(pid) = server {
        assert!(!gone(pid as i32), "capexec serve died");
    }
}

#[test]
fn a_deep_tree_removed_does_not_crash_the_embedded_executor() {
    deep_tree_removal(Backend::Embedded);
}

#[test]
fn a_deep_tree_removed_does_not_crash_capexec_serve() {
    deep_tree_removal(Backend::Unix);
}

/// One `make_directory` (or a `write_file`, which makes missing parents by
/// default) of a path of 2,000 components, within the 4,096 bytes a path
/// may have: `mkdir -p` in the executor once recursed per component and
/// overflowed the stack of the thread that ran it, aborting the executor.
fn deep_path_made(backend: Backend, tool: &str) {
    let root = root();
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    let server = mcp.served().map(|served| served.child.id());
    let path = "c/".repeat(2000);
    let arguments = match tool {
        "make_directory" => json!({"path": path}),
        _ => json!({"path": format!("{path}f"), "content": "x"}),
    };
    let answer = mcp.call_raw(tool, arguments);
    assert!(answer["result"].is_object(), "{answer}");
    let (code, _, _) = sh(&mut mcp, "rm -rf c");
    assert_eq!(code, 0);
    if let Some(pid) = server {
        assert!(!gone(pid as i32), "capexec serve died");
    }
}

#[test]
fn a_deep_path_made_does_not_crash_the_embedded_executor() {
    deep_path_made(Backend::Embedded, "make_directory");
}

#[test]
fn a_deep_path_written_does_not_crash_capexec_serve() {
    deep_path_made(Backend::Unix, "write_file");
}

/// With `--network all`, a confined command that holds a capexec server's
/// token (found in the root, or in the environment the embedded executor
/// passes on: `CAPEXEC_TOKEN` included) logs into that server over TCP,
/// whose peers are not checked for being sandboxed as Unix ones are, and
/// starts an unconfined process there.
#[test]
fn a_confined_command_with_the_network_cannot_drive_a_capexec_server_over_tcp() {
    let root = root();
    let outside = Outside::new();
    let served = Served::start();
    let mut mcp = Mcp::start(Backend::Embedded, root.path(), &["--network", "all"]);
    std::fs::copy(&served.token_file, root.path().join("token")).expect("copy token");
    std::fs::copy(BIN, root.path().join("capexec")).expect("copy capexec");
    let target = outside.path().join("dir/via-tcp");
    // HOME in the root: capexec run reads its known servers from there.
    let (code, stdout, stderr) = sh(
        &mut mcp,
        &format!(
            "HOME=$PWD ./capexec run --connect {} --token-file token -- sh -c 'echo PWNED > {}; echo RAN'",
            served.tcp,
            target.display()
        ),
    );
    assert!(
        !stdout.contains("RAN") && code != 0,
        "a confined command ran a process through capexec serve: {stdout} {stderr}"
    );
    outside.unchanged("a capexec server over TCP");
}
