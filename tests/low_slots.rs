//! The first 64 descriptor slots kept for the server's own
//! (`capexec::sys::low_slots`), in a binary of its own: keeping them
//! changes the whole process's descriptor table.

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

mod common;

/// Whether descriptor `fd` of this process is `/dev/null`.
fn is_dev_null(fd: i32) -> bool {
    let null = std::fs::metadata("/dev/null").expect("/dev/null");
    std::fs::metadata(format!("/proc/self/fd/{fd}"))
        .is_ok_and(|meta| meta.dev() == null.dev() && meta.ino() == null.ino())
}

#[test]
fn kept_slots_stay_taken_and_a_close_below_64_leaves_a_placeholder() {
    use capexec::sys::low_slots;
    low_slots::reserve().expect("keep the first 64 slots");
    let open_below_64 = || {
        // SAFETY: F_GETFD reads a descriptor's flags and nothing else.
        (0..64)
            .filter(|&fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0)
            .count()
    };
    assert_eq!(open_below_64(), 64);
    // What is opened from now on lands above them.
    let (read, write) = std::io::pipe().expect("pipe");
    assert!(read.as_raw_fd() >= 64 && write.as_raw_fd() >= 64);

    // A client's descriptor below 64, as a binary before the placeholders
    // could hand one over in an upgrade: the read end, alone, at 40.
    let low = 40;
    assert!(is_dev_null(low));
    // SAFETY: dup3 onto a placeholder of ours, which it closes.
    let moved = unsafe { libc::dup3(read.as_raw_fd(), low, libc::O_CLOEXEC) };
    assert_eq!(moved, low);
    drop(read);
    // SAFETY: just put there, owned by nothing else.
    let low = unsafe { OwnedFd::from_raw_fd(low) };
    capexec::sys::close_in_background(vec![low]);
    let mut write = std::fs::File::from(OwnedFd::from(write));
    common::eventually("the read end is closed", || {
        write
            .write(b"x")
            .is_err_and(|error| error.kind() == std::io::ErrorKind::BrokenPipe)
    });
    // Its slot holds a placeholder again: never free for a moment.
    assert!(is_dev_null(40));
    assert_eq!(open_below_64(), 64);
    assert_eq!(low_slots::reserve().expect("again"), 0);

    // A plain drop below 64 frees its slot; refill takes it back.
    assert!(is_dev_null(41));
    // SAFETY: a placeholder of ours, owned by nothing else from here.
    drop(unsafe { OwnedFd::from_raw_fd(41) });
    assert_eq!(open_below_64(), 63);
    assert_eq!(low_slots::refill().expect("refill"), 1);
    assert!(is_dev_null(41));

    // A socket passed in below 64, closed once copied, leaves a
    // placeholder too.
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("pair");
    let passed = 42;
    assert!(is_dev_null(passed));
    // SAFETY: dup3 onto a placeholder of ours, which it closes.
    let moved = unsafe { libc::dup3(theirs.as_raw_fd(), passed, libc::O_CLOEXEC) };
    assert_eq!(moved, passed);
    drop(theirs);
    // SAFETY: just put there, owned by nothing else.
    let kept = low_slots::KeepsItsSlot::new(unsafe { OwnedFd::from_raw_fd(passed) });
    drop(kept);
    ours.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .expect("timeout");
    let mut peer = std::io::Read::bytes(&ours);
    assert!(peer.next().is_none(), "the passed socket is closed");
    assert!(is_dev_null(passed));

    // What the binary before handed over below 64 (a process's pipe)
    // moves above, still the same pipe, a placeholder in its slot.
    let (read, write) = std::io::pipe().expect("pipe");
    let handed = 43;
    assert!(is_dev_null(handed));
    // SAFETY: dup3 onto a placeholder of ours, which it closes.
    let moved = unsafe { libc::dup3(read.as_raw_fd(), handed, libc::O_CLOEXEC) };
    assert_eq!(moved, handed);
    drop(read);
    // SAFETY: just put there, owned by nothing else.
    let raised = low_slots::raise(unsafe { OwnedFd::from_raw_fd(handed) });
    assert!(raised.as_raw_fd() >= 64);
    assert!(is_dev_null(handed));
    let mut write = std::fs::File::from(OwnedFd::from(write));
    write.write_all(b"still the pipe").expect("write");
    drop(write);
    let mut got = String::new();
    std::io::Read::read_to_string(&mut std::fs::File::from(raised), &mut got).expect("read");
    assert_eq!(got, "still the pipe");
    assert_eq!(open_below_64(), 64);
}
