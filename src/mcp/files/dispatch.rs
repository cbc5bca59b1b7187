//! The file tools as an MCP server lists and calls them: each tool's
//! name, description and JSON schemas ([`tool_specs`]), and one entry
//! point that takes a tool's name and JSON arguments ([`FileTools::call`]),
//! so the server registers the tools without repeating their types.

use schemars::{JsonSchema, schema_for};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::*;

/// A tool as `tools/list` describes it.
#[derive(Clone, Debug)]
pub struct ToolSpec {
    pub name: &'static str,
    pub description: &'static str,
    /// JSON Schema (draft 2020-12) of the arguments: an object.
    pub input_schema: Map<String, Value>,
    /// JSON Schema of the structured result: an object.
    pub output_schema: Map<String, Value>,
}

fn schema_of<T: JsonSchema>() -> Map<String, Value> {
    object(schema_for!(T))
}

/// The schema of what serialising a `T` writes: a field skipped when
/// empty is not required (a client checking results against the schema,
/// as the MCP Python SDK does, accepts every result).
fn output_schema_of<T: JsonSchema>() -> Map<String, Value> {
    object(
        schemars::generate::SchemaSettings::draft2020_12()
            .for_serialize()
            .into_generator()
            .into_root_schema_for::<T>(),
    )
}

fn object(schema: schemars::Schema) -> Map<String, Value> {
    match serde_json::to_value(schema) {
        Ok(Value::Object(schema)) => schema,
        // A derived schema of a struct is always an object.
        _ => Map::new(),
    }
}

fn description(name: &str) -> &'static str {
    TOOL_DESCRIPTIONS
        .iter()
        .find(|(tool, _)| *tool == name)
        .map_or("", |(_, text)| text)
}

/// Arguments from JSON: a malformed value is the arguments' fault.
fn arguments<T: DeserializeOwned>(tool: &str, arguments: Value) -> Result<T, FileToolError> {
    // A call without arguments is a call with none.
    let arguments = if arguments.is_null() {
        Value::Object(Map::new())
    } else {
        arguments
    };
    serde_json::from_value(arguments)
        .map_err(|error| FileToolError::invalid(format!("{tool}: {error}")))
}

fn result<T: Serialize>(value: T) -> Result<Value, FileToolError> {
    serde_json::to_value(value).map_err(|error| {
        FileToolError::failed(format!("capexec: a result could not be written: {error}"))
    })
}

macro_rules! file_tools {
    ($($name:literal => $method:ident($args:ty) -> $result:ty;)*) => {
        /// Every file tool, in a stable order.
        pub fn tool_specs() -> Vec<ToolSpec> {
            vec![$(ToolSpec {
                name: $name,
                description: description($name),
                input_schema: schema_of::<$args>(),
                output_schema: output_schema_of::<$result>(),
            },)*]
        }

        impl FileTools {
            /// Calls tool `name` with JSON `arguments` (`null` for none) and
            /// answers its structured result; `None` when `name` is not a
            /// file tool.
            pub async fn call(
                &self,
                name: &str,
                arguments_json: Value,
            ) -> Option<Result<Value, FileToolError>> {
                Some(match name {
                    $($name => match arguments::<$args>($name, arguments_json) {
                        Ok(args) => match self.$method(args).await {
                            Ok(done) => result(done),
                            Err(error) => Err(error),
                        },
                        Err(error) => Err(error),
                    },)*
                    _ => return None,
                })
            }
        }
    };
}

file_tools! {
    "read_file" => read_file(ReadFileArgs) -> ReadFileResult;
    "write_file" => write_file(WriteFileArgs) -> WriteFileResult;
    "edit_file" => edit_file(EditFileArgs) -> EditFileResult;
    "list_directory" => list_directory(ListDirectoryArgs) -> ListDirectoryResult;
    "search_files" => search_files(SearchFilesArgs) -> SearchFilesResult;
    "file_info" => file_info(FileInfoArgs) -> FileInfoResult;
    "move_path" => move_path(MovePathArgs) -> MovePathResult;
    "remove_path" => remove_path(RemovePathArgs) -> RemovePathResult;
    "make_directory" => make_directory(MakeDirectoryArgs) -> MakeDirectoryResult;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_has_a_description_and_object_schemas() {
        let specs = tool_specs();
        let names: Vec<_> = specs.iter().map(|spec| spec.name).collect();
        assert_eq!(
            names,
            [
                "read_file",
                "write_file",
                "edit_file",
                "list_directory",
                "search_files",
                "file_info",
                "move_path",
                "remove_path",
                "make_directory"
            ]
        );
        assert_eq!(TOOL_DESCRIPTIONS.len(), specs.len());
        for spec in specs {
            assert!(!spec.description.is_empty(), "{}", spec.name);
            assert_eq!(spec.input_schema["type"], "object", "{}", spec.name);
            assert_eq!(spec.output_schema["type"], "object", "{}", spec.name);
        }
    }

    #[test]
    fn malformed_arguments_are_the_arguments_fault_naming_the_tool() {
        let error = arguments::<ReadFileArgs>("read_file", serde_json::json!({"path": 3}))
            .expect_err("a number for a path");
        assert_eq!(error.kind, FileToolErrorKind::InvalidArgument);
        assert_eq!(
            error.message,
            "read_file: invalid type: integer `3`, expected a string"
        );
        let none =
            arguments::<ListDirectoryArgs>("list_directory", Value::Null).expect("no arguments");
        assert_eq!(none.path, None);
    }
}
