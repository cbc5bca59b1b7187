//! `Sandbox`, `Limits` and `Confinement`, both directions.

use std::path::PathBuf;

use crate::capexec_capnp::{self as wire, confinement, limits, sandbox};
use crate::model::{Confinement, Limits, Network, Sandbox, Tracking};
use crate::wire::lists::{byte_strings, set_byte_strings};

pub fn sandbox_to_wire(sandbox: &Sandbox, mut builder: sandbox::Builder<'_>) {
    set_byte_strings(
        builder
            .reborrow()
            .init_read_only(sandbox.read_only.len() as u32),
        &sandbox.read_only,
    );
    set_byte_strings(
        builder
            .reborrow()
            .init_writable(sandbox.writable.len() as u32),
        &sandbox.writable,
    );
    builder.set_network(match sandbox.network {
        Network::None => wire::SandboxNetwork::None,
        Network::All => wire::SandboxNetwork::All,
    });
    builder.set_no_system_roots(sandbox.no_system_roots);
    builder.set_read_only_cwd(sandbox.read_only_cwd);
    builder.set_best_effort(sandbox.best_effort);
    builder.set_allow_namespaces(sandbox.allow_namespaces);
    builder.set_keep_root(sandbox.keep_root);
    builder.set_leave_out_secrets(sandbox.leave_out_secrets);
    set_byte_strings(
        builder
            .reborrow()
            .init_read_only_inside(sandbox.read_only_inside.len() as u32),
        &sandbox.read_only_inside,
    );
}

pub fn sandbox_from_wire(reader: sandbox::Reader<'_>) -> capnp::Result<Sandbox> {
    let paths = |list: capnp::data_list::Reader<'_>| -> capnp::Result<Vec<PathBuf>> {
        Ok(byte_strings(list)?.into_iter().map(PathBuf::from).collect())
    };
    Ok(Sandbox {
        read_only: paths(reader.get_read_only()?)?,
        writable: paths(reader.get_writable()?)?,
        network: match reader.get_network()? {
            wire::SandboxNetwork::None => Network::None,
            wire::SandboxNetwork::All => Network::All,
        },
        no_system_roots: reader.get_no_system_roots(),
        read_only_cwd: reader.get_read_only_cwd(),
        best_effort: reader.get_best_effort(),
        allow_namespaces: reader.get_allow_namespaces(),
        keep_root: reader.get_keep_root(),
        leave_out_secrets: reader.get_leave_out_secrets(),
        read_only_inside: paths(reader.get_read_only_inside()?)?,
    })
}

pub fn limits_to_wire(limits: &Limits, mut builder: limits::Builder<'_>) {
    builder.set_memory_bytes(limits.memory_bytes.unwrap_or(0));
    builder.set_max_pids(limits.max_pids.unwrap_or(0));
    builder.set_cpu_millis(limits.cpu_millis.unwrap_or(0));
    builder.set_best_effort(limits.best_effort);
}

pub fn limits_from_wire(reader: limits::Reader<'_>) -> Limits {
    Limits {
        memory_bytes: Some(reader.get_memory_bytes()).filter(|&bytes| bytes > 0),
        max_pids: Some(reader.get_max_pids()).filter(|&pids| pids > 0),
        cpu_millis: Some(reader.get_cpu_millis()).filter(|&millis| millis > 0),
        best_effort: reader.get_best_effort(),
    }
}

pub fn confinement_to_wire(confinement: &Confinement, mut builder: confinement::Builder<'_>) {
    builder.set_tracking(match confinement.tracking {
        Tracking::ProcessGroup => wire::ProcessTracking::ProcessGroup,
        Tracking::Cgroup => wire::ProcessTracking::Cgroup,
    });
    if let Some(sandbox) = &confinement.sandbox {
        sandbox_to_wire(sandbox, builder.reborrow().init_sandbox());
    }
    limits_to_wire(&confinement.limits, builder.reborrow().init_limits());
    let mut enforced = builder
        .reborrow()
        .init_enforced(confinement.enforced.len() as u32);
    for (index, name) in confinement.enforced.iter().enumerate() {
        enforced.set(index as u32, name.as_str());
    }
    let mut not_enforced = builder.init_not_enforced(confinement.not_enforced.len() as u32);
    for (index, name) in confinement.not_enforced.iter().enumerate() {
        not_enforced.set(index as u32, name.as_str());
    }
}

pub fn confinement_from_wire(reader: confinement::Reader<'_>) -> capnp::Result<Confinement> {
    let names = |list: capnp::text_list::Reader<'_>| -> capnp::Result<Vec<String>> {
        list.iter()
            .map(|name| Ok(name?.to_string()?))
            .collect::<capnp::Result<Vec<String>>>()
    };
    Ok(Confinement {
        tracking: match reader.get_tracking()? {
            wire::ProcessTracking::ProcessGroup => Tracking::ProcessGroup,
            wire::ProcessTracking::Cgroup => Tracking::Cgroup,
        },
        sandbox: if reader.has_sandbox() {
            Some(sandbox_from_wire(reader.get_sandbox()?)?)
        } else {
            None
        },
        limits: if reader.has_limits() {
            limits_from_wire(reader.get_limits()?)
        } else {
            Limits::default()
        },
        enforced: names(reader.get_enforced()?)?,
        not_enforced: names(reader.get_not_enforced()?)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox() -> Sandbox {
        Sandbox {
            read_only: vec!["/srv/data".into(), "/etc/hosts".into()],
            writable: vec!["/srv/out".into()],
            network: Network::All,
            no_system_roots: true,
            read_only_cwd: true,
            best_effort: true,
            allow_namespaces: true,
            keep_root: true,
            leave_out_secrets: true,
            read_only_inside: vec!["/srv/out/.git".into()],
        }
    }

    #[test]
    fn every_field_of_a_sandbox_and_of_limits_survives_the_wire() {
        let mut message = capnp::message::Builder::new_default();
        sandbox_to_wire(&sandbox(), message.init_root());
        let reader = message
            .get_root_as_reader::<sandbox::Reader<'_>>()
            .expect("root");
        assert_eq!(sandbox_from_wire(reader).expect("decode"), sandbox());

        let limits = Limits {
            memory_bytes: Some(512 << 20),
            max_pids: Some(64),
            cpu_millis: Some(500),
            best_effort: true,
        };
        let mut message = capnp::message::Builder::new_default();
        limits_to_wire(&limits, message.init_root());
        let reader = message
            .get_root_as_reader::<limits::Reader<'_>>()
            .expect("root");
        assert_eq!(limits_from_wire(reader), limits);
    }

    #[test]
    fn a_confinement_survives_the_wire() {
        for sandbox in [None, Some(sandbox())] {
            let confinement = Confinement {
                tracking: Tracking::Cgroup,
                sandbox,
                limits: Limits {
                    memory_bytes: None,
                    max_pids: Some(3),
                    cpu_millis: None,
                    best_effort: false,
                },
                enforced: vec!["cgroup".into(), "filesystem".into()],
                not_enforced: vec!["limit-cpu".into()],
            };
            let mut message = capnp::message::Builder::new_default();
            confinement_to_wire(&confinement, message.init_root());
            let reader = message
                .get_root_as_reader::<confinement::Reader<'_>>()
                .expect("root");
            assert_eq!(confinement_from_wire(reader).expect("decode"), confinement);
        }
    }
}
