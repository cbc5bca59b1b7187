//! The MCP conformance suite (npm `@modelcontextprotocol/conformance`,
//! on Node 22) against `capexec mcp --listen http://127.0.0.1:PORT/mcp`:
//! every generic server scenario passes, against one server. The other
//! scenarios need the reference "everything" server's fixture tools
//! (docs/MCP.md lists them): they are not run, rather than run with
//! `--expected-failures`.

use std::process::Command;

use crate::common::data::TempDir;
use crate::http::Listening;
use crate::tools::mcp_tools;

const GENERIC_SCENARIOS: &[&str] = &[
    "server-initialize",
    "ping",
    "tools-list",
    "logging-set-level",
    "server-sse-polling",
    "server-sse-multiple-streams",
    "dns-rebinding-protection",
];

#[test]
fn every_generic_conformance_scenario_passes() {
    let tools = mcp_tools();
    let root = TempDir::new("mcp-conformance");
    let server = Listening::start(root.path(), &[]);
    let mut failed = Vec::new();
    for scenario in GENERIC_SCENARIOS {
        let output = Command::new(&tools.node)
            .arg(&tools.conformance)
            .args(["server", "--url", &server.url, "--scenario", scenario])
            .output()
            .expect("run the conformance suite");
        let stdout = String::from_utf8_lossy(&output.stdout);
        // Its summary: "Passed: N/N, 0 failed, W warnings".
        let summary = stdout
            .lines()
            .find(|line| line.starts_with("Passed: "))
            .unwrap_or_default()
            .to_string();
        let passed = summary
            .strip_prefix("Passed: ")
            .and_then(|rest| rest.split_once(','))
            .and_then(|(ratio, rest)| {
                let (done, all) = ratio.split_once('/')?;
                Some(done == all && done != "0" && rest.trim_start().starts_with("0 failed"))
            })
            .unwrap_or(false);
        if !output.status.success() || !passed {
            failed.push(format!(
                "{scenario} ({}): {summary}\n{stdout}\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "failed scenarios:\n{}",
        failed.join("\n")
    );
}
