//! What the agent's commands may do: by default write only beneath the
//! root, start only in it, and reach no network; `--network all` and
//! `--unconfined` as they say, and every tool saying which.

use std::io::Read;
use std::net::TcpListener;
use std::time::Duration;

use serde_json::json;

use crate::client::{Backend, Mcp, bytes};
use crate::common::data::{TempDir, outside_temporary_directories};

crate::mcp_backend_tests!(confinement:
    commands_write_beneath_the_root_only,
    the_network_is_off_unless_asked_for,
    unconfined_commands_can_write_anywhere_and_every_tool_says_so,
);

pub fn commands_write_beneath_the_root_only(backend: Backend) {
    let root = TempDir::new("mcp-root");
    let outside = TempDir::new("mcp-outside");
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    let inside = mcp.call(
        "exec",
        json!({"command": "echo in > inside.txt && mkdir -p a/b && echo deep > a/b/f"}),
    );
    assert_eq!(inside["exit"]["code"], 0, "{inside}");
    assert_eq!(
        std::fs::read(root.path().join("inside.txt")).expect("inside.txt"),
        b"in\n"
    );
    assert_eq!(
        std::fs::read(root.path().join("a/b/f")).expect("a/b/f"),
        b"deep\n"
    );
    let target = outside.path().join("x");
    let refused = mcp.call(
        "exec",
        json!({"argv": ["sh", "-c", "echo out > \"$1\"", "sh", target.display().to_string()]}),
    );
    assert_ne!(refused["exit"]["code"], 0, "{refused}");
    assert!(
        String::from_utf8_lossy(&bytes(&refused["stderr"])).contains("Permission denied"),
        "{refused}"
    );
    assert!(
        !target.exists(),
        "a confined command wrote outside its root"
    );
    // A working directory outside the root is refused, with capexec's tag.
    let text = mcp.call_error(
        "exec",
        json!({"argv": ["true"], "cwd": outside.path().display().to_string()}),
    );
    assert!(
        text.starts_with("capexec: exec: cannot start \"true\": "),
        "{text}"
    );
    assert!(text.ends_with("[capexec:not-allowed]"), "{text}");
    let text = mcp.call_error("exec", json!({"argv": ["true"], "cwd": "../.."}));
    assert!(text.ends_with("[capexec:not-allowed]"), "{text}");
    // The description says where it is confined.
    let tools = mcp.request("tools/list", json!({}));
    let description = tools["result"]["tools"][0]["description"]
        .as_str()
        .expect("description");
    assert!(
        description.ends_with(&format!(
            "Confined to {} on the executor's machine: commands run inside it and may write \
             only beneath it (the system directories are read-only), no network.",
            root.path().display()
        )),
        "{description}"
    );
    // Even a root outside the temporary directories.
    drop(mcp);
    let elsewhere =
        outside_temporary_directories().join(format!("mcp-{}-{backend:?}", std::process::id()));
    std::fs::create_dir_all(&elsewhere).expect("mkdir");
    let mut mcp = Mcp::start(backend, &elsewhere, &[]);
    let tmp = std::env::temp_dir().join(format!("mcp-escape-{}", std::process::id()));
    let refused = mcp.call(
        "exec",
        json!({"argv": ["sh", "-c", "echo out > \"$1\"", "sh", tmp.display().to_string()]}),
    );
    assert_ne!(refused["exit"]["code"], 0, "{refused}");
    assert!(
        !tmp.exists(),
        "a confined command wrote to the temporary directory"
    );
    drop(mcp);
    let _ = std::fs::remove_dir_all(&elsewhere);
}

/// Runs a connection attempt to a listener of this machine from a
/// command of `mcp`, and says whether it connected.
fn connects(mcp: &mut Mcp) -> (bool, serde_json::Value) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("listen");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("address").port();
    let result = mcp.call(
        "exec",
        json!({"argv": ["bash", "-c", format!("echo hello > /dev/tcp/127.0.0.1/{port}")]}),
    );
    let accepted = match listener.accept() {
        Ok((mut stream, _)) => {
            stream.set_nonblocking(false).expect("blocking");
            stream
                .set_read_timeout(Some(Duration::from_secs(10)))
                .expect("timeout");
            let mut said = String::new();
            let _ = stream.read_to_string(&mut said);
            assert_eq!(said, "hello\n");
            true
        }
        Err(_) => false,
    };
    (accepted, result)
}

pub fn the_network_is_off_unless_asked_for(backend: Backend) {
    let root = TempDir::new("mcp");
    let mut mcp = Mcp::start(backend, root.path(), &[]);
    let (accepted, result) = connects(&mut mcp);
    assert!(
        !accepted,
        "a confined command reached the network: {result}"
    );
    assert_ne!(result["exit"]["code"], 0, "{result}");
    drop(mcp);
    let mut mcp = Mcp::start(backend, root.path(), &["--network", "all"]);
    let (accepted, result) = connects(&mut mcp);
    assert!(accepted, "--network all: {result}");
    assert_eq!(result["exit"]["code"], 0, "{result}");
    // Still confined to the root for writes.
    let outside = TempDir::new("mcp-outside");
    let target = outside.path().join("x");
    let refused = mcp.call(
        "exec",
        json!({"argv": ["sh", "-c", "echo out > \"$1\"", "sh", target.display().to_string()]}),
    );
    assert_ne!(refused["exit"]["code"], 0, "{refused}");
    assert!(!target.exists());
    let tools = mcp.request("tools/list", json!({}));
    let description = tools["result"]["tools"][0]["description"]
        .as_str()
        .expect("description");
    assert!(
        description.contains("the network is reachable (--network all)"),
        "{description}"
    );
}

pub fn unconfined_commands_can_write_anywhere_and_every_tool_says_so(backend: Backend) {
    let root = TempDir::new("mcp");
    let outside = TempDir::new("mcp-outside");
    let mut mcp = Mcp::start(backend, root.path(), &["--unconfined"]);
    let tools = mcp.request("tools/list", json!({}));
    let tools = tools["result"]["tools"].as_array().expect("tools").clone();
    assert_eq!(tools.len(), 15);
    for tool in &tools {
        let description = tool["description"].as_str().expect("description");
        assert!(
            description.contains("UNCONFINED (--unconfined)"),
            "{description}"
        );
    }
    let target = outside.path().join("x");
    let result = mcp.call(
        "exec",
        json!({"argv": ["sh", "-c", "echo out > \"$1\"", "sh", target.display().to_string()]}),
    );
    assert_eq!(result["exit"]["code"], 0, "{result}");
    assert_eq!(std::fs::read(&target).expect("x"), b"out\n");
    let (accepted, result) = connects(&mut mcp);
    assert!(accepted, "{result}");
}
