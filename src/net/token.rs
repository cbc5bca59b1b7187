//! The shared secret of TCP listeners.

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A login token. Never printed: `Debug` shows nothing of it.
#[derive(Clone)]
pub struct Token(String);

#[derive(Debug)]
pub enum TokenError {
    Read(PathBuf, io::Error),
    Create(PathBuf, io::Error),
    Empty(PathBuf),
    /// Shorter than [`MIN_TOKEN_BYTES`]: the length found.
    TooShort(PathBuf, usize),
}

/// The largest token file read: a token is a line.
pub const MAX_TOKEN_FILE_BYTES: u64 = 64 * 1024;

/// The shortest token accepted (128 bits of hex would be 32): anything
/// shorter could be guessed by a patient peer, three guesses a connection.
pub const MIN_TOKEN_BYTES: usize = 16;

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenError::Read(path, error) => {
                write!(
                    f,
                    "cannot read token file {}: {}",
                    path.display(),
                    crate::model::io_message(error)
                )
            }
            TokenError::Create(path, error) => {
                write!(f, "cannot create token file {}: {error}", path.display())
            }
            TokenError::Empty(path) => write!(f, "token file {} is empty", path.display()),
            TokenError::TooShort(path, length) => write!(
                f,
                "token file {} holds a token of {length} bytes; a token needs at least \
                 {MIN_TOKEN_BYTES} (remove the file and a new random one is made)",
                path.display()
            ),
        }
    }
}

impl std::error::Error for TokenError {}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    pub fn new(secret: impl Into<String>) -> Token {
        Token(secret.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Compares in time independent of where (or whether) they differ, and
    /// of the candidate's length: both sides are hashed first.
    pub fn matches(&self, candidate: &str) -> bool {
        let expected = crate::secret::digest(&self.0);
        let given = crate::secret::digest(candidate);
        expected
            .iter()
            .zip(given.iter())
            .fold(0u8, |diff, (a, b)| diff | (a ^ b))
            == 0
    }

    /// Reads the token in `path` (surrounding white space is ignored): a
    /// regular file of at most 64 KiB.
    pub fn load(path: &Path) -> Result<Token, TokenError> {
        let text = crate::local_file::read_regular_text(path, MAX_TOKEN_FILE_BYTES)
            .map_err(|e| TokenError::Read(path.into(), e))?;
        let secret = text.trim();
        if secret.is_empty() {
            return Err(TokenError::Empty(path.into()));
        }
        if secret.len() < MIN_TOKEN_BYTES {
            return Err(TokenError::TooShort(path.into(), secret.len()));
        }
        if let Ok(meta) = fs::metadata(path)
            && meta.permissions().mode() & 0o077 != 0
        {
            tracing::warn!(
                path = %path.display(),
                "the token file is readable by other users; chmod 600 it"
            );
        }
        Ok(Token(secret.to_string()))
    }

    /// Reads the token in `path`, or creates a new random 256-bit one there
    /// (mode 0600) if the file does not exist. Returns whether it was created.
    pub fn load_or_create(path: &Path) -> Result<(Token, bool), TokenError> {
        match fs::symlink_metadata(path) {
            Ok(_) => Token::load(path).map(|token| (token, false)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                let token = Token(
                    crate::secret::random_hex(32)
                        .map_err(|e| TokenError::Create(path.into(), e))?,
                );
                write_new_private(path, &token.0)
                    .map_err(|e| TokenError::Create(path.into(), e))?;
                Ok((token, true))
            }
            Err(error) => Err(TokenError::Read(path.into(), error)),
        }
    }
}

/// `$XDG_CONFIG_HOME/capexec/token`, else `$HOME/.config/capexec/token`:
/// where `serve` and `run --connect` look when not told otherwise.
pub fn default_token_path() -> Option<PathBuf> {
    let config = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".config")))?;
    Some(config.join("capexec").join("token"))
}

fn write_new_private(path: &Path, secret: &str) -> io::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)?;
    }
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(secret.as_bytes())?;
    file.write_all(b"\n")?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_only_the_exact_secret() {
        let token = Token::new("s3cret");
        assert!(token.matches("s3cret"));
        assert!(!token.matches("s3cre"));
        assert!(!token.matches("s3cret "));
        assert!(!token.matches(""));
        assert_eq!(format!("{token:?}"), "Token(..)");
    }

    #[test]
    fn a_short_token_file_is_refused_with_its_length() {
        let dir = std::env::temp_dir().join(format!("capexec-short-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("token");
        fs::write(&path, "0123456789abcde\n").expect("write");
        let error = Token::load(&path).expect_err("15 bytes");
        assert_eq!(
            error.to_string(),
            format!(
                "token file {} holds a token of 15 bytes; a token needs at least 16 (remove \
                 the file and a new random one is made)",
                path.display()
            )
        );
        fs::write(&path, "0123456789abcdef").expect("write");
        assert!(
            Token::load(&path)
                .expect("16 bytes")
                .matches("0123456789abcdef")
        );
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn creates_a_private_random_token_once() {
        let dir = std::env::temp_dir().join(format!("capexec-token-{}", std::process::id()));
        let path = dir.join("nested").join("token");
        let (created, was_created) = Token::load_or_create(&path).expect("create");
        assert!(was_created);
        assert_eq!(created.as_str().len(), 64);
        assert!(created.as_str().bytes().all(|b| b.is_ascii_hexdigit()));
        let mode = fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let (loaded, was_created) = Token::load_or_create(&path).expect("load");
        assert!(!was_created);
        assert!(loaded.matches(created.as_str()));
        let _ = fs::remove_dir_all(&dir);
    }
}
