//! A sandbox's roots: the defaults made explicit (system directories,
//! devices, the working directory), paths resolved, and the checks that
//! keep a sandbox meaningful: no writable kernel interface, no root that
//! exposes a server's secret (a login token, a TLS private key), nothing a
//! policy does not allow.
//!
//! Landlock rules are unions: a path may be accessed as any root it is in
//! (or below) allows. So the access a set of roots gives a path is the
//! greatest of its ancestors' among them, and one set is within another
//! when each of its roots is allowed at least as much by the other.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::mounts::KernelMounts;
use super::{Protected, Secret};
use crate::model::{Network, Refusal, RefusalKind, Sandbox, excerpt, io_message};

/// What a root allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Access {
    /// Read and execute.
    Read,
    /// Everything: read, execute, create, write, remove, rename.
    Write,
}

/// Whether a root was asked for by name, or came with a default (the
/// system directories, the working directory): a policy refuses a root
/// asked for beyond it, and narrows a default one to what it allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    Asked,
    Default,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Root {
    pub path: PathBuf,
    pub access: Access,
    pub origin: Origin,
}

/// Readable by every sandbox that keeps the system roots, if they exist.
const SYSTEM_DIRECTORIES: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/proc",
];

/// The devices programs need, writable (a terminal's among them).
const WRITABLE_DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
];

/// The devices programs read.
const READABLE_DEVICES: &[&str] = &["/dev/random", "/dev/urandom"];

/// The system roots as they resolve on this host (once: they do not move).
fn system_roots() -> &'static [Root] {
    static ROOTS: OnceLock<Vec<Root>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let existing = |paths: &[&str], access: Access| -> Vec<Root> {
            paths
                .iter()
                .filter_map(|path| std::fs::canonicalize(path).ok())
                .map(|path| Root {
                    path,
                    access,
                    origin: Origin::Default,
                })
                .collect()
        };
        let mut roots = existing(SYSTEM_DIRECTORIES, Access::Read);
        roots.extend(existing(WRITABLE_DEVICES, Access::Write));
        roots.extend(existing(READABLE_DEVICES, Access::Read));
        dedup(roots)
    })
}

/// Whether `path` is one of the devices a sandbox may write.
fn is_default_device(path: &Path) -> bool {
    system_roots()
        .iter()
        .any(|root| root.access == Access::Write && root.path == path)
}

/// A sandbox's roots, resolved: what `sandbox` gives a process that runs
/// in `cwd` (absolute). Fails for a root that does not resolve.
pub(crate) fn resolve(sandbox: &Sandbox, cwd: &Path, rule: &str) -> Result<Vec<Root>, Refusal> {
    let cwd = std::fs::canonicalize(cwd).map_err(|error| {
        Refusal::new(
            RefusalKind::BadCwd,
            format!("working directory {}: {}", shown(cwd), io_message(&error)),
        )
    })?;
    resolve_in_canonical(sandbox, &cwd, rule)
}

/// [`resolve`] for a start whose working directory was resolved already
/// (`cwd` is canonical, and not resolved again: its path may name another
/// directory by now).
pub(crate) fn resolve_in_canonical(
    sandbox: &Sandbox,
    cwd: &Path,
    rule: &str,
) -> Result<Vec<Root>, Refusal> {
    let mut roots = resolve_without_cwd(sandbox, rule)?;
    roots.push(Root {
        path: cwd.to_path_buf(),
        access: if sandbox.read_only_cwd {
            Access::Read
        } else {
            Access::Write
        },
        origin: Origin::Default,
    });
    Ok(dedup(roots))
}

/// The system roots (unless left out) and the asked ones, resolved.
fn resolve_without_cwd(sandbox: &Sandbox, rule: &str) -> Result<Vec<Root>, Refusal> {
    let mut roots = Vec::new();
    if !sandbox.no_system_roots {
        roots.extend(system_roots().iter().cloned());
    }
    let asked = sandbox
        .read_only
        .iter()
        .map(|path| (path, Access::Read, "read-only"))
        .chain(
            sandbox
                .writable
                .iter()
                .map(|path| (path, Access::Write, "writable")),
        );
    for (path, access, kind) in asked {
        if !path.is_absolute() {
            return Err(Refusal::new(
                RefusalKind::InvalidArgument,
                format!(
                    "{rule}: the {kind} root {} is not an absolute path",
                    shown(path)
                ),
            ));
        }
        let path = std::fs::canonicalize(path).map_err(|error| {
            Refusal::new(
                RefusalKind::InvalidArgument,
                format!(
                    "{rule}: the {kind} root {}: {}",
                    shown(path),
                    io_message(&error)
                ),
            )
        })?;
        roots.push(Root {
            path,
            access,
            origin: Origin::Asked,
        });
    }
    Ok(dedup(roots))
}

/// A policy's sandbox, resolved when the policy was added: what starts
/// through its executor may be given.
#[derive(Clone, Debug)]
pub struct PolicySandbox {
    /// As the policy said it: what a start without a sandbox gets.
    asked: Sandbox,
    /// Its roots but the working directory, narrowed by the policies
    /// before it.
    roots: Vec<Root>,
    /// What a start's working directory may get.
    cwd: Access,
    network: Network,
    allow_namespaces: bool,
    keep_root: bool,
    best_effort: bool,
}

impl PolicySandbox {
    /// About how many bytes it keeps in memory (a restricted executor's
    /// rules are counted against its connection).
    pub fn approximate_bytes(&self) -> usize {
        let paths = |paths: &[PathBuf]| -> usize {
            paths.iter().map(|path| path.as_os_str().len() + 32).sum()
        };
        std::mem::size_of::<PolicySandbox>()
            + paths(&self.asked.read_only)
            + paths(&self.asked.writable)
            + self
                .roots
                .iter()
                .map(|root| root.path.as_os_str().len() + std::mem::size_of::<Root>())
                .sum::<usize>()
    }

    /// `sandbox` resolved, within `outer` (the policy before it, if any
    /// has a sandbox): a root or network it asks for beyond `outer` is
    /// refused, its system roots are narrowed to `outer`'s.
    pub fn resolve(
        sandbox: &Sandbox,
        outer: Option<&PolicySandbox>,
        rule: &str,
    ) -> Result<PolicySandbox, Refusal> {
        let mut resolved = PolicySandbox {
            asked: sandbox.clone(),
            roots: resolve_without_cwd(sandbox, rule)?,
            // Writable roots say where writes may go: a start's working
            // directory outside them is only read, as with `readOnlyCwd`
            // (else any start could write wherever it chose to run).
            cwd: if sandbox.read_only_cwd || !sandbox.writable.is_empty() {
                Access::Read
            } else {
                Access::Write
            },
            network: sandbox.network,
            allow_namespaces: sandbox.allow_namespaces,
            keep_root: sandbox.keep_root,
            best_effort: sandbox.best_effort,
        };
        check(
            &resolved.roots,
            &super::protected(),
            &super::mounts::kernel_mount_points(),
            rule,
        )?;
        if let Some(outer) = outer {
            if resolved.network > outer.network {
                return Err(Refusal::new(
                    RefusalKind::NotAllowed,
                    format!("{rule}: the network is off in this executor's sandbox"),
                ));
            }
            if resolved.allow_namespaces && !outer.allow_namespaces {
                return Err(no_namespaces(rule));
            }
            if resolved.keep_root && !outer.keep_root {
                return Err(no_root(rule));
            }
            resolved.roots = narrowed(&resolved.roots, &outer.roots, rule)?;
            resolved.cwd = resolved.cwd.min(outer.cwd);
            resolved.best_effort &= outer.best_effort;
        }
        Ok(resolved)
    }

    /// The sandbox of a start in `cwd` that asked for `start` (or none)
    /// through executors restricted by `layers` (oldest first): every
    /// default narrowed to what they allow, made explicit (one Landlock
    /// layer); refused if the start asks for more than they allow.
    pub fn narrow(
        layers: &[PolicySandbox],
        start: Option<&Sandbox>,
        cwd: &Path,
        rule: &str,
    ) -> Result<Sandbox, Refusal> {
        let Some(innermost) = layers.last() else {
            return Ok(start.cloned().unwrap_or_default());
        };
        let asked = start.unwrap_or(&innermost.asked);
        let mut roots = resolve(asked, cwd, rule)?;
        let cwd = roots
            .iter()
            .find(|root| root.origin == Origin::Default && !is_system(&root.path))
            .map(|root| root.path.clone());
        let mut network = asked.network;
        let mut allow_namespaces = asked.allow_namespaces;
        let mut keep_root = asked.keep_root;
        let mut best_effort = asked.best_effort;
        for layer in layers {
            let mut allowed = layer.roots.clone();
            if let Some(cwd) = &cwd {
                allowed.push(Root {
                    path: cwd.clone(),
                    access: layer.cwd,
                    origin: Origin::Default,
                });
            }
            roots = narrowed(&roots, &dedup(allowed), rule)?;
            if network > layer.network {
                if start.is_some() {
                    return Err(Refusal::new(
                        RefusalKind::NotAllowed,
                        format!("{rule}: the network is off in this executor's sandbox"),
                    ));
                }
                network = layer.network;
            }
            if allow_namespaces && !layer.allow_namespaces {
                if start.is_some() {
                    return Err(no_namespaces(rule));
                }
                allow_namespaces = false;
            }
            if keep_root && !layer.keep_root {
                if start.is_some() {
                    return Err(no_root(rule));
                }
                keep_root = false;
            }
            best_effort &= layer.best_effort;
        }
        if let Some(cwd) = &cwd
            && !readable(&roots, cwd)
        {
            return Err(Refusal::new(
                RefusalKind::NotAllowed,
                format!(
                    "{rule}: the working directory {} is not readable in this executor's sandbox",
                    shown(cwd)
                ),
            ));
        }
        Ok(explicit(
            &roots,
            &Sandbox {
                network,
                allow_namespaces,
                keep_root,
                best_effort,
                leave_out_secrets: asked.leave_out_secrets,
                // Every layer's as well: each only makes less writable.
                read_only_inside: std::iter::once(asked)
                    .chain(layers.iter().map(|layer| &layer.asked))
                    .flat_map(|sandbox| sandbox.read_only_inside.iter().cloned())
                    .collect(),
                ..Sandbox::default()
            },
        ))
    }
}

fn no_root(rule: &str) -> Refusal {
    Refusal::new(
        RefusalKind::NotAllowed,
        format!("{rule}: processes may not stay root in this executor's sandbox"),
    )
}

fn no_namespaces(rule: &str) -> Refusal {
    Refusal::new(
        RefusalKind::NotAllowed,
        format!("{rule}: namespaces are not allowed in this executor's sandbox"),
    )
}

fn is_system(path: &Path) -> bool {
    system_roots().iter().any(|root| root.path == path)
}

/// The roots as a sandbox that says everything: what a process was given,
/// with `flags`' network, namespaces, root and best effort.
pub(crate) fn explicit(roots: &[Root], flags: &Sandbox) -> Sandbox {
    let listed = |access: Access| {
        roots
            .iter()
            .filter(|root| root.access == access)
            .map(|root| root.path.clone())
            .collect()
    };
    Sandbox {
        read_only: listed(Access::Read),
        writable: listed(Access::Write),
        network: flags.network,
        no_system_roots: true,
        read_only_cwd: true,
        best_effort: flags.best_effort,
        allow_namespaces: flags.allow_namespaces,
        keep_root: flags.keep_root,
        leave_out_secrets: flags.leave_out_secrets,
        read_only_inside: flags.read_only_inside.clone(),
    }
}

/// The access `roots` give `path`: the greatest of its ancestors' (itself
/// included); `None` if it is in none of them.
pub(crate) fn access_at(roots: &[Root], path: &Path) -> Option<Access> {
    roots
        .iter()
        .filter(|root| path.starts_with(&root.path))
        .map(|root| root.access)
        .max()
}

/// `roots` within `rule`'s roots: an asked root must be allowed as much as
/// it asks (else the refusal names it); a default one is narrowed to what
/// the rule allows, in it and below it.
pub(crate) fn narrowed(
    roots: &[Root],
    rule: &[Root],
    rule_name: &str,
) -> Result<Vec<Root>, Refusal> {
    let mut result = Vec::new();
    for root in roots {
        let allowed = access_at(rule, &root.path);
        match root.origin {
            Origin::Asked => {
                if allowed.is_none_or(|allowed| allowed < root.access) {
                    return Err(Refusal::new(
                        RefusalKind::NotAllowed,
                        format!(
                            "{rule_name}: {} is not {} in this executor's sandbox ({})",
                            shown(&root.path),
                            match root.access {
                                Access::Read => "readable",
                                Access::Write => "writable",
                            },
                            listed(rule)
                        ),
                    ));
                }
                result.push(root.clone());
            }
            Origin::Default => {
                if let Some(allowed) = allowed {
                    result.push(Root {
                        access: allowed.min(root.access),
                        ..root.clone()
                    });
                }
                for inner in rule {
                    if inner.path != root.path && inner.path.starts_with(&root.path) {
                        result.push(Root {
                            path: inner.path.clone(),
                            access: inner.access.min(root.access),
                            origin: Origin::Default,
                        });
                    }
                }
            }
        }
    }
    Ok(dedup(result))
}

/// Refuses roots that would make the sandbox meaningless: a writable root
/// that contains a kernel interface file system (proc, sysfs, cgroups,
/// devices...) or lies on one, other than the default devices; any root
/// that contains one of `protected` (login tokens, TLS private keys).
pub(crate) fn check(
    roots: &[Root],
    protected: &[Protected],
    kernel_mounts: &KernelMounts,
    rule: &str,
) -> Result<(), Refusal> {
    for root in roots {
        if let Some(file) = protected
            .iter()
            .find(|file| file.path.starts_with(&root.path))
        {
            let (what, then) = match file.secret {
                Secret::LoginToken => ("a capexec login token", "log in"),
                Secret::TlsKey => (
                    "the private key of a capexec server's TLS certificate",
                    "pose as the server",
                ),
            };
            return Err(Refusal::new(
                RefusalKind::NotAllowed,
                format!(
                    "{rule}: the root {} contains {what} ({}); a sandboxed process could read \
                     it and {then}: choose roots that leave it out",
                    shown(&root.path),
                    shown(&file.path)
                ),
            ));
        }
        if root.access == Access::Write
            && !is_default_device(&root.path)
            && let Some(mount) = kernel_mounts.exposed_by(&root.path)
        {
            return Err(Refusal::new(
                RefusalKind::NotAllowed,
                format!(
                    "{rule}: the writable root {} would make the kernel's own files at {} \
                     writable (a process could change the kernel or leave its cgroup)",
                    shown(&root.path),
                    shown(mount)
                ),
            ));
        }
    }
    Ok(())
}

/// The most roots [`leave_out`] makes.
const MAX_SPLIT_ROOTS: usize = 4096;

/// `roots` with each that contains one of `protected` split around it
/// (`Sandbox.leaveOutSecrets`): its entries get its access, but the one
/// that leads to a secret, which is split in turn, down to the secret,
/// left out. Symbolic links are not followed; entries that vanish while
/// listed are left out.
pub(crate) fn leave_out(
    roots: Vec<Root>,
    protected: &[Protected],
    rule: &str,
) -> Result<Vec<Root>, Refusal> {
    let secrets: Vec<&Path> = protected.iter().map(|file| file.path.as_path()).collect();
    if !roots
        .iter()
        .any(|root| secrets.iter().any(|secret| secret.starts_with(&root.path)))
    {
        return Ok(roots);
    }
    let mut result = Vec::new();
    for root in roots {
        split_around(&root, &secrets, &mut result, rule)?;
    }
    Ok(dedup(result))
}

fn split_around(
    root: &Root,
    secrets: &[&Path],
    result: &mut Vec<Root>,
    rule: &str,
) -> Result<(), Refusal> {
    if secrets.iter().any(|secret| *secret == root.path) {
        return Ok(());
    }
    if result.len() >= MAX_SPLIT_ROOTS {
        return Err(Refusal::new(
            RefusalKind::NotAllowed,
            format!(
                "{rule}: leaving the server's secrets out of {} takes more than \
                 {MAX_SPLIT_ROOTS} roots",
                shown(&root.path)
            ),
        ));
    }
    if !secrets.iter().any(|secret| secret.starts_with(&root.path)) {
        result.push(root.clone());
        return Ok(());
    }
    let entries = match std::fs::read_dir(&root.path) {
        Ok(entries) => entries,
        // Gone, or not to be listed: it is no root then.
        Err(_) => return Ok(()),
    };
    for entry in entries.flatten() {
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        // A link's target has what its own roots give it; a socket, pipe
        // or device is no root worth mounting (a root server's child has
        // each root as a mount of its own).
        if !(kind.is_dir() || kind.is_file()) {
            continue;
        }
        let inner = Root {
            path: entry.path(),
            access: root.access,
            origin: root.origin,
        };
        let leads_to_secret = secrets.iter().any(|secret| secret.starts_with(&inner.path));
        if leads_to_secret && !kind.is_dir() {
            // The secret itself (or a file in its place).
            continue;
        }
        split_around(&inner, secrets, result, rule)?;
    }
    Ok(())
}

/// Whether `path` may be read (or executed) under `roots`.
pub(crate) fn readable(roots: &[Root], path: &Path) -> bool {
    access_at(roots, path).is_some()
}

/// Sorted, each path once with the greatest access it was given (an asked
/// origin wins over a default one), and roots implied by an ancestor with
/// at least their access left out.
fn dedup(mut roots: Vec<Root>) -> Vec<Root> {
    roots.sort_by(|a, b| a.path.cmp(&b.path));
    let mut merged: Vec<Root> = Vec::with_capacity(roots.len());
    for root in roots {
        match merged.last_mut() {
            Some(last) if last.path == root.path => {
                last.access = last.access.max(root.access);
                if root.origin == Origin::Asked {
                    last.origin = Origin::Asked;
                }
            }
            _ => merged.push(root),
        }
    }
    let all = merged.clone();
    merged.retain(|root| {
        !all.iter().any(|outer| {
            outer.path != root.path
                && root.path.starts_with(&outer.path)
                && outer.access >= root.access
                && (outer.origin == Origin::Asked || root.origin == Origin::Default)
        })
    });
    merged
}

fn shown(path: &Path) -> String {
    format!("{:?}", excerpt(&path.display().to_string()))
}

fn listed(roots: &[Root]) -> String {
    let mut text = String::new();
    for (index, root) in roots.iter().enumerate() {
        if text.len() > crate::model::EXCERPT_BYTES {
            text.push_str(&format!(" and {} more", roots.len() - index));
            break;
        }
        if !text.is_empty() {
            text.push_str(", ");
        }
        text.push_str(&format!(
            "{} {}",
            match root.access {
                Access::Read => "read",
                Access::Write => "write",
            },
            shown(&root.path)
        ));
    }
    if text.is_empty() {
        "no roots".to_string()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(path: &str, access: Access, origin: Origin) -> Root {
        Root {
            path: path.into(),
            access,
            origin,
        }
    }

    #[test]
    fn a_root_is_split_around_the_secrets_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        for path in ["server/token", "server/other", "work/file", "alone"] {
            let path = base.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, "x").unwrap();
        }
        std::os::unix::fs::symlink(base.join("server"), base.join("link")).unwrap();
        let protected = [Protected {
            path: base.join("server/token"),
            secret: Secret::LoginToken,
        }];
        let roots = vec![
            Root {
                path: base.clone(),
                access: Access::Write,
                origin: Origin::Asked,
            },
            root("/nowhere-near", Access::Read, Origin::Asked),
        ];
        let split = leave_out(roots, &protected, "sandbox").unwrap();
        let mut paths: Vec<(PathBuf, Access)> = split
            .iter()
            .map(|root| (root.path.clone(), root.access))
            .collect();
        paths.sort();
        assert_eq!(
            paths,
            [
                (PathBuf::from("/nowhere-near"), Access::Read),
                (base.join("alone"), Access::Write),
                (base.join("server/other"), Access::Write),
                (base.join("work"), Access::Write),
            ]
        );
        assert!(check(&split, &protected, &KernelMounts::default(), "sandbox").is_ok());
        // Without a secret in them, roots are left as they are.
        let untouched = vec![root("/usr", Access::Read, Origin::Default)];
        assert_eq!(
            leave_out(untouched.clone(), &protected, "s").unwrap(),
            untouched
        );
    }

    #[test]
    fn access_is_the_greatest_of_the_ancestors() {
        let roots = [
            root("/srv", Access::Read, Origin::Asked),
            root("/srv/out", Access::Write, Origin::Asked),
        ];
        assert_eq!(access_at(&roots, Path::new("/srv/a")), Some(Access::Read));
        assert_eq!(
            access_at(&roots, Path::new("/srv/out/x")),
            Some(Access::Write)
        );
        assert_eq!(access_at(&roots, Path::new("/srvx")), None);
        assert_eq!(access_at(&roots, Path::new("/")), None);
    }

    #[test]
    fn asked_roots_beyond_a_rule_are_refused_and_defaults_narrowed() {
        let rule = [
            root("/usr/bin", Access::Read, Origin::Asked),
            root("/work", Access::Write, Origin::Asked),
            root("/data", Access::Read, Origin::Asked),
        ];
        let roots = [
            root("/usr", Access::Read, Origin::Default),
            root("/work/a", Access::Write, Origin::Default),
            root("/data/x", Access::Read, Origin::Asked),
        ];
        let within = narrowed(&roots, &rule, "rule").expect("within");
        assert_eq!(
            within,
            vec![
                root("/data/x", Access::Read, Origin::Asked),
                root("/usr/bin", Access::Read, Origin::Default),
                root("/work/a", Access::Write, Origin::Default),
            ]
        );
        // A default writable directory where the rule only reads: read.
        let cwd = [root("/data/y", Access::Write, Origin::Default)];
        assert_eq!(
            narrowed(&cwd, &rule, "rule").expect("narrowed"),
            vec![root("/data/y", Access::Read, Origin::Default)]
        );
        for wider in [
            root("/data/x", Access::Write, Origin::Asked),
            root("/etc", Access::Read, Origin::Asked),
        ] {
            let error = narrowed(&[wider], &rule, "policy rule `sandbox`").expect_err("wider");
            assert_eq!(error.kind, RefusalKind::NotAllowed);
            assert!(
                error.message.starts_with("policy rule `sandbox`: "),
                "{error}"
            );
        }
    }

    #[test]
    fn roots_that_expose_secrets_or_kernel_files_are_refused() {
        let protected = [
            Protected {
                path: "/home/u/.config/capexec/token".into(),
                secret: Secret::LoginToken,
            },
            Protected {
                path: "/srv/tls/key.pem".into(),
                secret: Secret::TlsKey,
            },
        ];
        let kernel = KernelMounts {
            points: vec![
                PathBuf::from("/proc"),
                PathBuf::from("/sys/fs/cgroup"),
                PathBuf::from("/dev"),
            ],
            others: vec![PathBuf::from("/"), PathBuf::from("/dev/shm")],
        };
        let check_one = |root: Root| check(&[root], &protected, &kernel, "sandbox");
        let refused = |root: Root| check_one(root).expect_err("refused").to_string();
        assert!(refused(root("/home/u", Access::Read, Origin::Asked)).contains("login token"));
        assert!(check_one(root("/home/u/src", Access::Write, Origin::Asked)).is_ok());
        for exposing in ["/srv", "/srv/tls", "/srv/tls/key.pem"] {
            let message = refused(root(exposing, Access::Read, Origin::Asked));
            assert!(message.contains("private key"), "{message}");
        }
        assert!(check_one(root("/srv/www", Access::Read, Origin::Asked)).is_ok());
        assert!(check_one(root("/", Access::Write, Origin::Asked)).is_err());
        assert!(check_one(root("/sys", Access::Write, Origin::Asked)).is_err());
        assert!(check_one(root("/proc/sys", Access::Write, Origin::Asked)).is_err());
        assert!(check_one(root("/proc", Access::Read, Origin::Default)).is_ok());
        // Devices: the default ones only; a tmpfs below /dev is no device.
        assert!(check_one(root("/dev/null", Access::Write, Origin::Asked)).is_ok());
        assert!(check_one(root("/dev/sda", Access::Write, Origin::Asked)).is_err());
        assert!(check_one(root("/dev", Access::Write, Origin::Asked)).is_err());
        assert!(check_one(root("/dev/shm/x", Access::Write, Origin::Asked)).is_ok());
    }

    #[test]
    fn duplicates_and_implied_roots_merge() {
        let merged = dedup(vec![
            root("/a", Access::Read, Origin::Default),
            root("/a", Access::Write, Origin::Asked),
            root("/a/b", Access::Read, Origin::Asked),
            root("/c", Access::Read, Origin::Default),
            root("/c/d", Access::Write, Origin::Default),
        ]);
        assert_eq!(
            merged,
            vec![
                root("/a", Access::Write, Origin::Asked),
                root("/c", Access::Read, Origin::Default),
                root("/c/d", Access::Write, Origin::Default),
            ]
        );
    }
}
