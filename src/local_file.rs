//! The files a user names to capexec and capexec reads at start or on
//! SIGHUP: token files, TLS certificates, keys and CAs, the client's
//! configuration and its known servers. Each is opened without blocking
//! and read only if the opened descriptor is a regular file, and at most
//! to a bound: a FIFO's open would wait for a writer for ever, a device
//! such as `/dev/zero` never ends, and either would hang a command that
//! has not yet set up its signals. The errors say what the file is; the
//! callers name it.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Opens `path` for reading without blocking (`O_NONBLOCK`: a FIFO's open
/// returns at once) and refuses anything but a regular file, judged by
/// the descriptor opened, so nothing can be swapped in between.
pub fn open_regular_file(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|error| explain_open_error(path, error))?;
    ensure_regular(&file)?;
    Ok(file)
}

/// The whole of the regular file at `path`, if it holds at most
/// `max_bytes` (see [`open_regular_file`]).
pub fn read_regular_file(path: &Path, max_bytes: u64) -> io::Result<Vec<u8>> {
    let file = open_regular_file(path)?;
    let size = file.metadata()?.len();
    if size > max_bytes {
        return Err(too_large(max_bytes));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    // A file that grows while it is read is cut at the bound, and refused.
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_large(max_bytes));
    }
    Ok(bytes)
}

/// [`read_regular_file`] as UTF-8 text.
pub fn read_regular_text(path: &Path, max_bytes: u64) -> io::Result<String> {
    String::from_utf8(read_regular_file(path, max_bytes)?).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "it is not UTF-8 text".to_string(),
        )
    })
}

/// Refuses a descriptor that is not a regular file, saying what it is.
pub fn ensure_regular(file: &File) -> io::Result<()> {
    let kind = file.metadata()?.file_type();
    let what = if kind.is_file() {
        return Ok(());
    } else if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a file"
    };
    Err(not_regular(what))
}

fn not_regular(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("it is {what}, not a regular file"),
    )
}

/// A socket cannot be opened at all (`ENXIO`, "No such device or
/// address"): say what is there instead.
fn explain_open_error(path: &Path, error: io::Error) -> io::Error {
    if error.raw_os_error() == Some(libc::ENXIO)
        && std::fs::metadata(path).is_ok_and(|meta| meta.file_type().is_socket())
    {
        return not_regular("a socket");
    }
    error
}

fn too_large(max_bytes: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::FileTooLarge,
        format!(
            "it is larger than {}, the most capexec reads of such a file",
            shown_size(max_bytes)
        ),
    )
}

/// `16 MiB`, `64 KiB`, or bytes.
fn shown_size(bytes: u64) -> String {
    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * 1024;
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= KIB && bytes.is_multiple_of(KIB) {
        format!("{} KiB", bytes / KIB)
    } else {
        format!("{bytes} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("capexec-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        dir
    }

    fn message(error: io::Error) -> String {
        crate::model::io_message(&error)
    }

    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let dir = dir("local-fifo");
        let fifo = dir.join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        let error = read_regular_file(&fifo, 1024).expect_err("a FIFO");
        assert_eq!(
            message(error),
            "it is a FIFO (named pipe), not a regular file"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn devices_directories_and_sockets_are_refused_as_what_they_are() {
        assert_eq!(
            message(read_regular_file(Path::new("/dev/zero"), 1024).expect_err("/dev/zero")),
            "it is a character device, not a regular file"
        );
        let dir = dir("local-kinds");
        assert_eq!(
            message(read_regular_file(&dir, 1024).expect_err("a directory")),
            "it is a directory, not a regular file"
        );
        let socket = dir.join("socket");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
        assert_eq!(
            message(read_regular_file(&socket, 1024).expect_err("a socket")),
            "it is a socket, not a regular file"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_over_the_bound_is_refused_with_the_bound_and_one_at_it_is_read() {
        let dir = dir("local-size");
        let file = dir.join("file");
        std::fs::write(&file, vec![b'x'; 2048]).expect("write");
        assert_eq!(
            read_regular_file(&file, 2048).expect("at the bound").len(),
            2048
        );
        assert_eq!(
            message(read_regular_file(&file, 2047).expect_err("over")),
            "it is larger than 2047 bytes, the most capexec reads of such a file"
        );
        assert_eq!(
            message(read_regular_file(&file, 1024).expect_err("over")),
            "it is larger than 1 KiB, the most capexec reads of such a file"
        );
        assert_eq!(
            read_regular_file(&dir.join("missing"), 1)
                .expect_err("missing")
                .kind(),
            io::ErrorKind::NotFound
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
