//! The layers, kept by a test: every `crate::MODULE` a file of `src/`
//! names (outside comments) must be one its top-level module may import.
//! The arrows: cli -> client/net -> rpc -> wire -> model <- engines, with
//! `policy` (restricted executors' rules) between rpc and the engines, and
//! `conn` (connection plumbing) under client and rpc, and `sys` (the
//! operating system) under all. Front-ends (codex, mcp) are clients of the
//! capabilities; engines know nothing of capnp. A new wrong import fails
//! here at once, naming the file; the imports that break the arrows today
//! are listed in `DEBTS`, each with why, so that none grows.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const ENGINES: &[&str] = &["engine", "files", "sandbox", "ports"];

/// What each top-level module may name besides itself.
fn allowed(module: &str) -> Option<Vec<&'static str>> {
    let leaves = ["model", "sys", "metrics", "secret", "local_file", "segment"];
    Some(match module {
        "model" => vec![],
        "sys" | "metrics" | "secret" | "local_file" | "segment" => vec!["model"],
        "conn" => vec!["model", "sys"],
        "wire" => vec!["model", "capexec_capnp"],
        "engine" | "files" | "sandbox" | "ports" => leaves.to_vec(),
        // Accounts, the user map and workers: plain code on the system's
        // databases and calls, under whatever serves logins as users; the
        // sandbox makes the cgroup each user's worker gets.
        "users" => [&leaves[..], &["sandbox"]].concat(),
        // Restricted executors' rules, composed of the engines' own.
        "policy" => [&leaves[..], ENGINES].concat(),
        "rpc" => [
            &leaves[..],
            ENGINES,
            &["policy", "wire", "conn", "capexec_capnp"],
        ]
        .concat(),
        // (`users`: a server that runs logins as users starts their
        // workers.)
        "net" => [
            &leaves[..],
            &["rpc", "policy", "wire", "conn", "capexec_capnp", "users"],
        ]
        .concat(),
        "client" => [&leaves[..], &["net", "wire", "conn", "capexec_capnp"]].concat(),
        "codex" | "mcp" => [
            &leaves[..],
            &["client", "net", "wire", "conn", "capexec_capnp"],
        ]
        .concat(),
        _ => return None,
    })
}

/// Imports that break the arrows today, each a piece of work left
/// (issue 39): (from, to, why it is there).
const DEBTS: &[(&str, &str, &str)] = &[
    (
        "engine",
        "sandbox",
        "the spawn applies the sandbox's plan: to become a rule type the engine takes",
    ),
    (
        "sandbox",
        "engine",
        "the sandbox reads the engine's descriptor budget",
    ),
    (
        "ports",
        "files",
        "a port's Unix path is resolved beneath a directory",
    ),
    (
        "net",
        "engine",
        "the server is assembled in net: to move to the command line",
    ),
    (
        "net",
        "sandbox",
        "the server is assembled in net: to move to the command line",
    ),
    (
        "net",
        "ports",
        "the server is assembled in net: to move to the command line",
    ),
];

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src is listable") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
}

/// The top-level modules `text` names as `crate::NAME` or in `crate::{..}`,
/// comments left out.
fn named(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let inside = group.split('}').next().unwrap_or("");
                for item in inside.split(',') {
                    let name: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() {
                        names.insert(name);
                    }
                }
            } else {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                names.insert(name);
            }
        }
    }
    names
}

#[test]
fn every_import_keeps_to_the_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut wrong = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).expect("beneath src");
        let top = relative
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .map(|name| name.trim_end_matches(".rs").to_string())
            .unwrap_or_default();
        let Some(mut allowed) = allowed(&top) else {
            continue; // lib.rs, main.rs, cli: the top may use anything.
        };
        allowed.push(Box::leak(top.clone().into_boxed_str()));
        let text = std::fs::read_to_string(file).expect("readable");
        for name in named(&text) {
            let debt = DEBTS
                .iter()
                .any(|(from, to, _)| *from == top && *to == name);
            if !allowed.contains(&name.as_str()) && !debt {
                wrong.push(format!("{}: crate::{name}", relative.display()));
            }
        }
        if ENGINES.contains(&top.as_str()) {
            let names_capnp = text
                .lines()
                .map(|line| line.split("//").next().unwrap_or(""))
                .any(|code| code.contains("capnp"));
            if names_capnp {
                wrong.push(format!("{}: capnp in an engine", relative.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layers (see tests/it/layering.rs):\n{}",
        wrong.join("\n")
    );
}

/// Each debt is still owed: one paid off is taken off the list.
#[test]
fn every_debt_is_still_owed() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for (from, to, why) in DEBTS {
        let mut files = Vec::new();
        let dir = src.join(from);
        if dir.is_dir() {
            rust_files(&dir, &mut files);
        } else {
            files.push(src.join(format!("{from}.rs")));
        }
        let owed = files
            .iter()
            .any(|file| named(&std::fs::read_to_string(file).expect("readable")).contains(*to));
        assert!(
            owed,
            "{from} no longer imports {to} ({why}): take it off DEBTS"
        );
    }
}
