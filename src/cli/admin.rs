//! `capexec ps` and `capexec kill`: the operator's view of every process a
//! server holds, over its admin socket (`capexec serve --admin unix:PATH`).

use std::time::{Duration, SystemTime};

use clap::Args;

use capexec::model::{ExitStatus, ProcessRecord};
use capexec::net::{self, Address};

use crate::cli::{EXIT_CAPEXEC_FAILURE, named, stdio};

#[derive(Args, Debug)]
pub struct AdminArgs {
    /// The server's admin socket: unix:PATH (or /PATH), or the name of a
    /// server in the configuration file whose address is one. Default:
    /// admin.sock beside the default socket.
    #[arg(long, value_name = "ADDR|NAME")]
    connect: Option<String>,
}

#[derive(Args, Debug)]
pub struct PsArgs {
    #[command(flatten)]
    admin: AdminArgs,
    /// One JSON array of records instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct KillArgs {
    #[command(flatten)]
    admin: AdminArgs,
    /// The processes to terminate (SIGTERM to each one's group, then
    /// SIGKILL after the usual grace).
    #[arg(value_name = "PID", required = true)]
    pids: Vec<u32>,
}

#[derive(Args, Debug)]
pub struct UpgradeArgs {
    #[command(flatten)]
    admin: AdminArgs,
    /// How long to wait for the upgraded server to answer on the admin
    /// socket again (30s, 2m...).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = crate::cli::duration::parse)]
    wait: Duration,
}

fn address(args: &AdminArgs) -> Result<Address, String> {
    let address = match &args.connect {
        Some(text) => named::resolve(text)?.address,
        None => Address::Unix(net::default_admin_socket_path()?),
    };
    if address.is_tcp() {
        return Err(format!(
            "--connect {address}: the admin capability is served on a Unix socket only \
             (capexec serve --admin unix:PATH)"
        ));
    }
    Ok(address)
}

async fn connect(args: &AdminArgs) -> Result<net::AdminConnection, String> {
    let address = address(args)?;
    net::connect_admin(&address)
        .await
        .map_err(|error| error.to_string())
}

pub fn ps_main(args: PsArgs) -> i32 {
    crate::cli::run_local(async move {
        let listed = async {
            let connection = connect(&args.admin).await?;
            capexec::client::admin::processes(&connection.admin())
                .await
                .map_err(|error| describe(&connection, &error))
        };
        match listed.await {
            Ok(records) => {
                let text = if args.json {
                    json(&records)
                } else {
                    table(&records, SystemTime::now())
                };
                stdio::print_answer(text, "the answer")
            }
            Err(message) => fail(&message),
        }
    })
}

pub fn kill_main(args: KillArgs) -> i32 {
    crate::cli::run_local(async move {
        let connection = match connect(&args.admin).await {
            Ok(connection) => connection,
            Err(message) => return fail(&message),
        };
        let admin = connection.admin();
        let mut code = 0;
        for pid in &args.pids {
            match capexec::client::admin::terminate(&admin, *pid).await {
                Ok(true) => {}
                Ok(false) => stdio::note(&format!("{pid} had already exited")),
                Err(error) => {
                    if let Some(not_capexec) = connection.not_a_capexec_server() {
                        return fail(&not_capexec.to_string());
                    }
                    stdio::note(&format!("{pid}: {}", describe(&connection, &error)));
                    code = EXIT_CAPEXEC_FAILURE;
                }
            }
        }
        code
    })
}

/// `capexec upgrade`: the server re-executes into the binary now at its
/// path, handing everything over; this waits until the upgraded server
/// answers on the admin socket.
pub fn upgrade_main(args: UpgradeArgs) -> i32 {
    crate::cli::run_local(async move {
        let connection = match connect(&args.admin).await {
            Ok(connection) => connection,
            Err(message) => return fail(&message),
        };
        match capexec::client::admin::upgrade(&connection.admin()).await {
            Ok(()) => {}
            // The server closes every connection as it upgrades: its
            // answer may not have left first. Reconnecting tells.
            Err(capexec::client::Error::Rpc(error))
                if error.kind == capnp::ErrorKind::Disconnected
                    && connection.not_a_capexec_server().is_none() => {}
            Err(error) => {
                return fail(&format!(
                    "the server was not upgraded and serves as before: {}",
                    describe(&connection, &error)
                ));
            }
        }
        drop(connection);
        let deadline = tokio::time::Instant::now() + args.wait;
        loop {
            let answered = async {
                let connection = connect(&args.admin).await?;
                let admin = connection.admin();
                capexec::client::admin::processes(&admin)
                    .await
                    .map_err(|error| describe(&connection, &error))?;
                capexec::client::admin::last_upgrade_failure(&admin)
                    .await
                    .map_err(|error| describe(&connection, &error))
            };
            match answered.await {
                Ok(None) => {
                    stdio::note("upgraded: the server serves from the new binary");
                    return 0;
                }
                Ok(Some(failure)) => {
                    return fail(&format!(
                        "the server was not upgraded: {failure}; it serves from the binary \
                         before, which took everything back"
                    ));
                }
                Err(message) if tokio::time::Instant::now() >= deadline => {
                    return fail(&format!(
                        "the server took the new binary but did not answer within {}: {message}",
                        capexec::model::show_duration(args.wait)
                    ));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    })
}

fn describe(connection: &net::AdminConnection, error: &capexec::client::Error) -> String {
    if let Some(not_capexec) = connection.not_a_capexec_server() {
        return not_capexec.to_string();
    }
    match error {
        capexec::client::Error::Rpc(error) if error.kind == capnp::ErrorKind::Unimplemented => {
            "this socket does not serve the admin capability (give the path of serve --admin)"
                .to_string()
        }
        capexec::client::Error::Refused(refusal) => refusal.message.clone(),
        other => other.to_string(),
    }
}

fn fail(message: &str) -> i32 {
    stdio::note(message);
    EXIT_CAPEXEC_FAILURE
}

/// Like `docker ps`: one line per process.
fn table(records: &[ProcessRecord], now: SystemTime) -> String {
    let mut rows =
        vec![["PID", "OWNER", "STATE", "AGE", "CPU", "MEMORY", "COMMAND"].map(str::to_string)];
    for record in records {
        rows.push([
            record.pid.to_string(),
            record
                .owner
                .clone()
                .unwrap_or_else(|| "detached".to_string()),
            state(record),
            age(now.duration_since(record.started).unwrap_or_default()),
            format!("{:.2}s", record.cpu_ms as f64 / 1000.0),
            memory(record.memory_bytes),
            command_line(&record.argv),
        ]);
    }
    let widths: Vec<usize> = (0..7)
        .map(|column| {
            rows.iter()
                .map(|row| row[column].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (column, cell) in row.iter().enumerate() {
            if column + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:width$}  ", width = widths[column]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn state(record: &ProcessRecord) -> String {
    match &record.exit {
        None => "running".to_string(),
        Some(exit) => match exit.status {
            ExitStatus::Code(code) => format!("exited {code}"),
            ExitStatus::Killed { signal, number, .. } => match signal {
                Some(signal) => format!("killed {signal}"),
                None => format!("killed {number}"),
            },
        },
    }
}

fn age(elapsed: Duration) -> String {
    let seconds = elapsed.as_secs();
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3600 => format!("{}m", seconds / 60),
        3600..86_400 => format!("{}h", seconds / 3600),
        _ => format!("{}d", seconds / 86_400),
    }
}

fn memory(bytes: u64) -> String {
    if bytes == 0 {
        "-".to_string()
    } else if bytes < 10 << 20 {
        format!("{}K", bytes >> 10)
    } else {
        format!("{}M", bytes >> 20)
    }
}

/// The argv as a shell would show it: arguments with spaces or odd bytes
/// quoted, control characters escaped so a name cannot rewrite the table.
fn command_line(argv: &[Vec<u8>]) -> String {
    argv.iter()
        .map(|argument| {
            let text = String::from_utf8_lossy(argument);
            let plain = !text.is_empty()
                && text
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
            if plain {
                text.into_owned()
            } else {
                format!("{:?}", text.as_ref())
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn json(records: &[ProcessRecord]) -> String {
    let values: Vec<serde_json::Value> = records
        .iter()
        .map(|record| {
            let (state, exit) = match &record.exit {
                None => ("running", serde_json::Value::Null),
                Some(exit) => (
                    "exited",
                    match exit.status {
                        ExitStatus::Code(code) => serde_json::json!({ "code": code }),
                        ExitStatus::Killed { number, signal, .. } => serde_json::json!({
                            "signal": number,
                            "name": signal.map(|signal| signal.to_string()),
                        }),
                    },
                ),
            };
            serde_json::json!({
                "pid": record.pid,
                "argv": record.argv.iter().map(|a| String::from_utf8_lossy(a).into_owned()).collect::<Vec<_>>(),
                "environment": record.environment,
                "started_ms": record
                    .started
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_millis() as u64,
                "state": state,
                "exit": exit,
                "owner": record.owner.clone().unwrap_or_else(|| "detached".to_string()),
                "cpu_ms": record.cpu_ms,
                "memory_bytes": record.memory_bytes,
            })
        })
        .collect();
    let mut text = serde_json::Value::Array(values).to_string();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use capexec::model::Exit;

    #[test]
    fn the_table_is_aligned_and_escapes_what_it_shows() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let records = vec![
            ProcessRecord {
                pid: 42,
                argv: vec![b"sleep".to_vec(), b"30".to_vec()],
                environment: "local".into(),
                started: now - Duration::from_secs(125),
                exit: None,
                owner: Some("3 unix".into()),
                cpu_ms: 1500,
                memory_bytes: 2 << 20,
            },
            ProcessRecord {
                pid: 1234,
                argv: vec![b"sh".to_vec(), b"-c".to_vec(), b"echo \x1b[2J".to_vec()],
                environment: "local".into(),
                started: now - Duration::from_secs(5),
                exit: Some(Exit::status(ExitStatus::Code(2))),
                owner: None,
                cpu_ms: 0,
                memory_bytes: 0,
            },
        ];
        assert_eq!(
            table(&records, now),
            "PID   OWNER     STATE     AGE  CPU    MEMORY  COMMAND\n\
             42    3 unix    running   2m   1.50s  2048K   sleep 30\n\
             1234  detached  exited 2  5s   0.00s  -       sh -c \"echo \\u{1b}[2J\"\n"
        );
        let json = json(&records);
        assert!(json.starts_with("[{"), "{json}");
        assert!(json.contains("\"owner\":\"detached\""), "{json}");
    }
}
