//! The mounts this process sees (`/proc/self/mountinfo`): where the cgroup
//! hierarchies are, and which directories are the kernel's own interfaces.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

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

/// Where the kernel's interface file systems are mounted.
pub(crate) fn kernel_mount_points() -> Vec<PathBuf> {
    mounts()
        .into_iter()
        .filter(|mount| KERNEL_FILE_SYSTEMS.contains(&mount.fstype.as_str()))
        .map(|mount| mount.point)
        .collect()
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
