//! What a client gets wrong: the answer says what, and the server goes
//! on serving.

use serde_json::json;

use crate::client::{Backend, Mcp, bytes};
use crate::common::data::TempDir;

crate::mcp_backend_tests!(bad_input:
    bad_input_is_answered_and_the_server_goes_on,
    calls_in_flight_are_bounded_per_session,
);

/// A normal call still works.
fn still_serves(mcp: &mut Mcp) {
    let result = mcp.call("exec", json!({"argv": ["echo", "alive"]}));
    assert_eq!(bytes(&result["stdout"]), b"alive\n");
}

pub fn bad_input_is_answered_and_the_server_goes_on(backend: Backend) {
    let root = TempDir::new("mcp");
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    // A line that is not JSON is ignored (as every official MCP SDK does:
    // an answer could start an error storm with a peer that echoes).
    mcp.send_line("this is not json");
    still_serves(&mut mcp);
    // JSON that is no JSON-RPC message: Invalid Request.
    mcp.send_line(r#"{"jsonrpc":"2.0","id":77,"method":5}"#);
    let answer = mcp.next_message();
    assert_eq!(
        answer,
        json!({"jsonrpc": "2.0", "error": {"code": -32600, "message": "Invalid request"}})
    );
    // A line over 16 MiB is dropped without being held, and said on stderr.
    mcp.send_line(&"y".repeat(17 << 20));
    still_serves(&mut mcp);
    assert!(
        mcp.stderr_text()
            .contains("Incoming message exceeded the maximum line length, discarding it"),
        "{}",
        mcp.stderr_text()
    );
    // An unknown tool: a JSON-RPC error naming the tools.
    let answer = mcp.call_raw("rm_rf", json!({}));
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    assert_eq!(
        answer["error"]["message"],
        "capexec: unknown tool \"rm_rf\"; the tools are: exec, process_output, process_input, \
         process_signal, process_terminate, process_list, read_file, write_file, edit_file, \
         list_directory, search_files, file_info, move_path, remove_path, make_directory"
    );
    // The answer is the news: nothing on stderr for it.
    assert!(
        !mcp.stderr_text().contains("rm_rf"),
        "{}",
        mcp.stderr_text()
    );
    // Wrong argument types, unknown fields, missing ones: tool errors.
    let text = mcp.call_error("exec", json!({"argv": "echo hi"}));
    assert!(
        text.starts_with("capexec: exec: invalid arguments: invalid type: string \"echo hi\""),
        "{text}"
    );
    let text = mcp.call_error("exec", json!({"argv": ["true"], "shell": true}));
    assert!(
        text.starts_with("capexec: exec: invalid arguments: unknown field `shell`"),
        "{text}"
    );
    let text = mcp.call_error("process_output", json!({}));
    assert!(text.contains("missing field `process_id`"), "{text}");
    let text = mcp.call_error("exec", json!({}));
    assert_eq!(
        text,
        "capexec: exec: give argv (a program and its arguments) or command (a line for sh -c)"
    );
    let text = mcp.call_error("exec", json!({"argv": ["true"], "command": "true"}));
    assert_eq!(text, "capexec: exec: give argv or command, not both");
    let text = mcp.call_error("exec", json!({"argv": []}));
    assert_eq!(text, "capexec: exec: argv must not be empty");
    let text = mcp.call_error("exec", json!({"argv": ["no-such-program-here"]}));
    assert!(text.ends_with("[capexec:program-not-found]"), "{text}");
    // A huge argument is taken and answered.
    let huge = "x".repeat(4 << 20);
    let result = mcp.call("exec", json!({"command": "wc -c", "stdin": huge}));
    assert_eq!(bytes(&result["stdout"]), b"4194304\n");
    // Every tool has its input and output schema.
    let tools = mcp.request("tools/list", json!({}));
    let names: Vec<_> = tools["result"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|tool| {
            assert_eq!(tool["inputSchema"]["type"], "object", "{tool}");
            assert_eq!(tool["outputSchema"]["type"], "object", "{tool}");
            tool["name"].as_str().expect("name").to_string()
        })
        .collect();
    assert_eq!(
        names,
        [
            "exec",
            "process_output",
            "process_input",
            "process_signal",
            "process_terminate",
            "process_list",
            "read_file",
            "write_file",
            "edit_file",
            "list_directory",
            "search_files",
            "file_info",
            "move_path",
            "remove_path",
            "make_directory"
        ]
    );
    still_serves(&mut mcp);
    assert_eq!(mcp.finish(), 0);
}

pub fn calls_in_flight_are_bounded_per_session(backend: Backend) {
    let root = TempDir::new("mcp");
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    // It ends once the test says so, through a file.
    let running = mcp.call(
        "exec",
        json!({"command": "while [ ! -e go ]; do sleep 0.05; done", "yield_ms": 0}),
    );
    let read = json!({"name": "process_output",
                      "arguments": {"process_id": "p1", "wait_ms": 300000,
                                    "after_seq": running["next_seq"]}});
    let ids: Vec<u64> = (0..70)
        .map(|_| mcp.send_request("tools/call", read.clone()))
        .collect();
    // Six are one too many, answered at once; 64 wait for output.
    let mut refused = Vec::new();
    while refused.len() < 6 {
        let message = mcp.next_message();
        assert_eq!(message["error"]["code"], -32600, "{message}");
        assert_eq!(
            message["error"]["message"],
            "capexec: 64 calls of this session are being worked on: wait for their answers"
        );
        refused.push(message["id"].as_u64().expect("id"));
    }
    // Any tool: the bound is the session's.
    let answer = mcp.call_raw("process_list", json!({}));
    assert_eq!(answer["error"]["code"], -32600, "{answer}");
    // The process's end answers the others.
    std::fs::write(root.path().join("go"), "").expect("go");
    let mut answered = refused.clone();
    while answered.len() < ids.len() {
        let message = mcp.next_message();
        assert_eq!(message["result"]["isError"], false, "{message}");
        answered.push(message["id"].as_u64().expect("an answer"));
    }
    answered.sort_unstable();
    assert_eq!(answered, ids);
    still_serves(&mut mcp);
}
