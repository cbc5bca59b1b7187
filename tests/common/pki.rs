//! Certificates for TLS tests, made on the spot with rcgen.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, date_time_ymd,
};

/// A certificate authority that writes its certificate to `dir/NAME.pem`.
pub struct Authority {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub pem: PathBuf,
}

impl Authority {
    pub fn new(dir: &Path, name: &str) -> Authority {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("capexec test {name}"));
        let key = KeyPair::generate().expect("key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("CA");
        let pem = dir.join(format!("{name}.pem"));
        std::fs::write(&pem, issuer.pem()).expect("write CA");
        Authority { issuer, pem }
    }

    /// A server certificate for `names`, expired if asked; returns the
    /// certificate and key files.
    pub fn server(
        &self,
        dir: &Path,
        file: &str,
        names: &[&str],
        expired: bool,
    ) -> (PathBuf, PathBuf) {
        self.server_with(dir, file, names, |params| {
            if expired {
                params.not_before = date_time_ymd(2000, 1, 1);
                params.not_after = date_time_ymd(2001, 1, 1);
            }
        })
    }

    /// A server certificate for `names` that stops being valid at `until`.
    pub fn server_valid_until(
        &self,
        dir: &Path,
        file: &str,
        names: &[&str],
        until: SystemTime,
    ) -> (PathBuf, PathBuf) {
        self.server_with(dir, file, names, |params| {
            params.not_before = (until - Duration::from_secs(365 * 86_400)).into();
            params.not_after = until.into();
        })
    }

    fn server_with(
        &self,
        dir: &Path,
        file: &str,
        names: &[&str],
        validity: impl FnOnce(&mut CertificateParams),
    ) -> (PathBuf, PathBuf) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("params");
        validity(&mut params);
        let key = KeyPair::generate().expect("key");
        let certificate = params.signed_by(&key, &self.issuer).expect("sign");
        let (cert, key_file) = (
            dir.join(format!("{file}.pem")),
            dir.join(format!("{file}.key")),
        );
        std::fs::write(&cert, certificate.pem()).expect("write cert");
        std::fs::write(&key_file, key.serialize_pem()).expect("write key");
        (cert, key_file)
    }

    /// A key that belongs to no certificate, for mismatched pairs.
    pub fn stray_key(dir: &Path, file: &str) -> PathBuf {
        let path = dir.join(format!("{file}.key"));
        let key = KeyPair::generate().expect("key");
        std::fs::write(&path, key.serialize_pem()).expect("write key");
        path
    }
}
