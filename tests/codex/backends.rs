//! What Codex's environment is in a scenario: Codex's own exec-server (the
//! reference the harness is proven against), or `capexec codex-bridge`
//! with the embedded executor, connected to a `capexec serve` over a Unix
//! socket, or over TLS with a token. The served backends also tell where
//! the processes ran: the server's metrics.

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;

use crate::codex_home::Environment;
use crate::common::cli::{BIN, Watched};
use crate::common::data::TempDir;
use crate::common::pki::Authority;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `codex exec-server --listen stdio`.
    CodexExecServer,
    /// `capexec codex-bridge`: processes are the bridge's children.
    Embedded,
    /// `capexec codex-bridge --connect unix:PATH`.
    Unix,
    /// `capexec codex-bridge --connect tcp:… --token-file … --tls-ca …`.
    Tls,
    /// `capexec codex-bridge --listen ws://127.0.0.1:0 --ws-token-file …`,
    /// declared to Codex as a `url` environment with its bearer token.
    Websocket,
}

/// A backend ready for Codex: the environment to declare, and the server
/// behind it, if any.
pub struct Prepared {
    pub environment: Environment,
    pub server: Option<Server>,
    /// A bridge listening for Codex (the websocket backend).
    pub _listening: Option<(Watched, TempDir)>,
}

impl Backend {
    pub fn prepare(self, codex: &Path) -> Prepared {
        let bridge = |args: &[&str]| Environment {
            program: BIN.into(),
            args: ["codex-bridge"]
                .iter()
                .chain(args)
                .map(|arg| arg.to_string())
                .collect(),
            url: None,
        };
        match self {
            Backend::CodexExecServer => Prepared {
                environment: Environment {
                    program: codex.to_path_buf(),
                    args: vec!["exec-server".into(), "--listen".into(), "stdio".into()],
                    url: None,
                },
                server: None,
                _listening: None,
            },
            Backend::Embedded => Prepared {
                environment: bridge(&[]),
                server: None,
                _listening: None,
            },
            Backend::Websocket => {
                let dir = TempDir::new("codex-ws");
                let token = "codex-ws-test-token-0123456789abcdef";
                let token_file = dir.path().join("ws-token");
                std::fs::write(&token_file, token).expect("write the token");
                let mut listen = Command::new(BIN);
                listen
                    .args([
                        "codex-bridge",
                        "--listen",
                        "ws://127.0.0.1:0",
                        "--ws-token-file",
                    ])
                    .arg(&token_file);
                let watched = Watched::spawn(listen);
                watched.wait_for_stdout("\n");
                let url = watched.stdout_text().trim().to_string();
                assert!(
                    url.starts_with("ws://127.0.0.1:"),
                    "the bridge printed {url:?}"
                );
                let mut environment = bridge(&[]);
                environment.url = Some((url, token.to_string()));
                Prepared {
                    environment,
                    server: None,
                    _listening: Some((watched, dir)),
                }
            }
            Backend::Unix => {
                let server = Server::start();
                Prepared {
                    environment: bridge(&["--connect", &server.unix]),
                    server: Some(server),
                    _listening: None,
                }
            }
            Backend::Tls => {
                let server = Server::start();
                let (token, ca) = (
                    server.dir.path().join("token").display().to_string(),
                    server.dir.path().join("ca.pem").display().to_string(),
                );
                Prepared {
                    environment: bridge(&[
                        "--connect",
                        &server.tcp,
                        "--token-file",
                        &token,
                        "--tls-ca",
                        &ca,
                    ]),
                    server: Some(server),
                    _listening: None,
                }
            }
        }
    }
}

/// A `capexec serve` with a Unix listener, a TLS listener that needs a
/// token, and metrics.
pub struct Server {
    watched: Watched,
    pub unix: String,
    pub tcp: String,
    metrics: String,
    dir: TempDir,
}

impl Server {
    fn start() -> Server {
        let dir = TempDir::new("codex-serve");
        let authority = Authority::new(dir.path(), "ca");
        let (cert, key) = authority.server(dir.path(), "server", &["127.0.0.1"], false);
        let socket = dir.path().join("capexec.sock");
        let mut serve = Command::new(BIN);
        serve
            .arg("serve")
            .arg("--listen")
            .arg(format!("unix:{}", socket.display()))
            .args(["--listen", "tcp:127.0.0.1:0", "--token-file"])
            .arg(dir.path().join("token"))
            .arg("--tls-cert")
            .arg(cert)
            .arg("--tls-key")
            .arg(key)
            .args(["--metrics", "tcp:127.0.0.1:0"])
            .env("HOME", dir.path())
            .env_remove("XDG_CONFIG_HOME");
        let watched = Watched::spawn(serve);
        watched.wait_for_stderr("/metrics\n");
        let metrics = watched
            .stderr_text()
            .lines()
            .find_map(|line| line.strip_prefix("capexec: metrics at http://"))
            .expect("the metrics address")
            .trim_end_matches("/metrics")
            .to_string();
        // Each listener's line is one write, in the order of --listen.
        watched.wait_for_stdout("\ntcp:");
        let stdout = watched.stdout_text();
        let mut lines = stdout.lines().map(str::to_string);
        let (unix, tcp) = (
            lines.next().unwrap_or_default(),
            lines.next().unwrap_or_default(),
        );
        assert_eq!(unix, format!("unix:{}", socket.display()));
        Server {
            watched,
            unix,
            tcp,
            metrics,
            dir,
        }
    }

    /// The server's process id, to take it away under the bridge.
    pub fn pid(&self) -> u32 {
        self.watched.child.id()
    }

    /// The sample `name` (with its labels) of the server's metrics.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let mut stream = std::net::TcpStream::connect(&self.metrics).expect("connect to metrics");
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: capexec\r\n\r\n")
            .expect("ask for the metrics");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("the metrics");
        response
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    }

    /// Asserts that Codex's `commands` ran on this server and that, Codex
    /// and its bridge gone, the server holds none of them. The bridge
    /// starts one more process per session: `env`, to learn the
    /// environment its children inherit (for Codex's `envPolicy`).
    pub fn assert_ran(&self, commands: u64) {
        assert_eq!(
            self.metric("capexec_processes_started_total"),
            Some((commands + 1) as f64),
            "processes started on the capexec server: {commands} commands and the bridge's env"
        );
        crate::common::eventually(
            "the server holds no processes after Codex and the bridge ended",
            || match self.metric("capexec_processes") {
                Some(0.0) => Ok(()),
                held => Err(format!("it holds {held:?}")),
            },
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.watched.child.kill();
        let _ = self.watched.child.wait();
    }
}
