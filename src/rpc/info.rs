//! `Executor.info`: what a server reports about itself, and what a hop
//! makes of a far server's answer.

use std::path::PathBuf;

use crate::model::{ExecutorInfo, LOCAL_ENVIRONMENT};

/// The protocol features this build supports (the schema lists the names):
/// each server object names those it implements, next to its methods.
pub fn features() -> impl Iterator<Item = &'static str> {
    crate::rpc::executor::EXECUTOR_FEATURES
        .iter()
        .chain(crate::rpc::process::PROCESS_FEATURES)
        .chain(crate::rpc::directory::DIRECTORY_FEATURES)
        .copied()
}

fn supported(feature: &str) -> bool {
    features().any(|known| known == feature)
}

/// Listed, besides [`features`], by the `info` of a restricted executor.
pub const RESTRICTED_FEATURE: &str = "restricted";

/// This server's own description, as of now, its engine on `host`.
pub fn local_info(host: &crate::sys::HostConfig) -> ExecutorInfo {
    ExecutorInfo {
        version: env!("CARGO_PKG_VERSION").to_string(),
        features: features()
            .map(str::to_string)
            .chain(
                crate::sandbox::info_features(host)
                    .into_iter()
                    .filter(|feature| !supported(feature)),
            )
            .collect(),
        os: std::env::consts::OS.to_string(),
        arch: std::env::consts::ARCH.to_string(),
        hostname: nix::unistd::gethostname()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default(),
        default_shell: default_shell(),
        cwd: std::env::current_dir().unwrap_or_default(),
        temp_dir: std::env::temp_dir(),
        environment: LOCAL_ENVIRONMENT.to_string(),
    }
}

/// The login shell of the user the server runs as, as ssh (and Codex's
/// own exec-server) use it: a server started by a service manager or CI
/// often has no `$SHELL`, and an inherited one describes whoever started
/// it, not the account the commands run as. A service account's
/// `nologin` or `false` is no shell to run lines with: `$SHELL` is the
/// fallback for those and for an account the password database does not
/// know, then "/bin/sh".
fn default_shell() -> PathBuf {
    let login_shell = nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map(|user| user.shell)
        .filter(|shell| is_a_shell(shell));
    login_shell
        .or_else(|| {
            std::env::var_os("SHELL")
                .filter(|shell| !shell.is_empty())
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from("/bin/sh"))
}

fn is_a_shell(path: &std::path::Path) -> bool {
    let refuses_logins = path
        .file_name()
        .is_some_and(|name| name == "nologin" || name == "false");
    path.is_absolute() && !refuses_logins && path.is_file()
}

/// The features of every server, including those from before `info`.
const BEFORE_INFO: &[&str] = &[
    "start",
    "read",
    "write",
    "write-id",
    "close-stdin",
    "signal",
    "terminate",
    "subscribe",
    "lossless",
    "tty",
    "resize",
    "process-info",
];

/// What is known of a server too old to answer `info`: it supports the
/// process protocol but predates environments.
pub fn unknown_info() -> ExecutorInfo {
    ExecutorInfo {
        version: String::new(),
        features: BEFORE_INFO.iter().map(|name| name.to_string()).collect(),
        os: String::new(),
        arch: String::new(),
        hostname: String::new(),
        default_shell: PathBuf::new(),
        cwd: PathBuf::new(),
        temp_dir: PathBuf::new(),
        environment: LOCAL_ENVIRONMENT.to_string(),
    }
}

/// The far end's answer as seen through the hop to `hop` (an environment
/// name): its environment path gains the hop, and its features are limited
/// to those this hop supports too.
pub fn seen_through_hop(mut info: ExecutorInfo, hop: &str) -> ExecutorInfo {
    info.environment = if info.environment == LOCAL_ENVIRONMENT {
        hop.to_string()
    } else {
        format!("{hop}/{}", info.environment)
    };
    // "restricted" describes the far executor, and what its host can
    // enforce describes its host (this hop forwards sandboxes and limits
    // as they are), not protocol features.
    info.features.retain(|feature| {
        supported(feature)
            || feature == RESTRICTED_FEATURE
            || crate::sandbox::is_host_feature(feature)
    });
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hop_extends_the_path_and_keeps_only_shared_features() {
        let mut far = local_info(&crate::sys::HostConfig::default());
        far.features.push("from-the-future".to_string());
        let once = seen_through_hop(far, "c");
        assert_eq!(once.environment, "c");
        assert!(!once.features.iter().any(|f| f == "from-the-future"));
        assert_eq!(seen_through_hop(once, "b").environment, "b/c");
    }

    #[test]
    fn only_a_shell_that_runs_lines_is_the_default() {
        assert!(is_a_shell(std::path::Path::new("/bin/sh")));
        for not_a_shell in [
            "/usr/sbin/nologin",
            "/bin/false",
            "sh",
            "/nonexistent/sh",
            "",
        ] {
            assert!(
                !is_a_shell(std::path::Path::new(not_a_shell)),
                "{not_a_shell}"
            );
        }
    }
}
