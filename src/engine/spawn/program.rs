//! Where a start's program is, resolved as `execvp` would (the child's
//! PATH, relative to its working directory), the child's environment, and
//! what a failed start is called: the refusal a client reads.

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::child::{SetupFailure, Step};
use crate::engine::descriptors;
use crate::model::{Refusal, RefusalKind, StartSpec, excerpt, io_message};

/// Where `execvp` looks when the environment has no PATH.
const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// What a spec resolves to on this host.
pub(super) struct Resolved {
    pub(super) env: Vec<(OsString, OsString)>,
    pub(super) program: PathBuf,
}

pub(super) fn resolve(spec: &StartSpec) -> Result<Resolved, Refusal> {
    let cwd = match spec.effective_cwd() {
        Some(cwd) => {
            Some(std::path::absolute(cwd).map_err(|error| bad_cwd(cwd, &io_message(&error)))?)
        }
        None => None,
    };
    let env = child_env(spec);
    let path_var = env
        .iter()
        .find(|(name, _)| name == "PATH")
        .map(|(_, value)| value.as_os_str());
    let program = resolve_program(&spec.argv[0], path_var, cwd.as_deref())
        .map_err(|error| classify(spec, &error))?;
    Ok(Resolved { env, program })
}

/// The file `spec` would execute: its program resolved as the spawn
/// resolves it (the child's PATH, relative to its working directory).
pub(crate) fn program_path(spec: &StartSpec) -> Result<PathBuf, Refusal> {
    resolve(spec).map(|resolved| resolved.program)
}

/// The child's complete environment: the server's (or none), without the
/// spec's `unset`, with its `set` applied in order.
pub(crate) fn child_env(spec: &StartSpec) -> Vec<(OsString, OsString)> {
    let mut env: HashMap<OsString, OsString> = if spec.env.clear {
        HashMap::new()
    } else {
        std::env::vars_os().collect()
    };
    for name in &spec.env.unset {
        env.remove(name);
    }
    if spec.tty
        && let Some(term) = &spec.term
        && !spec.env.set.iter().any(|(name, _)| name == "TERM")
    {
        env.insert("TERM".into(), term.clone());
    }
    for (name, value) in &spec.env.set {
        env.insert(name.clone(), value.clone());
    }
    env.into_iter().collect()
}

/// A program name looked up on this process's own PATH, as `execvp` would.
pub(crate) fn program_on_own_path(name: &OsStr) -> io::Result<PathBuf> {
    let path_var = std::env::var_os("PATH");
    resolve_program(name, path_var.as_deref(), None)
}

fn bad_cwd(cwd: &Path, why: &str) -> Refusal {
    Refusal::new(
        RefusalKind::BadCwd,
        format!(
            "working directory {}: {why}",
            excerpt(&cwd.display().to_string())
        ),
    )
}

/// `execvp`'s search: a name with a slash is used as it is (relative to the
/// child's working directory); otherwise the first executable file of that
/// name along PATH. EACCES if only non-executable candidates exist, ENOENT
/// if none.
fn resolve_program(
    program: &OsStr,
    path_var: Option<&OsStr>,
    cwd: Option<&Path>,
) -> io::Result<PathBuf> {
    let in_cwd = |path: &Path| match cwd {
        Some(cwd) if path.is_relative() => cwd.join(path),
        _ => path.to_path_buf(),
    };
    if program.as_bytes().contains(&b'/') {
        return Ok(in_cwd(Path::new(program)));
    }
    let path_var = path_var.unwrap_or(OsStr::new(DEFAULT_PATH));
    let mut denied = false;
    for dir in path_var.as_bytes().split(|&b| b == b':') {
        let dir = if dir.is_empty() {
            Path::new(".")
        } else {
            Path::new(OsStr::from_bytes(dir))
        };
        let candidate = in_cwd(dir).join(program);
        match std::fs::metadata(&candidate) {
            Ok(meta) if meta.is_file() => {
                if executable(&candidate) {
                    return Ok(candidate);
                }
                denied = true;
            }
            Ok(_) => denied = true,
            Err(_) => {}
        }
    }
    Err(io::Error::from_raw_os_error(if denied {
        libc::EACCES
    } else {
        libc::ENOENT
    }))
}

fn executable(path: &Path) -> bool {
    let Ok(path) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access(2) reads a NUL-terminated path.
    unsafe { libc::access(path.as_ptr(), libc::X_OK) == 0 }
}

pub(super) fn classify(spec: &StartSpec, error: &io::Error) -> Refusal {
    if let Some(failure) = error
        .get_ref()
        .and_then(|e| e.downcast_ref::<SetupFailure>())
    {
        return match failure.step {
            Step::Chdir => Refusal::new(
                RefusalKind::BadCwd,
                format!(
                    "working directory {}: {}",
                    spec.effective_cwd()
                        .map(|cwd| excerpt(&cwd.display().to_string()).into_owned())
                        .unwrap_or_default(),
                    // The child's check that its path, entered again under
                    // its mounts, is the directory that was opened.
                    if failure.error.raw_os_error() == Some(libc::ESTALE) {
                        "it changed while the start was prepared (its path names another \
                         directory now)"
                            .to_string()
                    } else {
                        io_message(&failure.error)
                    }
                ),
            ),
            Step::Cgroup => Refusal::new(
                RefusalKind::SpawnFailed,
                format!(
                    "cannot move {} into its cgroup: {}",
                    excerpt(&spec.argv[0].to_string_lossy()),
                    io_message(&failure.error)
                ),
            ),
            Step::Confine => Refusal::new(
                RefusalKind::SpawnFailed,
                format!(
                    "cannot confine {} (mounts, user, capabilities, no_new_privs, Landlock, \
                     seccomp): {}",
                    excerpt(&spec.argv[0].to_string_lossy()),
                    io_message(&failure.error)
                ),
            ),
            Step::Setup if descriptors::is_exhaustion(&failure.error) => descriptors::exhausted(
                &format!("set up {}", excerpt(&spec.argv[0].to_string_lossy())),
                &failure.error,
            ),
            Step::Setup => Refusal::new(
                RefusalKind::SpawnFailed,
                format!(
                    "cannot set up {} (session or standard descriptors): {}",
                    excerpt(&spec.argv[0].to_string_lossy()),
                    io_message(&failure.error)
                ),
            ),
        };
    }
    let program = spec.argv[0].to_string_lossy();
    let program = excerpt(&program);
    match error.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ENOTDIR) => Refusal::new(
            RefusalKind::ProgramNotFound,
            format!("program not found: {program}"),
        ),
        Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EISDIR) => {
            // The kernel says "Permission denied" for a directory too.
            let directory = program_path(spec).is_ok_and(|path| path.is_dir());
            let why = if directory {
                "it is a directory".to_string()
            } else {
                io_message(error)
            };
            Refusal::new(
                RefusalKind::PermissionDenied,
                format!("cannot execute {program}: {why}"),
            )
        }
        Some(libc::ENOEXEC) => Refusal::new(
            RefusalKind::PermissionDenied,
            format!("cannot execute {program}: not an executable format"),
        ),
        _ => spawn_failed(spec, error),
    }
}

pub(super) fn spawn_failed(spec: &StartSpec, error: &io::Error) -> Refusal {
    let doing = format!("start {}", excerpt(&spec.argv[0].to_string_lossy()));
    if descriptors::is_exhaustion(error) {
        return descriptors::exhausted(&doing, error);
    }
    Refusal::new(
        RefusalKind::SpawnFailed,
        format!("cannot {doing}: {}", io_message(error)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_programs_resolve_against_the_working_directory() {
        let cwd = Path::new("/usr");
        assert_eq!(
            resolve_program(OsStr::new("./bin/env"), None, Some(cwd)).expect("found"),
            Path::new("/usr/./bin/env")
        );
        assert_eq!(
            resolve_program(OsStr::new("env"), Some(OsStr::new("bin")), Some(cwd)).expect("found"),
            Path::new("/usr/bin/env")
        );
        let missing = resolve_program(
            OsStr::new("capexec-none"),
            Some(OsStr::new("/usr/bin")),
            None,
        );
        assert_eq!(
            missing.expect_err("missing").raw_os_error(),
            Some(libc::ENOENT)
        );
    }

    #[test]
    fn a_terminal_gets_its_type_unless_the_start_sets_term() {
        let mut spec = StartSpec::new(["sh"]);
        spec.env.clear = true;
        spec.term = Some("xterm-kitty".into());
        assert!(child_env(&spec).is_empty(), "no terminal, no TERM");
        spec.tty = true;
        assert_eq!(
            child_env(&spec),
            vec![("TERM".into(), "xterm-kitty".into())]
        );
        spec.env.set = vec![("TERM".into(), "dumb".into())];
        assert_eq!(child_env(&spec), vec![("TERM".into(), "dumb".into())]);
        for bad in ["", "../../x", "a b", "x=y"] {
            spec.term = Some(bad.into());
            assert!(spec.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn environment_is_built_by_clear_unset_then_set() {
        let mut spec = StartSpec::new(["env"]);
        spec.env.clear = true;
        spec.env.set = vec![
            ("A".into(), "1".into()),
            ("B".into(), "2".into()),
            ("A".into(), "3".into()),
        ];
        spec.env.unset = vec!["B".into()];
        let mut env = child_env(&spec);
        env.sort();
        assert_eq!(
            env,
            vec![("A".into(), "3".into()), ("B".into(), "2".into())]
        );

        let mut inherit = StartSpec::new(["env"]);
        inherit.env.unset = vec!["PATH".into()];
        assert!(child_env(&inherit).iter().all(|(name, _)| name != "PATH"));
    }
}
