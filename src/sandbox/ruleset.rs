//! The Landlock ruleset of a start, built in the parent with the
//! `landlock` crate (from the Landlock maintainers), as far as the kernel's
//! ABI goes; the child only passes its descriptor to
//! `landlock_restrict_self`.
//!
//! A ruleset is built once per distinct set of roots and kept: the kernel
//! copies it into each child's domain, so one descriptor serves every
//! start that asks for the same roots. Its rules name the directories'
//! inodes as they were when it was built, so a start uses it only while
//! each root's path still names the same inode (one `statx` per root);
//! otherwise it is built again. The working directory's root is pinned:
//! its rule must name the inode the child enters (opened once by the
//! engine), compared with what was opened, never with what its path names
//! by now.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, Ruleset,
    RulesetAttr, RulesetCreatedAttr, Scope,
};

use crate::model::{Network, Refusal, RefusalKind};
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

/// How many rulesets are kept (each holds a descriptor); the oldest goes.
const KEPT: usize = 32;

/// A kept ruleset, and what it was built from.
struct Kept {
    roots: Vec<(PathBuf, RootAccess)>,
    network: Network,
    version: u32,
    /// Each root's (device, inode) when the ruleset was built.
    identities: Vec<(u64, u64)>,
    ruleset: Arc<OwnedFd>,
}

static KEPT_RULESETS: Mutex<Vec<Kept>> = Mutex::new(Vec::new());

/// The (device, inode) `path` names now.
fn identity(path: &std::path::Path) -> Option<(u64, u64)> {
    std::fs::metadata(path)
        .ok()
        .map(|meta| (meta.dev(), meta.ino()))
}

/// The ruleset [`build`] makes of `roots`, `network` and `version`: a kept
/// one if its roots still name the same inodes, else built and kept.
/// `pinned` is the working directory and its (device, inode): a root at
/// that path must name that inode, or the start is refused.
pub(crate) fn ruleset(
    roots: &[Root],
    pinned: Option<(&std::path::Path, (u64, u64))>,
    network: Network,
    version: u32,
) -> Result<Arc<OwnedFd>, Refusal> {
    let pinned_at = |root: &Root| {
        pinned
            .filter(|(path, _)| *path == root.path)
            .map(|(_, identity)| identity)
    };
    let now = |root: &Root| pinned_at(root).or_else(|| identity(&root.path));
    let matches = |kept: &Kept| {
        kept.network == network
            && kept.version == version
            && kept.roots.len() == roots.len()
            && kept
                .roots
                .iter()
                .zip(roots)
                .all(|((path, access), root)| *path == root.path && *access == root.access)
    };
    {
        let mut kept = KEPT_RULESETS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(index) = kept.iter().position(matches) {
            let current = roots
                .iter()
                .zip(&kept[index].identities)
                .all(|(root, &was)| now(root) == Some(was));
            if current {
                return Ok(Arc::clone(&kept[index].ruleset));
            }
            kept.remove(index);
        }
    }
    let (fd, identities) = build(roots, network, version)
        .map_err(|why| Refusal::new(RefusalKind::SpawnFailed, format!("sandbox: {why}")))?;
    for (root, &built) in roots.iter().zip(&identities) {
        if pinned_at(root).is_some_and(|pinned| pinned != built) {
            return Err(Refusal::new(
                RefusalKind::BadCwd,
                format!(
                    "working directory {}: it changed while the start was prepared (its path \
                     names another directory now)",
                    root.path.display()
                ),
            ));
        }
    }
    let ruleset = Arc::new(fd);
    let mut kept = KEPT_RULESETS.lock().unwrap_or_else(|p| p.into_inner());
    if kept.len() >= KEPT {
        kept.remove(0);
    }
    kept.push(Kept {
        roots: roots
            .iter()
            .map(|root| (root.path.clone(), root.access))
            .collect(),
        network,
        version,
        identities,
        ruleset: Arc::clone(&ruleset),
    });
    Ok(ruleset)
}

/// A ruleset allowing `roots` (and nothing else of the file system), TCP
/// as `network` says, and scoped signals and abstract sockets, as far as
/// ABI `version` (at least 1) goes; every requirement is hard, so what is
/// returned enforces exactly [`Coverage::of`]. With it, the (device, inode)
/// of each root its rules name.
fn build(
    roots: &[Root],
    network: Network,
    version: u32,
) -> Result<(OwnedFd, Vec<(u64, u64)>), String> {
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
    let mut identities = Vec::with_capacity(roots.len());
    for root in roots {
        let at_root =
            |error: std::io::Error| format!("sandbox root {}: {error}", root.path.display());
        // The rule names what this descriptor names; its identity is
        // what later starts compare with.
        let fd = File::options()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
            .open(&root.path)
            .map_err(at_root)?;
        let meta = fd.metadata().map_err(at_root)?;
        identities.push((meta.dev(), meta.ino()));
        let directory = meta.is_dir();
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
        created = created
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|e| failed(&e))?;
    }
    let fd: Option<OwnedFd> = created.into();
    fd.map(|fd| (fd, identities))
        .ok_or_else(|| "the kernel made no Landlock ruleset".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::roots::Origin;

    #[test]
    fn a_ruleset_is_kept_while_its_roots_name_the_same_inodes() {
        let version = crate::sandbox::probe::landlock_abi();
        assert!(version >= 1, "this machine has Landlock (CI checks)");
        let dir = tempfile::tempdir().expect("tempdir");
        let root = std::fs::canonicalize(dir.path())
            .expect("canonical")
            .join("cwd");
        std::fs::create_dir(&root).expect("mkdir");
        let roots = vec![Root {
            path: root.clone(),
            access: RootAccess::Write,
            origin: Origin::Default,
        }];
        let first = ruleset(&roots, None, Network::All, version).expect("built");
        let again = ruleset(&roots, None, Network::All, version).expect("kept");
        assert!(
            Arc::ptr_eq(&first, &again),
            "the same roots share one ruleset"
        );
        let other = ruleset(&roots, None, Network::None, version).expect("built");
        assert!(
            !Arc::ptr_eq(&first, &other),
            "another network, another ruleset"
        );
        // The same path, another directory: the kept rules name the old one.
        std::fs::remove_dir(&root).expect("rmdir");
        std::fs::create_dir(&root).expect("mkdir");
        let rebuilt = ruleset(&roots, None, Network::All, version).expect("built again");
        assert!(
            !Arc::ptr_eq(&first, &rebuilt),
            "built again for the new inode"
        );
    }
}
