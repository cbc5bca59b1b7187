//! Field shapes several wire areas share: byte strings, environment
//! variables, milliseconds and terminal sizes.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;
use std::time::Duration;

use crate::capexec_capnp::{env_var, pty_size};
use crate::model::PtySize;

pub fn os_string(bytes: &[u8]) -> OsString {
    OsString::from_vec(bytes.to_vec())
}

pub fn path(bytes: &[u8]) -> PathBuf {
    PathBuf::from(os_string(bytes))
}

/// A `List(Data)` of byte strings.
pub fn byte_strings(list: capnp::data_list::Reader<'_>) -> capnp::Result<Vec<OsString>> {
    list.iter().map(|item| item.map(os_string)).collect()
}

/// Fills `list` (initialised with `items.len()` entries).
pub fn set_byte_strings<S: AsRef<OsStr>>(mut list: capnp::data_list::Builder<'_>, items: &[S]) {
    for (index, item) in items.iter().enumerate() {
        list.set(index as u32, item.as_ref().as_bytes());
    }
}

/// A `List(EnvVar)`.
pub fn env_vars(
    list: capnp::struct_list::Reader<'_, env_var::Owned>,
) -> capnp::Result<Vec<(OsString, OsString)>> {
    list.iter()
        .map(|var| Ok((os_string(var.get_name()?), os_string(var.get_value()?))))
        .collect()
}

/// Fills `list` (initialised with `vars.len()` entries).
pub fn set_env_vars(
    mut list: capnp::struct_list::Builder<'_, env_var::Owned>,
    vars: &[(OsString, OsString)],
) {
    for (index, (name, value)) in vars.iter().enumerate() {
        let mut var = list.reborrow().get(index as u32);
        var.set_name(name.as_bytes());
        var.set_value(value.as_bytes());
    }
}

/// A time limit in whole milliseconds, 0 for none; a limit below a
/// millisecond is rounded up, so that it stays a limit.
pub fn limit_millis(limit: Option<Duration>) -> u64 {
    limit.filter(|limit| !limit.is_zero()).map_or(0, |limit| {
        limit.as_millis().clamp(1, u128::from(u64::MAX)) as u64
    })
}

/// The time limit of [`limit_millis`].
pub fn limit_from_millis(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// A duration in milliseconds, saturated at the field's maximum.
pub fn millis_u32(duration: Duration) -> u32 {
    duration.as_millis().min(u128::from(u32::MAX)) as u32
}

pub fn pty_size_from_wire(size: pty_size::Reader<'_>) -> PtySize {
    PtySize {
        rows: size.get_rows(),
        cols: size.get_cols(),
    }
}

pub fn pty_size_to_wire(size: PtySize, mut builder: pty_size::Builder<'_>) {
    builder.set_rows(size.rows);
    builder.set_cols(size.cols);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_limits_round_up_and_zero_means_none() {
        assert_eq!(limit_millis(None), 0);
        assert_eq!(limit_millis(Some(Duration::ZERO)), 0);
        assert_eq!(limit_millis(Some(Duration::from_micros(10))), 1);
        assert_eq!(limit_millis(Some(Duration::from_millis(1500))), 1500);
        assert_eq!(limit_from_millis(0), None);
        assert_eq!(limit_from_millis(7), Some(Duration::from_millis(7)));
        assert_eq!(millis_u32(Duration::from_secs(u64::MAX / 4)), u32::MAX);
    }
}
