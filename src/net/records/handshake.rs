//! rustls's handshake over a tokio stream, driven through its unbuffered
//! API until the connection may send data, then handed over: the keys to
//! capexec's record layer, the rest to rustls's kernel connection.

use std::io;
use std::sync::Arc;

use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncodeError, InsufficientSizeError, UnbufferedStatus};
use rustls::{ClientConfig, ProtocolVersion, ServerConfig};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};

use super::keys::{Kernel, Keys};
use super::protection::{Protection, Version, broken};
use super::reader::RecordReader;
use super::writer::RecordWriter;

/// The most a peer may send in one handshake flight before it is read:
/// rustls takes handshake messages of up to 64 KiB.
const MAX_FLIGHT: usize = 64 * 1024 + 16 * 1024;

/// A connection whose handshake is done: its two halves, and the
/// certificates the peer presented.
pub(crate) struct Established<S> {
    pub(crate) reader: RecordReader<ReadHalf<S>>,
    pub(crate) writer: RecordWriter<WriteHalf<S>>,
    pub(crate) peer_certificates: Vec<CertificateDer<'static>>,
}

/// The client's side of the handshake with `name` over `stream`. A TLS
/// error is an `io::Error` whose inner error is the `rustls::Error`.
pub(crate) async fn client<S>(
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    mut stream: S,
) -> io::Result<Established<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut connection = UnbufferedClientConnection::new(config, name).map_err(tls)?;
    let flight = drive(&mut connection, &mut stream).await?;
    let version = version_of(connection.protocol_version())?;
    let peer_certificates = certificates(connection.peer_certificates());
    let (secrets, kernel) = connection.dangerous_into_kernel_connection().map_err(tls)?;
    established(
        stream,
        flight,
        version,
        secrets,
        Kernel::Client(kernel),
        peer_certificates,
    )
}

/// The server's side of the handshake over `stream`.
pub(crate) async fn server<S>(
    config: Arc<ServerConfig>,
    mut stream: S,
) -> io::Result<Established<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut connection = UnbufferedServerConnection::new(config).map_err(tls)?;
    let flight = drive(&mut connection, &mut stream).await?;
    let version = version_of(connection.protocol_version())?;
    let peer_certificates = certificates(connection.peer_certificates());
    let (secrets, kernel) = connection.dangerous_into_kernel_connection().map_err(tls)?;
    established(
        stream,
        flight,
        version,
        secrets,
        Kernel::Server(kernel),
        peer_certificates,
    )
}

fn established<S>(
    stream: S,
    flight: Flight,
    version: Version,
    secrets: rustls::ExtractedSecrets,
    kernel: Kernel,
    peer_certificates: Vec<CertificateDer<'static>>,
) -> io::Result<Established<S>>
where
    S: AsyncRead + AsyncWrite,
{
    let receiving = Protection::new(version, secrets.rx)?;
    let sending = Protection::new(version, secrets.tx)?;
    let keys = Keys::new(kernel, version);
    let (read, write) = tokio::io::split(stream);
    Ok(Established {
        reader: RecordReader::new(
            read,
            receiving,
            Arc::clone(&keys),
            flight.leftover,
            flight.early,
        ),
        writer: RecordWriter::new(write, sending, keys),
        peer_certificates,
    })
}

fn version_of(version: Option<ProtocolVersion>) -> io::Result<Version> {
    match version {
        Some(ProtocolVersion::TLSv1_3) => Ok(Version::Tls13),
        Some(ProtocolVersion::TLSv1_2) => Ok(Version::Tls12),
        other => Err(broken(format!(
            "the handshake settled on {other:?}, which capexec does not speak"
        ))),
    }
}

fn certificates(chain: Option<&[CertificateDer<'_>]>) -> Vec<CertificateDer<'static>> {
    chain
        .unwrap_or_default()
        .iter()
        .map(|certificate| certificate.clone().into_owned())
        .collect()
}

fn tls(error: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error)
}

/// What the peer sent beyond the handshake: records read with its last
/// flight, and data rustls opened there.
struct Flight {
    leftover: Vec<u8>,
    early: Vec<u8>,
}

/// Either side's unbuffered connection.
trait Unbuffered {
    type Data;
    fn handshaking(&self) -> bool;
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Data>;
}

impl Unbuffered for UnbufferedClientConnection {
    type Data = ClientConnectionData;
    fn handshaking(&self) -> bool {
        self.is_handshaking()
    }
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Data> {
        self.process_tls_records(incoming)
    }
}

impl Unbuffered for UnbufferedServerConnection {
    type Data = ServerConnectionData;
    fn handshaking(&self) -> bool {
        self.is_handshaking()
    }
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Data> {
        self.process_tls_records(incoming)
    }
}

/// What to do once a state's borrow of the buffers has ended.
enum Next {
    Process,
    Read,
    Done,
    Failed(rustls::Error),
}

/// Runs the handshake until the connection may send data.
async fn drive<C, S>(connection: &mut C, stream: &mut S) -> io::Result<Flight>
where
    C: Unbuffered,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut incoming = vec![0; 16 * 1024 + 256];
    let mut used = 0;
    // How many of `incoming`'s first bytes, whole records, rustls has been
    // given.
    let mut fed = 0;
    let mut outgoing = Vec::new();
    let mut early = Vec::new();
    loop {
        // One record at a time, and none once the handshake is done: what
        // follows it is the record layer's (a KeyUpdate or a session
        // ticket rustls would take in, or a close_notify) and stays in
        // `incoming` for it.
        let next_record = whole_record(&incoming[fed..used]);
        // Without a whole record next, rustls sees the part that is here
        // (and can refuse bytes that are not TLS at once) but `fed` stays
        // before it.
        let given = match (connection.handshaking(), next_record) {
            (false, _) => 0,
            (true, Some(length)) => fed + length,
            (true, None) => used,
        };
        let whole = fed + next_record.unwrap_or(0);
        let UnbufferedStatus { mut discard, state } = connection.process(&mut incoming[..given]);
        let next = match state {
            Err(error) => Next::Failed(error),
            Ok(ConnectionState::EncodeTlsData(mut data)) => {
                encode(&mut outgoing, |room| data.encode(room))?;
                Next::Process
            }
            Ok(ConnectionState::TransmitTlsData(data)) => {
                stream.write_all(&outgoing).await?;
                stream.flush().await?;
                outgoing.clear();
                data.done();
                Next::Process
            }
            Ok(ConnectionState::BlockedHandshake) => Next::Read,
            // A server may send before the client's Finished (0.5-RTT): not
            // done until the handshake is.
            Ok(ConnectionState::WriteTraffic(_)) => Next::Done,
            Ok(ConnectionState::ReadTraffic(mut traffic)) => {
                while let Some(record) = traffic.next_record() {
                    let record = record.map_err(tls)?;
                    early.extend_from_slice(record.payload);
                    discard += record.discard;
                }
                Next::Process
            }
            Ok(ConnectionState::PeerClosed | ConnectionState::Closed) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection during the TLS handshake",
                ));
            }
            Ok(_) => {
                return Err(broken(
                    "the handshake reached a state capexec does not expect",
                ));
            }
        };
        incoming.copy_within(discard..used, 0);
        used -= discard;
        // rustls may hold ranges of what it was given (a handshake message
        // split across records) without discarding them yet: it is given
        // them again, and the next record after.
        fed = whole.min(given).saturating_sub(discard);
        let more = whole_record(&incoming[fed..used]).is_some();
        let next = match next {
            Next::Read | Next::Done if connection.handshaking() && more => Next::Process,
            Next::Done if connection.handshaking() => Next::Read,
            other => other,
        };
        match next {
            Next::Process => {}
            Next::Done => {
                incoming.truncate(used);
                return Ok(Flight {
                    leftover: incoming,
                    early,
                });
            }
            Next::Read => {
                if used == incoming.len() {
                    if incoming.len() >= MAX_FLIGHT {
                        return Err(broken("the peer's handshake flight is too long"));
                    }
                    incoming.resize((incoming.len() * 2).min(MAX_FLIGHT), 0);
                }
                let read = stream.read(&mut incoming[used..]).await?;
                if read == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the peer closed the connection during the TLS handshake",
                    ));
                }
                used += read;
            }
            Next::Failed(error) => {
                send_alert(connection, stream, &mut incoming[..used], &mut outgoing).await;
                return Err(tls(error));
            }
        }
    }
}

/// The length of `incoming`'s first record, if all of it is there.
fn whole_record(incoming: &[u8]) -> Option<usize> {
    match incoming {
        [_, _, _, high, low, ..] => {
            let whole = 5 + usize::from(u16::from_be_bytes([*high, *low]));
            (whole <= incoming.len()).then_some(whole)
        }
        _ => None,
    }
}

/// The alert rustls queued when the handshake failed, sent if the peer
/// takes it (best effort: the handshake has failed either way). rustls
/// hands a queued message out before it reads anything more, so one call
/// gives the alert and reads nothing: a second would read the bytes that
/// failed again. `incoming` is what is left of the peer's bytes, of which
/// rustls may hold ranges.
async fn send_alert<C, S>(
    connection: &mut C,
    stream: &mut S,
    incoming: &mut [u8],
    outgoing: &mut Vec<u8>,
) where
    C: Unbuffered,
    S: AsyncWrite + Unpin,
{
    if let Ok(ConnectionState::EncodeTlsData(mut data)) = connection.process(incoming).state
        && encode(outgoing, |room| data.encode(room)).is_ok()
    {
        let _ = stream.write_all(outgoing).await;
        let _ = stream.flush().await;
    }
}

/// Appends what `encode` writes to `outgoing`, with the room it asks for.
fn encode(
    outgoing: &mut Vec<u8>,
    mut encode: impl FnMut(&mut [u8]) -> Result<usize, EncodeError>,
) -> io::Result<()> {
    let at = outgoing.len();
    let mut room = 4096;
    loop {
        outgoing.resize(at + room, 0);
        match encode(&mut outgoing[at..]) {
            Ok(written) => {
                outgoing.truncate(at + written);
                return Ok(());
            }
            Err(EncodeError::InsufficientSize(InsufficientSizeError { required_size })) => {
                room = required_size;
            }
            Err(error) => {
                outgoing.truncate(at);
                return Err(broken(format!(
                    "a handshake message could not be encoded: {error}"
                )));
            }
        }
    }
}
