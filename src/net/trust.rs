//! How a client decides that a server's certificate is the right one: a CA
//! file (which may hold the server's own self-signed certificate, as
//! `curl --cacert` users expect), a pinned fingerprint, or trust on first
//! use against a remembered fingerprint (ssh's known_hosts). Handshake
//! signatures are always checked against the certificate accepted, so only
//! the holder of its key gets through.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};

use crate::net::certificate;

/// Certificates signed by a CA of the file, or exactly one of the file's
/// certificates: a self-signed server certificate given as its own trust
/// anchor. Such a certificate is still checked for its validity dates and
/// for the name connected to; webpki alone would refuse it as a CA used as
/// an end entity (`openssl req -x509` marks its certificates CA:TRUE).
#[derive(Debug)]
pub(crate) struct CaVerifier {
    webpki: Arc<WebPkiServerVerifier>,
    anchors: Vec<CertificateDer<'static>>,
    provider: Arc<CryptoProvider>,
}

/// The handshake-signature half of a `ServerCertVerifier`, the same for
/// every verifier here: checked with the crypto provider's algorithms
/// against the certificate accepted (`self.provider`).
macro_rules! signatures_checked_by_the_provider {
    () => {
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
    };
}

/// A server's verifier of client certificates where a certificate is an
/// identity by its fingerprint (`cert` lines of a user map): any
/// certificate is taken, and none is required, but its holder must sign
/// the handshake with its key (checked with the provider's algorithms), so
/// a peer cannot present a certificate it only copied.
#[derive(Debug)]
pub(crate) struct AnyClientCertificate {
    pub provider: Arc<CryptoProvider>,
}

impl rustls::server::danger::ClientCertVerifier for AnyClientCertificate {
    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        Ok(rustls::server::danger::ClientCertVerified::assertion())
    }

    signatures_checked_by_the_provider!();
}

impl CaVerifier {
    pub(crate) fn new(
        anchors: Vec<CertificateDer<'static>>,
        provider: Arc<CryptoProvider>,
    ) -> Result<CaVerifier, String> {
        let mut roots = rustls::RootCertStore::empty();
        for anchor in &anchors {
            roots
                .add(anchor.clone())
                .map_err(|error| format!("not a usable CA certificate ({})", words(&error)))?;
        }
        let webpki =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider))
                .build()
                .map_err(|error| format!("not a usable CA certificate ({error})"))?;
        Ok(CaVerifier {
            webpki,
            anchors,
            provider,
        })
    }
}

impl ServerCertVerifier for CaVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if self
            .anchors
            .iter()
            .any(|anchor| anchor.as_ref() == end_entity.as_ref())
        {
            return verify_anchor_itself(end_entity, server_name, now);
        }
        self.webpki
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    signatures_checked_by_the_provider!();
}

/// A trusted certificate presented as the server's own: valid now and for
/// the name connected to.
fn verify_anchor_itself(
    certificate: &CertificateDer<'_>,
    server_name: &ServerName<'_>,
    now: UnixTime,
) -> Result<ServerCertVerified, rustls::Error> {
    let invalid = |problem| Err(rustls::Error::InvalidCertificate(problem));
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(now.as_secs());
    match (
        certificate::not_before(certificate),
        certificate::not_after(certificate),
    ) {
        (Some(start), _) if now < start => return invalid(CertificateError::NotValidYet),
        (_, Some(end)) if now > end => return invalid(CertificateError::Expired),
        (Some(_), Some(_)) => {}
        _ => return invalid(CertificateError::BadEncoding),
    }
    let parsed = ParsedCertificate::try_from(certificate)?;
    rustls::client::verify_server_name(&parsed, server_name)?;
    Ok(ServerCertVerified::assertion())
}

/// What a fingerprint verifier expects of the server's certificate.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Expect {
    /// Nothing: note that a certificate came, and refuse it (the probe of
    /// `tls::speaks_tls`).
    Probe,
    /// Exactly this fingerprint (`--tls-pin`).
    Pin([u8; 32]),
    /// Trust on first use: the fingerprint remembered for this server, or
    /// none yet (then the certificate is refused with its fingerprint, for
    /// the caller to ask about before any secret is sent).
    FirstUse(Option<[u8; 32]>),
}

/// Why a fingerprint verifier refused a certificate.
#[derive(Debug)]
pub(crate) enum FingerprintRefusal {
    /// The probe reached a certificate: the server speaks TLS.
    Reached,
    /// Not the pinned certificate: the one offered.
    NotPinned { offered: String },
    /// No fingerprint is remembered for the server: the one offered.
    Unknown { offered: String },
    /// Not the certificate remembered for the server.
    Changed { known: String, offered: String },
}

impl fmt::Display for FingerprintRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FingerprintRefusal::Reached => f.write_str("probe: the server sent a certificate"),
            FingerprintRefusal::NotPinned { offered } => {
                write!(
                    f,
                    "the server offered {offered}, not the pinned certificate"
                )
            }
            FingerprintRefusal::Unknown { offered } => {
                write!(f, "the server offered the unknown certificate {offered}")
            }
            FingerprintRefusal::Changed { known, offered } => {
                write!(f, "the server offered {offered} instead of {known}")
            }
        }
    }
}

impl std::error::Error for FingerprintRefusal {}

/// Trusts a certificate by its SHA-256 fingerprint, as [`Expect`] says.
#[derive(Debug)]
pub(crate) struct FingerprintVerifier {
    pub(crate) expect: Expect,
    pub(crate) provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for FingerprintVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let presented: [u8; 32] = Sha256::digest(end_entity.as_ref()).into();
        let offered = || fingerprint(end_entity);
        let refusal = match self.expect {
            Expect::Pin(expected) | Expect::FirstUse(Some(expected)) if expected == presented => {
                return Ok(ServerCertVerified::assertion());
            }
            Expect::Probe => FingerprintRefusal::Reached,
            Expect::Pin(_) => FingerprintRefusal::NotPinned { offered: offered() },
            Expect::FirstUse(None) => FingerprintRefusal::Unknown { offered: offered() },
            Expect::FirstUse(Some(known)) => FingerprintRefusal::Changed {
                known: crate::model::show_fingerprint(&known),
                offered: offered(),
            },
        };
        Err(rustls::Error::InvalidCertificate(CertificateError::Other(
            rustls::OtherError(Arc::new(refusal)),
        )))
    }

    signatures_checked_by_the_provider!();
}

/// The refusal of a fingerprint verifier inside a rustls error, if it is
/// one.
pub(crate) fn fingerprint_refusal(error: &rustls::Error) -> Option<&FingerprintRefusal> {
    match error {
        rustls::Error::InvalidCertificate(CertificateError::Other(other)) => {
            other.0.downcast_ref::<FingerprintRefusal>()
        }
        _ => None,
    }
}

/// A rustls error as a phrase for people, never a debug-formatted enum.
pub(crate) fn words(error: &rustls::Error) -> String {
    match error {
        rustls::Error::InvalidCertificate(problem) => certificate_words(problem),
        rustls::Error::AlertReceived(alert) => {
            format!(
                "the server refused the TLS handshake (alert: {})",
                alert_words(*alert)
            )
        }
        rustls::Error::NoCertificatesPresented => "the server sent no certificate".to_string(),
        rustls::Error::PeerIncompatible(_) => {
            "the server's TLS versions or cipher suites are not ones this client supports"
                .to_string()
        }
        rustls::Error::PeerMisbehaved(_) => "the server broke the TLS protocol".to_string(),
        rustls::Error::InvalidMessage(_) => "the server sent something that is not TLS".to_string(),
        rustls::Error::DecryptError => "a TLS record could not be decrypted".to_string(),
        rustls::Error::NoApplicationProtocol => {
            "the server offers no protocol this client speaks".to_string()
        }
        other => format!("TLS failed ({other})"),
    }
}

/// What is wrong with a certificate, in words.
fn certificate_words(problem: &CertificateError) -> String {
    match problem {
        CertificateError::BadEncoding => "the certificate is malformed".to_string(),
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
            "the certificate has expired".to_string()
        }
        CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
            "the certificate is not valid yet".to_string()
        }
        CertificateError::Revoked => "the certificate has been revoked".to_string(),
        CertificateError::UnhandledCriticalExtension => {
            "the certificate has a critical extension this client does not understand".to_string()
        }
        CertificateError::UnknownIssuer => {
            "the certificate is not signed by a trusted CA".to_string()
        }
        CertificateError::BadSignature => "the certificate's signature is not valid".to_string(),
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
            "the certificate is not valid for the name connected to".to_string()
        }
        CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. } => {
            "the certificate is not meant for TLS servers".to_string()
        }
        CertificateError::Other(other) => {
            if let Some(refusal) = other.0.downcast_ref::<FingerprintRefusal>() {
                return refusal.to_string();
            }
            match other
                .0
                .downcast_ref::<rustls::pki_types::InvalidDnsNameError>()
            {
                Some(_) => "the certificate names an invalid host".to_string(),
                None => webpki_words(&other.0.to_string()),
            }
        }
        _ => "the certificate cannot be verified (a revocation or signature algorithm problem)"
            .to_string(),
    }
}

/// webpki's errors arrive as their names (`CaUsedAsEndEntity`): the ones
/// people meet, in words.
fn webpki_words(name: &str) -> String {
    let known = [
        (
            "CaUsedAsEndEntity",
            "the server presents a CA certificate as its own, and it is not one of the \
             certificates trusted",
        ),
        (
            "EndEntityUsedAsCa",
            "the chain uses a server certificate as a CA",
        ),
        (
            "UnsupportedCertVersion",
            "the certificate is not X.509 version 3",
        ),
        (
            "InvalidCertValidity",
            "the certificate's validity dates are malformed",
        ),
        ("BadDer", "the certificate is malformed"),
        ("BadDerTime", "the certificate's dates are malformed"),
        ("CertExpired", "the certificate has expired"),
        ("CertNotValidYet", "the certificate is not valid yet"),
        (
            "PathLenConstraintViolated",
            "the chain is longer than its CA allows",
        ),
        (
            "NameConstraintViolation",
            "the certificate breaks its CA's name constraints",
        ),
        (
            "RequiredEkuNotFound",
            "the certificate is not meant for TLS servers",
        ),
        (
            "UnsupportedSignatureAlgorithm",
            "the certificate uses a signature algorithm this client does not support",
        ),
    ];
    known
        .iter()
        .find(|(variant, _)| name.contains(variant))
        .map_or_else(
            || "the certificate cannot be verified".to_string(),
            |(_, words)| words.to_string(),
        )
}

/// A TLS alert's name in lower case words (`handshake failure`).
fn alert_words(alert: rustls::AlertDescription) -> String {
    let name = format!("{alert:?}");
    let mut words = String::new();
    for (index, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && index > 0 {
            words.push(' ');
        }
        words.push(c.to_ascii_lowercase());
    }
    words
}

/// Hex SHA-256 of a DER certificate.
pub fn fingerprint(certificate: &CertificateDer<'_>) -> String {
    crate::model::show_fingerprint(&Sha256::digest(certificate.as_ref()).into())
}

pub use crate::model::parse_fingerprint;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_words_not_enum_names() {
        let other = |name: &str| {
            #[derive(Debug)]
            struct Named(String);
            impl fmt::Display for Named {
                fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str(&self.0)
                }
            }
            impl std::error::Error for Named {}
            rustls::Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(
                Arc::new(Named(name.to_string())),
            )))
        };
        for error in [
            other("CaUsedAsEndEntity"),
            other("SomethingNew"),
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
            rustls::Error::AlertReceived(rustls::AlertDescription::HandshakeFailure),
            rustls::Error::DecryptError,
        ] {
            let text = words(&error);
            assert!(
                !text.contains("Other(")
                    && !text.contains("CaUsedAsEndEntity")
                    && !text.contains("HandshakeFailure"),
                "{text}"
            );
            assert!(text.contains(' '), "{text}");
        }
        assert_eq!(
            words(&rustls::Error::AlertReceived(
                rustls::AlertDescription::HandshakeFailure
            )),
            "the server refused the TLS handshake (alert: handshake failure)"
        );
    }
}
