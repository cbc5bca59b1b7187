//! TLS for TCP connections (rustls, ring): the server's certificate, and
//! the two ways a client can trust it: a CA certificate file (with the
//! usual name and validity checks) or a pinned SHA-256 fingerprint of the
//! server's own certificate (no CA needed, as with `ssh`'s known hosts).
//! With TLS on, the login token only ever crosses the network encrypted.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};

/// A TLS set-up that could not be made, with the file and the reason.
#[derive(Debug)]
pub struct TlsError(String);

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TlsError {}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The server side: a certificate chain and its private key.
#[derive(Clone)]
pub struct TlsServer {
    pub(crate) config: Arc<rustls::ServerConfig>,
    fingerprint: String,
}

impl fmt::Debug for TlsServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsServer")
            .field("fingerprint", &self.fingerprint)
            .finish()
    }
}

impl TlsServer {
    /// Loads a PEM certificate chain (the server's certificate first) and a
    /// PEM private key.
    pub fn from_files(cert: &Path, key: &Path) -> Result<TlsServer, TlsError> {
        let chain = load_certificates(cert)?;
        let key = PrivateKeyDer::from_pem_file(key).map_err(|error| {
            TlsError(format!(
                "--tls-key {}: no usable private key: {error}",
                key.display()
            ))
        })?;
        let fingerprint = fingerprint(&chain[0]);
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|error| TlsError(format!("TLS set-up: {error}")))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|error| {
                TlsError(format!(
                    "--tls-cert {} and --tls-key do not make a usable pair: {error}",
                    cert.display()
                ))
            })?;
        Ok(TlsServer {
            config: Arc::new(config),
            fingerprint,
        })
    }

    /// SHA-256 of the server's certificate, as clients pin it.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }
}

/// How a client decides to trust a server's certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerTrust {
    /// Certificates signed by the CA certificate(s) in this PEM file, valid
    /// now and for the host name (or IP address) connected to.
    Ca(PathBuf),
    /// Exactly the certificate with this SHA-256 fingerprint (64 hex
    /// digits, colons allowed).
    Pin(String),
}

/// The client side of TLS.
#[derive(Clone)]
pub struct TlsClient {
    pub(crate) config: Arc<rustls::ClientConfig>,
    trust: ServerTrust,
}

impl fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsClient")
            .field("trust", &self.trust)
            .finish()
    }
}

impl TlsClient {
    pub fn new(trust: ServerTrust) -> Result<TlsClient, TlsError> {
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|error| TlsError(format!("TLS set-up: {error}")))?;
        let config = match &trust {
            ServerTrust::Ca(path) => {
                let mut roots = rustls::RootCertStore::empty();
                for certificate in load_certificates(path)? {
                    roots.add(certificate).map_err(|error| {
                        TlsError(format!(
                            "--tls-ca {}: not a usable CA certificate: {error}",
                            path.display()
                        ))
                    })?;
                }
                builder.with_root_certificates(roots).with_no_client_auth()
            }
            ServerTrust::Pin(text) => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(PinnedCertificate {
                    fingerprint: parse_fingerprint(text)?,
                    provider: provider(),
                }))
                .with_no_client_auth(),
        };
        Ok(TlsClient {
            config: Arc::new(config),
            trust,
        })
    }

    /// Why a handshake failed, in the terms of how this client trusts.
    pub(crate) fn explain(&self, host: &str, error: &std::io::Error) -> String {
        let rustls_error = error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>());
        let why = match rustls_error {
            Some(rustls::Error::InvalidCertificate(problem)) => match (problem, &self.trust) {
                (CertificateError::Expired | CertificateError::ExpiredContext { .. }, _) => {
                    "the server's certificate has expired".to_string()
                }
                (
                    CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. },
                    _,
                ) => "the server's certificate is not valid yet".to_string(),
                (
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                    _,
                ) => format!("the server's certificate is not valid for {host}"),
                (
                    CertificateError::UnknownIssuer | CertificateError::BadSignature,
                    ServerTrust::Ca(path),
                ) => format!(
                    "the server's certificate is not signed by the CA in {}",
                    path.display()
                ),
                (CertificateError::ApplicationVerificationFailure, ServerTrust::Pin(_)) => {
                    "the server's certificate does not have the pinned fingerprint".to_string()
                }
                (other, _) => format!("the server's certificate is not acceptable: {other:?}"),
            },
            Some(rustls::Error::AlertReceived(alert)) => {
                format!("the server refused the TLS handshake ({alert:?})")
            }
            Some(other) => format!("TLS handshake failed: {other}"),
            None => match error.kind() {
                std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset => {
                    "the server closed the connection during the TLS handshake (does it serve \
                     TLS?)"
                        .to_string()
                }
                _ => format!("TLS handshake failed: {error}"),
            },
        };
        format!("TLS: {why}")
    }
}

/// Trusts exactly one certificate, by its SHA-256 fingerprint; handshake
/// signatures are still checked against it, so only the holder of its key
/// can pass.
#[derive(Debug)]
struct PinnedCertificate {
    fingerprint: [u8; 32],
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for PinnedCertificate {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let presented: [u8; 32] = Sha256::digest(end_entity.as_ref()).into();
        if presented == self.fingerprint {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

fn load_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|error| TlsError(format!("{}: {error}", path.display())))?;
    if certificates.is_empty() {
        return Err(TlsError(format!(
            "{}: no PEM certificate in it",
            path.display()
        )));
    }
    Ok(certificates)
}

/// Hex SHA-256 of a DER certificate.
pub fn fingerprint(certificate: &CertificateDer<'_>) -> String {
    Sha256::digest(certificate.as_ref())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

fn parse_fingerprint(text: &str) -> Result<[u8; 32], TlsError> {
    let hex: String = text.chars().filter(|c| *c != ':').collect();
    let bad = || {
        TlsError(format!(
            "--tls-pin {text:?}: expected the certificate's SHA-256 fingerprint, 64 hex digits"
        ))
    };
    if hex.len() != 64 || !hex.is_ascii() {
        return Err(bad());
    }
    let mut bytes = [0u8; 32];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_parse_with_or_without_colons() {
        let hex = "ab".repeat(32);
        let colons = vec!["AB"; 32].join(":");
        assert_eq!(parse_fingerprint(&hex).ok(), Some([0xab; 32]));
        assert_eq!(parse_fingerprint(&colons).ok(), Some([0xab; 32]));
        assert!(parse_fingerprint("abcd").is_err());
        assert!(parse_fingerprint(&"zz".repeat(32)).is_err());
    }
}
