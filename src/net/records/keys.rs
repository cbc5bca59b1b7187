//! What the two halves of a connection share: rustls's kernel connection,
//! which derives the next traffic keys on a KeyUpdate and takes the
//! session tickets a server sends, and whether the peer asked for ours to
//! be updated.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rustls::client::ClientConnectionData;
use rustls::kernel::KernelConnection;
use rustls::server::ServerConnectionData;
use rustls::{AlertDescription, ConnectionTrafficSecrets, SupportedCipherSuite};

use super::protection::{Ending, Protection, Version, broken, refused};

/// `Keys::ending`'s codes: none yet, silent, or an alert (its code in the
/// low byte).
const NO_ENDING: u16 = 0;
const SILENT: u16 = 0x100;
const ALERT: u16 = 0x200;

/// rustls's side of a connection whose records capexec protects.
pub(crate) enum Kernel {
    Client(KernelConnection<ClientConnectionData>),
    Server(KernelConnection<ServerConnectionData>),
}

impl Kernel {
    fn suite(&self) -> SupportedCipherSuite {
        match self {
            Kernel::Client(kernel) => kernel.negotiated_cipher_suite(),
            Kernel::Server(kernel) => kernel.negotiated_cipher_suite(),
        }
    }

    fn next_rx(&mut self) -> Result<(u64, ConnectionTrafficSecrets), rustls::Error> {
        match self {
            Kernel::Client(kernel) => kernel.update_rx_secret(),
            Kernel::Server(kernel) => kernel.update_rx_secret(),
        }
    }

    fn next_tx(&mut self) -> Result<(u64, ConnectionTrafficSecrets), rustls::Error> {
        match self {
            Kernel::Client(kernel) => kernel.update_tx_secret(),
            Kernel::Server(kernel) => kernel.update_tx_secret(),
        }
    }
}

/// The state both halves of one connection reach.
pub(crate) struct Keys {
    kernel: Mutex<Kernel>,
    version: Version,
    /// Records one key may seal before it must be replaced (the suite's
    /// confidentiality limit, less a margin for the records in flight).
    limit: AtomicU64,
    /// The peer's KeyUpdate asked for ours: the writer sends one before
    /// its next record.
    update_requested: AtomicBool,
    /// The reader ended the connection: how the writer ends it, encoded
    /// (`NO_ENDING`, `SILENT`, or `ALERT` with the alert's code).
    ending: AtomicU16,
}

impl Keys {
    pub(crate) fn new(kernel: Kernel, version: Version) -> Arc<Keys> {
        let limit = match kernel.suite() {
            SupportedCipherSuite::Tls13(suite) => suite.common.confidentiality_limit,
            SupportedCipherSuite::Tls12(suite) => suite.common.confidentiality_limit,
        };
        Arc::new(Keys {
            kernel: Mutex::new(kernel),
            version,
            limit: AtomicU64::new(limit.saturating_sub(1 << 16).max(1)),
            update_requested: AtomicBool::new(false),
            ending: AtomicU16::new(NO_ENDING),
        })
    }

    pub(crate) fn version(&self) -> Version {
        self.version
    }

    pub(crate) fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Makes a key worn out after `records`, as a test would wait hours
    /// for.
    #[cfg(test)]
    pub(crate) fn wear_out_after(&self, records: u64) {
        self.limit.store(records, Ordering::Relaxed);
    }

    fn kernel(&self) -> MutexGuard<'_, Kernel> {
        self.kernel
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The peer's next receiving key, after its KeyUpdate.
    pub(crate) fn next_receiving(&self) -> io::Result<Protection> {
        let secrets = self
            .kernel()
            .next_rx()
            .map_err(|error| broken(format!("the peer's key update: {error}")))?;
        Protection::new(self.version, secrets)
    }

    /// Our next sending key, once our KeyUpdate is sealed with the old.
    pub(crate) fn next_sending(&self) -> io::Result<Protection> {
        let secrets = self
            .kernel()
            .next_tx()
            .map_err(|error| broken(format!("our key update: {error}")))?;
        Protection::new(self.version, secrets)
    }

    /// Whether this is the client's side.
    pub(crate) fn is_client(&self) -> bool {
        matches!(&*self.kernel(), Kernel::Client(_))
    }

    /// A session ticket the server sent after the handshake, for the
    /// client's resumption store; a server's peer sends none.
    pub(crate) fn take_ticket(&self, payload: &[u8]) -> io::Result<()> {
        match &mut *self.kernel() {
            Kernel::Client(kernel) => kernel.handle_new_session_ticket(payload).map_err(|error| {
                refused(
                    AlertDescription::DecodeError,
                    format!("the server's session ticket: {error}"),
                )
            }),
            Kernel::Server(_) => Err(refused(
                AlertDescription::UnexpectedMessage,
                "the client sent a session ticket",
            )),
        }
    }

    /// The reader ended the connection: the writer ends it as `ending`
    /// says. The first ending stands.
    pub(crate) fn end(&self, ending: Ending) {
        let code = match ending {
            Ending::Silent => SILENT,
            Ending::Alert(alert) => ALERT | u16::from(u8::from(alert)),
        };
        let _ = self
            .ending
            .compare_exchange(NO_ENDING, code, Ordering::AcqRel, Ordering::Relaxed);
    }

    /// How the reader asked the writer to end the connection, once.
    pub(crate) fn take_ending(&self) -> Option<Ending> {
        match self.ending.swap(NO_ENDING, Ordering::AcqRel) {
            NO_ENDING => None,
            SILENT => Some(Ending::Silent),
            code => Some(Ending::Alert(AlertDescription::from(code as u8))),
        }
    }

    pub(crate) fn request_update(&self) {
        self.update_requested.store(true, Ordering::Release);
    }

    /// Whether the peer asked for our keys to be updated since the last
    /// call.
    pub(crate) fn take_update_request(&self) -> bool {
        self.update_requested.load(Ordering::Relaxed)
            && self.update_requested.swap(false, Ordering::AcqRel)
    }
}
