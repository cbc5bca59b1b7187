//! Certificate fingerprints as people write them.

/// A SHA-256 fingerprint as people copy it: 64 hex digits in either case,
/// with or without `:`, space or `-` between them, after an optional label
/// (`sha256:`, `SHA256=`, openssl's `SHA256 Fingerprint=`, or the
/// `sha256="..."` that `capexec serve` logs), quotes allowed.
pub fn parse_fingerprint(text: &str) -> Result<[u8; 32], String> {
    let unquoted = |text: &str| {
        text.trim()
            .trim_matches(|c| c == '"' || c == '\'')
            .to_string()
    };
    let mut rest = unquoted(text);
    let lower = rest.to_ascii_lowercase();
    for label in [
        "sha256 fingerprint",
        "sha-256 fingerprint",
        "sha256",
        "sha-256",
    ] {
        if let Some(after) = lower.strip_prefix(label)
            && let Some(value) = after.trim_start().strip_prefix(['=', ':'])
        {
            rest = unquoted(&rest[rest.len() - value.len()..]);
            break;
        }
    }
    let hex: String = rest
        .chars()
        .filter(|c| !matches!(c, ':' | ' ' | '-'))
        .collect();
    if hex.len() == 40 && hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!(
            "{text:?} is a SHA-1 fingerprint (40 hex digits): pin the SHA-256 one, which \
             `capexec serve` logs (or `openssl x509 -noout -fingerprint -sha256 -in CERT`)"
        ));
    }
    if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!(
            "{text:?} is not a SHA-256 fingerprint: expected 64 hex digits (colons allowed), \
             as `capexec serve` logs it"
        ));
    }
    let mut bytes = [0u8; 32];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
            .map_err(|_| format!("{text:?} is not a SHA-256 fingerprint"))?;
    }
    Ok(bytes)
}

/// A SHA-256 fingerprint as `capexec serve` prints one: 64 lowercase hex
/// digits.
pub fn show_fingerprint(sha256: &[u8; 32]) -> String {
    sha256.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_parse_in_every_common_spelling() {
        let hex = "ab".repeat(32);
        let colons = vec!["AB"; 32].join(":");
        let spellings = [
            hex.clone(),
            hex.to_uppercase(),
            colons.clone(),
            vec!["ab"; 32].join(" "),
            format!("sha256:{hex}"),
            format!("SHA256:{colons}"),
            format!("SHA256 Fingerprint={colons}"),
            format!("sha256 Fingerprint={colons}"),
            format!("sha256=\"{hex}\""),
            format!("  \"{hex}\"  "),
            format!("SHA-256: {colons}"),
        ];
        for spelling in &spellings {
            assert_eq!(parse_fingerprint(spelling), Ok([0xab; 32]), "{spelling}");
        }
        assert!(parse_fingerprint("abcd").is_err());
        assert!(parse_fingerprint(&"zz".repeat(32)).is_err());
        let sha1 = parse_fingerprint(&vec!["AB"; 20].join(":")).expect_err("SHA-1");
        assert!(sha1.contains("SHA-1"), "{sha1}");
    }
}
