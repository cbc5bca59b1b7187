//! The tools' JSON shapes as an MCP client sees them: every input and
//! output schema is an object (MCP requires it), the field names are the
//! documented ones, and arguments reject unknown fields.

use schemars::{JsonSchema, schema_for};
use serde_json::{Value, json};

use super::*;

fn object_with<T: JsonSchema>(fields: &[&str], required: &[&str]) {
    let schema = serde_json::to_value(schema_for!(T)).expect("schema");
    assert_eq!(schema["type"], "object", "{schema}");
    let mut properties: Vec<&str> = schema["properties"]
        .as_object()
        .expect("properties")
        .keys()
        .map(String::as_str)
        .collect();
    properties.sort_unstable();
    let mut expected = fields.to_vec();
    expected.sort_unstable();
    assert_eq!(properties, expected, "{schema}");
    let mut needed: Vec<&str> = schema["required"]
        .as_array()
        .map(|list| list.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    needed.sort_unstable();
    let mut wanted = required.to_vec();
    wanted.sort_unstable();
    assert_eq!(needed, wanted, "{schema}");
}

#[test]
fn every_argument_schema_is_an_object_of_the_documented_fields() {
    object_with::<ReadFileArgs>(
        &["path", "offset", "limit", "byte_offset", "byte_length"],
        &["path"],
    );
    object_with::<WriteFileArgs>(
        &[
            "path",
            "content",
            "encoding",
            "if_version",
            "create_parents",
        ],
        &["path", "content"],
    );
    object_with::<EditFileArgs>(&["path", "edits", "if_version"], &["path", "edits"]);
    object_with::<ListDirectoryArgs>(&["path", "depth", "glob", "max_entries"], &[]);
    object_with::<SearchFilesArgs>(
        &[
            "pattern",
            "path",
            "glob",
            "exclude",
            "case_insensitive",
            "max_matches",
        ],
        &["pattern"],
    );
    object_with::<FileInfoArgs>(&["path", "follow_symlinks"], &["path"]);
    object_with::<MovePathArgs>(&["from", "to", "overwrite"], &["from", "to"]);
    object_with::<RemovePathArgs>(&["path", "recursive"], &["path"]);
    object_with::<MakeDirectoryArgs>(&["path", "parents"], &["path"]);
}

#[test]
fn every_result_schema_is_an_object() {
    for schema in [
        schema_for!(ReadFileResult),
        schema_for!(WriteFileResult),
        schema_for!(EditFileResult),
        schema_for!(ListDirectoryResult),
        schema_for!(SearchFilesResult),
        schema_for!(FileInfoResult),
        schema_for!(MovePathResult),
        schema_for!(RemovePathResult),
        schema_for!(MakeDirectoryResult),
    ] {
        let schema = serde_json::to_value(schema).expect("schema");
        assert_eq!(schema["type"], "object", "{schema}");
    }
}

#[test]
fn arguments_reject_unknown_fields_and_results_serialise_as_documented() {
    let error = serde_json::from_value::<ReadFileArgs>(json!({"path": "a", "lines": 3}))
        .expect_err("unknown field");
    assert!(
        error.to_string().starts_with("unknown field `lines`"),
        "{error}"
    );
    let args: WriteFileArgs =
        serde_json::from_value(json!({"path": "a", "content": "AA==", "encoding": "base64"}))
            .expect("args");
    assert_eq!(args.encoding, Some(Encoding::Base64));
    let entry = ListedEntry {
        path: "src".into(),
        entry_type: EntryType::Directory,
        size: None,
        link_target: None,
        error: None,
        path_not_utf8: false,
    };
    assert_eq!(
        serde_json::to_value(entry).expect("json"),
        json!({"path": "src", "type": "directory"})
    );
}
