//! What a running child uses now, from `/proc/PID/stat`: CPU time and
//! resident memory, for the operator's process list; and the state of one
//! of the server's own threads.

/// User plus system CPU milliseconds and resident bytes of `pid`, or
/// `None` if it cannot be read (gone, or no procfs).
pub fn cpu_and_memory(pid: u32) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse(&stat, clock_ticks()?, page_size()?)
}

/// The scheduling state of this process's thread `tid` (`R`, `S`, `D`,
/// ...), or `None` if it is gone.
pub fn own_thread_state(tid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    state(&stat)
}

fn state(stat: &str) -> Option<char> {
    let (_, after) = stat.rsplit_once(')')?;
    after.split_whitespace().next()?.chars().next()
}

/// Fields after the command name (which may hold spaces and parentheses):
/// state is the first, utime the 12th, stime the 13th, rss the 22nd.
fn parse(stat: &str, ticks_per_second: u64, page_size: u64) -> Option<(u64, u64)> {
    let (_, after) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let number = |index: usize| fields.get(index)?.parse::<u64>().ok();
    let ticks = number(11)? + number(12)?;
    let rss_pages = number(21)?;
    Some((
        ticks * 1000 / ticks_per_second.max(1),
        rss_pages * page_size,
    ))
}

fn clock_ticks() -> Option<u64> {
    // SAFETY: sysconf only reads a system constant.
    u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok()
}

fn page_size() -> Option<u64> {
    // SAFETY: as above.
    u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_are_read_past_odd_command_names() {
        let line = "123 (a) b (c)) S 1 123 123 0 -1 4194304 100 0 0 0 250 50 0 0 20 0 1 0 \
                    1000 10000000 300 18446744073709551615";
        assert_eq!(parse(line, 100, 4096), Some((3000, 300 * 4096)));
        assert_eq!(parse("garbage", 100, 4096), None);
        assert_eq!(state(line), Some('S'));
        assert_eq!(state("garbage"), None);
        let (_, memory) = cpu_and_memory(std::process::id()).expect("own stat");
        assert!(memory > 0);
        // SAFETY: gettid(2) has no preconditions.
        let tid = unsafe { libc::gettid() };
        assert_eq!(own_thread_state(tid), Some('R'));
    }
}
