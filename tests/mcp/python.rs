//! The official MCP Python SDK (PyPI `mcp`) as the client: every tool,
//! over stdio (the SDK starts `capexec mcp`) and over Streamable HTTP,
//! on the embedded executor, on a `capexec serve` over a Unix socket and
//! over TCP with its token (the HTTP listener then wants a bearer token
//! too). `tests/mcp_python/drive_tools.py` does the checks; a failed one
//! ends it with exit 1 and the reason on stderr.

use std::path::Path;
use std::process::Command;

use serde_json::json;

use crate::common::cli::{BIN, Served};
use crate::common::data::TempDir;
use crate::http::Listening;
use crate::tools::mcp_tools;

/// How `capexec mcp` reaches its executor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Embedded,
    Unix,
    Tcp,
}

/// A Python of the system directories: confined commands may run it.
const SYSTEM_PYTHON: &str = "/usr/bin/python3";

#[test]
fn python_sdk_drives_every_tool_on_the_embedded_executor() {
    drive(Backend::Embedded);
}

#[test]
fn python_sdk_drives_every_tool_on_a_server_over_unix() {
    drive(Backend::Unix);
}

#[test]
fn python_sdk_drives_every_tool_on_a_server_over_tcp_with_tokens() {
    drive(Backend::Tcp);
}

fn drive(backend: Backend) {
    assert!(
        Path::new(SYSTEM_PYTHON).exists(),
        "{SYSTEM_PYTHON} is needed (the network check runs it confined)"
    );
    for transport in ["stdio", "http"] {
        let root = TempDir::new("mcp-py-root");
        let outside = TempDir::new("mcp-py-outside");
        let served = (backend != Backend::Embedded).then(Served::start);
        let mut connect: Vec<String> = Vec::new();
        if let Some(served) = &served {
            match backend {
                Backend::Unix => connect.extend(["--connect".into(), served.unix.clone()]),
                _ => connect.extend([
                    "--connect".into(),
                    served.tcp.clone(),
                    "--token-file".into(),
                    served.token_arg(),
                ]),
            }
        }
        // A listener of the test: confined commands must not reach it.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        let mut config = json!({
            "transport": transport,
            "root": root.path(),
            "outside": outside.path(),
            "port": port,
            "python": SYSTEM_PYTHON,
        });
        let mut listening = None;
        if transport == "stdio" {
            let mut command = vec![BIN.to_string(), "mcp".into(), "--root".into()];
            command.push(root.path().display().to_string());
            command.extend(connect);
            config["command"] = json!(command);
            if let Some(served) = &served {
                config["env"] = json!({"HOME": served.home.path()});
            }
        } else {
            let token = "http-bearer-token-of-the-test-0123456789";
            let secrets = TempDir::new("mcp-py-token");
            let token_file = secrets.path().join("http-token");
            std::fs::write(&token_file, format!("{token}\n")).expect("token file");
            std::fs::set_permissions(
                &token_file,
                std::os::unix::fs::PermissionsExt::from_mode(0o600),
            )
            .expect("chmod 600");
            let mut extra = connect;
            if backend == Backend::Tcp {
                extra.extend(["--http-token-file".into(), token_file.display().to_string()]);
                config["token"] = json!(token);
            }
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            let server = Listening::start_with(root.path(), &extra, served);
            config["url"] = json!(server.url);
            listening = Some((server, secrets));
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_python/drive_tools.py");
        let output = Command::new(&mcp_tools().python)
            .arg(&script)
            .arg(config.to_string())
            .env_remove("CAPEXEC_CONNECT")
            .output()
            .expect("run the Python SDK client");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "{backend:?} over {transport}: {}\n{stderr}",
            output.status
        );
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            format!("drive_tools.py ({transport}): every check passed\n"),
            "{stderr}"
        );
        listener.set_nonblocking(true).expect("nonblocking");
        assert!(
            listener.accept().is_err(),
            "a confined command reached the test's listener"
        );
        drop(listening);
    }
}
