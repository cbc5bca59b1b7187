//! `StartParams` and the start spec, both directions.

use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use crate::capexec_capnp::start_params;
use crate::model::{EnvSpec, PassedStdio, PtySize, Refusal, RefusalKind, StartSpec};
use crate::wire::lists::{
    byte_strings, env_vars, limit_from_millis, limit_millis, os_string, pty_size_from_wire,
    pty_size_to_wire, set_byte_strings, set_env_vars,
};
use crate::wire::process::{flow_from_wire, flow_to_wire};
use crate::wire::sandbox::{limits_from_wire, limits_to_wire, sandbox_from_wire, sandbox_to_wire};

fn malformed(what: &str, error: impl std::fmt::Display) -> Refusal {
    Refusal::new(
        RefusalKind::InvalidArgument,
        format!("malformed start parameters ({what}): {error}"),
    )
}

pub fn start_spec_from_wire(params: start_params::Reader<'_>) -> Result<StartSpec, Refusal> {
    let argv = params
        .get_argv()
        .and_then(byte_strings)
        .map_err(|e| malformed("argv", e))?;
    let cwd = if params.has_cwd() {
        let cwd = params.get_cwd().map_err(|e| malformed("cwd", e))?;
        (!cwd.is_empty()).then(|| PathBuf::from(os_string(cwd)))
    } else {
        None
    };
    let unset = params
        .get_unset_env()
        .and_then(byte_strings)
        .map_err(|e| malformed("unsetEnv", e))?;
    let set = params
        .get_set_env()
        .and_then(env_vars)
        .map_err(|e| malformed("setEnv", e))?;
    let arg0 = if params.has_arg0() {
        Some(os_string(
            params.get_arg0().map_err(|e| malformed("arg0", e))?,
        ))
    } else {
        None
    };
    let pty_size = if params.has_pty_size() {
        pty_size_from_wire(params.get_pty_size().map_err(|e| malformed("ptySize", e))?)
    } else {
        PtySize::default()
    };
    let term = if params.has_term() {
        let term = params.get_term().map_err(|e| malformed("term", e))?;
        (!term.is_empty()).then(|| os_string(term))
    } else {
        None
    };
    let flow = flow_from_wire(params.get_flow().map_err(|e| malformed("flow", e))?);
    let sandbox = if params.has_sandbox() {
        Some(
            params
                .get_sandbox()
                .and_then(sandbox_from_wire)
                .map_err(|e| malformed("sandbox", e))?,
        )
    } else {
        None
    };
    let limits = if params.has_limits() {
        limits_from_wire(params.get_limits().map_err(|e| malformed("limits", e))?)
    } else {
        Default::default()
    };
    Ok(StartSpec {
        argv,
        cwd,
        env: EnvSpec {
            clear: params.get_clear_env(),
            unset,
            set,
        },
        arg0,
        tty: params.get_tty(),
        term,
        pipe_stdin: params.get_pipe_stdin(),
        pty_size,
        flow,
        timeout: limit_from_millis(params.get_timeout_ms()),
        sandbox,
        limits,
        passed_stdio: passed_stdio_from_wire(params)?,
    })
}

pub fn start_spec_to_wire(spec: &StartSpec, mut params: start_params::Builder<'_>) {
    set_byte_strings(
        params.reborrow().init_argv(spec.argv.len() as u32),
        &spec.argv,
    );
    if let Some(cwd) = &spec.cwd {
        params.set_cwd(cwd.as_os_str().as_bytes());
    }
    params.set_clear_env(spec.env.clear);
    set_byte_strings(
        params
            .reborrow()
            .init_unset_env(spec.env.unset.len() as u32),
        &spec.env.unset,
    );
    set_env_vars(
        params.reborrow().init_set_env(spec.env.set.len() as u32),
        &spec.env.set,
    );
    if let Some(arg0) = &spec.arg0 {
        params.set_arg0(arg0.as_bytes());
    }
    params.set_tty(spec.tty);
    if let Some(term) = &spec.term {
        params.set_term(term.as_bytes());
    }
    params.set_pipe_stdin(spec.pipe_stdin);
    pty_size_to_wire(spec.pty_size, params.reborrow().init_pty_size());
    params.set_flow(flow_to_wire(spec.flow));
    params.set_timeout_ms(limit_millis(spec.timeout));
    if let Some(sandbox) = &spec.sandbox {
        sandbox_to_wire(sandbox, params.reborrow().init_sandbox());
    }
    if !spec.limits.is_empty() {
        limits_to_wire(&spec.limits, params.reborrow().init_limits());
    }
    if let Some(passed) = spec.passed_stdio {
        let mut wire = params.init_passed_stdio();
        wire.set_first(passed.first);
        wire.set_stdin(passed.stdin);
        wire.set_stdout(passed.stdout);
        wire.set_stderr(passed.stderr);
    }
}

/// `params.passedStdio`, decoded on its own: a start takes the
/// descriptors it names before anything else can refuse it.
pub fn passed_stdio_from_wire(
    params: start_params::Reader<'_>,
) -> Result<Option<PassedStdio>, Refusal> {
    if !params.has_passed_stdio() {
        return Ok(None);
    }
    let wire = params
        .get_passed_stdio()
        .map_err(|e| malformed("passedStdio", e))?;
    let passed = PassedStdio {
        first: wire.get_first(),
        stdin: wire.get_stdin(),
        stdout: wire.get_stdout(),
        stderr: wire.get_stderr(),
    };
    Ok((passed.count() > 0).then_some(passed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Flow, Limits, Network, Sandbox};

    fn round_trip(spec: &StartSpec) -> StartSpec {
        let mut message = capnp::message::Builder::new_default();
        start_spec_to_wire(spec, message.init_root());
        let reader = message
            .get_root_as_reader::<start_params::Reader<'_>>()
            .expect("root");
        start_spec_from_wire(reader).expect("decode")
    }

    #[test]
    fn every_field_of_a_start_survives_the_wire() {
        let spec = StartSpec {
            argv: vec!["sh".into(), "-c".into(), "echo \u{1}\u{ff}".into()],
            cwd: Some("/tmp/work".into()),
            env: EnvSpec {
                clear: true,
                unset: vec!["HOME".into(), "LANG".into()],
                set: vec![("A".into(), "1".into()), ("B".into(), "".into())],
            },
            arg0: Some("-sh".into()),
            tty: true,
            term: Some("xterm-256color".into()),
            pipe_stdin: true,
            pty_size: PtySize {
                rows: 40,
                cols: 132,
            },
            flow: Flow::Lossless,
            timeout: Some(std::time::Duration::from_millis(2500)),
            sandbox: Some(Sandbox {
                read_only: vec!["/data".into()],
                writable: vec!["/out".into()],
                network: Network::All,
                no_system_roots: true,
                read_only_cwd: true,
                best_effort: true,
                allow_namespaces: true,
                keep_root: true,
                leave_out_secrets: true,
                read_only_inside: vec!["/out/.git".into()],
            }),
            limits: Limits {
                memory_bytes: Some(1 << 30),
                max_pids: Some(20),
                cpu_millis: Some(1500),
                best_effort: true,
            },
            passed_stdio: Some(crate::model::PassedStdio {
                first: 7,
                stdin: false,
                stdout: true,
                stderr: true,
            }),
        };
        assert_eq!(round_trip(&spec), spec);
    }

    #[test]
    fn defaults_survive_the_wire() {
        let spec = StartSpec::new(["true"]);
        assert_eq!(round_trip(&spec), spec);
    }
}
