//! Building and starting processes, in the spirit of `std::process::Command`.

use std::ffi::OsString;
use std::path::PathBuf;

use futures::StreamExt;

use crate::capexec_capnp::executor;
use crate::client::{Error, EventStream, RemoteProcess, StdioHandoff};
use crate::model::{EventBody, Exit, ExitStatus, Flow, OutputStream, PtySize, StartSpec};
use crate::wire;

/// Where the child's stdin comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stdin {
    /// /dev/null: the child reads end-of-file at once.
    Null,
    /// A pipe fed by [`RemoteProcess::write`].
    Piped,
}

/// Everything a finished process wrote, and how it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Output {
    /// Its status, whether its timeout ended it, and what the tree used
    /// (`None` from servers without the "usage" feature).
    pub exit: Exit,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// A process to start on an executor.
#[derive(Clone, Debug)]
pub struct Command {
    spec: StartSpec,
    flow: Option<Flow>,
    handoff: Option<StdioHandoff>,
}

impl Command {
    pub fn new(program: impl Into<OsString>) -> Command {
        Command {
            spec: StartSpec::new([program]),
            flow: None,
            handoff: None,
        }
    }

    /// Offers the child the caller's own stdio descriptors (see
    /// [`StdioHandoff`]), for a server on this machine; the start falls
    /// back to pipes where they cannot be taken, and `handoff.taken()`
    /// says which once it has answered. Ignored with [`Command::tty`].
    pub fn pass_stdio(&mut self, handoff: StdioHandoff) -> &mut Command {
        self.handoff = Some(handoff);
        self
    }

    pub fn arg(&mut self, arg: impl Into<OsString>) -> &mut Command {
        self.spec.argv.push(arg.into());
        self
    }

    pub fn args<I, S>(&mut self, args: I) -> &mut Command
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.spec.argv.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets a variable in the child's environment.
    pub fn env(&mut self, name: impl Into<OsString>, value: impl Into<OsString>) -> &mut Command {
        let name = name.into();
        self.spec.env.unset.retain(|unset| *unset != name);
        self.spec.env.set.push((name, value.into()));
        self
    }

    pub fn envs<I, K, V>(&mut self, vars: I) -> &mut Command
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<OsString>,
        V: Into<OsString>,
    {
        for (name, value) in vars {
            self.env(name, value);
        }
        self
    }

    /// Removes a variable from the child's environment.
    pub fn env_remove(&mut self, name: impl Into<OsString>) -> &mut Command {
        let name = name.into();
        self.spec.env.set.retain(|(set, _)| *set != name);
        self.spec.env.unset.push(name);
        self
    }

    /// Starts the child with an empty environment (plus what `env` sets).
    pub fn env_clear(&mut self) -> &mut Command {
        self.spec.env.clear = true;
        self.spec.env.set.clear();
        self.spec.env.unset.clear();
        self
    }

    /// The child's working directory, as a path on the executor's host.
    pub fn current_dir(&mut self, dir: impl Into<PathBuf>) -> &mut Command {
        self.spec.cwd = Some(dir.into());
        self
    }

    /// What the child sees as its `argv[0]`.
    pub fn arg0(&mut self, arg0: impl Into<OsString>) -> &mut Command {
        self.spec.arg0 = Some(arg0.into());
        self
    }

    pub fn stdin(&mut self, stdin: Stdin) -> &mut Command {
        self.spec.pipe_stdin = stdin == Stdin::Piped;
        self
    }

    /// Runs the child on a pseudo-terminal of the given size.
    pub fn tty(&mut self, size: PtySize) -> &mut Command {
        self.spec.tty = true;
        self.spec.pty_size = size;
        self
    }

    /// The terminal's type (the client's `TERM`, such as `xterm-256color`),
    /// which the child of a [`Command::tty`] start gets as `TERM` unless
    /// [`Command::env`] sets one. Servers older than this field ignore it.
    pub fn terminal_type(&mut self, term: impl Into<OsString>) -> &mut Command {
        self.spec.term = Some(term.into());
        self
    }

    /// Replaces the program (`argv[0]`), keeping the arguments.
    pub fn set_program(&mut self, program: impl Into<OsString>) -> &mut Command {
        let program = program.into();
        match self.spec.argv.first_mut() {
            Some(first) => *first = program,
            None => self.spec.argv.push(program),
        }
        self
    }

    /// Output flow mode; `spawn` defaults to retain, `output` and `status`
    /// to lossless.
    pub fn flow(&mut self, flow: Flow) -> &mut Command {
        self.flow = Some(flow);
        self
    }

    /// Terminates the process group if the child has not exited `timeout`
    /// after its spawn; its `info().timed_out` then says so.
    pub fn timeout(&mut self, timeout: std::time::Duration) -> &mut Command {
        self.spec.timeout = Some(timeout);
        self
    }

    /// Confines the process and all it starts (see [`Sandbox`]); the start
    /// fails with `[capexec:unsupported]` where the server cannot enforce
    /// it (unless it says best effort).
    ///
    /// [`Sandbox`]: crate::model::Sandbox
    pub fn sandbox(&mut self, sandbox: crate::model::Sandbox) -> &mut Command {
        self.spec.sandbox = Some(sandbox);
        self
    }

    /// Resource limits of the process tree (a cgroup's).
    pub fn limits(&mut self, limits: crate::model::Limits) -> &mut Command {
        self.spec.limits = limits;
        self
    }

    /// The descriptors offered with [`Command::pass_stdio`].
    pub fn stdio_handoff(&self) -> Option<&StdioHandoff> {
        self.handoff.as_ref()
    }

    pub fn spec(&self) -> &StartSpec {
        &self.spec
    }

    /// Starts the process; the returned handle owns it.
    pub async fn spawn(&self, executor: &executor::Client) -> Result<RemoteProcess, Error> {
        self.start(executor, self.flow.unwrap_or(Flow::Retain))
            .await
    }

    async fn start(&self, executor: &executor::Client, flow: Flow) -> Result<RemoteProcess, Error> {
        let (process, started) = self.start_pipelined_with(executor, flow);
        started.await?;
        Ok(process)
    }

    /// Starts the process without waiting for the answer: the returned
    /// handle can be used at once (calls on it are pipelined behind the
    /// start, costing no extra round trip) and the future reports whether
    /// the start succeeded. Spawn defaults apply (retain unless set).
    pub fn spawn_pipelined(
        &self,
        executor: &executor::Client,
    ) -> (
        RemoteProcess,
        impl std::future::Future<Output = Result<(), Error>> + 'static + use<>,
    ) {
        self.start_pipelined_with(executor, self.flow.unwrap_or(Flow::Retain))
    }

    fn start_pipelined_with(
        &self,
        executor: &executor::Client,
        flow: Flow,
    ) -> (
        RemoteProcess,
        impl std::future::Future<Output = Result<(), Error>> + 'static + use<>,
    ) {
        let mut spec = self.spec.clone();
        spec.flow = flow;
        let handoff = self.handoff.clone().filter(|_| !spec.tty);
        spec.passed_stdio = handoff.as_ref().and_then(StdioHandoff::hand_over);
        let mut request = executor.start_request();
        wire::start_spec_to_wire(&spec, request.get().init_params());
        let sent = request.send();
        let process = RemoteProcess::from_capability(sent.pipeline.get_process());
        let answer = sent.promise;
        let started = async move {
            let response = answer.await?;
            if let Some(handoff) = handoff {
                handoff.answered(response.get()?.get_stdio_passed());
            }
            Ok(())
        };
        (process, started)
    }

    /// Runs the process to completion and collects its output (stdin is
    /// /dev/null unless set to piped, in which case it is closed at once).
    /// Lossless unless another flow was set; if output was evicted all the
    /// same, the result is [`Error::OutputLost`], never truncated output.
    pub async fn output(&self, executor: &executor::Client) -> Result<Output, Error> {
        let (process, events) = self.start_to_completion(executor).await?;
        process.explain(collect_output(events).await).await
    }

    /// Runs the process to completion, discarding its output.
    pub async fn status(&self, executor: &executor::Client) -> Result<ExitStatus, Error> {
        let (process, events) = self.start_to_completion(executor).await?;
        process
            .explain(crate::client::process::exit_from(events).await)
            .await
    }

    /// Starts for `output` and `status`: lossless unless set otherwise;
    /// with nothing to write, a piped stdin is closed at once. The close and
    /// the subscription travel pipelined behind the start, so a short
    /// command costs one round trip; a failed start reports its own error.
    async fn start_to_completion(
        &self,
        executor: &executor::Client,
    ) -> Result<(RemoteProcess, EventStream), Error> {
        let (process, started) =
            self.start_pipelined_with(executor, self.flow.unwrap_or(Flow::Lossless));
        let closing = self.spec.pipe_stdin.then(|| process.close_stdin_in_order());
        let (started, events) = futures::join!(started, process.events(0));
        started?;
        if let Some(closing) = closing {
            closing.outcome().await?;
        }
        Ok((process, events?))
    }
}

/// The output and exit of `events`, once they reach `closed`.
async fn collect_output(mut events: EventStream) -> Result<Output, Error> {
    let (mut stdout, mut stderr, mut exit) = (Vec::new(), Vec::new(), None);
    while let Some(event) = events.next().await {
        let event = event?;
        match event.body {
            EventBody::Output { stream, data } => match stream {
                OutputStream::Stdout | OutputStream::Pty => stdout.extend_from_slice(&data),
                OutputStream::Stderr => stderr.extend_from_slice(&data),
            },
            EventBody::Exited(ended) => exit = Some(ended),
            EventBody::Closed => break,
            EventBody::Gap { from_seq } => {
                return Err(Error::OutputLost {
                    from_seq,
                    to_seq: event.seq,
                });
            }
        }
    }
    Ok(Output {
        exit: exit.ok_or(Error::EventsEnded)?,
        stdout,
        stderr,
    })
}
