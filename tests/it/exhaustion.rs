//! A logged-in client trying to take the server from everyone, against a
//! real `capexec serve`: holding directories, restricted executors and
//! port connections until something runs out, wedging the blocking pool
//! with FIFOs and with transfers whose client never answers. Each attack
//! must meet a `[capexec:limit]` (per connection, then server-wide) or
//! hold no thread, and another client's starts and file calls must keep
//! working while it runs.

use crate::common;

use std::rc::Rc;
use std::time::Duration;

use capexec::capexec_capnp::{byte_sink, directory, entry_sink, executor, upload_sink};
use capexec::client::{Command, Directory, StdioHandoff};
use capexec::model::{Policy, RefusalKind};
use capexec::net::{Address, Connection};
use common::cli::Served;
use common::data::TempDir;
use common::pipe_lock::{self, KillOnDrop, io_thread_states};
use common::procfs;

/// How long an honest client may take before the server counts as wedged
/// (a hang detector, not a speed goal: a served call takes milliseconds).
const WEDGED: Duration = Duration::from_secs(60);

async fn connect(served: &Served) -> Connection {
    capexec::net::connect(&Address::Unix(served.socket.clone()), None)
        .await
        .expect("connect")
}

/// Another client's start and file calls, while an attack holds what it
/// holds: served, not wedged.
async fn an_honest_client_is_served(served: &Served, dir: &std::path::Path) {
    let honest = async {
        let connection = connect(served).await;
        let executor = connection.executor();
        let status = Command::new("true")
            .status(&executor)
            .await
            .expect("the honest client's start");
        assert!(status.success());
        let files = Directory::open(&executor, dir);
        files
            .write("honest.txt", b"still served")
            .await
            .expect("the honest client's write");
        assert_eq!(
            files
                .read("honest.txt")
                .await
                .expect("the honest client's read"),
            b"still served"
        );
    };
    tokio::time::timeout(WEDGED, honest)
        .await
        .expect("the server is wedged: an honest client was not served");
}

/// The refusal `result` carries: its kind and message.
fn refused<T>(result: Result<T, capexec::client::Error>) -> (RefusalKind, String) {
    match result {
        Err(capexec::client::Error::Refused(refusal)) => (refusal.kind, refusal.message),
        Err(other) => panic!("expected a refusal, got {other}"),
        Ok(_) => panic!("expected a refusal, the call succeeded"),
    }
}

/// Opens `.` beneath `root` over and over, pipelined, until refused;
/// returns what it holds and the refusal.
async fn hold_subdirectories(
    root: &Directory,
    most: usize,
) -> (Vec<Directory>, (RefusalKind, String)) {
    let mut held = Vec::new();
    while held.len() < most {
        let batch: Vec<Directory> = (0..64).map(|_| root.subdirectory(".")).collect();
        let answers = futures::future::join_all(batch.iter().map(Directory::info)).await;
        for (dir, answer) in batch.into_iter().zip(answers) {
            match answer {
                Ok(_) => held.push(dir),
                Err(error) => return (held, refused::<()>(Err(error))),
            }
        }
    }
    panic!("{most} directories held and none refused");
}

/// Held directories count against the connection (half of the server's
/// share of descriptors) and the server: one connection took every one of
/// the server's 20,000 descriptors in 1.5 s before.
#[test]
fn held_directories_are_bounded_per_connection_and_server_wide() {
    common::run_local(async {
        // 4,096 descriptors: 512 kept for capabilities, 256 per connection.
        let served = Served::start_limited(&[], Some(4096));
        let work = TempDir::new("held-dirs");
        let server = served.child.id();
        let before = procfs::open_fds(server);

        let first = connect(&served).await;
        let root = Directory::open(&first.executor(), work.path());
        let (held, (kind, message)) = hold_subdirectories(&root, 10_000).await;
        assert_eq!(kind, RefusalKind::LimitReached, "{message}");
        assert!(
            message.contains(
                "this connection's capabilities already hold its maximum of 256 descriptors"
            ),
            "{message}"
        );
        // The root directory holds one of the 256.
        assert_eq!(held.len(), 255);
        assert!(procfs::open_fds(server) < before + 300);
        an_honest_client_is_served(&served, work.path()).await;

        // A second connection takes what is left to connections that hold
        // much: three quarters of the server's share in all.
        let second = connect(&served).await;
        let other_root = Directory::open(&second.executor(), work.path());
        let (more, (kind, message)) = hold_subdirectories(&other_root, 10_000).await;
        assert_eq!(kind, RefusalKind::LimitReached, "{message}");
        assert!(
            message.contains(
                "the server's capabilities already hold its maximum of 384 descriptors for every \
                 connection together (of 512,"
            ),
            "{message}"
        );
        assert_eq!(more.len(), 127);
        assert!(procfs::open_fds(server) < before + 600);
        // The last quarter is kept for connections that hold little: an
        // honest client still opens its directory and files.
        an_honest_client_is_served(&served, work.path()).await;
        let third = connect(&served).await;
        assert!(
            Command::new("true")
                .status(&third.executor())
                .await
                .expect("start")
                .success()
        );
        // Released, they are given back.
        drop((held, more, root, other_root, first, second));
        common::eventually_async("the released directories are given back", async || {
            let again = Directory::open(&third.executor(), work.path());
            again.info().await.map(drop)
        })
        .await;
    });
}

/// A restricted executor's rules count against the connection's memory:
/// 100 restrictions with a 7 MiB environment took 731 MiB before.
#[test]
fn restricted_executors_count_against_the_connections_memory() {
    common::run_local(async {
        let served = Served::start();
        let work = TempDir::new("held-rules");
        let server = served.child.id();
        let before = procfs::rss_quiet(server).await;
        let peak = procfs::PeakRss::watch(server);
        let connection = connect(&served).await;
        let policy = Policy {
            environment: Some(vec![("BIG".into(), "x".repeat(7 << 20).into())]),
            ..Policy::default()
        };
        let mut held: Vec<executor::Client> = Vec::new();
        let (kind, message) = loop {
            assert!(held.len() < 100, "100 restrictions of 7 MiB held");
            let restricted = capexec::client::restrict(&connection.executor(), &policy);
            match capexec::client::info(&restricted).await {
                Ok(_) => held.push(restricted),
                Err(error) => break refused::<()>(Err(error)),
            }
        };
        assert_eq!(kind, RefusalKind::LimitReached, "{message}");
        assert!(
            message.contains("this connection's capabilities already hold its maximum of"),
            "{message}"
        );
        assert!(message.contains("bytes of memory"), "{message}");
        // 160 MiB per connection: 22 of them.
        assert_eq!(held.len(), 22);
        an_honest_client_is_served(&served, work.path()).await;
        assert!(
            peak.peak_kib() < before + 256 * 1024,
            "RSS {before} -> {} KiB",
            peak.peak_kib()
        );
        // Released, the memory goes back to the system.
        drop((held, connection));
        procfs::rss_settles_below(server, before + 8 * 1024).await;
    });
}

/// Port connections count against the server's share of descriptors too:
/// 20 connections of 1,000 dials took every descriptor before.
#[test]
fn port_connections_are_bounded_server_wide() {
    common::run_local(async {
        let served = Served::start_limited(&[], Some(4096));
        let work = TempDir::new("held-ports");
        let server = served.child.id();
        let before = procfs::open_fds(server);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = format!("tcp:{}", listener.local_addr().expect("address"));
        let accepting = tokio::task::spawn_local(async move {
            let mut kept = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                kept.push(socket);
            }
        });
        let mut connections = Vec::new();
        let mut streams = Vec::new();
        let mut dialled = Vec::new();
        let mut refusals = Vec::new();
        for _ in 0..3 {
            let connection = connect(&served).await;
            let executor = connection.executor();
            connections.push(connection);
            let mut count = 0;
            loop {
                match capexec::client::dial(&executor, &address).await {
                    Ok(stream) => streams.push(stream),
                    Err(error) => {
                        refusals.push(refused::<()>(Err(error)));
                        break;
                    }
                }
                count += 1;
                assert!(count < 2_000, "no limit met");
            }
            dialled.push(count);
        }
        // Of the 512 descriptors kept for capabilities: half for the first
        // connection, the rest of three quarters for the second, and for
        // the third what a connection that holds little may take of the
        // last quarter.
        assert_eq!(dialled, [256, 128, 16]);
        for (kind, message) in &refusals {
            assert_eq!(*kind, RefusalKind::LimitReached, "{message}");
        }
        assert!(
            refusals[0].1.contains("this connection's capabilities"),
            "{}",
            refusals[0].1
        );
        assert!(
            refusals[1].1.contains("the server's capabilities"),
            "{}",
            refusals[1].1
        );
        assert!(
            refusals[2].1.contains("the server's capabilities"),
            "{}",
            refusals[2].1
        );
        assert!(procfs::open_fds(server) < before + 600);
        an_honest_client_is_served(&served, work.path()).await;
        drop(streams);
        accepting.abort();
    });
}

/// `writeFile` in place into a FIFO held a blocking thread in open(2)
/// until a reader came: 512 of them wedged every file call of every
/// client. A FIFO, socket or device is never opened where a regular file
/// is meant.
#[test]
fn a_fifo_named_as_a_file_is_refused_without_holding_a_thread() {
    common::run_local(async {
        let served = Served::start();
        let work = TempDir::new("fifo");
        let fifo = work.path().join("pipe");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        let connection = connect(&served).await;
        let dir = Directory::open(&connection.executor(), work.path());
        let write_in_place = |dir: &Directory| {
            let mut request = dir.client().write_file_request();
            request.get().set_path(b"pipe");
            request.get().set_data(b"x");
            request.get().init_options().set_in_place(true);
            request.send().promise
        };
        let answers = futures::future::join_all((0..600).map(|_| write_in_place(&dir))).await;
        for answer in answers {
            let error = capexec::client::Error::from(answer.err().expect("refused"));
            assert_eq!(
                error.refusal_kind(),
                Some(RefusalKind::InvalidArgument),
                "{error}"
            );
            assert!(
                error.to_string().contains("not a regular file (a FIFO)"),
                "{error}"
            );
        }
        let error = dir.write("pipe", b"x").await.expect_err("refused");
        assert!(
            error.to_string().contains("not a regular file (a FIFO)"),
            "{error}"
        );
        let (kind, message) = refused(dir.read("pipe").await);
        assert_eq!(kind, RefusalKind::InvalidArgument, "{message}");
        assert!(
            std::fs::symlink_metadata(&fifo)
                .expect("still there")
                .file_type()
                .is_fifo()
        );
        an_honest_client_is_served(&served, work.path()).await;
        let threads = procfs::status_field(served.child.id(), "Threads:").expect("threads");
        assert!(threads < 64, "{threads} threads");
    });
}

use std::os::unix::fs::FileTypeExt;

/// A sink that takes a chunk and never answers.
struct Stalled;

impl byte_sink::Server for Stalled {
    async fn write(self: Rc<Self>, _: byte_sink::WriteParams) -> Result<(), capnp::Error> {
        std::future::pending().await
    }
}

impl entry_sink::Server for Stalled {
    async fn push(self: Rc<Self>, _: entry_sink::PushParams) -> Result<(), capnp::Error> {
        std::future::pending().await
    }
}

/// Starts a download of `path` into a sink that never answers.
fn stalled_download(dir: &directory::Client, path: &str) -> impl std::future::Future + use<> {
    let mut request = dir.download_request();
    request.get().set_path(path.as_bytes());
    request
        .get()
        .set_sink(capnp_rpc::new_client::<byte_sink::Client, _>(Stalled));
    request.send().promise
}

/// Starts a walk into a sink that never answers.
fn stalled_walk(dir: &directory::Client) -> impl std::future::Future + use<> {
    let mut request = dir.walk_request();
    request.get().set_path(b"");
    request.get().init_options();
    request
        .get()
        .set_sink(capnp_rpc::new_client::<entry_sink::Client, _>(Stalled));
    request.send().promise
}

/// Starts an upload and writes one chunk, never `done`.
async fn unfinished_upload(dir: &directory::Client, path: String) -> Option<upload_sink::Client> {
    let mut request = dir.upload_request();
    request.get().set_path(path.as_bytes());
    request.get().init_options();
    let response = request.send().promise.await.ok()?;
    let sink = response.get().ok()?.get_sink().ok()?;
    let mut write = sink.write_request();
    write.get().set_data(&[7u8; 64 * 1024]);
    write.send().await.ok()?;
    Some(sink)
}

/// Transfers whose client never answers held a blocking thread each: 8
/// connections of 64 unfinished uploads, or 9 of 64 downloads or walks
/// into sinks that never acknowledge, wedged the pool (and kept 1.3 GB).
/// Now they wait without a thread, within the connection's and the
/// server's memory, and everyone else is served.
#[test]
fn transfers_waiting_on_their_client_hold_no_thread() {
    common::run_local(async {
        let served = Served::start();
        let work = TempDir::new("stalled");
        std::fs::write(work.path().join("big"), vec![1u8; 8 << 20]).expect("big file");
        for n in 0..64 {
            std::fs::create_dir_all(work.path().join(format!("tree/{n}"))).expect("tree");
        }
        let server = served.child.id();
        let before = procfs::rss_quiet(server).await;
        let threads_before = procfs::threads_but_the_spawner(server).expect("threads");
        let mut connections = Vec::new();
        let mut sinks = Vec::new();
        let mut pending = Vec::new();
        for attacker in 0..8 {
            let connection = connect(&served).await;
            let dir = Directory::open(&connection.executor(), work.path());
            let client = dir.client().clone();
            for n in 0..64 {
                let client = client.clone();
                match attacker % 3 {
                    0 => sinks.push(unfinished_upload(&client, format!("up-{attacker}-{n}")).await),
                    1 => pending.push(tokio::task::spawn_local(async move {
                        let _ = stalled_download(&client, "big").await;
                    })),
                    _ => pending.push(tokio::task::spawn_local(async move {
                        let _ = stalled_walk(&client).await;
                    })),
                }
            }
            connections.push((connection, dir));
        }
        // Every transfer has started (or been refused) once its connection
        // answers a later call.
        for (_, dir) in &connections {
            dir.info().await.expect("info");
        }
        an_honest_client_is_served(&served, work.path()).await;
        // The memory they may hold is bounded server-wide (512 MiB).
        let rss = procfs::status_field(server, procfs::HELD).expect("rss");
        assert!(rss < 640 * 1024, "RSS {rss} KiB");
        // Their file calls ran on the blocking pool, up to 16 per
        // connection at once, and the pool keeps a thread it started for
        // ten seconds after its last call. Once those have gone, with
        // all 512 transfers still waiting, the server has the threads it
        // had before them: the transfers hold none.
        let threads =
            common::eventually_async("the stalled transfers to hold no thread", async || {
                let threads = procfs::threads_but_the_spawner(server).expect("threads");
                if threads <= threads_before {
                    Ok(threads)
                } else {
                    Err(format!(
                        "{threads} threads, {threads_before} before the transfers"
                    ))
                }
            })
            .await;
        for task in pending {
            task.abort();
        }
        drop((sinks, connections));
        // Once the attackers are gone, so is what they made the server
        // hold (a few MiB of allocator slack at most).
        let after = procfs::rss_settles_below(server, before + 8 * 1024).await;
        eprintln!(
            "RSS {before} KiB before, {rss} KiB during, {after} KiB after; {threads_before} threads before, {threads} during"
        );
    });
}

/// inotify instances of the server's process: one, however many watches.
fn inotify_instances(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fds")
        .flatten()
        .filter(|entry| {
            std::fs::read_link(entry.path())
                .is_ok_and(|target| target.as_os_str() == "anon_inode:inotify")
        })
        .count()
}

/// Watches took an inotify instance and a thread each: four connections
/// took every instance of the server's user, and ten recursive watches its
/// every watch, so the user's other programs failed. Now the server has
/// one instance and one thread for all, and its watches hold at most their
/// share of the user's watches.
#[test]
fn watches_share_one_instance_within_a_share_of_the_users_watches() {
    common::run_local(async {
        let served = Served::start_with(&["--max-inotify-watches", "100"]);
        let work = TempDir::new("watches");
        for n in 0..150 {
            std::fs::create_dir_all(work.path().join(format!("deep/{n}"))).expect("tree");
        }
        for n in 0..128 {
            std::fs::create_dir(work.path().join(format!("flat-{n}"))).expect("dir");
        }
        let server = served.child.id();
        let threads_before = procfs::status_field(server, "Threads:").expect("threads");
        // Four connections of 32 watches of their own directories: one
        // instance, one thread, and the share holds.
        let mut connections = Vec::new();
        let mut watches = Vec::new();
        let mut refusals = Vec::new();
        for connection_number in 0..4 {
            let connection = connect(&served).await;
            let dir = Directory::open(&connection.executor(), work.path());
            for n in 0..32 {
                match dir
                    .watch(format!("flat-{}", connection_number * 32 + n), false)
                    .await
                {
                    Ok(watch) => watches.push(watch),
                    Err(error) => refusals.push(refused::<()>(Err(error))),
                }
            }
            connections.push((connection, dir));
        }
        assert_eq!(watches.len(), 100);
        assert_eq!(refusals.len(), 28);
        let (kind, message) = &refusals[0];
        assert_eq!(*kind, RefusalKind::LimitReached, "{message}");
        assert!(
            message.contains("share of 100 inotify watches"),
            "{message}"
        );
        assert_eq!(inotify_instances(server), 1);
        // The hub's thread, and the blocking pool's few that started the
        // watches; not one per watch (100 before).
        let threads = procfs::status_field(server, "Threads:").expect("threads");
        assert!(
            threads <= threads_before + 17,
            "{threads_before} -> {threads} threads"
        );
        an_honest_client_is_served(&served, work.path()).await;
        // Released, their kernel watches are given back; a recursive watch
        // of more directories than the share says at once, with an
        // overflow, that it could not watch them all.
        drop(watches);
        let dir = &connections[0].1;
        let mut deep = common::eventually_async("the kernel watches are given back", async || {
            dir.watch("deep", true).await
        })
        .await;
        let events = tokio::time::timeout(WEDGED, deep.next_batch())
            .await
            .expect("an event in time")
            .expect("events");
        assert_eq!(
            events[0].kind,
            capexec::model::WatchEventKind::Overflow,
            "{events:?}"
        );
        assert_eq!(inotify_instances(server), 1);
    });
}

/// A command that keeps one of its own pipes locked makes every call on
/// that pipe sleep uninterruptibly, O_NONBLOCK or not. It stops its own
/// output or input, and nothing else: another client and its owner's
/// other starts are served, and its end frees the lock and the thread
/// that waited on it.
fn holding_a_pipe_locked(fd: i32) {
    common::run_local(async move {
        let served = Served::start();
        let server = served.child.id();
        let work = TempDir::new("locked-pipe");
        let ready = work.path().join("ready");
        let connection = connect(&served).await;
        let executor = connection.executor();
        let argv = pipe_lock::holder_argv(fd, &ready);
        let mut holder = Command::new(&argv[0]);
        holder.args(&argv[1..]);
        if fd == 0 {
            holder.stdin(capexec::client::Stdin::Piped);
        }
        let process = holder.spawn(&executor).await.expect("start the holder");
        let holder_pid: i32 =
            common::eventually_async("the holder holds its pipe locked", async || {
                pipe_lock::holder_pid(&ready)
            })
            .await;
        // Should the server be wedged after all, the test fails rather
        // than wait with it: the lock goes with the descendant.
        let _unwedge = KillOnDrop::when_failing(holder_pid);
        // Written while the lock is held: it waits for the holder's end.
        let stuck_write = (fd == 0).then(|| process.write_in_order(b"stuck", "w1"));
        an_honest_client_is_served(&served, work.path()).await;
        let own = tokio::time::timeout(WEDGED, Command::new("true").status(&executor))
            .await
            .expect("the owner's connection is wedged")
            .expect("the owner's next start");
        assert!(own.success());
        // The attack is real: the process's own thread sleeps on the lock.
        common::eventually_async("an I/O thread waits on the held lock", async || {
            let states = io_thread_states(server);
            states
                .contains(&'D')
                .then_some(())
                .ok_or(format!("{states:?}"))
        })
        .await;
        // Released, its tree ends, which frees the lock (the write still
        // waiting does not keep it).
        drop(stuck_write);
        drop(process);
        common::eventually_async("no I/O thread is left", async || {
            let states = io_thread_states(server);
            states.is_empty().then_some(()).ok_or(format!("{states:?}"))
        })
        .await;
    });
}

#[test]
fn a_command_holding_its_stdout_locked_stalls_only_itself() {
    holding_a_pipe_locked(1);
}

#[test]
fn a_command_holding_its_stdin_locked_stalls_only_itself() {
    holding_a_pipe_locked(0);
}

/// A client that sends a pipe it holds locked where the server's reads
/// would not take it in (beyond a read's room, or into a restricted
/// server's plain reads) had the kernel close it on the serving thread,
/// asleep on the lock: the server stopped for everyone. Every descriptor
/// that arrives is now read in and closed off that thread, on a server
/// that keeps descriptors and on a restricted one that keeps none.
fn a_locked_pipe_sent_unread(extra: &[&str], urgently: bool) {
    common::run_local(async move {
        let served = Served::start_with(extra);
        let work = TempDir::new("unread-pipe");
        let ready = work.path().join("ready");
        let client = if urgently {
            pipe_lock::client_sending_a_locked_pipe_urgently(&served.socket, &ready)
        } else {
            pipe_lock::client_sending_a_locked_pipe(&served.socket, &ready, 40)
        };
        let _client = pipe_lock::ChildKilledOnDrop(client);
        let holder =
            common::eventually_async("the pipe is sent", async || pipe_lock::holder_pid(&ready))
                .await;
        let _holder = KillOnDrop::always(holder);
        an_honest_client_is_served(&served, work.path()).await;
    });
}

#[test]
fn a_locked_pipe_beyond_a_read_s_room_stops_nothing() {
    a_locked_pipe_sent_unread(&[], false);
}

/// An urgent byte (MSG_OOB) kept apart from the stream: a read skipped it
/// and the kernel released its descriptors on the serving thread. Urgent
/// bytes are read in line, their descriptors filed like any.
#[test]
fn a_locked_pipe_sent_as_urgent_data_stops_nothing() {
    a_locked_pipe_sent_unread(&[], true);
}

#[test]
fn a_locked_pipe_sent_to_a_restricted_server_stops_nothing() {
    a_locked_pipe_sent_unread(&["--allow-program", "/bin/true"], false);
}

/// Why a start was held up by another client's locked pipe: a child
/// between its clone and its exec held a copy of every descriptor of the
/// table it was cloned from, and its exec could be the last close of a
/// pipe a client sent (`a_locked_pipe_sent_to_a_restricted_server_stops_nothing`
/// hung 2 in 99 loaded runs so). Children are now cloned from a thread
/// whose table holds nothing of the server's: with clients connected,
/// their pipes open and a locked pipe sent, it holds 0, 1 and 2 and its
/// own two (a pidfd and its end of a socket) between starts.
#[test]
fn children_are_cloned_from_a_table_that_holds_nothing_of_the_clients() {
    common::run_local(async move {
        let served = Served::start();
        let server = served.child.id();
        let work = TempDir::new("spawner-table");
        let ready = work.path().join("ready");
        let _client = pipe_lock::ChildKilledOnDrop(pipe_lock::client_sending_a_locked_pipe(
            &served.socket,
            &ready,
            40,
        ));
        let holder =
            common::eventually_async("the pipe is sent", async || pipe_lock::holder_pid(&ready))
                .await;
        let _holder = KillOnDrop::always(holder);
        // Made in the background with the engine (cgroup tracking, which
        // this machine must have, sends starts there): ready once its
        // table holds its own two.
        common::eventually_async("the spawner is ready", async || {
            let table = procfs::thread_descriptors(server, "capexec-spawn").unwrap_or_default();
            (table.iter().filter(|(number, _)| *number > 2).count() == 2).then_some(())
        })
        .await;
        let mut connections = Vec::new();
        let mut running = Vec::new();
        for _ in 0..8 {
            let connection = connect(&served).await;
            let process = Command::new("sleep")
                .arg("60")
                .spawn(&connection.executor())
                .await
                .expect("start");
            running.push(process);
            connections.push(connection);
        }
        // So are starts handed a file of a local filesystem (tmpfs here),
        // whose close cannot flush: a client's `> out.txt`.
        let connection = connect(&served).await;
        let route = connection.stdio_route().expect("a Unix socket's route");
        let file =
            tempfile::NamedTempFile::new_in("/dev/shm").expect("a file in /dev/shm, a tmpfs");
        let out = file.reopen().expect("reopen");
        let handoff = StdioHandoff::new(route, None, Some(out.into()), None);
        let process = Command::new("sh")
            .args(["-c", "echo to the file; sleep 60"])
            .pass_stdio(handoff.clone())
            .spawn(&connection.executor())
            .await
            .expect("start");
        assert!(handoff.taken(), "a regular file is a standard descriptor");
        running.push(process);
        connections.push(connection);
        common::eventually_async("the child writes the file", async || {
            let written = std::fs::read(file.path()).unwrap_or_default();
            (written == b"to the file\n").then_some(())
        })
        .await;
        // Cloned there: they are that thread's children.
        let cloned = procfs::thread_children(server, "capexec-spawn").unwrap_or_default();
        for process in &running {
            let pid = process.info().await.expect("info").pid;
            assert!(cloned.contains(&pid), "{pid} is not among {cloned:?}");
        }
        let spawner = procfs::thread_descriptors(server, "capexec-spawn").expect(
            "the server has a spawner thread once it started something \
                 (with cgroup tracking, which this machine must have)",
        );
        let above_stdio: Vec<&(i32, String)> =
            spawner.iter().filter(|(number, _)| *number > 2).collect();
        assert_eq!(above_stdio.len(), 2, "the spawner's table: {spawner:?}");
        assert!(
            above_stdio
                .iter()
                .any(|(_, target)| target.contains("pidfd")),
            "{spawner:?}"
        );
        assert!(
            above_stdio
                .iter()
                .any(|(_, target)| target.starts_with("socket:")),
            "{spawner:?}"
        );
        let server_holds = procfs::open_fds(server);
        assert!(
            server_holds > 8 * 3,
            "the server's own table holds the clients' connections and pipes ({server_holds})"
        );
        an_honest_client_is_served(&served, work.path()).await;
        drop(running);
    });
}

/// The holders of locked pipes a client names in `ready` once it does
/// (`what`), each killed when dropped.
async fn holders_named_in(ready: &std::path::Path, what: &str) -> Vec<KillOnDrop> {
    let holders = common::eventually_async(what, async || pipe_lock::holder_pids(ready)).await;
    holders.into_iter().map(KillOnDrop::always).collect()
}

/// Once the client whose file is `ready` saw the server end its
/// connection (`ready`.ended).
async fn the_server_ends_the_connection(ready: &std::path::Path) {
    let ended = ready.with_extension("ended");
    common::eventually_async("the server ends the connection", async || {
        ended.exists().then_some(())
    })
    .await;
}

/// A client sends three pipes it holds locked, then more descriptors than
/// a connection keeps: the server's closes of the three (its last of
/// each, which take their locks) sleep on one thread of their own, not
/// one each on the pool file calls use, and the descriptors that wait
/// behind them are counted: past the bound, the connection ends.
#[test]
fn locked_pipes_a_client_sends_hold_one_thread_and_end_its_connection() {
    common::run_local(async move {
        let served = Served::start();
        let server = served.child.id();
        let work = TempDir::new("locked-pipes");
        let ready = work.path().join("ready");
        let nulls = capexec::rpc::MAX_KEPT_DESCRIPTORS + capexec::rpc::MAX_WAITING_TO_CLOSE + 8;
        let _client = pipe_lock::ChildKilledOnDrop(pipe_lock::client_sending_locked_pipes(
            &served.socket,
            &ready,
            3,
            nulls,
        ));
        let holders = holders_named_in(&ready, "the pipes are sent").await;
        the_server_ends_the_connection(&ready).await;
        common::eventually_async("one thread sleeps, closing the first pipe", async || {
            (pipe_lock::threads_asleep(server) == ["capexec-close"]).then_some(())
        })
        .await;
        an_honest_client_is_served(&served, work.path()).await;
        drop(holders);
        common::eventually_async("the closes go through", async || {
            pipe_lock::threads_asleep(server).is_empty().then_some(())
        })
        .await;
        an_honest_client_is_served(&served, work.path()).await;
    });
}

/// A client sends a pipe it holds locked, then floods the connection with
/// messages of 253 descriptors each: what waits behind the close that
/// sleeps stays within a bound (the connection ends past 64, before a
/// read that could bring a message's worth more), and what the client
/// sent and nobody read stays in the socket, read out and closed behind
/// that close, never in the server's descriptor table.
#[test]
fn a_flood_of_descriptors_behind_a_close_that_sleeps_is_bounded() {
    common::run_local(async move {
        let served = Served::start();
        let server = served.child.id();
        let before = procfs::open_fds(server);
        let work = TempDir::new("descriptor-flood");
        let ready = work.path().join("ready");
        let _client = pipe_lock::ChildKilledOnDrop(pipe_lock::client_flooding_behind_locked_pipes(
            &served.socket,
            &ready,
            1,
            400,
            253,
        ));
        let holders = holders_named_in(&ready, "the flood is sent").await;
        the_server_ends_the_connection(&ready).await;
        let held = procfs::open_fds(server).saturating_sub(before);
        let bound = capexec::rpc::MAX_KEPT_DESCRIPTORS
            + capexec::rpc::MAX_WAITING_TO_CLOSE
            + capexec::sys::SCM_MAX_FD
            + 16;
        assert!(
            held <= bound,
            "the server holds {held} more descriptors (bound {bound})"
        );
        an_honest_client_is_served(&served, work.path()).await;
        drop(holders);
        common::eventually_async("every descriptor of the flood is closed", async || {
            (procfs::open_fds(server) <= before + 16).then_some(())
        })
        .await;
        an_honest_client_is_served(&served, work.path()).await;
    });
}

/// A client that opens connections until the server refuses one cannot
/// fill the server's descriptor table: connections stop at the share of
/// the limit kept for them, what is kept for the descriptors clients
/// send stays free, and the read that brings a pipe whose lock the
/// client holds, with a message's worth more, has room for them all and
/// closes none on the serving thread. (A read that finds the table full
/// does: before connections were bounded, a client held 2,029 of them at
/// `ulimit -n 2048` and stalled the server so.)
#[test]
fn a_client_cannot_fill_the_descriptor_table_with_connections() {
    use capexec::engine::descriptors::RECEIVED_DESCRIPTORS;
    use capnp_rpc::rpc_capnp::exception;
    /// The smallest limit that keeps all of [`RECEIVED_DESCRIPTORS`].
    const LIMIT: u64 = 17_408;
    common::run_local(async move {
        let served = Served::start_limited(&[], Some(LIMIT));
        let server = served.child.id();
        let most = (LIMIT / 8) as usize;
        let mut held = Vec::with_capacity(most);
        while held.len() < most {
            let stream = tokio::net::UnixStream::connect(&served.socket).await;
            held.push(stream.expect("connect"));
        }
        let mut refused = tokio::net::UnixStream::connect(&served.socket)
            .await
            .expect("connect");
        common::hostile::told(
            &mut refused,
            exception::Type::Overloaded,
            &format!(
                "the server holds its most connections at once (the limit is {most}); try \
                 again once others have closed"
            ),
            WEDGED,
        )
        .await;
        let open = procfs::open_fds(server) as u64;
        assert!(
            open + RECEIVED_DESCRIPTORS + capexec::sys::SCM_MAX_FD as u64 <= LIMIT,
            "the server holds {open} descriptors of {LIMIT} with every connection open"
        );
        // Places for the flood's connection and an honest client's.
        held.truncate(most - 2);
        common::eventually_async("the server sees two connections close", async || {
            (procfs::open_fds(server) as u64 <= open - 2).then_some(())
        })
        .await;
        let work = TempDir::new("full-table");
        let ready = work.path().join("ready");
        let _client = pipe_lock::ChildKilledOnDrop(pipe_lock::client_flooding_behind_locked_pipes(
            &served.socket,
            &ready,
            1,
            40,
            253,
        ));
        let holders = holders_named_in(&ready, "the flood is sent").await;
        the_server_ends_the_connection(&ready).await;
        an_honest_client_is_served(&served, work.path()).await;
        drop(holders);
    });
}

/// A direct channel holds its socket on top of its port connection's,
/// and the capabilities' share of descriptors counts both: a client that
/// dials many at once gets channels while its share has room for one (a
/// dial with room for its socket alone goes through the sinks), then its
/// dials are refused. The pipes
/// the bytes move through are bounded server-wide, with a share of the
/// budget of their own. (A channel counted as nothing, and its pipes
/// unbounded, let a connection hold five descriptors per dial beyond the
/// share kept for capabilities.)
#[test]
fn direct_channels_count_every_descriptor_they_hold() {
    /// The server's limit: a share of 128 for capabilities, 64 for one
    /// connection.
    const LIMIT: u64 = 1024;
    const DIALS: usize = 40;
    common::run_local(async move {
        let served = Served::start_limited(&[], Some(LIMIT));
        let server = served.child.id();
        let (listener, address) = crate::ports::peer().await;
        let answering = tokio::task::spawn_local(async move {
            let mut held = Vec::new();
            while let Ok((mut socket, _)) = listener.accept().await {
                // One byte back once one came: the bytes moved both ways.
                let mut one = [0u8; 1];
                if tokio::io::AsyncReadExt::read_exact(&mut socket, &mut one)
                    .await
                    .is_ok()
                {
                    let _ = tokio::io::AsyncWriteExt::write_all(&mut socket, &one).await;
                }
                held.push(socket);
            }
        });
        let connection = connect(&served).await;
        let route = connection.direct_route();
        assert!(
            route.is_some(),
            "a Unix connection has a route for channels"
        );
        let before = procfs::open_fds(server);
        let mut streams = Vec::new();
        loop {
            assert!(streams.len() < DIALS, "{DIALS} dials and none refused");
            let dialled =
                capexec::client::dial_via(&connection.executor(), &address, route.as_ref()).await;
            let mut stream = match dialled {
                Ok(stream) => stream,
                Err(capexec::client::Error::Refused(refusal)) => {
                    assert_eq!(refusal.kind, RefusalKind::LimitReached, "{refusal}");
                    break;
                }
                Err(error) => panic!("dial: {error}"),
            };
            tokio::io::AsyncWriteExt::write_all(&mut stream, b"x")
                .await
                .expect("write");
            let mut one = [0u8; 1];
            tokio::io::AsyncReadExt::read_exact(&mut stream, &mut one)
                .await
                .expect("the answer");
            streams.push(stream);
        }
        let dials = streams.len();
        let direct = streams.iter().filter(|stream| stream.is_direct()).count();
        assert!(direct >= 1, "none of {dials} dials was direct");
        // Two a direct one (its socket and its channel), one a dial
        // through the sinks.
        assert_eq!(
            direct * 2 + (dials - direct),
            64,
            "{direct} of {dials} direct"
        );
        // And the pipes the bytes moved through, which the pumps bound.
        let held = procfs::open_fds(server).saturating_sub(before);
        let pipes = (direct * 4).min(2 * capexec::ports::MAX_PUMP_PIPES);
        assert!(
            held <= 64 + pipes + 8,
            "{dials} dials ({direct} direct) hold {held} descriptors at the server, more than \
             one connection's share of 64 and {pipes} for pipes"
        );
        an_honest_client_is_served(&served, TempDir::new("direct-count").path()).await;
        drop(streams);
        answering.abort();
    });
}

/// Twenty clients each leave the server a pipe they hold locked: each
/// connection's end closes its pipe on a closing thread of its own,
/// asleep on the lock, and the server's other closes (the child's ends
/// of a start's pipes, another client's descriptors) go on: a start's
/// output still ends.
#[test]
fn closes_that_sleep_leave_the_others_to_go_on() {
    const LEFT: usize = 20;
    common::run_local(async move {
        let served = Served::start();
        let server = served.child.id();
        let work = TempDir::new("closes-that-sleep");
        let ready = work.path().join("ready");
        let _clients = pipe_lock::ChildKilledOnDrop(pipe_lock::clients_leaving_locked_pipes(
            &served.socket,
            &ready,
            LEFT,
        ));
        let holders = holders_named_in(&ready, "the pipes are left").await;
        common::eventually_async("each close sleeps on its lock", async || {
            (pipe_lock::threads_asleep(server) == vec!["capexec-close"; LEFT]).then_some(())
        })
        .await;
        an_honest_client_is_served(&served, work.path()).await;
        // Its stdout is a pipe it hands the server: the server's copy is
        // closed once the child has it, or the output never ends. Read
        // to its end, not waited for: this test binary's reaper may reap
        // the client first.
        let mut run = served.run_script("echo still served");
        let mut client = run
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("capexec run");
        let mut stdout = client.stdout.take().expect("stdout");
        let echoed = tokio::task::spawn_blocking(move || {
            let mut all = Vec::new();
            std::io::Read::read_to_end(&mut stdout, &mut all).map(|_| all)
        });
        let echoed = tokio::time::timeout(WEDGED, echoed)
            .await
            .expect("the output never ended")
            .expect("reader")
            .expect("read");
        assert_eq!(echoed, b"still served\n");
        let _ = client.wait();
        drop(holders);
        common::eventually_async("the closes go through", async || {
            pipe_lock::threads_asleep(server).is_empty().then_some(())
        })
        .await;
    });
}

/// Locked pipes a client sends a restricted server (which closes each at
/// once) while another client starts process after process: a child
/// between its clone and its exec holds a copy of every descriptor the
/// server has, and if a closing thread let go of the server's copy then,
/// the child's close would be the pipe's last, asleep on the lock, with
/// the serving thread waiting for the child (CLONE_VFORK). Children mark
/// descriptors close-on-exec instead, and the exec closes them once it
/// has let the server go: at worst that one start waits for the lock.
#[test]
fn starts_are_not_held_up_by_closes_that_sleep() {
    const LEFT: usize = 40;
    common::run_local(async move {
        let served = Served::start_with(&["--allow-program", "/bin/true"]);
        let work = TempDir::new("starts-and-closes");
        let ready = work.path().join("ready");
        let connection = connect(&served).await;
        let executor = connection.executor();
        let starting = tokio::task::spawn_local({
            let executor = executor.clone();
            async move {
                let starts = (0..200).map(|_| {
                    let executor = executor.clone();
                    async move { Command::new("/bin/true").status(&executor).await }
                });
                let mut done = Vec::new();
                for start in starts {
                    done.push(tokio::task::spawn_local(start));
                    tokio::task::yield_now().await;
                }
                done
            }
        });
        let _clients = pipe_lock::ChildKilledOnDrop(pipe_lock::clients_leaving_locked_pipes(
            &served.socket,
            &ready,
            LEFT,
        ));
        let holders = holders_named_in(&ready, "the pipes are left").await;
        let started = starting.await.expect("starts");
        an_honest_client_is_served(&served, work.path()).await;
        // A start whose child took a last copy waits for its lock.
        drop(holders);
        for start in started {
            let status = tokio::time::timeout(WEDGED, start)
                .await
                .expect("a start never ended")
                .expect("task")
                .expect("start");
            assert!(status.success());
        }
    });
}

/// A dial's far end is whatever listens at the path: a hostile service
/// sends a pipe it holds locked. The server reads that socket plainly (or
/// splices it, through a direct channel), which would have the kernel
/// close the pipe on the thread that serves everyone, asleep on its lock;
/// the socket refuses descriptors instead (the service's send fails), and
/// the bytes flow.
#[test]
fn a_dialled_service_cannot_send_the_server_a_locked_pipe() {
    common::run_local(async move {
        let served = Served::start();
        let work = TempDir::new("dialled-service");
        let connection = connect(&served).await;
        let executor = connection.executor();
        for (name, route) in [("sinks", None), ("direct", connection.direct_route())] {
            let service = work.path().join(format!("{name}.sock"));
            let ready = work.path().join(format!("{name}.ready"));
            let _service = pipe_lock::ChildKilledOnDrop(pipe_lock::service_sending_a_locked_pipe(
                &service, &ready,
            ));
            common::eventually_async("the service listens", async || {
                service.exists().then_some(())
            })
            .await;
            let address = format!("unix:{}", service.display());
            let mut stream = capexec::client::dial_via(&executor, &address, route.as_ref())
                .await
                .expect("dial");
            assert_eq!(stream.is_direct(), route.is_some());
            let outcome = common::eventually_async("the service has sent", async || {
                std::fs::read_to_string(&ready).ok()
            })
            .await;
            let mut words = outcome.split_whitespace();
            let said = words.next().map(str::to_string);
            let holder = words
                .next()
                .and_then(|pid| pid.parse().ok())
                .expect("a pid");
            let _holder = KillOnDrop::always(holder);
            assert_eq!(said.as_deref(), Some("refused"), "{name}: {outcome}");
            let mut got = [0u8; 5];
            let read = tokio::io::AsyncReadExt::read_exact(&mut stream, &mut got);
            tokio::time::timeout(WEDGED, read)
                .await
                .expect("the server is wedged")
                .expect("read");
            assert_eq!(&got, b"hello", "{name}");
            an_honest_client_is_served(&served, work.path()).await;
        }
    });
}
