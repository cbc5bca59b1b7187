//! The subset of JSON Schema (draft 2020-12) the tools' output schemas
//! use, to check every structured result against its tool's
//! `outputSchema` as the MCP Python SDK does: `$ref` into `$defs`, `type`,
//! `required`, `properties`, `items`, `anyOf`, `oneOf`, `enum`, `const`,
//! `minimum`. A keyword it does not know fails the check, so that a schema
//! growing past it is noticed.

use serde_json::Value;

const KNOWN: &[&str] = &[
    "$schema",
    "$defs",
    "$ref",
    "title",
    "description",
    "format",
    "type",
    "required",
    "properties",
    "items",
    "anyOf",
    "oneOf",
    "enum",
    "const",
    "minimum",
];

/// Why `value` does not match `schema` (whose `$defs` are `root`'s).
pub fn mismatch(root: &Value, schema: &Value, value: &Value, at: &str) -> Option<String> {
    let Some(schema) = schema.as_object() else {
        return (schema != &Value::Bool(true)).then(|| format!("{at}: schema {schema}"));
    };
    if let Some(unknown) = schema.keys().find(|key| !KNOWN.contains(&key.as_str())) {
        return Some(format!(
            "{at}: the check does not know the keyword {unknown}"
        ));
    }
    if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
        let name = reference.strip_prefix("#/$defs/")?;
        return mismatch(root, &root["$defs"][name], value, at);
    }
    if let Some(types) = schema.get("type") {
        let types: Vec<&str> = match types {
            Value::String(one) => vec![one.as_str()],
            Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        let fits = types.iter().any(|kind| match *kind {
            "null" => value.is_null(),
            "boolean" => value.is_boolean(),
            "integer" => value.is_i64() || value.is_u64(),
            "number" => value.is_number(),
            "string" => value.is_string(),
            "array" => value.is_array(),
            "object" => value.is_object(),
            _ => false,
        });
        if !fits {
            return Some(format!("{at}: {value} is not of type {types:?}"));
        }
    }
    if let Some(choices) = schema.get("enum").and_then(Value::as_array)
        && !choices.contains(value)
    {
        return Some(format!("{at}: {value} is not one of {choices:?}"));
    }
    if let Some(constant) = schema.get("const")
        && constant != value
    {
        return Some(format!("{at}: {value} is not {constant}"));
    }
    if let (Some(minimum), Some(number)) = (
        schema.get("minimum").and_then(Value::as_f64),
        value.as_f64(),
    ) && number < minimum
    {
        return Some(format!("{at}: {value} is under {minimum}"));
    }
    if let Some(options) = schema.get("anyOf").and_then(Value::as_array)
        && options
            .iter()
            .all(|option| mismatch(root, option, value, at).is_some())
    {
        return Some(format!("{at}: {value} matches none of anyOf"));
    }
    if let Some(options) = schema.get("oneOf").and_then(Value::as_array) {
        let matching = options
            .iter()
            .filter(|option| mismatch(root, option, value, at).is_none())
            .count();
        if matching != 1 {
            return Some(format!("{at}: {value} matches {matching} of oneOf"));
        }
    }
    if let Some(object) = value.as_object() {
        for name in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            if !object.contains_key(name) {
                return Some(format!("{at}: required {name} is missing from {value}"));
            }
        }
        if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
            for (name, property) in properties {
                if let Some(field) = object.get(name)
                    && let Some(why) = mismatch(root, property, field, &format!("{at}.{name}"))
                {
                    return Some(why);
                }
            }
        }
    }
    if let (Some(items), Some(array)) = (schema.get("items"), value.as_array()) {
        for (index, item) in array.iter().enumerate() {
            if let Some(why) = mismatch(root, items, item, &format!("{at}[{index}]")) {
                return Some(why);
            }
        }
    }
    None
}

#[test]
fn the_check_can_fail() {
    let schema = serde_json::json!({
        "type": "object", "required": ["a"],
        "properties": {"a": {"$ref": "#/$defs/A"}},
        "$defs": {"A": {"type": ["integer", "null"], "minimum": 0}},
    });
    let check = |value: Value| mismatch(&schema, &schema, &value, "result");
    assert_eq!(check(serde_json::json!({"a": 1})), None);
    assert_eq!(check(serde_json::json!({"a": null})), None);
    assert!(check(serde_json::json!({})).is_some());
    assert!(check(serde_json::json!({"a": "x"})).is_some());
    assert!(check(serde_json::json!({"a": -1})).is_some());
}
