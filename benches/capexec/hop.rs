//! TCP hops at their best, the floor of any command run over TCP: real
//! processes on each side (`head` on one, `wc` on the other), and between
//! them a loopback TCP connection that two threads of this process fill
//! and drain with splice(2), pipe to socket and socket to pipe, so that no
//! byte is copied through user space. `capexec run --connect tcp:…` puts
//! its connection where this hop is, and must move the same bytes at least
//! this way; it does more (framing, the server's reads of the command's
//! pipe, the client's writes into its own). A remote command that reads
//! its stdin and writes what it read (`… | capexec run -- cat | wc`) has
//! every byte cross the connection twice, there and back: its floor is two
//! hops, `head | <hop> | cat | <hop> | wc`. Over TLS the least a hop
//! costs is more: its bytes are sealed and opened (`sealed.rs`).

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::resource::{UsageWho, getrusage};

use crate::sealed;

/// How a hop carries its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// splice(2) at both ends: no byte through user space.
    Spliced,
    /// read(2) and write(2) of up to 256 KiB at both ends: each byte
    /// through user space once, as any program that looks at its bytes
    /// moves them (on some machines faster than splice(2)).
    Copied,
    /// As TLS 1.3 records, sealed and opened with AES-128-GCM
    /// (`sealed.rs`).
    Sealed,
}

impl Kind {
    /// The hop as a line shows it.
    pub fn shown(self) -> &'static str {
        match self {
            Kind::Spliced => "<TCP hop>",
            Kind::Copied => "<TCP hop, read/write>",
            Kind::Sealed => "<TLS hop>",
        }
    }
}

/// What one pipeline through the hops took: its wall time, what its last
/// process printed, and the CPU time of the hops' threads.
pub struct Hopped {
    pub took: Duration,
    pub printed: String,
    pub hop_cpu: Duration,
}

/// Runs `chains[0] | <TCP hop> | chains[1] | <TCP hop> | …`, each chain
/// programs with their arguments joined by pipes, and waits for every
/// process and every hop's threads. A process that fails, or a hop that
/// fails, is an error (the processes' failures first: a hop fails after
/// the program it feeds, with a broken pipe). The last program's output
/// is read once it has ended: it must print little (`wc -c`), or it would
/// block on a full pipe.
pub fn run(chains: &[Vec<Vec<String>>], kind: Kind) -> Result<Hopped, Box<dyn std::error::Error>> {
    let started = Instant::now();
    let mut children = Vec::new();
    let outcome = start_and_pump(chains, kind, &mut children);
    // Every process is waited for, whatever failed, so that none is left
    // behind; the last one's output is what `wc -c` counted.
    let mut printed = String::new();
    let mut failed = Vec::new();
    let last = children.len().saturating_sub(1);
    for (i, (name, child)) in children.into_iter().enumerate() {
        let output = child.wait_with_output();
        match output {
            Ok(output) if output.status.success() => {
                if i == last {
                    printed = String::from_utf8_lossy(&output.stdout).into_owned();
                }
            }
            Ok(output) => failed.push(format!("{name}: {}", output.status)),
            Err(why) => failed.push(format!("{name}: {why}")),
        }
    }
    let took = started.elapsed();
    if let Err(why) = &outcome {
        failed.push(format!("a TCP hop: {why}"));
    }
    let hop_cpu = match outcome {
        Ok(hop_cpu) if failed.is_empty() => hop_cpu,
        _ => return Err(failed.join("; ").into()),
    };
    Ok(Hopped {
        took,
        printed,
        hop_cpu,
    })
}

/// One hop's ends before it pumps: the pipe it drains, its connection's
/// two sockets, and the pipe it fills.
struct Hop {
    from: ChildStdout,
    sender: TcpStream,
    receiver: TcpStream,
    feeds: OwnedFd,
}

/// Starts every chain with a hop's connection between each and the next,
/// then pumps the hops to the end; the processes started are pushed onto
/// `children` (named) as they start, for the caller to wait for. Returns
/// the hops' CPU time.
fn start_and_pump(
    chains: &[Vec<Vec<String>>],
    kind: Kind,
    children: &mut Vec<(String, Child)>,
) -> io::Result<Duration> {
    let (first, rest) = chains
        .split_first()
        .ok_or_else(|| io::Error::other("no programs"))?;
    chain(first, Stdio::null(), children)?;
    let mut hops = Vec::new();
    for next in rest {
        let from = children
            .last_mut()
            .and_then(|(_, child)| child.stdout.take())
            .ok_or_else(|| io::Error::other("a chain before a hop has no stdout"))?;
        let (into, feeds) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        chain(next, Stdio::from(into), children)?;
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let sender = TcpStream::connect(listener.local_addr()?)?;
        let (receiver, _) = listener.accept()?;
        hops.push(Hop {
            from,
            sender,
            receiver,
            feeds,
        });
    }
    std::thread::scope(|scope| {
        let threads: Vec<_> = hops
            .into_iter()
            .map(|hop| {
                let sending = scope.spawn(move || send(hop.from, hop.sender, kind));
                let receiving = scope.spawn(move || receive(hop.receiver, hop.feeds, kind));
                (sending, receiving)
            })
            .collect();
        let panicked = |_| io::Error::other("a thread of a hop panicked");
        let mut cpu = Duration::ZERO;
        let mut first_failure = None;
        for (sending, receiving) in threads {
            // A hop's receiving side's error first: when it fails, the
            // sender fails after it, with a broken connection.
            let received = receiving.join().map_err(panicked).and_then(|r| r);
            let sent = sending.join().map_err(panicked).and_then(|r| r);
            match received.and_then(|received| Ok(received + sent?)) {
                Ok(used) => cpu += used,
                Err(why) => {
                    first_failure.get_or_insert(why);
                }
            }
        }
        first_failure.map_or(Ok(cpu), Err)
    })
}

/// Starts `programs` joined by pipes, the first reading `stdin`, the last
/// writing a pipe left in its `Child`.
fn chain(
    programs: &[Vec<String>],
    stdin: Stdio,
    children: &mut Vec<(String, Child)>,
) -> io::Result<()> {
    let mut stdin = Some(stdin);
    for argv in programs {
        let (program, args) = argv
            .split_first()
            .ok_or_else(|| io::Error::other("an empty command"))?;
        // The first reads `stdin`; each after it the one before's stdout.
        let input = match stdin.take() {
            Some(stdin) => stdin,
            None => children
                .last_mut()
                .and_then(|(_, before)| before.stdout.take())
                .map(Stdio::from)
                .ok_or_else(|| io::Error::other("no pipe from the program before"))?,
        };
        let child = Command::new(program)
            .args(args)
            .stdin(input)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|why| io::Error::new(why.kind(), format!("cannot start {program}: {why}")))?;
        children.push((argv.join(" "), child));
    }
    Ok(())
}

/// The most one splice(2) call moves.
const CHUNK: usize = 1 << 20;

/// Pipe to socket until the pipe's end, then the socket's write side
/// shut, as a client does at its stdin's end.
fn send(from: ChildStdout, socket: TcpStream, kind: Kind) -> io::Result<Duration> {
    match kind {
        Kind::Spliced => {
            pump(from.as_raw_fd(), socket.as_raw_fd())?;
            socket.shutdown(Shutdown::Write)?;
        }
        Kind::Copied => {
            let (mut from, mut socket) = (from, socket);
            copy(&mut from, &mut socket)?;
            socket.shutdown(Shutdown::Write)?;
        }
        Kind::Sealed => {
            let mut socket = socket;
            sealed::send(&from, &mut socket)?;
            socket.shutdown(Shutdown::Write)?;
        }
    }
    thread_cpu()
}

/// Socket to pipe until the connection's end; the pipe closes after, and
/// its reader sees the end.
fn receive(socket: TcpStream, into: OwnedFd, kind: Kind) -> io::Result<Duration> {
    match kind {
        Kind::Spliced => {
            pump(socket.as_raw_fd(), into.as_raw_fd())?;
            drop(into);
        }
        Kind::Copied => {
            let (mut socket, mut into) = (socket, std::fs::File::from(into));
            copy(&mut socket, &mut into)?;
        }
        Kind::Sealed => {
            let (mut socket, mut into) = (socket, std::fs::File::from(into));
            sealed::receive(&mut socket, &mut into)?;
        }
    }
    thread_cpu()
}

/// splice(2) from `from` to `to` (one of them a pipe) until `from` ends.
fn pump(from: i32, to: i32) -> io::Result<()> {
    loop {
        // SAFETY: both descriptors are open for the call (their owners
        // outlive it) and no offsets are passed.
        let moved = unsafe {
            libc::splice(
                from,
                std::ptr::null_mut(),
                to,
                std::ptr::null_mut(),
                CHUNK,
                libc::SPLICE_F_MOVE | libc::SPLICE_F_MORE,
            )
        };
        match moved {
            0 => return Ok(()),
            n if n > 0 => {}
            _ => {
                let why = io::Error::last_os_error();
                if why.kind() != io::ErrorKind::Interrupted {
                    return Err(why);
                }
            }
        }
    }
}

/// read(2) from `from` and write(2) to `to`, 256 KiB at most a call, until
/// `from` ends. Not `std::io::copy`, which splices between these
/// descriptors.
fn copy(from: &mut impl Read, to: &mut impl Write) -> io::Result<()> {
    let mut buffer = vec![0u8; 256 * 1024];
    loop {
        match from.read(&mut buffer) {
            Ok(0) => return Ok(()),
            Ok(read) => to.write_all(&buffer[..read])?,
            Err(why) if why.kind() == io::ErrorKind::Interrupted => {}
            Err(why) => return Err(why),
        }
    }
}

/// The calling thread's CPU time so far, user and system.
fn thread_cpu() -> io::Result<Duration> {
    let usage = getrusage(UsageWho::RUSAGE_THREAD)?;
    let time = |t: nix::sys::time::TimeVal| {
        Duration::new(t.tv_sec().max(0) as u64, t.tv_usec().max(0) as u32 * 1000)
    };
    Ok(time(usage.user_time()) + time(usage.system_time()))
}
