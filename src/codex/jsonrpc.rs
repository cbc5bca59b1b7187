//! Codex's JSON-RPC dialect: messages without a `"jsonrpc"` field, ids
//! that are integers or strings, and the error codes Codex's exec-server
//! answers with (its client tells a missing file from a bad parameter by
//! the code alone).

use serde_json::{Map, Value, json};

/// Codex's code for a path that does not exist.
pub const NOT_FOUND: i64 = -32004;
/// JSON-RPC's codes, as Codex's exec-server uses them.
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;

/// An error answer: a code and the sentence Codex shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
        }
    }

    pub fn invalid_params(message: impl Into<String>) -> RpcError {
        RpcError::new(INVALID_PARAMS, message)
    }

    pub fn invalid_request(message: impl Into<String>) -> RpcError {
        RpcError::new(INVALID_REQUEST, message)
    }

    pub fn not_found(message: impl Into<String>) -> RpcError {
        RpcError::new(NOT_FOUND, message)
    }

    pub fn internal(message: impl Into<String>) -> RpcError {
        RpcError::new(INTERNAL_ERROR, message)
    }

    pub fn unknown_method(method: &str) -> RpcError {
        RpcError::new(
            METHOD_NOT_FOUND,
            format!("capexec codex-bridge does not implement `{method}`"),
        )
    }
}

/// One message a client sent.
#[derive(Debug)]
pub enum Incoming {
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    Notification {
        method: String,
        params: Value,
    },
    /// A response to a request of ours: the bridge sends none, so it is
    /// ignored.
    Response,
}

/// Parses one message; the error is the answer to send (with id -1 when
/// the message had none that could be read, as Codex's server does).
pub fn parse(text: &str) -> Result<Incoming, (Value, RpcError)> {
    let value: Value = serde_json::from_str(text).map_err(|error| {
        (
            json!(-1),
            RpcError::invalid_request(format!("failed to parse JSON-RPC message: {error}")),
        )
    })?;
    let Value::Object(mut object) = value else {
        return Err((
            json!(-1),
            RpcError::invalid_request("a JSON-RPC message must be an object"),
        ));
    };
    let id = object.remove("id");
    if let Some(id) = &id
        && !(id.is_i64() || id.is_u64() || id.is_string())
    {
        return Err((
            json!(-1),
            RpcError::invalid_request("a request's id must be an integer or a string"),
        ));
    }
    let params = object.remove("params").unwrap_or(Value::Null);
    match (object.remove("method"), id) {
        (Some(Value::String(method)), Some(id)) => Ok(Incoming::Request { id, method, params }),
        (Some(Value::String(method)), None) => Ok(Incoming::Notification { method, params }),
        (Some(_), id) => Err((
            id.unwrap_or(json!(-1)),
            RpcError::invalid_request("a method must be a string"),
        )),
        (None, Some(_)) if object.contains_key("result") || object.contains_key("error") => {
            Ok(Incoming::Response)
        }
        (None, id) => Err((
            id.unwrap_or(json!(-1)),
            RpcError::invalid_request("a message needs a method, or a result or an error"),
        )),
    }
}

/// The text of a successful answer.
pub fn result(id: &Value, result: Value) -> String {
    let mut object = Map::with_capacity(2);
    object.insert("id".into(), id.clone());
    object.insert("result".into(), result);
    Value::Object(object).to_string()
}

/// The text of an error answer.
pub fn error(id: &Value, error: &RpcError) -> String {
    json!({"id": id, "error": {"code": error.code, "message": error.message}}).to_string()
}

/// The text of a notification.
pub fn notification(method: &str, params: Value) -> String {
    json!({"method": method, "params": params}).to_string()
}

/// Reads `params` as `T`, answering -32602 with serde's sentence (Codex's
/// own: "missing field `path`") when it does not fit.
pub fn params<T: serde::de::DeserializeOwned>(params: Value) -> Result<T, RpcError> {
    let params = if params.is_null() {
        Value::Object(Map::new())
    } else {
        params
    };
    serde_json::from_value(params).map_err(|error| RpcError::invalid_params(error.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_notifications_and_garbage_are_told_apart() {
        assert!(matches!(
            parse(r#"{"id":1,"method":"initialize","params":{}}"#),
            Ok(Incoming::Request { ref method, .. }) if method == "initialize"
        ));
        assert!(matches!(
            parse(r#"{"id":"a","method":"x"}"#),
            Ok(Incoming::Request { ref id, .. }) if id == "a"
        ));
        assert!(matches!(
            parse(r#"{"method":"initialized","params":{}}"#),
            Ok(Incoming::Notification { .. })
        ));
        assert!(matches!(
            parse(r#"{"id":3,"result":{}}"#),
            Ok(Incoming::Response)
        ));
        let (id, error) = parse("{bad json").unwrap_err();
        assert_eq!((id, error.code), (json!(-1), INVALID_REQUEST));
        let (id, error) = parse(r#"{"id":[1],"method":"x"}"#).unwrap_err();
        assert_eq!((id, error.code), (json!(-1), INVALID_REQUEST));
        let (id, error) = parse(r#"{"id":7}"#).unwrap_err();
        assert_eq!((id, error.code), (json!(7), INVALID_REQUEST));
    }

    #[test]
    fn answers_have_codex_shape() {
        assert_eq!(result(&json!(1), json!({})), r#"{"id":1,"result":{}}"#);
        assert_eq!(
            error(&json!("x"), &RpcError::not_found("gone")),
            r#"{"error":{"code":-32004,"message":"gone"},"id":"x"}"#
        );
    }
}
