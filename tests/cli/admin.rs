//! `capexec serve --admin`, `capexec ps` and `capexec kill`: the
//! operator sees and stops every process, whoever started it, and no
//! ordinary client can reach the admin capability.

use crate::common;

use std::time::Duration;

use common::cli::{Served, Watched, finish, text};
use common::data::TempDir;

/// `capexec ps --json` through `admin`, parsed.
fn ps(served: &Served, admin: &str) -> Vec<serde_json::Value> {
    let listed = finish(served.command("ps", &["--connect", admin, "--json"]), None);
    assert_eq!(listed.code, 0, "{}", text(&listed.stderr));
    match serde_json::from_slice(&listed.stdout).expect("JSON") {
        serde_json::Value::Array(records) => records,
        other => panic!("not an array: {other}"),
    }
}

/// Polls `ps` until `done` holds of its records.
fn ps_until(
    served: &Served,
    admin: &str,
    what: &str,
    done: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    common::eventually(what, || {
        let records = ps(served, admin);
        if done(&records) {
            Ok(records)
        } else {
            Err(format!("{records:?}"))
        }
    })
}

fn argv_of(record: &serde_json::Value) -> Vec<String> {
    record["argv"]
        .as_array()
        .map(|argv| {
            argv.iter()
                .filter_map(|a| a.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_admin_lists_observes_and_terminates_every_process() {
    let sockets = TempDir::new("cli-admin");
    let admin_path = sockets.path().join("admin.sock");
    let admin = format!("unix:{}", admin_path.display());
    let served = Served::start_with(&["--admin", &admin]);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&admin_path)
        .expect("admin socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    let token = served.token_arg();
    // Relayed, so that the server retains the output the observer reads
    // (handed to the command, it would be the command's alone).
    let over_unix = Watched::spawn(served.run(&[
        "--connect",
        &served.unix,
        "--relay-stdio",
        "--",
        "sh",
        "-c",
        "echo started; exec sleep 300",
    ]));
    let over_tcp = Watched::spawn(served.run(&[
        "--connect",
        &served.tcp,
        "--token-file",
        &token,
        "--",
        "sleep",
        "301",
    ]));
    over_unix.wait_for_stdout("started");
    let records = ps_until(&served, &admin, "both listed", |records| records.len() == 2);
    let unix = records
        .iter()
        .find(|r| argv_of(r) == ["sh", "-c", "echo started; exec sleep 300"])
        .expect("the unix client's process");
    let tcp = records
        .iter()
        .find(|r| argv_of(r) == ["sleep", "301"])
        .expect("the tcp client's process");
    assert_eq!(unix["state"], "running");
    assert_eq!(unix["environment"], "local");
    let owner = unix["owner"].as_str().expect("owner");
    assert!(owner.ends_with(" unix"), "{owner}");
    let tcp_owner = tcp["owner"].as_str().expect("owner");
    assert!(tcp_owner.contains(" 127.0.0.1:"), "{tcp_owner}");
    assert_ne!(owner, tcp_owner);
    let started = unix["started_ms"].as_u64().expect("started");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("now")
        .as_millis() as u64;
    assert!(started <= now && now - started < 120_000, "{started} {now}");
    let pid = unix["pid"].as_u64().expect("pid") as u32;
    let tcp_pid = tcp["pid"].as_u64().expect("pid") as u32;

    // The table, like ps.
    let table = finish(served.command("ps", &["--connect", &admin]), None);
    let table = text(&table.stdout);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    assert!(
        lines[0].starts_with("PID ") && lines[0].ends_with("COMMAND"),
        "{table}"
    );
    assert!(table.contains("sleep 301"), "{table}");

    // An observer of someone else's process: it reads, it may not act.
    let address: capexec::net::Address = admin.parse().expect("address");
    common::run_on_runtime(async move {
        let connection = capexec::net::connect_admin(&address).await.expect("admin");
        let view = capexec::client::admin::observe(&connection.admin(), pid);
        let info = view.info().await.expect("info");
        assert_eq!(info.pid, pid);
        let read = view.read(0, 1 << 16, Duration::ZERO).await.expect("read");
        let output: Vec<u8> = read
            .events
            .iter()
            .filter_map(|event| match &event.body {
                capexec::model::EventBody::Output { data, .. } => Some(data.to_vec()),
                _ => None,
            })
            .flatten()
            .collect();
        assert_eq!(output, b"started\n");
        let refused = view
            .terminate()
            .await
            .expect_err("an observer cannot terminate");
        assert!(
            matches!(&refused, capexec::client::Error::Refused(r) if r.kind == capexec::model::RefusalKind::Forbidden),
            "{refused}"
        );
        let unknown = capexec::client::admin::terminate(&connection.admin(), 1)
            .await
            .expect_err("pid 1 is not the server's");
        assert!(
            unknown
                .to_string()
                .contains("this server holds no process 1"),
            "{unknown}"
        );
    });

    // kill ends it, and its owner sees it die of SIGTERM.
    let killed = finish(
        served.command("kill", &["--connect", &admin, &pid.to_string()]),
        None,
    );
    assert_eq!((killed.code, text(&killed.stderr)), (0, String::new()));
    let ended = over_unix.finish();
    assert_eq!(ended.code, 128 + 15, "{}", text(&ended.stderr));
    ps_until(&served, &admin, "the killed one gone", |records| {
        records
            .iter()
            .all(|record| record["pid"].as_u64() != Some(u64::from(pid)))
    });
    let unknown = finish(
        served.command("kill", &["--connect", &admin, "999999999"]),
        None,
    );
    assert_eq!(
        (unknown.code, text(&unknown.stderr)),
        (
            125,
            "capexec: 999999999: this server holds no process 999999999\n".to_string()
        )
    );
    let killed = finish(
        served.command("kill", &["--connect", &admin, &tcp_pid.to_string()]),
        None,
    );
    assert_eq!(killed.code, 0);
    assert_eq!(over_tcp.finish().code, 128 + 15);
}

#[test]
fn an_ordinary_client_cannot_reach_the_admin_capability() {
    let sockets = TempDir::new("cli-admin-only");
    let admin = format!("unix:{}", sockets.path().join("admin.sock").display());
    let served = Served::start_with(&["--admin", &admin]);
    // The ordinary socket's bootstrap is an Executor: Admin calls on it are
    // unimplemented, whatever the client asks for.
    let refused = finish(served.command("ps", &["--connect", &served.unix]), None);
    assert_eq!(
        (refused.code, text(&refused.stderr)),
        (
            125,
            "capexec: this socket does not serve the admin capability (give the path of serve \
             --admin)\n"
                .to_string()
        )
    );
    let over_tcp = finish(served.command("ps", &["--connect", &served.tcp]), None);
    assert_eq!(over_tcp.code, 125);
    assert_eq!(
        text(&over_tcp.stderr),
        format!(
            "capexec: --connect {}: the admin capability is served on a Unix socket only \
             (capexec serve --admin unix:PATH)\n",
            served.tcp
        )
    );
    let unix = served.unix.clone();
    common::run_on_runtime(async move {
        let connection = capexec::net::connect(&unix.parse().expect("address"), None)
            .await
            .expect("connect");
        // Bootstrapped as an Executor, the connection's capability answers
        // only Executor's methods: an Admin call on the same capability is
        // unimplemented.
        let executor = connection.executor();
        let as_admin: capexec::capexec_capnp::admin::Client =
            capnp::capability::FromClientHook::new(executor.client.hook.clone());
        let error = capexec::client::admin::processes(&as_admin)
            .await
            .expect_err("not an admin");
        match error {
            capexec::client::Error::Rpc(error) => {
                assert_eq!(error.kind, capnp::ErrorKind::Unimplemented, "{error}")
            }
            other => panic!("{other}"),
        }
    });
    // And the admin socket does not serve an Executor.
    let run = finish(served.run(&["--connect", &admin, "--", "true"]), None);
    assert_eq!(run.code, 125);
}

#[test]
fn a_process_whose_client_died_under_resume_is_listed_as_detached() {
    let sockets = TempDir::new("cli-admin-detached");
    let admin = format!("unix:{}", sockets.path().join("admin.sock").display());
    let served = Served::start_with(&["--admin", &admin]);
    let mut client = Watched::spawn(served.run(&[
        "--connect",
        &served.unix,
        "--resume",
        "60",
        "--",
        "sh",
        "-c",
        "echo up; exec sleep 302",
    ]));
    client.wait_for_stdout("up\n");
    let records = ps_until(&served, &admin, "listed", |records| records.len() == 1);
    assert!(
        records[0]["owner"]
            .as_str()
            .is_some_and(|o| o.ends_with(" unix"))
    );
    let _ = client.child.kill();
    let _ = client.child.wait();
    let records = ps_until(&served, &admin, "parked", |records| {
        records.len() == 1 && records[0]["owner"] == "detached"
    });
    assert_eq!(
        argv_of(&records[0]),
        ["sh", "-c", "echo up; exec sleep 302"]
    );
    let pid = records[0]["pid"].as_u64().expect("pid").to_string();
    assert_eq!(
        finish(served.command("kill", &["--connect", &admin, &pid]), None).code,
        0
    );
}
