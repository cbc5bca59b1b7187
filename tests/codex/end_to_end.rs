//! The unmodified `codex exec`, driven by a scripted model on loopback,
//! running whole turns against each backend (see `backends.rs`) with the
//! same test body: what reached the model is asserted exactly, what is on
//! disk is checked, and for a `capexec serve` behind the bridge, that the
//! processes ran there.

use std::future::Future;
use std::path::Path;

use serde_json::json;

use crate::backends::{Backend, Prepared};
use crate::codex_home::{self, CodexHome, Finished, SandboxMode};
use crate::scripted_model::{
    CommandOutput, Reply, Request, ScriptedModel, Status, Step, ToolOutput,
};

/// What a scenario gets.
struct Ctx {
    codex: &'static Path,
    prepared: Prepared,
}

impl Ctx {
    fn home(&self, sandbox: SandboxMode) -> CodexHome {
        CodexHome::new(sandbox, &self.prepared.environment)
    }

    /// Runs one turn of `steps` (the last a message "done") in `home`,
    /// asserting that Codex followed the script to its answer.
    async fn turn(&self, home: &CodexHome, steps: Vec<Step>) -> Turn {
        let model = ScriptedModel::start(steps).await;
        let finished = home
            .exec(self.codex, &model.base_url(), "follow the script")
            .await;
        model.assert_followed(&finished.context());
        finished.assert_answered("done");
        Turn { model, finished }
    }

    /// For a served backend, asserts that Codex's `commands` ran on the
    /// capexec server (and none is left there).
    fn assert_ran_on_server(&self, commands: u64) {
        if let Some(server) = &self.prepared.server {
            server.assert_ran(commands);
        }
    }
}

/// A turn that ran: what reached the model, and Codex's own output for
/// the messages of failed assertions.
struct Turn {
    model: ScriptedModel,
    finished: Finished,
}

impl Turn {
    fn tool_outputs(&self) -> Vec<ToolOutput> {
        self.model.tool_outputs()
    }

    /// The tool outputs read as command outputs.
    fn command_outputs(&self) -> Vec<CommandOutput> {
        self.tool_outputs()
            .iter()
            .map(|output| {
                output
                    .command()
                    .unwrap_or_else(|error| panic!("{error}\n{}", self.finished.context()))
            })
            .collect()
    }
}

/// Runs `body` against `backend`, or says loudly that Codex is missing.
fn run<F, Fut>(backend: Backend, body: F)
where
    F: FnOnce(Ctx) -> Fut,
    Fut: Future<Output = ()>,
{
    let Some(codex) = codex_home::codex() else {
        return;
    };
    let prepared = backend.prepare(codex);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(body(Ctx { codex, prepared }));
}

/// `exec_command` of `cmd` with `bash -c` (not a login shell, whose
/// profile would print its own lines), and more arguments.
fn exec_command(cmd: &str, more: serde_json::Value) -> serde_json::Value {
    let mut arguments = json!({"cmd": cmd, "login": false});
    if let (Some(arguments), Some(more)) = (arguments.as_object_mut(), more.as_object()) {
        arguments.extend(more.clone());
    }
    arguments
}

fn is_running(request: &Request) -> bool {
    request
        .last_output()
        .and_then(|output| output.command())
        .is_ok_and(|output| matches!(output.status, Status::Running(_)))
}

/// `write_stdin` of `chars` to the command the last output shows running.
fn write_to_running(request: &Request, chars: &str) -> Result<Reply, String> {
    let session = request.last_output()?.session_id()?;
    Ok(Reply::call(
        "write_stdin",
        json!({"session_id": session, "chars": chars, "yield_time_ms": 5000}),
    ))
}

/// Polls (an empty `write_stdin`) for as long as the last output shows
/// the command running.
fn poll_while_running() -> Step {
    Step::from(|request| write_to_running(request, "")).repeat_while(is_running)
}

/// The outputs of a command polled to its end: the first shows it
/// running, the last its exit; returns every output byte after the first
/// and the exit.
fn polled_to_the_end(outputs: &[CommandOutput]) -> (String, Status) {
    assert!(
        matches!(outputs.first().map(|o| o.status), Some(Status::Running(_))),
        "{outputs:?}"
    );
    assert!(
        outputs[1..outputs.len() - 1]
            .iter()
            .all(|o| matches!(o.status, Status::Running(_))),
        "{outputs:?}"
    );
    let text = outputs[1..].iter().map(|o| o.output.as_str()).collect();
    (text, outputs[outputs.len() - 1].status)
}

/// A command's output and exit code reach the model exactly, from the
/// workspace Codex asked for.
async fn a_command_s_output_reaches_the_model(ctx: Ctx) {
    let home = ctx.home(SandboxMode::DangerFullAccess);
    let turn = ctx
        .turn(
            &home,
            vec![
                Step::call(
                    "exec_command",
                    exec_command("pwd; printf 'hello from codex\\n'; exit 3", json!({})),
                ),
                Step::message("done"),
            ],
        )
        .await;
    let workspace = home.workspace.canonicalize().expect("the workspace");
    assert_eq!(
        turn.command_outputs(),
        [CommandOutput::exited(
            3,
            &format!("{}\nhello from codex\n", workspace.display())
        )]
    );
    ctx.assert_ran_on_server(1);
}

/// A command still running when Codex yields is polled with
/// `write_stdin` until its output arrives.
async fn a_long_running_command_is_polled_to_its_output(ctx: Ctx) {
    let home = ctx.home(SandboxMode::DangerFullAccess);
    // The command waits for the model to have seen it running (so that
    // the first answer is "running" however loaded the machine), then
    // runs a second longer before it prints.
    let gate = home.workspace.join("gate");
    let turn = ctx
        .turn(
            &home,
            vec![
                Step::call(
                    "exec_command",
                    exec_command(
                        "until [ -e gate ]; do sleep 0.02; done; sleep 1; printf 'finished late\\n'",
                        json!({"yield_time_ms": 300}),
                    ),
                ),
                Step::from(move |request| {
                    let reply = write_to_running(request, "")?;
                    std::fs::write(&gate, "").map_err(|error| format!("the gate: {error}"))?;
                    Ok(reply)
                }),
                poll_while_running(),
                Step::message("done"),
            ],
        )
        .await;
    let outputs = turn.command_outputs();
    assert_eq!(outputs[0].output, "", "{outputs:?}");
    assert_eq!(
        polled_to_the_end(&outputs),
        ("finished late\n".to_string(), Status::Exited(0)),
        "{outputs:?}"
    );
    ctx.assert_ran_on_server(1);
}

/// A command on a terminal gets what the model types: the terminal
/// echoes the line, `cat -n` numbers it, Ctrl-D ends it.
async fn a_terminal_gets_typed_input(ctx: Ctx) {
    let home = ctx.home(SandboxMode::DangerFullAccess);
    let turn = ctx
        .turn(
            &home,
            vec![
                Step::call(
                    "exec_command",
                    exec_command("cat -n", json!({"tty": true, "yield_time_ms": 300})),
                ),
                Step::from(|request| write_to_running(request, "typed line\n\u{4}")),
                poll_while_running(),
                Step::message("done"),
            ],
        )
        .await;
    let outputs = turn.command_outputs();
    assert_eq!(outputs[0].output, "", "{outputs:?}");
    assert_eq!(
        polled_to_the_end(&outputs),
        (
            "typed line\r\n     1\ttyped line\r\n".to_string(),
            Status::Exited(0)
        ),
        "{outputs:?}"
    );
    ctx.assert_ran_on_server(1);
}

/// `apply_patch` adds (in a new directory too), updates and deletes
/// files through the environment's file system.
async fn apply_patch_adds_updates_and_deletes_files(ctx: Ctx) {
    let home = ctx.home(SandboxMode::DangerFullAccess);
    let workspace = &home.workspace;
    std::fs::write(workspace.join("kept.txt"), "old text\nsecond line\n").expect("kept.txt");
    std::fs::write(workspace.join("doomed.txt"), "bye\n").expect("doomed.txt");
    let patch = "apply_patch <<'PATCH'\n\
                 *** Begin Patch\n\
                 *** Add File: added.txt\n\
                 +new line one\n\
                 +new line two\n\
                 *** Add File: nested/dir/new.txt\n\
                 +deep\n\
                 *** Update File: kept.txt\n\
                 @@\n\
                 -old text\n\
                 +new text\n\
                 \x20second line\n\
                 *** Delete File: doomed.txt\n\
                 *** End Patch\n\
                 PATCH\n";
    let turn = ctx
        .turn(
            &home,
            vec![
                Step::call("exec_command", exec_command(patch, json!({}))),
                Step::message("done"),
            ],
        )
        .await;
    let outputs = turn.tool_outputs();
    assert_eq!(outputs.len(), 1, "{outputs:?}");
    let output = &outputs[0].text;
    assert!(
        output.contains("\nExit code: 0\n")
            && output.ends_with(
                "\nOutput:\nSuccess. Updated the following files:\nA added.txt\n\
                 A nested/dir/new.txt\nM kept.txt\nD doomed.txt\n"
            ),
        "{output:?}"
    );
    let read = |name: &str| std::fs::read_to_string(workspace.join(name)).ok();
    assert_eq!(
        read("added.txt").as_deref(),
        Some("new line one\nnew line two\n")
    );
    assert_eq!(read("nested/dir/new.txt").as_deref(), Some("deep\n"));
    assert_eq!(read("kept.txt").as_deref(), Some("new text\nsecond line\n"));
    assert!(!workspace.join("doomed.txt").exists());
    // Files are read and written through the environment's file system,
    // not by starting processes.
    ctx.assert_ran_on_server(0);
}

/// In `workspace-write` mode, a command cannot write outside the
/// workspace (and the model sees why), while one writing inside can.
async fn workspace_write_denies_writes_outside_the_workspace(ctx: Ctx) {
    let home = ctx.home(SandboxMode::WorkspaceWrite);
    let escape = home.outside.join("escape.txt");
    let turn = ctx
        .turn(
            &home,
            vec![
                Step::call(
                    "exec_command",
                    exec_command(
                        // The shell's complaint on stdout, in order.
                        &format!(
                            "{{ printf escaped > '{}'; }} 2>&1; echo status=$?",
                            escape.display()
                        ),
                        json!({}),
                    ),
                ),
                Step::call(
                    "exec_command",
                    exec_command("printf inside > inside.txt; echo status=$?", json!({})),
                ),
                Step::message("done"),
            ],
        )
        .await;
    let outputs = turn.command_outputs();
    assert_eq!(outputs.len(), 2, "{outputs:?}");
    let denied = &outputs[0];
    let reason = denied
        .output
        .strip_prefix(&format!("/bin/bash: line 1: {}: ", escape.display()))
        .and_then(|rest| rest.strip_suffix("\nstatus=1\n"));
    assert!(
        denied.status == Status::Exited(0)
            && matches!(reason, Some("Permission denied" | "Read-only file system")),
        "{denied:?}"
    );
    assert_eq!(outputs[1], CommandOutput::exited(0, "status=0\n"));
    assert!(!escape.exists(), "the write outside the workspace landed");
    assert_eq!(
        std::fs::read_to_string(home.workspace.join("inside.txt")).ok(),
        Some("inside".to_string())
    );
    ctx.assert_ran_on_server(2);
}

/// In `workspace-write` mode with a `.git` in the workspace (which Codex
/// keeps read-only): `apply_patch` and commands add files beside it, at the
/// top of the workspace and deeper, while a patch of `.git/config` and a
/// command writing to it fail and leave it as it was.
async fn workspace_write_keeps_git_read_only_and_the_rest_writable(ctx: Ctx) {
    let home = ctx.home(SandboxMode::WorkspaceWrite);
    let workspace = &home.workspace;
    std::fs::create_dir_all(workspace.join(".git")).expect(".git");
    std::fs::write(workspace.join(".git/config"), "[core]\n").expect(".git/config");
    let added = "apply_patch <<'PATCH'\n\
                 *** Begin Patch\n\
                 *** Add File: top.txt\n\
                 +top\n\
                 *** Add File: nested/dir/new.txt\n\
                 +deep\n\
                 *** End Patch\n\
                 PATCH\n";
    let into_git = "apply_patch <<'PATCH'\n\
                    *** Begin Patch\n\
                    *** Update File: .git/config\n\
                    @@\n\
                    -[core]\n\
                    +[core]\n\
                    +\thooksPath = /tmp\n\
                    *** End Patch\n\
                    PATCH\n";
    let turn = ctx
        .turn(
            &home,
            vec![
                Step::call("exec_command", exec_command(added, json!({}))),
                Step::call("exec_command", exec_command(into_git, json!({}))),
                Step::call(
                    "exec_command",
                    exec_command("echo made > by-command.txt; echo status=$?", json!({})),
                ),
                Step::call(
                    "exec_command",
                    exec_command(
                        "{ echo x >> .git/config; } 2>/dev/null; echo status=$?",
                        json!({}),
                    ),
                ),
                Step::message("done"),
            ],
        )
        .await;
    let outputs = turn.tool_outputs();
    assert_eq!(outputs.len(), 4, "{outputs:?}");
    assert!(
        outputs[0].text.contains("\nExit code: 0\n")
            && outputs[0].text.ends_with(
                "\nOutput:\nSuccess. Updated the following files:\nA top.txt\n\
                 A nested/dir/new.txt\n"
            ),
        "{:?}",
        outputs[0].text
    );
    assert!(
        !outputs[1].text.contains("\nExit code: 0\n") && !outputs[1].text.contains("Success."),
        "{:?}",
        outputs[1].text
    );
    let commands: Vec<CommandOutput> = outputs[2..]
        .iter()
        .map(|output| output.command().expect("a command's output"))
        .collect();
    assert_eq!(
        commands,
        [
            CommandOutput::exited(0, "status=0\n"),
            CommandOutput::exited(0, "status=1\n")
        ]
    );
    let read = |name: &str| std::fs::read_to_string(workspace.join(name)).ok();
    assert_eq!(read("top.txt").as_deref(), Some("top\n"));
    assert_eq!(read("nested/dir/new.txt").as_deref(), Some("deep\n"));
    assert_eq!(read("by-command.txt").as_deref(), Some("made\n"));
    assert_eq!(read(".git/config").as_deref(), Some("[core]\n"));
}

/// The capexec server vanishing under the bridge while Codex polls a
/// running command: Codex gets an error at once, never a command running
/// forever, and its turn ends.
async fn a_server_lost_under_the_bridge_is_an_error_not_a_hang(ctx: Ctx) {
    let server = ctx
        .prepared
        .server
        .as_ref()
        .expect("a served backend")
        .pid();
    let home = ctx.home(SandboxMode::DangerFullAccess);
    let turn = ctx
        .turn(
            &home,
            vec![
                Step::call(
                    "exec_command",
                    exec_command(
                        "printf started; exec sleep 5",
                        json!({"yield_time_ms": 300}),
                    ),
                ),
                Step::from(move |request| {
                    let reply = write_to_running(request, "")?;
                    // SAFETY: kill(2) of the server this test started.
                    if unsafe { libc::kill(server as i32, libc::SIGKILL) } != 0 {
                        return Err(format!(
                            "kill the server: {}",
                            std::io::Error::last_os_error()
                        ));
                    }
                    Ok(reply)
                }),
                Step::message("done"),
            ],
        )
        .await;
    let outputs = turn.tool_outputs();
    assert_eq!(outputs.len(), 2, "{outputs:?}");
    assert!(
        matches!(
            outputs[0].command().map(|o| o.status),
            Ok(Status::Running(_))
        ),
        "{outputs:?}"
    );
    // The bridge ends when its server is lost, so Codex's environment
    // fails at once; the bridge's reason reaches Codex's log.
    assert_eq!(
        outputs[1].text,
        "write_stdin failed: Unified exec process failed: exec-server transport disconnected",
        "{}",
        turn.finished.context()
    );
    assert!(
        turn.finished
            .stderr
            .contains("exec-server stdio stderr: capexec: codex-bridge: lost the capexec server: "),
        "{}",
        turn.finished.context()
    );
}

/// Instantiates each scenario once per backend, in a module named after
/// it: `bridge_tls::a_terminal_gets_typed_input`.
macro_rules! on_backends {
    ([$module:ident: $backend:ident $(, $more:ident: $backends:ident)* $(,)?]: $($name:ident),* $(,)?) => {
        mod $module {
            $(
                #[test]
                fn $name() {
                    super::run(super::Backend::$backend, super::$name);
                }
            )*
        }
        on_backends!([$($more: $backends),*]: $($name),*);
    };
    ([]: $($name:ident),* $(,)?) => {};
}

on_backends!(
    [
        codex_exec_server: CodexExecServer,
        bridge_embedded: Embedded,
        bridge_unix: Unix,
        bridge_tls: Tls,
        bridge_websocket: Websocket,
    ]:
    a_command_s_output_reaches_the_model,
    a_long_running_command_is_polled_to_its_output,
    a_terminal_gets_typed_input,
    apply_patch_adds_updates_and_deletes_files,
    workspace_write_denies_writes_outside_the_workspace,
    workspace_write_keeps_git_read_only_and_the_rest_writable,
);

/// Only a served backend has a server to lose.
mod server_lost {
    use super::{Backend, a_server_lost_under_the_bridge_is_an_error_not_a_hang, run};

    on_backends!(
        [bridge_unix: Unix, bridge_tls: Tls]:
        a_server_lost_under_the_bridge_is_an_error_not_a_hang,
    );
}
