//! Raw system calls' results as `io::Result`s, written once.

use std::io;
use std::os::fd::RawFd;

/// The non-negative result of a system call, or the thread's `errno` for a
/// negative one (the C convention of every call used here).
pub(crate) fn cvt(result: impl Into<i64>) -> io::Result<i64> {
    let result = result.into();
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

/// read(2) into `buf`; the count of bytes now initialised there.
pub(crate) fn read(fd: RawFd, buf: &mut [std::mem::MaybeUninit<u8>]) -> io::Result<usize> {
    // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    cvt(n as i64).map(|n| n as usize)
}

/// write(2) from `buf`; the count of bytes written.
pub(crate) fn write(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: the kernel reads at most `buf.len()` bytes from `buf`.
    let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
    cvt(n as i64).map(|n| n as usize)
}
