//! A bounded soak of one `capexec serve`: many sequential processes, many
//! concurrent ones and many concurrent clients, after which the server's
//! descriptors and threads are back where they were, with no zombie and
//! memory within noise; and consumers that never read, which cost the
//! server no more than the log bound. `cargo bench --bench capexec --
//! --only scale` runs the same at full size (see docs/RELIABILITY.md).

use crate::common;

use capexec::client::Command;
use capexec::model::{ExitStatus, Flow};
use capexec::net::{self, Address};
use common::cli::Served;
use common::procfs::{self, Usage};
use futures::future::join_all;

const SEQUENTIAL: usize = 300;
const CONCURRENT: usize = 100;
const CLIENTS: usize = 20;

async fn executor_of(served: &Served) -> net::Connection {
    let address: Address = served.unix.parse().expect("address");
    net::connect(&address, None).await.expect("connect")
}

/// The server's usage once releases have settled: no child left and its
/// descriptors back to `fds` or fewer (releases finish asynchronously, so
/// a reading may include one on its way out).
async fn settled(pid: u32, fds: u64, threads: u64) -> Usage {
    let what =
        format!("the server settles back to {fds} descriptors, {threads} threads and no children");
    common::eventually_async(&what, async || {
        let now = procfs::usage(pid);
        // Threads too: a closing thread ends once it has nothing to close.
        if now.fds <= fds && now.threads <= threads && now.zombies == 0 && now.children == 0 {
            Ok(now)
        } else {
            Err(format!("{now:?}"))
        }
    })
    .await
}

#[test]
fn many_processes_and_clients_leave_the_server_as_they_found_it() {
    common::run_local(async {
        let served = Served::start();
        let pid = served.child.id();
        let connection = executor_of(&served).await;
        let executor = connection.executor();
        let truth = Command::new("true");
        for _ in 0..10 {
            truth.status(&executor).await.expect("warm up");
        }
        let now = procfs::usage(pid);
        let before = settled(pid, now.fds, now.threads).await;

        for _ in 0..SEQUENTIAL {
            assert_eq!(
                truth.status(&executor).await.expect("true"),
                ExitStatus::Code(0)
            );
        }

        let mut sleep = Command::new("sleep");
        sleep.arg("0.2");
        let statuses = join_all((0..CONCURRENT).map(|_| sleep.status(&executor))).await;
        assert!(
            statuses
                .iter()
                .all(|s| matches!(s, Ok(ExitStatus::Code(0))))
        );

        let clients = (0..CLIENTS).map(|i| {
            let served = &served;
            async move {
                let connection = executor_of(served).await;
                let mut echo = Command::new("echo");
                echo.arg(format!("client {i}"));
                let output = echo.output(&connection.executor()).await.expect("echo");
                assert_eq!(output.stdout, format!("client {i}\n").into_bytes());
            }
        });
        join_all(clients).await;

        // No more descriptors or threads than before (fewer when one of
        // the warm-up's was still on its way out when counted).
        let after = settled(pid, before.fds, before.threads).await;
        assert!(
            after.rss_kib < before.rss_kib + 16 * 1024,
            "RSS grew by more than 16 MiB: {before:?} -> {after:?}"
        );
    });
}

/// Retain mode: a child that writes 64 MiB nobody reads runs to the end,
/// and the server keeps only the log bound. Lossless: the child blocks in
/// write(2) once a window and a pipe are full, and stays blocked.
#[test]
fn consumers_that_never_read_cost_the_log_bound() {
    common::run_local(async {
        let served = Served::start();
        let pid = served.child.id();
        let connection = executor_of(&served).await;
        let executor = connection.executor();
        let before = procfs::usage(pid);

        let mut flood = Command::new("head");
        flood
            .args(["-c", "67108864", "/dev/zero"])
            .flow(Flow::Retain);
        let retained = flood.spawn(&executor).await.expect("start");
        let info = retained.info().await.expect("info");
        let child = info.pid;
        common::eventually_async("the flood's process ends", async || {
            procfs::state(child).is_none_or(|s| s == 'Z')
        })
        .await;
        let during = procfs::usage(pid);
        assert!(
            during.rss_kib < before.rss_kib + 16 * 1024,
            "retain mode held more than the log bound: {before:?} -> {during:?}"
        );
        drop(retained);

        let mut endless = Command::new("cat");
        endless.arg("/dev/zero").flow(Flow::Lossless);
        let held = endless.spawn(&executor).await.expect("start");
        let child = held.info().await.expect("info").pid;
        common::eventually_async("the endless writer blocks in pipe_write", async || {
            procfs::wchan(child).is_some_and(|w| w.contains("pipe_write"))
        })
        .await;
        let written = procfs::bytes_written(child).expect("wchar");
        // The lossless window (1 MiB), what the pipe holds (up to 1 MiB) and
        // the chunk in flight.
        assert!(written <= 3 << 20, "the child wrote {written} bytes unread");
        let blocked = procfs::usage(pid);
        assert!(
            blocked.rss_kib < before.rss_kib + 16 * 1024,
            "lossless mode held more than the window: {before:?} -> {blocked:?}"
        );
        drop(held);
    });
}
