//! TLS for TCP connections (rustls, ring): the server's certificate, and
//! the two ways a client can trust it: a CA certificate file (with the
//! usual name and validity checks) or a pinned SHA-256 fingerprint of the
//! server's own certificate (no CA needed, as with `ssh`'s known hosts).
//! With TLS on, the login token only ever crosses the network encrypted.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use tokio::net::TcpStream;
use tokio::time::Instant;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};

use crate::model::io_message;
use crate::net::certificate;

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
    expires: Option<SystemTime>,
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
        let chain = load_certificates(cert)
            .map_err(|why| TlsError(format!("--tls-cert {}: {why}", cert.display())))?;
        let key_der = PrivateKeyDer::from_pem_file(key).map_err(|error| {
            TlsError(format!(
                "--tls-key {}: {}",
                key.display(),
                pem_problem(&error, "no private key in it")
            ))
        })?;
        let fingerprint = fingerprint(&chain[0]);
        let expires = certificate::not_after(&chain[0]);
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|error| TlsError(format!("TLS set-up: {error}")))?
            .with_no_client_auth()
            .with_single_cert(chain, key_der)
            .map_err(|error| {
                TlsError(match error {
                    rustls::Error::InconsistentKeys(_) => format!(
                        "--tls-key {} is not the private key of the certificate in --tls-cert {}",
                        key.display(),
                        cert.display()
                    ),
                    other => format!(
                        "--tls-cert {} and --tls-key {} cannot be used: {other}",
                        cert.display(),
                        key.display()
                    ),
                })
            })?;
        Ok(TlsServer {
            config: Arc::new(config),
            fingerprint,
            expires,
        })
    }

    /// When the server's certificate stops being valid (`None` if that
    /// cannot be read from it).
    pub fn expires(&self) -> Option<SystemTime> {
        self.expires
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
    /// Exactly the certificate with this SHA-256 fingerprint, in any of
    /// the usual spellings (see [`parse_fingerprint`]).
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

/// Why a TLS handshake failed.
pub(crate) enum Failure {
    /// The server answered with something that is not TLS.
    NotTls,
    /// The handshake was refused or the certificate not trusted: why, in
    /// the terms of how this client trusts.
    Refused(String),
}

impl TlsClient {
    /// A client trusting as `trust` says. Errors name the file or the
    /// fingerprint, not the flag: callers know which flag gave it.
    pub fn new(trust: ServerTrust) -> Result<TlsClient, TlsError> {
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|error| TlsError(format!("TLS set-up: {error}")))?;
        let config = match &trust {
            ServerTrust::Ca(path) => {
                let in_file = |why: String| TlsError(format!("{}: {why}", path.display()));
                let mut roots = rustls::RootCertStore::empty();
                for certificate in load_certificates(path).map_err(in_file)? {
                    roots.add(certificate).map_err(|error| {
                        in_file(format!("not a usable CA certificate ({error})"))
                    })?;
                }
                builder.with_root_certificates(roots).with_no_client_auth()
            }
            ServerTrust::Pin(text) => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(PinnedCertificate {
                    fingerprint: Some(parse_fingerprint(text).map_err(TlsError)?),
                    provider: provider(),
                }))
                .with_no_client_auth(),
        };
        Ok(TlsClient {
            config: Arc::new(config),
            trust,
        })
    }

    /// The TLS handshake with `host` over `stream`.
    pub(crate) async fn handshake(
        &self,
        host: &str,
        stream: TcpStream,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, Failure> {
        let name = ServerName::try_from(host.to_string())
            .map_err(|_| Failure::Refused(format!("TLS: {host:?} is not a valid server name")))?;
        let connector = tokio_rustls::TlsConnector::from(self.config.clone());
        connector.connect(name, stream).await.map_err(|error| {
            match rustls_error(&error) {
                // Bytes that are not TLS: a plaintext server's answer.
                Some(rustls::Error::InvalidMessage(_)) => Failure::NotTls,
                _ => Failure::Refused(self.explain(host, &error)),
            }
        })
    }

    /// Why a handshake failed, in the terms of how this client trusts.
    pub(crate) fn explain(&self, host: &str, error: &std::io::Error) -> String {
        let why = match rustls_error(error) {
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
                (CertificateError::Other(other), ServerTrust::Pin(_)) => {
                    match other.0.downcast_ref::<PinMismatch>() {
                        Some(mismatch) => format!(
                            "the server's certificate does not have the pinned fingerprint (it \
                             offered {})",
                            mismatch.offered
                        ),
                        None => format!("the server's certificate is not acceptable: {other}"),
                    }
                }
                (other, _) => format!("the server's certificate is not acceptable: {other}"),
            },
            Some(rustls::Error::AlertReceived(alert)) => {
                format!("the server refused the TLS handshake ({alert:?})")
            }
            Some(other) => format!("the TLS handshake failed: {other}"),
            None => match error.kind() {
                std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset => {
                    "the server closed the connection during the TLS handshake".to_string()
                }
                _ => format!("the TLS handshake failed: {}", io_message(error)),
            },
        };
        format!("TLS: {why}")
    }
}

fn rustls_error(error: &std::io::Error) -> Option<&rustls::Error> {
    error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
}

/// Whether the server at `resolved` answers a TLS handshake: asked when a
/// plaintext client was dropped without a word, which is what a TLS server
/// does with one. Sends nothing but a ClientHello, and stops at the
/// certificate.
pub(crate) async fn speaks_tls(host: &str, resolved: &[SocketAddr], deadline: Instant) -> bool {
    let Some(address) = resolved.first() else {
        return false;
    };
    let config = match rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
    {
        Ok(builder) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PinnedCertificate {
                fingerprint: None,
                provider: provider(),
            }))
            .with_no_client_auth(),
        Err(_) => return false,
    };
    let name = ServerName::try_from(host.to_string())
        .unwrap_or_else(|_| ServerName::try_from("capexec").expect("a valid name"));
    let probe = async {
        let stream = TcpStream::connect(address).await.ok()?;
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let error = connector.connect(name, stream).await.err()?;
        let reached = matches!(
            rustls_error(&error),
            Some(rustls::Error::InvalidCertificate(CertificateError::Other(other)))
                if other.0.downcast_ref::<ReachedCertificate>().is_some()
        );
        Some(reached)
    };
    let deadline = deadline.min(Instant::now() + std::time::Duration::from_secs(3));
    matches!(
        tokio::time::timeout_at(deadline, probe).await,
        Ok(Some(true))
    )
}

/// The certificate a pinning client was offered instead of its pin.
#[derive(Debug)]
struct PinMismatch {
    offered: String,
}

impl fmt::Display for PinMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the server offered {}", self.offered)
    }
}

impl std::error::Error for PinMismatch {}

/// What [`speaks_tls`]'s verifier answers: the server got as far as
/// sending a certificate, so it speaks TLS.
#[derive(Debug)]
struct ReachedCertificate;

impl fmt::Display for ReachedCertificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("probe: the server sent a certificate")
    }
}

impl std::error::Error for ReachedCertificate {}

/// Trusts exactly one certificate, by its SHA-256 fingerprint; handshake
/// signatures are still checked against it, so only the holder of its key
/// can pass. Without a fingerprint it trusts nothing and only notes that a
/// certificate came (see [`speaks_tls`]).
#[derive(Debug)]
struct PinnedCertificate {
    fingerprint: Option<[u8; 32]>,
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
        let Some(expected) = self.fingerprint else {
            return Err(rustls::Error::InvalidCertificate(CertificateError::Other(
                rustls::OtherError(Arc::new(ReachedCertificate)),
            )));
        };
        let presented: [u8; 32] = Sha256::digest(end_entity.as_ref()).into();
        if presented == expected {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(CertificateError::Other(
                rustls::OtherError(Arc::new(PinMismatch {
                    offered: fingerprint(end_entity),
                })),
            )))
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

/// The certificates of a PEM file; errors say what is wrong with the file
/// (callers name it).
fn load_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|error| pem_problem(&error, "no PEM certificate in it"))?;
    if certificates.is_empty() {
        return Err("no PEM certificate in it".to_string());
    }
    Ok(certificates)
}

/// What is wrong with a PEM file, in words.
fn pem_problem(error: &rustls::pki_types::pem::Error, nothing_found: &str) -> String {
    use rustls::pki_types::pem::Error;
    match error {
        Error::Io(error) => io_message(error),
        Error::NoItemsFound => nothing_found.to_string(),
        Error::MissingSectionEnd { .. } => "a PEM section in it has no END line".to_string(),
        Error::IllegalSectionStart { .. } | Error::Base64Decode(_) => {
            "it is not a valid PEM file".to_string()
        }
        other => other.to_string(),
    }
}

/// Hex SHA-256 of a DER certificate.
pub fn fingerprint(certificate: &CertificateDer<'_>) -> String {
    Sha256::digest(certificate.as_ref())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// A SHA-256 fingerprint as people copy it: 64 hex digits in either case,
/// with or without `:`, space or `-` between them, after an optional label
/// (`sha256:`, `SHA256=`, openssl's `SHA256 Fingerprint=`, or the
/// `sha256="..."` that `capexec serve` logs), quotes allowed.
pub fn parse_fingerprint(text: &str) -> Result<[u8; 32], String> {
    let unquoted = |text: &str| {
        text.trim()
            .trim_matches(|c| c == '"' || c == '\'')
            .to_string()
    };
    let mut rest = unquoted(text);
    let lower = rest.to_ascii_lowercase();
    for label in [
        "sha256 fingerprint",
        "sha-256 fingerprint",
        "sha256",
        "sha-256",
    ] {
        if let Some(after) = lower.strip_prefix(label)
            && let Some(value) = after.trim_start().strip_prefix(['=', ':'])
        {
            rest = unquoted(&rest[rest.len() - value.len()..]);
            break;
        }
    }
    let hex: String = rest
        .chars()
        .filter(|c| !matches!(c, ':' | ' ' | '-'))
        .collect();
    if hex.len() == 40 && hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!(
            "{text:?} is a SHA-1 fingerprint (40 hex digits): pin the SHA-256 one, which \
             `capexec serve` logs (or `openssl x509 -noout -fingerprint -sha256 -in CERT`)"
        ));
    }
    if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!(
            "{text:?} is not a SHA-256 fingerprint: expected 64 hex digits (colons allowed), \
             as `capexec serve` logs it"
        ));
    }
    let mut bytes = [0u8; 32];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
            .map_err(|_| format!("{text:?} is not a SHA-256 fingerprint"))?;
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_parse_in_every_common_spelling() {
        let hex = "ab".repeat(32);
        let colons = vec!["AB"; 32].join(":");
        let spellings = [
            hex.clone(),
            hex.to_uppercase(),
            colons.clone(),
            vec!["ab"; 32].join(" "),
            format!("sha256:{hex}"),
            format!("SHA256:{colons}"),
            format!("SHA256 Fingerprint={colons}"),
            format!("sha256 Fingerprint={colons}"),
            format!("sha256=\"{hex}\""),
            format!("  \"{hex}\"  "),
            format!("SHA-256: {colons}"),
        ];
        for spelling in &spellings {
            assert_eq!(parse_fingerprint(spelling), Ok([0xab; 32]), "{spelling}");
        }
        assert!(parse_fingerprint("abcd").is_err());
        assert!(parse_fingerprint(&"zz".repeat(32)).is_err());
        let sha1 = parse_fingerprint(&vec!["AB"; 20].join(":")).expect_err("SHA-1");
        assert!(sha1.contains("SHA-1"), "{sha1}");
    }
}
