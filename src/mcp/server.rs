//! The MCP side: rmcp's [`ServerHandler`] for one MCP session, `Send` as
//! rmcp requires, doing each tool's work on the capability thread through
//! the [`Seam`].

use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    InitializeResult, ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerCapabilities,
    ServerConfig, Tool,
};
// Logging is deprecated from 2026-07-28 (SEP-2577), but the versions with
// sessions have it and clients of them send `logging/setLevel`.
#[allow(deprecated)]
use rmcp::model::SetLevelRequestParams;
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{Semaphore, mpsc};

use super::local::{Local, Session};
use super::process::{self, Call};
use super::seam::{LocalFuture, Seam};
use super::tools::{self, Confinement};

/// Calls of one session being worked on at once. rmcp reads on and spawns
/// a task per request without limit, each holding its arguments (a line
/// of up to 16 MiB): past this, a call is answered at once with an error
/// and its arguments let go.
pub const CALLS_IN_FLIGHT: usize = 64;

/// What makes MCP sessions: one per stdio connection, or one per
/// Streamable HTTP session (a transport's service factory calls
/// [`Mcp::session`]). `Send + Sync`: it only holds the way to the
/// capability thread.
pub struct Mcp {
    seam: Seam<Local>,
    ends: mpsc::UnboundedSender<u64>,
    tools: Arc<Vec<Tool>>,
    instructions: Arc<str>,
    next: AtomicU64,
}

impl Mcp {
    pub(super) fn new(
        seam: Seam<Local>,
        ends: mpsc::UnboundedSender<u64>,
        confinement: &Confinement,
    ) -> Mcp {
        Mcp {
            seam,
            ends,
            tools: Arc::new(tools::definitions(confinement)),
            instructions: tools::instructions(confinement).into(),
            next: AtomicU64::new(0),
        }
    }

    /// A new MCP session: its own processes, which end when it is dropped
    /// (unless --keep-processes).
    pub fn session(&self) -> McpSession {
        self.make_session(false)
    }

    /// A new MCP session of the Streamable HTTP transport: the same, for
    /// the protocol versions that have sessions (up to 2025-11-25; see
    /// `super::http`).
    pub fn http_session(&self) -> McpSession {
        self.make_session(true)
    }

    fn make_session(&self, handshake_only: bool) -> McpSession {
        McpSession {
            handshake_only,
            seam: self.seam.clone(),
            key: Arc::new(SessionKey {
                id: self.next.fetch_add(1, Ordering::Relaxed) + 1,
                ends: self.ends.clone(),
            }),
            tools: self.tools.clone(),
            instructions: self.instructions.clone(),
            in_flight: Arc::new(Semaphore::new(CALLS_IN_FLIGHT)),
        }
    }
}

/// Ends its session on the capability thread once the handler and every
/// call in flight are gone.
struct SessionKey {
    id: u64,
    ends: mpsc::UnboundedSender<u64>,
}

impl Drop for SessionKey {
    fn drop(&mut self) {
        // Gone already if capexec is ending; the session goes with it.
        let _ = self.ends.send(self.id);
    }
}

/// One MCP session's handler.
pub struct McpSession {
    /// Only the protocol versions with an `initialize` handshake (and so
    /// sessions) are offered.
    handshake_only: bool,
    seam: Seam<Local>,
    key: Arc<SessionKey>,
    tools: Arc<Vec<Tool>>,
    instructions: Arc<str>,
    in_flight: Arc<Semaphore>,
}

type Work<A, R> = fn(Rc<Local>, Rc<Session>, A, Call) -> LocalFuture<Result<R, String>>;

impl McpSession {
    /// Runs tool `name`'s `work` with `arguments` on the capability
    /// thread. Arguments that do not fit the tool's schema, and failures,
    /// are tool errors (`isError`, the reason as text), which the agent
    /// reads; the session goes on.
    async fn call<A, R>(
        &self,
        name: &str,
        arguments: serde_json::Value,
        call: Call,
        work: Work<A, R>,
    ) -> Result<CallToolResponse, McpError>
    where
        A: DeserializeOwned + Send + 'static,
        R: Serialize + Send + 'static,
    {
        let args: A = match serde_json::from_value(arguments) {
            Ok(args) => args,
            Err(error) => {
                return Ok(failure(format!(
                    "capexec: {name}: invalid arguments: {error}"
                )));
            }
        };
        let key = self.key.clone();
        let answer = self
            .seam
            .run(move |local| {
                let session = local.session(key.id);
                let work = work(local, session, args, call);
                Box::pin(async move {
                    let answer = work.await;
                    // The session may end only after its last call.
                    drop(key);
                    answer.map(|result| serde_json::to_value(result).map_err(|e| e.to_string()))
                })
            })
            .await
            .map_err(|closed| McpError::internal_error(closed.to_string(), None))?;
        match answer {
            Ok(Ok(value)) => Ok(CallToolResult::structured(value).into()),
            Ok(Err(error)) => Err(McpError::internal_error(
                format!("capexec: {name}: cannot write the result: {error}"),
                None,
            )),
            Err(error) => Ok(failure(error)),
        }
    }

    fn is_file_tool(&self, name: &str) -> bool {
        super::files::TOOL_DESCRIPTIONS
            .iter()
            .any(|(tool, _)| *tool == name)
    }

    /// File tool `name` (`src/mcp/files/`, by its own dispatch) on the
    /// capability thread; its failure is a tool error `capexec: TOOL: ...`
    /// with capexec's tag kept.
    async fn call_file(
        &self,
        name: &str,
        arguments: serde_json::Value,
    ) -> Result<CallToolResponse, McpError> {
        let key = self.key.clone();
        let tool = name.to_string();
        let answer = self
            .seam
            .run(move |local| {
                Box::pin(async move {
                    let files = local.files().await?;
                    let answer = files.call(&tool, arguments).await;
                    drop(key);
                    match answer {
                        Some(Ok(value)) => Ok(value),
                        Some(Err(error)) => {
                            let message = error
                                .message
                                .strip_prefix("capexec: ")
                                .unwrap_or(&error.message);
                            let message = message
                                .strip_prefix(&format!("{tool}: "))
                                .unwrap_or(message);
                            Err(format!("capexec: {tool}: {message}"))
                        }
                        None => Err(format!("capexec: {tool}: not a file tool")),
                    }
                })
            })
            .await
            .map_err(|closed| McpError::internal_error(closed.to_string(), None))?;
        Ok(match answer {
            Ok(value) => CallToolResult::structured(value).into(),
            Err(error) => failure(error),
        })
    }
}

fn failure(text: String) -> CallToolResponse {
    CallToolResult::error(vec![ContentBlock::text(text)]).into()
}

impl ServerHandler for McpSession {
    #[allow(deprecated)] // logging: see the import of SetLevelRequestParams
    fn get_info(&self) -> ServerConfig {
        InitializeResult::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_logging()
                .build(),
        )
        .with_server_info(
            Implementation::new("capexec", env!("CARGO_PKG_VERSION")).with_title("capexec"),
        )
        .with_instructions(self.instructions.to_string())
    }

    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        if self.handshake_only {
            std::borrow::Cow::Borrowed(ProtocolVersion::known_up_to(
                &ProtocolVersion::LATEST_WITH_INITIALIZE,
            ))
        } else {
            std::borrow::Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS)
        }
    }

    /// `logging/setLevel` is accepted (clients send it, and an error would
    /// fail their start-up); capexec sends no log messages, its
    /// diagnostics go to its stderr.
    #[allow(deprecated)]
    async fn set_level(
        &self,
        _request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        Ok(())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.tools.as_ref().clone()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|tool| tool.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let Ok(_permit) = self.in_flight.clone().try_acquire_owned() else {
            return Err(McpError::invalid_request(
                format!(
                    "capexec: {CALLS_IN_FLIGHT} calls of this session are being worked on: \
                     wait for their answers"
                ),
                None,
            ));
        };
        let arguments = serde_json::Value::Object(request.arguments.unwrap_or_default());
        let call = Call {
            cancelled: context.ct.clone(),
            progress: context
                .meta
                .get_progress_token()
                .map(|token| (context.peer.clone(), token)),
        };
        let name = request.name.as_ref();
        match name {
            "exec" => {
                self.call(name, arguments, call, |l, s, a, c| {
                    Box::pin(process::exec(l, s, a, c))
                })
                .await
            }
            "process_output" => {
                self.call(name, arguments, call, |l, s, a, c| {
                    Box::pin(process::output(l, s, a, c))
                })
                .await
            }
            "process_input" => {
                self.call(name, arguments, call, |l, s, a, c| {
                    Box::pin(process::input(l, s, a, c))
                })
                .await
            }
            "process_signal" => {
                self.call(name, arguments, call, |l, s, a, c| {
                    Box::pin(process::signal(l, s, a, c))
                })
                .await
            }
            "process_terminate" => {
                self.call(name, arguments, call, |l, s, a, c| {
                    Box::pin(process::terminate(l, s, a, c))
                })
                .await
            }
            "process_list" => {
                self.call(name, arguments, call, |l, s, a, c| {
                    Box::pin(process::list(l, s, a, c))
                })
                .await
            }
            name if self.is_file_tool(name) => self.call_file(name, arguments).await,
            _ => Err(McpError::invalid_params(
                format!(
                    "capexec: unknown tool {name:?}; the tools are: {}",
                    self.tools
                        .iter()
                        .map(|tool| tool.name.as_ref())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                None,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    /// A transport with many sessions (Streamable HTTP) shares the factory
    /// between its tasks and hands sessions to rmcp: both must be `Send +
    /// Sync`, whatever the capability thread holds.
    #[test]
    fn the_factory_and_its_sessions_may_cross_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<super::Mcp>();
        send_sync::<super::McpSession>();
    }
}
