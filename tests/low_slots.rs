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

/// One test, in two steps that must run in this order: the first needs a
/// process that keeps no slots yet.
#[test]
fn kept_slots() {
    a_process_handed_over_below_64_is_moved_above_and_handed_over_again();
    kept_slots_stay_taken_and_a_close_below_64_leaves_a_placeholder();
}

/// `body` on a runtime of its own, as each binary of an upgrade has: what
/// the one before registered with its runtime is gone with it.
fn on_its_own_runtime<T>(body: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(tokio::task::LocalSet::new().run_until(body))
}

/// As an upgrade from a binary without the placeholders: the process's
/// pidfd and pipes come below 64, the new binary moves them above as it
/// takes them over, and hands them over again under their new numbers
/// (the stdin pipe's number was once left behind: the next binary found
/// a placeholder there, and killed the process it could not take over).
fn a_process_handed_over_below_64_is_moved_above_and_handed_over_again() {
    use capexec::engine::Engine;
    use capexec::model::{EventBody, StartSpec, WriteStatus};
    // The binary before: nothing kept, so the process's descriptors come
    // below 64 (this test process has few open). What an exec does to it
    // is forgetting it: nothing of it runs on, nothing is closed.
    let handed = on_its_own_runtime(async {
        let before = Engine::default();
        let mut spec = StartSpec::new(vec!["cat".to_string()]);
        spec.pipe_stdin = true;
        let owner = before.start(&spec).expect("start cat");
        before.freeze().await;
        let handed = before.write_down();
        std::mem::forget((owner, before));
        handed
    });
    assert!(
        handed.descriptors.iter().any(|&fd| fd < 64),
        "{:?}",
        handed.descriptors
    );
    capexec::sys::low_slots::reserve().expect("keep the first 64 slots");
    let again = on_its_own_runtime(async {
        let after = Engine::default();
        let taken = after.take_over(handed.processes, handed.blob.into());
        assert_eq!(taken.len(), 1, "the process was taken over");
        after.freeze().await;
        let again = after.write_down();
        std::mem::forget((taken, after));
        again
    });
    assert!(
        again.descriptors.iter().all(|&fd| fd >= 64),
        "{:?}",
        again.descriptors
    );
    on_its_own_runtime(async {
        let last = Engine::default();
        let mut taken = last.take_over(again.processes, again.blob.into());
        assert_eq!(taken.len(), 1, "the process was taken over again");
        let (_, owner) = taken.remove(0);
        let written = owner
            .submit_write(bytes::Bytes::from_static(b"still here\n"), "w1")
            .expect("write")
            .outcome()
            .await;
        assert!(matches!(written, WriteStatus::Accepted), "{written:?}");
        let mut out = Vec::new();
        let mut seq = 0;
        while !out.ends_with(b"still here\n") {
            let read = owner
                .read(seq, 1 << 20, std::time::Duration::from_secs(60))
                .await
                .expect("read");
            assert!(!read.events.is_empty(), "no output within 60 s: {out:?}");
            for event in read.events {
                seq = event.seq;
                if let EventBody::Output { data, .. } = event.body {
                    out.extend_from_slice(&data);
                }
            }
        }
        assert_eq!(out, b"still here\n");
        assert!(owner.terminate());
    });
}

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
