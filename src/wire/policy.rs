//! `Policy`, both directions.

use std::path::PathBuf;

use crate::capexec_capnp::policy;
use crate::model::{Policy, Refusal, RefusalKind, RuleNames};
use crate::wire::lists::{
    byte_strings, env_vars, limit_from_millis, limit_millis, set_byte_strings, set_env_vars,
};
use crate::wire::sandbox::{limits_from_wire, limits_to_wire, sandbox_from_wire, sandbox_to_wire};

fn malformed(field: &str, error: capnp::Error) -> Refusal {
    Refusal::new(
        RefusalKind::InvalidArgument,
        format!("malformed policy ({field}): {error}"),
    )
}

pub fn policy_from_wire(reader: policy::Reader<'_>) -> Result<Policy, Refusal> {
    let programs = reader
        .has_programs()
        .then(|| reader.get_programs().and_then(byte_strings))
        .transpose()
        .map_err(|error| malformed("programs", error))?;
    let cwd_roots = reader
        .has_cwd_roots()
        .then(|| reader.get_cwd_roots().and_then(byte_strings))
        .transpose()
        .map_err(|error| malformed("cwdRoots", error))?
        .map(|roots| roots.into_iter().map(PathBuf::from).collect());
    let environment = reader
        .has_environment()
        .then(|| reader.get_environment().and_then(env_vars))
        .transpose()
        .map_err(|error| malformed("environment", error))?;
    let settable_env = reader
        .has_settable_env()
        .then(|| reader.get_settable_env().and_then(byte_strings))
        .transpose()
        .map_err(|error| malformed("settableEnv", error))?;
    let sandbox = reader
        .has_sandbox()
        .then(|| reader.get_sandbox().and_then(sandbox_from_wire))
        .transpose()
        .map_err(|error| malformed("sandbox", error))?;
    let limits = if reader.has_limits() {
        limits_from_wire(
            reader
                .get_limits()
                .map_err(|error| malformed("limits", error))?,
        )
    } else {
        Default::default()
    };
    let ports = reader
        .has_ports()
        .then(|| {
            reader
                .get_ports()
                .and_then(crate::wire::port_policy_from_wire)
        })
        .transpose()
        .map_err(|error| malformed("ports", error))?;
    Ok(Policy {
        programs,
        cwd_roots,
        environment,
        settable_env,
        forbid_tty: reader.get_forbid_tty(),
        max_processes: Some(reader.get_max_processes()).filter(|&max| max > 0),
        max_run_time: limit_from_millis(reader.get_max_run_time_ms()),
        sandbox,
        limits,
        ports,
        rule_names: RuleNames::Schema,
    })
}

pub fn policy_to_wire(policy: &Policy, mut builder: policy::Builder<'_>) {
    if let Some(programs) = &policy.programs {
        set_byte_strings(
            builder.reborrow().init_programs(programs.len() as u32),
            programs,
        );
    }
    if let Some(roots) = &policy.cwd_roots {
        set_byte_strings(builder.reborrow().init_cwd_roots(roots.len() as u32), roots);
    }
    if let Some(environment) = &policy.environment {
        set_env_vars(
            builder
                .reborrow()
                .init_environment(environment.len() as u32),
            environment,
        );
    }
    if let Some(names) = &policy.settable_env {
        set_byte_strings(
            builder.reborrow().init_settable_env(names.len() as u32),
            names,
        );
    }
    builder.set_forbid_tty(policy.forbid_tty);
    builder.set_max_processes(policy.max_processes.unwrap_or(0));
    builder.set_max_run_time_ms(limit_millis(policy.max_run_time));
    if let Some(sandbox) = &policy.sandbox {
        sandbox_to_wire(sandbox, builder.reborrow().init_sandbox());
    }
    if !policy.limits.is_empty() {
        limits_to_wire(&policy.limits, builder.reborrow().init_limits());
    }
    if let Some(ports) = &policy.ports {
        crate::wire::port_policy_to_wire(ports, builder.init_ports());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn round_trip(policy: &Policy) -> Policy {
        let mut message = capnp::message::Builder::new_default();
        policy_to_wire(policy, message.init_root());
        let reader = message
            .get_root_as_reader::<policy::Reader<'_>>()
            .expect("root");
        policy_from_wire(reader).expect("decode")
    }

    #[test]
    fn every_rule_survives_the_wire() {
        let policy = Policy {
            programs: Some(vec!["sh".into(), "/usr/bin/env".into()]),
            cwd_roots: Some(vec!["/srv/a".into(), "/srv/b".into()]),
            environment: Some(vec![("PATH".into(), "/usr/bin".into())]),
            settable_env: Some(vec!["LANG".into()]),
            forbid_tty: true,
            max_processes: Some(3),
            max_run_time: Some(Duration::from_millis(1500)),
            sandbox: Some(crate::model::Sandbox {
                read_only: vec!["/srv/data".into()],
                writable: vec!["/srv/out".into()],
                network: crate::model::Network::All,
                no_system_roots: true,
                read_only_cwd: true,
                best_effort: true,
                allow_namespaces: true,
                keep_root: true,
                leave_out_secrets: true,
                read_only_inside: vec!["/srv/out/.git".into()],
            }),
            limits: crate::model::Limits {
                memory_bytes: Some(1 << 30),
                max_pids: Some(9),
                cpu_millis: Some(250),
                best_effort: true,
            },
            ports: Some(crate::model::PortPolicy {
                dial: Some(vec!["tcp:127.0.0.1:5432".into()]),
                listen: None,
            }),
            rule_names: RuleNames::Schema,
        };
        assert_eq!(round_trip(&policy), policy);
    }

    #[test]
    fn absent_and_empty_rules_stay_apart() {
        assert_eq!(round_trip(&Policy::default()), Policy::default());
        let empty = Policy {
            programs: Some(Vec::new()),
            settable_env: Some(Vec::new()),
            ..Policy::default()
        };
        assert_eq!(round_trip(&empty), empty);
    }
}
