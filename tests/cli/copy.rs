//! `capexec cp`: trees both ways (byte-exact, symlinks as symlinks, `-p`
//! keeping modes and times), stdin and stdout, several sources, and the
//! exit codes and lines of failures.

use crate::common;

use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;

use common::cli::{Served, finish, text};
use common::data::{Pattern, TempDir};

fn cp(served: &Served, args: &[&str], stdin: Option<Vec<u8>>) -> common::cli::Finished {
    let mut all = vec!["--connect", served.unix.as_str()];
    all.extend(args);
    finish(served.command("cp", &all), stdin)
}

fn arg(path: &Path) -> String {
    path.display().to_string()
}

fn remote(path: &Path) -> String {
    format!(":{}", path.display())
}

/// A tree with a large binary file, small ones, an empty directory, a
/// symlink and unusual modes and times.
fn make_tree(root: &Path) {
    std::fs::create_dir_all(root.join("sub/empty")).expect("mkdir");
    std::fs::write(root.join("small"), b"hello\n").expect("write");
    std::fs::write(root.join("sub/big"), Pattern::bytes(5, 9_000_000)).expect("write");
    std::fs::set_permissions(root.join("sub/big"), std::fs::Permissions::from_mode(0o751))
        .expect("chmod");
    symlink("../small", root.join("sub/link")).expect("symlink");
    let old = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    std::fs::File::open(root.join("small"))
        .expect("open")
        .set_modified(old)
        .expect("mtime");
}

fn assert_same_tree(from: &Path, to: &Path, preserved: bool) {
    assert_eq!(
        std::fs::read(from.join("small")).expect("read"),
        std::fs::read(to.join("small")).expect("read")
    );
    assert_eq!(
        std::fs::read(from.join("sub/big")).expect("read"),
        std::fs::read(to.join("sub/big")).expect("read")
    );
    assert!(to.join("sub/empty").is_dir());
    assert_eq!(
        std::fs::read_link(to.join("sub/link")).expect("a symlink"),
        Path::new("../small")
    );
    let mode = |path: &Path| std::fs::metadata(path).expect("stat").mode() & 0o7777;
    assert_eq!(mode(&to.join("sub/big")), 0o751);
    let mtime = |path: &Path| std::fs::metadata(path).expect("stat").mtime();
    if preserved {
        assert_eq!(mtime(&to.join("small")), 1_000_000_000);
    } else {
        assert_ne!(mtime(&to.join("small")), 1_000_000_000);
    }
}

#[test]
fn cp_copies_trees_both_ways_byte_exact() {
    let served = Served::start();
    let work = TempDir::new("cli-cp-tree");
    let source = work.path().join("source");
    make_tree(&source);
    let up = work.path().join("up");
    let done = cp(&served, &["-r", "-p", &arg(&source), &remote(&up)], None);
    assert_eq!((done.code, text(&done.stderr)), (0, String::new()));
    assert_same_tree(&source, &up, true);
    let down = work.path().join("down");
    let done = cp(&served, &["-r", "-p", &remote(&up), &arg(&down)], None);
    assert_eq!((done.code, text(&done.stderr)), (0, String::new()));
    assert_same_tree(&source, &down, true);
    // Without -p, modification times are the copy's own.
    let plain = work.path().join("plain");
    let done = cp(&served, &["-r", &arg(&source), &remote(&plain)], None);
    assert_eq!(done.code, 0, "{}", text(&done.stderr));
    assert_same_tree(&source, &plain, false);
    // Into an existing directory, under the source's own name.
    let done = cp(&served, &["-r", &arg(&source), &remote(&plain)], None);
    assert_eq!(done.code, 0, "{}", text(&done.stderr));
    assert_same_tree(&source, &plain.join("source"), false);
}

#[test]
fn cp_streams_stdin_and_stdout() {
    let served = Served::start();
    let work = TempDir::new("cli-cp-stdio");
    let data = Pattern::bytes(9, 5_000_000);
    let file = work.path().join("from-stdin");
    let done = cp(&served, &["-", &remote(&file)], Some(data.clone()));
    assert_eq!((done.code, text(&done.stderr)), (0, String::new()));
    assert_eq!(std::fs::read(&file).expect("read"), data);
    let done = cp(&served, &[&remote(&file), "-"], None);
    assert_eq!(done.code, 0, "{}", text(&done.stderr));
    assert_eq!(done.stdout, data);
}

#[test]
fn cp_works_over_tcp_with_a_token_and_through_an_environment() {
    let served = Served::start();
    let work = TempDir::new("cli-cp-tcp");
    std::fs::write(work.path().join("a"), b"over tcp").expect("write");
    let token = served.token_arg();
    let copy = work.path().join("copy");
    let args = [
        "--connect",
        served.tcp.as_str(),
        "--token-file",
        &token,
        "--environment",
        "local",
    ];
    let mut up = args.to_vec();
    let (from, to) = (arg(&work.path().join("a")), remote(&copy));
    up.extend([from.as_str(), to.as_str()]);
    let done = finish(served.command("cp", &up), None);
    assert_eq!((done.code, text(&done.stderr)), (0, String::new()));
    assert_eq!(std::fs::read(&copy).expect("read"), b"over tcp");
    let mut down = args.to_vec();
    down.extend([to.as_str(), "-"]);
    let done = finish(served.command("cp", &down), None);
    assert_eq!((done.code, done.stdout), (0, b"over tcp".to_vec()));
}

#[test]
fn cp_copies_several_sources_into_a_directory() {
    let served = Served::start();
    let work = TempDir::new("cli-cp-several");
    for name in ["a", "b"] {
        std::fs::write(work.path().join(name), name).expect("write");
    }
    let dest = work.path().join("dest");
    std::fs::create_dir(&dest).expect("mkdir");
    let done = cp(
        &served,
        &[
            &arg(&work.path().join("a")),
            &arg(&work.path().join("b")),
            &remote(&dest),
        ],
        None,
    );
    assert_eq!(done.code, 0, "{}", text(&done.stderr));
    assert_eq!(std::fs::read(dest.join("a")).expect("a"), b"a");
    assert_eq!(std::fs::read(dest.join("b")).expect("b"), b"b");
}

#[test]
fn cp_says_what_failed_one_line_each_and_exits_1() {
    let served = Served::start();
    let work = TempDir::new("cli-cp-fail");
    std::fs::create_dir(work.path().join("dir")).expect("mkdir");
    std::fs::write(work.path().join("ok"), b"ok").expect("write");
    let missing = work.path().join("missing");
    let dir = work.path().join("dir");
    let dest = work.path().join("dest");
    std::fs::create_dir(&dest).expect("mkdir");
    let done = cp(
        &served,
        &[
            &arg(&missing),
            &arg(&dir),
            &arg(&work.path().join("ok")),
            &remote(&dest),
        ],
        None,
    );
    assert_eq!(done.code, 1);
    assert_eq!(
        text(&done.stderr),
        format!(
            "capexec: cp {}: no such file or directory\ncapexec: cp {}: is a directory (use -r)\n",
            missing.display(),
            dir.display()
        )
    );
    // What could be copied was.
    assert_eq!(std::fs::read(dest.join("ok")).expect("ok"), b"ok");
    let done = cp(&served, &[&remote(&missing), &arg(&dest)], None);
    assert_eq!(done.code, 1);
    assert_eq!(
        text(&done.stderr),
        format!(
            "capexec: cp :{}: stat \"missing\": not found\n",
            missing.display()
        )
    );
}

#[test]
fn cp_refuses_bad_arguments_with_125() {
    let served = Served::start();
    for (args, line) in [
        (
            vec!["a"],
            "capexec: cp needs a source and a destination (capexec cp [-r] [-p] SRC... DST)\n",
        ),
        (
            vec!["a", "b"],
            "capexec: cp copies between this machine and the executor's: the sources on one \
             side, the destination on the other, remote paths written :PATH\n",
        ),
        (
            vec![":a", ":b"],
            "capexec: cp copies between this machine and the executor's: the sources on one \
             side, the destination on the other, remote paths written :PATH\n",
        ),
        (
            vec!["-", "a", ":b"],
            "capexec: cp with - (stdin or stdout) copies exactly one file\n",
        ),
    ] {
        let done = cp(&served, &args, None);
        assert_eq!(
            (done.code, text(&done.stderr).as_str()),
            (125, line),
            "{args:?}"
        );
    }
}

#[test]
fn cp_says_which_files_of_a_batch_failed_and_copies_the_others() {
    let served = Served::start();
    let work = TempDir::new("cli-cp-batch");
    let tree = work.path().join("t");
    std::fs::create_dir(&tree).expect("mkdir");
    for name in ["a", "b", "c"] {
        std::fs::write(tree.join(name), name).expect("write");
    }
    // Where b goes there is a directory: b fails, a and c are copied.
    let dest = work.path().join("dest");
    std::fs::create_dir_all(dest.join("t/b/inside")).expect("mkdir");
    let done = cp(&served, &["-r", &arg(&tree), &remote(&dest)], None);
    assert_eq!(done.code, 1);
    assert_eq!(
        text(&done.stderr),
        format!(
            "capexec: cp {}: write \"t/b\": is a directory\n",
            tree.join("b").display()
        )
    );
    assert_eq!(std::fs::read(dest.join("t/a")).expect("a"), b"a");
    assert_eq!(std::fs::read(dest.join("t/c")).expect("c"), b"c");
    assert!(dest.join("t/b/inside").is_dir());
}

#[test]
fn cp_refuses_when_the_server_cannot_confine_paths() {
    let served = Served::start_with(&["--hide-kernel-feature", "openat2"]);
    let work = TempDir::new("cli-cp-openat2");
    std::fs::write(work.path().join("file"), b"x").expect("write");
    let line = "this kernel has no openat2 (Linux 5.6 or later), so paths could not be confined \
                beneath a directory; directories are not offered";
    let dest = work.path().join("dest");
    let done = cp(
        &served,
        &[&arg(&work.path().join("file")), &remote(&dest)],
        None,
    );
    assert_eq!(
        (done.code, text(&done.stderr)),
        (
            1,
            format!(
                "capexec: cp {}: {line}\n",
                work.path().join("file").display()
            )
        )
    );
    let done = cp(
        &served,
        &[&remote(&work.path().join("file")), &arg(&dest)],
        None,
    );
    assert_eq!(
        (done.code, text(&done.stderr)),
        (
            1,
            format!(
                "capexec: cp :{}: {line}\n",
                work.path().join("file").display()
            )
        )
    );
    assert!(!dest.exists(), "nothing was copied");
}

/// On a terminal, a copy still running after a second shows how far it
/// got on stderr, and clears it when done; what was copied is exact.
#[test]
fn cp_shows_its_progress_on_a_terminal_and_clears_it() {
    use std::io::{Read, Write};
    let served = Served::start();
    let work = TempDir::new("cli-cp-progress");
    let dest = work.path().join("from-stdin");
    let pty = nix::pty::openpty(None, None).expect("openpty");
    for fd in [&pty.master, &pty.slave] {
        // Not inherited by the children of other tests running meanwhile.
        nix::fcntl::fcntl(
            fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .expect("close-on-exec");
    }
    let mut command = served.command("cp", &["--connect", &served.unix, "-", &remote(&dest)]);
    command
        .env("TERM", "xterm")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(pty.slave));
    let mut child = command.spawn().expect("spawn capexec cp");
    drop(command);
    let (shown, seen) = std::sync::mpsc::channel();
    let mut terminal = std::fs::File::from(pty.master);
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = terminal.read(&mut buf) {
            if n == 0 || shown.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    // The copy waits for its stdin: it is running until the test ends it.
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(b"first part, ").expect("write");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut output = Vec::new();
    let wait_for = |output: &mut Vec<u8>, done: &dyn Fn(&str) -> bool| {
        while !done(&text(output)) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match seen.recv_timeout(left) {
                Ok(bytes) => output.extend(bytes),
                Err(_) => panic!("the terminal shows {:?}", text(output)),
            }
        }
    };
    wait_for(&mut output, &|shown| shown.contains("files copied"));
    assert!(
        text(&output).contains("0 files copied ("),
        "{:?}",
        text(&output)
    );
    stdin.write_all(b"second part").expect("write");
    drop(stdin);
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(0));
    assert_eq!(
        std::fs::read(&dest).expect("uploaded"),
        b"first part, second part"
    );
    // Cleared: after the last drawing of the line comes its erasure.
    wait_for(&mut output, &|shown| {
        shown
            .rfind("files copied")
            .is_some_and(|last| shown[last..].contains("\x1b[2K"))
    });
}

/// Every file, directory and symlink beneath `root`, by relative path:
/// its kind and contents (a file's bytes, a link's target).
fn tree_of(root: &Path) -> std::collections::BTreeMap<std::path::PathBuf, (char, Vec<u8>)> {
    let mut found = std::collections::BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read_dir") {
            let path = entry.expect("entry").path();
            let relative = path.strip_prefix(root).expect("beneath").to_path_buf();
            let kind = std::fs::symlink_metadata(&path).expect("lstat").file_type();
            let described = if kind.is_symlink() {
                let target = std::fs::read_link(&path).expect("readlink");
                ('l', target.into_os_string().into_encoded_bytes())
            } else if kind.is_dir() {
                stack.push(path.clone());
                ('d', Vec::new())
            } else {
                ('f', std::fs::read(&path).expect("read"))
            };
            found.insert(relative, described);
        }
    }
    found
}

/// The shapes of tree a copy must carry whole: only empty files, only
/// small ones (nested), one file, thousands of small files, a mix of
/// sizes with links and an empty directory, a deep one.
fn shapes(root: &Path) -> Vec<(&'static str, std::path::PathBuf)> {
    let made = |name: &'static str, fill: &dyn Fn(&Path)| {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).expect("mkdir");
        fill(&dir);
        (name, dir)
    };
    vec![
        made("empty-files", &|dir| {
            for n in 0..20 {
                std::fs::write(dir.join(format!("e{n}")), b"").expect("write");
            }
        }),
        made("small-files", &|dir| {
            for n in 0..53 {
                let sub = dir.join(format!("d{}", n % 5)).join(format!("s{}", n % 3));
                std::fs::create_dir_all(&sub).expect("mkdir");
                std::fs::write(sub.join(format!("f{n}")), format!("{n}\n")).expect("write");
            }
        }),
        made("one-file", &|dir| {
            std::fs::write(dir.join("only"), b"one\n").expect("write");
        }),
        made("thousands", &|dir| {
            for n in 0..3000 {
                let sub = dir.join(format!("{}", n % 30));
                std::fs::create_dir_all(&sub).expect("mkdir");
                std::fs::write(
                    sub.join(format!("{n}")),
                    Pattern::bytes(n, n as usize % 700),
                )
                .expect("write");
            }
        }),
        made("mixed", &|dir| {
            std::fs::create_dir_all(dir.join("a/empty")).expect("mkdir");
            std::fs::write(dir.join("a/tiny"), b"t").expect("write");
            std::fs::write(dir.join("a/mid"), Pattern::bytes(1, 70_000)).expect("write");
            std::fs::write(dir.join("big"), Pattern::bytes(2, 3_000_000)).expect("write");
            symlink("a/tiny", dir.join("link")).expect("symlink");
        }),
        made("deep", &|dir| {
            let mut deep = dir.to_path_buf();
            for level in 0..40 {
                deep.push(format!("l{level}"));
                std::fs::create_dir_all(&deep).expect("mkdir");
                std::fs::write(deep.join("f"), format!("level {level}\n")).expect("write");
            }
        }),
    ]
}

/// Every shape, both ways, through the embedded executor and a server's
/// socket, arrives byte for byte: a recursive download of small files only
/// used to create the directories, write no file and exit 0.
#[test]
fn cp_carries_every_shape_of_tree_whole_both_ways() {
    let served = Served::start();
    let work = TempDir::new("cli-cp-shapes");
    let sources = shapes(&work.path().join("sources"));
    for (connect, through) in [(Some(served.unix.as_str()), "unix"), (None, "embedded")] {
        for (name, source) in &sources {
            let expected = tree_of(source);
            let run = |args: &[&str]| {
                let mut all = Vec::new();
                if let Some(address) = connect {
                    all.extend(["--connect", address]);
                }
                all.extend(args);
                finish(served.command("cp", &all), None)
            };
            let up = work.path().join(format!("up-{through}-{name}"));
            let done = run(&["-r", &arg(source), &remote(&up)]);
            assert_eq!(
                (done.code, text(&done.stderr)),
                (0, String::new()),
                "{through} {name} up"
            );
            assert!(
                tree_of(&up) == expected,
                "{through} {name}: the upload differs"
            );
            let down = work.path().join(format!("down-{through}-{name}"));
            let done = run(&["-r", &remote(&up), &arg(&down)]);
            assert_eq!(
                (done.code, text(&done.stderr)),
                (0, String::new()),
                "{through} {name} down"
            );
            assert!(
                tree_of(&down) == expected,
                "{through} {name}: the download differs"
            );
        }
    }
}

/// `capexec cp ARGS` under umask `mask`, through the server at `connect`
/// (or the embedded executor, whose files this process itself makes).
fn cp_masked(
    served: &Served,
    connect: Option<&str>,
    mask: &str,
    args: &[&str],
) -> common::cli::Finished {
    let mut command = std::process::Command::new("sh");
    command
        .arg("-c")
        .arg(format!("umask {mask}; exec \"$@\""))
        .arg("sh")
        .arg(common::cli::BIN)
        .arg("cp");
    if let Some(address) = connect {
        command.args(["--connect", address]);
    }
    command.args(args).env("HOME", served.home.path());
    finish(command, None)
}

fn mode_of(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).expect("stat").mode() & 0o7777
}

/// A private character device that discards what is written (a null
/// device of our own: a bug must not change the machine's /dev/null).
fn null_device(at: &Path) {
    nix::sys::stat::mknod(
        at,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
        nix::sys::stat::makedev(1, 3),
    )
    .expect("mknod (the tests run as root)");
}

/// Without -p an existing destination keeps its mode and a new file gets
/// the source's less the umask, on either side; a device is written and
/// left as it was; with -p the source's mode is set.
#[test]
fn cp_keeps_existing_modes_and_masks_new_ones_both_ways() {
    use std::os::unix::fs::FileTypeExt;
    let served = Served::start();
    let work = TempDir::new("cli-cp-modes");
    let source = work.path().join("script");
    std::fs::write(&source, b"#!/bin/sh\necho hi\n").expect("write");
    std::fs::set_permissions(&source, std::fs::Permissions::from_mode(0o754)).expect("chmod");
    // Uploads are made by the embedded executor here: its umask counts.
    for (direction, from, to_dir) in [
        ("up", arg(&source), work.path().join("up")),
        ("down", remote(&source), work.path().join("down")),
    ] {
        std::fs::create_dir(&to_dir).expect("mkdir");
        let existing = to_dir.join("existing");
        std::fs::write(&existing, b"old").expect("write");
        std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let target = |path: &Path| {
            if direction == "up" {
                remote(path)
            } else {
                arg(path)
            }
        };
        let done = cp_masked(&served, None, "027", &[&from, &target(&existing)]);
        assert_eq!(
            (done.code, text(&done.stderr)),
            (0, String::new()),
            "{direction}"
        );
        assert_eq!(
            std::fs::read(&existing).expect("read"),
            b"#!/bin/sh\necho hi\n"
        );
        assert_eq!(
            mode_of(&existing),
            0o600,
            "{direction}: an existing file keeps its mode"
        );
        let new = to_dir.join("new");
        let done = cp_masked(&served, None, "027", &[&from, &target(&new)]);
        assert_eq!(done.code, 0, "{direction}: {}", text(&done.stderr));
        assert_eq!(
            mode_of(&new),
            0o750,
            "{direction}: the source's mode less the umask"
        );
        let preserved = to_dir.join("preserved");
        std::fs::write(&preserved, b"old").expect("write");
        std::fs::set_permissions(&preserved, std::fs::Permissions::from_mode(0o600))
            .expect("chmod");
        let done = cp_masked(&served, None, "027", &["-p", &from, &target(&preserved)]);
        assert_eq!(done.code, 0, "{direction}: {}", text(&done.stderr));
        assert_eq!(
            mode_of(&preserved),
            0o754,
            "{direction}: -p sets the source's mode"
        );
    }
    // A device as a download's destination is written and left alone.
    let device = work.path().join("null");
    null_device(&device);
    let done = cp(&served, &[&remote(&source), &arg(&device)], None);
    assert_eq!((done.code, text(&done.stderr)), (0, String::new()));
    let after = std::fs::symlink_metadata(&device).expect("still there");
    assert!(after.file_type().is_char_device());
    assert_eq!(after.mode() & 0o7777, 0o600);
    // The server never writes into a device where a file is meant.
    let done = cp(&served, &[&arg(&source), &remote(&device)], None);
    assert_eq!(done.code, 1);
    assert!(
        text(&done.stderr).contains("not a regular file (a character device)"),
        "{}",
        text(&done.stderr)
    );
    let after = std::fs::symlink_metadata(&device).expect("still there");
    assert!(after.file_type().is_char_device());
    assert_eq!(after.mode() & 0o7777, 0o600);
}

/// A symlink copied over what is there replaces only a link or a regular
/// file (in one rename); a device or a FIFO stays, and the copy says so
/// and exits 1.
#[test]
fn cp_replaces_only_links_and_files_with_a_link_both_ways() {
    use std::os::unix::fs::FileTypeExt;
    let served = Served::start();
    let work = TempDir::new("cli-cp-links");
    let tree = work.path().join("tree");
    std::fs::create_dir(&tree).expect("mkdir");
    std::fs::write(tree.join("file"), b"f").expect("write");
    symlink("file", tree.join("link")).expect("symlink");
    for direction in ["up", "down"] {
        for existing in ["device", "fifo", "plain", "old-link"] {
            let dest = work.path().join(format!("{direction}-{existing}"));
            std::fs::create_dir_all(dest.join("tree")).expect("mkdir");
            let there = dest.join("tree/link");
            match existing {
                "device" => null_device(&there),
                "fifo" => {
                    nix::unistd::mkfifo(&there, nix::sys::stat::Mode::from_bits_truncate(0o600))
                        .expect("mkfifo")
                }
                "plain" => std::fs::write(&there, b"p").expect("write"),
                _ => symlink("elsewhere", &there).expect("symlink"),
            }
            let (from, to) = if direction == "up" {
                (arg(&tree), remote(&dest))
            } else {
                (remote(&tree), arg(&dest))
            };
            let done = cp(&served, &["-r", &from, &to], None);
            let kind = std::fs::symlink_metadata(&there)
                .expect("still there")
                .file_type();
            if existing == "device" || existing == "fifo" {
                assert!(
                    kind.is_char_device() || kind.is_fifo(),
                    "{direction} {existing}: replaced by a {kind:?}"
                );
                assert_eq!(done.code, 1, "{direction} {existing}");
                assert!(
                    text(&done.stderr).contains("not replaced by a symlink"),
                    "{direction} {existing}: {}",
                    text(&done.stderr)
                );
            } else {
                assert_eq!(
                    (done.code, text(&done.stderr)),
                    (0, String::new()),
                    "{direction} {existing}"
                );
                assert_eq!(
                    std::fs::read_link(&there).expect("a link"),
                    Path::new("file")
                );
            }
        }
    }
}

/// A source named on the command line that is a symlink is followed, as
/// `cp` and `scp` do (docs/GUIDE.md's own `cp :/etc/os-release -`); one in a
/// tree is copied as a link, and one leading out of the tree is said.
#[test]
fn cp_follows_a_named_symlink_and_says_links_that_leave_a_tree() {
    let served = Served::start();
    let work = TempDir::new("cli-cp-follow");
    let os_release = std::fs::read("/etc/os-release").expect("/etc/os-release");
    assert!(std::fs::symlink_metadata("/etc/os-release").is_ok());
    let done = cp(&served, &[":/etc/os-release", "-"], None);
    assert_eq!((done.code, text(&done.stderr)), (0, String::new()));
    assert_eq!(done.stdout, os_release);
    let copied = work.path().join("os-release");
    let done = cp(&served, &[":/etc/os-release", &arg(&copied)], None);
    assert_eq!((done.code, text(&done.stderr)), (0, String::new()));
    assert!(
        std::fs::symlink_metadata(&copied)
            .expect("copied")
            .is_file()
    );
    assert_eq!(std::fs::read(&copied).expect("read"), os_release);
    // A link to a file somewhere else, named here: its content goes up.
    let elsewhere = work.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).expect("mkdir");
    std::fs::write(elsewhere.join("target"), b"followed\n").expect("write");
    let link = work.path().join("named-link");
    symlink(elsewhere.join("target"), &link).expect("symlink");
    let up = work.path().join("up-named");
    let done = cp(&served, &[&arg(&link), &remote(&up)], None);
    assert_eq!((done.code, text(&done.stderr)), (0, String::new()));
    assert!(std::fs::symlink_metadata(&up).expect("copied").is_file());
    // In a tree, links are links; one leading out is said, both ways.
    let tree = work.path().join("tree");
    std::fs::create_dir(&tree).expect("mkdir");
    symlink("../elsewhere/target", tree.join("out")).expect("symlink");
    symlink("inside", tree.join("in")).expect("symlink");
    for (from, to) in [
        (arg(&tree), remote(&work.path().join("up-tree"))),
        (remote(&tree), arg(&work.path().join("down-tree"))),
    ] {
        let done = cp(&served, &["-r", &from, &to], None);
        assert_eq!(done.code, 0, "{}", text(&done.stderr));
        let said = text(&done.stderr);
        assert_eq!(said.lines().count(), 1, "{said}");
        assert!(
            said.contains(
                "out: a symlink to ../elsewhere/target outside the copied tree; copied as a link"
            ),
            "{said}"
        );
    }
    assert_eq!(
        std::fs::read_link(work.path().join("down-tree/out")).expect("a link"),
        Path::new("../elsewhere/target")
    );
}

/// A FIFO or process substitution named as a source is read as a stream,
/// as `-` is: `cp <(echo x) :dst` made a link to `pipe:[N]`.
#[test]
fn cp_reads_a_fifo_or_process_substitution_as_a_stream() {
    let served = Served::start();
    let work = TempDir::new("cli-cp-fifo");
    let dst = work.path().join("dst");
    let mut command = std::process::Command::new("bash");
    command
        .arg("-c")
        .arg(format!(
            "exec {} cp --connect {} <(printf 'x\\n') :{}",
            common::cli::BIN,
            served.unix,
            dst.display()
        ))
        .env("HOME", served.home.path());
    let done = finish(command, None);
    assert_eq!((done.code, text(&done.stderr)), (0, String::new()));
    assert!(std::fs::symlink_metadata(&dst).expect("made").is_file());
    assert_eq!(std::fs::read(&dst).expect("read"), b"x\n");
}
