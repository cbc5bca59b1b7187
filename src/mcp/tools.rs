//! The tools as `tools/list` shows them: names, descriptions that say how
//! the server is confined, and each tool's input and output schema, made
//! from the argument and result types (`types`).

use std::path::PathBuf;

use rmcp::handler::server::common::schema_for_type;
use rmcp::model::{Tool, ToolAnnotations};
use schemars::JsonSchema;

use super::files;
use super::types::{
    ExecArgs, ExecResult, InputArgs, InputResult, ListResult, NoArgs, OutputArgs, OutputResult,
    ProcessArgs, SignalArgs, SignalResult, TerminateResult,
};

/// How the server's commands are confined, as every description says.
#[derive(Clone, Debug)]
pub struct Confinement {
    /// The root on the executor's machine.
    pub root: PathBuf,
    /// Commands start through the root's confined executor.
    pub confined: bool,
    /// Confined commands may use the network.
    pub network: bool,
    /// A session's processes outlive it.
    pub keep_processes: bool,
}

impl Confinement {
    /// The sentence every tool's description ends with.
    pub fn sentence(&self) -> String {
        let root = self.root.display();
        if !self.confined {
            return format!(
                "UNCONFINED (--unconfined): commands run with the executor's full access \
                 (any file the account may write, the network); relative paths are taken \
                 from {root}."
            );
        }
        let network = if self.network {
            "the network is reachable (--network all)"
        } else {
            "no network"
        };
        format!(
            "Confined to {root} on the executor's machine: commands run inside it and may \
             write only beneath it (the system directories are read-only), {network}."
        )
    }
}

fn tool<A: JsonSchema + 'static, R: JsonSchema + 'static>(
    name: &'static str,
    description: &str,
    confinement: &str,
    annotations: ToolAnnotations,
) -> Tool {
    Tool::new(
        name,
        format!("{description} {confinement}"),
        schema_for_type::<A>(),
    )
    .with_output_schema::<R>()
    .with_annotations(annotations)
}

impl Confinement {
    /// The sentence every file tool's description ends with.
    pub fn file_sentence(&self) -> String {
        let paths = format!(
            "Paths are relative to {} on the executor's machine, or absolute beneath it; a path \
             outside it is refused.",
            self.root.display()
        );
        if self.confined {
            paths
        } else {
            format!("{paths} {}", self.sentence())
        }
    }
}

/// The description of file tool `name` (`files::TOOL_DESCRIPTIONS`).
fn file_description(name: &str) -> &'static str {
    files::TOOL_DESCRIPTIONS
        .iter()
        .find(|(tool, _)| *tool == name)
        .map_or("", |(_, description)| description)
}

fn file_tool<A: JsonSchema + 'static, R: JsonSchema + 'static>(
    name: &'static str,
    confinement: &str,
    annotations: ToolAnnotations,
) -> Tool {
    tool::<A, R>(name, file_description(name), confinement, annotations)
}

/// The file tools (`src/mcp/files/`), with their output schemas made
/// from their result types for what serialising them writes (rmcp's
/// serialize contract: a field skipped when empty is not required), so
/// that a client checking results against them (the MCP Python SDK does)
/// accepts every result. `files::tool_specs` makes them for what the types
/// accept, which requires such fields.
fn file_definitions(confinement: &Confinement) -> Vec<Tool> {
    let note = confinement.file_sentence();
    let reading = || ToolAnnotations::new().read_only(true).open_world(false);
    let changing = || {
        ToolAnnotations::new()
            .read_only(false)
            .destructive(true)
            .open_world(false)
    };
    vec![
        file_tool::<files::ReadFileArgs, files::ReadFileResult>("read_file", &note, reading()),
        file_tool::<files::WriteFileArgs, files::WriteFileResult>("write_file", &note, changing()),
        file_tool::<files::EditFileArgs, files::EditFileResult>("edit_file", &note, changing()),
        file_tool::<files::ListDirectoryArgs, files::ListDirectoryResult>(
            "list_directory",
            &note,
            reading(),
        ),
        file_tool::<files::SearchFilesArgs, files::SearchFilesResult>(
            "search_files",
            &note,
            reading(),
        ),
        file_tool::<files::FileInfoArgs, files::FileInfoResult>("file_info", &note, reading()),
        file_tool::<files::MovePathArgs, files::MovePathResult>("move_path", &note, changing()),
        file_tool::<files::RemovePathArgs, files::RemovePathResult>(
            "remove_path",
            &note,
            changing(),
        ),
        file_tool::<files::MakeDirectoryArgs, files::MakeDirectoryResult>(
            "make_directory",
            &note,
            ToolAnnotations::new()
                .read_only(false)
                .idempotent(true)
                .open_world(false),
        ),
    ]
}

/// Every tool of the server.
pub fn definitions(confinement: &Confinement) -> Vec<Tool> {
    let note = confinement.sentence();
    let acting = || {
        ToolAnnotations::new()
            .read_only(false)
            .open_world(!confinement.confined || confinement.network)
    };
    let reading = || ToolAnnotations::new().read_only(true).open_world(false);
    vec![
        tool::<ExecArgs, ExecResult>(
            "exec",
            "Run a program (argv) or a shell line (command, through sh -c) and wait up to \
             yield_ms for it to exit. Answers with its exit status (code or signal, timed out, \
             killed by its memory limit) once it exited, else with running: true and its \
             process_id, which the process_* tools take; and its output so far (stdout and \
             stderr, each up to max_output_bytes: head and tail kept, the cut said in bytes), \
             byte-exact, with next_seq to continue from with process_output. Cancelling the \
             call ends the process unless it was already handed back.",
            &note,
            acting(),
        ),
        tool::<OutputArgs, OutputResult>(
            "process_output",
            "Read a process's output after sequence number after_seq (0: all still retained; \
             else the next_seq of the previous answer), waiting up to wait_ms for some; with \
             its exit status once it exited, and closed once no more output can come. Output \
             the executor no longer retains (it keeps the last MiB) is listed in gaps, never \
             skipped silently.",
            &note,
            reading(),
        ),
        tool::<InputArgs, InputResult>(
            "process_input",
            "Write data to a process's stdin (exec with stdin or keep_stdin_open), and/or \
             close it. A write with a write_id is applied once however often it is repeated.",
            &note,
            ToolAnnotations::new().read_only(false).idempotent(true),
        ),
        tool::<SignalArgs, SignalResult>(
            "process_signal",
            "Send a signal to a process, by name (INT, SIGTERM, hup) or number.",
            &note,
            ToolAnnotations::new().read_only(false).destructive(true),
        ),
        tool::<ProcessArgs, TerminateResult>(
            "process_terminate",
            "End a process and everything it started: SIGTERM, then SIGKILL after 2 s.",
            &note,
            ToolAnnotations::new()
                .read_only(false)
                .destructive(true)
                .idempotent(true),
        ),
        tool::<NoArgs, ListResult>(
            "process_list",
            "The processes this MCP session started, running or ended (the latest 64).",
            &note,
            reading(),
        ),
    ]
    .into_iter()
    .chain(file_definitions(confinement))
    .collect()
}

/// What `initialize` tells the client about the server.
pub fn instructions(confinement: &Confinement) -> String {
    format!(
        "capexec runs commands on its executor's machine. {} {}",
        confinement.sentence(),
        if confinement.keep_processes {
            "Processes started by exec go on running after this session ends (--keep-processes)."
        } else {
            "Processes started by exec end when this session ends."
        }
    )
}
