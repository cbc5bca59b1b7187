//! A hostile peer: raw Cap'n Proto RPC frames (built with capnp-rpc's own
//! `rpc.capnp` types) over a real TCP socket, and the attacks on a server
//! that the abuse tests and the benchmarks' `abuse` section replay.

use std::time::Duration;

use capnp::traits::HasTypeId;
use capnp_rpc::rpc_capnp::{exception, message};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use capexec::capexec_capnp::{executor, gatekeeper, process};

/// A frame announcing a 15 MiB message, and nothing after it.
pub fn huge_header() -> [u8; 8] {
    let mut header = [0u8; 8];
    header[4..8].copy_from_slice(&((15u32 << 20) / 8).to_le_bytes());
    header
}

fn frame(fill: impl FnOnce(message::Builder<'_>)) -> Vec<u8> {
    let mut builder = capnp::message::Builder::new_default();
    fill(builder.init_root());
    capnp::serialize::write_message_to_words(&builder)
}

pub fn bootstrap(question: u32) -> Vec<u8> {
    frame(|message| message.init_bootstrap().set_question_id(question))
}

pub fn finish(question: u32) -> Vec<u8> {
    frame(|message| {
        let mut finish = message.init_finish();
        finish.set_question_id(question);
        finish.set_release_result_caps(true);
    })
}

/// A call numbered `question` on the capability that question `on`
/// returns (in its first pointer field, or as the bootstrap itself).
fn call(
    question: u32,
    on: u32,
    field: Option<u16>,
    interface: u64,
    method: u16,
    params: impl FnOnce(capnp::any_pointer::Builder<'_>),
) -> Vec<u8> {
    frame(|message| {
        let mut call = message.init_call();
        call.set_question_id(question);
        call.set_interface_id(interface);
        call.set_method_id(method);
        let mut promised = call.reborrow().init_target().init_promised_answer();
        promised.set_question_id(on);
        if let Some(field) = field {
            promised
                .init_transform(1)
                .get(0)
                .set_get_pointer_field(field);
        }
        params(call.init_params().init_content());
    })
}

/// `login(token)` on the bootstrap of question `on`.
pub fn login(question: u32, on: u32, token: &str) -> Vec<u8> {
    let interface = <gatekeeper::Client as HasTypeId>::TYPE_ID;
    call(question, on, None, interface, 0, |params| {
        let mut params: gatekeeper::login_params::Builder = params.init_as();
        params.set_token(token);
    })
}

/// `start(argv)` on the executor that login `on` returns (or, with
/// `field` `None`, on the executor bootstrapped by `on`).
pub fn start(question: u32, on: u32, field: Option<u16>, argv: &[&str]) -> Vec<u8> {
    start_with_stdin(question, on, field, argv, false)
}

/// The same start, its stdin a pipe that `write_stdin` feeds when
/// `pipe_stdin`, else `/dev/null`.
pub fn start_with_stdin(
    question: u32,
    on: u32,
    field: Option<u16>,
    argv: &[&str],
    pipe_stdin: bool,
) -> Vec<u8> {
    let interface = <executor::Client as HasTypeId>::TYPE_ID;
    call(question, on, field, interface, 0, |params| {
        let params: executor::start_params::Builder = params.init_as();
        let mut start = params.init_params();
        start.set_pipe_stdin(pipe_stdin);
        let mut list = start.init_argv(argv.len() as u32);
        for (index, arg) in argv.iter().enumerate() {
            list.set(index as u32, arg.as_bytes());
        }
    })
}

/// `read(afterSeq = 0, maxBytes = 0)`, the whole retained log, on the
/// process that start `on` returns.
pub fn read_everything(question: u32, on: u32) -> Vec<u8> {
    read_waiting(question, on, 0)
}

/// The same read, waiting up to `wait_ms` for output if there is none.
pub fn read_waiting(question: u32, on: u32, wait_ms: u32) -> Vec<u8> {
    let interface = <process::Client as HasTypeId>::TYPE_ID;
    call(question, on, Some(0), interface, 0, |params| {
        let mut params: process::read_params::Builder = params.init_as();
        params.set_after_seq(0);
        params.set_max_bytes(0);
        params.set_wait_ms(wait_ms);
    })
}

/// `write(data)` to the stdin of the process that start `on` returns.
pub fn write_stdin(question: u32, on: u32, data: &[u8]) -> Vec<u8> {
    let interface = <process::Client as HasTypeId>::TYPE_ID;
    call(question, on, Some(0), interface, 1, |params| {
        let mut params: process::write_params::Builder = params.init_as();
        params.set_data(data);
        params.set_write_id(format!("hostile-{question}").as_str());
    })
}

/// `frame`, a call, asking that its results be kept for a later
/// `takeFromOtherQuestion` (`sendResultsTo.yourself`, as a tail call does).
pub fn results_to_yourself(frame: &[u8]) -> Vec<u8> {
    let mut words = frame;
    let message = capnp::serialize::read_message(&mut words, Default::default()).expect("a frame");
    let mut builder = capnp::message::Builder::new_default();
    builder
        .set_root(message.get_root::<message::Reader>().expect("a message"))
        .expect("copy");
    let root: message::Builder = builder.get_root().expect("root");
    match root.which() {
        Ok(message::Call(Ok(call))) => call.init_send_results_to().set_yourself(()),
        _ => panic!("not a call"),
    }
    capnp::serialize::write_message_to_words(&builder)
}

/// `subscribe` on the process that start `on` returns, its sink a promise
/// that this peer exports as `promise` (and may resolve later, or never).
pub fn subscribe_to_promise(question: u32, on: u32, promise: u32) -> Vec<u8> {
    subscribe(question, on, Exported::Promise(promise))
}

/// `subscribe` on the process that start `on` returns, its sink an object
/// that this peer exports as `export` (and answers as it likes).
pub fn subscribe_to_export(question: u32, on: u32, export: u32) -> Vec<u8> {
    subscribe(question, on, Exported::Object(export))
}

/// A capability this peer exports.
enum Exported {
    Promise(u32),
    Object(u32),
}

fn subscribe(question: u32, on: u32, sink: Exported) -> Vec<u8> {
    use capnp::traits::ImbueMut;
    frame(|message| {
        let mut call = message.init_call();
        call.set_question_id(question);
        call.set_interface_id(<process::Client as HasTypeId>::TYPE_ID);
        call.set_method_id(5);
        let mut promised = call.reborrow().init_target().init_promised_answer();
        promised.set_question_id(on);
        promised.init_transform(1).get(0).set_get_pointer_field(0);
        let mut params = call.init_params();
        // The sink's pointer names entry 0 of the call's table of
        // capabilities, written below by hand: any capability will do to
        // make the pointer.
        let mut hooks = Vec::new();
        let mut content = params.reborrow().init_content();
        content.imbue_mut(&mut hooks);
        let mut subscribe: process::subscribe_params::Builder = content.init_as();
        let placeholder = capnp_rpc::new_broken_cap(capnp::Error::failed(String::new()));
        subscribe.set_sink(capnp::capability::FromClientHook::new(placeholder.hook));
        let mut descriptor = params.init_cap_table(1).get(0);
        match sink {
            Exported::Promise(id) => descriptor.set_sender_promise(id),
            Exported::Object(id) => descriptor.set_sender_hosted(id),
        }
    })
}

/// `Resolve` of this peer's promise `promise` to its promise `to` (itself,
/// when the two are the same).
pub fn resolve_to_promise(promise: u32, to: u32) -> Vec<u8> {
    frame(|message| {
        let mut resolve = message.init_resolve();
        resolve.set_promise_id(promise);
        resolve.init_cap().set_sender_promise(to);
    })
}

/// A plain TCP connection to `address` (`HOST:PORT`, as `tcp:` addresses
/// print it after the scheme).
pub async fn connect(address: &str) -> TcpStream {
    let address = address.strip_prefix("tcp:").unwrap_or(address);
    let stream = TcpStream::connect(address).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    stream
}

/// What a `Return` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answered {
    Results,
    Exception,
    Canceled,
    ResultsSentElsewhere,
    Otherwise,
}

/// One message from the server, as the peer reads it.
pub enum Heard {
    /// A message that is none of the others here.
    Other,
    /// A `Call` of the server's (its question) to the capability this
    /// peer exported as `export`.
    Called { question: u32, export: u32 },
    /// The server's `Release` of what this peer exported as the number.
    Released(u32),
    /// The `Return` of the question numbered so, and what it says.
    Returned(u32, Answered),
    /// The server's goodbye: the error's type and reason.
    Abort(exception::Type, String),
    /// The connection ended (closed or reset).
    Closed,
}

/// Reads the next message the server sends.
pub async fn hear(stream: &mut (impl AsyncRead + Unpin)) -> Heard {
    let mut first = [0u8; 8];
    if stream.read_exact(&mut first).await.is_err() {
        return Heard::Closed;
    }
    let count = u32::from_le_bytes([first[0], first[1], first[2], first[3]]) as usize + 1;
    let table_bytes = (4 * (count + 1)).next_multiple_of(8);
    let mut bytes = first.to_vec();
    bytes.resize(table_bytes, 0);
    if stream.read_exact(&mut bytes[8..]).await.is_err() {
        return Heard::Closed;
    }
    let words: usize = bytes[4..4 + 4 * count]
        .chunks_exact(4)
        .map(|length| u32::from_le_bytes([length[0], length[1], length[2], length[3]]) as usize)
        .sum();
    let body = bytes.len();
    bytes.resize(body + words * 8, 0);
    if stream.read_exact(&mut bytes[body..]).await.is_err() {
        return Heard::Closed;
    }
    let mut options = capnp::message::ReaderOptions::new();
    options.traversal_limit_in_words(None);
    let message = capnp::serialize::read_message(&mut &bytes[..], options).expect("a message");
    let root: message::Reader = message.get_root().expect("rpc message");
    match root.which() {
        Ok(message::Abort(abort)) => {
            let abort = abort.expect("abort");
            let reason = abort
                .get_reason()
                .ok()
                .and_then(|reason| reason.to_string().ok())
                .unwrap_or_default();
            let kind = abort.get_type().unwrap_or(exception::Type::Failed);
            Heard::Abort(kind, reason)
        }
        Ok(message::Return(Ok(answer))) => {
            use capnp_rpc::rpc_capnp::return_;
            let how = match answer.which() {
                Ok(return_::Results(_)) => Answered::Results,
                Ok(return_::Exception(_)) => Answered::Exception,
                Ok(return_::Canceled(())) => Answered::Canceled,
                Ok(return_::ResultsSentElsewhere(())) => Answered::ResultsSentElsewhere,
                _ => Answered::Otherwise,
            };
            Heard::Returned(answer.get_answer_id(), how)
        }
        Ok(message::Call(Ok(call))) => match call.get_target().map(|target| target.which()) {
            Ok(Ok(capnp_rpc::rpc_capnp::message_target::ImportedCap(export))) => Heard::Called {
                question: call.get_question_id(),
                export,
            },
            _ => Heard::Other,
        },
        Ok(message::Release(Ok(release))) => Heard::Released(release.get_id()),
        _ => Heard::Other,
    }
}

/// Reads what the server sends until the `Return` of `question`; false if
/// the connection ends first or nothing comes within `within`.
pub async fn answered(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
    question: u32,
    within: Duration,
) -> bool {
    answered_as(stream, question, within).await.is_some()
}

/// What the `Return` of `question` says, read as [`answered`] does; `None`
/// if it does not come.
pub async fn answered_as(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
    question: u32,
    within: Duration,
) -> Option<Answered> {
    match heard_within(
        stream,
        within,
        |heard| matches!(heard, Heard::Returned(id, _) if *id == question),
    )
    .await
    {
        Some(Heard::Returned(_, how)) => Some(how),
        _ => None,
    }
}

/// Reads what the server sends until it calls this peer's capability
/// `export`; false if the connection ends first or no such call comes
/// within `within`.
pub async fn called(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
    export: u32,
    within: Duration,
) -> bool {
    heard_within(
        stream,
        within,
        |heard| matches!(heard, Heard::Called { export: to, .. } if *to == export),
    )
    .await
    .is_some()
}

/// Reads what the server sends until a message that `awaited`, answering
/// the server's other calls with empty results (as a sink acknowledges a
/// push); that message, or `None` if the connection ends first or no such
/// message comes within `within`.
async fn heard_within(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
    within: Duration,
    awaited: impl Fn(&Heard) -> bool,
) -> Option<Heard> {
    tokio::time::timeout(within, async {
        loop {
            let heard = hear(stream).await;
            if awaited(&heard) {
                return Some(heard);
            }
            match heard {
                Heard::Called { question, .. } => {
                    if !send(stream, &returned_empty(question)).await {
                        return None;
                    }
                }
                Heard::Closed | Heard::Abort(..) => return None,
                Heard::Other | Heard::Returned(..) | Heard::Released(_) => {}
            }
        }
    })
    .await
    .ok()
    .flatten()
}

/// Asserts that the server says goodbye within `within` with an error of
/// `kind` and exactly `reason`.
pub async fn told(
    stream: &mut (impl AsyncRead + Unpin),
    kind: exception::Type,
    reason: &str,
    within: Duration,
) {
    match goodbye(stream, within).await {
        Some(Heard::Abort(said_kind, said)) => {
            assert_eq!(said, reason);
            assert_eq!(said_kind, kind, "{said}");
        }
        Some(Heard::Closed) => panic!("closed without a reason (expected {reason:?})"),
        Some(_) => unreachable!("goodbye skips other messages"),
        None => panic!("the connection was not closed (expected {reason:?})"),
    }
}

/// Reads what the server sends until it releases this peer's capability
/// `export`; false if the connection ends first or that does not happen
/// within `within`.
pub async fn released(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
    export: u32,
    within: Duration,
) -> bool {
    heard_within(
        stream,
        within,
        |heard| matches!(heard, Heard::Released(id) if *id == export),
    )
    .await
    .is_some()
}

/// The `Return` of the server's question `question`, `canceled`.
pub fn returned_canceled(question: u32) -> Vec<u8> {
    frame(|message| {
        let mut answer = message.init_return();
        answer.set_answer_id(question);
        answer.set_canceled(());
    })
}

/// The `Return` of the server's question `question`, with empty results.
pub fn returned_empty(question: u32) -> Vec<u8> {
    frame(|message| {
        let mut answer = message.init_return();
        answer.set_answer_id(question);
        answer.init_results();
    })
}

/// Reads what the server sends until its goodbye or the end of the
/// connection; `None` if neither comes within `within`.
pub async fn goodbye(stream: &mut (impl AsyncRead + Unpin), within: Duration) -> Option<Heard> {
    tokio::time::timeout(within, async {
        loop {
            match hear(stream).await {
                Heard::Other | Heard::Returned(..) | Heard::Called { .. } | Heard::Released(_) => {
                    continue;
                }
                ended => return ended,
            }
        }
    })
    .await
    .ok()
}

/// Sends `bytes`; false if the server has closed the connection.
pub async fn send(stream: &mut (impl AsyncWrite + Unpin), bytes: &[u8]) -> bool {
    stream.write_all(bytes).await.is_ok()
}

/// Logs in on a fresh connection: bootstrap 0, login 1. Question 2 and up
/// are the caller's.
pub async fn logged_in(address: &str, token: &str) -> TcpStream {
    let mut stream = connect(address).await;
    let mut hello = bootstrap(0);
    hello.extend(login(1, 0, token));
    assert!(send(&mut stream, &hello).await, "the server took the login");
    stream
}

/// Attack 1: `count` connections that each announce a 15 MiB message and
/// send nothing more; before login, or (with `token`) after it.
pub async fn huge_headers(address: &str, token: Option<&str>, count: usize) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for _ in 0..count {
        let mut stream = match token {
            Some(token) => logged_in(address, token).await,
            None => connect(address).await,
        };
        let _ = send(&mut stream, &huge_header()).await;
        held.push(stream);
    }
    held
}

/// Attack 2: bootstraps that are never finished, `count` of them, sent
/// until the server stops taking them.
pub async fn unfinished_bootstraps(stream: &mut TcpStream, count: u32) {
    for question in 0..count {
        if !send(stream, &bootstrap(question)).await {
            return;
        }
    }
}

/// Attack 3: after login and a start (question 2), ask for the process's
/// whole retained log `count` times without ever finishing a read.
pub async fn unfinished_reads(stream: &mut TcpStream, count: u32) {
    for question in 3..3 + count {
        if !send(stream, &read_everything(question, 2)).await {
            return;
        }
    }
}

/// A TCP connection to `address` from the loopback address `source`
/// (any of 127.0.0.0/8), so one test can play several peers.
pub async fn connect_from(source: &str, address: &str) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    let source: std::net::IpAddr = source.parse().expect("source address");
    socket.bind((source, 0).into()).expect("bind the source");
    let address = address.strip_prefix("tcp:").unwrap_or(address);
    let stream = socket
        .connect(address.parse().expect("address"))
        .await
        .expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    stream
}

/// Attack 4: `count` connections from `source` that never send anything.
pub async fn idle_connections(source: &str, address: &str, count: usize) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for _ in 0..count {
        held.push(connect_from(source, address).await);
    }
    held
}
