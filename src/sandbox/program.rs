//! A sandboxed start's program, checked in the parent against the roots
//! Landlock will confine the child to: the program as resolved and the
//! interpreters of its `#!` lines must lie in them, or the kernel refuses
//! the exec with a bare "Permission denied" that says nothing of why (a
//! `python3` that is a pyenv shim or a virtualenv's, under the home
//! directory). The refusal names the file and the directory to add: the
//! one that makes the program run, not only start (a version manager's
//! shim runs programs kept above it; a program in an installation's `bin`
//! loads its libraries from beside it; a virtualenv's `python` is one only
//! where it reads the virtualenv).

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::roots::{self, Root};
use crate::model::{Refusal, RefusalKind, excerpt};

/// How many `#!` lines the kernel follows (an interpreter that is itself a
/// script), and so this check.
const MAX_INTERPRETERS: usize = 4;

/// What the kernel reads of a file to find its `#!` line.
const SHEBANG_BYTES: u64 = 256;

/// The words between what to add and the directory at the end of the
/// refusal ("(add its directory as a read-only root: DIR)"), which
/// `capexec run` turns into the flag that adds it.
pub const AS_READ_ONLY_ROOT: &str = " as a read-only root: ";

/// Refuses `program` (`name` as the start gave it, resolved) if it, or an
/// interpreter of its `#!` lines, is outside `roots`.
pub(crate) fn check(roots: &[Root], name: &OsStr, program: &Path) -> Result<(), Refusal> {
    if let Some(virtualenv) = virtualenv_of(program)
        && !roots::readable(roots, &virtualenv)
    {
        return Err(refused(
            name,
            &program.display().to_string(),
            &format!("(in a virtualenv: add the virtualenv{AS_READ_ONLY_ROOT}"),
            &virtualenv,
        ));
    }
    let mut file = program.to_path_buf();
    let mut script: Option<PathBuf> = None;
    for _ in 0..=MAX_INTERPRETERS {
        // What does not resolve is left to the exec to report.
        let Ok(real) = std::fs::canonicalize(&file) else {
            return Ok(());
        };
        if !roots::readable(roots, &real) {
            return Err(outside(name, &file, &real, script.as_deref(), program));
        }
        let Some(interpreter) = interpreter_of(&real) else {
            return Ok(());
        };
        script = Some(file);
        file = interpreter;
    }
    Ok(())
}

/// The absolute interpreter on `file`'s `#!` line, if it has one.
fn interpreter_of(file: &Path) -> Option<PathBuf> {
    let opened = crate::local_file::open_regular_file(file).ok()?;
    let mut start = Vec::with_capacity(SHEBANG_BYTES as usize);
    opened.take(SHEBANG_BYTES).read_to_end(&mut start).ok()?;
    let line = start.strip_prefix(b"#!")?;
    let line = line.split(|&b| b == b'\n').next()?;
    let interpreter = line
        .split(|&b| b == b' ' || b == b'\t')
        .find(|word| !word.is_empty())?;
    let interpreter = Path::new(OsStr::from_bytes(interpreter));
    interpreter.is_absolute().then(|| interpreter.to_path_buf())
}

/// The virtualenv `program` is the `python` of, as named (its links not
/// followed: a virtualenv's `python` is a link to its base interpreter,
/// and is a virtualenv's only because `pyvenv.cfg` lies above it).
fn virtualenv_of(program: &Path) -> Option<PathBuf> {
    let bin = std::path::absolute(program).ok()?.parent()?.to_path_buf();
    let root = bin.parent()?;
    (bin.file_name()? == "bin" && root.join("pyvenv.cfg").is_file())
        .then(|| std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf()))
}

/// What to add so that `real` runs, and the directory: a version manager's
/// shim (`MANAGER/shims/NAME`, as pyenv, rbenv, nodenv, asdf and mise
/// make them) runs the manager's programs and versions, kept under
/// MANAGER; a program in an installation's `bin` beside its `lib` (a
/// Python of pyenv's, `/opt/tool`, `~/.local`) loads its libraries from
/// there; anything else needs its own directory.
fn admitting(real: &Path) -> (&'static str, PathBuf) {
    let directory = real.parent().unwrap_or(Path::new("/"));
    let above = directory.parent().filter(|above| above.parent().is_some());
    match (directory.file_name(), above) {
        (Some(name), Some(manager)) if name == "shims" => (
            "(a version manager's shim: add the manager's directory",
            manager.to_path_buf(),
        ),
        (Some(name), Some(installation)) if name == "bin" && installation.join("lib").is_dir() => (
            "(add the installation it belongs to",
            installation.to_path_buf(),
        ),
        _ => ("(add its directory", directory.to_path_buf()),
    }
}

fn outside(
    name: &OsStr,
    file: &Path,
    real: &Path,
    script: Option<&Path>,
    program: &Path,
) -> Refusal {
    let what = if real == file {
        file.display().to_string()
    } else {
        format!("{} (a link to {})", file.display(), real.display())
    };
    let what = match script {
        None => what,
        Some(script) if script == program => format!("its interpreter {what} (on its #! line)"),
        Some(script) => format!(
            "its interpreter {what} (on the #! line of {})",
            script.display()
        ),
    };
    let (add, directory) = admitting(real);
    refused(
        name,
        &what,
        &format!("{add}{AS_READ_ONLY_ROOT}"),
        &directory,
    )
}

/// "cannot execute NAME: WHAT is outside the sandbox's readable roots
/// (ADD as a read-only root: DIRECTORY)".
fn refused(name: &OsStr, what: &str, add: &str, directory: &Path) -> Refusal {
    Refusal::new(
        RefusalKind::PermissionDenied,
        format!(
            "cannot execute {}: {what} is outside the sandbox's readable roots {add}{})",
            excerpt(&name.to_string_lossy()),
            directory.display()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::roots::{Access, Origin};
    use std::os::unix::fs::PermissionsExt;

    fn root(path: &Path) -> Root {
        Root {
            path: path.to_path_buf(),
            access: Access::Read,
            origin: Origin::Asked,
        }
    }

    fn executable(path: &Path, text: &str) {
        std::fs::write(path, text).expect("write");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }

    #[test]
    fn a_program_and_its_interpreters_must_lie_in_the_roots() {
        let base = std::env::temp_dir().join(format!("capexec-program-{}", std::process::id()));
        let inside = base.join("inside");
        let outside_dir = base.join("outside");
        std::fs::create_dir_all(&inside).expect("inside");
        std::fs::create_dir_all(&outside_dir).expect("outside");
        let (inside, outside_dir) = (
            std::fs::canonicalize(&inside).expect("inside"),
            std::fs::canonicalize(&outside_dir).expect("outside"),
        );
        let roots = [
            root(&inside),
            root(Path::new("/usr")),
            root(Path::new("/bin")),
        ];

        let tool = outside_dir.join("tool");
        executable(&tool, "#!/bin/sh\n");
        assert_eq!(
            check(&roots, OsStr::new("tool"), &tool)
                .expect_err("outside")
                .message,
            format!(
                "cannot execute tool: {} is outside the sandbox's readable roots (add its \
                 directory as a read-only root: {})",
                tool.display(),
                outside_dir.display()
            )
        );

        let script = inside.join("script");
        executable(&script, &format!("#! {} -x\necho\n", tool.display()));
        assert_eq!(
            check(&roots, OsStr::new("script"), &script)
                .expect_err("interpreter outside")
                .message,
            format!(
                "cannot execute script: its interpreter {} (on its #! line) is outside the \
                 sandbox's readable roots (add its directory as a read-only root: {})",
                tool.display(),
                outside_dir.display()
            )
        );

        let link = inside.join("link");
        std::os::unix::fs::symlink(&tool, &link).expect("symlink");
        let refused = check(&roots, OsStr::new("link"), &link).expect_err("a link out");
        assert!(
            refused.message.contains(&format!(
                "{} (a link to {}) is outside",
                link.display(),
                tool.display()
            )),
            "{}",
            refused.message
        );

        // A version manager's shim: the manager's directory, which holds
        // what the shim runs.
        let manager = outside_dir.join(".pyenv");
        std::fs::create_dir_all(manager.join("shims")).expect("shims");
        let shim = manager.join("shims/python3");
        executable(&shim, "#!/bin/sh\n");
        assert_eq!(
            check(&roots, OsStr::new("python3"), &shim)
                .expect_err("a shim")
                .message,
            format!(
                "cannot execute python3: {} is outside the sandbox's readable roots (a version \
                 manager's shim: add the manager's directory as a read-only root: {})",
                shim.display(),
                manager.display()
            )
        );

        // A program in an installation's bin, beside its lib: the
        // installation.
        let installation = manager.join("versions/3.12.1");
        std::fs::create_dir_all(installation.join("bin")).expect("bin");
        std::fs::create_dir_all(installation.join("lib")).expect("lib");
        let python = installation.join("bin/python3");
        executable(&python, "");
        assert_eq!(
            check(&roots, OsStr::new("python3"), &python)
                .expect_err("an installation")
                .message,
            format!(
                "cannot execute python3: {} is outside the sandbox's readable roots (add the \
                 installation it belongs to as a read-only root: {})",
                python.display(),
                installation.display()
            )
        );

        // A virtualenv's python, a link into the roots: the virtualenv,
        // without which it would run as a plain python.
        let virtualenv = outside_dir.join("venv");
        std::fs::create_dir_all(virtualenv.join("bin")).expect("venv");
        std::fs::write(virtualenv.join("pyvenv.cfg"), "home = /usr/bin\n").expect("cfg");
        let venv_python = virtualenv.join("bin/python3");
        std::os::unix::fs::symlink("/bin/sh", &venv_python).expect("symlink");
        assert_eq!(
            check(&roots, OsStr::new("python3"), &venv_python)
                .expect_err("a virtualenv")
                .message,
            format!(
                "cannot execute python3: {} is outside the sandbox's readable roots (in a \
                 virtualenv: add the virtualenv as a read-only root: {})",
                venv_python.display(),
                virtualenv.display()
            )
        );
        check(
            &[root(&virtualenv), roots[1].clone(), roots[2].clone()],
            OsStr::new("python3"),
            &venv_python,
        )
        .expect("the virtualenv a root");

        let fine = inside.join("fine");
        executable(&fine, "#!/bin/sh\necho\n");
        check(&roots, OsStr::new("fine"), &fine).expect("inside, /bin/sh too");
        let _ = std::fs::remove_dir_all(&base);
    }
}
