//! The parameters of Codex's exec-server methods, as its client sends
//! them (camelCase; bytes in standard base64; paths as `file://` URIs).
//! Unknown fields are ignored, as Codex's own server ignores them, so a
//! newer client keeps working.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Initialize {
    #[allow(dead_code)]
    pub client_name: String,
    #[serde(default)]
    pub resume_session_id: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvPolicy {
    /// "all", "none" or "core".
    #[serde(default = "inherit_all")]
    pub inherit: String,
    #[serde(default)]
    pub ignore_default_excludes: bool,
    #[serde(default)]
    pub exclude: Vec<String>,
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    #[serde(default)]
    pub include_only: Vec<String>,
}

fn inherit_all() -> String {
    "all".to_string()
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Start {
    pub process_id: String,
    pub argv: Vec<String>,
    pub cwd: String,
    #[serde(default)]
    pub env_policy: Option<EnvPolicy>,
    pub env: BTreeMap<String, String>,
    pub tty: bool,
    #[serde(default)]
    pub pipe_stdin: bool,
    #[serde(default)]
    pub arg0: Option<String>,
    #[serde(default)]
    pub sandbox: Option<Value>,
    #[serde(default)]
    pub enforce_managed_network: bool,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Read {
    pub process_id: String,
    #[serde(default)]
    pub after_seq: Option<u64>,
    #[serde(default)]
    pub max_bytes: Option<u64>,
    #[serde(default)]
    pub wait_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Write {
    pub process_id: String,
    pub chunk: String,
    pub write_id: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Signal {
    pub process_id: String,
    pub signal: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessOnly {
    pub process_id: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resize {
    pub process_id: String,
    pub rows: u16,
    pub cols: u16,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PathOnly {
    pub path: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteFile {
    pub path: String,
    pub data_base64: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateDirectory {
    pub path: String,
    #[serde(default)]
    pub recursive: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Remove {
    pub path: String,
    #[serde(default)]
    pub recursive: Option<bool>,
    #[serde(default)]
    pub force: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Copy {
    pub source_path: String,
    pub destination_path: String,
    pub recursive: bool,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WalkOptions {
    pub max_depth: u32,
    pub max_directories: u64,
    pub max_entries: u64,
    #[serde(default)]
    pub prune_hidden_directories: bool,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Walk {
    pub path: String,
    pub options: WalkOptions,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Open {
    pub handle_id: String,
    pub path: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadBlock {
    pub handle_id: String,
    pub offset: u64,
    pub len: u64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HandleOnly {
    pub handle_id: String,
}
