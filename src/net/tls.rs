//! TLS for TCP connections (rustls; ring, with aws-lc's record protection,
//! see `provider`): the server's certificate, and the ways a client can
//! trust it (`net/trust.rs`): a CA certificate file (with the usual name
//! and validity checks; the server's own self-signed certificate counts as
//! its anchor), a pinned SHA-256 fingerprint of the server's own
//! certificate, or trust on first use against a remembered fingerprint (as
//! `ssh`'s known hosts). With TLS on, the login token only ever crosses the
//! network encrypted.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use tokio::net::TcpStream;
use tokio::time::Instant;

use rustls::CertificateError;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::model::io_message;
use crate::net::certificate;
use crate::net::records;
use crate::net::trust::{self, CaVerifier, Expect, FingerprintRefusal, FingerprintVerifier};
pub use crate::net::trust::{fingerprint, parse_fingerprint};

/// A TLS set-up that could not be made, with the file and the reason.
#[derive(Debug)]
pub struct TlsError(String);

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TlsError {}

/// ring's provider with aws-lc's record protection, AES-128-GCM first.
///
/// Each of ring's cipher suites is swapped for aws-lc's implementation of
/// the same suite: the AEAD that seals and opens every record, and the
/// suite's hash, HKDF and TLS 1.2 PRF. On a bulk stream the cipher can be
/// the largest single cost of TLS (a third of the receiving end's samples
/// with ring on an AMD EPYC with AVX-512, a tenth on other machines, see
/// docs/PROFILES.md), and aws-lc has AES-GCM code for AVX-512 with VAES
/// where ring's stops at AVX2. Key exchange, signatures, key loading and
/// randomness stay ring's: a client that used aws-lc's for those paid
/// 27-30 ms of CPU per start, as the first use of aws-lc's random
/// generator sets it up (31 ms for a first 32-byte fill in a program of
/// its own), twenty times what a TLS start may add. Sealing and opening
/// records draw no randomness.
///
/// With both of rustls's providers compiled in, rustls picks no process
/// default: every config is built with `builder_with_provider(provider())`,
/// never `ClientConfig::builder()`, which would panic.
///
/// The suite order puts AES-128-GCM first. ring's own order puts AES-256
/// first; both are safe, and AES-128 does 10 rounds per block against 14.
/// The server decides by this order too (`ignore_client_order`), so other
/// clients (Python's ssl, OpenSSL's AES-256-first default) get the same
/// suite.
fn provider() -> Arc<CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    let aws_lc = rustls::crypto::aws_lc_rs::default_provider().cipher_suites;
    for suite in &mut provider.cipher_suites {
        if let Some(faster) = aws_lc.iter().find(|other| other.suite() == suite.suite()) {
            *suite = *faster;
        }
    }
    provider
        .cipher_suites
        .sort_by_key(|suite| suite_preference(suite.suite()));
    Arc::new(provider)
}

/// Lower first: AES-128-GCM, then the rest in ring's order (the sort is
/// stable).
fn suite_preference(suite: rustls::CipherSuite) -> u8 {
    use rustls::CipherSuite as Suite;
    match suite {
        Suite::TLS13_AES_128_GCM_SHA256
        | Suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
        | Suite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => 0,
        _ => 1,
    }
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
    /// PEM private key. From now on no sandbox of this process may have a
    /// root that contains the key.
    pub fn from_files(cert: &Path, key: &Path) -> Result<TlsServer, TlsError> {
        crate::sandbox::protect(key, crate::sandbox::Secret::TlsKey);
        let chain = load_certificates(cert)
            .map_err(|why| TlsError(format!("--tls-cert {}: {why}", cert.display())))?;
        let key_der = read_pem_file(key)
            .and_then(|pem| {
                PrivateKeyDer::from_pem_slice(&pem)
                    .map_err(|error| pem_problem(&error, "no private key in it"))
            })
            .map_err(|why| TlsError(format!("--tls-key {}: {why}", key.display())))?;
        let fingerprint = fingerprint(&chain[0]);
        let expires = certificate::not_after(&chain[0]);
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
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
        config.ignore_client_order = true;
        // capexec's record layer takes the keys after the handshake.
        config.enable_secret_extraction = true;
        Ok(TlsServer {
            config: Arc::new(config),
            fingerprint,
            expires,
        })
    }

    /// The same certificate, asking each client for a certificate of its
    /// own (optional, any, its key proven by the handshake): what a user
    /// map's `cert` lines log in by.
    pub fn asking_client_certificates(&self) -> Result<TlsServer, TlsError> {
        let verifier = Arc::new(crate::net::trust::AnyClientCertificate {
            provider: provider(),
        });
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|error| TlsError(format!("TLS set-up: {error}")))?
            .with_client_cert_verifier(verifier)
            .with_cert_resolver(Arc::clone(&self.config.cert_resolver));
        config.ignore_client_order = true;
        config.enable_secret_extraction = true;
        Ok(TlsServer {
            config: Arc::new(config),
            fingerprint: self.fingerprint.clone(),
            expires: self.expires,
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

    /// SHA-256 of the first certificate in the PEM file `cert`, as clients
    /// pin it.
    pub fn certificate_fingerprint(cert: &Path) -> Result<String, TlsError> {
        let chain = load_certificates(cert)
            .map_err(|why| TlsError(format!("{}: {why}", cert.display())))?;
        Ok(fingerprint(&chain[0]))
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
    /// Trust on first use: the certificate whose fingerprint is remembered
    /// for this server; with none remembered, every certificate is refused
    /// with [`ConnectError::UnknownCertificate`], before any secret is sent,
    /// so that the caller can ask and connect again with it remembered.
    ///
    /// [`ConnectError::UnknownCertificate`]: crate::net::ConnectError::UnknownCertificate
    FirstUse(Option<[u8; 32]>),
}

/// A client's certificate chain and private key, presented to a server
/// that asks for one (a user map's `cert` lines).
pub struct ClientIdentity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    /// The files, for errors.
    names: String,
}

impl Clone for ClientIdentity {
    fn clone(&self) -> ClientIdentity {
        ClientIdentity {
            chain: self.chain.clone(),
            key: self.key.clone_key(),
            names: self.names.clone(),
        }
    }
}

impl ClientIdentity {
    /// Loads a PEM certificate chain (the client's own first) and a PEM
    /// private key; errors name the file.
    pub fn from_files(cert: &Path, key: &Path) -> Result<ClientIdentity, TlsError> {
        let chain = load_certificates(cert)
            .map_err(|why| TlsError(format!("{}: {why}", cert.display())))?;
        let key_der = read_pem_file(key)
            .and_then(|pem| {
                PrivateKeyDer::from_pem_slice(&pem)
                    .map_err(|error| pem_problem(&error, "no private key in it"))
            })
            .map_err(|why| TlsError(format!("{}: {why}", key.display())))?;
        let names = format!("{} and {}", cert.display(), key.display());
        // The key must be the certificate's: checked now, not at the
        // first handshake.
        provider()
            .key_provider
            .load_private_key(key_der.clone_key())
            .map_err(|error| TlsError(format!("{}: {error}", key.display())))
            .and_then(|signing| {
                let certified = rustls::sign::CertifiedKey::new(chain.clone(), signing);
                certified.keys_match().map_err(|_| {
                    TlsError(format!(
                        "{} is not the private key of the certificate in {}",
                        key.display(),
                        cert.display()
                    ))
                })
            })?;
        Ok(ClientIdentity {
            chain,
            key: key_der,
            names,
        })
    }
}

/// The SHA-256 of the certificate a TLS client presented, if it did.
pub(crate) fn peer_fingerprint(chain: &[CertificateDer<'_>]) -> Option<[u8; 32]> {
    use sha2::Digest;
    let certificate = chain.first()?;
    Some(sha2::Sha256::digest(certificate.as_ref()).into())
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
    /// Trust on first use: the server's certificate is not known yet; its
    /// fingerprint.
    Unknown(String),
    /// Trust on first use: the server's certificate is not the one
    /// remembered.
    Changed { known: String, offered: String },
}

impl TlsClient {
    /// A client trusting as `trust` says. Errors name the file or the
    /// fingerprint, not the flag: callers know which flag gave it.
    pub fn new(trust: ServerTrust) -> Result<TlsClient, TlsError> {
        TlsClient::presenting(trust, None)
    }

    /// [`TlsClient::new`], presenting `identity` (a certificate chain and
    /// its key, from [`ClientIdentity::from_files`]) when the server asks.
    pub fn presenting(
        trust: ServerTrust,
        identity: Option<ClientIdentity>,
    ) -> Result<TlsClient, TlsError> {
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|error| TlsError(format!("TLS set-up: {error}")))?;
        let fingerprints = |expect| {
            Arc::new(FingerprintVerifier {
                expect,
                provider: provider(),
            })
        };
        let verifier: Arc<dyn rustls::client::danger::ServerCertVerifier> = match &trust {
            ServerTrust::Ca(path) => {
                let in_file = |why: String| TlsError(format!("{}: {why}", path.display()));
                let anchors = load_certificates(path).map_err(in_file)?;
                Arc::new(CaVerifier::new(anchors, provider()).map_err(in_file)?)
            }
            ServerTrust::Pin(text) => {
                fingerprints(Expect::Pin(parse_fingerprint(text).map_err(TlsError)?))
            }
            ServerTrust::FirstUse(known) => fingerprints(Expect::FirstUse(*known)),
        };
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut config = match identity {
            None => builder.with_no_client_auth(),
            Some(ClientIdentity { chain, key, names }) => builder
                .with_client_auth_cert(chain, key)
                .map_err(|error| TlsError(format!("{names}: {error}")))?,
        };
        // capexec's record layer takes the keys after the handshake.
        config.enable_secret_extraction = true;
        Ok(TlsClient {
            config: Arc::new(config),
            trust,
        })
    }

    /// The TLS handshake with `host` over `stream`.
    pub(crate) async fn handshake<S>(
        &self,
        host: &str,
        stream: S,
    ) -> Result<records::Established<S>, Failure>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let name = ServerName::try_from(host.to_string())
            .map_err(|_| Failure::Refused(format!("TLS: {host:?} is not a valid server name")))?;
        records::client(self.config.clone(), name, stream)
            .await
            .map_err(|error| {
                let refusal = rustls_error(&error).and_then(trust::fingerprint_refusal);
                match (rustls_error(&error), refusal) {
                    // Bytes that are not TLS: a plaintext server's answer.
                    (Some(rustls::Error::InvalidMessage(_)), _) => Failure::NotTls,
                    (_, Some(FingerprintRefusal::Unknown { offered })) => {
                        Failure::Unknown(offered.clone())
                    }
                    (_, Some(FingerprintRefusal::Changed { known, offered })) => Failure::Changed {
                        known: known.clone(),
                        offered: offered.clone(),
                    },
                    _ => Failure::Refused(self.explain(host, &error)),
                }
            })
    }

    /// Why a handshake failed, in the terms of how this client trusts: a
    /// sentence, never a debug-formatted enum.
    pub(crate) fn explain(&self, host: &str, error: &std::io::Error) -> String {
        let why = match rustls_error(error) {
            Some(rustls::Error::InvalidCertificate(problem)) => match (problem, &self.trust) {
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
                (problem, _) => {
                    let error = rustls::Error::InvalidCertificate(problem.clone());
                    match trust::fingerprint_refusal(&error) {
                        Some(FingerprintRefusal::NotPinned { offered }) => format!(
                            "the server's certificate does not have the pinned fingerprint \
                             (it offered {offered})"
                        ),
                        Some(other) => other.to_string(),
                        None => the_servers(&trust::words(&error)),
                    }
                }
            },
            Some(other) => trust::words(other),
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

/// "the certificate has expired" as "the server's certificate has expired".
fn the_servers(words: &str) -> String {
    match words.strip_prefix("the certificate ") {
        Some(rest) => format!("the server's certificate {rest}"),
        None => words.to_string(),
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
            .with_custom_certificate_verifier(Arc::new(FingerprintVerifier {
                expect: Expect::Probe,
                provider: provider(),
            }))
            .with_no_client_auth(),
        Err(_) => return false,
    };
    let name = ServerName::try_from(host.to_string())
        .unwrap_or_else(|_| ServerName::try_from("capexec").expect("a valid name"));
    let probe = async {
        let stream = TcpStream::connect(address).await.ok()?;
        let error = records::client(Arc::new(config), name, stream)
            .await
            .err()?;
        let reached = matches!(
            rustls_error(&error).and_then(trust::fingerprint_refusal),
            Some(FingerprintRefusal::Reached)
        );
        Some(reached)
    };
    let deadline = deadline.min(Instant::now() + std::time::Duration::from_secs(3));
    matches!(
        tokio::time::timeout_at(deadline, probe).await,
        Ok(Some(true))
    )
}

/// The certificates of a PEM file; errors say what is wrong with the file
/// (callers name it).
pub(crate) fn load_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read_pem_file(path)?;
    let certificates = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| pem_problem(&error, "no PEM certificate in it"))?;
    if certificates.is_empty() {
        return Err("no PEM certificate in it".to_string());
    }
    Ok(certificates)
}

/// The largest PEM file read (a system's whole CA bundle is a few hundred
/// KiB).
pub const MAX_PEM_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// The bytes of a PEM file (a regular file: see `crate::local_file`);
/// errors say what is wrong with the file (callers name it).
fn read_pem_file(path: &Path) -> Result<Vec<u8>, String> {
    crate::local_file::read_regular_file(path, MAX_PEM_FILE_BYTES)
        .map_err(|error| io_message(&error))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aes_128_gcm_comes_first_and_every_suite_of_ring_stays() {
        let ours: Vec<_> = provider().cipher_suites.iter().map(|s| s.suite()).collect();
        let ring: Vec<_> = rustls::crypto::ring::default_provider()
            .cipher_suites
            .iter()
            .map(|s| s.suite())
            .collect();
        assert_eq!(ours[0], rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
        assert_eq!(ours.len(), ring.len());
        assert!(ring.iter().all(|suite| ours.contains(suite)));
    }

    /// Each provider's suites are `static`s of its own, so an address
    /// tells whose implementation a suite is.
    fn same_suite(a: &rustls::SupportedCipherSuite, b: &rustls::SupportedCipherSuite) -> bool {
        use rustls::SupportedCipherSuite::{Tls12, Tls13};
        match (a, b) {
            (Tls13(a), Tls13(b)) => std::ptr::eq(*a, *b),
            (Tls12(a), Tls12(b)) => std::ptr::eq(*a, *b),
            _ => false,
        }
    }

    #[test]
    fn records_are_sealed_by_aws_lc_and_the_rest_is_rings() {
        let ours = provider();
        let aws_lc = rustls::crypto::aws_lc_rs::default_provider();
        let ring = rustls::crypto::ring::default_provider();
        for suite in &ours.cipher_suites {
            let theirs = aws_lc
                .cipher_suites
                .iter()
                .find(|other| other.suite() == suite.suite())
                .expect("aws-lc has every suite ring has");
            assert!(
                same_suite(suite, theirs),
                "{:?} is not aws-lc's",
                suite.suite()
            );
        }
        // Key exchange and randomness from aws-lc would cost every start
        // its random generator's set-up.
        let addresses = |groups: &[&'static dyn rustls::crypto::SupportedKxGroup]| {
            groups
                .iter()
                .map(|group| std::ptr::from_ref(*group).cast::<()>())
                .collect::<Vec<_>>()
        };
        assert_eq!(addresses(&ours.kx_groups), addresses(&ring.kx_groups));
        // Both providers' randomness and key loading are unit structs
        // (`Ring`, `AwsLcRs`), which share an address: their names tell.
        assert_eq!(format!("{:?}", ours.secure_random), "Ring");
        assert_eq!(format!("{:?}", ours.key_provider), "Ring");
    }
}
