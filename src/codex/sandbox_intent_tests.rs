use std::collections::BTreeMap;

use super::*;

/// A file system in memory: each path and its kind (parents implied).
struct FakeTree {
    files: BTreeMap<PathBuf, FileKind>,
}

impl FakeTree {
    fn new(files: &[(&str, FileKind)]) -> FakeTree {
        let mut tree = FakeTree {
            files: BTreeMap::new(),
        };
        for (path, kind) in files {
            let path = PathBuf::from(path);
            for ancestor in path.ancestors().skip(1) {
                tree.files
                    .entry(ancestor.to_path_buf())
                    .or_insert(FileKind::Directory);
            }
            tree.files.insert(path, *kind);
        }
        tree
    }
}

impl Tree for FakeTree {
    async fn kind(&self, path: &Path) -> Result<Option<FileKind>, String> {
        Ok(self.files.get(path).copied())
    }

    async fn list(&self, path: &Path) -> Result<Option<Listing>, String> {
        if self.files.get(path) != Some(&FileKind::Directory) {
            return Ok(None);
        }
        Ok(Some(Listing {
            real_path: path.to_path_buf(),
            entries: self
                .files
                .iter()
                .filter(|(file, _)| file.parent() == Some(path))
                .map(|(file, kind)| Listed {
                    name: file.file_name().unwrap_or_default().to_os_string(),
                    kind: *kind,
                })
                .collect(),
        }))
    }
}

fn fixture(name: &str) -> Value {
    let text = match name {
        "start-workspace-write" => {
            include_str!("../../tests/codex/fixtures/start-workspace-write.json")
        }
        "start-read-only" => include_str!("../../tests/codex/fixtures/start-read-only.json"),
        "start-danger-full-access" => {
            include_str!("../../tests/codex/fixtures/start-danger-full-access.json")
        }
        "writefile-workspace-write" => {
            include_str!("../../tests/codex/fixtures/writefile-workspace-write.json")
        }
        _ => panic!("no fixture {name}"),
    };
    serde_json::from_str(text).unwrap()
}

/// Where the fixtures were recorded: the workspace Codex ran in.
const RECORDED_WS: &str = "/tmp/h-cap/ws-workspace-write";

fn run<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(future)
}

fn paths(list: &[PathBuf]) -> Vec<&str> {
    list.iter().map(|path| path.to_str().unwrap()).collect()
}

/// The workspace of the recording, with `.git` and `.codex` (as when it
/// was recorded), two ordinary entries and a link.
fn workspace() -> FakeTree {
    FakeTree::new(&[
        ("/tmp/h-cap/ws-workspace-write/.git/config", FileKind::File),
        ("/tmp/h-cap/ws-workspace-write/.codex", FileKind::Directory),
        ("/tmp/h-cap/ws-workspace-write/src/main.rs", FileKind::File),
        ("/tmp/h-cap/ws-workspace-write/README", FileKind::File),
        ("/tmp/h-cap/ws-workspace-write/link", FileKind::Symlink),
        ("/tmp/h-cap/other", FileKind::Directory),
        ("/tmp/scratch", FileKind::File),
        ("/var/tmp/job", FileKind::Directory),
        ("/usr/bin/sh", FileKind::File),
        ("/bin", FileKind::Symlink),
        ("/proc/1/environ", FileKind::File),
        ("/sys/kernel", FileKind::Directory),
        ("/dev/null", FileKind::CharDevice),
    ])
}

#[test]
fn workspace_write_keeps_the_protected_paths_read_only() {
    let start = fixture("start-workspace-write");
    let confinement = confinement_for(Some(&start["sandbox"]), Path::new("/elsewhere"), false)
        .unwrap()
        .unwrap();
    assert_eq!(sandbox_type(Some(&confinement)), "linuxSeccomp");
    assert_eq!(confinement.cwd(), Path::new(RECORDED_WS));
    let plan = run(confinement.plan(&workspace(), Some(OsStr::new("/var/tmp")))).unwrap();
    let sandbox = plan.sandbox();
    // The root read; the workspace and /tmp split around `.git` and
    // `.codex` (`.agents` and `.aws` are missing: skipped); $TMPDIR whole.
    // The root's entries (the kernel's directories as capexec's system
    // roots give them, a link as its target's root does); /tmp/h-cap and
    // the workspace, split, are read as all /tmp is.
    assert_eq!(paths(&sandbox.read_only), ["/tmp", "/usr", "/var"]);
    assert_eq!(
        paths(&sandbox.writable),
        [
            "/tmp/h-cap/other",
            "/tmp/h-cap/ws-workspace-write/README",
            "/tmp/h-cap/ws-workspace-write/src",
            "/tmp/scratch",
            "/var/tmp",
        ]
    );
    assert_eq!(sandbox.network, Network::None);
    assert!(!sandbox.no_system_roots);
    assert!(sandbox.read_only_cwd);
    assert!(!sandbox.best_effort);
    assert!(!sandbox.allow_namespaces);
    assert_eq!(
        paths(&plan.protected),
        [
            "/tmp/h-cap/ws-workspace-write/.codex",
            "/tmp/h-cap/ws-workspace-write/.git"
        ]
    );
    let ws = Path::new(RECORDED_WS);
    assert_eq!(plan.access_at(&ws.join("src/new.rs")), Access::Write);
    assert_eq!(plan.access_at(&ws.join(".git/config")), Access::Read);
    assert_eq!(plan.access_at(&ws.join(".codex/x")), Access::Read);
    // Stricter than asked: a new entry at the top of the workspace, and
    // what the link leads to through it.
    assert_eq!(plan.access_at(&ws.join("new-file")), Access::Read);
    assert_eq!(plan.access_at(&ws.join("link")), Access::Read);
    assert_eq!(plan.access_at(Path::new("/etc/passwd")), Access::Read);
}

/// Carved by mounts: the workspace writable whole (a new entry at its top
/// too), `.git` and `.codex` read-only inside it; /tmp still split on the
/// way to the workspace, whose own entries stay out of reach of a rename.
#[test]
fn mounts_keep_the_workspace_whole_and_its_protected_paths_read_only() {
    let start = fixture("start-workspace-write");
    let confinement = confinement_for(Some(&start["sandbox"]), Path::new("/elsewhere"), false)
        .unwrap()
        .unwrap();
    let plan =
        run(confinement.plan_carving(&workspace(), Some(OsStr::new("/var/tmp")), Carving::Mount))
            .unwrap();
    let sandbox = plan.sandbox();
    assert_eq!(
        paths(&sandbox.writable),
        [
            "/tmp/h-cap/other",
            "/tmp/h-cap/ws-workspace-write",
            "/tmp/scratch",
            "/var/tmp",
        ]
    );
    assert_eq!(
        paths(&sandbox.read_only_inside),
        [
            "/tmp/h-cap/ws-workspace-write/.codex",
            "/tmp/h-cap/ws-workspace-write/.git"
        ]
    );
    assert!(plan.protected.is_empty(), "{:?}", plan.protected);
    let ws = Path::new(RECORDED_WS);
    assert_eq!(plan.access_at(&ws.join("new-file")), Access::Write);
    assert_eq!(plan.access_at(&ws.join(".git/config")), Access::Read);
    assert_eq!(plan.access_at(&ws.join(".codex")), Access::Read);
    // /tmp and /tmp/h-cap were split on the way: the workspace cannot be
    // renamed away and made again with a `.git` of the process's own.
    assert_eq!(plan.access_at(Path::new("/tmp/h-cap/new")), Access::Read);
    assert_eq!(
        plan.splits
            .iter()
            .map(|split| split.path.to_str().unwrap())
            .collect::<Vec<_>>(),
        ["/", "/tmp", "/tmp/h-cap"]
    );
}

/// A path carved to `none`, or one deeper than the top of the root, is
/// split as without mounts (a mount can only keep a path read-only, and a
/// deeper one's parent could be renamed away).
#[test]
fn mounts_carve_only_read_only_paths_at_the_top_of_a_writable_root() {
    let ws = Path::new("/srv/ws");
    let tree = FakeTree::new(&[
        ("/srv/ws/a/.git/config", FileKind::File),
        ("/srv/ws/b", FileKind::File),
    ]);
    let intent = serde_json::json!({
        "permissions": {"type": "managed", "network": "restricted", "file_system": {
            "type": "restricted", "entries": [
                {"path": {"type": "path", "path": "/srv"}, "access": "read"},
                {"path": {"type": "path", "path": "/srv/ws"}, "access": "write"},
                {"path": {"type": "path", "path": "/srv/ws/a/.git"}, "access": "read"},
            ]}},
        "cwd": "file:///srv/ws",
    });
    let confinement = confinement_for(Some(&intent), ws, false).unwrap().unwrap();
    let plan = run(confinement.plan_carving(&tree, None, Carving::Mount)).unwrap();
    assert_eq!(paths(&plan.sandbox().writable), ["/srv/ws/a", "/srv/ws/b"]);
    assert_eq!(paths(&plan.read_only_inside), ["/srv/ws/a/.git"]);
    assert_eq!(plan.access_at(&ws.join("new")), Access::Read);
    assert_eq!(plan.access_at(&ws.join("a/new")), Access::Write);
}

#[test]
fn a_missing_protected_path_leaves_the_workspace_whole() {
    let start = fixture("start-workspace-write");
    let confinement = confinement_for(Some(&start["sandbox"]), Path::new("/x"), false)
        .unwrap()
        .unwrap();
    let tree = FakeTree::new(&[("/tmp/h-cap/ws-workspace-write/src", FileKind::Directory)]);
    let sandbox = run(confinement.plan(&tree, None)).unwrap().sandbox();
    assert!(sandbox.read_only.is_empty());
    // No $TMPDIR: that entry names nothing.
    // (The workspace is inside /tmp, writable as a whole.)
    assert_eq!(paths(&sandbox.writable), ["/tmp"]);
}

#[test]
fn read_only_reads_everything_and_writes_nothing() {
    let start = fixture("start-read-only");
    let confinement = confinement_for(Some(&start["sandbox"]), Path::new("/x"), false)
        .unwrap()
        .unwrap();
    let sandbox = run(confinement.plan(&workspace(), Some(OsStr::new("/var/tmp"))))
        .unwrap()
        .sandbox();
    assert_eq!(paths(&sandbox.read_only), ["/tmp", "/usr", "/var"]);
    assert!(sandbox.writable.is_empty());
    assert_eq!(sandbox.network, Network::None);
    assert!(!sandbox.no_system_roots);
}

#[test]
fn full_access_and_no_intent_confine_nothing() {
    let start = fixture("start-danger-full-access");
    assert_eq!(start["sandbox"], Value::Null);
    let none = confinement_for(Some(&start["sandbox"]), Path::new("/x"), false).unwrap();
    assert_eq!(none, None);
    assert_eq!(sandbox_type(none.as_ref()), "none");
    assert_eq!(confinement_for(None, Path::new("/x"), false), Ok(None));
    let disabled = serde_json::json!({"permissions": {"type": "disabled"}});
    assert_eq!(
        confinement_for(Some(&disabled), Path::new("/x"), false),
        Ok(None)
    );
}

#[test]
fn fs_calls_carry_the_same_intent_as_starts() {
    // Recorded in another workspace.
    let write: Value = serde_json::from_str(
        &fixture("writefile-workspace-write")
            .to_string()
            .replace("/tmp/h-cap/ws-p", RECORDED_WS),
    )
    .unwrap();
    let start = fixture("start-workspace-write");
    let from_fs = confinement_for(Some(&write["sandbox"]), Path::new("/x"), false).unwrap();
    let from_start = confinement_for(Some(&start["sandbox"]), Path::new("/x"), false).unwrap();
    assert!(from_fs.is_some());
    assert_eq!(from_fs, from_start);
}

#[test]
fn network_enabled_is_all_unless_codex_manages_it() {
    let mut start = fixture("start-workspace-write");
    start["sandbox"]["permissions"]["network"] = "enabled".into();
    let open = confinement_for(Some(&start["sandbox"]), Path::new("/x"), false)
        .unwrap()
        .unwrap();
    assert_eq!(open.network(), Network::All);
    // A managed network (a proxy with allowed domains): none at all.
    let managed = confinement_for(Some(&start["sandbox"]), Path::new("/x"), true)
        .unwrap()
        .unwrap();
    assert_eq!(managed.network(), Network::None);
    // Managed network without a sandbox cannot be enforced.
    let refused = confinement_for(None, Path::new("/x"), true).unwrap_err();
    assert!(
        matches!(refused, IntentError::Unenforceable(_)),
        "{refused}"
    );
    assert_eq!(refused.code(), -32603);
}

#[test]
fn what_cannot_be_enforced_is_refused() {
    let start = fixture("start-workspace-write");
    let refused = |edit: &dyn Fn(&mut Value)| {
        let mut sandbox = start["sandbox"].clone();
        edit(&mut sandbox);
        confinement_for(Some(&sandbox), Path::new("/x"), false).unwrap_err()
    };
    let external = refused(&|s| s["permissions"]["type"] = "external".into());
    assert!(external.message().contains("\"external\""), "{external}");
    assert_eq!(external.code(), -32603);
    let glob = refused(&|s| {
        s["permissions"]["file_system"]["entries"][0]["path"] =
            serde_json::json!({"type": "glob_pattern", "pattern": "/**/*.pem"})
    });
    assert!(glob.message().contains("glob_pattern"), "{glob}");
    let unknown_kind = refused(&|s| {
        s["permissions"]["file_system"]["entries"][0]["path"]["value"]["kind"] = "home".into()
    });
    assert!(
        unknown_kind.message().contains("\"home\""),
        "{unknown_kind}"
    );
    let everything = refused(&|s| s["permissions"]["file_system"]["type"] = "unrestricted".into());
    assert!(matches!(everything, IntentError::Unenforceable(_)));
    // Malformed: -32602, naming the field.
    let access =
        refused(&|s| s["permissions"]["file_system"]["entries"][1]["access"] = "execute".into());
    assert_eq!(access.code(), -32602);
    assert_eq!(
        access.message(),
        "invalid sandbox: sandbox.permissions.file_system.entries[1]: unknown access \"execute\""
    );
    let escape = refused(&|s| {
        s["permissions"]["file_system"]["entries"][4]["path"]["value"]["subpath"] = "../..".into()
    });
    assert_eq!(escape.code(), -32602);
    let relative = refused(&|s| s["workspaceRoots"][0] = "ws".into());
    assert_eq!(relative.code(), -32602);
    // Unrestricted with the network on: nothing to confine.
    let mut open = start["sandbox"].clone();
    open["permissions"]["file_system"]["type"] = "unrestricted".into();
    open["permissions"]["network"] = "enabled".into();
    assert_eq!(
        confinement_for(Some(&open), Path::new("/x"), false),
        Ok(None)
    );
}

#[test]
fn a_protected_path_that_is_a_link_is_refused() {
    let start = fixture("start-workspace-write");
    let confinement = confinement_for(Some(&start["sandbox"]), Path::new("/x"), false)
        .unwrap()
        .unwrap();
    let tree = FakeTree::new(&[
        ("/tmp/h-cap/ws-workspace-write/.git", FileKind::Symlink),
        ("/tmp/h-cap/ws-workspace-write/src", FileKind::Directory),
    ]);
    let refused = run(confinement.plan(&tree, None)).unwrap_err();
    assert_eq!(
        refused.message(),
        "sandbox cannot be enforced by this capexec executor: \
         /tmp/h-cap/ws-workspace-write/.git is a symbolic link: its target cannot be kept \
         read-only inside a root with more access"
    );
}

#[test]
fn out_of_reach_paths_split_readable_roots() {
    let intent = serde_json::json!({
        "permissions": {"type": "managed", "network": "restricted", "file_system": {
            "type": "restricted", "entries": [
                {"path": {"type": "path", "path": "/srv"}, "access": "read"},
                {"path": {"type": "path", "path": "/srv/app"}, "access": "write"},
                {"path": {"type": "path", "path": "/srv/app/secrets"}, "access": "none"},
            ]}},
        "cwd": "file:///srv/app",
    });
    let confinement = confinement_for(Some(&intent), Path::new("/x"), false)
        .unwrap()
        .unwrap();
    let tree = FakeTree::new(&[
        ("/srv/app/secrets/key", FileKind::File),
        ("/srv/app/code", FileKind::Directory),
        ("/srv/data", FileKind::Directory),
    ]);
    // The working directory, /srv/app, cannot be readable as a whole
    // (capexec lets a start read all of its working directory): refused.
    let refused = run(confinement.plan(&tree, None)).unwrap_err();
    assert!(
        refused
            .message()
            .contains("working directory /srv/app is not readable"),
        "{refused}"
    );
    // Elsewhere, /srv read but /srv/app/secrets nothing: /srv is split too.
    let mut elsewhere = intent.clone();
    elsewhere["cwd"] = "file:///srv/data".into();
    let confinement = confinement_for(Some(&elsewhere), Path::new("/x"), false)
        .unwrap()
        .unwrap();
    let plan = run(confinement.plan(&tree, None)).unwrap();
    let sandbox = plan.sandbox();
    assert!(
        sandbox.no_system_roots,
        "neither root nor minimal was asked"
    );
    assert_eq!(paths(&sandbox.read_only), ["/srv/data"]);
    assert_eq!(paths(&sandbox.writable), ["/srv/app/code"]);
    assert_eq!(
        plan.access_at(Path::new("/srv/app/secrets/key")),
        Access::None
    );
    assert_eq!(plan.access_at(Path::new("/srv/app/code/x")), Access::Write);
}

#[test]
fn a_working_directory_the_intent_hides_is_refused() {
    let intent = serde_json::json!({
        "permissions": {"type": "managed", "network": "restricted", "file_system": {
            "type": "restricted", "entries": [
                {"path": {"type": "special", "value": {"kind": "minimal"}}, "access": "read"},
                {"path": {"type": "path", "path": "/data"}, "access": "write"},
            ]}},
    });
    let confinement = confinement_for(Some(&intent), Path::new("/home/me"), false)
        .unwrap()
        .unwrap();
    let refused = run(confinement.plan(&FakeTree::new(&[]), None)).unwrap_err();
    assert!(
        refused
            .message()
            .contains("working directory /home/me is not readable"),
        "{refused}"
    );
}

#[test]
fn too_many_entries_to_split_are_refused() {
    let start = fixture("start-workspace-write");
    let confinement = confinement_for(Some(&start["sandbox"]), Path::new("/x"), false)
        .unwrap()
        .unwrap();
    let names: Vec<String> = (0..=MAX_ROOTS)
        .map(|n| format!("{RECORDED_WS}/file{n}"))
        .collect();
    let mut files: Vec<(&str, FileKind)> = names
        .iter()
        .map(|name| (name.as_str(), FileKind::File))
        .collect();
    files.push(("/tmp/h-cap/ws-workspace-write/.git", FileKind::Directory));
    let refused = run(confinement.plan(&FakeTree::new(&files), None)).unwrap_err();
    assert!(
        refused.message().contains("more than 2048 roots"),
        "{refused}"
    );
}

#[test]
fn an_applied_root_that_reaches_a_protected_path_is_caught() {
    let start = fixture("start-workspace-write");
    let confinement = confinement_for(Some(&start["sandbox"]), Path::new("/x"), false)
        .unwrap()
        .unwrap();
    let plan = run(confinement.plan(&workspace(), None)).unwrap();
    assert_eq!(plan.check_applied(&plan.sandbox()), Ok(()));
    // `src` swapped for a link to `.git` after the listing: the kernel
    // would have been given `.git`.
    let mut applied = plan.sandbox();
    applied.writable[1] = PathBuf::from(RECORDED_WS).join(".git");
    let caught = plan.check_applied(&applied).unwrap_err();
    assert!(caught.message().contains("must stay read-only"), "{caught}");
    let mut applied = plan.sandbox();
    applied.writable.push(PathBuf::from(RECORDED_WS));
    assert!(plan.check_applied(&applied).is_err());
    let mut applied = plan.sandbox();
    applied.network = Network::All;
    assert!(plan.check_applied(&applied).is_err());
}

#[test]
fn paths_are_uris_or_absolute_and_normal() {
    assert_eq!(
        absolute_path(&"file:///a%20b/./c".into(), "p"),
        Ok(PathBuf::from("/a b/c"))
    );
    assert_eq!(
        absolute_path(&"/x/y".into(), "p"),
        Ok(PathBuf::from("/x/y"))
    );
    assert!(absolute_path(&"file:///a/../b".into(), "p").is_err());
    assert!(absolute_path(&"x/y".into(), "p").is_err());
    assert!(absolute_path(&"file:///a%2".into(), "p").is_err());
    assert_eq!(
        relative_path(&".git".into(), "s"),
        Ok(PathBuf::from(".git"))
    );
    assert!(relative_path(&"/etc".into(), "s").is_err());
    assert!(relative_path(&"".into(), "s").is_err());
}
