//! Looking at processes and descriptors through /proc.
//!
//! Whoever includes this module provides `eventually_async` beside it
//! (`common` re-exports it from `wait.rs`; so does the benchmark).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The fields of `/proc/PID/stat` from the third (state) on. The command
/// name before them may hold spaces and parentheses: they start after the
/// last `)`.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    Some(rest.split_whitespace().map(String::from).collect())
}

/// The state letter of `pid` (`Z` for a zombie), or `None` if it is gone.
pub fn state(pid: u32) -> Option<char> {
    stat_fields(pid)?.first()?.chars().next()
}

/// Waits until `pid` no longer exists at all (neither running nor a zombie).
pub async fn wait_gone(pid: u32) {
    super::eventually_async(&format!("process {pid} is gone"), async || {
        match state(pid) {
            Some(state) => Err(format!("state {state}")),
            None => Ok(()),
        }
    })
    .await
}

/// Whether `pid` holds, as one of its descriptors, the accepted end of
/// the TCP connection made from `peer` (a connection still waiting in a
/// listener's backlog has no descriptor yet).
pub fn holds_connection_from(pid: u32, peer: std::net::SocketAddrV4) -> bool {
    // /proc/net/tcp shows an address as its bytes in network order read
    // as a native integer, and the port in hex.
    let wanted = format!(
        "{:08X}:{:04X}",
        u32::from_ne_bytes(peer.ip().octets()),
        peer.port()
    );
    let Ok(table) = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")) else {
        return false;
    };
    let sockets: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // remote address, then the socket's inode (0 while unaccepted)
            (fields.get(2) == Some(&wanted.as_str()))
                .then(|| fields.get(9).map(|inode| format!("socket:[{inode}]")))
                .flatten()
        })
        .collect();
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .any(|target| {
            sockets
                .iter()
                .any(|socket| target.as_os_str() == socket.as_str())
        })
}

pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| dir.count())
        .unwrap_or(0)
}

/// How many threads `pid` has, less the one that clones its children
/// (`capexec-spawn`, started with the engine and kept for good).
pub fn threads_but_the_spawner(pid: u32) -> Option<u64> {
    let threads = status_field(pid, "Threads:")?;
    let spawner = thread_descriptors(pid, "capexec-spawn").is_some();
    Some(threads - u64::from(spawner))
}

/// The children of `pid`'s thread named `thread` (the processes it
/// cloned that are still there); `None` without such a thread.
pub fn thread_children(pid: u32, thread: &str) -> Option<Vec<u32>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let task = tasks.flatten().find(|task| {
        std::fs::read_to_string(task.path().join("comm")).is_ok_and(|comm| comm.trim() == thread)
    })?;
    let children = std::fs::read_to_string(task.path().join("children")).ok()?;
    Some(
        children
            .split_whitespace()
            .filter_map(|child| child.parse().ok())
            .collect(),
    )
}

/// What each descriptor of the table of `pid`'s thread named `thread`
/// names (`/proc/<pid>/task/<tid>/fd`), by number; `None` without such a
/// thread.
pub fn thread_descriptors(pid: u32, thread: &str) -> Option<Vec<(i32, String)>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let task = tasks.flatten().find(|task| {
        std::fs::read_to_string(task.path().join("comm")).is_ok_and(|comm| comm.trim() == thread)
    })?;
    let mut fds: Vec<(i32, String)> = std::fs::read_dir(task.path().join("fd"))
        .ok()?
        .flatten()
        .filter_map(|fd| {
            let number = fd.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(fd.path()).ok()?;
            Some((number, target.to_string_lossy().into_owned()))
        })
        .collect();
    fds.sort();
    Some(fds)
}

/// Whether `parent` has a child running the program named `name` (its
/// `comm`).
pub fn has_child_named(parent: u32, name: &str) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .any(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
                return false;
            };
            let parent_pid = stat[close + 1..].split_whitespace().nth(1);
            &stat[open + 1..close] == name && parent_pid == Some(parent.to_string().as_str())
        })
}

/// Zombie children of `parent`.
pub fn zombie_children(parent: u32) -> usize {
    children(parent).1
}

/// Children of `parent`: (alive, exited and not yet reaped).
pub fn children(parent: u32) -> (usize, usize) {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return (0, 0);
    };
    let (mut alive, mut zombies) = (0, 0);
    for pid in dir
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
    {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        // The cgroup sentinel belongs to the server (it cleans up after
        // it), not to what it started.
        if stat.contains("(cgroup-sentinel)") {
            continue;
        }
        let mut fields = stat[close + 1..].split_whitespace();
        let state = fields.next();
        if fields.next().and_then(|p| p.parse::<u32>().ok()) != Some(parent) {
            continue;
        }
        if state == Some("Z") {
            zombies += 1;
        } else {
            alive += 1;
        }
    }
    (alive, zombies)
}

/// A numeric field of /proc/PID/status (`VmRSS:` in KiB, `Threads:`...).
pub fn status_field(pid: u32, name: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(name))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// CPU time `pid` has used, user and system (`/proc/PID/stat`).
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let fields = stat_fields(pid)?;
    // utime and stime, the 14th and 15th fields.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let per_second = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok()?;
    Some(Duration::from_millis(ticks * 1000 / per_second.max(1)))
}

/// Bytes `pid` has written with write(2) and the like (`wchar`).
pub fn bytes_written(pid: u32) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    io.lines()
        .find_map(|line| line.strip_prefix("wchar:"))?
        .trim()
        .parse()
        .ok()
}

/// Where `pid` sleeps in the kernel (`pipe_write`...), if anywhere.
pub fn wchan(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/wchan")).ok()
}

/// What a server's resources look like at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    pub rss_kib: u64,
    pub fds: u64,
    pub threads: u64,
    pub children: u64,
    pub zombies: u64,
}

pub fn usage(pid: u32) -> Usage {
    let (children, zombies) = children(pid);
    Usage {
        rss_kib: status_field(pid, "VmRSS:").unwrap_or(0),
        fds: open_fds(pid) as u64,
        threads: status_field(pid, "Threads:").unwrap_or(0),
        children: children as u64,
        zombies: zombies as u64,
    }
}

/// Signals queued for `pid` and not yet acted on (process- and
/// thread-directed), from `/proc/PID/status`.
pub fn pending_signals(pid: u32) -> u64 {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return 0;
    };
    status
        .lines()
        .filter(|line| line.starts_with("SigPnd:") || line.starts_with("ShdPnd:"))
        .filter_map(|line| u64::from_str_radix(line.split_whitespace().nth(1)?, 16).ok())
        .fold(0, |all, mask| all | mask)
}

/// The memory a process holds, as the bounds of the exhaustion tests count
/// it: its resident anonymous memory (heap, stacks, anonymous mappings).
/// The binary's code that a new path pages in is file-backed, shared and
/// reclaimable; it is not memory a peer made the server hold, and in a
/// debug build it alone grew by 6 to 8 MiB in the first run of an attack.
pub const HELD: &str = "RssAnon:";

/// The highest [`HELD`] memory a process reaches while this lives, sampled every few
/// milliseconds on a thread of its own (a peak between samples is missed,
/// so bounds checked against it are a floor of the truth, not a ceiling).
pub struct PeakRss {
    peak_kib: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PeakRss {
    pub fn watch(pid: u32) -> PeakRss {
        let peak_kib = Arc::new(AtomicU64::new(status_field(pid, HELD).unwrap_or(0)));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (peak_kib, stop) = (Arc::clone(&peak_kib), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(rss) = status_field(pid, HELD) {
                        peak_kib.fetch_max(rss, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            })
        };
        PeakRss {
            peak_kib,
            stop,
            thread: Some(thread),
        }
    }

    pub fn peak_kib(&self) -> u64 {
        self.peak_kib.load(Ordering::Relaxed)
    }
}

impl Drop for PeakRss {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Waits until the [`HELD`] memory of `pid` is at most `kib` (memory freed
/// by closed connections is handed back a second after they close);
/// returns it.
pub async fn rss_settles_below(pid: u32, kib: u64) -> u64 {
    super::eventually_async(&format!("RSS of {pid} at most {kib} KiB"), async || {
        let rss = status_field(pid, HELD).unwrap_or(0);
        if rss <= kib {
            Ok(rss)
        } else {
            Err(format!("it is {rss} KiB"))
        }
    })
    .await
}

/// Waits until the [`HELD`] memory of `pid` has stopped changing (the same
/// for half a second), and returns it: what an attack that has run its
/// course holds.
pub async fn rss_quiet(pid: u32) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = status_field(pid, HELD).unwrap_or(0);
    let mut same = 0;
    while same < 10 {
        assert!(Instant::now() < deadline, "RSS of {pid} never settled");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let rss = status_field(pid, HELD).unwrap_or(0);
        same = if rss == last { same + 1 } else { 0 };
        last = rss;
    }
    last
}
