//! `capexec environments` and `capexec info`: what a server offers.

use capexec::client::{self, Error};
use capexec::model::{EnvironmentState, EnvironmentStatus, ExecutorInfo};

use crate::cli::{ConnectArgs, EXIT_CAPEXEC_FAILURE};
use crate::cli::{stdio, target};

pub fn environments_main(args: ConnectArgs) -> i32 {
    crate::cli::run_local(async move {
        let listed = async {
            let target = target::established_target(&args).await?;
            client::environments(&target.executor)
                .await
                .map_err(|error| describe(&error))
        };
        match listed.await {
            Ok(environments) => print(&table(&environments)),
            Err(message) => fail(&message),
        }
    })
}

pub fn info_main(args: ConnectArgs, environment: Option<String>) -> i32 {
    crate::cli::run_local(async move {
        let answered = async {
            let target = target::established_target(&args).await?;
            let environment = environment.or_else(|| target.environment.clone());
            let executor = match &environment {
                Some(path) => client::environment(&target.executor, path),
                None => target.executor.clone(),
            };
            client::info(&executor)
                .await
                .map_err(|error| describe(&error))
        };
        match answered.await {
            Ok(info) => print(&info_lines(&info)),
            Err(message) => fail(&message),
        }
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
    match stdio::write_answer(text) {
        Ok(()) => 0,
        Err(error) => fail(&format!(
            "cannot write the answer: {}",
            capexec::model::io_message(&error)
        )),
    }
}

fn fail(message: &str) -> i32 {
    stdio::note(message);
    EXIT_CAPEXEC_FAILURE
}

/// One line per environment: a `*` marks the default, then name, state and
/// address in aligned columns; a failure's reason and retry time come last.
fn table(environments: &[EnvironmentStatus]) -> String {
    let name_width = environments.iter().map(|e| e.name.len()).max().unwrap_or(0);
    let state_name = |state: &EnvironmentState| match state {
        EnvironmentState::Failed { .. } => "failed",
        EnvironmentState::Local => "local",
        EnvironmentState::Idle => "idle",
        EnvironmentState::Connecting => "connecting",
        EnvironmentState::Connected => "connected",
    };
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
    }
}
