//! `capexec forward`: ssh's `-L` and `-R` through an executor, until
//! interrupted.
//!
//! `-L`: listens here; each connection accepted is dialled from the
//! executor's machine (`Executor.dial`) and the two are spliced. `-R`:
//! listens on the executor's machine (`Executor.listen`); each connection
//! it accepts is connected to from here. Both directions of a connection
//! go on independently (half-close is passed on), and a reset or failure
//! at either end resets the other end too.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use capexec::capexec_capnp::executor;
use capexec::client::{self, PortStream};
use capexec::model::{Address, io_message};
use capexec::net::DirectRoute;
use capexec::ports::{PortRules, Socket};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::forward_spec::ForwardSpec;
use crate::cli::{EXIT_CAPEXEC_FAILURE, ForwardArgs, stdio, target};

/// Bytes moved at once in each direction.
const CHUNK_BYTES: usize = 64 * 1024;

pub fn main(args: ForwardArgs) -> i32 {
    if args.no_command {
        stdio::note("-N is not needed: capexec forward runs no command, it only forwards");
    }
    crate::cli::run_local(async move {
        match forward(args).await {
            Ok(code) => code,
            Err(message) => {
                stdio::note(&message);
                EXIT_CAPEXEC_FAILURE
            }
        }
    })
}

/// Prints a forward's line on stdout, under the rule of every
/// subcommand's stdout (`stdio::unwritten`): a line that cannot be written
/// ends capexec there, as SIGPIPE ends a local program; its listeners and
/// its connection close with it, which the server reads as the release of
/// everything opened through it.
fn announce(line: &str) {
    let code = stdio::print_answer(format!("{line}\n"), "the forward's line");
    if code != 0 {
        std::process::exit(code);
    }
}

/// The signals that end `capexec forward`, with their names.
const CAUGHT: [(i32, &str); 3] = [
    (libc::SIGINT, "SIGINT"),
    (libc::SIGTERM, "SIGTERM"),
    (libc::SIGHUP, "SIGHUP"),
];

async fn forward(args: ForwardArgs) -> Result<i32, String> {
    if args.local.is_empty() && args.remote.is_empty() {
        return Err("nothing to forward: give -L or -R (see capexec forward --help)".to_string());
    }
    // Caught from the start, so that none of them kills us half set up.
    let mut signals = Vec::new();
    for (number, _) in CAUGHT {
        let kind = SignalKind::from_raw(number);
        signals.push(signal(kind).map_err(|error| format!("cannot catch signals: {error}"))?);
    }
    // Connecting may wait for an answer on the terminal (trust on first
    // use), or for a server that says nothing: a signal ends it at once.
    let connected = async {
        let target = target::target(&args.connect).await?;
        target.established().await?;
        Ok::<_, String>(target)
    };
    let signalled = futures::future::select_all(signals.iter_mut().map(|s| Box::pin(s.recv())));
    let mut target = tokio::select! {
        target = connected => target?,
        (_, index, _) = signalled => {
            let (number, name) = CAUGHT[index];
            stdio::note(&format!("{name}: stopped before forwarding"));
            return Ok(128 + number);
        }
    };
    let executor = Rc::new(RefCell::new(executor_of(&args, &target)));
    // Local listeners stay across reconnections: their ports do not change,
    // nor does the socket their direct channels are opened on.
    let route = direct_route(&target);
    let _local = open_local(&executor, route, &args.local, announce).await?;
    loop {
        let (lost_tx, lost_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let current = executor.borrow().clone();
        let remote = open_remote(&current, &args.remote, announce, lost_tx).await?;
        let signalled = futures::future::select_all(signals.iter_mut().map(|s| Box::pin(s.recv())));
        let why = tokio::select! {
            _ = signalled => return Ok(0),
            why = lost(&target, lost_rx) => why,
        };
        // Connections through the old one fail (reset); new ones wait.
        drop(remote);
        let Some(grace) = args.resume else {
            return Err(why);
        };
        stdio::note(&format!(
            "{why}; reconnecting (for up to {})",
            capexec::model::show_duration(grace)
        ));
        match reconnect(&args, grace, &mut signals).await? {
            Some(again) => target = again,
            None => return Ok(0),
        }
        *executor.borrow_mut() = executor_of(&args, &target);
        stdio::note("reconnected: forwarding again");
    }
}

/// Where `-L` connections open their direct channels: a server on this
/// machine's Unix socket. (A dial the server passes on, through an
/// environment or a chain, declines its channel: the sinks carry it.)
pub fn direct_route(target: &target::Target) -> Option<Rc<DirectRoute>> {
    target
        .connection
        .as_ref()
        .and_then(|connection| connection.direct_route())
        .map(Rc::new)
}

fn executor_of(args: &ForwardArgs, target: &target::Target) -> executor::Client {
    match &args.environment {
        Some(path) => client::environment(&target.executor, path),
        None => target.executor.clone(),
    }
}

/// Why the connection is gone, once it is (a listener on the server lost
/// says so too).
async fn lost(
    target: &target::Target,
    mut listeners: tokio::sync::mpsc::UnboundedReceiver<String>,
) -> String {
    let closed = async {
        match &target.connection {
            Some(connection) => connection.closed().await,
            // The embedded executor has no connection to lose.
            None => std::future::pending().await,
        }
    };
    tokio::pin!(closed);
    // Without `-R` every sender is gone from the start: a closed channel
    // is ready at once, and polling it again would spin.
    let mut listening = true;
    loop {
        tokio::select! {
            () = &mut closed => {
                let said = match &target.connection {
                    Some(connection) => connection.abort_reason().await,
                    None => None,
                };
                return match said {
                    Some(reason) => format!("the connection to the server was lost: {reason}"),
                    None => "the connection to the server was lost".to_string(),
                };
            }
            why = listeners.recv(), if listening => match why {
                Some(why) => return why,
                None => listening = false,
            },
        }
    }
}

/// Connects again within `grace`, trying every half second; `None` if a
/// signal came first.
async fn reconnect(
    args: &ForwardArgs,
    grace: Duration,
    signals: &mut [tokio::signal::unix::Signal],
) -> Result<Option<target::Target>, String> {
    let deadline = tokio::time::Instant::now() + grace;
    loop {
        let attempt = async {
            match target::established_target(&args.connect).await {
                Ok(target) => Ok(target),
                Err(why) => {
                    tokio::time::sleep_until(
                        deadline.min(tokio::time::Instant::now() + Duration::from_millis(500)),
                    )
                    .await;
                    Err(why)
                }
            }
        };
        let signalled = futures::future::select_all(signals.iter_mut().map(|s| Box::pin(s.recv())));
        tokio::select! {
            _ = signalled => return Ok(None),
            result = attempt => match result {
                Ok(target) => return Ok(Some(target)),
                Err(why) if tokio::time::Instant::now() >= deadline => {
                    return Err(format!(
                        "gave up reconnecting after {}: {why}",
                        capexec::model::show_duration(grace)
                    ));
                }
                Err(_) => {}
            },
        }
    }
}

/// Forwards that run until dropped.
pub struct Forwards(Vec<tokio::task::AbortHandle>);

impl Drop for Forwards {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// The forwards of one command (`capexec run --forward`), which follow
/// it across reconnections: `-L` listeners stay here (their ports do not
/// change) and dial through the newest connection; `-R` listeners are
/// opened again on the executor's machine, and announced again.
pub struct Forwarding {
    executor: Rc<RefCell<executor::Client>>,
    _local: Forwards,
    remote: RefCell<Forwards>,
    remote_specs: Vec<ForwardSpec>,
    announce: fn(&str),
    lost: tokio::sync::mpsc::UnboundedSender<String>,
}

impl Forwarding {
    /// Sets up every forward through `executor`, each announced once it
    /// listens; a failed one fails all. A listener on the server that goes
    /// away is reported on `lost`.
    pub async fn open(
        executor: &executor::Client,
        route: Option<Rc<DirectRoute>>,
        local: &[ForwardSpec],
        remote: &[ForwardSpec],
        announce: fn(&str),
        lost: tokio::sync::mpsc::UnboundedSender<String>,
    ) -> Result<Forwarding, String> {
        let shared = Rc::new(RefCell::new(executor.clone()));
        let local_forwards = open_local(&shared, route, local, announce).await?;
        let remote_forwards = open_remote(executor, remote, announce, lost.clone()).await?;
        Ok(Forwarding {
            executor: shared,
            _local: local_forwards,
            remote: RefCell::new(remote_forwards),
            remote_specs: remote.to_vec(),
            announce,
            lost,
        })
    }

    /// Forwards through `executor` from now on (a new connection's): the
    /// connections through the old one have failed already.
    pub async fn reconnected(&self, executor: &executor::Client) -> Result<(), String> {
        *self.executor.borrow_mut() = executor.clone();
        // The old listeners went with their connection.
        drop(self.remote.replace(Forwards(Vec::new())));
        let remote = open_remote(
            executor,
            &self.remote_specs,
            self.announce,
            self.lost.clone(),
        )
        .await?;
        *self.remote.borrow_mut() = remote;
        Ok(())
    }
}

/// `-L`: listens here; each connection is dialled through whatever
/// `executor` holds when it arrives.
async fn open_local(
    executor: &Rc<RefCell<executor::Client>>,
    route: Option<Rc<DirectRoute>>,
    local: &[ForwardSpec],
    announce: fn(&str),
) -> Result<Forwards, String> {
    let mut tasks = Forwards(Vec::new());
    for spec in local {
        let shown = format!("-L {} -> {}", spec.listen, spec.target);
        let listening = listen_here(spec)
            .await
            .map_err(|why| format!("{shown}: {why}"))?;
        let shown = format!("-L {} -> {}", listening.address(), spec.target);
        announce(&shown);
        let task = tokio::task::spawn_local(serve_local(
            listening,
            Rc::clone(executor),
            route.clone(),
            spec.target.clone(),
            Rc::from(shown),
        ));
        tasks.0.push(task.abort_handle());
    }
    Ok(tasks)
}

/// `-R`: listens on the executor's machine.
async fn open_remote(
    executor: &executor::Client,
    remote: &[ForwardSpec],
    announce: fn(&str),
    lost: tokio::sync::mpsc::UnboundedSender<String>,
) -> Result<Forwards, String> {
    let mut tasks = Forwards(Vec::new());
    for spec in remote {
        let shown = format!("-R {} -> {}", spec.listen, spec.target);
        let listener = client::listen(executor, &spec.listen)
            .await
            .map_err(|error| format!("{shown}: {error}"))?;
        let shown = format!("-R {} -> {}", listener.address(), spec.target);
        announce(&shown);
        let task = tokio::task::spawn_local(serve_remote(
            listener,
            spec.target.clone(),
            Rc::from(shown),
            lost.clone(),
        ));
        tasks.0.push(task.abort_handle());
    }
    Ok(tasks)
}

async fn listen_here(spec: &ForwardSpec) -> Result<capexec::ports::Listening, String> {
    let address: Address = spec.listen.parse()?;
    capexec::ports::listen(&address, &spec.listen, &PortRules::unrestricted())
        .await
        .map_err(|refusal| refusal.message)
}

/// The local connection and a direct channel, spliced kernel to kernel
/// both ways (`capexec::ports::pump`: no byte through this process); the
/// channel's ends mean what the connection's sinks say.
async fn splice_direct(socket: Socket, direct: client::DirectParts) -> Result<(), String> {
    let client::DirectParts { channel, ends } = direct;
    // A failure the server reported says more than the channel's error.
    let why = |error: std::io::Error| io_message(&ends.failure().unwrap_or(error));
    let outgoing = async {
        capexec::ports::pump(&socket, &channel)
            .await
            .map_err(|error| why(error.into_io()))?;
        channel.shutdown_write().map_err(&why)?;
        ends.end().await.map_err(&why)
    };
    let incoming = async {
        capexec::ports::pump(&channel, &socket)
            .await
            .map_err(|error| why(error.into_io()))?;
        ends.far_end().await.map_err(|error| io_message(&error))?;
        socket.shutdown_write().map_err(|error| io_message(&error))
    };
    let result = futures::future::try_join(outgoing, incoming).await;
    if result.is_err() {
        socket.prepare_reset();
        channel.prepare_reset();
    }
    result.map(|_| ())
}

/// Reports a connection's failure, one line.
fn failed(shown: &str, from: &str, why: &str) {
    stdio::note(&format!("{shown}: connection from {from} failed: {why}"));
}

async fn serve_local(
    listening: capexec::ports::Listening,
    executor: Rc<RefCell<executor::Client>>,
    route: Option<Rc<DirectRoute>>,
    target: String,
    shown: Rc<str>,
) {
    loop {
        let (socket, info) = match listening.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                stdio::note(&format!("{shown}: accepting: {}", io_message(&error)));
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let executor = executor.borrow().clone();
        let (target, shown, route) = (target.clone(), Rc::clone(&shown), route.clone());
        tokio::task::spawn_local(async move {
            match client::dial_via(&executor, &target, route.as_deref()).await {
                Ok(stream) => {
                    if let Err(why) = splice(socket, stream).await {
                        failed(&shown, &info.peer, &why);
                    }
                }
                Err(error) => {
                    socket.prepare_reset();
                    failed(&shown, &info.peer, &error.to_string());
                }
            }
        });
    }
}

async fn serve_remote(
    mut listener: client::PortListener,
    target: String,
    shown: Rc<str>,
    lost: tokio::sync::mpsc::UnboundedSender<String>,
) {
    let address: Address = match target.parse() {
        Ok(address) => address,
        Err(why) => {
            let _ = lost.send(format!("{shown}: {why}"));
            return;
        }
    };
    while let Some(stream) = listener.accept().await {
        let (address, target, shown) = (address.clone(), target.clone(), Rc::clone(&shown));
        tokio::task::spawn_local(async move {
            let from = stream.info().peer.clone();
            match capexec::ports::dial(&address, &target, &PortRules::unrestricted()).await {
                Ok(socket) => {
                    if let Err(why) = splice(socket, stream).await {
                        failed(&shown, &from, &why);
                    }
                }
                // Dropping the stream resets the far connection.
                Err(refusal) => failed(&shown, &from, &refusal.message),
            }
        });
    }
    let _ = lost.send(format!("{shown}: the listener on the server was lost"));
}

/// Copies both ways until both directions ended; a failure either way
/// resets the socket (and, by dropping the stream, the far one).
async fn splice(socket: Socket, stream: PortStream) -> Result<(), String> {
    let stream = match stream.into_direct() {
        Ok(direct) => return splice_direct(socket, direct).await,
        Err(stream) => *stream,
    };
    let socket = Rc::new(socket);
    let (mut from_far, mut to_far) = stream.into_split();
    let outgoing = async {
        let mut buffer = vec![0u8; CHUNK_BYTES];
        loop {
            let read = socket.read(&mut buffer).await.map_err(|e| io_message(&e))?;
            if read == 0 {
                return to_far.shutdown().await.map_err(|e| e.to_string());
            }
            to_far
                .write_all(&buffer[..read])
                .await
                .map_err(|e| e.to_string())?;
        }
    };
    let incoming = async {
        loop {
            // Written on from where their message brought them; answered
            // (the far writer's room) once the local socket took them.
            let bytes = from_far.fill_buf().await.map_err(|e| e.to_string())?;
            if bytes.is_empty() {
                return socket.shutdown_write().map_err(|e| io_message(&e));
            }
            let read = bytes.len();
            socket.write_all(bytes).await.map_err(|e| io_message(&e))?;
            from_far.consume(read);
        }
    };
    let result = futures::future::try_join(outgoing, incoming).await;
    if result.is_err() {
        socket.prepare_reset();
    }
    result.map(|_| ())
}
