//! When a certificate is valid: its `notBefore` and `notAfter`, read
//! straight from the DER (RFC 5280: Certificate > TBSCertificate >
//! Validity), so that `capexec serve` can warn before its clients start
//! refusing it, and a client can check a self-signed certificate it trusts
//! as its own anchor. Five fixed steps
//! into the structure; a full X.509 parser would add a dozen crates to the
//! server to read this one field.

use std::time::{Duration, SystemTime};

use rustls::pki_types::CertificateDer;

/// The end of the certificate's validity, or `None` if it cannot be read.
pub(crate) fn not_after(certificate: &CertificateDer<'_>) -> Option<SystemTime> {
    time(skip(validity(certificate)?)?)
}

/// The start of the certificate's validity, or `None` if it cannot be read.
pub(crate) fn not_before(certificate: &CertificateDer<'_>) -> Option<SystemTime> {
    time(validity(certificate)?)
}

/// The contents of the certificate's `Validity` (notBefore, notAfter).
fn validity<'a>(certificate: &'a CertificateDer<'_>) -> Option<&'a [u8]> {
    let (certificate, _) = element(certificate.as_ref(), SEQUENCE)?;
    let (mut tbs, _) = element(certificate, SEQUENCE)?;
    // version [0] EXPLICIT, optional (absent in version 1 certificates).
    if tbs.first() == Some(&0xa0) {
        tbs = skip(tbs)?;
    }
    let tbs = skip(tbs)?; // serialNumber
    let tbs = skip(tbs)?; // signature
    let tbs = skip(tbs)?; // issuer
    let (validity, _) = element(tbs, SEQUENCE)?;
    Some(validity)
}

const SEQUENCE: u8 = 0x30;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// The contents of the element at the start of `der` if it has `tag`, and
/// what follows it.
fn element(der: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    (der.first()? == &tag).then_some(())?;
    let (length, header) = length(&der[1..])?;
    let start = 1 + header;
    let end = start.checked_add(length)?;
    Some((der.get(start..end)?, der.get(end..)?))
}

/// What follows the element at the start of `der`.
fn skip(der: &[u8]) -> Option<&[u8]> {
    let (length, header) = length(der.get(1..)?)?;
    der.get((1 + header).checked_add(length)?..)
}

/// A DER length and how many bytes encode it.
fn length(der: &[u8]) -> Option<(usize, usize)> {
    let first = *der.first()?;
    if first < 0x80 {
        return Some((usize::from(first), 1));
    }
    let count = usize::from(first & 0x7f);
    if count == 0 || count > 4 {
        return None;
    }
    let value = der
        .get(1..1 + count)?
        .iter()
        .fold(0usize, |value, byte| (value << 8) | usize::from(*byte));
    Some((value, 1 + count))
}

/// A UTCTime (`YYMMDDHHMMSSZ`, years 1950 to 2049) or GeneralizedTime
/// (`YYYYMMDDHHMMSSZ`) at the start of `der`.
fn time(der: &[u8]) -> Option<SystemTime> {
    let (text, year) = match *der.first()? {
        UTC_TIME => {
            let (text, _) = element(der, UTC_TIME)?;
            let short = number(text.get(0..2)?)?;
            (
                text.get(2..)?,
                if short < 50 {
                    2000 + short
                } else {
                    1900 + short
                },
            )
        }
        GENERALIZED_TIME => {
            let (text, _) = element(der, GENERALIZED_TIME)?;
            (text.get(4..)?, number(text.get(0..4)?)?)
        }
        _ => return None,
    };
    if text.len() != 11 || text[10] != b'Z' {
        return None;
    }
    let field = |at: usize| number(&text[at..at + 2]);
    let (month, day) = (field(0)?, field(2)?);
    let (hour, minute, second) = (field(4)?, field(6)?, field(8)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    let days = days_from_civil(year, month, day)?;
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second.min(60);
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(seconds))
}

fn number(digits: &[u8]) -> Option<u64> {
    digits.iter().try_fold(0u64, |value, digit| {
        digit
            .is_ascii_digit()
            .then(|| value * 10 + u64::from(digit - b'0'))
    })
}

/// Days from 1970-01-01 to a date on or after it (Howard Hinnant's
/// algorithm).
fn days_from_civil(year: u64, month: u64, day: u64) -> Option<u64> {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year / 400;
    let year_of_era = year - era * 400;
    let month_index = (month + 9) % 12;
    let day_of_year = (153 * month_index + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    (era * 146_097 + day_of_era).checked_sub(719_468)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_count_days_as_the_calendar_does() {
        assert_eq!(days_from_civil(1970, 1, 1), Some(0));
        assert_eq!(days_from_civil(2000, 3, 1), Some(11_017));
        assert_eq!(days_from_civil(2024, 2, 29), Some(19_782));
    }

    #[test]
    fn both_time_forms_are_read() {
        let utc = [&[UTC_TIME, 13][..], b"491231235959Z"].concat();
        let generalized = [&[GENERALIZED_TIME, 15][..], b"20500101000000Z"].concat();
        let seconds = |time: SystemTime| {
            time.duration_since(SystemTime::UNIX_EPOCH)
                .expect("after 1970")
                .as_secs()
        };
        assert_eq!(time(&utc).map(seconds), Some(2_524_607_999));
        assert_eq!(time(&generalized).map(seconds), Some(2_524_608_000));
        assert_eq!(time(b"\x17\x03abc"), None);
    }
}
