//! `Executor.info` and `Executor.environments`: what a server reports about
//! itself, and the wire form of both answers.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;
use std::time::Duration;

use crate::capexec_capnp as wire;
use crate::model::{EnvironmentState, EnvironmentStatus, ExecutorInfo, LOCAL_ENVIRONMENT};

/// The protocol features this build supports (the schema lists the names).
pub const FEATURES: &[&str] = &[
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
    "info",
    "environments",
    "detach",
    "facets",
    "timeout",
    "usage",
    "restrict",
];

/// Listed, besides [`FEATURES`], by the `info` of a restricted executor.
pub const RESTRICTED_FEATURE: &str = "restricted";

/// This server's own description, as of now.
pub fn local_info() -> ExecutorInfo {
    ExecutorInfo {
        version: env!("CARGO_PKG_VERSION").to_string(),
        features: FEATURES.iter().map(|name| name.to_string()).collect(),
        os: std::env::consts::OS.to_string(),
        arch: std::env::consts::ARCH.to_string(),
        hostname: nix::unistd::gethostname()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default(),
        default_shell: std::env::var_os("SHELL")
            .filter(|shell| !shell.is_empty())
            .map_or_else(|| PathBuf::from("/bin/sh"), PathBuf::from),
        cwd: std::env::current_dir().unwrap_or_default(),
        temp_dir: std::env::temp_dir(),
        environment: LOCAL_ENVIRONMENT.to_string(),
    }
}

/// What is known of a server too old to answer `info`: it supports the
/// process protocol but predates environments.
pub fn unknown_info() -> ExecutorInfo {
    ExecutorInfo {
        version: String::new(),
        features: FEATURES
            .iter()
            .filter(|name| {
                !matches!(
                    **name,
                    "info" | "environments" | "detach" | "facets" | "timeout"
                )
            })
            .map(|name| name.to_string())
            .collect(),
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
    // "restricted" describes the far executor, not a protocol feature.
    info.features
        .retain(|feature| FEATURES.contains(&feature.as_str()) || feature == RESTRICTED_FEATURE);
    info
}

pub fn info_to_wire(info: &ExecutorInfo, mut builder: wire::executor_info::Builder<'_>) {
    builder.set_version(&info.version);
    let mut features = builder.reborrow().init_features(info.features.len() as u32);
    for (index, feature) in info.features.iter().enumerate() {
        features.set(index as u32, feature);
    }
    builder.set_os(&info.os);
    builder.set_arch(&info.arch);
    builder.set_hostname(&info.hostname);
    builder.set_default_shell(info.default_shell.as_os_str().as_bytes());
    builder.set_cwd(info.cwd.as_os_str().as_bytes());
    builder.set_temp_dir(info.temp_dir.as_os_str().as_bytes());
    builder.set_environment(&info.environment);
}

pub fn info_from_wire(reader: wire::executor_info::Reader<'_>) -> capnp::Result<ExecutorInfo> {
    let text = |result: capnp::Result<capnp::text::Reader<'_>>| -> capnp::Result<String> {
        Ok(result?.to_string()?)
    };
    let path = |bytes: &[u8]| PathBuf::from(OsString::from_vec(bytes.to_vec()));
    let features = reader
        .get_features()?
        .iter()
        .map(|feature| Ok(feature?.to_string()?))
        .collect::<capnp::Result<Vec<String>>>()?;
    Ok(ExecutorInfo {
        version: text(reader.get_version())?,
        features,
        os: text(reader.get_os())?,
        arch: text(reader.get_arch())?,
        hostname: text(reader.get_hostname())?,
        default_shell: path(reader.get_default_shell()?),
        cwd: path(reader.get_cwd()?),
        temp_dir: path(reader.get_temp_dir()?),
        environment: text(reader.get_environment())?,
    })
}

pub fn environments_to_wire(
    environments: &[EnvironmentStatus],
    mut list: capnp::struct_list::Builder<'_, wire::environment::Owned>,
) {
    for (index, environment) in environments.iter().enumerate() {
        let mut entry = list.reborrow().get(index as u32);
        entry.set_name(&environment.name);
        entry.set_address(&environment.address);
        entry.set_is_default(environment.is_default);
        let mut state = entry.init_state();
        match &environment.state {
            EnvironmentState::Local => state.set_local(()),
            EnvironmentState::Idle => state.set_idle(()),
            EnvironmentState::Connecting => state.set_connecting(()),
            EnvironmentState::Connected => state.set_connected(()),
            EnvironmentState::Failed { reason, retry_in } => {
                let mut failed = state.init_failed();
                failed.set_reason(reason);
                failed.set_retry_in_ms(retry_in.as_millis().min(u32::MAX as u128) as u32);
            }
        }
    }
}

pub fn environments_from_wire(
    list: capnp::struct_list::Reader<'_, wire::environment::Owned>,
) -> capnp::Result<Vec<EnvironmentStatus>> {
    list.iter()
        .map(|entry| {
            use wire::environment::state::Which;
            let state = match entry.get_state().which()? {
                Which::Local(()) => EnvironmentState::Local,
                Which::Idle(()) => EnvironmentState::Idle,
                Which::Connecting(()) => EnvironmentState::Connecting,
                Which::Connected(()) => EnvironmentState::Connected,
                Which::Failed(failed) => EnvironmentState::Failed {
                    reason: failed.get_reason()?.to_string()?,
                    retry_in: Duration::from_millis(failed.get_retry_in_ms().into()),
                },
            };
            Ok(EnvironmentStatus {
                name: entry.get_name()?.to_string()?,
                address: entry.get_address()?.to_string()?,
                is_default: entry.get_is_default(),
                state,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hop_extends_the_path_and_keeps_only_shared_features() {
        let mut far = local_info();
        far.features.push("from-the-future".to_string());
        let once = seen_through_hop(far, "c");
        assert_eq!(once.environment, "c");
        assert!(!once.features.iter().any(|f| f == "from-the-future"));
        assert_eq!(seen_through_hop(once, "b").environment, "b/c");
    }

    #[test]
    fn info_round_trips_through_the_wire() {
        let info = local_info();
        let mut message = capnp::message::Builder::new_default();
        info_to_wire(&info, message.init_root());
        let reader = message
            .get_root_as_reader::<wire::executor_info::Reader<'_>>()
            .expect("root");
        assert_eq!(info_from_wire(reader).expect("decode"), info);
    }
}
