//! The admin socket's view of processes (`Admin.list`): what a record
//! keeps of a process's argv.

use crate::common;

use capexec::client::Command;
use capexec::model::MAX_RECORDED_ARGV_BYTES;
use capexec::net::Address;
use common::server::ServerThread;

/// The argv an admin lists for `pid`, once it is listed.
async fn listed_argv(admin: &capexec::capexec_capnp::admin::Client, pid: u32) -> Vec<Vec<u8>> {
    let records = capexec::client::admin::processes(admin)
        .await
        .expect("list");
    records
        .into_iter()
        .find(|record| record.pid == pid)
        .map(|record| record.argv)
        .expect("listed")
}

fn lengths(argv: &[Vec<u8>]) -> Vec<usize> {
    argv.iter().map(Vec::len).collect()
}

/// An argv of at most 4,096 bytes is listed whole; a longer one is cut to
/// exactly 4,096 bytes in all, the "..." that ends it included.
#[test]
fn a_long_argv_is_listed_cut_to_4096_bytes_the_mark_included() {
    common::run_local(async {
        let (server, admin) = ServerThread::with_admin("admin-argv");
        let connection = capexec::net::connect(&server.address, None)
            .await
            .expect("connect");
        let operator = capexec::net::connect_admin(&Address::Unix(admin))
            .await
            .expect("admin");
        let script = "exec sleep 300";
        let start = |last: String| {
            let executor = connection.executor();
            async move {
                let mut command = Command::new("sh");
                command.args(["-c", script, "name"]).arg(last);
                command.spawn(&executor).await.expect("start")
            }
        };
        // "sh", "-c", the script and "name".
        let fixed = 2 + 2 + script.len() + 4;
        // Exactly the bound: whole.
        let fits = "y".repeat(MAX_RECORDED_ARGV_BYTES - fixed);
        let process = start(fits.clone()).await;
        let pid = process.info().await.expect("info").pid;
        let argv = listed_argv(&operator.admin(), pid).await;
        let whole = vec![
            b"sh".to_vec(),
            b"-c".to_vec(),
            script.as_bytes().to_vec(),
            b"name".to_vec(),
            fits.into_bytes(),
        ];
        assert!(argv == whole, "lengths {:?}", lengths(&argv));
        // One byte more: cut to the bound, "..." included.
        let over = "z".repeat(MAX_RECORDED_ARGV_BYTES - fixed + 1);
        let process = start(over).await;
        let pid = process.info().await.expect("info").pid;
        let argv = listed_argv(&operator.admin(), pid).await;
        assert_eq!(MAX_RECORDED_ARGV_BYTES, 4096);
        assert_eq!(argv.iter().map(Vec::len).sum::<usize>(), 4096);
        assert_eq!(argv.len(), 5, "lengths {:?}", lengths(&argv));
        let mut cut = "z".repeat(MAX_RECORDED_ARGV_BYTES - fixed - 3).into_bytes();
        cut.extend_from_slice(b"...");
        assert!(argv[4] == cut, "lengths {:?}", lengths(&argv));
    });
}
