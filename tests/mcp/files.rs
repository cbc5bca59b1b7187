//! The file tools through `capexec mcp` (their behaviour in depth is in
//! tests/it/mcp_files.rs): the root's files, what commands see of them,
//! and paths outside refused with capexec's tag.

use serde_json::json;

use crate::client::{Backend, Mcp, bytes};
use crate::common::data::TempDir;

crate::mcp_backend_tests!(files:
    file_tools_work_beneath_the_root_and_refuse_outside_it,
);

pub fn file_tools_work_beneath_the_root_and_refuse_outside_it(backend: Backend) {
    let root = TempDir::new("mcp");
    let outside = TempDir::new("mcp-outside");
    std::fs::write(outside.path().join("secret"), "s").expect("write");
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    let written = mcp.call(
        "write_file",
        json!({"path": "dir/a.txt", "content": "one\ntwo\n"}),
    );
    assert_eq!(written["size"], 8, "{written}");
    assert_eq!(
        std::fs::read(root.path().join("dir/a.txt")).expect("a.txt"),
        b"one\ntwo\n"
    );
    let edited = mcp.call(
        "edit_file",
        json!({"path": "dir/a.txt", "edits": [{"old_text": "two", "new_text": "2"}]}),
    );
    assert_eq!(edited["replacements"], 1, "{edited}");
    // A command sees what the file tools wrote, and the other way round.
    let result = mcp.call(
        "exec",
        json!({"command": "cat dir/a.txt; echo three >> dir/a.txt"}),
    );
    assert_eq!(bytes(&result["stdout"]), b"one\n2\n");
    let read = mcp.call("read_file", json!({"path": "dir/a.txt"}));
    assert_eq!(read["content"], "one\n2\nthree\n", "{read}");
    // Outside the root: refused, tagged, untouched.
    let secret = outside.path().join("secret").display().to_string();
    let text = mcp.call_error("read_file", json!({"path": secret}));
    assert!(text.starts_with("capexec: read_file: "), "{text}");
    assert!(text.ends_with("[capexec:outside-directory]"), "{text}");
    let text = mcp.call_error("write_file", json!({"path": "../escape", "content": "x"}));
    assert!(text.contains("[capexec:"), "{text}");
    assert!(
        !root
            .path()
            .parent()
            .expect("parent")
            .join("escape")
            .exists()
    );
    let text = mcp.call_error("remove_path", json!({"path": secret}));
    assert!(text.ends_with("[capexec:outside-directory]"), "{text}");
    assert!(outside.path().join("secret").exists());
}
