//! What the first bytes a server sent say of it, when the connection
//! failed before it answered: a TLS server, or not a capexec server at all
//! (an HTTP or SSH port given by mistake), which the user is told in those
//! words instead of the frame reader's "a frame announces 1347703881
//! segments".

/// How many of a server's first bytes are kept to say what it is.
pub(crate) const KEPT: usize = 64;

/// Longest excerpt of a text line quoted back to the user.
const QUOTED_CHARS: usize = 60;

/// Bytes shown of an answer that is not text.
const SHOWN_BYTES: usize = 12;

/// Whether `first` starts a TLS record (a handshake or an alert): a TLS
/// server answering a plaintext client.
pub(crate) fn look_like_tls(first: &[u8]) -> bool {
    matches!(first, [0x15 | 0x16, 0x03, ..])
}

/// What a peer that sent `first` is, in the words of "not a capexec
/// server (...)", unless they could begin a Cap'n Proto frame that this
/// client would read (or nothing was sent).
pub(crate) fn not_capexec(first: &[u8]) -> Option<String> {
    if first.is_empty() || could_begin_a_frame(first) {
        return None;
    }
    let line_end = first
        .iter()
        .position(|&b| b == b'\r' || b == b'\n')
        .unwrap_or(first.len());
    let line = &first[..line_end];
    let text = !line.is_empty()
        && line
            .iter()
            .all(|&b| b == b'\t' || (b' '..=b'~').contains(&b));
    if !text {
        let shown: Vec<String> = first
            .iter()
            .take(SHOWN_BYTES)
            .map(|b| format!("{b:02x}"))
            .collect();
        let more = if first.len() > SHOWN_BYTES {
            " ..."
        } else {
            ""
        };
        return Some(format!("it sent the bytes {}{more}", shown.join(" ")));
    }
    let mut quoted: String = String::from_utf8_lossy(line)
        .chars()
        .take(QUOTED_CHARS)
        .collect();
    if line.len() > QUOTED_CHARS {
        quoted.push_str("...");
    }
    Some(if line.starts_with(b"HTTP/") {
        format!("it answered in HTTP: {quoted:?}")
    } else if line.starts_with(b"SSH-") {
        format!("it sent an SSH banner: {quoted:?}")
    } else {
        format!("it sent {quoted:?}")
    })
}

/// What the frame reader would take as the start of a frame: a segment
/// count (less one, a little-endian u32) below
/// `crate::net::frame::MAX_SEGMENTS`, then a first segment no longer than
/// a message may be (`crate::net::guard::RECEIVE_LIMIT_WORDS`). Text
/// fails the first test (its second to fourth bytes are not zero), and the
/// binary protocols whose first bytes pass it (a length in little-endian,
/// as MySQL's greeting and PostgreSQL's messages begin) fail the second.
fn could_begin_a_frame(first: &[u8]) -> bool {
    let word = |at: usize| {
        let mut bytes = [0u8; 4];
        for (slot, byte) in bytes.iter_mut().zip(first.iter().skip(at)) {
            *slot = *byte;
        }
        u32::from_le_bytes(bytes) as usize
    };
    word(0) < crate::net::frame::MAX_SEGMENTS && word(4) <= crate::net::guard::RECEIVE_LIMIT_WORDS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_not_a_capexec_server_is_said_in_its_own_terms() {
        assert_eq!(
            not_capexec(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n").as_deref(),
            Some("it answered in HTTP: \"HTTP/1.1 400 Bad Request\"")
        );
        assert_eq!(
            not_capexec(b"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13.5\r\n").as_deref(),
            Some("it sent an SSH banner: \"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13.5\"")
        );
        assert_eq!(
            not_capexec(b"220 mail.example.com ESMTP\r\n").as_deref(),
            Some("it sent \"220 mail.example.com ESMTP\"")
        );
        assert_eq!(
            not_capexec(&[
                0x45, 0, 0, 0, 0x6a, 0x53, 0x46, 0x41, 0x54, 0x41, 0x4c, 0, 0x43, 0x30
            ])
            .as_deref(),
            Some("it sent the bytes 45 00 00 00 6a 53 46 41 54 41 4c 00 ...")
        );
        // MySQL's greeting: a length in little-endian, then the version.
        assert_eq!(
            not_capexec(b"\x4a\x00\x00\x00\x0a8.0.36\x00").as_deref(),
            Some("it sent the bytes 4a 00 00 00 0a 38 2e 30 2e 33 36 00")
        );
        let long = [b'x'; KEPT];
        assert_eq!(
            not_capexec(&long),
            Some(format!("it sent \"{}...\"", "x".repeat(QUOTED_CHARS)))
        );
        // What a capexec server sends first: a frame of one segment (or a
        // few), and anything that could still become one.
        for frame in [
            &[0u8, 0, 0, 0, 3, 0, 0, 0][..],
            &[1, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0],
            &[0xff, 1, 0, 0],
            &[0],
            &[0xff, 1],
        ] {
            assert_eq!(not_capexec(frame), None, "{frame:?}");
        }
        assert_eq!(not_capexec(b""), None);
        assert!(look_like_tls(&[0x15, 0x03, 0x03]));
        assert!(!look_like_tls(b"HTTP/1.1"));
    }
}
