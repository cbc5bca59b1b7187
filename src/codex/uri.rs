//! `file://` URIs, the only form of path Codex's protocol carries.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use super::jsonrpc::RpcError;

/// The absolute path a `file://` URI names (percent-escapes decoded; a
/// host other than none or `localhost` refused, as it names another
/// machine).
pub fn to_path(uri: &str) -> Result<PathBuf, RpcError> {
    let Some((scheme, rest)) = uri.split_once(':') else {
        return Err(RpcError::invalid_params(format!(
            "invalid URI `{uri}`: a file:// URI is expected"
        )));
    };
    if !scheme.eq_ignore_ascii_case("file") {
        return Err(RpcError::invalid_params(format!(
            "unsupported path URI scheme `{scheme}`"
        )));
    }
    let Some(authority_and_path) = rest.strip_prefix("//") else {
        return Err(RpcError::invalid_params(format!(
            "invalid URI `{uri}`: a file:// URI is expected"
        )));
    };
    let (host, path) = match authority_and_path.find('/') {
        Some(slash) => authority_and_path.split_at(slash),
        None => (authority_and_path, ""),
    };
    if !(host.is_empty() || host.eq_ignore_ascii_case("localhost")) {
        return Err(RpcError::invalid_params(format!(
            "invalid URI `{uri}`: host `{host}` is not this executor's"
        )));
    }
    let path = path.split(['?', '#']).next().unwrap_or_default();
    if path.is_empty() {
        return Err(RpcError::invalid_params(format!(
            "invalid URI `{uri}`: it names no path"
        )));
    }
    let bytes = decode(path.as_bytes())
        .ok_or_else(|| RpcError::invalid_params(format!("invalid URI `{uri}`: a bad %-escape")))?;
    if bytes.contains(&0) {
        return Err(RpcError::invalid_params(format!(
            "invalid URI `{uri}`: a path cannot hold NUL"
        )));
    }
    Ok(PathBuf::from(OsString::from_vec(bytes)))
}

/// The `file://` URI of an absolute path, escaping what a URI may not
/// hold literally.
pub fn from_path(path: &Path) -> String {
    let mut uri = String::from("file://");
    for &byte in path.as_os_str().as_bytes() {
        if byte.is_ascii_alphanumeric() || b"/-._~!$&'()*+,;=:@".contains(&byte) {
            uri.push(char::from(byte));
        } else {
            uri.push_str(&format!("%{byte:02X}"));
        }
    }
    uri
}

fn decode(text: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len());
    let mut rest = text;
    while let Some((&byte, tail)) = rest.split_first() {
        if byte == b'%' {
            let hex = tail.get(..2)?;
            let value = u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
            out.push(value);
            rest = &tail[2..];
        } else {
            out.push(byte);
            rest = tail;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_round_trip_through_uris() {
        for path in ["/", "/tmp/a b", "/x/%41", "/é/ü", "/a?b#c"] {
            let uri = from_path(Path::new(path));
            assert_eq!(to_path(&uri).unwrap(), PathBuf::from(path), "{uri}");
        }
        assert_eq!(from_path(Path::new("/tmp/a b")), "file:///tmp/a%20b");
        assert_eq!(
            to_path("file://localhost/etc").unwrap(),
            PathBuf::from("/etc")
        );
    }

    #[test]
    fn what_is_not_a_local_file_uri_is_refused() {
        for uri in [
            "/etc",
            "etc",
            "http://x/y",
            "file://host/etc",
            "file://",
            "file:///%4",
            "file:///a%00b",
        ] {
            assert_eq!(to_path(uri).unwrap_err().code, -32602, "{uri}");
        }
    }
}
