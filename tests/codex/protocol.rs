//! Codex's exec-server protocol, method by method: each case runs against
//! `capexec codex-bridge` and against the pinned `codex exec-server
//! --listen stdio`, and what a client sees must agree. Where the bridge
//! differs on purpose (docs/CODEX.md lists each difference), the case
//! asserts the difference on its own.

use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

use crate::codex_home::codex;
use crate::common::data::TempDir;
use crate::peer::{Failure, Kind, Peer, Pushed, file_uri};

/// Runs `case` against both servers, each in a fresh directory, and
/// returns what each saw with its directory written `<DIR>`.
fn both(name: &str, case: impl Fn(&mut Peer, &Path) -> Value) -> Option<(Value, Value)> {
    let codex = codex()?;
    let run = |kind| {
        let dir = TempDir::new(&format!("codex-protocol-{name}"));
        let mut peer = Peer::start(kind, codex, dir.path());
        peer.initialize();
        let seen = case(&mut peer, dir.path());
        let text = seen
            .to_string()
            .replace(&dir.path().display().to_string(), "<DIR>");
        serde_json::from_str(&text).expect("JSON")
    };
    Some((run(Kind::Bridge), run(Kind::Codex)))
}

/// Asserts both servers agree on `case`.
fn agree(name: &str, case: impl Fn(&mut Peer, &Path) -> Value) {
    if let Some((bridge, codex)) = both(name, case) {
        assert_eq!(
            bridge, codex,
            "{name}: capexec codex-bridge (left) and codex exec-server (right) differ"
        );
    }
}

fn code(result: Result<Value, Failure>) -> Value {
    match result {
        Ok(value) => json!({"ok": value}),
        Err(failure) => json!({"error": failure.code}),
    }
}

fn with_message(result: Result<Value, Failure>) -> Value {
    match result {
        Ok(value) => json!({"ok": value}),
        Err(failure) => json!({"error": failure.code, "message": failure.message}),
    }
}

fn start(
    peer: &mut Peer,
    dir: &Path,
    id: &str,
    argv: &[&str],
    extra: Value,
) -> Result<Value, Failure> {
    let mut params = json!({
        "processId": id,
        "argv": argv,
        "cwd": file_uri(dir),
        "env": {"PATH": "/usr/local/bin:/usr/bin:/bin"},
        "tty": false,
    });
    if let (Some(params), Some(extra)) = (params.as_object_mut(), extra.as_object()) {
        params.extend(extra.clone());
    }
    peer.call("process/start", params)
}

/// The bridge's order, beyond what both share: every output, then the
/// exit, then the close.
fn assert_bridge_order(pushed: &Pushed) {
    let outputs = pushed
        .order
        .iter()
        .filter(|kind| **kind == "output")
        .count();
    let mut expected = vec!["output"; outputs];
    expected.extend(["exited", "closed"]);
    assert_eq!(pushed.order, expected);
}

/// What both servers must agree on about a process's pushes. Deliberate:
/// the bridge pushes in seq order; Codex's own server may not (observed).
fn summary(kind: Kind, pushed: &Pushed) -> Value {
    if kind == Kind::Bridge {
        assert!(
            pushed.seqs.windows(2).all(|pair| pair[0] < pair[1]),
            "the bridge pushed seqs out of order: {:?}",
            pushed.seqs
        );
    }
    json!({
        "stdout": String::from_utf8_lossy(&pushed.stdout),
        "stderr": String::from_utf8_lossy(&pushed.stderr),
        "pty": String::from_utf8_lossy(&pushed.pty),
        "exitCode": pushed.exit_code,
        "sandboxDenied": pushed.sandbox_denied,
        // Codex's own server may push the exit before the last output;
        // both end with one exit and then the close.
        "closedLast": pushed.order.last() == Some(&"closed"),
        "exits": pushed.order.iter().filter(|kind| **kind == "exited").count(),
    })
}

#[test]
fn a_request_before_initialize_is_refused_alike() {
    let Some(codex) = codex() else { return };
    let mut seen = Vec::new();
    for kind in [Kind::Bridge, Kind::Codex] {
        let dir = TempDir::new("codex-protocol-early");
        let mut peer = Peer::start(kind, codex, dir.path());
        let early = peer.call("process/start", json!({"processId": "p", "argv": ["true"], "cwd": file_uri(dir.path()), "env": {}, "tty": false}));
        seen.push(with_message(early));
        // ...and the connection goes on.
        peer.initialize();
        seen.push(code(peer.call("environment/status", json!({}))));
    }
    assert_eq!(seen[..2], seen[2..]);
}

#[test]
fn initialize_describes_the_executor_truthfully() {
    let Some(codex) = codex() else { return };
    let dir = TempDir::new("codex-protocol-initialize");
    // The shell is the account's login shell whatever `$SHELL` says, or
    // whether it is set at all (as under a service manager or CI).
    for shell in [None, Some("/bin/sh"), Some("/nonexistent/zsh")] {
        let adjust = |command: &mut std::process::Command| match shell {
            Some(shell) => drop(command.env("SHELL", shell)),
            None => drop(command.env_remove("SHELL")),
        };
        let ours = Peer::start_with(Kind::Bridge, codex, dir.path(), adjust).initialize();
        let theirs = Peer::start_with(Kind::Codex, codex, dir.path(), adjust).initialize();
        assert_eq!(
            ours["environmentInfo"]["shell"], theirs["environmentInfo"]["shell"],
            "environmentInfo.shell with SHELL={shell:?}"
        );
    }
    let mut bridge = Peer::start(Kind::Bridge, codex, dir.path());
    let mut reference = Peer::start(Kind::Codex, codex, dir.path());
    let ours = bridge.initialize();
    let theirs = reference.initialize();
    let (ours, theirs) = (&ours["environmentInfo"], &theirs["environmentInfo"]);
    for field in ["shell", "cwd", "userHomeDir", "platformOs", "tempDir"] {
        assert_eq!(ours[field], theirs[field], "environmentInfo.{field}");
    }
    // Deliberate: the version is capexec's, and only what the bridge
    // implements is advertised.
    assert_eq!(ours["executorVersion"], env!("CARGO_PKG_VERSION"));
    assert_eq!(ours["capabilities"], json!({"fsWatchMissing": true}));
    assert_eq!(theirs["capabilities"]["fsWatchMissing"], true);
    assert!(ours.get("providerId").is_none() && ours.get("prependPathDirs").is_none());
    assert_eq!(bridge.call("environment/info", json!({})).unwrap(), *ours);
    assert_eq!(
        bridge.call("environment/status", json!({})).unwrap(),
        json!({"status": "ready"})
    );
    // A second initialize on the connection is refused.
    assert_eq!(
        bridge
            .call("initialize", json!({"clientName": "again"}))
            .unwrap_err()
            .code,
        -32600
    );
}

#[test]
fn a_command_pushes_its_output_exit_and_close() {
    agree("pushed", |peer, dir| {
        let started = start(
            peer,
            dir,
            "p1",
            &["sh", "-c", "printf out; printf err >&2; exit 3"],
            json!({}),
        );
        let pushed = peer.pushed_until_closed("p1");
        if peer.kind == Kind::Bridge {
            assert_bridge_order(&pushed);
        }
        json!({"start": started.map(|mut result| result["sandboxType"].take()).ok(), "pushed": summary(peer.kind, &pushed)})
    });
}

#[test]
fn read_serves_the_retained_log_after_the_close() {
    agree("read", |peer, dir| {
        start(
            peer,
            dir,
            "p1",
            &["sh", "-c", "echo one; echo two >&2; exit 4"],
            json!({}),
        )
        .expect("start");
        peer.pushed_until_closed("p1");
        let read = peer
            .call("process/read", json!({"processId": "p1", "afterSeq": 0}))
            .expect("read");
        let mut text = String::new();
        for chunk in read["chunks"].as_array().expect("chunks") {
            text.push_str(&String::from_utf8_lossy(
                &BASE64
                    .decode(chunk["chunk"].as_str().expect("chunk"))
                    .expect("base64"),
            ));
        }
        let mut lines: Vec<&str> = text.lines().collect();
        lines.sort();
        let unknown = peer.call("process/read", json!({"processId": "nope"}));
        json!({
            "lines": lines,
            "exited": read["exited"], "exitCode": read["exitCode"], "closed": read["closed"],
            "nextSeq": read["nextSeq"], "failure": read["failure"],
            "unknown": code(unknown),
        })
    });
}

#[test]
fn starts_are_checked_alike() {
    agree("start-checks", |peer, dir| {
        start(peer, dir, "p1", &["true"], json!({})).expect("start");
        peer.pushed_until_closed("p1");
        let duplicate = start(peer, dir, "p1", &["true"], json!({}));
        let empty = start(peer, dir, "p2", &[], json!({}));
        let not_a_uri = peer.call(
            "process/start",
            json!({"processId": "p3", "argv": ["true"], "cwd": "/tmp", "env": {}, "tty": false}),
        );
        let missing = peer.call(
            "process/start",
            json!({"processId": "p4", "cwd": file_uri(dir), "env": {}, "tty": false}),
        );
        let no_program = start(peer, dir, "p5", &["/nonexistent/program"], json!({}));
        json!({
            "duplicate": with_message(duplicate),
            "empty": with_message(empty),
            "notAUri": code(not_a_uri),
            "missingArgv": code(missing),
            "noProgram": code(no_program),
        })
    });
}

#[test]
fn stdin_writes_are_applied_once_per_write_id() {
    agree("write", |peer, dir| {
        start(
            peer,
            dir,
            "cat",
            &["head", "-n", "2"],
            json!({"pipeStdin": true}),
        )
        .expect("start");
        let hello = BASE64.encode("hello\n");
        let first = peer.call(
            "process/write",
            json!({"processId": "cat", "chunk": hello, "writeId": "w1"}),
        );
        let again = peer.call(
            "process/write",
            json!({"processId": "cat", "chunk": hello, "writeId": "w1"}),
        );
        let second = peer.call(
            "process/write",
            json!({"processId": "cat", "chunk": BASE64.encode("bye\n"), "writeId": "w2"}),
        );
        let pushed = peer.pushed_until_closed("cat");
        let empty_id = peer.call(
            "process/write",
            json!({"processId": "cat", "chunk": hello, "writeId": ""}),
        );
        start(peer, dir, "closed", &["sleep", "5"], json!({})).expect("start");
        let closed = peer.call(
            "process/write",
            json!({"processId": "closed", "chunk": hello, "writeId": "w1"}),
        );
        peer.call("process/terminate", json!({"processId": "closed"}))
            .expect("terminate");
        let unknown = peer.call(
            "process/write",
            json!({"processId": "nope", "chunk": hello, "writeId": "w1"}),
        );
        json!({
            "first": code(first), "again": code(again), "second": code(second),
            "pushed": summary(peer.kind, &pushed),
            "emptyId": with_message(empty_id), "stdinClosed": code(closed), "unknown": code(unknown),
        })
    });
}

#[test]
fn interrupt_reaches_the_command_and_terminate_ends_it() {
    agree("signals", |peer, dir| {
        start(
            peer,
            dir,
            "trap",
            &[
                "sh",
                "-c",
                "trap 'exit 7' INT; echo ready; while :; do sleep 0.05; done",
            ],
            json!({}),
        )
        .expect("start");
        peer.wait_for_output("trap", "ready");
        let signalled = peer.call(
            "process/signal",
            json!({"processId": "trap", "signal": "interrupt"}),
        );
        let pushed = peer.pushed_until_closed("trap");
        let after = peer.call(
            "process/signal",
            json!({"processId": "trap", "signal": "interrupt"}),
        );
        let unknown = peer.call(
            "process/signal",
            json!({"processId": "nope", "signal": "interrupt"}),
        );
        start(peer, dir, "sleep", &["sleep", "100"], json!({})).expect("start");
        let running = peer.call("process/terminate", json!({"processId": "sleep"}));
        let ended = peer.pushed_until_closed("sleep");
        let finished = peer.call("process/terminate", json!({"processId": "sleep"}));
        let never = peer.call("process/terminate", json!({"processId": "nope"}));
        json!({
            "signalled": code(signalled), "trap": summary(peer.kind, &pushed), "after": code(after), "unknown": code(unknown),
            "running": code(running), "killedExit": terminated_exit(peer.kind, ended.exit_code),
            "finished": code(finished), "never": code(never),
        })
    });
}

/// Deliberate: the bridge's terminate is capexec's, SIGTERM first (SIGKILL
/// after a grace), so a command may clean up; Codex's kills at once.
fn terminated_exit(kind: Kind, exit_code: Option<i64>) -> Value {
    let expected = match kind {
        Kind::Bridge => 128 + 15,
        Kind::Codex => 128 + 9,
    };
    assert_eq!(
        exit_code,
        Some(expected),
        "{kind:?}: the exit of a terminated command"
    );
    json!("terminated")
}

#[test]
fn the_bridge_delivers_every_signal_codex_cannot_name() {
    let Some(codex) = codex() else { return };
    let dir = TempDir::new("codex-protocol-any-signal");
    // Deliberate: Codex's server knows only `interrupt`.
    let mut reference = Peer::start(Kind::Codex, codex, dir.path());
    reference.initialize();
    start(
        &mut reference,
        dir.path(),
        "s",
        &["sleep", "100"],
        json!({}),
    )
    .expect("start");
    let refused = reference.call(
        "process/signal",
        json!({"processId": "s", "signal": "terminate"}),
    );
    assert_eq!(refused.unwrap_err().code, -32602);
    let mut bridge = Peer::start(Kind::Bridge, codex, dir.path());
    bridge.initialize();
    for (name, code) in [
        ("terminate", 143),
        ("SIGHUP", 129),
        ("kill", 137),
        ("USR1", 138),
    ] {
        start(&mut bridge, dir.path(), name, &["sleep", "100"], json!({})).expect("start");
        bridge
            .call("process/signal", json!({"processId": name, "signal": name}))
            .unwrap_or_else(|error| panic!("{name}: {error:?}"));
        assert_eq!(
            bridge.pushed_until_closed(name).exit_code,
            Some(code),
            "{name}"
        );
    }
    assert_eq!(
        bridge
            .call(
                "process/signal",
                json!({"processId": "kill", "signal": "NOPE"})
            )
            .unwrap_err()
            .code,
        -32602
    );
}

#[test]
fn a_terminal_merges_its_output_as_pty() {
    agree("tty", |peer, dir| {
        start(
            peer,
            dir,
            "t",
            &["sh", "-c", "test -t 0 && test -t 1 && echo tty; stty size"],
            json!({"tty": true}),
        )
        .expect("start");
        summary(peer.kind, &peer.pushed_until_closed("t"))
    });
}

#[test]
fn a_terminal_takes_typed_input() {
    agree("tty-input", |peer, dir| {
        start(peer, dir, "cat", &["cat", "-n"], json!({"tty": true})).expect("start");
        let typed = peer.call("process/write", json!({"processId": "cat", "chunk": BASE64.encode("typed line\n\u{4}"), "writeId": "1"}));
        let pushed = peer.pushed_until_closed("cat");
        let text = String::from_utf8_lossy(&pushed.pty).replace('\r', "");
        json!({"typed": code(typed), "numbered": text.lines().any(|line| line.trim() == "1\ttyped line"), "exit": pushed.exit_code})
    });
}

#[test]
fn the_child_environment_follows_env_and_env_policy() {
    agree("environment", |peer, dir| {
        let mut seen = json!({});
        let cases = [
            ("exact", json!({"env": {"ONLY": "this"}})),
            (
                "core",
                json!({"env": {"SET": "1"}, "envPolicy": {"inherit": "core", "ignoreDefaultExcludes": false, "exclude": [], "set": {}, "includeOnly": []}}),
            ),
            (
                "filtered",
                json!({"env": {"PATH": "/usr/bin:/bin", "MY_TOKEN": "kept"}, "envPolicy": {"inherit": "all", "ignoreDefaultExcludes": false, "exclude": ["CARGO*", "RUST*"], "set": {"FROM_SET": "yes"}, "includeOnly": ["PATH", "*TOKEN", "FROM_SET", "HOME", "CAPEXEC_TEST_SECRET"]}}),
            ),
        ];
        for (name, extra) in cases {
            start(peer, dir, name, &["/usr/bin/env"], extra).expect("start");
            let pushed = peer.pushed_until_closed(name);
            let mut lines: Vec<String> = String::from_utf8_lossy(&pushed.stdout)
                .lines()
                .map(|line| without_codex_helpers(peer.kind, line))
                .collect();
            lines.sort();
            seen[name] = json!(lines);
        }
        seen
    });
}

/// Deliberate: Codex's own server puts the directory of its helper
/// binaries first in an inherited PATH; the bridge has none to add.
fn without_codex_helpers(kind: Kind, line: &str) -> String {
    let Some(path) = line.strip_prefix("PATH=") else {
        return line.to_string();
    };
    let kept: Vec<&str> = path
        .split(':')
        .filter(|dir| !dir.ends_with("/codex-path"))
        .collect();
    if kind == Kind::Bridge {
        assert_eq!(
            kept.len(),
            path.split(':').count(),
            "the bridge adds to PATH: {path}"
        );
    }
    format!("PATH={}", kept.join(":"))
}

/// A tree for the file cases: a file, a symlink to it, a directory.
fn tree(dir: &Path) {
    std::fs::create_dir_all(dir.join("d/sub")).expect("mkdir");
    std::fs::write(dir.join("d/a.txt"), "hello\n").expect("write");
    std::os::unix::fs::symlink("a.txt", dir.join("d/link")).expect("symlink");
}

fn fs(peer: &mut Peer, method: &str, params: Value) -> Value {
    code(peer.call(method, params))
}

#[test]
fn file_metadata_reads_and_writes_agree() {
    agree("fs-basics", |peer, dir| {
        tree(dir);
        let d = |rest: &str| file_uri(&dir.join("d").join(rest));
        let mut metadata = Vec::new();
        for path in ["a.txt", "link", "", "nope", "a.txt/x"] {
            let mut answer = fs(peer, "fs/getMetadata", json!({"path": d(path)}));
            if let Some(ok) = answer.get_mut("ok") {
                // Times differ between runs; their presence does not.
                ok["modifiedAtMs"] = json!(ok["modifiedAtMs"].as_i64().is_some_and(|ms| ms > 0));
                if ok["isDirectory"] == true {
                    ok["size"] = json!("a directory's");
                }
            }
            metadata.push(answer);
        }
        json!({
            "metadata": metadata,
            "read": fs(peer, "fs/readFile", json!({"path": d("a.txt")})),
            "readLink": fs(peer, "fs/readFile", json!({"path": d("link")})),
            "readDirectory": fs(peer, "fs/readFile", json!({"path": d("")})),
            "readMissing": fs(peer, "fs/readFile", json!({"path": d("nope")})),
            "write": fs(peer, "fs/writeFile", json!({"path": d("new.txt"), "dataBase64": BASE64.encode("new\n")})),
            "written": std::fs::read_to_string(dir.join("d/new.txt")).ok(),
            "writeNoParent": fs(peer, "fs/writeFile", json!({"path": d("nodir/f"), "dataBase64": "aGkK"})),
            "writeBadBase64": fs(peer, "fs/writeFile", json!({"path": d("bad"), "dataBase64": "***"})),
            "noPath": fs(peer, "fs/getMetadata", json!({})),
            "httpUri": fs(peer, "fs/readFile", json!({"path": "http://x/y"})),
        })
    });
}

#[test]
fn directories_are_made_listed_copied_and_removed_alike() {
    agree("fs-trees", |peer, dir| {
        tree(dir);
        let d = |rest: &str| file_uri(&dir.join("d").join(rest));
        let mut listing = peer
            .call("fs/readDirectory", json!({"path": d("")}))
            .expect("list");
        if let Some(entries) = listing["entries"].as_array_mut() {
            entries.sort_by_key(|entry| entry["fileName"].as_str().unwrap_or_default().to_string());
        }
        json!({
            "list": listing,
            "listFile": fs(peer, "fs/readDirectory", json!({"path": d("a.txt")})),
            "mkdirNoParent": fs(peer, "fs/createDirectory", json!({"path": d("x/y"), "recursive": false})),
            "mkdirs": fs(peer, "fs/createDirectory", json!({"path": d("x/y"), "recursive": true})),
            "mkdirsAgain": fs(peer, "fs/createDirectory", json!({"path": d("x/y"), "recursive": true})),
            "write": fs(peer, "fs/writeFile", json!({"path": d("x/y/f"), "dataBase64": "aGkK"})),
            "copyNotRecursive": fs(peer, "fs/copy", json!({"sourcePath": d("x"), "destinationPath": d("x2"), "recursive": false})),
            "copy": fs(peer, "fs/copy", json!({"sourcePath": d("x"), "destinationPath": d("x2"), "recursive": true})),
            "copied": std::fs::read_to_string(dir.join("d/x2/y/f")).ok(),
            "copyFile": fs(peer, "fs/copy", json!({"sourcePath": d("a.txt"), "destinationPath": d("b.txt"), "recursive": false})),
            "copiedFile": std::fs::read_to_string(dir.join("d/b.txt")).ok(),
            "removeNotRecursive": fs(peer, "fs/remove", json!({"path": d("x2"), "recursive": false, "force": false})),
            "remove": fs(peer, "fs/remove", json!({"path": d("x2"), "recursive": true, "force": false})),
            "removed": dir.join("d/x2").exists(),
            "removeMissing": fs(peer, "fs/remove", json!({"path": d("x2"), "recursive": true, "force": false})),
            "removeMissingForced": fs(peer, "fs/remove", json!({"path": d("x2"), "recursive": true, "force": true})),
        })
    });
}

#[test]
fn walks_canonical_paths_and_block_reads_agree() {
    agree("fs-walk", |peer, dir| {
        tree(dir);
        std::fs::create_dir_all(dir.join("d/.hidden/inner")).expect("mkdir");
        std::fs::write(dir.join("d/.hidden/inner/f"), "x").expect("write");
        std::fs::write(dir.join("d/sub/.dotfile"), "x").expect("write");
        let d = |rest: &str| file_uri(&dir.join("d").join(rest));
        let options = json!({"maxDepth": 6, "maxDirectories": 2000, "maxEntries": 20000, "followDirectorySymlinks": true, "pruneHiddenDirectories": true});
        let mut walk = peer
            .call("fs/walk", json!({"path": d(""), "options": options}))
            .expect("walk");
        if let Some(entries) = walk["entries"].as_array_mut() {
            entries.sort_by_key(|entry| entry["path"].as_str().unwrap_or_default().to_string());
        }
        json!({
            "walk": walk,
            "walkNoOptions": fs(peer, "fs/walk", json!({"path": d(""), "options": {}})),
            "canonical": fs(peer, "fs/canonicalize", json!({"path": d("link")})),
            "canonicalMissing": fs(peer, "fs/canonicalize", json!({"path": d("nope")})),
            "open": fs(peer, "fs/open", json!({"handleId": "h1", "path": d("a.txt")})),
            "block": fs(peer, "fs/readBlock", json!({"handleId": "h1", "offset": 1, "len": 3})),
            "blockAtEnd": fs(peer, "fs/readBlock", json!({"handleId": "h1", "offset": 6, "len": 3})),
            "close": fs(peer, "fs/close", json!({"handleId": "h1"})),
            "blockAfterClose": fs(peer, "fs/readBlock", json!({"handleId": "h1", "offset": 0, "len": 3})),
            "openMissing": fs(peer, "fs/open", json!({"handleId": "h2", "path": d("nope")})),
        })
    });
}

#[test]
fn unknown_methods_and_malformed_messages_are_answered_and_serving_goes_on() {
    agree("bad-input", |peer, _dir| {
        let unknown = peer.call("nope/x", json!({}));
        peer.send_raw(b"{bad json\n");
        let malformed = peer.answer(-1);
        let status = peer.call("environment/status", json!({}));
        json!({"unknown": code(unknown), "malformed": code(malformed), "status": code(status)})
    });
}

#[test]
fn a_line_of_64_mib_is_refused_without_being_held() {
    let Some(codex) = codex() else { return };
    let dir = TempDir::new("codex-protocol-huge");
    let mut bridge = Peer::start(Kind::Bridge, codex, dir.path());
    bridge.initialize();
    let mut huge = vec![b'x'; 64 << 20];
    huge.push(b'\n');
    bridge.send_raw(&huge);
    let refused = bridge.answer(-1).unwrap_err();
    assert_eq!(refused.code, -32600);
    assert!(
        refused.message.contains("longer than"),
        "{}",
        refused.message
    );
    assert_eq!(
        bridge.call("environment/status", json!({})).unwrap(),
        json!({"status": "ready"})
    );
    let rss_kib = crate::common::procfs::status_field(bridge.pid(), "VmRSS:").expect("VmRSS");
    assert!(
        rss_kib < 48 * 1024,
        "the bridge holds {rss_kib} KiB after a 64 MiB line"
    );
}

#[test]
fn a_client_that_vanishes_mid_output_releases_its_processes() {
    let Some(codex) = codex() else { return };
    let dir = TempDir::new("codex-protocol-vanish");
    let mut bridge = Peer::start(Kind::Bridge, codex, dir.path());
    bridge.initialize();
    let pid_file = dir.path().join("pid");
    let script = format!("echo $$ > {}; exec yes", pid_file.display());
    start(
        &mut bridge,
        dir.path(),
        "yes",
        &["sh", "-c", &script],
        json!({}),
    )
    .expect("start");
    bridge.wait_for_output("yes", "y\ny\n");
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .expect("pid")
        .trim()
        .parse()
        .expect("a pid");
    let status = bridge.close();
    assert!(status.success(), "the bridge ended with {status}");
    crate::common::eventually("the command ends with its client", || {
        !Path::new(&format!("/proc/{pid}")).exists()
    });
}

#[test]
fn a_server_lost_under_the_bridge_ends_it_instead_of_leaving_codex_waiting() {
    let served = crate::common::cli::Served::start();
    let dir = TempDir::new("codex-protocol-lost");
    let mut command = std::process::Command::new(crate::common::cli::BIN);
    command.args(["codex-bridge", "--connect", &served.unix]);
    let mut bridge = Peer::spawn(Kind::Bridge, command);
    bridge.initialize();
    start(
        &mut bridge,
        dir.path(),
        "s",
        &["sh", "-c", "echo started; exec sleep 100"],
        json!({}),
    )
    .expect("start");
    bridge.wait_for_output("s", "started");
    let mut served = served;
    served.child.kill().expect("kill the server");
    served.child.wait().expect("reap the server");
    let status = bridge.exit();
    assert_eq!(status.code(), Some(125), "the bridge ended with {status}");
}

fn watch(peer: &mut Peer, id: u64, missing: Vec<String>, present: Option<String>) -> Value {
    let mut params = json!({"watchId": id, "missing": missing});
    if let Some(present) = present {
        params["present"] = json!(present);
    }
    code(peer.call("fs/watchMissing", params))
}

#[test]
fn watches_of_missing_paths_are_taken_alike() {
    agree("watch-missing", |peer, dir| {
        tree(dir);
        let d = |rest: &str| file_uri(&dir.join("d").join(rest));
        json!({
            "appears": watch(peer, 1, vec![d("top.md")], None),
            "goes": watch(peer, 2, vec![d("other.md")], Some(d("a.txt"))),
            "already": watch(peer, 3, vec![d("a.txt")], None),
            "presentGone": watch(peer, 4, vec![d("x.md")], Some(d("gone"))),
            "nothing": watch(peer, 5, vec![], None),
            "relative": watch(peer, 6, vec!["/relative".to_string()], None),
            "noMissing": code(peer.call("fs/watchMissing", json!({"watchId": 7}))),
        })
    });
}

#[test]
fn the_bridge_says_once_when_a_missing_path_appears_or_a_present_one_goes() {
    let Some(codex) = codex() else { return };
    // Deliberate: Codex's own server (0.169.0) was seen to say nothing when
    // two watches share a directory; the bridge says it for each.
    let dir = TempDir::new("codex-protocol-watch-told");
    tree(dir.path());
    let d = |rest: &str| file_uri(&dir.path().join("d").join(rest));
    let mut bridge = Peer::start(Kind::Bridge, codex, dir.path());
    bridge.initialize();
    assert_eq!(
        watch(&mut bridge, 1, vec![d("top.md")], None),
        json!({"ok": {"watching": true}})
    );
    assert_eq!(
        watch(&mut bridge, 2, vec![d("other.md")], Some(d("a.txt"))),
        json!({"ok": {"watching": true}})
    );
    std::fs::write(dir.path().join("d/top.md"), "x").expect("write");
    assert_eq!(
        bridge.notification(),
        json!({"method": "fs/missingChanged", "params": {"watchId": 1}})
    );
    std::fs::remove_file(dir.path().join("d/a.txt")).expect("remove");
    assert_eq!(
        bridge.notification(),
        json!({"method": "fs/missingChanged", "params": {"watchId": 2}})
    );
}

#[test]
fn a_missing_path_beneath_missing_directories_is_watched_level_by_level() {
    let Some(codex) = codex() else { return };
    let dir = TempDir::new("codex-protocol-watch-deep");
    // Deliberate: Codex's own server says nothing when such a path appears
    // (observed with 0.169.0); the bridge follows the directories down.
    let mut bridge = Peer::start(Kind::Bridge, codex, dir.path());
    bridge.initialize();
    let agents = dir.path().join("new/deeper/AGENTS.md");
    let watched = bridge
        .call(
            "fs/watchMissing",
            json!({"watchId": 7, "missing": [file_uri(&agents)]}),
        )
        .expect("watch");
    assert_eq!(watched, json!({"watching": true}));
    std::fs::create_dir_all(dir.path().join("new/deeper")).expect("mkdir");
    std::fs::write(&agents, "# agents\n").expect("write");
    let told = bridge.notification();
    assert_eq!(
        told,
        json!({"method": "fs/missingChanged", "params": {"watchId": 7}})
    );
    // Said once: the id is free again, and the path is there now.
    let again = bridge
        .call(
            "fs/watchMissing",
            json!({"watchId": 7, "missing": [file_uri(&agents)]}),
        )
        .expect("watch");
    assert_eq!(again, json!({"watching": false}));
}

#[test]
fn flags_that_need_a_websocket_are_refused_over_stdio() {
    for (flags, line) in [
        (
            &["--keep-session", "5"][..],
            "capexec: codex-bridge: --keep-session needs --listen ws://HOST:PORT: over stdio \
             Codex never reconnects, so a session ends with stdin\n",
        ),
        (
            &["--ws-token-file", "/dev/null"][..],
            "capexec: codex-bridge: --ws-token-file is the token of --listen ws://HOST:PORT\n",
        ),
    ] {
        let mut args = vec!["codex-bridge"];
        args.extend(flags);
        let done = crate::common::cli::finish(crate::common::cli::capexec(&args), Some(Vec::new()));
        assert_eq!(
            (
                done.code,
                done.stdout.as_slice(),
                crate::common::cli::text(&done.stderr).as_str()
            ),
            (125, &b""[..], line),
            "{flags:?}"
        );
    }
}

/// Codex's `workspace-write` intent (as Codex 0.169.0 sent it with
/// `fs/writeFile`) for the workspace `ws`.
fn workspace_write_intent(ws: &Path) -> Value {
    let fixture = include_str!("fixtures/writefile-workspace-write.json")
        .replace("/tmp/h-cap/ws-p", &ws.display().to_string());
    let call: Value = serde_json::from_str(&fixture).expect("the fixture is JSON");
    call["sandbox"].clone()
}

#[test]
fn block_reads_and_copies_under_a_sandbox_intent_stay_where_it_allows() {
    let Some(codex) = codex() else { return };
    // Not under /tmp, which the intent makes writable.
    let base = crate::common::data::outside_temporary_directories()
        .join(format!("codex-intent-fs-{}", std::process::id()));
    let (ws, outside) = (base.join("ws"), base.join("outside"));
    std::fs::create_dir_all(&ws).expect("mkdir");
    std::fs::create_dir_all(&outside).expect("mkdir");
    std::fs::write(ws.join("a.txt"), "inside\n").expect("write");
    std::fs::write(outside.join("o.txt"), "outside\n").expect("write");
    let sandbox = workspace_write_intent(&ws);
    let mut bridge = Peer::start(Kind::Bridge, codex, &ws);
    bridge.initialize();
    let uri = |path: &Path| file_uri(path);

    let opened = bridge.call(
        "fs/open",
        json!({"handleId": "h", "path": uri(&ws.join("a.txt")), "sandbox": sandbox}),
    );
    assert_eq!(opened, Ok(json!({"handleId": "h"})));
    let block = bridge
        .call(
            "fs/readBlock",
            json!({"handleId": "h", "offset": 0, "len": 64, "sandbox": sandbox}),
        )
        .expect("read a block");
    assert_eq!(block["chunk"], BASE64.encode("inside\n"));
    assert_eq!(
        bridge.call("fs/close", json!({"handleId": "h", "sandbox": sandbox})),
        Ok(json!({}))
    );
    // Readable everywhere the intent reads: the whole file system.
    let read_outside = bridge.call(
        "fs/open",
        json!({"handleId": "o", "path": uri(&outside.join("o.txt")), "sandbox": sandbox}),
    );
    assert_eq!(read_outside, Ok(json!({"handleId": "o"})));

    let copied = bridge.call(
        "fs/copy",
        json!({"sourcePath": uri(&ws.join("a.txt")), "destinationPath": uri(&ws.join("b.txt")), "recursive": false, "sandbox": sandbox}),
    );
    assert_eq!(copied, Ok(json!({})));
    assert_eq!(
        std::fs::read_to_string(ws.join("b.txt")).expect("copied"),
        "inside\n"
    );
    let escaped = bridge.call(
        "fs/copy",
        json!({"sourcePath": uri(&ws.join("a.txt")), "destinationPath": uri(&outside.join("b.txt")), "recursive": false, "sandbox": sandbox}),
    );
    assert!(escaped.is_err(), "a copy out of the workspace: {escaped:?}");
    assert!(
        !outside.join("b.txt").exists(),
        "the copy out of the workspace was made"
    );
    drop(bridge);
    let _ = std::fs::remove_dir_all(&base);
}

/// `--root DIR`: files beneath DIR only; commands write only beneath it;
/// Codex's intent narrowed to it (stricter, never refused for asking more
/// than DIR allows): `.git` read-only, new entries beside it, nothing
/// written outside nor in /tmp, which the intent would make writable.
#[test]
fn the_root_confines_files_commands_and_codexs_intent() {
    let Some(codex) = codex() else { return };
    let base = crate::common::data::outside_temporary_directories()
        .join(format!("codex-root-{}", std::process::id()));
    let (ws, outside) = (base.join("ws"), base.join("outside"));
    std::fs::create_dir_all(ws.join(".git")).expect("mkdir");
    std::fs::create_dir_all(&outside).expect("mkdir");
    std::fs::write(ws.join(".git/config"), "[core]\n").expect("write");
    std::fs::write(outside.join("o.txt"), "outside\n").expect("write");
    let in_tmp = std::env::temp_dir().join(format!("codex-root-{}", std::process::id()));
    let mut bridge = Peer::start_with(Kind::Bridge, codex, &ws, |command| {
        command.arg("--root").arg(&ws);
    });
    bridge.initialize();

    let read_outside = bridge.call(
        "fs/readFile",
        json!({"path": file_uri(&outside.join("o.txt"))}),
    );
    assert!(read_outside.is_err(), "{read_outside:?}");
    assert_eq!(
        bridge.call(
            "fs/writeFile",
            json!({"path": file_uri(&ws.join("a.txt")), "dataBase64": BASE64.encode("a\n")}),
        ),
        Ok(json!({}))
    );

    let script = format!(
        "try() {{ if out=$(sh -c \"$1\" 2>&1); then echo \"done: $1\"; else echo \"denied: $1\"; fi; }}; \
         try 'echo top > top'; try 'echo x >> .git/config'; try 'echo x > {outside}/x'; \
         try 'echo x > {tmp}'",
        outside = outside.display(),
        tmp = in_tmp.display()
    );
    let expected = |carved: bool| {
        format!(
            "done: echo top > top\n{git}denied: echo x > {outside}/x\ndenied: echo x > {tmp}\n",
            git = if carved {
                "denied: echo x >> .git/config\n"
            } else {
                "done: echo x >> .git/config\n"
            },
            outside = outside.display(),
            tmp = in_tmp.display()
        )
    };
    for (id, extra, carved) in [
        ("plain", json!({}), false),
        (
            "intent",
            json!({"sandbox": workspace_write_intent(&ws)}),
            true,
        ),
    ] {
        let started = start(&mut bridge, &ws, id, &["bash", "-c", &script], extra);
        assert!(started.is_ok(), "{id}: {started:?}");
        let pushed = bridge.pushed_until_closed(id);
        assert_eq!(
            String::from_utf8_lossy(&pushed.stdout),
            expected(carved),
            "{id}: {}",
            String::from_utf8_lossy(&pushed.stderr)
        );
        std::fs::write(ws.join(".git/config"), "[core]\n").expect("reset");
    }
    assert!(!outside.join("x").exists());
    assert!(!in_tmp.exists());
    drop(bridge);
    let _ = std::fs::remove_dir_all(&base);
}
