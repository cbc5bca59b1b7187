//! Codex as its users run it, offline: a `CODEX_HOME` of its own whose
//! `config.toml` points at the scripted model and whose `environments.toml`
//! makes a stdio exec-server program the one environment, a workspace, and
//! `codex exec` run there within a deadline.
//!
//! Everything lives outside `/tmp` and `$TMPDIR`
//! (`common::data::outside_temporary_directories`): Codex's
//! `workspace-write` sandbox lets commands write there, so a directory the
//! sandbox must protect cannot be there.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use tokio::io::AsyncReadExt;

/// Far above the few seconds a scenario takes on a loaded machine.
const DEADLINE: Duration = Duration::from_secs(60);
/// How long Codex's pipes may stay open after it exits: only a process it
/// left behind holds them longer.
const PIPES_DEADLINE: Duration = Duration::from_secs(10);

/// The pinned Codex binary, installed on first use through
/// `scripts/install-codex.sh` (which honours `$CAPEXEC_CODEX`). `None` only
/// where neither `$CAPEXEC_CODEX` nor npm is available, said loudly: CI has
/// both, so these tests never skip there.
pub fn codex() -> Option<&'static Path> {
    static CODEX: OnceLock<Option<PathBuf>> = OnceLock::new();
    CODEX.get_or_init(install).as_deref()
}

fn install() -> Option<PathBuf> {
    let have_npm = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("npm").is_file()));
    if std::env::var_os("CAPEXEC_CODEX").is_none() && !have_npm {
        eprintln!(
            "\n\n*** NOT RUN: the end-to-end tests with Codex need $CAPEXEC_CODEX or npm \
             (to install @openai/codex through scripts/install-codex.sh) ***\n\n"
        );
        return None;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install-codex.sh");
    let installed = std::process::Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|error| panic!("{}: {error}", script.display()));
    assert!(
        installed.status.success(),
        "{} failed ({})",
        script.display(),
        installed.status
    );
    let path = String::from_utf8_lossy(&installed.stdout)
        .trim()
        .to_string();
    assert!(!path.is_empty(), "{} printed no path", script.display());
    Some(PathBuf::from(path))
}

/// The exec-server Codex runs as its environment: a program speaking the
/// protocol on stdio, or (with `url`) one Codex connects to over a
/// websocket with a bearer token.
#[derive(Clone, Debug)]
pub struct Environment {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// `ws://HOST:PORT` and the bearer token, instead of the program.
    pub url: Option<(String, String)>,
}

/// Codex's `sandbox_mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SandboxMode {
    DangerFullAccess,
    WorkspaceWrite,
}

impl SandboxMode {
    fn as_str(self) -> &'static str {
        match self {
            SandboxMode::DangerFullAccess => "danger-full-access",
            SandboxMode::WorkspaceWrite => "workspace-write",
        }
    }
}

/// A `CODEX_HOME`, a workspace for the turn and a directory beside it.
pub struct CodexHome {
    root: tempfile::TempDir,
    pub home: PathBuf,
    pub workspace: PathBuf,
    /// Outside the workspace and every temporary directory.
    pub outside: PathBuf,
    sandbox: SandboxMode,
    /// More of `config.toml` (an `[mcp_servers.NAME]` table, say).
    extra_config: String,
}

impl CodexHome {
    pub fn new(sandbox: SandboxMode, environment: &Environment) -> CodexHome {
        CodexHome::with_environment(sandbox, Some(environment))
    }

    /// Codex with its own local environment (no `environments.toml`).
    #[allow(dead_code)] // for tests/mcp, which includes this file
    pub fn local(sandbox: SandboxMode) -> CodexHome {
        CodexHome::with_environment(sandbox, None)
    }

    /// Appends `toml` to the `config.toml` each `exec` writes.
    #[allow(dead_code)] // for tests/mcp, which includes this file
    pub fn add_config(&mut self, toml: &str) {
        self.extra_config.push_str(toml);
    }

    fn with_environment(sandbox: SandboxMode, environment: Option<&Environment>) -> CodexHome {
        let root = tempfile::Builder::new()
            .prefix("codex-")
            .tempdir_in(crate::common::data::outside_temporary_directories())
            .expect("a directory for Codex");
        let dir = |name: &str| {
            let path = root.path().join(name);
            std::fs::create_dir(&path).expect("create a directory for Codex");
            path
        };
        let (home, workspace, outside) = (dir("codex-home"), dir("workspace"), dir("outside"));
        dir("user-home");
        dir("tmp");
        let home_root = CodexHome {
            root,
            home,
            workspace,
            outside,
            sandbox,
            extra_config: String::new(),
        };
        let Some(environment) = environment else {
            return home_root;
        };
        let args: Vec<String> = environment.args.iter().map(|a| toml_string(a)).collect();
        let declared = match &environment.url {
            Some((url, token)) => format!(
                "url = {}\nauth_bearer_token = {}\n",
                toml_string(url),
                toml_string(token)
            ),
            None => format!(
                "program = {}\nargs = [{}]\n",
                toml_string(&environment.program.display().to_string()),
                args.join(", "),
            ),
        };
        std::fs::write(
            home_root.home.join("environments.toml"),
            format!(
                "default = \"under-test\"\n\
                 include_local = false\n\
                 \n\
                 [[environments]]\n\
                 id = \"under-test\"\n\
                 {declared}",
            ),
        )
        .expect("write environments.toml");
        home_root
    }

    /// Runs `codex exec --skip-git-repo-check PROMPT` in the workspace
    /// with the model at `model_url`, with an environment of its own (no
    /// `CODEX_*`, `OPENAI_*` or capexec settings of the caller), within the
    /// deadline; the whole process group is killed if it runs over.
    pub async fn exec(&self, codex: &Path, model_url: &str, prompt: &str) -> Finished {
        std::fs::write(
            self.home.join("config.toml"),
            format!(
                "model = \"mock-model\"\n\
                 model_provider = \"mock\"\n\
                 approval_policy = \"never\"\n\
                 sandbox_mode = \"{}\"\n\
                 \n\
                 [model_providers.mock]\n\
                 name = \"mock\"\n\
                 base_url = {}\n\
                 wire_api = \"responses\"\n\
                 request_max_retries = 0\n\
                 stream_max_retries = 0\n\
                 {}",
                self.sandbox.as_str(),
                toml_string(model_url),
                self.extra_config,
            ),
        )
        .expect("write config.toml");
        let mut command = tokio::process::Command::new(codex);
        command
            .args(["exec", "--skip-git-repo-check", prompt])
            .current_dir(&self.workspace)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        for (name, _) in std::env::vars_os() {
            let text = name.to_string_lossy();
            if ["CODEX_", "OPENAI_", "CAPEXEC_", "RUST_LOG"]
                .iter()
                .any(|prefix| text.starts_with(prefix))
                || text == "XDG_CONFIG_HOME"
            {
                command.env_remove(&name);
            }
        }
        command
            .env("CODEX_HOME", &self.home)
            .env("HOME", self.root.path().join("user-home"))
            .env("TMPDIR", self.root.path().join("tmp"))
            // Codex logs its environment program's stderr (the bridge's
            // diagnostics) at this level only: shown when a test fails.
            .env("RUST_LOG", "warn,codex_exec_server::client_transport=debug");
        let mut child = command.spawn().expect("start codex");
        let group = child.id().expect("codex's pid") as i32;
        let mut stdout = child.stdout.take().expect("stdout");
        let mut stderr = child.stderr.take().expect("stderr");
        let read_stdout = tokio::spawn(async move {
            let mut bytes = Vec::new();
            let _ = stdout.read_to_end(&mut bytes).await;
            bytes
        });
        let read_stderr = tokio::spawn(async move {
            let mut bytes = Vec::new();
            let _ = stderr.read_to_end(&mut bytes).await;
            bytes
        });
        let status = tokio::time::timeout(DEADLINE, child.wait()).await;
        let mut failure = None;
        let status = match status {
            Ok(status) => Some(status.expect("wait for codex")),
            Err(_) => {
                failure = Some(format!("codex exec ran over {DEADLINE:?}"));
                None
            }
        };
        let pipes = tokio::time::timeout(PIPES_DEADLINE, async {
            (
                read_stdout.await.unwrap_or_default(),
                read_stderr.await.unwrap_or_default(),
            )
        })
        .await;
        let (stdout, stderr) = match pipes {
            Ok(pipes) => pipes,
            Err(_) => {
                failure.get_or_insert(format!(
                    "codex exited, but its stdout or stderr stayed open {PIPES_DEADLINE:?}: \
                     a process it started was left behind"
                ));
                (Vec::new(), Vec::new())
            }
        };
        if failure.is_some() {
            // SAFETY: kill(2) of the process group of a child we started
            // in a group of its own.
            unsafe { libc::killpg(group, libc::SIGKILL) };
        }
        Finished {
            code: status.map(|status| {
                status
                    .code()
                    .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
            }),
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            failure,
        }
    }
}

/// How a `codex exec` ended.
#[derive(Debug)]
pub struct Finished {
    /// The exit code (128 + signal for a signal); `None` if it ran over.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// What the runner saw going wrong (a deadline passed).
    pub failure: Option<String>,
}

impl Finished {
    /// Everything, for a failed assertion's message.
    pub fn context(&self) -> String {
        format!(
            "codex exec: code {:?}{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code,
            self.failure
                .as_ref()
                .map(|failure| format!(", {failure}"))
                .unwrap_or_default(),
            self.stdout,
            self.stderr
        )
    }

    /// Asserts that the turn ran to its end: exit 0, the model's last
    /// message printed as Codex's answer.
    pub fn assert_answered(&self, message: &str) {
        assert!(
            self.failure.is_none() && self.code == Some(0) && self.stdout == format!("{message}\n"),
            "{}",
            self.context()
        );
    }
}

/// `text` as a TOML basic string: JSON's escapes are all valid there.
pub fn toml_string(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_default()
}
