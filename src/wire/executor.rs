//! `ExecutorInfo` and the list of environments, both directions.

use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use crate::capexec_capnp as wire;
use crate::model::{EnvironmentState, EnvironmentStatus, ExecutorInfo};
use crate::wire::lists::{millis_u32, path};

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

/// Over a far executor's info copied whole, what a hop changes of it
/// (see `rpc::info::seen_through_hop`): its environment path and its
/// features; every other field, known or not, stays the far end's.
pub fn hop_view_to_wire(info: &ExecutorInfo, mut builder: wire::executor_info::Builder<'_>) {
    let mut features = builder.reborrow().init_features(info.features.len() as u32);
    for (index, feature) in info.features.iter().enumerate() {
        features.set(index as u32, feature);
    }
    builder.set_environment(&info.environment);
}

pub fn info_from_wire(reader: wire::executor_info::Reader<'_>) -> capnp::Result<ExecutorInfo> {
    let text = |result: capnp::Result<capnp::text::Reader<'_>>| -> capnp::Result<String> {
        Ok(result?.to_string()?)
    };
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
                failed.set_retry_in_ms(millis_u32(*retry_in));
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
    fn info_survives_the_wire() {
        let info = ExecutorInfo {
            version: "9.9.9".into(),
            features: vec!["start".into(), "restricted".into()],
            os: "linux".into(),
            arch: "x86_64".into(),
            hostname: "build-box".into(),
            default_shell: "/bin/bash".into(),
            cwd: "/srv/work".into(),
            temp_dir: "/tmp".into(),
            environment: "b/c".into(),
        };
        let mut message = capnp::message::Builder::new_default();
        info_to_wire(&info, message.init_root());
        let reader = message
            .get_root_as_reader::<wire::executor_info::Reader<'_>>()
            .expect("root");
        assert_eq!(info_from_wire(reader).expect("decode"), info);
    }

    #[test]
    fn every_environment_state_survives_the_wire() {
        let states = [
            EnvironmentState::Local,
            EnvironmentState::Idle,
            EnvironmentState::Connecting,
            EnvironmentState::Connected,
            EnvironmentState::Failed {
                reason: "refused".into(),
                retry_in: Duration::from_millis(1500),
            },
        ];
        let environments: Vec<EnvironmentStatus> = states
            .into_iter()
            .enumerate()
            .map(|(index, state)| EnvironmentStatus {
                name: format!("e{index}"),
                address: format!("unix:/run/e{index}.sock"),
                is_default: index == 2,
                state,
            })
            .collect();
        let mut message = capnp::message::Builder::new_default();
        let list = message.initn_root::<capnp::struct_list::Builder<'_, wire::environment::Owned>>(
            environments.len() as u32,
        );
        environments_to_wire(&environments, list);
        let reader = message
            .get_root_as_reader::<capnp::struct_list::Reader<'_, wire::environment::Owned>>()
            .expect("root");
        assert_eq!(
            environments_from_wire(reader).expect("decode"),
            environments
        );
    }
}
