//! What an engine takes the kernel to support: every feature the kernel
//! has, except those its [`HostConfig`] hides. A value held by the engine
//! (as rust-landlock's `Compatibility` is) and handed to everything that
//! asks whether the kernel has Landlock, cgroups, openat2 and the rest, so
//! engines that hide different features live side by side in one process
//! (`capexec serve --hide-kernel-feature` builds its engine's; tests build
//! theirs). What the kernel itself has is probed once per process
//! (`sandbox/probe.rs`, `files`).

use std::collections::HashSet;

/// Which kernel features an engine treats as missing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostConfig {
    /// Kernel features treated as missing (for tests of the refusals and
    /// of best effort: `capexec serve --hide-kernel-feature`).
    pub hidden: HashSet<KernelFeature>,
}

impl HostConfig {
    /// The kernel as it is, with `features` treated as missing.
    pub fn hiding(features: impl IntoIterator<Item = KernelFeature>) -> HostConfig {
        HostConfig {
            hidden: features.into_iter().collect(),
        }
    }

    /// Whether `feature` is treated as missing.
    pub fn hides(&self, feature: KernelFeature) -> bool {
        self.hidden.contains(&feature)
    }
}

/// A kernel feature confinement or the files rely on, as
/// [`HostConfig::hidden`] (and `capexec serve --hide-kernel-feature`, for
/// tests) names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelFeature {
    /// Landlock altogether.
    Landlock,
    /// Landlock's TCP rules (ABI 4): what remains is ABI 3.
    LandlockTcp,
    /// Landlock's signal and abstract-socket scoping (ABI 6): ABI 5 remains.
    LandlockScopes,
    Seccomp,
    /// A writable cgroup2 hierarchy: processes are tracked by their group.
    Cgroups,
    MemoryController,
    PidsController,
    CpuController,
    /// clone3's CLONE_INTO_CGROUP (Linux 5.7): children join their cgroup
    /// by writing its `cgroup.procs` instead.
    CloneIntoCgroup,
    /// openat2 (Linux 5.6), which confines every path of a `Directory`.
    Openat2,
    /// O_TMPFILE: atomic writes then stage in hidden named temporaries.
    TmpFile,
    /// Idmapped mounts (Linux 5.12), with which a root server's sandboxed
    /// children run as an unprivileged user.
    IdmappedMounts,
}

impl KernelFeature {
    pub const ALL: &'static [KernelFeature] = &[
        KernelFeature::Landlock,
        KernelFeature::LandlockTcp,
        KernelFeature::LandlockScopes,
        KernelFeature::Seccomp,
        KernelFeature::Cgroups,
        KernelFeature::MemoryController,
        KernelFeature::PidsController,
        KernelFeature::CpuController,
        KernelFeature::CloneIntoCgroup,
        KernelFeature::Openat2,
        KernelFeature::TmpFile,
        KernelFeature::IdmappedMounts,
    ];

    pub fn name(self) -> &'static str {
        match self {
            KernelFeature::Landlock => "landlock",
            KernelFeature::LandlockTcp => "landlock-tcp",
            KernelFeature::LandlockScopes => "landlock-scopes",
            KernelFeature::Seccomp => "seccomp",
            KernelFeature::Cgroups => "cgroups",
            KernelFeature::MemoryController => "memory",
            KernelFeature::PidsController => "pids",
            KernelFeature::CpuController => "cpu",
            KernelFeature::CloneIntoCgroup => "clone-into-cgroup",
            KernelFeature::Openat2 => "openat2",
            KernelFeature::TmpFile => "o-tmpfile",
            KernelFeature::IdmappedMounts => "idmapped-mounts",
        }
    }
}

impl std::str::FromStr for KernelFeature {
    type Err = String;

    fn from_str(text: &str) -> Result<KernelFeature, String> {
        KernelFeature::ALL
            .iter()
            .copied()
            .find(|feature| feature.name() == text)
            .ok_or_else(|| {
                let names: Vec<&str> = KernelFeature::ALL.iter().map(|f| f.name()).collect();
                format!(
                    "unknown kernel feature {text:?} (known: {})",
                    names.join(", ")
                )
            })
    }
}
