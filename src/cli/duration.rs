//! Durations on the command line, written as timeout(1) takes them: a
//! number of seconds with an optional fraction and an optional unit
//! (`s`, `m`, `h` or `d`): `10`, `0.5`, `90s`, `5m`, `1h`.

use std::time::Duration;

/// The longest duration any flag takes: a year, far beyond any sensible
/// limit, and far from overflowing anything it is added to.
const LONGEST: Duration = Duration::from_secs(365 * 24 * 3600);

/// Parses `text` as timeout(1) would. Errors read after the flag's name
/// (`--timeout expects ...`).
pub fn parse(text: &str) -> Result<Duration, String> {
    let bad = || format!("expects a duration such as 10, 0.5, 90s, 5m or 1h, got {text:?}");
    let trimmed = text.trim();
    let (number, unit) = match trimmed.char_indices().last() {
        Some((at, unit @ ('s' | 'm' | 'h' | 'd'))) => (&trimmed[..at], unit),
        _ => (trimmed, 's'),
    };
    let digits_only = number.chars().all(|c| c.is_ascii_digit() || c == '.');
    if number.is_empty() || !digits_only || number == "." {
        return Err(bad());
    }
    let value: f64 = number.parse().map_err(|_| bad())?;
    let scale = match unit {
        'm' => 60.0,
        'h' => 3600.0,
        'd' => 86_400.0,
        _ => 1.0,
    };
    let seconds = value * scale;
    if seconds > LONGEST.as_secs_f64() {
        return Err(format!("takes at most a year, got {text:?}"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// [`parse`], for flags where 0 would mean nothing sensible.
pub fn parse_positive(text: &str) -> Result<Duration, String> {
    match parse(text)? {
        Duration::ZERO => Err(format!("needs a duration above 0, got {text:?}")),
        duration => Ok(duration),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_as_timeout_1_takes_them() {
        let cases = [
            ("10", 10_000),
            ("0.5", 500),
            ("90s", 90_000),
            ("5m", 300_000),
            ("1h", 3_600_000),
            ("1.5m", 90_000),
            ("2d", 172_800_000),
            (".25", 250),
            ("0", 0),
        ];
        for (text, millis) in cases {
            assert_eq!(parse(text), Ok(Duration::from_millis(millis)), "{text}");
        }
        for bad in [
            "", "s", "-1", "1x", "1 m", "abc", ".", "1e3", "nan", "inf", "400d",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_show_in_the_notes_form() {
        assert_eq!(
            capexec::model::show_duration(Duration::from_secs(10)),
            "10 s"
        );
        assert_eq!(
            capexec::model::show_duration(Duration::from_millis(500)),
            "0.5 s"
        );
        assert_eq!(
            capexec::model::show_duration(Duration::from_millis(1250)),
            "1.25 s"
        );
        assert_eq!(
            capexec::model::show_duration(Duration::from_secs(300)),
            "5 min"
        );
        assert_eq!(
            capexec::model::show_duration(Duration::from_secs(7200)),
            "2 h"
        );
        assert_eq!(
            capexec::model::show_duration(Duration::from_secs(90)),
            "90 s"
        );
    }
}
