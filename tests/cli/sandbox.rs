//! `capexec run --sandbox` and the limit flags, `capexec serve`'s policy
//! equivalents, and what a server killed with SIGKILL leaves behind
//! (nothing).

use crate::common;

use common::cli::{Finished, Served, capexec, finish, spawn_reading_first_line, text};
use common::data::TempDir;

fn one_line(stderr: &[u8], starts: &str) {
    let stderr = text(stderr);
    assert!(
        stderr.starts_with(starts) && stderr.ends_with('\n') && stderr.lines().count() == 1,
        "expected one line starting {starts:?}, got {stderr:?}"
    );
}

#[test]
fn a_sandboxed_run_writes_only_where_it_may() {
    let cwd = TempDir::new("cli-sandbox");
    let other = TempDir::new("cli-sandbox-other");
    let script = format!(
        "echo in > f && cat f; echo out > {}/f 2>/dev/null || echo refused",
        other.path().display()
    );
    let cwd_arg = cwd.path().display().to_string();
    let other_arg = other.path().display().to_string();
    // --writable implies --sandbox and adds a root.
    for (flags, printed) in [
        (vec!["--sandbox"], "in\nrefused\n"),
        (vec!["--writable", &other_arg], "in\n"),
    ] {
        let mut args = vec!["run"];
        args.extend(flags);
        args.extend(["--cwd", &cwd_arg, "-n", "--", "sh", "-c", &script]);
        let done = finish(capexec(&args), None);
        assert_eq!(
            (done.code, text(&done.stdout)),
            (0, printed.to_string()),
            "{}",
            text(&done.stderr)
        );
    }
}

#[test]
fn a_sandboxed_run_makes_namespaces_only_with_allow_namespaces() {
    let cwd = TempDir::new("cli-sandbox");
    let cwd_arg = cwd.path().display().to_string();
    // --allow-namespaces implies --sandbox (the mount namespace is still
    // refused its mounts by Landlock).
    for (flag, code, stderr) in [
        (
            "--sandbox",
            1,
            "unshare: unshare failed: Operation not permitted\n",
        ),
        ("--allow-namespaces", 0, ""),
    ] {
        let done = finish(
            capexec(&[
                "run", flag, "--cwd", &cwd_arg, "-n", "--", "unshare", "-Un", "true",
            ]),
            None,
        );
        assert_eq!((done.code, text(&done.stderr)), (code, stderr.to_string()));
    }
    let done = finish(
        capexec(&[
            "run",
            "--allow-namespaces",
            "--cwd",
            &cwd_arg,
            "-n",
            "--",
            "sh",
            "-c",
            "echo > here && echo wrote; echo > /f 2>/dev/null || echo sandboxed",
        ]),
        None,
    );
    assert_eq!(
        (done.code, text(&done.stdout)),
        (0, "wrote\nsandboxed\n".to_string())
    );
}

#[test]
fn a_memory_hog_exits_137_with_a_line_saying_why() {
    let done = finish(
        capexec(&["run", "--memory", "32M", "-n", "--", "tail", "/dev/zero"]),
        None,
    );
    assert_eq!(done.code, 137);
    assert_eq!(
        text(&done.stderr),
        "capexec: the command was killed by its memory limit\n"
    );
}

/// What the server cannot enforce is refused in one line that names the
/// flag that starts the command anyway, `--best-effort`; with it the
/// command runs, and a line says what it runs without.
#[test]
fn a_sandbox_the_server_cannot_enforce_is_refused_naming_best_effort() {
    let served = Served::start_with(&["--hide-kernel-feature", "landlock"]);
    let run = |flags: &[&str]| {
        let mut args = vec!["--connect", served.unix.as_str()];
        args.extend(flags);
        args.extend(["-n", "--", "echo", "ran"]);
        finish(served.run(&args), None)
    };
    let refused = run(&["--sandbox"]);
    assert_eq!(
        (refused.code, text(&refused.stdout), text(&refused.stderr)),
        (
            125,
            String::new(),
            "capexec: sandbox: this server cannot enforce filesystem, scope-signals, \
             scope-abstract-sockets (the kernel has no Landlock (Linux 5.13, enabled in the \
             `lsm=` boot list); Landlock ABI 6 (Linux 6.12) is needed, the kernel has ABI 0); \
             bestEffort (capexec run --best-effort) starts it without them\n"
                .to_string()
        )
    );
    let relaxed = run(&["--sandbox", "--best-effort"]);
    assert_eq!(
        (relaxed.code, text(&relaxed.stdout), text(&relaxed.stderr)),
        (
            0,
            "ran\n".to_string(),
            "capexec: best effort: this server does not enforce filesystem, scope-signals, \
             scope-abstract-sockets; the command runs without them\n"
                .to_string()
        )
    );
    // Limits work without a sandbox, and need their controller.
    let served = Served::start_with(&["--hide-kernel-feature", "pids"]);
    let run = |flags: &[&str]| {
        let mut args = vec!["--connect", served.unix.as_str(), "--max-pids", "5"];
        args.extend(flags);
        args.extend(["-n", "--", "echo", "ran"]);
        finish(served.run(&args), None)
    };
    let refused = run(&[]);
    assert_eq!(
        (refused.code, text(&refused.stderr)),
        (
            125,
            "capexec: limits: this server cannot enforce limit-pids (no pids controller is \
             available to this server); bestEffort (capexec run --best-effort) starts it \
             without them\n"
                .to_string()
        )
    );
    let relaxed = run(&["--best-effort"]);
    assert_eq!(
        (relaxed.code, text(&relaxed.stdout), text(&relaxed.stderr)),
        (
            0,
            "ran\n".to_string(),
            "capexec: best effort: this server does not enforce limit-pids; the command runs \
             without them\n"
                .to_string()
        )
    );
    // Alone it relaxes nothing, and says so.
    let alone = finish(capexec(&["run", "--best-effort", "--", "true"]), None);
    assert_eq!(
        (alone.code, text(&alone.stderr)),
        (
            125,
            "capexec: --best-effort needs a sandbox (--sandbox, --read-only, --writable...) or \
             a limit (--memory, --max-pids, --cpus) to relax\n"
                .to_string()
        )
    );
}

#[test]
fn a_root_server_that_cannot_run_a_sandbox_as_nobody_refuses_it_unless_kept_root() {
    let served = Served::start_with(&["--hide-kernel-feature", "idmapped-mounts"]);
    let cwd = TempDir::new("cli-sandbox");
    let cwd_arg = cwd.path().display().to_string();
    let script = "id -u; head -c 5 /etc/shadow";
    let done = finish(
        served.run(&[
            "--connect",
            &served.unix,
            "--cwd",
            &cwd_arg,
            "--sandbox",
            "-n",
            "--",
            "sh",
            "-c",
            script,
        ]),
        None,
    );
    assert_eq!((done.code, text(&done.stdout)), (125, String::new()));
    one_line(
        &done.stderr,
        "capexec: sandbox: this server cannot enforce unprivileged-user (idmapped mounts are \
         hidden (--hide-kernel-feature idmapped-mounts); keepRoot (capexec run --keep-root) runs \
         it as root without capabilities); bestEffort (capexec run --best-effort) starts it \
         without them\n",
    );
    // Asked to stay root, it does (and reads what root reads).
    let done = finish(
        served.run(&[
            "--connect",
            &served.unix,
            "--cwd",
            &cwd_arg,
            "--keep-root",
            "-n",
            "--",
            "sh",
            "-c",
            script,
        ]),
        None,
    );
    assert_eq!(
        (done.code, text(&done.stdout)),
        (0, "0\nroot:".to_string()),
        "{}",
        text(&done.stderr)
    );
}

#[test]
fn a_sandboxed_server_narrows_every_start() {
    let allowed = TempDir::new("cli-sandbox-allowed");
    let other = TempDir::new("cli-sandbox-other");
    let allowed_arg = allowed.path().display().to_string();
    let other_arg = other.path().display().to_string();
    let served = Served::start_with(&["--writable", &allowed_arg, "--max-pids", "30"]);
    let script = format!(
        "echo a > {allowed_arg}/f && echo ok; echo b > {other_arg}/f 2>/dev/null || echo refused"
    );
    let done = finish(
        served.run(&[
            "--connect",
            &served.unix,
            "--cwd",
            &allowed_arg,
            "-n",
            "--",
            "sh",
            "-c",
            &script,
        ]),
        None,
    );
    assert_eq!(
        (done.code, text(&done.stdout)),
        (0, "ok\nrefused\n".to_string()),
        "{}",
        text(&done.stderr)
    );
    let done = finish(
        served.run(&[
            "--connect",
            &served.unix,
            "--cwd",
            &allowed_arg,
            "--writable",
            &other_arg,
            "-n",
            "--",
            "true",
        ]),
        None,
    );
    assert_eq!(done.code, 125);
    one_line(&done.stderr, "capexec: the server's --sandbox: ");
    let done = finish(
        served.run(&[
            "--connect",
            &served.unix,
            "--cwd",
            &allowed_arg,
            "--network",
            "all",
            "-n",
            "--",
            "true",
        ]),
        None,
    );
    assert_eq!(done.code, 125);
    one_line(&done.stderr, "capexec: the server's --sandbox: ");
}

/// Asks `served` for a sandboxed `cat KEY` whose read-only root is `root`.
fn read_in_a_sandbox(served: &Served, root: &std::path::Path, key: &std::path::Path) -> Finished {
    let cwd = TempDir::new("cli-sandbox-cwd");
    finish(
        served.run(&[
            "--connect",
            &served.unix,
            "--cwd",
            &cwd.path().display().to_string(),
            "--read-only",
            &root.display().to_string(),
            "-n",
            "--",
            "cat",
            &key.display().to_string(),
        ]),
        None,
    )
}

#[test]
fn no_sandbox_may_read_the_servers_tls_key() {
    // The key --tls-self-signed made and keeps.
    let served = Served::start_with(&["--tls-self-signed"]);
    let config = served.home.path().join(".config/capexec");
    let key = config.join("server-key.pem");
    assert!(key.is_file(), "{}", key.display());
    for root in [config.clone(), key.clone()] {
        let done = read_in_a_sandbox(&served, &root, &key);
        assert_eq!(done.code, 125, "{}", text(&done.stdout));
        assert_eq!(text(&done.stdout), "");
        one_line(
            &done.stderr,
            &format!(
                "capexec: sandbox: the root \"{}\" contains the private key of a capexec \
                 server's TLS certificate (\"{}\"); a sandboxed process could read it and pose \
                 as the server: choose roots that leave it out\n",
                root.display(),
                key.display()
            ),
        );
    }
    // A key of --tls-key, wherever it is.
    let dir = TempDir::new("cli-sandbox-tls");
    let authority = common::pki::Authority::new(dir.path(), "ca");
    let (cert, key) = authority.server(dir.path(), "server", &["localhost"], false);
    let served = Served::start_with(&[
        "--tls-cert",
        &cert.display().to_string(),
        "--tls-key",
        &key.display().to_string(),
    ]);
    let done = read_in_a_sandbox(&served, dir.path(), &key);
    assert_eq!(done.code, 125, "{}", text(&done.stdout));
    one_line(
        &done.stderr,
        &format!(
            "capexec: sandbox: the root \"{}\" contains the private key",
            dir.path().display()
        ),
    );
    // The certificate beside it is no secret: a root with it alone is fine.
    let done = read_in_a_sandbox(&served, &cert, &cert);
    assert_eq!(done.code, 0, "{}", text(&done.stderr));
    assert_eq!(
        done.stdout,
        std::fs::read(&cert).expect("certificate"),
        "the certificate as it is"
    );
}

#[test]
fn info_lists_what_the_server_can_enforce() {
    let served = Served::start();
    let done = finish(served.command("info", &["--connect", &served.unix]), None);
    assert_eq!(done.code, 0);
    let stdout = text(&done.stdout);
    for feature in [
        " sandbox ",
        " limits ",
        " sandbox-landlock-",
        " seccomp ",
        " cgroup-tracking ",
        " limits:memory,pids,cpu",
    ] {
        assert!(stdout.contains(feature), "{feature:?} in {stdout}");
    }
}

fn alive(pid: u32) -> bool {
    common::procfs::state(pid).is_some_and(|state| state != 'Z')
}

/// The cgroups a server with pid `server` made (in the cgroup2 hierarchy).
fn cgroups_of(server: u32) -> Vec<String> {
    let prefix = format!("capexec-{server}-");
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for line in mounts.lines().filter(|line| line.contains(" - cgroup")) {
        let point = line.split(' ').nth(4).unwrap_or("");
        let mut stack = vec![std::path::PathBuf::from(point)];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    if name.starts_with(&prefix) {
                        found.push(entry.path().display().to_string());
                    } else if stack.len() < 64 {
                        stack.push(entry.path());
                    }
                }
            }
        }
    }
    found
}

/// Waits (within the tests' patience) for what `owner` (a capexec
/// process, killed) started to be gone, `left` the pid of one of them: a
/// sentinel of its own ends them, which a loaded machine may run late.
fn nothing_left_of(owner: u32, left: u32) {
    common::wait::eventually("what the killed capexec started to be gone", || {
        let cgroups = cgroups_of(owner);
        match (alive(left), cgroups.is_empty()) {
            (false, true) => Ok(()),
            (running, _) => Err(format!(
                "pid {left} running: {running}; cgroups left: {cgroups:?}"
            )),
        }
    });
}

/// Leaves a `sleep` running in the background, prints its pid and waits.
const SLEEP_IN_THE_BACKGROUND: &str = "sleep 1000 </dev/null >/dev/null 2>&1 & echo $!; wait";

#[test]
fn a_killed_one_shot_run_leaves_nothing_behind() {
    // No server: the run's own engine tracks the command, and a SIGKILL
    // leaves no time to end it.
    let (mut run, first) = spawn_reading_first_line(capexec(&[
        "run",
        "-n",
        "--",
        "sh",
        "-c",
        SLEEP_IN_THE_BACKGROUND,
    ]));
    let left: u32 = first.trim().parse().expect("pid");
    assert!(alive(left));
    assert_eq!(
        cgroups_of(run.id()).len(),
        1,
        "one cgroup2 root, no v1 mirror"
    );
    common::cli::kill(&run, libc::SIGKILL);
    let _ = run.wait();
    nothing_left_of(run.id(), left);
}

#[test]
fn a_server_killed_with_sigkill_leaves_its_limits_cgroups_behind_neither() {
    let served = Served::start();
    let server = served.child.id();
    // A start without limits makes no v1 mirror; one with limits makes
    // those its controllers need (on hosts whose controllers are v1).
    let done = finish(
        served.run(&["--connect", &served.unix, "-n", "--", "true"]),
        None,
    );
    assert_eq!(done.code, 0, "{}", text(&done.stderr));
    assert_eq!(cgroups_of(server).len(), 1, "{:?}", cgroups_of(server));
    let (mut run, first) = spawn_reading_first_line(served.run(&[
        "--connect",
        &served.unix,
        "--max-pids",
        "50",
        "--memory",
        "64M",
        "--cpus",
        "0.5",
        "-n",
        "--",
        "sh",
        "-c",
        SLEEP_IN_THE_BACKGROUND,
    ]));
    let left: u32 = first.trim().parse().expect("pid");
    assert!(alive(left));
    common::cli::kill(&served.child, libc::SIGKILL);
    nothing_left_of(server, left);
    let _ = run.kill();
    let _ = run.wait();
}

#[test]
fn a_run_is_in_its_cgroup_with_and_without_clone_into_cgroup() {
    for extra in [&[][..], &["--hide-kernel-feature", "clone-into-cgroup"][..]] {
        let served = Served::start_with(extra);
        let (mut run, first) = spawn_reading_first_line(
            served.run_script("echo $$ $(grep '^0::' /proc/self/cgroup); exec sleep 300"),
        );
        let (pid, inside) = first.trim_end().split_once(' ').expect("two words");
        // Its own view is a cgroup namespace rooted at its leaf.
        assert_eq!(inside, "0::/", "{extra:?}");
        let memberships =
            std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("its cgroups");
        let line = memberships
            .lines()
            .find(|line| line.starts_with("0::"))
            .expect("a cgroup2 membership");
        let root = format!("/capexec-{}-", served.child.id());
        assert!(
            line.contains(&root)
                && line
                    .rsplit('/')
                    .next()
                    .is_some_and(|leaf| leaf.starts_with("p-")),
            "{extra:?}: {line:?}"
        );
        let _ = run.kill();
        let _ = run.wait();
    }
}

#[test]
fn a_server_killed_with_sigkill_leaves_nothing_behind() {
    let served = Served::start();
    let (mut run, first) = spawn_reading_first_line(
        served.run_script("setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!; exec sleep 300"),
    );
    let left: u32 = first.trim().parse().expect("pid");
    assert!(alive(left));
    let server = served.child.id();
    assert!(
        !cgroups_of(server).is_empty(),
        "the server made its cgroups"
    );
    common::cli::kill(&served.child, libc::SIGKILL);
    nothing_left_of(server, left);
    let _ = run.kill();
    let _ = run.wait();
}

/// A program found outside the sandbox's readable roots (as a pyenv shim
/// or a virtualenv's `python3` under the home directory is) is refused
/// with the file as resolved and the flag that adds its directory, not
/// the kernel's bare "Permission denied"; so is a script whose `#!`
/// interpreter lies outside. With the directory added, both run.
#[test]
fn a_program_outside_the_sandbox_says_which_directory_to_add() {
    use std::os::unix::fs::PermissionsExt;
    let outside = TempDir::new("cli-sandbox-tools");
    let cwd = TempDir::new("cli-sandbox-cwd");
    let tools = std::fs::canonicalize(outside.path()).expect("tools");
    let cwd_path = std::fs::canonicalize(cwd.path()).expect("cwd");
    let executable = |path: &std::path::Path, text: &str| {
        std::fs::write(path, text).expect("write");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    };
    executable(&tools.join("hello"), "#!/bin/sh\necho hello\n");
    executable(
        &tools.join("interp"),
        "#!/bin/sh\necho interpreted \"$1\"\n",
    );
    let script = cwd_path.join("script");
    executable(&script, &format!("#!{}\n", tools.join("interp").display()));
    let path_var = format!("{}:/usr/bin:/bin", tools.display());
    let cwd_arg = cwd_path.display().to_string();
    let tools_arg = tools.display().to_string();
    let hint = format!(
        "is outside the sandbox's readable roots (add its directory with --read-only {})\n",
        tools.display()
    );
    let run = |flags: &[&str], program: &str| {
        let mut args = vec!["run", "--cwd", &cwd_arg];
        args.extend(flags);
        args.extend(["-n", "--", program]);
        let mut command = capexec(&args);
        command.env("PATH", &path_var).env_remove("CAPEXEC_CONNECT");
        finish(command, None)
    };

    let found = run(&["--sandbox"], "hello");
    assert_eq!(
        (found.code, text(&found.stderr)),
        (
            126,
            format!(
                "capexec: cannot execute hello: {}/hello {hint}",
                tools.display()
            )
        )
    );
    let interpreted = run(&["--sandbox"], "./script");
    assert_eq!(
        (interpreted.code, text(&interpreted.stderr)),
        (
            126,
            format!(
                "capexec: cannot execute ./script: its interpreter {}/interp (on its #! line) \
                 {hint}",
                tools.display()
            )
        )
    );
    let added = run(&["--read-only", &tools_arg], "hello");
    assert_eq!(
        (added.code, text(&added.stdout), text(&added.stderr)),
        (0, "hello\n".to_string(), String::new())
    );
    let added = run(&["--read-only", &tools_arg], "./script");
    assert_eq!(
        (added.code, text(&added.stdout), text(&added.stderr)),
        (
            0,
            format!("interpreted {}/./script\n", cwd_path.display()),
            String::new()
        )
    );

    // The same through a server: the refusal crosses the wire with its tag.
    let served = Served::start();
    let program = tools.join("hello").display().to_string();
    let done = finish(
        served.run(&[
            "--connect",
            &served.unix,
            "--sandbox",
            "--cwd",
            &cwd_arg,
            "-n",
            "--",
            &program,
        ]),
        None,
    );
    assert_eq!(
        (done.code, text(&done.stderr)),
        (
            126,
            format!("capexec: cannot execute {program}: {program} {hint}")
        )
    );
}

/// `capexec run --sandbox -- python3` where python3 is a pyenv shim: the
/// shim runs `PYENV_ROOT/libexec/pyenv`, which runs a Python of
/// `PYENV_ROOT/versions`, which loads its libraries from beside its `bin`.
/// The refusal names the directory that makes it all run (the manager's),
/// not the shim's own, which would only move the failure to a bare
/// "Permission denied" from bash; a Python of the manager named directly
/// asks for its installation, and one run from a virtualenv for the
/// virtualenv.
#[test]
fn a_sandboxed_pyenv_shim_asks_for_the_directory_that_makes_it_run() {
    use std::os::unix::fs::PermissionsExt;
    let home = TempDir::new("cli-sandbox-pyenv");
    let cwd = TempDir::new("cli-sandbox-cwd");
    let home_path = std::fs::canonicalize(home.path()).expect("home");
    let root = home_path.join(".pyenv");
    let executable = |path: &std::path::Path, text: &str| {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    };
    // As pyenv writes them: the shim execs the manager, the manager the
    // version's program, which reads its library.
    let python = root.join("versions/3.12.1/bin/python3");
    let library = root.join("versions/3.12.1/lib/python3.12/os.py");
    executable(&library, "");
    std::fs::write(&library, "stdlib\n").expect("library");
    executable(&python, &format!("#!/bin/sh\ncat {}\n", library.display()));
    executable(
        &root.join("libexec/pyenv"),
        &format!(
            "#!/bin/sh\nshift\nexec {}/versions/3.12.1/bin/\"$@\"\n",
            root.display()
        ),
    );
    executable(
        &root.join("shims/python3"),
        &format!(
            "#!/bin/sh\nexport PYENV_ROOT=\"{root}\"\nexec \"{root}/libexec/pyenv\" exec \
             python3 \"$@\"\n",
            root = root.display()
        ),
    );
    let virtualenv = home_path.join("venv");
    std::fs::create_dir_all(virtualenv.join("bin")).expect("venv");
    std::fs::write(virtualenv.join("pyvenv.cfg"), "home = /usr/bin\n").expect("cfg");
    std::os::unix::fs::symlink("/bin/sh", virtualenv.join("bin/python3")).expect("link");

    let cwd_arg = cwd.path().display().to_string();
    let run = |path_var: &str, flags: &[&str], program: &str| {
        let mut args = vec!["run", "--cwd", &cwd_arg, "--sandbox"];
        args.extend(flags);
        args.extend(["-n", "--", program, "-c", "exit 7"]);
        let mut command = capexec(&args);
        command.env("PATH", path_var).env_remove("CAPEXEC_CONNECT");
        finish(command, None)
    };
    let shims = format!("{}/shims:/usr/bin:/bin", root.display());
    let shimmed = run(&shims, &[], "python3");
    assert_eq!(
        (shimmed.code, text(&shimmed.stderr)),
        (
            126,
            format!(
                "capexec: cannot execute python3: {root}/shims/python3 is outside the sandbox's \
                 readable roots (a version manager's shim: add the manager's directory with \
                 --read-only {root})\n",
                root = root.display()
            )
        )
    );
    let root_arg = root.display().to_string();
    let admitted = run(&shims, &["--read-only", &root_arg], "python3");
    assert_eq!(
        (
            admitted.code,
            text(&admitted.stdout),
            text(&admitted.stderr)
        ),
        (0, "stdlib\n".to_string(), String::new())
    );

    let installation = root.join("versions/3.12.1");
    let direct = python.display().to_string();
    let named = run("/usr/bin:/bin", &[], &direct);
    assert_eq!(
        (named.code, text(&named.stderr)),
        (
            126,
            format!(
                "capexec: cannot execute {direct}: {direct} is outside the sandbox's readable \
                 roots (add the installation it belongs to with --read-only {})\n",
                installation.display()
            )
        )
    );
    let installation_arg = installation.display().to_string();
    let admitted = run(
        "/usr/bin:/bin",
        &["--read-only", &installation_arg],
        &direct,
    );
    assert_eq!(
        (
            admitted.code,
            text(&admitted.stdout),
            text(&admitted.stderr)
        ),
        (0, "stdlib\n".to_string(), String::new())
    );

    let venv_path = format!("{}/bin:/usr/bin:/bin", virtualenv.display());
    let in_venv = run(&venv_path, &[], "python3");
    assert_eq!(
        (in_venv.code, text(&in_venv.stderr)),
        (
            126,
            format!(
                "capexec: cannot execute python3: {venv}/bin/python3 is outside the sandbox's \
                 readable roots (in a virtualenv: add the virtualenv with --read-only {venv})\n",
                venv = virtualenv.display()
            )
        )
    );
    let venv_arg = virtualenv.display().to_string();
    let admitted = run(&venv_path, &["--read-only", &venv_arg], "python3");
    assert_eq!(admitted.code, 7, "{}", text(&admitted.stderr));
}
