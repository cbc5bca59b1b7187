//! Generates the Rust bindings of `schema/*.capnp` without the `capnp` binary.
//!
//! `scripts/regen-schema.sh` compiles the schema into a CodeGeneratorRequest
//! (`schema/codegen-request.bin`) and records the SHA-256 of every schema file
//! next to it. This script refuses to build when the schema no longer matches
//! that fingerprint, so the hand-edited schema stays the single source of truth,
//! then replays the request through capnpc's code generator.

use std::fs;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

const SCHEMA_DIR: &str = "schema";
const REQUEST: &str = "schema/codegen-request.bin";
const FINGERPRINT: &str = "schema/codegen-request.sha256";

fn main() {
    println!("cargo:rerun-if-changed={SCHEMA_DIR}");
    println!("cargo:rerun-if-changed={REQUEST}");
    println!("cargo:rerun-if-changed={FINGERPRINT}");

    let schemas = schema_files(Path::new(SCHEMA_DIR));
    for schema in &schemas {
        println!("cargo:rerun-if-changed={}", schema.display());
    }

    let expected = fingerprint(&schemas);
    let recorded = fs::read_to_string(FINGERPRINT).unwrap_or_default();
    if normalize(&recorded) != normalize(&expected) {
        panic!(
            "\n\nschema/*.capnp changed since {REQUEST} was generated.\n\
             Run scripts/regen-schema.sh (needs Debian's capnproto and libcapnp-dev) \
             and commit schema/codegen-request.*\n\
             recorded fingerprint:\n{recorded}\ncurrent fingerprint:\n{expected}\n"
        );
    }

    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let request = fs::File::open(REQUEST).unwrap_or_else(|e| panic!("cannot open {REQUEST}: {e}"));
    capnpc::codegen::CodeGenerationCommand::new()
        .output_directory(out_dir)
        .run(request)
        .unwrap_or_else(|e| panic!("capnp code generation from {REQUEST} failed: {e}"));
}

fn schema_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "capnp"))
        .collect();
    // `sha256sum -- *.capnp` lists files in the shell's glob order, which is
    // byte order under the C locale used by the regeneration script.
    files.sort();
    files
}

/// The same text `(cd schema && sha256sum -- *.capnp)` prints.
fn fingerprint(schemas: &[PathBuf]) -> String {
    let mut text = String::new();
    for schema in schemas {
        let bytes =
            fs::read(schema).unwrap_or_else(|e| panic!("cannot read {}: {e}", schema.display()));
        let digest = Sha256::digest(&bytes);
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        let name = schema
            .file_name()
            .expect("schema files have names")
            .to_string_lossy();
        text.push_str(&format!("{hex}  {name}\n"));
    }
    text
}

fn normalize(text: &str) -> String {
    text.lines()
        .map(str::trim_end)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}
