//! `capexec environments` and `capexec info`: what a server offers.

use capexec::client::{self, Error};
use capexec::model::{EnvironmentState, EnvironmentStatus, ExecutorInfo};

use crate::cli::{EXIT_CAPEXEC_FAILURE, EnvironmentsArgs, InfoArgs};
use crate::cli::{stdio, target};

pub fn environments_main(args: EnvironmentsArgs) -> i32 {
    crate::cli::run_local(async move {
        let listed = async {
            let target = target::established_target(&args.connect).await?;
            client::environments(&target.executor)
                .await
                .map_err(|error| describe(&error))
        };
        match listed.await {
            Ok(environments) if args.json => print(&json_line(&environments_json(&environments))),
            Ok(environments) => print(&table(&environments)),
            Err(message) => fail(&message),
        }
    })
}

pub fn info_main(args: InfoArgs) -> i32 {
    crate::cli::run_local(async move {
        let answered = async {
            let target = target::established_target(&args.connect).await?;
            let environment = args.environment.or_else(|| target.environment.clone());
            let executor = match &environment {
                Some(path) => client::environment(&target.executor, path),
                None => target.executor.clone(),
            };
            client::info(&executor)
                .await
                .map_err(|error| describe(&error))
        };
        match answered.await {
            Ok(info) if args.json => print(&json_line(&info_json(&info))),
            Ok(info) => print(&info_lines(&info)),
            Err(message) => fail(&message),
        }
    })
}

/// One JSON document and its newline.
pub fn json_line(value: &serde_json::Value) -> String {
    let mut text = value.to_string();
    text.push('\n');
    text
}

/// `environments --json`: one object per environment, in the table's
/// order: `name`, `default` (the `*`), `state` (the table's word),
/// `address` (null for `local`), and for a failed one `reason` and
/// `retry_in_ms` (null otherwise).
fn environments_json(environments: &[EnvironmentStatus]) -> serde_json::Value {
    let objects = environments
        .iter()
        .map(|environment| {
            let (reason, retry_in_ms) = match &environment.state {
                EnvironmentState::Failed { reason, retry_in } => (
                    serde_json::Value::from(reason.as_str()),
                    serde_json::Value::from(retry_in.as_millis() as u64),
                ),
                _ => (serde_json::Value::Null, serde_json::Value::Null),
            };
            serde_json::json!({
                "name": environment.name,
                "default": environment.is_default,
                "state": state_name(&environment.state),
                "address": (!environment.address.is_empty()).then_some(&environment.address),
                "reason": reason,
                "retry_in_ms": retry_in_ms,
            })
        })
        .collect();
    serde_json::Value::Array(objects)
}

/// `info --json`: the lines' labels as keys, `features` a list.
fn info_json(info: &ExecutorInfo) -> serde_json::Value {
    serde_json::json!({
        "environment": info.environment,
        "version": info.version,
        "os": info.os,
        "arch": info.arch,
        "hostname": info.hostname,
        "shell": info.default_shell.to_string_lossy(),
        "cwd": info.cwd.to_string_lossy(),
        "temp": info.temp_dir.to_string_lossy(),
        "features": info.features,
    })
}

fn describe(error: &Error) -> String {
    match error {
        Error::Rpc(error) if error.kind == capnp::ErrorKind::Unimplemented => {
            "the server is too old to answer this (it predates environments and info)".to_string()
        }
        other => other.to_string(),
    }
}

fn print(text: &str) -> i32 {
    stdio::print_answer(text, "the answer")
}

fn fail(message: &str) -> i32 {
    stdio::note(message);
    EXIT_CAPEXEC_FAILURE
}

/// One line per environment: a `*` marks the default, then name, state and
/// address in aligned columns; a failure's reason and retry time come last.
fn table(environments: &[EnvironmentStatus]) -> String {
    let name_width = environments.iter().map(|e| e.name.len()).max().unwrap_or(0);
    let mut text = String::new();
    for environment in environments {
        let marker = if environment.is_default { '*' } else { ' ' };
        let mut line = format!(
            "{marker} {:<name_width$}  {:<10}  {}",
            environment.name,
            state_name(&environment.state),
            environment.address
        );
        if let EnvironmentState::Failed { reason, retry_in } = &environment.state {
            line.push_str(&format!(
                "  ({reason}; next attempt in {:.1}s)",
                retry_in.as_secs_f64()
            ));
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

fn state_name(state: &EnvironmentState) -> &'static str {
    match state {
        EnvironmentState::Failed { .. } => "failed",
        EnvironmentState::Local => "local",
        EnvironmentState::Idle => "idle",
        EnvironmentState::Connecting => "connecting",
        EnvironmentState::Connected => "connected",
    }
}

fn info_lines(info: &ExecutorInfo) -> String {
    format!(
        "environment: {}\nversion: {}\nos: {}\narch: {}\nhostname: {}\nshell: {}\ncwd: {}\ntemp: {}\nfeatures: {}\n",
        info.environment,
        info.version,
        info.os,
        info.arch,
        info.hostname,
        info.default_shell.display(),
        info.cwd.display(),
        info.temp_dir.display(),
        info.features.join(" "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_table_marks_the_default_and_explains_failures() {
        let environments = vec![
            EnvironmentStatus {
                name: "local".into(),
                address: String::new(),
                is_default: false,
                state: EnvironmentState::Local,
            },
            EnvironmentStatus {
                name: "build".into(),
                address: "unix:/run/b.sock".into(),
                is_default: true,
                state: EnvironmentState::Connected,
            },
            EnvironmentStatus {
                name: "gpu".into(),
                address: "tcp:10.0.0.9:7000".into(),
                is_default: false,
                state: EnvironmentState::Failed {
                    reason: "cannot connect to tcp:10.0.0.9:7000: Connection refused".into(),
                    retry_in: Duration::from_millis(1500),
                },
            },
        ];
        assert_eq!(
            table(&environments),
            "  local  local\n\
             * build  connected   unix:/run/b.sock\n\
             \x20 gpu    failed      tcp:10.0.0.9:7000  (cannot connect to tcp:10.0.0.9:7000: Connection refused; next attempt in 1.5s)\n"
        );
        assert_eq!(
            json_line(&environments_json(&environments)),
            "[{\"address\":null,\"default\":false,\"name\":\"local\",\"reason\":null,\
             \"retry_in_ms\":null,\"state\":\"local\"},{\"address\":\"unix:/run/b.sock\",\
             \"default\":true,\"name\":\"build\",\"reason\":null,\"retry_in_ms\":null,\
             \"state\":\"connected\"},{\"address\":\"tcp:10.0.0.9:7000\",\"default\":false,\
             \"name\":\"gpu\",\"reason\":\"cannot connect to tcp:10.0.0.9:7000: Connection \
             refused\",\"retry_in_ms\":1500,\"state\":\"failed\"}]\n"
        );
    }
}
