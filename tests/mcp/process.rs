//! The process tools: exact bytes and statuses, processes handed back and
//! read to their end, stdin, signals, cancellation, progress, and the end
//! of a session.

use serde_json::json;

use crate::client::{Backend, Mcp, bytes, gone, pid_in};
use crate::common::data::TempDir;
use crate::common::eventually;

crate::mcp_backend_tests!(process:
    exec_answers_exact_bytes_and_the_exit_code,
    a_death_by_signal_is_said_by_name,
    output_over_the_limit_keeps_head_and_tail_and_says_the_cut,
    a_long_command_is_handed_back_and_read_to_its_end,
    input_is_idempotent_by_write_id_and_closes,
    a_signal_by_name_reaches_the_process,
    cancelling_exec_terminates_its_process,
    exec_reports_progress_while_it_waits,
    the_session_end_ends_its_processes,
    process_list_shows_the_sessions_processes,
    a_session_holds_at_most_64_processes,
    output_the_executor_no_longer_has_is_a_gap,
    a_client_that_vanishes_mid_call_ends_the_session,
    lossless_output_is_never_lost,
);

pub fn exec_answers_exact_bytes_and_the_exit_code(backend: Backend) {
    let root = TempDir::new("mcp");
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    let result = mcp.call(
        "exec",
        json!({"command": "printf 'a\\000b\\n'; printf 'oops' >&2; exit 7"}),
    );
    assert_eq!(result["running"], false, "{result}");
    assert_eq!(bytes(&result["stdout"]), b"a\0b\n");
    assert_eq!(bytes(&result["stderr"]), b"oops");
    assert_eq!(
        result["exit"],
        json!({"code": 7, "signal": null, "signal_number": null, "core_dumped": false,
               "shell_code": 7, "timed_out": false, "killed_by_memory_limit": false})
    );
    // Bytes that are not UTF-8 come in base64, exactly; argv needs no shell.
    let result = mcp.call(
        "exec",
        json!({"argv": ["printf", "\\377\\001"], "stdin": "ignored"}),
    );
    assert_eq!(result["stdout"]["encoding"], "base64", "{result}");
    assert_eq!(bytes(&result["stdout"]), b"\xff\x01");
    assert_eq!(result["exit"]["code"], 0);
    // stdin, env and a relative cwd.
    std::fs::create_dir(root.path().join("sub")).expect("mkdir");
    let result = mcp.call(
        "exec",
        json!({"command": "cat; printf '%s %s' \"$GREETING\" \"${PWD##*/}\"",
               "stdin": "in\n", "env": {"GREETING": "hello"}, "cwd": "sub"}),
    );
    assert_eq!(bytes(&result["stdout"]), b"in\nhello sub");
    assert_eq!(mcp.finish(), 0);
}

pub fn a_death_by_signal_is_said_by_name(backend: Backend) {
    let root = TempDir::new("mcp");
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    let result = mcp.call("exec", json!({"command": "kill -KILL $$"}));
    assert_eq!(result["exit"]["code"], json!(null), "{result}");
    assert_eq!(result["exit"]["signal"], "KILL");
    assert_eq!(result["exit"]["signal_number"], 9);
    assert_eq!(result["exit"]["shell_code"], 137);
    let result = mcp.call("exec", json!({"argv": ["sleep", "30"], "timeout_ms": 100}));
    assert_eq!(result["exit"]["timed_out"], true, "{result}");
    assert_eq!(result["exit"]["signal"], "TERM");
}

pub fn output_over_the_limit_keeps_head_and_tail_and_says_the_cut(backend: Backend) {
    let root = TempDir::new("mcp");
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    // 100000 bytes: "H", 99998 "-", "T".
    let result = mcp.call(
        "exec",
        json!({"command": "printf H; head -c 99998 /dev/zero | tr '\\000' -; printf T",
               "max_output_bytes": 1000}),
    );
    let stdout = &result["stdout"];
    assert_eq!(stdout["bytes"], 100_000, "{result}");
    assert_eq!(stdout["cut_bytes"], 99_000);
    assert_eq!(stdout["text"], format!("H{}", "-".repeat(499)));
    assert_eq!(stdout["tail"], format!("{}T", "-".repeat(499)));
    let text = mcp.call_error("exec", json!({"argv": ["true"], "max_output_bytes": 0}));
    assert_eq!(
        text,
        "capexec: exec: max_output_bytes must be 1 to 1048576, not 0"
    );
}

pub fn a_long_command_is_handed_back_and_read_to_its_end(backend: Backend) {
    let root = TempDir::new("mcp");
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    // It cannot end before its input comes: the answer is the hand-back.
    let result = mcp.call(
        "exec",
        json!({"command": "echo started; read line; echo \"got $line\"; echo bye >&2; exit 3",
               "keep_stdin_open": true, "yield_ms": 200}),
    );
    assert_eq!(result["running"], true, "{result}");
    assert_eq!(result["exit"], json!(null));
    let id = result["process_id"]
        .as_str()
        .expect("process_id")
        .to_string();
    assert_eq!(id, "p1");
    let input = mcp.call("process_input", json!({"process_id": id, "data": "x\n"}));
    assert_eq!(input, json!({"status": "accepted", "closed": false}));
    let (stdout, stderr, last) = mcp.read_to_end(&id);
    assert_eq!(stdout, b"started\ngot x\n");
    assert_eq!(stderr, b"bye\n");
    assert_eq!(last["exit"]["code"], 3, "{last}");
    assert_eq!(last["running"], false);
    // Nothing comes after the close: the same read again is empty.
    let again = mcp.call(
        "process_output",
        json!({"process_id": id, "after_seq": last["next_seq"]}),
    );
    assert_eq!(bytes(&again["stdout"]), b"");
    assert_eq!(again["closed"], true);
    assert_eq!(again["next_seq"], last["next_seq"]);
    // Paging by seq: one chunk per answer with max_bytes 1.
    let first = mcp.call("process_output", json!({"process_id": id, "max_bytes": 1}));
    assert_eq!(bytes(&first["stdout"]), b"started\n", "{first}");
    let unknown = mcp.call_error("process_output", json!({"process_id": "p9"}));
    assert!(
        unknown.starts_with("capexec: process_output: no process \"p9\""),
        "{unknown}"
    );
}

pub fn input_is_idempotent_by_write_id_and_closes(backend: Backend) {
    let root = TempDir::new("mcp");
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    let result = mcp.call(
        "exec",
        json!({"command": "read a; read b; printf '%s|%s|' \"$a\" \"$b\"; cat",
               "keep_stdin_open": true, "yield_ms": 0}),
    );
    let id = result["process_id"]
        .as_str()
        .expect("process_id")
        .to_string();
    for _ in 0..2 {
        let input = mcp.call(
            "process_input",
            json!({"process_id": id, "data": "one\n", "write_id": "w1"}),
        );
        assert_eq!(input["status"], "accepted");
    }
    let input = mcp.call(
        "process_input",
        json!({"process_id": id, "data": "two\n", "write_id": "w2", "close": true}),
    );
    assert_eq!(input, json!({"status": "accepted", "closed": true}));
    let (stdout, _, last) = mcp.read_to_end(&id);
    assert_eq!(
        stdout, b"one|two|",
        "the repeated write w1 was applied once"
    );
    assert_eq!(last["exit"]["code"], 0);
    let closed = mcp.call("process_input", json!({"process_id": id, "data": "late"}));
    assert_ne!(closed["status"], "accepted", "{closed}");
    let text = mcp.call_error("process_input", json!({"process_id": id}));
    assert_eq!(
        text,
        "capexec: process_input: give data to write, close: true, or both"
    );
}

pub fn a_signal_by_name_reaches_the_process(backend: Backend) {
    let root = TempDir::new("mcp");
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    let result = mcp.call(
        "exec",
        json!({"command": "trap 'echo caught; exit 5' USR1; echo ready; while :; do sleep 0.05; done",
               "yield_ms": 0}),
    );
    let id = result["process_id"]
        .as_str()
        .expect("process_id")
        .to_string();
    // The trap is set once "ready" is out.
    let mut seen = Vec::new();
    let mut after = 0;
    while !seen.ends_with(b"ready\n") {
        let answer = mcp.call(
            "process_output",
            json!({"process_id": id, "after_seq": after, "wait_ms": 5000}),
        );
        seen.extend(bytes(&answer["stdout"]));
        after = answer["next_seq"].as_u64().expect("next_seq");
        assert_eq!(answer["running"], true, "{answer}");
    }
    let signalled = mcp.call(
        "process_signal",
        json!({"process_id": id, "signal": "sigusr1"}),
    );
    assert_eq!(signalled, json!({"signal": "USR1", "running": true}));
    let (stdout, _, last) = mcp.read_to_end(&id);
    assert_eq!(stdout, b"ready\ncaught\n");
    assert_eq!(last["exit"]["code"], 5);
    let after_exit = mcp.call(
        "process_signal",
        json!({"process_id": id, "signal": "TERM"}),
    );
    assert_eq!(after_exit, json!({"signal": "TERM", "running": false}));
    let text = mcp.call_error(
        "process_signal",
        json!({"process_id": id, "signal": "NOPE"}),
    );
    assert_eq!(text, "capexec: process_signal: unknown signal \"NOPE\"");
    // process_terminate: a running tree ends (SIGTERM).
    let result = mcp.call("exec", json!({"argv": ["sleep", "60"], "yield_ms": 0}));
    let id = result["process_id"]
        .as_str()
        .expect("process_id")
        .to_string();
    assert_eq!(
        mcp.call("process_terminate", json!({"process_id": id})),
        json!({"running": true})
    );
    let (_, _, last) = mcp.read_to_end(&id);
    assert_eq!(last["exit"]["signal"], "TERM", "{last}");
}

pub fn cancelling_exec_terminates_its_process(backend: Backend) {
    let root = TempDir::new("mcp");
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    let id = mcp.send_request(
        "tools/call",
        json!({"name": "exec", "arguments": {"command": "echo $$ > pid; exec sleep 60",
                                             "yield_ms": 120000}}),
    );
    let pid = pid_in(&root.path().join("pid"));
    assert!(!gone(pid));
    mcp.send_line(
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                "params": {"requestId": id, "reason": "test"}})
        .to_string(),
    );
    eventually("the cancelled exec's process is gone", || gone(pid));
    // The server goes on; the process is listed as ended (once the
    // executor has seen its exit).
    eventually("p1 is listed as ended", || {
        let list = mcp.call("process_list", json!({}));
        assert_eq!(list["processes"][0]["process_id"], "p1", "{list}");
        list["processes"][0]["running"] == false
    });
    // A process handed back is not ended by a later cancellation.
    let result = mcp.call(
        "exec",
        json!({"command": "echo $$ > pid2; exec sleep 60", "yield_ms": 0}),
    );
    assert_eq!(result["running"], true);
    let handed = pid_in(&root.path().join("pid2"));
    // A long-poll of it, cancelled: the read ends, the process does not.
    let read = mcp.send_request(
        "tools/call",
        json!({"name": "process_output",
               "arguments": {"process_id": result["process_id"], "wait_ms": 300000,
                             "after_seq": result["next_seq"]}}),
    );
    mcp.send_line(
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                "params": {"requestId": read}})
        .to_string(),
    );
    let list = mcp.call("process_list", json!({}));
    assert_eq!(list["processes"][1]["running"], true, "{list}");
    // A read past the newest seq is refused with capexec's tag.
    let text = mcp.call_error(
        "process_output",
        json!({"process_id": result["process_id"], "after_seq": 1000}),
    );
    assert!(text.ends_with("[capexec:invalid-argument]"), "{text}");
    assert!(!gone(handed), "a handed-back process runs on");
    assert_eq!(mcp.finish(), 0);
    eventually("the session's end ends it", || gone(handed));
}

pub fn exec_reports_progress_while_it_waits(backend: Backend) {
    let root = TempDir::new("mcp");
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    let id = mcp.send_request(
        "tools/call",
        json!({"name": "exec", "arguments": {"argv": ["sleep", "2.5"]},
               "_meta": {"progressToken": "tok-1"}}),
    );
    let answer = mcp.answer(id);
    assert_eq!(
        answer["result"]["structuredContent"]["exit"]["code"], 0,
        "{answer}"
    );
    let progress: Vec<_> = mcp
        .notifications
        .iter()
        .filter(|note| note["method"] == "notifications/progress")
        .collect();
    assert!(!progress.is_empty(), "{:?}", mcp.notifications);
    for (n, note) in progress.iter().enumerate() {
        assert_eq!(note["params"]["progressToken"], "tok-1");
        assert_eq!(note["params"]["progress"], json!(n as f64 + 1.0));
    }
    // Without a token, none.
    mcp.notifications.clear();
    mcp.call("exec", json!({"argv": ["sleep", "1.5"]}));
    assert_eq!(mcp.notifications, Vec::<serde_json::Value>::new());
}

pub fn the_session_end_ends_its_processes(backend: Backend) {
    let root = TempDir::new("mcp");
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    let mut pids = Vec::new();
    for n in 0..3 {
        let result = mcp.call(
            "exec",
            json!({"command": format!("echo $$ > pid{n}; exec sleep 60"), "yield_ms": 0}),
        );
        assert_eq!(result["running"], true, "{result}");
        pids.push(pid_in(&root.path().join(format!("pid{n}"))));
    }
    assert_eq!(mcp.finish(), 0);
    for pid in pids {
        eventually(&format!("process {pid} ended with the session"), || {
            gone(pid)
        });
    }
}

pub fn process_list_shows_the_sessions_processes(backend: Backend) {
    let root = TempDir::new("mcp");
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    assert_eq!(
        mcp.call("process_list", json!({})),
        json!({"processes": [], "limit": 64})
    );
    mcp.call("exec", json!({"argv": ["true"]}));
    let running = mcp.call("exec", json!({"argv": ["sleep", "60"], "yield_ms": 0}));
    let list = mcp.call("process_list", json!({}));
    let processes = list["processes"].as_array().expect("processes");
    assert_eq!(processes.len(), 2, "{list}");
    assert_eq!(processes[0]["argv"], json!(["true"]));
    assert_eq!(processes[0]["running"], false);
    assert_eq!(processes[0]["exit"]["code"], 0);
    assert_eq!(processes[1]["process_id"], running["process_id"]);
    assert_eq!(processes[1]["argv"], json!(["sleep", "60"]));
    assert_eq!(processes[1]["running"], true);
    assert_eq!(processes[1]["exit"], json!(null));
    // Another session has processes of its own.
    let mut other = Mcp::start(backend, root.path(), &[]);
    assert_eq!(
        other.call("process_list", json!({}))["processes"],
        json!([])
    );
}

pub fn losing_the_server_ends_capexec_mcp_with_125(backend: Backend) {
    let root = TempDir::new("mcp");
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    mcp.call("exec", json!({"argv": ["true"]}));
    mcp.kill_server();
    assert_eq!(mcp.wait(), 125);
    let stderr = mcp.stderr_text();
    assert!(
        stderr.contains("capexec: mcp: lost the capexec server: "),
        "{stderr}"
    );
}

pub fn kept_processes_outlive_the_session(backend: Backend) {
    let root = TempDir::new("mcp");
    let mut mcp = Mcp::start(backend, root.path(), &["--keep-processes"]);
    let result = mcp.call(
        "exec",
        json!({"command": "echo $$ > pid; exec sleep 60", "yield_ms": 0}),
    );
    assert_eq!(result["running"], true);
    let pid = pid_in(&root.path().join("pid"));
    assert_eq!(mcp.finish(), 0);
    // Without --keep-processes it would be gone by now (the session's end
    // waits for that).
    assert!(!gone(pid), "a kept process ended with its session");
    // SAFETY: kill(2) of the test's own process, seen alive just now.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    eventually("the kept process is killed", || gone(pid));
}

pub mod unix_only {
    #[test]
    fn losing_the_server_ends_capexec_mcp_with_125() {
        super::losing_the_server_ends_capexec_mcp_with_125(crate::client::Backend::Unix);
    }

    #[test]
    fn kept_processes_outlive_the_session() {
        super::kept_processes_outlive_the_session(crate::client::Backend::Unix);
    }
}

pub fn a_session_holds_at_most_64_processes(backend: Backend) {
    let root = TempDir::new("mcp");
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    mcp.call("exec", json!({"argv": ["true"]}));
    for _ in 1..64 {
        let result = mcp.call("exec", json!({"argv": ["sleep", "60"], "yield_ms": 0}));
        assert_eq!(result["running"], true);
    }
    // Full: the ended p1 is forgotten for p65.
    let result = mcp.call("exec", json!({"argv": ["sleep", "60"], "yield_ms": 0}));
    assert_eq!(result["process_id"], "p65");
    let list = mcp.call("process_list", json!({}));
    assert_eq!(list["processes"].as_array().map(Vec::len), Some(64));
    assert_eq!(list["processes"][0]["process_id"], "p2");
    // Full of running ones: refused, saying why.
    let text = mcp.call_error("exec", json!({"argv": ["true"]}));
    assert_eq!(
        text,
        "capexec: exec: this session holds 64 processes and every one is running: end one \
         first (process_terminate)"
    );
    mcp.call("process_terminate", json!({"process_id": "p2"}));
    mcp.read_to_end("p2");
    let result = mcp.call("exec", json!({"argv": ["true"]}));
    assert_eq!(result["process_id"], "p66");
    let text = mcp.call_error("process_output", json!({"process_id": "p2"}));
    assert!(text.contains("no process \"p2\""), "{text}");
}

pub fn output_the_executor_no_longer_has_is_a_gap(backend: Backend) {
    let root = TempDir::new("mcp");
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    // 4 MiB, written only once the process is handed back and unread.
    let result = mcp.call(
        "exec",
        json!({"command": "read go; head -c 4194304 /dev/zero | tr '\\000' x; echo; echo end",
               "keep_stdin_open": true, "yield_ms": 0}),
    );
    assert_eq!(result["running"], true, "{result}");
    let id = result["process_id"]
        .as_str()
        .expect("process_id")
        .to_string();
    mcp.call(
        "process_input",
        json!({"process_id": id, "data": "go\n", "close": true}),
    );
    eventually("the process ended", || {
        mcp.call("process_list", json!({}))["processes"][0]["running"] == false
    });
    let mut stdout = Vec::new();
    let mut gaps = Vec::new();
    let mut after = 0;
    loop {
        let answer = mcp.call(
            "process_output",
            json!({"process_id": id, "after_seq": after, "max_bytes": 1048576}),
        );
        gaps.extend(answer["gaps"].as_array().cloned().unwrap_or_default());
        stdout.extend(bytes(&answer["stdout"]));
        after = answer["next_seq"].as_u64().expect("next_seq");
        if answer["closed"] == true {
            break;
        }
    }
    assert!(!gaps.is_empty(), "4 MiB fit in a 1 MiB log?");
    assert_eq!(gaps[0]["from_seq"], 1, "{gaps:?}");
    assert!(stdout.ends_with(b"x\nend\n"));
    assert!(stdout.len() < 4 << 20, "what was evicted is not answered");
    assert!(stdout[..stdout.len() - 5].iter().all(|&byte| byte == b'x'));
}

pub fn a_client_that_vanishes_mid_call_ends_the_session(backend: Backend) {
    let root = TempDir::new("mcp");
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    let handed = mcp.call(
        "exec",
        json!({"command": "echo $$ > pid1; exec sleep 60", "yield_ms": 0}),
    );
    assert_eq!(handed["running"], true);
    mcp.send_request(
        "tools/call",
        json!({"name": "exec", "arguments": {"command": "echo $$ > pid2; exec sleep 60",
                                             "yield_ms": 300000}}),
    );
    mcp.send_request(
        "tools/call",
        json!({"name": "process_output", "arguments": {"process_id": "p1", "wait_ms": 300000,
                                                       "after_seq": handed["next_seq"]}}),
    );
    let pids = [
        pid_in(&root.path().join("pid1")),
        pid_in(&root.path().join("pid2")),
    ];
    // Gone without a word: its end of stdin closes. rmcp gives the calls in
    // flight 5 s to answer, then cancels them: not the 300 s they asked.
    let started = std::time::Instant::now();
    assert_eq!(mcp.finish(), 0);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "capexec mcp waited for the calls in flight"
    );
    for pid in pids {
        eventually(&format!("process {pid} ended with the session"), || {
            gone(pid)
        });
    }
}

pub fn lossless_output_is_never_lost(backend: Backend) {
    let root = TempDir::new("mcp");
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    // The same 4 MiB that leave a gap without it.
    let result = mcp.call(
        "exec",
        json!({"command": "read go; head -c 4194304 /dev/zero | tr '\\000' x; echo end",
               "keep_stdin_open": true, "yield_ms": 0, "lossless": true}),
    );
    let id = result["process_id"]
        .as_str()
        .expect("process_id")
        .to_string();
    mcp.call(
        "process_input",
        json!({"process_id": id, "data": "go\n", "close": true}),
    );
    let (stdout, _, last) = mcp.read_to_end(&id);
    assert_eq!(last["exit"]["code"], 0, "{last}");
    assert_eq!(stdout.len(), (4 << 20) + 4);
    assert!(stdout.ends_with(b"xend\n"));
    assert!(stdout[..4 << 20].iter().all(|&byte| byte == b'x'));
}
