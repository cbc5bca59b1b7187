//! Abuse, continued: the exhaustion attacks of `tests/it/exhaustion.rs`
//! (a logged-in client holding what it can until a limit stops it) at
//! full size against a TCP server, with an honest client's start of
//! `true` and its file call (a directory opened and a small file read,
//! pipelined) measured while each attack holds what it took, next to the
//! same without an attack; and the server's RSS and threads.

use std::error::Error;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use capexec::capexec_capnp::{byte_sink, directory, executor};
use capexec::client::{Command, Directory};
use capexec::model::Policy;

use crate::Plan;
use crate::procfs::{self, PeakRss};
use crate::report::Report;
use crate::servers::Serve;

const SECTION: &str = "abuse";

#[derive(Clone, Copy)]
enum Attack {
    Subdirectories,
    Restrictions,
    Dials,
    FifoWrites,
    StalledUploads,
    StalledDownloads,
    Watches,
}

const ATTACKS: [Attack; 7] = [
    Attack::Subdirectories,
    Attack::Restrictions,
    Attack::Dials,
    Attack::FifoWrites,
    Attack::StalledUploads,
    Attack::StalledDownloads,
    Attack::Watches,
];

impl Attack {
    fn name(self) -> &'static str {
        match self {
            Attack::Subdirectories => "one connection's subdirectories, until refused",
            Attack::Restrictions => "7 MiB restrictions from one connection, until refused",
            Attack::Dials => "20 connections dialling until refused",
            Attack::FifoWrites => "512 in-place writes into a FIFO a round",
            Attack::StalledUploads => "8 connections of 64 uploads never done",
            Attack::StalledDownloads => {
                "9 connections of 64 downloads into sinks that never answer"
            }
            Attack::Watches => "4 connections of 32 watches",
        }
    }
}

/// What the attacker needs.
#[derive(Clone)]
struct Target {
    address: capexec::net::Address,
    token: capexec::net::Token,
    work: std::path::PathBuf,
    peer: String,
}

pub async fn run(plan: &Plan, report: &mut Report) -> Result<(), Box<dyn Error>> {
    let serve = Serve::start(true, &[])?;
    let dir = tempfile::tempdir()?;
    let work = dir.path().to_path_buf();
    std::fs::write(work.join("small"), vec![b's'; 4096])?;
    std::fs::write(work.join("big"), vec![b'b'; 8 << 20])?;
    nix::unistd::mkfifo(
        &work.join("pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )?;
    for n in 0..128 {
        std::fs::create_dir(work.join(format!("watched-{n}")))?;
    }
    let peer = std::net::TcpListener::bind("127.0.0.1:0")?;
    let target = Target {
        address: serve.address.clone(),
        token: serve.token.clone().ok_or("no token")?,
        work: work.clone(),
        peer: format!("tcp:{}", peer.local_addr()?),
    };
    // The peer of the dials takes whatever comes and holds it.
    let _accepting = std::thread::spawn(move || {
        let mut held = Vec::new();
        while let Ok((socket, _)) = peer.accept() {
            held.push(socket);
        }
    });
    let (executor, _connection) = serve.connect().await?;
    let runs = plan.abuse_runs;
    eprintln!("abuse: {runs} starts and file calls per exhaustion attack, and without one");
    honest(&executor, &work, plan.warmup_runs).await?;
    let (mut quiet_starts, mut quiet_files) = (Vec::new(), Vec::new());
    let mut cases = Vec::new();
    for attack in ATTACKS {
        eprintln!("abuse: {}", attack.name());
        let (starts, files) = honest(&executor, &work, runs).await?;
        quiet_starts.extend(starts);
        quiet_files.extend(files);
        let pid = serve.pid();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let before = procfs::rss_quiet(pid).await;
        let peak = PeakRss::watch(pid);
        let attacker = Attacker::start(attack, target.clone()).await?;
        let threads = procfs::status_field(pid, "Threads:").unwrap_or(0);
        let during = honest(&executor, &work, runs).await;
        attacker.stop();
        let (starts, files) = during?;
        let peak = peak.peak_kib();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let after = procfs::rss_quiet(pid).await;
        report.figure(
            SECTION,
            format!("server anonymous RSS and threads, {}", attack.name()),
            format!("{before} -> peak {peak} -> {after} KiB; {threads} threads while held"),
            None,
        );
        cases.push((attack, starts, files));
    }
    let start_baseline = report.baseline(
        SECTION,
        "start `true`, no exhaustion attack",
        quiet_starts,
        None,
    );
    let file_baseline = report.baseline(
        SECTION,
        "open a directory and read 4 KiB (pipelined), no exhaustion attack",
        quiet_files,
        None,
    );
    for (attack, starts, files) in cases {
        report.case(
            SECTION,
            format!("start `true` during: {}", attack.name()),
            starts,
            start_baseline,
            None,
            None,
            "",
        );
        report.case(
            SECTION,
            format!("directory + read during: {}", attack.name()),
            files,
            file_baseline,
            None,
            None,
            "",
        );
    }
    Ok(())
}

/// `runs` starts of `true` and `runs` file calls, each timed.
async fn honest(
    executor: &executor::Client,
    work: &std::path::Path,
    runs: usize,
) -> Result<(Vec<Duration>, Vec<Duration>), Box<dyn Error>> {
    let command = Command::new("true");
    let (mut starts, mut files) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    for _ in 0..runs {
        let started = Instant::now();
        let status = command.status(executor).await?;
        starts.push(started.elapsed());
        if !status.success() {
            return Err(format!("`true`: {status:?}").into());
        }
        let started = Instant::now();
        let read = Directory::open(executor, work).read("small").await?;
        files.push(started.elapsed());
        if read.len() != 4096 {
            return Err("the small file read short".into());
        }
    }
    Ok((starts, files))
}

/// An attack holding what it took, on its own thread, until stopped.
struct Attacker {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Attacker {
    /// Starts `attack`; returns once it holds what it can.
    async fn start(attack: Attack, target: Target) -> Result<Attacker, Box<dyn Error>> {
        let stop = Arc::new(AtomicBool::new(false));
        let (under_way, started) = tokio::sync::oneshot::channel();
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("attacker runtime");
                let local = tokio::task::LocalSet::new();
                local.block_on(&runtime, attack_until(attack, target, stop, under_way));
            })
        };
        started.await?;
        Ok(Attacker { stop, thread })
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

/// A sink that takes a chunk and never answers.
struct Stalled;

impl byte_sink::Server for Stalled {
    async fn write(self: Rc<Self>, _: byte_sink::WriteParams) -> Result<(), capnp::Error> {
        std::future::pending().await
    }
}

async fn attack_until(
    attack: Attack,
    target: Target,
    stop: Arc<AtomicBool>,
    under_way: tokio::sync::oneshot::Sender<()>,
) {
    let connect = || async {
        capexec::net::connect(&target.address, Some(&target.token))
            .await
            .expect("the attacker connects")
    };
    let mut held: Vec<Box<dyn std::any::Any>> = Vec::new();
    match attack {
        Attack::Subdirectories => {
            let connection = connect().await;
            let root = Directory::open(&connection.executor(), &target.work);
            loop {
                let batch: Vec<Directory> = (0..64).map(|_| root.subdirectory(".")).collect();
                let answers = futures::future::join_all(batch.iter().map(Directory::info)).await;
                let refused = answers.iter().any(Result::is_err);
                held.push(Box::new(batch));
                if refused {
                    break;
                }
            }
            held.push(Box::new((root, connection)));
        }
        Attack::Restrictions => {
            let connection = connect().await;
            let policy = Policy {
                environment: Some(vec![("BIG".into(), "x".repeat(7 << 20).into())]),
                ..Policy::default()
            };
            loop {
                let restricted = capexec::client::restrict(&connection.executor(), &policy);
                let refused = capexec::client::info(&restricted).await.is_err();
                held.push(Box::new(restricted));
                if refused || held.len() > 200 {
                    break;
                }
            }
            held.push(Box::new(connection));
        }
        Attack::Dials => {
            for _ in 0..20 {
                let connection = connect().await;
                for _ in 0..1000 {
                    match capexec::client::dial(&connection.executor(), &target.peer).await {
                        Ok(stream) => held.push(Box::new(stream)),
                        Err(_) => break,
                    }
                }
                held.push(Box::new(connection));
            }
        }
        Attack::FifoWrites => {
            let connection = connect().await;
            let dir = Directory::open(&connection.executor(), &target.work);
            let _ = under_way.send(());
            while !stop.load(Ordering::Relaxed) {
                let writes = (0..512).map(|_| {
                    let mut request = dir.client().write_file_request();
                    request.get().set_path(b"pipe");
                    request.get().set_data(b"x");
                    request.get().init_options().set_in_place(true);
                    request.send().promise
                });
                let _ = futures::future::join_all(writes).await;
            }
            return;
        }
        Attack::StalledUploads => {
            for connection_number in 0..8 {
                let connection = connect().await;
                let dir = Directory::open(&connection.executor(), &target.work);
                for n in 0..64 {
                    let mut request = dir.client().upload_request();
                    request
                        .get()
                        .set_path(format!("up-{connection_number}-{n}").as_bytes());
                    request.get().init_options();
                    let Ok(response) = request.send().promise.await else {
                        break;
                    };
                    let Ok(sink) = response.get().and_then(|results| results.get_sink()) else {
                        break;
                    };
                    let mut write = sink.write_request();
                    write.get().set_data(&[7u8; 256 * 1024]);
                    let _ = write.send().await;
                    held.push(Box::new(sink));
                }
                held.push(Box::new((dir, connection)));
            }
        }
        Attack::StalledDownloads => {
            for _ in 0..9 {
                let connection = connect().await;
                let dir = Directory::open(&connection.executor(), &target.work);
                let client: directory::Client = dir.client().clone();
                for _ in 0..64 {
                    let mut request = client.download_request();
                    request.get().set_path(b"big");
                    request
                        .get()
                        .set_sink(capnp_rpc::new_client::<byte_sink::Client, _>(Stalled));
                    held.push(Box::new(tokio::task::spawn_local(request.send().promise)));
                }
                // Every download has started once a later call is answered.
                let _ = dir.info().await;
                held.push(Box::new((dir, connection)));
            }
        }
        Attack::Watches => {
            for connection_number in 0..4 {
                let connection = connect().await;
                let dir = Directory::open(&connection.executor(), &target.work);
                for n in 0..32 {
                    let path = format!("watched-{}", connection_number * 32 + n);
                    if let Ok(watch) = dir.watch(path, true).await {
                        held.push(Box::new(watch));
                    }
                }
                held.push(Box::new((dir, connection)));
            }
        }
    }
    let _ = under_way.send(());
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(held);
}
