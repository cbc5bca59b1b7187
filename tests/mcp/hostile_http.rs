//! The agent as the adversary over Streamable HTTP, where one
//! `capexec mcp --listen` serves many MCP sessions: a session cannot
//! name, signal, read, write to, cancel or end another session's
//! processes and calls, by id or from a command.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::client::{gone, pid_in};
use crate::common::data::TempDir;
use crate::http::{Listening, call, initialize, mcp_headers, request};

/// A tool call's result in `session` (an `isError` result included).
fn tool(authority: &str, session: &str, id: u64, name: &str, arguments: Value) -> Value {
    let answer = call(
        authority,
        session,
        id,
        "tools/call",
        json!({"name": name, "arguments": arguments}),
    );
    answer["result"].clone()
}

/// A tool call that must fail with "no process" for `process_id`.
fn no_process(authority: &str, session: &str, id: u64, name: &str, arguments: Value) {
    let result = tool(authority, session, id, name, arguments.clone());
    assert_eq!(result["isError"], true, "{name} {arguments}: {result}");
    let text = result["content"][0]["text"].as_str().expect("text");
    assert!(
        text.starts_with(&format!(
            "capexec: {name}: no process \"p1\" in this session"
        )),
        "{text}"
    );
}

#[test]
fn hostile_http_one_session_cannot_reach_anothers_processes_or_calls() {
    let root = TempDir::new("mcp-hostile-http");
    std::fs::create_dir(root.path().join("b")).expect("mkdir");
    let listening = Listening::start(root.path(), &[]);
    let authority = listening.authority.clone();
    let a = initialize(&authority);
    let b = initialize(&authority);
    assert_ne!(a, b);
    // B's process, p1 of B.
    let started = tool(
        &authority,
        &b,
        1,
        "exec",
        json!({"command": "echo $$ > b/pid; exec sleep 300", "yield_ms": 0}),
    );
    assert_eq!(
        started["structuredContent"]["process_id"], "p1",
        "{started}"
    );
    let victim = pid_in(&root.path().join("b/pid"));
    // A, with no process of its own, names B's id: unknown in A.
    let listed = tool(&authority, &a, 1, "process_list", json!({}));
    assert_eq!(
        listed["structuredContent"]["processes"],
        json!([]),
        "{listed}"
    );
    no_process(
        &authority,
        &a,
        2,
        "process_terminate",
        json!({"process_id": "p1"}),
    );
    no_process(
        &authority,
        &a,
        3,
        "process_signal",
        json!({"process_id": "p1", "signal": "KILL"}),
    );
    no_process(
        &authority,
        &a,
        4,
        "process_input",
        json!({"process_id": "p1", "data": "x", "close": true}),
    );
    no_process(
        &authority,
        &a,
        5,
        "process_output",
        json!({"process_id": "p1"}),
    );
    // Nor from a command of A (the same root, the same user).
    let killed = tool(
        &authority,
        &a,
        6,
        "exec",
        json!({"command": format!("kill -KILL {victim}")}),
    );
    assert_ne!(killed["structuredContent"]["exit"]["code"], 0, "{killed}");
    assert!(!gone(victim), "A ended B's process");
    // A made-up session is no session.
    let answer = request(
        &authority,
        "POST",
        &mcp_headers(Some("00000000-0000-0000-0000-000000000000")),
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
               "params": {"name": "process_terminate", "arguments": {"process_id": "p1"}}})
        .to_string()
        .as_bytes(),
    );
    assert_eq!(answer.status, 404, "{answer:?}");
    // A cancels the id of B's exec while it waits: B's call goes on and
    // hands its process back.
    let (b_session, b_authority) = (b.clone(), authority.clone());
    let waiting = std::thread::spawn(move || {
        tool(
            &b_authority,
            &b_session,
            9,
            "exec",
            json!({"command": "echo $$ > b/waiting; exec sleep 300", "yield_ms": 4000}),
        )
    });
    let waiter = pid_in(&root.path().join("b/waiting"));
    let cancelled = request(
        &authority,
        "POST",
        &mcp_headers(Some(&a)),
        br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":9}}"#,
    );
    assert_eq!(cancelled.status, 202, "{cancelled:?}");
    let since = Instant::now();
    let answer = waiting.join().expect("B's exec");
    assert_eq!(answer["structuredContent"]["running"], true, "{answer}");
    assert_eq!(answer["structuredContent"]["process_id"], "p2", "{answer}");
    assert!(since.elapsed() < Duration::from_secs(60));
    assert!(!gone(waiter), "A's cancellation ended B's process");
    // A's session ends (DELETE): B's processes go on.
    let deleted = request(&authority, "DELETE", &[("Mcp-Session-Id", &a)], b"");
    assert_eq!(deleted.status / 100, 2, "{deleted:?}");
    let listed = tool(&authority, &b, 10, "process_list", json!({}));
    let processes = listed["structuredContent"]["processes"]
        .as_array()
        .expect("processes")
        .clone();
    assert_eq!(processes.len(), 2, "{listed}");
    assert!(processes.iter().all(|p| p["running"] == true), "{listed}");
    assert!(!gone(victim) && !gone(waiter));
    // B ends its own.
    for (id, process) in [(11, "p1"), (12, "p2")] {
        let ended = tool(
            &authority,
            &b,
            id,
            "process_terminate",
            json!({"process_id": process}),
        );
        assert_eq!(ended["isError"], false, "{ended}");
    }
    crate::common::eventually("B's processes end", || gone(victim) && gone(waiter));
}
