//! The Landlock ruleset of one start, built in the parent with the
//! `landlock` crate (from the Landlock maintainers), as far as the kernel's
//! ABI goes; the child only passes its descriptor to
//! `landlock_restrict_self`.

use std::os::fd::OwnedFd;

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd,
    Ruleset, RulesetAttr, RulesetCreatedAttr, Scope,
};

use crate::model::Network;
use crate::sandbox::roots::{Access as RootAccess, Root};

/// What a ruleset enforces, by the kernel's ABI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Coverage {
    pub filesystem: bool,
    /// TCP bind and connect are denied (network off, ABI 4).
    pub tcp: bool,
    /// Signals and abstract Unix sockets are scoped (ABI 6).
    pub scopes: bool,
}

impl Coverage {
    pub fn of(abi: u32, network: Network) -> Coverage {
        Coverage {
            filesystem: abi >= 1,
            tcp: abi >= 4 && network == Network::None,
            scopes: abi >= 6,
        }
    }
}

/// The ABI the crate names for the kernel's version (newer kernels keep
/// every older ABI).
fn abi(version: u32) -> ABI {
    match version {
        0 => ABI::Unsupported,
        1 => ABI::V1,
        2 => ABI::V2,
        3 => ABI::V3,
        4 => ABI::V4,
        5 => ABI::V5,
        6 => ABI::V6,
        7 => ABI::V7,
        8 => ABI::V8,
        9 => ABI::V9,
        _ => ABI::V10,
    }
}

/// A ruleset allowing `roots` (and nothing else of the file system), TCP
/// as `network` says, and scoped signals and abstract sockets, as far as
/// ABI `version` (at least 1) goes; every requirement is hard, so what is
/// returned enforces exactly [`Coverage::of`].
pub(crate) fn build(roots: &[Root], network: Network, version: u32) -> Result<OwnedFd, String> {
    let abi = abi(version);
    let coverage = Coverage::of(version, network);
    let failed =
        |error: &dyn std::fmt::Display| format!("cannot build the Landlock ruleset: {error}");
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))
        .map_err(|e| failed(&e))?;
    if coverage.tcp {
        ruleset = ruleset
            .handle_access(AccessNet::from_all(abi))
            .map_err(|e| failed(&e))?;
    }
    if coverage.scopes {
        ruleset = ruleset
            .scope(Scope::from_all(abi))
            .map_err(|e| failed(&e))?;
    }
    let mut created = ruleset.create().map_err(|e| failed(&e))?;
    for root in roots {
        let directory = root.path.is_dir();
        let wanted: BitFlags<AccessFs> = match root.access {
            RootAccess::Read => AccessFs::from_read(abi),
            RootAccess::Write => AccessFs::from_all(abi),
        };
        // A file takes only the rights that apply to files.
        let access = if directory {
            wanted
        } else {
            wanted & AccessFs::from_file(abi)
        };
        let fd = PathFd::new(&root.path)
            .map_err(|error| format!("sandbox root {}: {error}", root.path.display()))?;
        created = created
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|e| failed(&e))?;
    }
    let fd: Option<OwnedFd> = created.into();
    fd.ok_or_else(|| "the kernel made no Landlock ruleset".to_string())
}
