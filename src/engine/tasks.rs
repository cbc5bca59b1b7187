//! What the system's task limits let a server run.
//!
//! Every process is at least two tasks of the server's: the child, and
//! the thread that does its pipe I/O (`io_thread.rs`). Tasks are limited
//! by the cgroup the server runs in and each of its ancestors (`pids.max`,
//! systemd's `TasksMax=`, often a few thousand), and for a user other than
//! root by `RLIMIT_NPROC`. A server that allowed more processes than those
//! carry would have starts fail with EAGAIN from clone(2) or
//! pthread_create(3) for every client alike; so, as with descriptors
//! (`descriptors.rs`), what they carry is worked out at start, keeping
//! room for the server's own threads, and `--max-processes` is fitted to
//! it. The figure is a ceiling, not a promise: other processes of the
//! same cgroup or user use the same limits, and what a command starts
//! itself counts too; a start the system refuses anyway is refused as a
//! limit (`[capexec:limit]`).

use std::path::{Path, PathBuf};

/// Tasks of the server's per process: the child and its I/O thread.
pub const TASKS_PER_PROCESS: u64 = 2;

/// Kept for the server's own threads at rest (the runtime, the reaper,
/// upstream links, a few of tokio's blocking pool, a closing thread or
/// two). More closing threads (`sys::MAX_CLOSING_THREADS`) run only for
/// closes that sleep, each on a lock a task of its holder's keeps. File calls may take
/// up to `files::work::MAX_FILE_WORK` more pool threads for a while,
/// from the same limit; a server kept to a small limit (a container's
/// `--pids-limit`) should not be kept from starting for them.
pub const SERVER_OWN_TASKS: u64 = 64;

/// The tightest task limit on the server, and what it carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskBudget {
    /// The limit, and what sets it (for the note at start).
    pub limit: u64,
    pub set_by: String,
    /// Tasks counted against it when the budget was worked out.
    pub used: u64,
    /// Processes the rest carries.
    pub processes: u64,
}

impl TaskBudget {
    /// The budget of `limit` tasks, `used` already, set by `set_by`.
    pub fn new(limit: u64, used: u64, set_by: String) -> TaskBudget {
        TaskBudget {
            limit,
            used,
            processes: limit.saturating_sub(used + SERVER_OWN_TASKS) / TASKS_PER_PROCESS,
            set_by,
        }
    }

    /// The tightest of this process's limits now: its cgroups' `pids.max`
    /// (version 2, or the version 1 `pids` hierarchy), and `RLIMIT_NPROC`
    /// unless the kernel lets this process past it (root, or
    /// CAP_SYS_RESOURCE or CAP_SYS_ADMIN). `None` when nothing limits it.
    /// `processes` handed over are running already: their tasks are
    /// counted as theirs, not as in use.
    pub fn of_this_process(processes: u64) -> Option<TaskBudget> {
        let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let mut budgets: Vec<TaskBudget> = pids_cgroup_dirs(&cgroups, Path::new("/sys/fs/cgroup"))
            .into_iter()
            .filter_map(|dir| cgroup_budget(&dir, processes))
            .collect();
        budgets.extend(nproc_budget(processes));
        budgets.into_iter().min_by_key(|budget| budget.processes)
    }
}

/// The directories of the cgroups whose `pids.max` limit this process:
/// its own and every ancestor, in the hierarchy with the pids controller
/// (`/proc/self/cgroup` as `cgroups`, mounts under `root`).
fn pids_cgroup_dirs(cgroups: &str, root: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for line in cgroups.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let mount = if controllers.split(',').any(|c| c == "pids") {
            root.join("pids")
        } else if controllers.is_empty() {
            // Version 2: the unified mount, at the root, or beside the
            // version 1 hierarchies of a hybrid system.
            let unified = root.join("unified");
            if unified.join("cgroup.controllers").exists() {
                unified
            } else {
                root.to_path_buf()
            }
        } else {
            continue;
        };
        let mut dir = mount.join(path.trim_start_matches('/'));
        loop {
            dirs.push(dir.clone());
            if dir == mount || !dir.pop() {
                break;
            }
        }
    }
    dirs
}

/// What `pids.max` in `dir` leaves, if it limits anything, besides
/// `processes` of the server's.
fn cgroup_budget(dir: &Path, processes: u64) -> Option<TaskBudget> {
    let max = std::fs::read_to_string(dir.join("pids.max")).ok()?;
    let limit: u64 = max.trim().parse().ok()?;
    let used = std::fs::read_to_string(dir.join("pids.current"))
        .ok()
        .and_then(|current| current.trim().parse::<u64>().ok())
        .unwrap_or(0)
        .saturating_sub(processes);
    Some(TaskBudget::new(
        limit,
        used,
        format!("pids.max of {}", dir.display()),
    ))
}

/// What `RLIMIT_NPROC` leaves, when the kernel holds this process to it,
/// besides `processes` of the server's.
fn nproc_budget(processes: u64) -> Option<TaskBudget> {
    // SAFETY: getuid(2) has no preconditions.
    if unsafe { libc::getuid() } == 0 || exempt_from_nproc() {
        return None;
    }
    let (soft, _) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NPROC).ok()?;
    if soft == libc::RLIM_INFINITY {
        return None;
    }
    Some(TaskBudget::new(
        soft,
        tasks_of_this_user().saturating_sub(processes),
        "RLIMIT_NPROC (ulimit -u)".to_string(),
    ))
}

/// Whether this process has CAP_SYS_RESOURCE or CAP_SYS_ADMIN, which let
/// it past `RLIMIT_NPROC`.
fn exempt_from_nproc() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let effective = status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0);
    let bit = |cap: u32| effective & (1 << cap) != 0;
    bit(24) || bit(21) // CAP_SYS_RESOURCE, CAP_SYS_ADMIN
}

/// Tasks of this process's real user now, which `RLIMIT_NPROC` counts
/// (by real uid: the owner of `/proc/PID` is the effective one).
fn tasks_of_this_user() -> u64 {
    // SAFETY: getuid(2) has no preconditions.
    let uid = unsafe { libc::getuid() };
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return 0;
    };
    processes
        .flatten()
        .filter(|entry| {
            entry
                .file_name()
                .to_str()
                .is_some_and(|name| name.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter(|entry| {
            std::fs::read_to_string(entry.path().join("status"))
                .is_ok_and(|status| real_uid(&status) == Some(uid))
        })
        .filter_map(|entry| std::fs::read_dir(entry.path().join("task")).ok())
        .map(|tasks| tasks.count() as u64)
        .sum()
}

/// The real uid on the `Uid:` line of a `/proc/PID/status`.
fn real_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_keeps_room_for_the_servers_threads_and_halves_the_rest() {
        let budget = TaskBudget::new(4915, 20, "pids.max of /x".into());
        assert_eq!(budget.processes, (4915 - 20 - SERVER_OWN_TASKS) / 2);
        assert_eq!(TaskBudget::new(70, 10, String::new()).processes, 0);
    }

    #[test]
    fn the_pids_cgroups_are_the_own_and_every_ancestor() {
        let root = Path::new("/nonexistent/cgroup");
        let hybrid = "12:pids:/system.slice/capexec.service\n4:memory:/x\n0::/system.slice/capexec.service\n";
        assert_eq!(
            pids_cgroup_dirs(hybrid, root),
            [
                "/nonexistent/cgroup/pids/system.slice/capexec.service",
                "/nonexistent/cgroup/pids/system.slice",
                "/nonexistent/cgroup/pids",
                "/nonexistent/cgroup/system.slice/capexec.service",
                "/nonexistent/cgroup/system.slice",
                "/nonexistent/cgroup",
            ]
            .map(PathBuf::from)
        );
        assert_eq!(
            pids_cgroup_dirs("0::/\n", root),
            [PathBuf::from("/nonexistent/cgroup")]
        );
        assert!(pids_cgroup_dirs("garbage\n3:cpu:/a\n", root).is_empty());
    }

    #[test]
    fn a_user_s_tasks_are_counted_by_real_uid() {
        let status = "Name:\tx\nUid:\t1000\t0\t0\t0\nGid:\t1000\t1000\t1000\t1000\n";
        assert_eq!(real_uid(status), Some(1000));
        assert_eq!(real_uid("Name:\tx\n"), None);
        assert!(tasks_of_this_user() >= 1);
    }

    #[test]
    fn a_cgroup_without_a_limit_limits_nothing() {
        let dir = std::env::temp_dir().join(format!("capexec-tasks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("pids.max"), "max\n").expect("write");
        assert_eq!(cgroup_budget(&dir, 0), None);
        std::fs::write(dir.join("pids.max"), "1000\n").expect("write");
        std::fs::write(dir.join("pids.current"), "44\n").expect("write");
        let budget = cgroup_budget(&dir, 0).expect("a limit");
        assert_eq!((budget.limit, budget.used), (1000, 44));
        assert_eq!(budget.processes, (1000 - 44 - SERVER_OWN_TASKS) / 2);
        // After a hand-over, its processes' tasks are not the server's.
        assert_eq!(cgroup_budget(&dir, 40).expect("a limit").used, 4);
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
