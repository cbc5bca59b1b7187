//! A stand-in for the model on loopback, so that an unmodified `codex exec`
//! runs whole turns offline: it answers `POST /v1/responses` from a script
//! (a tool call or a message per request, as server-sent events) and
//! `GET /v1/models`, and records every request's `input`, so that a test
//! asserts exactly what reached the model (the `function_call_output`
//! items carry what each tool returned).
//!
//! Plain tokio and a minimal HTTP/1.1: one request per connection
//! (`Connection: close`), bodies sized by `Content-Length`, which is all
//! Codex's client sends to a custom provider.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// The most a request head may be; Codex's are a few KiB.
const MAX_HEAD: usize = 64 * 1024;
/// The most a request body may be; a turn's request is tens of KiB.
const MAX_BODY: usize = 64 * 1024 * 1024;

/// What the model answers to one request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A call of the tool `name` with these arguments (sent as a JSON
    /// string, as the model sends them).
    Call { name: String, arguments: Value },
    /// A call of the tool `name` of a namespace Codex declared (an MCP
    /// server's tools are the namespace `mcp__SERVER`; tests/mcp).
    #[allow(dead_code)]
    CallIn {
        namespace: String,
        name: String,
        arguments: Value,
    },
    /// An assistant message: the end of the turn.
    Message(String),
}

impl Reply {
    pub fn call(name: &str, arguments: Value) -> Reply {
        Reply::Call {
            name: name.to_string(),
            arguments,
        }
    }
}

type Choose = Box<dyn FnMut(&Request) -> Result<Reply, String> + Send>;
type Condition = Box<dyn Fn(&Request) -> bool + Send>;

/// One step of a scenario: the reply to one request, chosen when the
/// request arrives (so that it may use what the last tool returned), or a
/// step taken as long as a condition holds of each request (polling).
pub struct Step {
    choose: Choose,
    repeat_while: Option<Condition>,
}

impl Step {
    /// A fixed reply.
    pub fn reply(reply: Reply) -> Step {
        Step::from(move |_| Ok(reply.clone()))
    }

    /// A call of the tool `name`.
    pub fn call(name: &str, arguments: Value) -> Step {
        Step::reply(Reply::call(name, arguments))
    }

    /// The closing message of the turn.
    pub fn message(text: &str) -> Step {
        Step::reply(Reply::Message(text.to_string()))
    }

    /// A reply chosen from the request; an `Err` fails the scenario (the
    /// model ends the turn, and [`ScriptedModel::assert_followed`] says why).
    pub fn from(choose: impl FnMut(&Request) -> Result<Reply, String> + Send + 'static) -> Step {
        Step {
            choose: Box::new(choose),
            repeat_while: None,
        }
    }

    /// Takes this step for each request of which `condition` holds, none
    /// or many times; the first that fails it goes to the next step.
    pub fn repeat_while(mut self, condition: impl Fn(&Request) -> bool + Send + 'static) -> Step {
        self.repeat_while = Some(Box::new(condition));
        self
    }
}

/// One request to `/v1/responses`, as Codex sent it.
#[derive(Clone, Debug)]
pub struct Request {
    pub body: Value,
}

impl Request {
    /// The conversation so far (`input`).
    pub fn input(&self) -> &[Value] {
        self.body["input"].as_array().map_or(&[], Vec::as_slice)
    }

    /// Every tool output in the conversation so far, in call order.
    pub fn tool_outputs(&self) -> Vec<ToolOutput> {
        self.input()
            .iter()
            .filter(|item| item["type"] == "function_call_output")
            .map(|item| ToolOutput {
                call_id: item["call_id"].as_str().unwrap_or_default().to_string(),
                text: item["output"].as_str().unwrap_or_default().to_string(),
            })
            .collect()
    }

    /// What the last tool returned.
    pub fn last_output(&self) -> Result<ToolOutput, String> {
        self.tool_outputs()
            .pop()
            .ok_or_else(|| "the request carries no tool output".to_string())
    }
}

/// What a tool returned to the model, as the model reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolOutput {
    pub call_id: String,
    pub text: String,
}

/// How a command stood when Codex handed its output to the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Exited(i32),
    /// Still running; the model polls or writes to it by this id.
    Running(u64),
    /// The output says neither (`apply_patch`'s does not).
    Unstated,
}

/// A tool output read as Codex writes it for `exec_command` and
/// `write_stdin` ("Chunk ID", "Wall time", "Process exited with code N" or
/// "Process running with session ID N", "Original token count", then
/// "Output:" and the bytes), without the parts that change from run to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandOutput {
    pub status: Status,
    pub output: String,
}

impl CommandOutput {
    pub fn exited(code: i32, output: &str) -> CommandOutput {
        CommandOutput {
            status: Status::Exited(code),
            output: output.to_string(),
        }
    }
}

impl ToolOutput {
    pub fn command(&self) -> Result<CommandOutput, String> {
        let (head, output) = self
            .text
            .split_once("Output:\n")
            .ok_or_else(|| format!("no \"Output:\" in {:?}", self.text))?;
        let number = |prefix: &str| {
            head.lines()
                .find_map(|line| line.strip_prefix(prefix))
                .map(|n| n.trim().parse::<i64>())
        };
        let status = match (
            number("Process exited with code "),
            number("Process running with session ID "),
        ) {
            (Some(Ok(code)), None) => Status::Exited(code as i32),
            (None, Some(Ok(session))) => Status::Running(session as u64),
            (None, None) => Status::Unstated,
            _ => return Err(format!("an unreadable status in {:?}", self.text)),
        };
        Ok(CommandOutput {
            status,
            output: output.to_string(),
        })
    }

    /// The session id of a command still running.
    pub fn session_id(&self) -> Result<u64, String> {
        match self.command()?.status {
            Status::Running(session) => Ok(session),
            status => Err(format!("the command is not running ({status:?}): {self:?}")),
        }
    }
}

#[derive(Default)]
struct Shared {
    script: VecDeque<Step>,
    requests: Vec<Request>,
    /// What went wrong on the model's side (bad requests, the script run
    /// out, a step that could not choose).
    failures: Vec<String>,
}

/// The model on `127.0.0.1:PORT`, serving until dropped.
pub struct ScriptedModel {
    port: u16,
    shared: Arc<Mutex<Shared>>,
    server: tokio::task::JoinHandle<()>,
}

impl ScriptedModel {
    /// Listens on an ephemeral loopback port and serves `steps` in order.
    pub async fn start(steps: Vec<Step>) -> ScriptedModel {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the scripted model");
        let port = listener.local_addr().expect("the model's address").port();
        let shared = Arc::new(Mutex::new(Shared {
            script: steps.into(),
            ..Shared::default()
        }));
        let serving = Arc::clone(&shared);
        let server = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, Arc::clone(&serving)));
            }
        });
        ScriptedModel {
            port,
            shared,
            server,
        }
    }

    /// The `base_url` of Codex's provider.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// Every tool output that reached the model, in call order (the last
    /// request carries the whole conversation).
    pub fn tool_outputs(&self) -> Vec<ToolOutput> {
        self.lock()
            .requests
            .last()
            .map(Request::tool_outputs)
            .unwrap_or_default()
    }

    /// Asserts the script was followed to its end, with nothing going
    /// wrong on the model's side; `context` is shown otherwise (Codex's
    /// stderr, say).
    pub fn assert_followed(&self, context: &str) {
        let shared = self.lock();
        assert!(
            shared.failures.is_empty(),
            "the scripted model: {:?}\n{context}",
            shared.failures
        );
        assert!(
            shared.script.is_empty(),
            "Codex stopped after {} requests, {} steps before the script's end\n{context}",
            shared.requests.len(),
            shared.script.len()
        );
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}

impl Drop for ScriptedModel {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Shared {
    /// The reply to `request`, recorded with it.
    fn answer(&mut self, request: Request) -> Reply {
        self.requests.push(request.clone());
        let reply = loop {
            let Some(step) = self.script.front_mut() else {
                return self.fail(format!(
                    "request {} is past the script's end",
                    self.requests.len()
                ));
            };
            match &step.repeat_while {
                Some(condition) if !condition(&request) => {
                    self.script.pop_front();
                }
                Some(_) => break (step.choose)(&request),
                None => {
                    let mut step = self.script.pop_front().expect("the front step");
                    break (step.choose)(&request);
                }
            }
        };
        reply.unwrap_or_else(|error| self.fail(error))
    }

    /// Records `failure` and ends the turn, so that Codex stops at once.
    fn fail(&mut self, failure: String) -> Reply {
        self.failures.push(failure.clone());
        self.script.clear();
        Reply::Message(format!("scripted model failure: {failure}"))
    }
}

async fn serve(stream: TcpStream, shared: Arc<Mutex<Shared>>) {
    let mut stream = BufReader::new(stream);
    let response = match read_request(&mut stream).await {
        Ok((method, path, body)) => respond(&method, &path, &body, &shared),
        Err(error) => {
            let mut shared = shared.lock().unwrap_or_else(|poison| poison.into_inner());
            shared.failures.push(format!("a bad request: {error}"));
            http_response("400 Bad Request", "text/plain", error.into_bytes())
        }
    };
    let mut stream = stream.into_inner();
    // Codex may have given up on the request; nothing to do about it here.
    let _ = stream.write_all(&response).await;
    let _ = stream.shutdown().await;
}

async fn read_request(
    stream: &mut BufReader<TcpStream>,
) -> Result<(String, String, Vec<u8>), String> {
    let mut head = Vec::new();
    let mut length = 0usize;
    let mut request_line = String::new();
    loop {
        let mut line = String::new();
        let n = stream
            .read_line(&mut line)
            .await
            .map_err(|error| format!("reading the head: {error}"))?;
        head.push(line.clone());
        if n == 0 {
            return Err("the connection closed within the head".to_string());
        }
        if head.iter().map(String::len).sum::<usize>() > MAX_HEAD {
            return Err("a head over 64 KiB".to_string());
        }
        let line = line.trim_end_matches(['\r', '\n']);
        if request_line.is_empty() {
            request_line = line.to_string();
            continue;
        }
        if line.is_empty() {
            break;
        }
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| format!("a header line without a colon: {line:?}"))?;
        let name = name.trim().to_ascii_lowercase();
        let value = value.trim();
        match name.as_str() {
            "content-length" => {
                length = value
                    .parse()
                    .map_err(|_| format!("Content-Length {value:?}"))?;
            }
            "transfer-encoding" | "content-encoding" => {
                return Err(format!("{name}: {value} is not supported"));
            }
            _ => {}
        }
    }
    if length > MAX_BODY {
        return Err(format!("a body of {length} bytes"));
    }
    let mut words = request_line.split(' ');
    let (method, path) = match (words.next(), words.next()) {
        (Some(method), Some(path)) => (method.to_string(), path.to_string()),
        _ => return Err(format!("request line {request_line:?}")),
    };
    let mut body = vec![0; length];
    stream
        .read_exact(&mut body)
        .await
        .map_err(|error| format!("reading a body of {length} bytes: {error}"))?;
    Ok((method, path, body))
}

fn respond(method: &str, path: &str, body: &[u8], shared: &Mutex<Shared>) -> Vec<u8> {
    let mut shared = shared.lock().unwrap_or_else(|poison| poison.into_inner());
    match (method, path) {
        ("GET", "/v1/models") => http_response(
            "200 OK",
            "application/json",
            br#"{"data":[],"models":[]}"#.to_vec(),
        ),
        ("POST", "/v1/responses") => {
            let request = match serde_json::from_slice::<Value>(body) {
                Ok(body) => Request { body },
                Err(error) => {
                    shared.failures.push(format!("a request body: {error}"));
                    return http_response("400 Bad Request", "text/plain", Vec::new());
                }
            };
            let number = shared.requests.len();
            let reply = shared.answer(request);
            http_response("200 OK", "text/event-stream", events(number, &reply))
        }
        _ => {
            shared.failures.push(format!("unexpected {method} {path}"));
            http_response("404 Not Found", "text/plain", Vec::new())
        }
    }
}

/// The server-sent events of one response: created, the one output item,
/// completed (with the usage Codex requires).
fn events(number: usize, reply: &Reply) -> Vec<u8> {
    let item = match reply {
        Reply::Call { name, arguments } => json!({
            "type": "function_call",
            "id": format!("fc_{number}"),
            "call_id": format!("call_{number}"),
            "name": name,
            "arguments": arguments.to_string(),
        }),
        Reply::CallIn {
            namespace,
            name,
            arguments,
        } => json!({
            "type": "function_call",
            "id": format!("fc_{number}"),
            "call_id": format!("call_{number}"),
            "namespace": namespace,
            "name": name,
            "arguments": arguments.to_string(),
        }),
        Reply::Message(text) => json!({
            "type": "message",
            "role": "assistant",
            "id": format!("msg_{number}"),
            "content": [{"type": "output_text", "text": text}],
        }),
    };
    let id = format!("resp_{number}");
    let usage = json!({
        "input_tokens": 1,
        "input_tokens_details": null,
        "output_tokens": 1,
        "output_tokens_details": null,
        "total_tokens": 2,
    });
    let mut text = String::new();
    for event in [
        json!({"type": "response.created", "response": {"id": id}}),
        json!({"type": "response.output_item.done", "item": item}),
        json!({"type": "response.completed", "response": {"id": id, "usage": usage}}),
    ] {
        let name = event["type"].as_str().unwrap_or_default().to_string();
        text.push_str(&format!("event: {name}\ndata: {event}\n\n"));
    }
    text.into_bytes()
}

fn http_response(status: &str, content_type: &str, body: Vec<u8>) -> Vec<u8> {
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    response.extend_from_slice(&body);
    response
}
