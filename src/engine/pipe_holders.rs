//! The processes that hold a pipe open, found through `/proc`, for the
//! hand-over's last resort: a process's I/O thread that is asleep on a
//! pipe's lock at the freeze (it began after the upgrade's check) keeps
//! the exec waiting for as long as the lock is held; when ending the
//! process's tree does not free it, whatever else holds the pipe is
//! ended. Something the process gave its pipe to holds the lock, and a
//! server gone for every client is the alternative.

use std::os::fd::RawFd;

/// The inode of the pipe open at `fd`, or `None` if it is no pipe.
/// fstat(2) takes no pipe lock.
pub(crate) fn pipe_inode(fd: RawFd) -> Option<u64> {
    // SAFETY: a zeroed `stat` is a valid value of it.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes one `stat` into it.
    let failed = unsafe { libc::fstat(fd, &mut stat) } != 0;
    if failed || stat.st_mode & libc::S_IFMT != libc::S_IFIFO {
        return None;
    }
    Some(stat.st_ino)
}

/// Sends SIGKILL to every process but this one that has one of `pipes`
/// (inodes) open; returns their pids.
pub(crate) fn kill_holders(pipes: &[u64]) -> Vec<i32> {
    if pipes.is_empty() {
        return Vec::new();
    }
    let names: Vec<String> = pipes
        .iter()
        .map(|inode| format!("pipe:[{inode}]"))
        .collect();
    let own = std::process::id() as i32;
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let holders: Vec<i32> = processes
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != own)
        .filter(|&pid| {
            std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
                fds.flatten().any(|fd| {
                    std::fs::read_link(fd.path()).is_ok_and(|target| {
                        names.iter().any(|name| target.as_os_str() == name.as_str())
                    })
                })
            })
        })
        .collect();
    for &pid in &holders {
        // SAFETY: kill(2) of a process that holds one of our children's
        // pipes.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    holders
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn every_other_holder_of_a_pipe_is_killed_and_no_one_else() {
        let (reader, writer) = std::io::pipe().expect("pipe");
        let inode = pipe_inode(reader.as_raw_fd()).expect("a pipe");
        assert_eq!(pipe_inode(writer.as_raw_fd()), Some(inode));
        let mut holder = std::process::Command::new("sleep")
            .arg("600")
            .stdout(writer)
            .spawn()
            .expect("sleep");
        let mut bystander = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .expect("sleep");
        let file = std::fs::File::open("/proc/self/stat").expect("a file");
        assert_eq!(pipe_inode(file.as_raw_fd()), None);

        assert_eq!(kill_holders(&[inode]), [holder.id() as i32]);
        let status = holder.wait().expect("wait");
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        // This process holds the read end, and is still here; the other
        // sleep holds nothing of it.
        assert!(bystander.try_wait().expect("try_wait").is_none());
        bystander.kill().expect("kill");
        bystander.wait().expect("wait");
        drop(reader);
    }
}
