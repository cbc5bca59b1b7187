//! The MCP clients capexec mcp is tested against (Node 22 with the
//! conformance suite, a Python with the official `mcp` SDK), as
//! `scripts/install-mcp-tools.sh` installs them (pinned in
//! `.ci/mcp-versions`). `.ci/run` exports the variables; without them the
//! script is run here. A machine where neither works fails these tests,
//! loudly: they never skip.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;

pub struct McpTools {
    pub node: PathBuf,
    pub conformance: PathBuf,
    pub python: PathBuf,
}

/// The tools, installed on first use if the variables are not set.
pub fn mcp_tools() -> &'static McpTools {
    static TOOLS: OnceLock<McpTools> = OnceLock::new();
    TOOLS.get_or_init(install)
}

fn install() -> McpTools {
    let from_environment = |name: &str| std::env::var_os(name).filter(|value| !value.is_empty());
    if let (Some(node), Some(conformance), Some(python)) = (
        from_environment("CAPEXEC_NODE22"),
        from_environment("CAPEXEC_MCP_CONFORMANCE"),
        from_environment("CAPEXEC_MCP_PYTHON"),
    ) {
        return McpTools {
            node: node.into(),
            conformance: conformance.into(),
            python: python.into(),
        };
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install-mcp-tools.sh");
    let installed = std::process::Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|error| panic!("{}: {error}", script.display()));
    assert!(
        installed.status.success(),
        "\n\n*** the MCP client tests need CAPEXEC_NODE22, CAPEXEC_MCP_CONFORMANCE and \
         CAPEXEC_MCP_PYTHON, or {} to install them (npm and python3 with venv): it failed \
         ({}) ***\n\n",
        script.display(),
        installed.status
    );
    let printed = String::from_utf8_lossy(&installed.stdout).into_owned();
    // `NAME=VALUE` lines, VALUE quoted by printf %q (paths here need none).
    let value = |name: &str| -> PathBuf {
        printed
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{name}=")))
            .map(|value| PathBuf::from(value.trim_matches('\'')))
            .unwrap_or_else(|| panic!("{} printed no {name}: {printed}", script.display()))
    };
    McpTools {
        node: value("CAPEXEC_NODE22"),
        conformance: value("CAPEXEC_MCP_CONFORMANCE"),
        python: value("CAPEXEC_MCP_PYTHON"),
    }
}
