//! A sandbox's plan as the child applies it to itself between clone and
//! exec: its cgroup namespace, mounts, user, capabilities, no_new_privs,
//! Landlock and seccomp.

use std::os::fd::RawFd;

use super::child::raw;

/// The kernel's capability header and sets (capset(2), version 3).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// A seccomp program as seccomp(2) takes it.
#[repr(C)]
struct SockFprog {
    len: libc::c_ushort,
    filter: *const libc::sock_filter,
}

/// A [`crate::sandbox::Plan`] as the child applies it: raw descriptors
/// and pointers into the plan, which outlives the spawn.
pub(super) struct Confinement {
    /// The leaf's cgroup2 directory.
    pub(super) cgroup: Option<RawFd>,
    /// Whether to clone the child into it (else it writes `cgroup.procs`).
    pub(super) clone_into_cgroup: bool,
    /// The `cgroup.procs` of the leaf's v1 mirrors.
    pub(super) cgroup_procs: Vec<RawFd>,
    /// Make a cgroup namespace once in them.
    pub(super) cgroup_namespace: bool,
    /// Detached trees to move onto their paths (a path, a mount), in a
    /// mount namespace of the child's own.
    mounts: Vec<(*const libc::c_char, RawFd)>,
    /// The working directory to enter again once they are in place.
    mounted_cwd: Option<*const libc::c_char>,
    /// The uid and gid to take instead of root's.
    pub(super) user: Option<u32>,
    drop_capabilities: bool,
    last_capability: libc::c_int,
    bounding_set: u64,
    clear_ambient: bool,
    no_new_privs: bool,
    ruleset: Option<RawFd>,
    seccomp: Option<SockFprog>,
}

impl Confinement {
    pub(super) fn of(plan: &crate::sandbox::Plan) -> Confinement {
        use std::os::fd::AsRawFd;
        Confinement {
            cgroup: plan.cgroup.as_ref().map(AsRawFd::as_raw_fd),
            clone_into_cgroup: plan.clone_into_cgroup,
            cgroup_procs: plan.cgroup_procs.iter().map(AsRawFd::as_raw_fd).collect(),
            cgroup_namespace: plan.cgroup_namespace,
            mounts: plan
                .mounts
                .iter()
                .map(|(path, tree)| (path.as_ptr(), tree.as_raw_fd()))
                .collect(),
            mounted_cwd: plan.mounted_cwd.as_ref().map(|cwd| cwd.as_ptr()),
            user: plan.user,
            drop_capabilities: plan.drop_capabilities,
            last_capability: plan.last_capability,
            bounding_set: plan.bounding_set,
            clear_ambient: plan.clear_ambient,
            no_new_privs: plan.no_new_privs,
            ruleset: plan.ruleset.as_deref().map(AsRawFd::as_raw_fd),
            seccomp: plan.seccomp.as_ref().map(|program| SockFprog {
                len: program.len() as libc::c_ushort,
                filter: program.as_ptr(),
            }),
        }
    }

    /// Every descriptor the child uses (the spawner brings each into its
    /// table).
    pub(super) fn descriptors(&self) -> impl Iterator<Item = RawFd> + '_ {
        self.cgroup
            .iter()
            .chain(&self.cgroup_procs)
            .copied()
            .chain(self.mounts.iter().map(|&(_, tree)| tree))
            .chain(self.ruleset)
    }

    /// Whether [`Confinement::mount_trees`] enters the working directory
    /// again, by its path (the trees mounted over it hide the one its
    /// descriptor names).
    pub(super) fn entered_mounted_cwd(&self) -> bool {
        !self.mounts.is_empty() && self.mounted_cwd.is_some()
    }

    /// Moves the prepared trees into place in a mount namespace of the
    /// child's own (slave to ours: what is mounted here later shows
    /// there): raw system calls only. Returns the failed call's -errno.
    ///
    /// # Safety
    /// Only in the child between clone and exec.
    pub(super) unsafe fn mount_trees(&self) -> Result<(), libc::c_long> {
        const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;
        if self.mounts.is_empty() {
            return Ok(());
        }
        // SAFETY: raw system calls on values prepared by the parent.
        unsafe {
            let result = raw(libc::syscall(libc::SYS_unshare, libc::CLONE_NEWNS));
            if result < 0 {
                return Err(result);
            }
            let result = raw(libc::syscall(
                libc::SYS_mount,
                c"none".as_ptr(),
                c"/".as_ptr(),
                std::ptr::null::<libc::c_char>(),
                libc::MS_REC | libc::MS_SLAVE,
                std::ptr::null::<libc::c_void>(),
            ));
            if result < 0 {
                return Err(result);
            }
            for &(path, tree) in &self.mounts {
                let result = raw(libc::syscall(
                    libc::SYS_move_mount,
                    tree,
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    path,
                    MOVE_MOUNT_F_EMPTY_PATH,
                ));
                if result < 0 {
                    return Err(result);
                }
            }
            // The directory it was in is the one beneath the trees.
            if let Some(cwd) = self.mounted_cwd {
                let result = raw(libc::syscall(libc::SYS_chdir, cwd));
                if result < 0 {
                    return Err(result);
                }
            }
        }
        Ok(())
    }

    /// Applies the confinement to the calling (child) process: raw system
    /// calls only. Returns the failed call's -errno.
    ///
    /// # Safety
    /// Only in the child between clone and exec.
    pub(super) unsafe fn apply(&self) -> Result<(), libc::c_long> {
        // SAFETY: raw system calls on values prepared by the parent.
        unsafe {
            if self.drop_capabilities {
                // Only what the bounding set holds: a drop is a call each
                // (and a new set of credentials).
                for capability in 0..=self.last_capability.min(63) {
                    if self.bounding_set & (1u64 << capability) == 0 {
                        continue;
                    }
                    // EINVAL for numbers this kernel does not know.
                    raw(libc::syscall(
                        libc::SYS_prctl,
                        libc::PR_CAPBSET_DROP,
                        capability,
                        0,
                        0,
                        0,
                    ));
                }
                if self.clear_ambient {
                    raw(libc::syscall(
                        libc::SYS_prctl,
                        libc::PR_CAP_AMBIENT,
                        libc::PR_CAP_AMBIENT_CLEAR_ALL,
                        0,
                        0,
                        0,
                    ));
                }
                // Groups first (that needs CAP_SETGID), the uid last: it
                // takes the remaining capabilities with it.
                if let Some(id) = self.user {
                    let result = raw(libc::syscall(
                        libc::SYS_setgroups,
                        0usize,
                        std::ptr::null::<libc::gid_t>(),
                    ));
                    if result < 0 {
                        return Err(result);
                    }
                    let result = raw(libc::syscall(libc::SYS_setresgid, id, id, id));
                    if result < 0 {
                        return Err(result);
                    }
                    let result = raw(libc::syscall(libc::SYS_setresuid, id, id, id));
                    if result < 0 {
                        return Err(result);
                    }
                }
                let header = CapHeader {
                    version: LINUX_CAPABILITY_VERSION_3,
                    pid: 0,
                };
                let none = [CapData {
                    effective: 0,
                    permitted: 0,
                    inheritable: 0,
                }; 2];
                let result = raw(libc::syscall(
                    libc::SYS_capset,
                    &header as *const CapHeader,
                    none.as_ptr(),
                ));
                if result < 0 {
                    return Err(result);
                }
            }
            if self.no_new_privs {
                let result = raw(libc::syscall(
                    libc::SYS_prctl,
                    libc::PR_SET_NO_NEW_PRIVS,
                    1,
                    0,
                    0,
                    0,
                ));
                if result < 0 {
                    return Err(result);
                }
            }
            if let Some(ruleset) = self.ruleset {
                let result = raw(libc::syscall(
                    libc::SYS_landlock_restrict_self,
                    ruleset,
                    0u32,
                ));
                if result < 0 {
                    return Err(result);
                }
            }
            if let Some(program) = &self.seccomp {
                // Last: the filter allows everything that follows.
                let result = raw(libc::syscall(
                    libc::SYS_seccomp,
                    libc::SECCOMP_SET_MODE_FILTER,
                    0u32,
                    program as *const SockFprog,
                ));
                if result < 0 {
                    return Err(result);
                }
            }
        }
        Ok(())
    }
}
