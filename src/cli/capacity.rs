//! How many processes and connections `capexec serve` holds, checked
//! against what its descriptor limit carries (see
//! `engine::descriptors`): the defaults are lowered to fit, with a note at
//! start (the usual case on a machine with a modest descriptor limit, not
//! something to warn about); an explicit value lowered is warned about, and
//! an explicit `--max-processes` that cannot be carried is refused. The
//! system's task limits (`engine::tasks`) lower it too, with a warning
//! for an explicit value rather than a refusal: those limits are shared
//! with other processes and change while the server runs.
//!
//! The rule that keeps clients from starving each other: processes never
//! use the descriptors kept for connections, so accepting connections and
//! the moment's extra descriptors of a start keep working at any process
//! count; one connection's quota is at most seven eighths of the server's
//! processes, so a connection at its quota leaves the rest for the others'
//! starts; connections are at most the descriptors kept for them, and
//! those that have not logged in at most half of those.

use capexec::engine::descriptors::{DESCRIPTORS_PER_PROCESS, DescriptorBudget};
use capexec::engine::tasks::TaskBudget;
use capexec::net::PendingLimits;

pub const DEFAULT_MAX_PROCESSES: usize = 10_000;
pub const DEFAULT_MAX_PROCESSES_PER_CONNECTION: usize = 4096;

/// What was asked for on the command line (`None`: the default).
#[derive(Clone, Copy, Debug, Default)]
pub struct Asked {
    pub max_connections: Option<usize>,
    pub max_processes: Option<usize>,
    pub per_connection: Option<usize>,
    pub pending: Option<usize>,
    pub pending_per_address: Option<usize>,
    /// The server takes processes over from the binary before it: a
    /// value that cannot be carried is lowered, not refused (a refusal
    /// would end them all).
    pub handed_over: bool,
}

/// What the server will hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capacity {
    pub max_connections: usize,
    pub max_processes: usize,
    pub per_connection: usize,
    pub pending: PendingLimits,
    /// What they were fitted into.
    pub budget: DescriptorBudget,
    /// The tightest task limit, if any.
    pub tasks: Option<TaskBudget>,
    /// What was lowered to fit, to say at start.
    pub lowered: [Option<Lowered>; 4],
}

/// A value that was lowered: which, from what, to what, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lowered {
    pub flag: &'static str,
    pub from: usize,
    pub to: usize,
    pub why: &'static str,
    /// The operator gave the value (a warning), or it was the default (a
    /// note).
    pub asked: bool,
}

impl std::fmt::Display for Lowered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is {} instead of {}: {}",
            self.flag, self.to, self.from, self.why
        )
    }
}

/// Fits `asked` into `budget` and `tasks`, or says why it cannot be.
pub fn fit(
    asked: Asked,
    budget: DescriptorBudget,
    tasks: Option<TaskBudget>,
) -> Result<Capacity, String> {
    let carried = usize::try_from(budget.processes).unwrap_or(usize::MAX);
    if carried == 0 {
        return Err(format!(
            "the descriptor limit ({}) leaves no room for processes once {} are kept for \
             connections: raise it (ulimit -n)",
            budget.limit, budget.connections
        ));
    }
    let mut lowered = [None; 4];
    let max_processes = match asked.max_processes {
        Some(wanted) if wanted > carried && asked.handed_over => {
            lowered[0] = Some(Lowered {
                flag: "--max-processes",
                from: wanted,
                to: carried,
                why: "all the descriptor limit carries, lowered rather than refused after an \
                      upgrade (raise it with ulimit -n for more)",
                asked: true,
            });
            carried
        }
        Some(asked) if asked > carried => {
            let reserved = budget.limit - budget.processes * DESCRIPTORS_PER_PROCESS;
            return Err(format!(
                "--max-processes {asked} needs about {} descriptors, but the descriptor limit is \
                 {}: it carries at most {carried} processes (raise it with ulimit -n, or give \
                 --max-processes {carried} or less)",
                asked as u64 * DESCRIPTORS_PER_PROCESS + reserved,
                budget.limit
            ));
        }
        Some(asked) => asked,
        None if DEFAULT_MAX_PROCESSES > carried => {
            lowered[0] = Some(Lowered {
                flag: "--max-processes",
                from: DEFAULT_MAX_PROCESSES,
                to: carried,
                why: "all the descriptor limit carries (raise it with ulimit -n for more)",
                asked: false,
            });
            carried
        }
        None => DEFAULT_MAX_PROCESSES,
    };
    let by_tasks = tasks.as_ref().map_or(usize::MAX, |tasks| {
        usize::try_from(tasks.processes)
            .unwrap_or(usize::MAX)
            .max(1)
    });
    let max_processes = if max_processes > by_tasks {
        let asked_for = asked.max_processes.is_some();
        lowered[0] = Some(Lowered {
            flag: "--max-processes",
            from: if asked_for {
                max_processes
            } else {
                DEFAULT_MAX_PROCESSES
            },
            to: by_tasks,
            why: "all the task limit carries, two tasks a process (the command and the \
                  thread for its pipes; raise the limit for more)",
            asked: asked_for,
        });
        by_tasks
    } else {
        max_processes
    };
    let fair_share = (max_processes - max_processes / 8).max(1);
    let wanted = asked
        .per_connection
        .unwrap_or(DEFAULT_MAX_PROCESSES_PER_CONNECTION);
    let per_connection = if wanted > fair_share {
        // The default follows the rule without a word (the limits are
        // logged at start); a value asked for is said to be lowered.
        if asked.per_connection.is_some() {
            lowered[1] = Some(Lowered {
                flag: "--max-processes-per-connection",
                from: wanted,
                to: fair_share,
                why: "at most seven eighths of --max-processes, so that one connection at \
                      its quota leaves room for the others",
                asked: true,
            });
        }
        fair_share
    } else {
        wanted
    };
    let kept = usize::try_from(budget.connections).unwrap_or(usize::MAX);
    let max_connections = match asked.max_connections {
        Some(wanted) if wanted > kept && asked.handed_over => {
            lowered[3] = Some(Lowered {
                flag: "--max-connections",
                from: wanted,
                to: kept,
                why: "the descriptors the limit keeps for connections, lowered rather than \
                      refused after an upgrade (raise it with ulimit -n for more)",
                asked: true,
            });
            kept
        }
        Some(wanted) if wanted > kept => {
            return Err(format!(
                "--max-connections {wanted} needs a descriptor each, but the descriptor limit \
                 ({}) keeps {kept} for connections (raise it with ulimit -n, or give \
                 --max-connections {kept} or less)",
                budget.limit
            ));
        }
        Some(wanted) => wanted,
        None => kept,
    };
    let defaults = PendingLimits::default();
    // Half: peers that never log in cannot take every place from those
    // that do, nor from Unix clients.
    let room = usize::try_from(budget.connections / 2)
        .unwrap_or(usize::MAX)
        .min(max_connections / 2)
        .max(1);
    let wanted = asked.pending.unwrap_or(defaults.total);
    let total = if wanted > room {
        lowered[2] = Some(Lowered {
            flag: "--max-pending-logins",
            from: wanted,
            to: room,
            why: "at most half the descriptors kept for connections, and at most half \
                  of --max-connections",
            asked: asked.pending.is_some(),
        });
        room
    } else {
        wanted
    };
    let per_address = asked
        .pending_per_address
        .unwrap_or(defaults.per_address)
        .min(total);
    Ok(Capacity {
        max_connections,
        max_processes,
        per_connection,
        pending: PendingLimits { total, per_address },
        budget,
        tasks,
        lowered,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_limit_changes_nothing() {
        let capacity =
            fit(Asked::default(), DescriptorBudget::new(1 << 20, 16), None).expect("fits");
        assert_eq!(capacity.max_processes, DEFAULT_MAX_PROCESSES);
        assert_eq!(
            capacity.per_connection,
            DEFAULT_MAX_PROCESSES_PER_CONNECTION
        );
        assert_eq!(capacity.pending, PendingLimits::default());
        assert_eq!(capacity.max_connections, (1 << 20) / 8);
        assert_eq!(capacity.lowered, [None; 4]);
    }

    /// What Unix peers may have the server hold is what the budget keeps
    /// for them where the limit is large.
    #[test]
    fn the_received_reserve_covers_what_peers_may_have_the_server_hold() {
        use capexec::conn::{MAX_KEPT_DESCRIPTORS_IN_SERVER, MAX_WAITING_TO_CLOSE_IN_SERVER};
        use capexec::engine::descriptors::RECEIVED_DESCRIPTORS;
        use capexec::sys::{MAX_CLOSING_THREADS, MAX_OWNERS_IN_LINE, SCM_MAX_FD};
        let held = MAX_KEPT_DESCRIPTORS_IN_SERVER
            + MAX_WAITING_TO_CLOSE_IN_SERVER
            + 2 * SCM_MAX_FD
            + 2 * MAX_CLOSING_THREADS
            + MAX_OWNERS_IN_LINE;
        assert_eq!(RECEIVED_DESCRIPTORS, held as u64);
        assert_eq!(
            capexec::engine::descriptors::PUMP_PIPE_DESCRIPTORS,
            2 * capexec::ports::MAX_PUMP_PIPES as u64
        );
        assert_eq!(
            DescriptorBudget::new(20_000, 16).received,
            RECEIVED_DESCRIPTORS
        );
    }

    #[test]
    fn connections_are_what_the_limit_keeps_for_them() {
        let budget = DescriptorBudget::new(20_000, 16);
        let capacity = fit(Asked::default(), budget, None).expect("fits");
        assert_eq!(capacity.max_connections, 2_500);
        let asked = |max_connections, handed_over| Asked {
            max_connections: Some(max_connections),
            handed_over,
            ..Asked::default()
        };
        let fewer = fit(asked(10, false), budget, None).expect("fits");
        assert_eq!((fewer.max_connections, fewer.pending.total), (10, 5));
        let refused = fit(asked(2_501, false), budget, None).expect_err("cannot be carried");
        assert_eq!(
            refused,
            "--max-connections 2501 needs a descriptor each, but the descriptor limit (20000) \
             keeps 2500 for connections (raise it with ulimit -n, or give --max-connections \
             2500 or less)"
        );
        let upgraded = fit(asked(2_501, true), budget, None).expect("lowered");
        assert_eq!(upgraded.max_connections, 2_500);
        assert!(upgraded.lowered[3].is_some_and(|lowered| lowered.asked));
    }

    #[test]
    fn defaults_are_lowered_to_what_the_limit_carries_and_explicit_values_refused() {
        let budget = DescriptorBudget::new(512, 16);
        let carried = budget.processes as usize;
        let capacity = fit(Asked::default(), budget, None).expect("fits");
        assert_eq!(capacity.max_processes, carried);
        assert_eq!(capacity.per_connection, carried - carried / 8);
        assert!(capacity.lowered[0].is_some_and(|lowered| !lowered.asked));
        // The quota follows the rule without a word when it was not asked.
        assert!(capacity.lowered[1].is_none());
        assert_eq!(capacity.pending.total, 32);
        assert_eq!(capacity.pending.per_address, 32);

        let refused = fit(
            Asked {
                max_processes: Some(carried + 1),
                ..Asked::default()
            },
            budget,
            None,
        )
        .expect_err("cannot be carried");
        assert!(
            refused.contains(&format!("it carries at most {carried} processes")),
            "{refused}"
        );
        let asked = fit(
            Asked {
                max_processes: Some(10),
                per_connection: Some(10),
                ..Asked::default()
            },
            budget,
            None,
        )
        .expect("fits");
        assert_eq!((asked.max_processes, asked.per_connection), (10, 9));
        assert!(asked.lowered[1].is_some_and(|lowered| lowered.asked));
    }

    #[test]
    fn a_task_limit_lowers_defaults_with_a_note_and_explicit_values_with_a_warning() {
        let budget = DescriptorBudget::new(1 << 20, 16);
        let tasks = TaskBudget::new(4915, 15, "pids.max of /sys/fs/cgroup/x".into());
        let carried = tasks.processes as usize;
        let capacity = fit(Asked::default(), budget, Some(tasks.clone())).expect("fits");
        assert_eq!(capacity.max_processes, carried);
        assert_eq!(capacity.per_connection, carried - carried / 8);
        let lowered = capacity.lowered[0].expect("lowered");
        assert_eq!(
            (lowered.from, lowered.to, lowered.asked),
            (DEFAULT_MAX_PROCESSES, carried, false)
        );
        let asked = fit(
            Asked {
                max_processes: Some(carried + 10),
                ..Asked::default()
            },
            budget,
            Some(tasks.clone()),
        )
        .expect("lowered, not refused");
        assert_eq!(asked.max_processes, carried);
        assert!(
            asked.lowered[0]
                .as_ref()
                .is_some_and(|lowered| lowered.asked)
        );
        // Under the limit, a value asked for stands.
        let under = fit(
            Asked {
                max_processes: Some(100),
                ..Asked::default()
            },
            budget,
            Some(tasks.clone()),
        )
        .expect("fits");
        assert_eq!((under.max_processes, under.lowered[0]), (100, None));
        // A limit that carries nothing still lets one process run.
        let tiny = fit(
            Asked::default(),
            budget,
            Some(TaskBudget::new(50, 10, String::new())),
        )
        .expect("fits");
        assert_eq!(tiny.max_processes, 1);
    }

    #[test]
    fn after_an_upgrade_a_value_that_cannot_be_carried_is_lowered_not_refused() {
        let budget = DescriptorBudget::new(512, 16);
        let carried = budget.processes as usize;
        let capacity = fit(
            Asked {
                max_processes: Some(carried + 3),
                handed_over: true,
                ..Asked::default()
            },
            budget,
            None,
        )
        .expect("lowered, not refused");
        assert_eq!(capacity.max_processes, carried);
        assert!(capacity.lowered[0].is_some_and(|lowered| lowered.asked));
    }
}
