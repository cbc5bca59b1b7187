//! Ports: bulk TCP through `Executor.dial` (the path of `capexec forward
//! -L`) over a Unix socket, over TCP and over TLS, one way each and both
//! ways at once, next to a direct loopback TCP copy in the same run; the
//! set-up of a connection (dial and one byte there and back) next to a
//! direct connect; and many concurrent forwarded connections with the
//! server's memory. `ssh -L` (aes128-gcm) through an sshd of our own on
//! loopback is measured the same way, when sshd can run here (else the
//! run says why not), and TLS must move at least twice its rate.

use std::error::Error;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener};
use std::time::{Duration, Instant};

use capexec::capexec_capnp::executor;
use capexec::client;
use capexec::net::DirectRoute;
use tokio::io::{
    AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader,
};

use crate::Plan;
use crate::report::{Report, Target};
use crate::servers::Servers;
use crate::ssh::Sshd;

const SECTION: &str = "ports";
const CHUNK: usize = 64 << 10;

/// A loopback TCP peer: each connection first sends 8 bytes (how many to
/// send back), then its bytes; the peer sends that many back while it
/// reads everything to the end, and then 8 bytes more, the count of what
/// it read after the header (then half-closes): the client learns that
/// every byte it sent arrived, and stops its clock only then.
fn start_peer() -> Result<u16, Box<dyn Error>> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    std::thread::spawn(move || {
        for socket in listener.incoming() {
            let Ok(mut socket) = socket else { continue };
            std::thread::spawn(move || -> std::io::Result<()> {
                socket.set_nodelay(true)?;
                let mut header = [0u8; 8];
                socket.read_exact(&mut header)?;
                let down = u64::from_be_bytes(header);
                let mut writer = socket.try_clone()?;
                let sending =
                    std::thread::spawn(move || -> std::io::Result<std::net::TcpStream> {
                        let chunk = vec![b'd'; CHUNK];
                        let mut left = down;
                        while left > 0 {
                            let n = left.min(CHUNK as u64) as usize;
                            writer.write_all(&chunk[..n])?;
                            left -= n as u64;
                        }
                        Ok(writer)
                    });
                let mut buffer = vec![0u8; CHUNK];
                let mut received = 0u64;
                loop {
                    match socket.read(&mut buffer)? {
                        0 => break,
                        n => received += n as u64,
                    }
                }
                let mut writer = sending
                    .join()
                    .map_err(|_| std::io::Error::other("panicked"))??;
                writer.write_all(&received.to_be_bytes())?;
                writer.shutdown(Shutdown::Write)
            });
        }
    });
    Ok(port)
}

/// Sends `up` bytes and reads `down` back, both at once, on `stream`.
async fn exchange(
    mut read: impl AsyncBufRead + Unpin,
    mut write: impl AsyncWrite + Unpin,
    up: u64,
    down: u64,
) -> Result<(), Box<dyn Error>> {
    let sending = async {
        // The header goes with the first bytes: two small writes would
        // meet Nagle's algorithm and a delayed ACK on a path without
        // TCP_NODELAY (ssh's), 40 ms that are no one's transfer cost.
        let chunk = vec![b'u'; CHUNK];
        let first = up.min(CHUNK as u64) as usize;
        let mut head = down.to_be_bytes().to_vec();
        head.extend_from_slice(&chunk[..first]);
        write.write_all(&head).await?;
        let mut left = up - first as u64;
        while left > 0 {
            let n = left.min(CHUNK as u64) as usize;
            write.write_all(&chunk[..n]).await?;
            left -= n as u64;
        }
        write.shutdown().await
    };
    let receiving = async {
        // Where the reader hands its bytes out: a socket's, read into a
        // buffer of CHUNK; `dial`'s, in their messages.
        let mut answer = Answer::default();
        loop {
            let bytes = read.fill_buf().await?;
            if bytes.is_empty() {
                return Ok::<_, std::io::Error>(answer);
            }
            answer.take(bytes);
            let n = bytes.len();
            read.consume(n);
        }
    };
    let ((), answer) = futures::future::try_join(sending, receiving).await?;
    answer.check(up, down)
}

/// What a client of the peer ([`start_peer`]) received: its bytes'
/// count, and the last 8, which end with the peer's count of what it
/// read.
#[derive(Default)]
struct Answer {
    total: u64,
    last: [u8; 8],
}

impl Answer {
    fn take(&mut self, bytes: &[u8]) {
        self.total += bytes.len() as u64;
        let kept = bytes.len().min(8);
        self.last.rotate_left(kept);
        self.last[8 - kept..].copy_from_slice(&bytes[bytes.len() - kept..]);
    }

    /// Both ways whole: `down` bytes and the count, and the peer read `up`.
    fn check(&self, up: u64, down: u64) -> Result<(), Box<dyn Error>> {
        if self.total != down + 8 {
            return Err(format!("{} of {down} bytes and a count arrived", self.total).into());
        }
        let read = u64::from_be_bytes(self.last);
        if read != up {
            return Err(format!("the peer read {read} of {up} bytes").into());
        }
        Ok(())
    }
}

impl Write for Answer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.take(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A plain relay, the least any forward through a process of its own can
/// do: a Unix socket in front of the peer, whose every connection two
/// threads copy to and from a TCP connection to the peer with read(2) and
/// write(2) (four kernel copies a byte, as a forward through the server
/// makes; no Cap'n Proto, no copies of its own). The Unix socket's path.
fn start_relay(port: u16) -> Result<(tempfile::TempDir, std::path::PathBuf), Box<dyn Error>> {
    use std::os::unix::net::UnixListener;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("relay.sock");
    let listener = UnixListener::bind(&path)?;
    std::thread::spawn(move || {
        relay_each(listener.incoming(), port, |client| {
            Some((client.try_clone().ok()?, client))
        })
    });
    Ok((dir, path))
}

/// The same relay in front of the peer on loopback TCP: what a forward
/// through a TCP server at least costs, each byte crossing two TCP
/// connections where the baseline crosses one. Its port.
fn start_tcp_relay(port: u16) -> Result<u16, Box<dyn Error>> {
    let listener = TcpListener::bind(("127.0.0.1", 0))?;
    let relay_port = listener.local_addr()?.port();
    std::thread::spawn(move || {
        relay_each(listener.incoming(), port, |client| {
            client.set_nodelay(true).ok()?;
            Some((client.try_clone().ok()?, client))
        })
    });
    Ok(relay_port)
}

/// The opening end of a sealed tunnel in front of the peer: each
/// connection it accepts carries sealed TLS records (`sealed.rs`), which
/// it opens on to a connection of its own to the peer, and the peer's
/// bytes it seals back, each direction on a thread of its own. Its
/// address.
fn start_sealed_exit(port: u16) -> Result<std::net::SocketAddr, Box<dyn Error>> {
    let exit = TcpListener::bind(("127.0.0.1", 0))?;
    let address = exit.local_addr()?;
    std::thread::spawn(move || {
        for far in exit.incoming() {
            let _ = far.and_then(|far| {
                let peer = std::net::TcpStream::connect(("127.0.0.1", port))?;
                sealed_pumps(far, peer)
            });
        }
    });
    Ok(address)
}

/// Pumps between `sealed` (a connection carrying records) and `plain`, on
/// two threads: `sealed`'s records opened on to `plain`, `plain`'s bytes
/// sealed on to `sealed`; each passes its end on as a half-close, or a
/// failure as a closed connection (and the peer's count, [`Answer`],
/// tells the client).
fn sealed_pumps(sealed: std::net::TcpStream, plain: std::net::TcpStream) -> std::io::Result<()> {
    for socket in [&sealed, &plain] {
        socket.set_nodelay(true)?;
    }
    let (mut sealed_in, mut plain_out) = (sealed.try_clone()?, plain.try_clone()?);
    std::thread::spawn(move || {
        let how = match crate::sealed::receive(&mut sealed_in, &mut plain_out) {
            Ok(()) => Shutdown::Write,
            Err(_) => Shutdown::Both,
        };
        let _ = plain_out.shutdown(how);
    });
    let (plain_in, mut sealed_out) = (plain, sealed);
    std::thread::spawn(move || {
        let how = match crate::sealed::send(&plain_in, &mut sealed_out) {
            Ok(()) => Shutdown::Write,
            Err(_) => Shutdown::Both,
        };
        let _ = sealed_out.shutdown(how);
    });
    Ok(())
}

/// A sealed relay in front of the peer: an entry that accepts on loopback
/// TCP and seals each connection's bytes into a tunnel to the sealed exit
/// ([`start_sealed_exit`]), and opens what comes back. What `capexec
/// forward -L` over TLS, or `ssh -L`, at least costs: the shape of both
/// (a connection into a local process, a TLS one onwards, one more to the
/// peer), each byte read into user space, sealed, sent, opened and
/// written, and no protocol. Its port.
fn start_sealed_relay(port: u16) -> Result<u16, Box<dyn Error>> {
    let exit = start_sealed_exit(port)?;
    let entry = TcpListener::bind(("127.0.0.1", 0))?;
    let entry_port = entry.local_addr()?.port();
    std::thread::spawn(move || {
        for client in entry.incoming() {
            let _ = client.and_then(|client| {
                let near = std::net::TcpStream::connect(exit)?;
                sealed_pumps(near, client)
            });
        }
    });
    Ok(entry_port)
}

/// The exchange of [`direct`] with the client's own bytes sealed into one
/// connection to the sealed exit, and the peer's opened from it: `dial`'s
/// shape over TLS (the client's TLS connection to the server, the
/// server's to the peer) at its least, with the client's bytes copied into
/// records from memory as a TLS library does. Blocking: its own threads.
fn sealed_direct(
    exit: std::net::SocketAddr,
    up: u64,
    down: u64,
) -> Result<Duration, Box<dyn Error>> {
    /// `left` bytes copied out of a reused chunk, as [`exchange`] sends.
    struct Chunked {
        chunk: Vec<u8>,
        left: u64,
    }
    impl Read for Chunked {
        fn read(&mut self, into: &mut [u8]) -> std::io::Result<usize> {
            let n = into.len().min(self.chunk.len()).min(self.left as usize);
            into[..n].copy_from_slice(&self.chunk[..n]);
            self.left -= n as u64;
            Ok(n)
        }
    }
    let started = Instant::now();
    let connection = std::net::TcpStream::connect(exit)?;
    connection.set_nodelay(true)?;
    let mut sending = connection.try_clone()?;
    let sender = std::thread::spawn(move || -> std::io::Result<()> {
        let header = std::io::Cursor::new(down.to_be_bytes());
        let bytes = Read::chain(
            header,
            Chunked {
                chunk: vec![b'u'; CHUNK],
                left: up,
            },
        );
        crate::sealed::send_from_memory(bytes, &mut sending)?;
        sending.shutdown(Shutdown::Write)
    });
    let mut answer = Answer::default();
    let received = crate::sealed::receive(&mut &connection, &mut answer);
    sender.join().map_err(|_| "the sealed sender panicked")??;
    received?;
    answer.check(up, down)?;
    Ok(started.elapsed())
}

/// A half-closable stream of the relay.
trait HalfClose: Read + Write + Send + 'static {
    fn half_close(&self);
}

impl HalfClose for std::net::TcpStream {
    fn half_close(&self) {
        let _ = self.shutdown(Shutdown::Write);
    }
}

impl HalfClose for std::os::unix::net::UnixStream {
    fn half_close(&self) {
        let _ = self.shutdown(Shutdown::Write);
    }
}

/// Relays every connection `incoming` accepts to the peer on `port`, each
/// direction on a thread of its own (`split` gives a connection's two
/// handles).
fn relay_each<S: HalfClose>(
    incoming: impl Iterator<Item = std::io::Result<S>>,
    port: u16,
    split: impl Fn(S) -> Option<(S, S)>,
) {
    /// Copies until end of file, which it passes on as a half-close.
    fn pump(mut from: impl Read, mut to: impl HalfClose) {
        let mut buffer = vec![0u8; 256 << 10];
        while let Ok(n) = from.read(&mut buffer) {
            if n == 0 || to.write_all(&buffer[..n]).is_err() {
                break;
            }
        }
        to.half_close();
    }
    for client in incoming {
        let Some((client_in, client_out)) = client.ok().and_then(&split) else {
            continue;
        };
        let Ok(far) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            continue;
        };
        let _ = far.set_nodelay(true);
        let Ok(far_in) = far.try_clone() else {
            continue;
        };
        std::thread::spawn(move || pump(client_in, far));
        std::thread::spawn(move || pump(far_in, client_out));
    }
}

async fn relayed(path: &std::path::Path, up: u64, down: u64) -> Result<Duration, Box<dyn Error>> {
    let started = Instant::now();
    let (read, write) = tokio::net::UnixStream::connect(path).await?.into_split();
    exchange(BufReader::with_capacity(CHUNK, read), write, up, down).await?;
    Ok(started.elapsed())
}

async fn direct(port: u16, up: u64, down: u64) -> Result<Duration, Box<dyn Error>> {
    let started = Instant::now();
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream.set_nodelay(true)?;
    let (read, write) = stream.into_split();
    exchange(BufReader::with_capacity(CHUNK, read), write, up, down).await?;
    Ok(started.elapsed())
}

/// `capexec forward -L 0:127.0.0.1:PORT` through a server: what a user of
/// the command line gets (its own relay between the local socket and the
/// connection through the server included). Killed on drop.
struct CliForward {
    child: std::process::Child,
    port: u16,
}

impl CliForward {
    fn start(server: &crate::servers::Serve, port: u16) -> Result<CliForward, Box<dyn Error>> {
        use std::io::BufRead;
        let (args, token) = server.cli_args();
        let mut command = std::process::Command::new(crate::servers::CAPEXEC);
        command
            .arg("forward")
            .args(&args)
            .args(["-L", &format!("0:127.0.0.1:{port}")])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null());
        if let Some((name, value)) = token {
            command.env(name, value);
        }
        let mut child = command.spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut line = String::new();
        std::io::BufReader::new(stdout).read_line(&mut line)?;
        // "-L tcp:127.0.0.1:PORT -> tcp:127.0.0.1:TARGET"
        let local = line
            .split_whitespace()
            .nth(1)
            .and_then(|address| address.rsplit(':').next())
            .and_then(|port| port.parse().ok())
            .ok_or_else(|| format!("capexec forward said {line:?}"))?;
        Ok(CliForward { child, port: local })
    }
}

impl Drop for CliForward {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Through `dial`: in Cap'n Proto messages, or through a direct channel
/// if `route` is given (and the server must grant it).
async fn dialled(
    executor: &executor::Client,
    route: Option<&DirectRoute>,
    port: u16,
    up: u64,
    down: u64,
) -> Result<Duration, Box<dyn Error>> {
    let started = Instant::now();
    let stream = client::dial_via(executor, &format!("tcp:127.0.0.1:{port}"), route).await?;
    if stream.is_direct() != route.is_some() {
        return Err("the server did not grant a direct channel".into());
    }
    let (read, write) = stream.into_split();
    exchange(read, write, up, down).await?;
    Ok(started.elapsed())
}

pub async fn run(
    plan: &Plan,
    servers: &Servers,
    report: &mut Report,
) -> Result<(), Box<dyn Error>> {
    let size = plan.ports_bytes;
    let port = start_peer()?;
    let connections = servers.connect_direct().await?;
    let (tls, _tls_connection) = servers.tls.connect().await?;
    let sshd = Sshd::start();
    let forward = |sshd: &Sshd| sshd.forward(port).map_err(|why| why.to_string());
    let ssh = match sshd
        .as_ref()
        .map_err(|why| why.to_string())
        .and_then(forward)
    {
        Ok(ssh) => Some(ssh),
        Err(why) => {
            eprintln!("ports: no ssh -L rows: {why}");
            report.figure(SECTION, "ssh -L", format!("not measured: {why}"), None);
            None
        }
    };
    let (unix, tcp) = (&connections.unix, &connections.tcp);
    let unix_route = connections
        .unix_route
        .as_ref()
        .ok_or("no direct route over unix")?;
    // The paths `capexec forward` takes: over a Unix socket a direct
    // channel, over TCP and TLS Cap'n Proto messages; then the messages
    // over a Unix socket (what a chain, or a dial without a route, takes).
    // Whether each has a target, and whether it must also beat ssh -L.
    let paths = [
        (
            "unix: dial, direct channel",
            unix,
            Some(unix_route),
            true,
            false,
        ),
        ("tcp: dial", tcp, None, true, false),
        ("tls: dial", &tls, None, true, true),
        ("unix: dial, in messages", unix, None, false, false),
    ];
    let (_relay_dir, relay) = start_relay(port)?;
    let tcp_relay = start_tcp_relay(port)?;
    let sealed_relay = start_sealed_relay(port)?;
    let sealed_exit = start_sealed_exit(port)?;
    let forwards = [
        (
            "`capexec forward -L` over unix",
            CliForward::start(&servers.unix, port)?,
        ),
        (
            "`capexec forward -L` over tcp",
            CliForward::start(&servers.tcp, port)?,
        ),
        (
            "`capexec forward -L` over tls",
            CliForward::start(&servers.tls, port)?,
        ),
    ];
    eprintln!(
        "ports: {} MiB each way through dial, {} round(s)",
        size >> 20,
        plan.ports_rounds
    );
    for (what, up, down, bytes) in [
        ("one way, client to peer", size, 0, size),
        ("one way, peer to client", 0, size, size),
        ("both ways at once", size, size, 2 * size),
    ] {
        let mut baseline = Vec::new();
        let mut through = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
        let mut over_ssh = Vec::new();
        let mut over_relay = Vec::new();
        let mut over_tcp_relay = Vec::new();
        let mut over_sealed_relay = Vec::new();
        let mut sealed_directly = Vec::new();
        let mut over_cli = [Vec::new(), Vec::new(), Vec::new()];
        for _ in 0..plan.ports_rounds {
            baseline.push(direct(port, up, down).await?);
            over_relay.push(relayed(&relay, up, down).await?);
            over_tcp_relay.push(direct(tcp_relay, up, down).await?);
            over_sealed_relay.push(direct(sealed_relay, up, down).await?);
            sealed_directly.push(
                tokio::task::spawn_blocking(move || {
                    sealed_direct(sealed_exit, up, down).map_err(|why| why.to_string())
                })
                .await??,
            );
            for (samples, (_, forward)) in over_cli.iter_mut().zip(&forwards) {
                samples.push(direct(forward.port, up, down).await?);
            }
            for (samples, (_, executor, route, _, _)) in through.iter_mut().zip(&paths) {
                samples.push(dialled(executor, *route, port, up, down).await?);
            }
            if let Some(ssh) = &ssh {
                over_ssh.push(direct(ssh.port, up, down).await?);
            }
        }
        let base = report.baseline(
            SECTION,
            format!("direct loopback TCP, {what}"),
            baseline,
            Some(bytes),
        );
        report.case(
            SECTION,
            format!("plain relay (unix -> tcp, read/write), {what}"),
            over_relay,
            base,
            Some(bytes),
            None,
            "the least a forward through a process of its own costs",
        );
        report.case(
            SECTION,
            format!("plain relay (tcp -> tcp, read/write), {what}"),
            over_tcp_relay,
            base,
            Some(bytes),
            None,
            "the least a forward through a TCP server costs",
        );
        let relay_floor = report.case(
            SECTION,
            format!("sealed relay (tcp -> TLS records -> tcp), {what}"),
            over_sealed_relay,
            base,
            Some(bytes),
            None,
            "the least `capexec forward -L` over TLS, or ssh -L, costs",
        );
        let dial_floor = report.case(
            SECTION,
            format!("sealed directly (the client's records -> tcp), {what}"),
            sealed_directly,
            base,
            Some(bytes),
            None,
            "the least TLS `dial` costs: the TLS-hop floor",
        );
        let mut against_ssh = Vec::new();
        for (samples, (name, _, _, targeted, beats_ssh)) in through.into_iter().zip(&paths) {
            let row = report.case(
                SECTION,
                format!("{name}, {what}"),
                samples,
                base,
                Some(bytes),
                targeted.then_some(Target::AtLeastShare(0.6)),
                "",
            );
            if *beats_ssh {
                report.relative(row, dial_floor, "the TLS-hop floor");
                against_ssh.push(row);
            }
        }
        for (samples, (name, _)) in over_cli.into_iter().zip(&forwards) {
            let row = report.case(
                SECTION,
                format!("{name}, {what}"),
                samples,
                base,
                Some(bytes),
                None,
                "",
            );
            // Its shape is the sealed relay's: a process in front of the
            // peer, one connection into it, a TLS one onwards.
            if name.ends_with("over tls") {
                report.relative(row, relay_floor, "the sealed relay");
            }
        }
        if ssh.is_some() {
            let ssh_row = report.case(
                SECTION,
                format!("ssh -L, {what}"),
                over_ssh,
                base,
                Some(bytes),
                None,
                "",
            );
            report.relative(ssh_row, relay_floor, "the sealed relay");
            report.reach(
                SECTION,
                format!("2x ssh -L's rate against the TLS-hop floor of `dial`, {what}"),
                2.0,
                ssh_row,
                dial_floor,
            );
            for row in against_ssh {
                report.also(
                    row,
                    Target::AtLeastRateOf {
                        of: ssh_row,
                        times: 2.0,
                        name: "ssh -L",
                    },
                );
            }
        }
    }

    // Set-up: connect and one byte there and back.
    let runs = plan.latency_runs / 5;
    let mut baseline = Vec::new();
    let mut through = Vec::new();
    let mut through_direct = Vec::new();
    let mut over_ssh = Vec::new();
    for _ in 0..runs {
        baseline.push(direct(port, 1, 1).await?);
        through.push(dialled(unix, None, port, 1, 1).await?);
        through_direct.push(dialled(unix, Some(unix_route), port, 1, 1).await?);
        if let Some(ssh) = &ssh {
            over_ssh.push(direct(ssh.port, 1, 1).await?);
        }
    }
    let base = report.baseline(SECTION, "direct connect + 1 byte each way", baseline, None);
    report.case(
        SECTION,
        "unix: dial + 1 byte each way",
        through,
        base,
        None,
        None,
        "",
    );
    report.case(
        SECTION,
        "unix: dial + direct channel + 1 byte each way",
        through_direct,
        base,
        None,
        None,
        "",
    );
    if ssh.is_some() {
        report.case(
            SECTION,
            "ssh -L (open connection): connect + 1 byte each way",
            over_ssh,
            base,
            None,
            None,
            "",
        );
    }

    // Many at once, held open: the server's memory. A direct dial holds
    // two descriptors of the capabilities' share (2,500 at a limit of
    // 20,000, 1,875 of it for connections that hold much, 1,250 for one):
    // half as many direct ones, over connections of
    // DIRECT_DIALS_PER_CONNECTION each.
    const DIRECT_DIALS_PER_CONNECTION: usize = 250;
    for direct in [false, true] {
        let n = if direct {
            plan.concurrent / 2
        } else {
            plan.concurrent
        };
        let how = if direct { ", direct channels" } else { "" };
        let before = servers.unix.usage()?;
        let started = Instant::now();
        let mut streams = Vec::with_capacity(n);
        let mut connections = Vec::new();
        for dial in 0..n {
            if direct && dial % DIRECT_DIALS_PER_CONNECTION == 0 {
                let (executor, connection) = servers.unix.connect().await?;
                let route = connection
                    .direct_route()
                    .ok_or("no direct route over unix")?;
                connections.push((executor, route, connection));
            }
            let (executor, route) = match connections.last() {
                Some((executor, route, _)) => (executor, Some(route)),
                None => (unix, None),
            };
            let mut stream =
                client::dial_via(executor, &format!("tcp:127.0.0.1:{port}"), route).await?;
            stream.write_all(&1u64.to_be_bytes()).await?;
            streams.push(stream);
        }
        for stream in &mut streams {
            let mut one = [0u8; 1];
            stream.read_exact(&mut one).await?;
        }
        let opened = started.elapsed();
        let during = servers.unix.usage()?;
        let per = (during.rss_kib.saturating_sub(before.rss_kib)) as f64 / n as f64;
        // A direct channel counts six descriptors in the connection's
        // share of the capabilities' descriptors: past it, dials go
        // through the sinks.
        let direct = streams.iter().filter(|stream| stream.is_direct()).count();
        report.figure(
            SECTION,
            format!("{n} concurrent dialled connections{how}, each answered"),
            format!(
                "{:.0} ms; server RSS {} -> {} KiB ({per:.1} KiB per connection), fds {} -> {}, \
                 {direct} direct",
                opened.as_secs_f64() * 1e3,
                before.rss_kib,
                during.rss_kib,
                before.fds,
                during.fds
            ),
            Some(("< 64 KiB per connection".to_string(), per < 64.0)),
        );
        drop((streams, connections));
        // The next round starts from a server that let the last go.
        let deadline = Instant::now() + Duration::from_secs(20);
        while servers.unix.usage()?.fds > before.fds && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(())
}
