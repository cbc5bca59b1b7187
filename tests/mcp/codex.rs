//! The real Codex (the pinned `codex exec`, offline, with a scripted model
//! on loopback) as the MCP client of `capexec mcp`, declared in its
//! `config.toml` as `[mcp_servers.capexec]`: the model calls capexec's
//! `exec` and `edit_file`, and what they did on disk and what the model
//! read are checked.

use serde_json::{Value, json};

use crate::codex_home::{CodexHome, SandboxMode, codex, toml_string};
use crate::common::cli::BIN;
use crate::scripted_model::{Reply, Request, ScriptedModel, Step};

/// Codex offers an MCP server's tools to the model as the namespace
/// `mcp__SERVER` (`{"type": "namespace", "name": "mcp__capexec", "tools":
/// [...]}`); the model calls one with that `namespace` and the tool's own
/// name. The step checks capexec's tool is offered there first.
fn call(tool: &'static str, arguments: Value) -> Step {
    Step::from(move |request: &Request| {
        let offered = request.body["tools"]
            .as_array()
            .and_then(|tools| tools.iter().find(|entry| entry["name"] == "mcp__capexec"))
            .ok_or("Codex offered no namespace mcp__capexec")?;
        if offered["type"] != "namespace"
            || !offered["tools"]
                .as_array()
                .is_some_and(|tools| tools.iter().any(|entry| entry["name"] == tool))
        {
            return Err(format!("no {tool} in what Codex offered: {offered}"));
        }
        Ok(Reply::CallIn {
            namespace: "mcp__capexec".into(),
            name: tool.into(),
            arguments: arguments.clone(),
        })
    })
}

#[test]
fn codex_calls_capexec_exec_and_edit_file_over_stdio() {
    let Some(codex) = codex() else {
        return;
    };
    let home = CodexHome::local(SandboxMode::DangerFullAccess);
    let workspace = home.workspace.display().to_string();
    let table = format!(
        "command = {}\nargs = [\"mcp\", \"--root\", {}]\n",
        toml_string(BIN),
        toml_string(&workspace),
    );
    turn(codex, home, &table);
}

/// The same with `capexec mcp --listen` on loopback with a bearer token,
/// declared to Codex by its `url` and the header.
#[test]
fn codex_calls_capexec_exec_and_edit_file_over_http_with_a_token() {
    let Some(codex) = codex() else {
        return;
    };
    let home = CodexHome::local(SandboxMode::DangerFullAccess);
    let secrets = crate::common::data::TempDir::new("mcp-codex-token");
    let token = "bearer-token-codex-presents-0123456789";
    let token_file = secrets.path().join("token");
    std::fs::write(&token_file, token).expect("token file");
    std::fs::set_permissions(
        &token_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .expect("chmod");
    let file = token_file.display().to_string();
    let server = crate::http::Listening::start(&home.workspace, &["--http-token-file", &file]);
    let table = format!(
        "url = {}\nhttp_headers = {{ Authorization = {} }}\n",
        toml_string(&server.url),
        toml_string(&format!("Bearer {token}")),
    );
    turn(codex, home, &table);
    drop(server);
}

/// One turn of Codex whose `[mcp_servers.capexec]` is `table`: the model
/// calls capexec's exec, then edit_file.
fn turn(codex: &'static std::path::Path, mut home: CodexHome, table: &str) {
    home.add_config(&format!("\n[mcp_servers.capexec]\n{table}"));
    crate::common::run_on_runtime(async move {
        let model = ScriptedModel::start(vec![
            call(
                "exec",
                json!({"command": "printf 'one\\ntwo\\n' > notes.txt; echo written; exit 4"}),
            ),
            call(
                "edit_file",
                json!({"path": "notes.txt", "edits": [{"old_text": "two", "new_text": "2"}]}),
            ),
            Step::message("done"),
        ])
        .await;
        let finished = home
            .exec(codex, &model.base_url(), "follow the script")
            .await;
        model.assert_followed(&finished.context());
        finished.assert_answered("done");
        assert_eq!(
            std::fs::read(home.workspace.join("notes.txt")).expect("notes.txt"),
            b"one\n2\n"
        );
        let outputs = model.tool_outputs();
        assert_eq!(outputs.len(), 2, "{outputs:?}\n{}", finished.context());
        // What the model read: Codex's "Wall time" line, then the tool's
        // one text block, the JSON of its structured result.
        let read = |index: usize| -> Value {
            let text = &outputs[index].text;
            let (head, json) = text
                .split_once("\nOutput:\n")
                .unwrap_or_else(|| panic!("no Output: in {text:?}"));
            assert!(head.starts_with("Wall time: "), "{text:?}");
            serde_json::from_str(json).unwrap_or_else(|error| panic!("{error}: {json:?}"))
        };
        assert_eq!(
            read(0),
            json!({
                "process_id": "p1",
                "running": false,
                "exit": {"code": 4, "signal": null, "signal_number": null, "core_dumped": false,
                         "shell_code": 4, "timed_out": false, "killed_by_memory_limit": false},
                "stdout": {"text": "written\n", "tail": "", "encoding": "utf-8", "bytes": 8,
                           "cut_bytes": 0},
                "stderr": {"text": "", "tail": "", "encoding": "utf-8", "bytes": 0, "cut_bytes": 0},
                "gaps": [],
                "next_seq": 3,
            })
        );
        let mut edited = read(1);
        let version = edited
            .as_object_mut()
            .and_then(|object| object.remove("version"));
        assert!(
            version
                .as_ref()
                .and_then(Value::as_str)
                .is_some_and(|v| !v.is_empty()),
            "{version:?}"
        );
        assert_eq!(
            edited,
            json!({
                "path": "notes.txt",
                "size": 6,
                "replacements": 1,
                "diff": "@@ edit 1, line 2 @@\n-two\n+2\n",
                "diff_truncated": false,
            })
        );
    });
}
