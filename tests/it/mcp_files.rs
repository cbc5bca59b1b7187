//! The file tools of `capexec mcp` (`capexec::mcp::files`) against a real
//! root `Directory` on every backend: exact content and versions, refusal
//! texts, compare-and-swap, edits applied whole or not at all, bounds,
//! and confinement to the root.

use crate::common;

use std::os::unix::fs::symlink;
use std::path::Path;

use base64::Engine as _;
use capexec::client::Directory;
use capexec::mcp::files::{
    Edit, EditFileArgs, Encoding, EntryType, FileInfoArgs, FileToolError, FileToolErrorKind,
    FileTools, ListDirectoryArgs, MakeDirectoryArgs, MovePathArgs, READ_CAP_BYTES, ReadFileArgs,
    RemovePathArgs, SearchFilesArgs, WriteFileArgs,
};
use capexec::model::RefusalKind;
use common::Ctx;
use common::data::TempDir;
use serde_json::json;

async fn tools(ctx: &Ctx, temp: &TempDir) -> FileTools {
    FileTools::new(Directory::open(&ctx.executor, temp.path()), temp.path())
        .await
        .expect("file tools")
}

fn read(path: &str) -> ReadFileArgs {
    ReadFileArgs {
        path: path.into(),
        ..ReadFileArgs::default()
    }
}

fn write(path: &str, content: &str) -> WriteFileArgs {
    WriteFileArgs {
        path: path.into(),
        content: content.into(),
        ..WriteFileArgs::default()
    }
}

fn edit(old: &str, new: &str, count: Option<u64>) -> Edit {
    Edit {
        old_text: old.into(),
        new_text: new.into(),
        expected_count: count,
    }
}

fn failure<T: std::fmt::Debug>(outcome: Result<T, FileToolError>) -> FileToolError {
    outcome.expect_err("the tool succeeded")
}

/// Names in `dir` on this machine, sorted (temporaries would show here).
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

async fn read_file_reads_lines_and_bytes_and_says_where_a_cut_goes_on(ctx: Ctx) {
    let temp = TempDir::new("mcp-read");
    std::fs::write(temp.path().join("small.txt"), "one\ntwo\nthrée\n").expect("write");
    let tools = tools(&ctx, &temp).await;

    let whole = tools.read_file(read("small.txt")).await.expect("read");
    assert_eq!(whole.path, "small.txt");
    assert_eq!(whole.content, "one\ntwo\nthrée\n");
    assert_eq!(whole.encoding, Encoding::Utf8);
    assert_eq!(
        (whole.size, whole.byte_offset, whole.byte_length),
        (15, 0, 15)
    );
    assert_eq!(
        (whole.first_line, whole.lines, whole.total_lines),
        (Some(1), Some(3), Some(3))
    );
    assert!(!whole.truncated && whole.truncation.is_none());
    assert_eq!((whole.next_offset, whole.next_byte_offset), (None, None));
    // The version is the file's, as file_info says it.
    let info = tools
        .file_info(FileInfoArgs {
            path: "small.txt".into(),
            follow_symlinks: None,
        })
        .await
        .expect("info");
    assert_eq!(info.version.as_deref(), Some(whole.version.as_str()));

    let middle = tools
        .read_file(ReadFileArgs {
            offset: Some(1),
            limit: Some(1),
            ..read("small.txt")
        })
        .await
        .expect("read lines");
    assert_eq!(middle.content, "two\n");
    assert_eq!(
        (middle.first_line, middle.lines, middle.total_lines),
        (Some(2), Some(1), None)
    );
    assert_eq!((middle.byte_offset, middle.next_offset), (4, Some(2)));
    assert!(!middle.truncated);

    let bytes = tools
        .read_file(ReadFileArgs {
            byte_offset: Some(8),
            byte_length: Some(4),
            ..read("small.txt")
        })
        .await
        .expect("read bytes");
    // "thr" and half of "é": not text, so base64, said explicitly.
    assert_eq!(bytes.encoding, Encoding::Base64);
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(&bytes.content)
            .expect("base64"),
        &"thrée".as_bytes()[..4]
    );
    assert_eq!((bytes.byte_length, bytes.next_byte_offset), (4, Some(12)));
    assert!(!bytes.truncated);

    let both = failure(
        tools
            .read_file(ReadFileArgs {
                offset: Some(1),
                byte_offset: Some(1),
                ..read("small.txt")
            })
            .await,
    );
    assert_eq!(both.kind, FileToolErrorKind::InvalidArgument);
    assert_eq!(
        both.message,
        "give either `offset`/`limit` (lines) or `byte_offset`/`byte_length` (bytes), not both"
    );
    let missing = failure(tools.read_file(read("nope")).await);
    assert_eq!(missing.kind, FileToolErrorKind::Failed);
    assert_eq!(
        missing.message,
        "read \"nope\": not found [capexec:not-found]"
    );

    // A file of 2.5 MiB: read by lines within the cap, the cuts lead on
    // exactly, and lines are counted across the reads' chunks.
    let big: String = (0..250_000).map(|n| format!("line {n:05}\n")).collect();
    std::fs::write(temp.path().join("big.txt"), &big).expect("write");
    let mut gathered = String::new();
    let mut offset = 0;
    let mut reads = 0;
    loop {
        let part = tools
            .read_file(ReadFileArgs {
                offset: Some(offset),
                ..read("big.txt")
            })
            .await
            .expect("read part");
        assert!(part.byte_length <= READ_CAP_BYTES as u64);
        assert_eq!(part.byte_offset, gathered.len() as u64);
        gathered.push_str(&part.content);
        reads += 1;
        match part.next_offset {
            Some(next) => {
                assert!(part.truncated);
                assert_eq!(
                    part.truncation.as_deref(),
                    Some(
                        format!(
                            "cut at the {READ_CAP_BYTES}-byte cap of one read_file; read on with \
                             offset {next}"
                        )
                        .as_str()
                    )
                );
                offset = next;
            }
            None => {
                assert_eq!(part.total_lines, Some(250_000));
                break;
            }
        }
    }
    assert_eq!(gathered, big);
    assert_eq!(reads, big.len().div_ceil(READ_CAP_BYTES));
    let tail = tools
        .read_file(ReadFileArgs {
            offset: Some(249_998),
            ..read("big.txt")
        })
        .await
        .expect("read the tail");
    assert_eq!(tail.content, "line 249998\nline 249999\n");
    assert_eq!((tail.lines, tail.total_lines), (Some(2), Some(250_000)));

    // One line longer than the cap: cut inside it, read on by bytes.
    let wide = "é".repeat(READ_CAP_BYTES);
    std::fs::write(temp.path().join("wide.txt"), &wide).expect("write");
    let cut = tools.read_file(read("wide.txt")).await.expect("read wide");
    assert_eq!(cut.encoding, Encoding::Utf8);
    assert_eq!(cut.content, "é".repeat(READ_CAP_BYTES / 2));
    assert!(cut.truncated);
    assert_eq!(cut.next_byte_offset, Some(READ_CAP_BYTES as u64));
    assert_eq!(cut.next_offset, None);

    // Binary content comes in base64, byte-exact.
    let binary: Vec<u8> = (0..=255u8).collect();
    std::fs::write(temp.path().join("bin"), &binary).expect("write");
    let bin = tools.read_file(read("bin")).await.expect("read binary");
    assert_eq!(bin.encoding, Encoding::Base64);
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(&bin.content)
            .expect("base64"),
        binary
    );
}

async fn write_file_is_atomic_and_refuses_a_stale_version(ctx: Ctx) {
    let temp = TempDir::new("mcp-write");
    let tools = tools(&ctx, &temp).await;
    let first = tools
        .write_file(write("a/b/new.txt", "first\n"))
        .await
        .expect("write with parents");
    assert_eq!((first.path.as_str(), first.size), ("a/b/new.txt", 6));
    assert_eq!(
        std::fs::read(temp.path().join("a/b/new.txt")).expect("read"),
        b"first\n"
    );
    let read_back = tools.read_file(read("a/b/new.txt")).await.expect("read");
    assert_eq!(read_back.version, first.version);

    let second = tools
        .write_file(WriteFileArgs {
            if_version: Some(first.version.clone()),
            ..write("a/b/new.txt", "second\n")
        })
        .await
        .expect("compare-and-swap");
    assert_ne!(second.version, first.version);
    let stale = failure(
        tools
            .write_file(WriteFileArgs {
                if_version: Some(first.version.clone()),
                ..write("a/b/new.txt", "third\n")
            })
            .await,
    );
    assert_eq!(stale.kind, FileToolErrorKind::Failed);
    assert_eq!(stale.refusal, Some(RefusalKind::Conflict));
    assert_eq!(
        stale.message,
        format!(
            "\"a/b/new.txt\": not written: it is not at version {}; its version is now {} \
             [capexec:conflict]",
            first.version, second.version
        )
    );
    assert_eq!(
        std::fs::read(temp.path().join("a/b/new.txt")).expect("read"),
        b"second\n"
    );
    let gone = failure(
        tools
            .write_file(WriteFileArgs {
                if_version: Some(first.version.clone()),
                ..write("absent.txt", "x")
            })
            .await,
    );
    assert!(
        gone.message
            .ends_with("; it does not exist now [capexec:conflict]"),
        "{gone}"
    );
    assert!(!temp.path().join("absent.txt").exists());
    let junk = failure(
        tools
            .write_file(WriteFileArgs {
                if_version: Some("xyz".into()),
                ..write("a/b/new.txt", "x")
            })
            .await,
    );
    assert_eq!(junk.kind, FileToolErrorKind::InvalidArgument);

    let no_parents = failure(
        tools
            .write_file(WriteFileArgs {
                create_parents: Some(false),
                ..write("c/d.txt", "x")
            })
            .await,
    );
    assert_eq!(no_parents.refusal, Some(RefusalKind::NotFound));

    let bytes = tools
        .write_file(WriteFileArgs {
            encoding: Some(Encoding::Base64),
            ..write("bin", "AP8Q")
        })
        .await
        .expect("write base64");
    assert_eq!(bytes.size, 3);
    assert_eq!(
        std::fs::read(temp.path().join("bin")).expect("read"),
        [0x00, 0xff, 0x10]
    );
    // Written by rename or linking: no temporary left anywhere.
    assert_eq!(names(temp.path()), ["a", "bin"]);
    assert_eq!(names(&temp.path().join("a/b")), ["new.txt"]);
}

async fn edit_file_applies_every_edit_or_none(ctx: Ctx) {
    let temp = TempDir::new("mcp-edit");
    let original = "fn a() {}\nfn b() {}\nfn a() {}\n";
    std::fs::write(temp.path().join("code.rs"), original).expect("write");
    let tools = tools(&ctx, &temp).await;
    let before = tools.read_file(read("code.rs")).await.expect("read");

    let edited = tools
        .edit_file(EditFileArgs {
            path: "code.rs".into(),
            edits: vec![
                edit("fn a", "fn z", Some(2)),
                edit("fn b() {}", "fn b() {\n    1\n}", None),
            ],
            if_version: Some(before.version.clone()),
        })
        .await
        .expect("edit");
    let expected = "fn z() {}\nfn b() {\n    1\n}\nfn z() {}\n";
    assert_eq!(
        std::fs::read_to_string(temp.path().join("code.rs")).expect("read"),
        expected
    );
    assert_eq!(
        (edited.replacements, edited.size),
        (3, expected.len() as u64)
    );
    assert_eq!(
        edited.diff,
        "@@ edit 1, line 1 @@\n-fn a\n+fn z\n@@ edit 1, line 3 @@\n-fn a\n+fn z\n\
         @@ edit 2, line 2 @@\n-fn b() {}\n+fn b() {\n+    1\n+}\n"
    );
    let after = tools.read_file(read("code.rs")).await.expect("read");
    assert_eq!(after.version, edited.version);

    // One edit that does not match: none is applied, the file is
    // byte-identical and keeps its version.
    let refused = failure(
        tools
            .edit_file(EditFileArgs {
                path: "code.rs".into(),
                edits: vec![edit("fn z", "fn y", Some(2)), edit("fn missing", "x", None)],
                if_version: None,
            })
            .await,
    );
    assert_eq!(refused.kind, FileToolErrorKind::Failed);
    assert_eq!(
        refused.message,
        "capexec: edit 2 of 2: old_text was found 0 times, expected 1 (old_text must match the \
         file exactly, whitespace and line ends included); nothing was changed"
    );
    let too_many = failure(
        tools
            .edit_file(EditFileArgs {
                path: "code.rs".into(),
                edits: vec![edit("fn z", "fn y", None)],
                if_version: None,
            })
            .await,
    );
    assert!(
        too_many
            .message
            .starts_with("capexec: edit 1 of 1: old_text was found 2 times, expected 1"),
        "{too_many}"
    );
    let stale = failure(
        tools
            .edit_file(EditFileArgs {
                path: "code.rs".into(),
                edits: vec![edit("fn b", "fn c", None)],
                if_version: Some(before.version.clone()),
            })
            .await,
    );
    assert_eq!(
        stale.message,
        format!(
            "\"code.rs\": not edited: it is not at version {}; its version is now {} \
             [capexec:conflict]",
            before.version, edited.version
        )
    );
    assert_eq!(
        std::fs::read_to_string(temp.path().join("code.rs")).expect("read"),
        expected
    );
    let unchanged = tools.read_file(read("code.rs")).await.expect("read");
    assert_eq!(unchanged.version, edited.version);

    std::fs::write(temp.path().join("latin1"), b"caf\xe9\n").expect("write");
    let not_text = failure(
        tools
            .edit_file(EditFileArgs {
                path: "latin1".into(),
                edits: vec![edit("caf", "tea", None)],
                if_version: None,
            })
            .await,
    );
    assert_eq!(
        not_text.message,
        "capexec: \"latin1\" is not UTF-8 text (byte 3 is not), so it cannot be edited as text: \
         write it whole with write_file"
    );
    assert_eq!(
        std::fs::read(temp.path().join("latin1")).expect("read"),
        b"caf\xe9\n"
    );
    assert_eq!(names(temp.path()), ["code.rs", "latin1"]);
}

async fn list_directory_walks_to_a_depth_with_a_glob_and_a_bound(ctx: Ctx) {
    let temp = TempDir::new("mcp-list");
    let root = temp.path();
    std::fs::create_dir_all(root.join("src/deep")).expect("mkdir");
    std::fs::write(root.join("README"), b"12345").expect("write");
    std::fs::write(root.join("src/main.rs"), b"fn main() {}").expect("write");
    std::fs::write(root.join("src/deep/lib.rs"), b"").expect("write");
    symlink("src/main.rs", root.join("link")).expect("symlink");
    let tools = tools(&ctx, &temp).await;

    let top = tools
        .list_directory(ListDirectoryArgs::default())
        .await
        .expect("list");
    assert_eq!(top.path, ".");
    let shown: Vec<_> = top
        .entries
        .iter()
        .map(|entry| {
            (
                entry.path.as_str(),
                entry.entry_type,
                entry.size,
                entry.link_target.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            ("README", EntryType::File, Some(5), None),
            ("link", EntryType::Symlink, None, Some("src/main.rs")),
            ("src", EntryType::Directory, None, None),
        ]
    );
    assert!(!top.truncated);

    let paths = |entries: &[capexec::mcp::files::ListedEntry]| {
        entries.iter().map(|e| e.path.clone()).collect::<Vec<_>>()
    };
    let deep = tools
        .list_directory(ListDirectoryArgs {
            path: Some("src".into()),
            depth: Some(3),
            ..ListDirectoryArgs::default()
        })
        .await
        .expect("list src");
    // Paths are the root's, so every other tool takes them.
    assert_eq!(
        paths(&deep.entries),
        ["src/deep", "src/deep/lib.rs", "src/main.rs"]
    );
    let rust = tools
        .list_directory(ListDirectoryArgs {
            depth: Some(3),
            glob: Some("*.rs".into()),
            ..ListDirectoryArgs::default()
        })
        .await
        .expect("list *.rs");
    assert_eq!(paths(&rust.entries), ["src/deep/lib.rs", "src/main.rs"]);
    let bounded = tools
        .list_directory(ListDirectoryArgs {
            depth: Some(3),
            max_entries: Some(2),
            ..ListDirectoryArgs::default()
        })
        .await
        .expect("list bounded");
    assert_eq!(bounded.entries.len(), 2);
    assert!(bounded.truncated);
    assert_eq!(
        bounded.truncation.as_deref(),
        Some("cut at 2 entries (max_entries): list a subdirectory, less depth, or a glob")
    );
    let too_deep = failure(
        tools
            .list_directory(ListDirectoryArgs {
                depth: Some(17),
                ..ListDirectoryArgs::default()
            })
            .await,
    );
    assert_eq!(too_deep.kind, FileToolErrorKind::InvalidArgument);
    assert_eq!(too_deep.message, "`depth` is 17: from 1 to 16");
}

async fn search_files_runs_on_the_executor_with_globs_and_a_bound(ctx: Ctx) {
    let temp = TempDir::new("mcp-search");
    let root = temp.path();
    std::fs::create_dir_all(root.join("src")).expect("mkdir");
    std::fs::create_dir_all(root.join("target")).expect("mkdir");
    std::fs::write(root.join("src/main.rs"), "fn main() {\n    todo!()\n}\n").expect("write");
    std::fs::write(root.join("src/notes.txt"), "TODO: more\n").expect("write");
    std::fs::write(root.join("target/out.rs"), "todo\n").expect("write");
    std::fs::write(root.join("blob"), b"todo\0").expect("write");
    let tools = tools(&ctx, &temp).await;
    let search = |pattern: &str| SearchFilesArgs {
        pattern: pattern.into(),
        ..SearchFilesArgs::default()
    };

    let found = tools
        .search_files(SearchFilesArgs {
            path: Some("src".into()),
            case_insensitive: Some(true),
            ..search("todo")
        })
        .await
        .expect("search");
    let mut lines: Vec<_> = found
        .matches
        .iter()
        .map(|m| {
            (
                m.path.as_str(),
                m.line,
                m.text.as_str(),
                m.match_start,
                m.match_end,
            )
        })
        .collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            ("src/main.rs", 2, "    todo!()", 4, 8),
            ("src/notes.txt", 1, "TODO: more", 0, 4),
        ]
    );
    assert_eq!((found.files_searched, found.binary_files_skipped), (2, 0));
    assert!(!found.truncated);

    let rust = tools
        .search_files(SearchFilesArgs {
            glob: Some("*.rs".into()),
            exclude: Some(vec!["target".into()]),
            ..search("todo")
        })
        .await
        .expect("search *.rs");
    assert_eq!(rust.matches.len(), 1);
    assert_eq!(rust.matches[0].path, "src/main.rs");
    let everywhere = tools.search_files(search("todo")).await.expect("search");
    assert_eq!(everywhere.binary_files_skipped, 1);
    assert_eq!(everywhere.matches.len(), 2);
    let bounded = tools
        .search_files(SearchFilesArgs {
            max_matches: Some(1),
            ..search("(?i)todo")
        })
        .await
        .expect("search bounded");
    assert_eq!(bounded.matches.len(), 1);
    assert!(bounded.truncated);

    let malformed = failure(tools.search_files(search("todo(")).await);
    assert_eq!(malformed.kind, FileToolErrorKind::InvalidArgument);
    assert_eq!(
        malformed.message,
        "search \".\": pattern \"todo(\": unclosed group [capexec:invalid-argument]"
    );
    let too_many = failure(
        tools
            .search_files(SearchFilesArgs {
                max_matches: Some(1001),
                ..search("x")
            })
            .await,
    );
    assert_eq!(too_many.message, "`max_matches` is 1001: from 1 to 1000");
}

async fn paths_outside_the_root_are_refused_with_the_tag(ctx: Ctx) {
    let temp = TempDir::new("mcp-outside");
    let outside = TempDir::new("mcp-outside-target");
    std::fs::write(outside.path().join("secret"), b"secret").expect("write");
    symlink(outside.path().join("secret"), temp.path().join("link")).expect("symlink");
    symlink(outside.path(), temp.path().join("link-dir")).expect("symlink");
    let tools = tools(&ctx, &temp).await;
    let root = temp.path().display().to_string();

    for path in ["../x", "a/../../x", "/etc/passwd"] {
        let error = failure(tools.read_file(read(path)).await);
        assert_eq!(error.refusal, Some(RefusalKind::OutsideDirectory), "{path}");
        assert_eq!(
            error.message,
            format!(
                "{path:?} is outside the root {root:?}, the directory these tools are confined \
                 to [capexec:outside-directory]"
            )
        );
    }
    let escape = outside.path().join("planted").display().to_string();
    let writes = [
        failure(tools.write_file(write(&escape, "x")).await),
        failure(tools.write_file(write("link-dir/planted", "x")).await),
        failure(
            tools
                .make_directory(MakeDirectoryArgs {
                    path: "link-dir/planted".into(),
                    parents: None,
                })
                .await,
        ),
        failure(
            tools
                .move_path(MovePathArgs {
                    from: "link".into(),
                    to: "../planted".into(),
                    overwrite: None,
                })
                .await,
        ),
    ];
    for error in writes {
        assert_eq!(
            error.refusal,
            Some(RefusalKind::OutsideDirectory),
            "{error}"
        );
        assert!(
            error.message.ends_with("[capexec:outside-directory]"),
            "{error}"
        );
    }
    assert_eq!(names(outside.path()), ["secret"]);
    // A symlink out is refused by the executor's kernel, with its tag.
    let through = failure(tools.read_file(read("link")).await);
    assert_eq!(through.refusal, Some(RefusalKind::OutsideDirectory));
    assert!(through.message.starts_with("read \"link\": "), "{through}");
    let listed = failure(
        tools
            .list_directory(ListDirectoryArgs {
                path: Some("link-dir".into()),
                ..ListDirectoryArgs::default()
            })
            .await,
    );
    assert_eq!(listed.refusal, Some(RefusalKind::OutsideDirectory));
    let searched = failure(
        tools
            .search_files(SearchFilesArgs {
                pattern: "secret".into(),
                path: Some("link-dir".into()),
                ..SearchFilesArgs::default()
            })
            .await,
    );
    assert_eq!(searched.refusal, Some(RefusalKind::OutsideDirectory));
    // Absolute paths beneath the root are the root's.
    std::fs::write(temp.path().join("inside"), b"in").expect("write");
    let absolute = temp.path().join("inside").display().to_string();
    let inside = tools.read_file(read(&absolute)).await.expect("read");
    assert_eq!(
        (inside.path.as_str(), inside.content.as_str()),
        ("inside", "in")
    );
    let empty = failure(tools.read_file(read("")).await);
    assert_eq!(empty.kind, FileToolErrorKind::InvalidArgument);
}

async fn file_info_move_remove_and_make_directory_do_what_they_say(ctx: Ctx) {
    let temp = TempDir::new("mcp-manage");
    let tools = tools(&ctx, &temp).await;
    let made = tools
        .make_directory(MakeDirectoryArgs {
            path: "x/y/z".into(),
            parents: None,
        })
        .await
        .expect("mkdir -p");
    assert_eq!(made.path, "x/y/z");
    assert!(temp.path().join("x/y/z").is_dir());
    let again = tools
        .make_directory(MakeDirectoryArgs {
            path: "x/y/z".into(),
            parents: None,
        })
        .await;
    assert!(again.is_ok(), "{again:?}");
    let strict = failure(
        tools
            .make_directory(MakeDirectoryArgs {
                path: "q/r".into(),
                parents: Some(false),
            })
            .await,
    );
    assert_eq!(strict.refusal, Some(RefusalKind::NotFound));

    tools
        .write_file(write("f", "content"))
        .await
        .expect("write");
    tools.write_file(write("g", "other")).await.expect("write");
    let taken = failure(
        tools
            .move_path(MovePathArgs {
                from: "f".into(),
                to: "g".into(),
                overwrite: None,
            })
            .await,
    );
    assert_eq!(taken.refusal, Some(RefusalKind::Exists));
    let moved = tools
        .move_path(MovePathArgs {
            from: "f".into(),
            to: "x/y/f2".into(),
            overwrite: None,
        })
        .await
        .expect("move");
    assert_eq!((moved.from.as_str(), moved.to.as_str()), ("f", "x/y/f2"));
    assert_eq!(
        std::fs::read(temp.path().join("x/y/f2")).expect("read"),
        b"content"
    );
    tools
        .move_path(MovePathArgs {
            from: "g".into(),
            to: "x/y/f2".into(),
            overwrite: Some(true),
        })
        .await
        .expect("move over");
    assert_eq!(
        std::fs::read(temp.path().join("x/y/f2")).expect("read"),
        b"other"
    );

    symlink("x/y/f2", temp.path().join("link")).expect("symlink");
    let link = tools
        .file_info(FileInfoArgs {
            path: "link".into(),
            follow_symlinks: None,
        })
        .await
        .expect("info");
    assert_eq!(link.entry_type, EntryType::Symlink);
    assert_eq!(link.link_target.as_deref(), Some("x/y/f2"));
    assert_eq!(link.version, None);
    let followed = tools
        .file_info(FileInfoArgs {
            path: "link".into(),
            follow_symlinks: Some(true),
        })
        .await
        .expect("info");
    assert_eq!((followed.entry_type, followed.size), (EntryType::File, 5));
    let read_back = tools.read_file(read("x/y/f2")).await.expect("read");
    assert_eq!(
        followed.version.as_deref(),
        Some(read_back.version.as_str())
    );
    let directory = tools
        .file_info(FileInfoArgs {
            path: "x".into(),
            follow_symlinks: None,
        })
        .await
        .expect("info");
    assert_eq!(directory.entry_type, EntryType::Directory);
    assert_eq!(directory.permissions.len(), 4);

    let not_empty = failure(
        tools
            .remove_path(RemovePathArgs {
                path: "x".into(),
                recursive: None,
            })
            .await,
    );
    assert_eq!(not_empty.refusal, Some(RefusalKind::NotEmpty));
    assert!(temp.path().join("x/y/f2").exists());
    let removed = tools
        .remove_path(RemovePathArgs {
            path: "x".into(),
            recursive: Some(true),
        })
        .await
        .expect("remove -r");
    // x, y, z and f2.
    assert_eq!(removed.removed, 4);
    let root = failure(
        tools
            .remove_path(RemovePathArgs {
                path: ".".into(),
                recursive: Some(true),
            })
            .await,
    );
    assert_eq!(root.kind, FileToolErrorKind::InvalidArgument);
    assert_eq!(names(temp.path()), ["link"]);
}

async fn a_read_only_root_reads_and_refuses_every_write(ctx: Ctx) {
    let temp = TempDir::new("mcp-read-only");
    std::fs::write(temp.path().join("f"), "keep\n").expect("write");
    let directory = Directory::open(&ctx.executor, temp.path()).read_only();
    let tools = FileTools::new(directory, temp.path())
        .await
        .expect("file tools");
    assert_eq!(
        tools.read_file(read("f")).await.expect("read").content,
        "keep\n"
    );
    let found = tools
        .search_files(SearchFilesArgs {
            pattern: "keep".into(),
            ..SearchFilesArgs::default()
        })
        .await
        .expect("search");
    assert_eq!(found.matches.len(), 1);
    let refused = failure(tools.write_file(write("f", "x")).await);
    assert_eq!(
        refused.message,
        "`writeFile` is not allowed: this directory is read-only [capexec:forbidden]"
    );
    let refused = failure(
        tools
            .edit_file(EditFileArgs {
                path: "f".into(),
                edits: vec![edit("keep", "lose", None)],
                if_version: None,
            })
            .await,
    );
    assert_eq!(refused.refusal, Some(RefusalKind::Forbidden));
    assert_eq!(
        std::fs::read(temp.path().join("f")).expect("read"),
        b"keep\n"
    );
}

async fn writes_and_edits_through_a_symlink_change_the_file_it_leads_to(ctx: Ctx) {
    let temp = TempDir::new("mcp-symlinks");
    let outside = TempDir::new("mcp-symlinks-outside");
    std::fs::create_dir(temp.path().join("docs")).expect("mkdir");
    std::fs::write(temp.path().join("docs/AGENTS.md"), "old\n").expect("write");
    symlink("docs/AGENTS.md", temp.path().join("CLAUDE.md")).expect("symlink");
    symlink(outside.path().join("x"), temp.path().join("out")).expect("symlink");
    let tools = tools(&ctx, &temp).await;

    let written = tools
        .write_file(write("CLAUDE.md", "new\n"))
        .await
        .expect("write through the link");
    assert_eq!(written.path, "CLAUDE.md");
    let edited = tools
        .edit_file(EditFileArgs {
            path: "CLAUDE.md".into(),
            edits: vec![edit("new", "newer", None)],
            if_version: Some(written.version.clone()),
        })
        .await
        .expect("edit through the link");
    assert_eq!(edited.path, "CLAUDE.md");
    assert_eq!(
        std::fs::read(temp.path().join("docs/AGENTS.md")).expect("read"),
        b"newer\n"
    );
    assert_eq!(
        std::fs::read_link(temp.path().join("CLAUDE.md")).expect("still a link"),
        Path::new("docs/AGENTS.md")
    );
    let real = tools.read_file(read("docs/AGENTS.md")).await.expect("read");
    assert_eq!(real.version, edited.version);
    // A link out of the root is refused, not written through nor replaced.
    let out = failure(tools.write_file(write("out", "x")).await);
    assert_eq!(out.refusal, Some(RefusalKind::OutsideDirectory));
    assert!(
        std::fs::symlink_metadata(temp.path().join("out"))
            .expect("the link")
            .file_type()
            .is_symlink()
    );
    assert_eq!(names(outside.path()), Vec::<String>::new());
}

async fn the_json_entry_point_calls_each_tool_by_name(ctx: Ctx) {
    let temp = TempDir::new("mcp-json");
    let tools = tools(&ctx, &temp).await;
    let call = |name: &'static str, arguments: serde_json::Value| {
        let tools = &tools;
        async move { tools.call(name, arguments).await.expect("a file tool") }
    };
    let written = call("write_file", json!({"path": "n.txt", "content": "1\n2\n"}))
        .await
        .expect("write");
    let version = written["version"].as_str().expect("version").to_string();
    assert_eq!(
        written,
        json!({"path": "n.txt", "version": version, "size": 4})
    );
    let read = call("read_file", json!({"path": "n.txt", "offset": 1}))
        .await
        .expect("read");
    assert_eq!(
        read,
        json!({
            "path": "n.txt",
            "content": "2\n",
            "encoding": "utf-8",
            "version": version,
            "size": 4,
            "byte_offset": 2,
            "byte_length": 2,
            "first_line": 2,
            "lines": 1,
            "total_lines": 2,
            "truncated": false,
        })
    );
    let listed = call("list_directory", serde_json::Value::Null)
        .await
        .expect("list");
    assert_eq!(
        listed,
        json!({
            "path": ".",
            "entries": [{"path": "n.txt", "type": "file", "size": 4}],
            "truncated": false,
        })
    );
    let wrong = call("read_file", json!({"path": ["n.txt"]}))
        .await
        .expect_err("an array for a path");
    assert_eq!(wrong.kind, FileToolErrorKind::InvalidArgument);
    assert!(tools.call("exec", json!({})).await.is_none());
}

backend_tests!(
    the_json_entry_point_calls_each_tool_by_name,
    writes_and_edits_through_a_symlink_change_the_file_it_leads_to,
    read_file_reads_lines_and_bytes_and_says_where_a_cut_goes_on,
    write_file_is_atomic_and_refuses_a_stale_version,
    edit_file_applies_every_edit_or_none,
    list_directory_walks_to_a_depth_with_a_glob_and_a_bound,
    search_files_runs_on_the_executor_with_globs_and_a_bound,
    paths_outside_the_root_are_refused_with_the_tag,
    file_info_move_remove_and_make_directory_do_what_they_say,
    a_read_only_root_reads_and_refuses_every_write,
);
