//! Values as messages show them to people.

/// A duration as messages show it: `10 s`, `0.5 s`, `1.25 s`; whole
/// minutes and hours as `5 min` and `2 h`.
pub fn show_duration(duration: std::time::Duration) -> String {
    let secs = duration.as_secs();
    let whole = duration.subsec_nanos() == 0;
    if whole && secs >= 3600 && secs.is_multiple_of(3600) {
        return format!("{} h", secs / 3600);
    }
    if whole && secs >= 60 && secs.is_multiple_of(60) {
        return format!("{} min", secs / 60);
    }
    let text = format!("{:.3}", duration.as_secs_f64());
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text} s")
}

/// An I/O error's text for people: without Rust's " (os error N)" suffix.
pub fn io_message(error: &std::io::Error) -> String {
    let text = error.to_string();
    match text.find(" (os error ") {
        Some(index) => text[..index].to_string(),
        None => text,
    }
}

/// How much of a value a peer sent a refusal quotes, in bytes.
pub const EXCERPT_BYTES: usize = 200;

/// `text`, or its first [`EXCERPT_BYTES`] bytes (cut at a character) and
/// its length: a refusal says what it refuses without repeating an 8 KiB
/// path back.
pub fn excerpt(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= EXCERPT_BYTES {
        return text.into();
    }
    let mut end = EXCERPT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &text[..end], text.len()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpts_keep_short_values_and_cut_long_ones_at_a_character() {
        assert_eq!(excerpt("short"), "short");
        let long = "é".repeat(150);
        let cut = excerpt(&long);
        assert_eq!(cut, format!("{}... (300 bytes)", "é".repeat(100)));
    }

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(show_duration(std::time::Duration::from_secs(10)), "10 s");
        assert_eq!(
            show_duration(std::time::Duration::from_millis(500)),
            "0.5 s"
        );
        assert_eq!(show_duration(std::time::Duration::from_secs(300)), "5 min");
        assert_eq!(show_duration(std::time::Duration::from_secs(7200)), "2 h");
    }
}
