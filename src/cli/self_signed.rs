//! `capexec serve --tls-self-signed`: a key and certificate of the
//! server's own, made on first start and kept, so that TLS is one flag and
//! clients trust it by its fingerprint (on first use, or pinned).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Where the server's own certificate and key are kept.
pub fn paths() -> Result<(PathBuf, PathBuf), String> {
    let dir = crate::cli::config::config_dir().ok_or_else(|| {
        "--tls-self-signed keeps its certificate in $XDG_CONFIG_HOME/capexec or \
         ~/.config/capexec, and neither is set: give --tls-cert and --tls-key"
            .to_string()
    })?;
    Ok((dir.join("server-cert.pem"), dir.join("server-key.pem")))
}

/// The kept certificate and key, made first if there are none; whether
/// they were made now.
pub fn load_or_make() -> Result<(PathBuf, PathBuf, bool), String> {
    let (cert, key) = paths()?;
    match (cert.exists(), key.exists()) {
        (true, true) => return Ok((cert, key, false)),
        (false, false) => {}
        (true, false) | (false, true) => {
            return Err(format!(
                "--tls-self-signed: only one of {} and {} exists: remove it to have both made \
                 again",
                cert.display(),
                key.display()
            ));
        }
    }
    let hostname = nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .filter(|name| !name.is_empty());
    let mut names = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    names.extend(hostname);
    let made = rcgen::generate_simple_self_signed(names)
        .map_err(|error| format!("--tls-self-signed: cannot make a certificate: {error}"))?;
    if let Some(dir) = cert.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .create(dir)
            .map_err(|error| written(dir, &error))?;
    }
    // The key first, so that a certificate never exists without it.
    write_new(&key, made.signing_key.serialize_pem().as_bytes())?;
    write_new(&cert, made.cert.pem().as_bytes())?;
    Ok((cert, key, true))
}

fn write_new(path: &Path, bytes: &[u8]) -> Result<(), String> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut file| file.write_all(bytes))
        .map_err(|error| written(path, &error))
}

fn written(path: &Path, error: &std::io::Error) -> String {
    format!(
        "--tls-self-signed: cannot write {}: {}",
        path.display(),
        capexec::model::io_message(error)
    )
}
