//! `Policy` between the model and the wire, both directions.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;
use std::time::Duration;

use crate::capexec_capnp::policy;
use crate::engine::{Policy, RuleNames};
use crate::model::{StartError, StartErrorKind};

fn malformed(field: &str, error: capnp::Error) -> StartError {
    StartError::new(
        StartErrorKind::InvalidArgument,
        format!("malformed policy ({field}): {error}"),
    )
}

fn byte_strings(
    list: capnp::Result<capnp::data_list::Reader<'_>>,
    field: &str,
) -> Result<Vec<OsString>, StartError> {
    list.map_err(|error| malformed(field, error))?
        .iter()
        .map(|item| item.map(|bytes| OsString::from_vec(bytes.to_vec())))
        .collect::<capnp::Result<Vec<_>>>()
        .map_err(|error| malformed(field, error))
}

pub fn policy_from_wire(reader: policy::Reader<'_>) -> Result<Policy, StartError> {
    let programs = reader
        .has_programs()
        .then(|| byte_strings(reader.get_programs(), "programs"))
        .transpose()?;
    let cwd_roots = reader
        .has_cwd_roots()
        .then(|| byte_strings(reader.get_cwd_roots(), "cwdRoots"))
        .transpose()?
        .map(|roots| roots.into_iter().map(PathBuf::from).collect());
    let environment = if reader.has_environment() {
        let mut vars = Vec::new();
        let list = reader
            .get_environment()
            .map_err(|error| malformed("environment", error))?;
        for var in list {
            let name = var
                .get_name()
                .map_err(|error| malformed("environment", error))?;
            let value = var
                .get_value()
                .map_err(|error| malformed("environment", error))?;
            vars.push((
                OsString::from_vec(name.to_vec()),
                OsString::from_vec(value.to_vec()),
            ));
        }
        Some(vars)
    } else {
        None
    };
    let settable_env = reader
        .has_settable_env()
        .then(|| byte_strings(reader.get_settable_env(), "settableEnv"))
        .transpose()?;
    Ok(Policy {
        programs,
        cwd_roots,
        environment,
        settable_env,
        forbid_tty: reader.get_forbid_tty(),
        max_processes: Some(reader.get_max_processes()).filter(|&max| max > 0),
        max_run_time: Some(reader.get_max_run_time_ms())
            .filter(|&ms| ms > 0)
            .map(Duration::from_millis),
        rule_names: RuleNames::Schema,
    })
}

pub fn policy_to_wire(policy: &Policy, mut builder: policy::Builder<'_>) {
    if let Some(programs) = &policy.programs {
        let mut list = builder.reborrow().init_programs(programs.len() as u32);
        for (index, program) in programs.iter().enumerate() {
            list.set(index as u32, program.as_bytes());
        }
    }
    if let Some(roots) = &policy.cwd_roots {
        let mut list = builder.reborrow().init_cwd_roots(roots.len() as u32);
        for (index, root) in roots.iter().enumerate() {
            list.set(index as u32, root.as_os_str().as_bytes());
        }
    }
    if let Some(environment) = &policy.environment {
        let mut list = builder
            .reborrow()
            .init_environment(environment.len() as u32);
        for (index, (name, value)) in environment.iter().enumerate() {
            let mut var = list.reborrow().get(index as u32);
            var.set_name(name.as_bytes());
            var.set_value(value.as_bytes());
        }
    }
    if let Some(names) = &policy.settable_env {
        let mut list = builder.reborrow().init_settable_env(names.len() as u32);
        for (index, name) in names.iter().enumerate() {
            list.set(index as u32, name.as_bytes());
        }
    }
    builder.set_forbid_tty(policy.forbid_tty);
    builder.set_max_processes(policy.max_processes.unwrap_or(0));
    builder.set_max_run_time_ms(
        policy
            .max_run_time
            .filter(|max| !max.is_zero())
            // Rounded up: a limit below a millisecond is still a limit.
            .map_or(0, |max| {
                max.as_millis().clamp(1, u128::from(u64::MAX)) as u64
            }),
    );
}
