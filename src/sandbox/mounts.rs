//! The mounts this process sees (`/proc/self/mountinfo`): where the cgroup
//! hierarchies are, and which directories are the kernel's own interfaces.

use std::ffi::OsString;
use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// One line of `/proc/self/mountinfo`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mount {
    /// The directory of the mounted file system that is mounted here.
    pub root: PathBuf,
    pub point: PathBuf,
    pub fstype: String,
    /// Options of the file system itself (a cgroup v1 mount's controllers).
    pub super_options: String,
}

/// File systems whose files are the kernel's own knobs: a writable root
/// containing one could change the kernel (a root child without
/// capabilities still owns /proc/sys and /sys files) or leave its cgroup.
const KERNEL_FILE_SYSTEMS: &[&str] = &[
    "proc",
    "sysfs",
    "cgroup",
    "cgroup2",
    "devtmpfs",
    "securityfs",
    "debugfs",
    "tracefs",
    "configfs",
    "bpf",
    "pstore",
    "efivarfs",
    "fusectl",
    "binfmt_misc",
];

pub(crate) fn mounts() -> Vec<Mount> {
    std::fs::read("/proc/self/mountinfo")
        .map(|text| parse(&text))
        .unwrap_or_default()
}

pub(crate) fn parse(text: &[u8]) -> Vec<Mount> {
    text.split(|&b| b == b'\n')
        .filter_map(|line| {
            let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
            let separator = fields.iter().position(|field| *field == b"-")?;
            Some(Mount {
                root: unescape(fields.get(3)?),
                point: unescape(fields.get(4)?),
                fstype: String::from_utf8_lossy(fields.get(separator + 1)?).into_owned(),
                super_options: String::from_utf8_lossy(fields.get(separator + 3)?).into_owned(),
            })
        })
        .collect()
}

/// Where the kernel's interface file systems are mounted, and every other
/// mount point (a tmpfs on /dev/shm is not devtmpfs, though below /dev).
#[derive(Debug, Default)]
pub(crate) struct KernelMounts {
    pub points: Vec<PathBuf>,
    pub others: Vec<PathBuf>,
}

impl KernelMounts {
    /// The kernel file system that `path` (canonical) would expose as a
    /// root: one mounted at or below it, or the one it lies on (the
    /// nearest mount above it).
    pub(crate) fn exposed_by(&self, path: &Path) -> Option<&Path> {
        if let Some(below) = self.points.iter().find(|point| point.starts_with(path)) {
            return Some(below.as_path());
        }
        let kernel = nearest(&self.points, path)?;
        match nearest(&self.others, path) {
            Some(other) if other.as_os_str().len() > kernel.as_os_str().len() => None,
            _ => Some(kernel),
        }
    }
}

/// The mount point of `points` nearest above `path` (or at it): of its
/// ancestors, the longest.
fn nearest<'a>(points: &'a [PathBuf], path: &Path) -> Option<&'a Path> {
    points
        .iter()
        .filter(|point| path.starts_with(point))
        .max_by_key(|point| point.as_os_str().len())
        .map(PathBuf::as_path)
}

/// The mount points, kernel interfaces apart. Read once and
/// again only after the mount table changed: the kernel wakes pollers of
/// an open mountinfo (POLLPRI) on every change in the mount namespace, so
/// a start asks with one poll(2) instead of reading and parsing it.
pub(crate) fn kernel_mount_points() -> Arc<KernelMounts> {
    static KNOWN: Mutex<Option<(File, Arc<KernelMounts>)>> = Mutex::new(None);
    let mut known = KNOWN.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((watch, points)) = known.as_ref()
        && !changed(watch)
    {
        return Arc::clone(points);
    }
    // Opened first: a change after the open, even one the read below
    // already sees, wakes the next poll.
    let mut text = Vec::new();
    let watch = File::open("/proc/self/mountinfo").and_then(|mut file| {
        file.read_to_end(&mut text)?;
        Ok(file)
    });
    let mut mounts = KernelMounts::default();
    for mount in parse(&text) {
        if KERNEL_FILE_SYSTEMS.contains(&mount.fstype.as_str()) {
            mounts.points.push(mount.point);
        } else {
            mounts.others.push(mount.point);
        }
    }
    let points = Arc::new(mounts);
    *known = watch.ok().map(|watch| (watch, Arc::clone(&points)));
    points
}

/// Whether the mount table changed since `watch` (an open mountinfo) was
/// opened or last polled; true when it cannot be told.
fn changed(watch: &File) -> bool {
    let mut pollfd = libc::pollfd {
        fd: watch.as_raw_fd(),
        events: libc::POLLPRI,
        revents: 0,
    };
    // SAFETY: poll on one descriptor we own, without waiting.
    let ready = unsafe { libc::poll(&mut pollfd, 1, 0) };
    ready != 0 || pollfd.revents & (libc::POLLPRI | libc::POLLERR) != 0
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape(field: &[u8]) -> PathBuf {
    let mut bytes = Vec::with_capacity(field.len());
    let mut index = 0;
    while index < field.len() {
        if field[index] == b'\\'
            && index + 4 <= field.len()
            && field[index + 1..index + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let value = field[index + 1..index + 4]
                .iter()
                .fold(0u32, |value, digit| value * 8 + u32::from(digit - b'0'));
            bytes.push(value as u8);
            index += 4;
        } else {
            bytes.push(field[index]);
            index += 1;
        }
    }
    PathBuf::from(OsString::from_vec(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unmounts the proc mount made by the test, whatever happens.
    struct Mounted(std::ffi::CString);

    impl Drop for Mounted {
        fn drop(&mut self) {
            // SAFETY: unmounts what the test mounted, by its path.
            unsafe { libc::umount2(self.0.as_ptr(), libc::MNT_DETACH) };
        }
    }

    #[test]
    fn kernel_mount_points_are_read_again_after_the_mount_table_changes() {
        let before = kernel_mount_points();
        assert!(
            before
                .points
                .iter()
                .any(|point| point.as_os_str() == "/proc"),
            "{before:?}"
        );
        assert!(Arc::ptr_eq(&before, &kernel_mount_points()), "kept");
        // A proc mount on a directory of the test's (root, as CI runs).
        let dir = tempfile::tempdir().expect("tempdir");
        let point = std::fs::canonicalize(dir.path()).expect("canonical");
        let c_point = std::ffi::CString::new(point.as_os_str().as_encoded_bytes()).expect("no NUL");
        // SAFETY: a proc mount on a directory of our own.
        let mounted = unsafe {
            libc::mount(
                c"proc".as_ptr(),
                c_point.as_ptr(),
                c"proc".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        assert_eq!(mounted, 0, "mount: {}", std::io::Error::last_os_error());
        let guard = Mounted(c_point);
        assert!(
            kernel_mount_points().points.contains(&point),
            "seen once mounted"
        );
        drop(guard);
        assert!(
            !kernel_mount_points().points.contains(&point),
            "gone once unmounted"
        );
    }

    #[test]
    fn mountinfo_lines_are_read_with_their_escapes() {
        let text =
            b"29 23 0:26 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw\n\
                     35 23 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
                     40 1 8:1 /x /mnt/a\\040b rw - ext4 /dev/sda1 rw\n";
        let mounts = parse(text);
        assert_eq!(mounts.len(), 3);
        assert_eq!(mounts[0].fstype, "cgroup2");
        assert_eq!(mounts[0].point, PathBuf::from("/sys/fs/cgroup/unified"));
        assert_eq!(mounts[1].super_options, "rw,memory");
        assert_eq!(mounts[2].point, PathBuf::from("/mnt/a b"));
        assert_eq!(mounts[2].root, PathBuf::from("/x"));
    }
}
