# capexec wire protocol.
#
# This file is the public contract of capexec and its wire specification.
# Every client, in any language, talks to a capexec server through the
# interfaces below over Cap'n Proto two-party RPC (a plain byte stream:
# Unix socket or TCP).
#
# Compatibility rules: fields and methods are only ever added with new
# ordinals; nothing is renumbered, retyped or removed. A client that needs a
# newer method must expect `unimplemented` from an older server.
#
# Conventions used below:
# - "Bytes" fields (argv, environment, paths) are `Data`, not `Text`: on Unix
#   they are arbitrary byte strings except that they may not contain NUL.
# - Errors are Cap'n Proto exceptions. Every error a capexec server raises
#   carries a machine-readable tag at the end of its description, written
#   `[capexec:<code>]`, so that clients can classify it through any number of
#   forwarding hops (each hop prefixes the description with "remote
#   exception: "; the tag stays). The codes:
#     invalid-argument, program-not-found, permission-denied, bad-cwd,
#     unsupported, unavailable, spawn-failed, unknown-token,
#     upstream-unavailable, unknown-environment, not-allowed, limit
#     (see `Executor.start`, which can raise most of them);
#     socket-failed    a socket operation of `dial` or `listen` failed on
#                      the executor's machine (see `Executor.dial`);
#     forbidden        an attenuated capability may not make this call
#                      (see `Process.observer`);
#     unauthenticated  a refused login (see `Gatekeeper.login`);
#     internal         the server failed in a way the request could not
#                      have avoided (an operating-system failure outside a
#                      start, such as a terminal that cannot be resized).
#   Each method below says which codes it raises. Errors without a tag come
#   from the RPC system itself: `disconnected` (the connection or a link of a
#   chain broke), `overloaded` (the connection was closed for exceeding a
#   limit; the description names it), `unimplemented` (an older server), and
#   malformed messages.
# - Sequence numbers ("seqs") are per process, start at 1 and increase by one
#   per event. Output chunks (stdout, stderr and pty output alike), the exit
#   event and the close event all draw from the same counter, so one number
#   orders everything a process produced.

@0xecf2f3fe3c6551da;

# ---------------------------------------------------------------------------
# Bootstrap
# ---------------------------------------------------------------------------
#
# What a connection's bootstrap capability is depends on the listener:
# - a Unix socket (created mode 0600: file permissions are the
#   authentication) bootstraps an `Executor` directly;
# - a TCP listener bootstraps a `Gatekeeper`, so an unauthenticated peer can
#   name nothing but `login`.

interface Gatekeeper {
  login @0 (token :Text) -> (executor :Executor);
  # Returns the server's Executor if `token` is the server's secret. The
  # comparison takes the same time whatever the token. Use it pipelined:
  # `login(token).executor.start(...)` costs no extra round trip, and a wrong
  # token makes the pipelined calls fail with the login error.
  #
  # A refusal is an exception whose description ends with
  # `[capexec:unauthenticated]`. After 3 refusals on one connection the
  # server closes it; logins already on their way are not checked. A
  # connection that has not logged in within 30 s is closed too. Either way
  # the peer is told why: an `Abort` whose `failed` error ends with
  # `[capexec:unauthenticated]`, which every call it waits for fails with.
  #
  # Before login a connection may send messages of at most 4 KiB and have
  # at most 8 questions (calls and bootstraps) not yet finished; a message
  # beyond either waits while a login is being answered, so calls
  # pipelined on `login` go on. Otherwise, and when the server already has
  # as many connections that have not logged in as it takes (in all, or
  # from the peer's address: `capexec serve --max-pending-logins`,
  # `--max-pending-logins-per-address`), the connection is closed with an
  # `overloaded` error that says which limit.
}

# ---------------------------------------------------------------------------
# Executor
# ---------------------------------------------------------------------------

interface Executor {
  # Starts processes. An Executor may run them locally or forward them to
  # another executor; callers cannot tell and need not care.

  start @0 (params :StartParams) -> (process :Process);
  # Spawns `params.argv` and returns the capability that owns the new process.
  #
  # Ownership: holding `process` is owning the child. When the last reference
  # to it is released (the client drops it, or the client's connection ends),
  # the server terminates the child's whole process group (SIGTERM, then
  # SIGKILL after a short grace), reaps it, frees its retained output and
  # forgets it. There is no process id on the wire that could name it again.
  #
  # The child starts in a new session (it is session and process-group
  # leader), with every signal at its default disposition, an empty signal
  # mask and no file descriptors beyond 0, 1 and 2.
  #
  # The call returns once the child has been spawned (exec succeeded), so
  # calls pipelined on `process` always reach a running (or already exited)
  # process. Failures are exceptions whose description ends with a tag:
  #   [capexec:invalid-argument]   params are malformed (empty argv, NUL bytes,
  #                                "=" in a variable name, bad pty size...);
  #   [capexec:program-not-found]  argv[0] does not resolve to a file (the
  #                                `capexec run` CLI exits 127);
  #   [capexec:permission-denied]  the program exists but cannot be executed
  #                                (not executable, a directory, bad format;
  #                                the CLI exits 126);
  #   [capexec:bad-cwd]            `cwd` does not exist or is not a directory;
  #   [capexec:unsupported]        the server cannot honour a requested
  #                                feature;
  #   [capexec:unavailable]        the server starts nothing new (it is
  #                                shutting down), here or upstream;
  #   [capexec:spawn-failed]       any other operating-system failure;
  #   [capexec:unknown-token]      (`restore` only) no process has this
  #                                restore token: it never existed, or its
  #                                process was not restored in time;
  #   [capexec:upstream-unavailable] the start was for an upstream
  #                                environment that cannot be reached now
  #                                (see `environment`); nothing was started;
  #   [capexec:not-allowed]        the start breaks a rule of a restricted
  #                                executor (see `restrict`); the
  #                                description names the rule;
  #   [capexec:limit]              a limit of the server would be exceeded:
  #                                argv and environment over 1 MiB, the
  #                                processes held by the server or by this
  #                                connection (`capexec serve --max-processes`,
  #                                `--max-processes-per-connection`), or the
  #                                server's file descriptors.
  # A connection with too many questions not yet finished (more than
  # `--max-calls-per-connection`: each counts from its arrival until the
  # caller's `Finish`, not until its answer), or whose calls and answers
  # not yet finished (with replies not yet read) hold more than
  # `--max-call-memory-per-connection`, is closed with an `overloaded`
  # error that says so; the caller's waiting calls fail with it.
  # A failed start leaves nothing behind: no process, no zombie, no open file.
  #
  # Through a forwarding executor (`environment`, or a server whose default
  # environment is an upstream) the call is forwarded with promise
  # pipelining preserved: calls pipelined on `process` are sent on to the
  # far end at once, so a chain costs one trip per hop, not one per call
  # (on links already connected: a link's first use, or first use after it
  # broke, first connects and checks that the upstream answers).
  # Everything about the process (seqs, gaps, exit statuses, flow control,
  # write ids, resize) is the far end's, passed through unchanged, and
  # releasing `process` releases it at the far end. If a link of the chain
  # breaks, the processes started through it are released at the far side
  # of the break and calls on them fail with `disconnected`.

  info @1 () -> (info :ExecutorInfo);
  # What a client needs to adapt to this executor. Ask it instead of relying
  # on `unimplemented` errors; a server older than this method answers
  # `unimplemented`, which means: `start` only, no environments.
  # Through a forwarding executor the answer describes the far end (where
  # `start` runs), with `features` limited to what every hop supports.

  environments @2 () -> (environments :List(Environment));
  # Every environment this server offers: "local" (its own engine) first,
  # then its upstreams in the order they were configured, each with its
  # connection state. A server's root executor always lists its own
  # environments (even when its default is an upstream); the executor of an
  # upstream environment (from `environment`) lists the upstream's.

  environment @3 (name :Text) -> (executor :Executor);
  # The executor of environment `name` ("local", or an upstream's name).
  # Calls on it can be pipelined: `environment("b").start(...)` costs no
  # extra round trip, and `environment("b").environment("c")` reaches the
  # upstream of an upstream the same way. An upstream connects on first
  # use (connecting, logging in and a first answer must take at most 10 s).
  # After a failed attempt the next one happens on a later use once a
  # back-off has passed (0.5 s doubling to 10 s); after a connection that
  # was lost, on the next use. While an upstream cannot be reached, calls on
  # it fail at once with `[capexec:upstream-unavailable]` and the reason,
  # without affecting other environments. An executor obtained here stays
  # valid across reconnections of the links it crosses. An unknown name
  # fails with `[capexec:unknown-environment]`.

  restore @4 (token :Text) -> (process :Process);
  # A new capability for the process that `Process.detachable` gave
  # `token` to, on any connection to the same server (through a forwarding
  # executor: to the server behind it, so use the executor the process was
  # started on). It works whether or not the process still has other
  # references: after a broken connection the server may not have noticed
  # yet. Restoring ends a grace period that was running. Pipelining works as
  # for `start`. An unknown or expired token fails with
  # `[capexec:unknown-token]`; a token grants nothing but its one process.

  restrict @5 (policy :Policy) -> (executor :Executor);
  # An executor that can do less: its starts must satisfy `policy` as well
  # as every policy of this executor (restricting a restricted executor only
  # narrows it). Hand it to a party that should run only some programs, in
  # some directories. A start that breaks a rule fails with
  # `[capexec:not-allowed]` and a description that names the rule by its
  # field name (`programs`, `cwdRoots`, `environment`, `settableEnv`,
  # `forbidTty`, `maxProcesses`); nothing is started.
  #
  # The policy is resolved when `restrict` is called, on the server that
  # runs the processes (through a forwarding executor the call is forwarded,
  # pipelined, like `start`): program names are looked up on that server's
  # PATH and every path has its symlinks resolved. `restrict` fails with
  # `[capexec:invalid-argument]` for a policy that cannot be resolved (a
  # program or root that does not exist, a relative path) and with
  # `[capexec:not-allowed]` for one that asks for more than this executor
  # allows (a program it does not allow, a root outside its roots, an
  # environment its `settableEnv` forbids).
  #
  # The policy lists take at most 1,024 entries each, and an executor can be
  # restricted at most 64 times over. Through a forwarding executor the
  # restriction is asked for again (and resolved again) when a broken link
  # reconnects; processes still running from before the break are then not
  # counted by the new `maxProcesses`.
  #
  # A restricted executor offers no other environments: `environment`
  # answers only "local" (itself; any other name fails with
  # `[capexec:not-allowed]`), `environments` lists only "local", and
  # `restrict` narrows further. `restore` works as on the executor it came
  # from (a restore token is authority of its own). `info` describes the
  # server, with "restricted" among the features.
  #
  # It is not a sandbox: an allowed program can still read and write what
  # the server's user can, change its own directory, and run other programs
  # if its arguments tell it to (`sh -c`, `git -c core.pager=...`). Allow
  # programs with that in mind. Programs and directories are checked by
  # path and then used by path, so whoever can change the file system under
  # them at that moment can race the check, and an allowed program in a
  # writable directory can be rewritten.

  reserved6 @6 ();
  # Reserved for a method of its own; servers of this version answer
  # `unimplemented`.

  dial @7 (address :Text, fromSocket :PortSink)
      -> (connection :PortConnection, toSocket :PortSink, info :PortConnectionInfo);
  # Opens a connection to `address` from the executor's machine (see
  # "Ports" below for addresses, the two sinks and the connection's life)
  # and returns once it is connected: what the socket's peer sends goes to
  # `fromSocket`, what is written to `toSocket` goes to the peer. Calls
  # pipelined on `toSocket` wait for the connection. A host name is
  # resolved on the executor's machine and its addresses are tried in turn
  # (only those a restricted executor allows); connecting must take at most
  # 30 s in all.
  #
  # Errors: `[capexec:invalid-argument]` for a malformed address;
  # `[capexec:not-allowed]` for an address a restricted executor does not
  # allow (the description names the rule: `ports.dial`);
  # `[capexec:socket-failed]` when the name does not resolve or no address
  # accepts the connection (refused, unreachable, timed out), with the
  # operating system's reason; `[capexec:limit]` when the connection
  # already holds its maximum of port connections (1,024) or the server
  # is out of file descriptors.
  #
  # Through a forwarding executor the call is forwarded, pipelined like
  # `start`, with the client's `fromSocket`: each write crosses every hop
  # as a call answered by the far receiver, so flow control holds end to
  # end and no hop holds more than the sender's window. If a link of the
  # chain breaks, the far server loses the connection's capabilities and
  # resets the socket; the client's `fromSocket` is released with neither
  # `end` nor `fail` (a client must read that as an error, never as end
  # of file) and calls on `toSocket` fail as disconnected.

  listen @8 (address :Text, acceptor :PortAcceptor)
      -> (listener :PortListener, address :Text);
  # Listens on `address` on the executor's machine (`tcp:HOST:0` lets the
  # kernel choose a free port; a host name is resolved and its first
  # address used) and hands each accepted connection to
  # `acceptor.accept`. Returns the address it listens on (with the port
  # chosen). Holding `listener` keeps the socket listening; releasing it
  # closes the socket, removes a Unix socket's file, and resets every
  # connection it accepted that is still open. A Unix socket path must not
  # exist yet.
  #
  # At most 16 accepts wait for the acceptor's answer at once; while that
  # many are waiting, or while the connection holds its maximum of port
  # connections, new connections wait in the kernel's backlog instead of
  # being dropped.
  #
  # Errors: as `dial` (the rule is `ports.listen`), with
  # `[capexec:socket-failed]` for an address in use or one the server may
  # not bind; `[capexec:limit]` when the connection already holds its
  # maximum of listeners (64). Through a forwarding executor as `dial`.
}

struct Policy {
  # Rules for starts. A field left null (or zero / false) adds no rule; the
  # rules of the executor being restricted always apply as well.

  programs @0 :List(Data);
  # The programs a start may run: absolute paths, or names looked up on the
  # server's PATH when `restrict` is called. Symlinks in their directories
  # are resolved (where /bin links to /usr/bin, "/bin/true" and
  # "/usr/bin/true" are one program) but not the file name itself:
  # multi-call programs such as busybox act by the name they are run as, so
  # allowing "ls" must not allow "sh". A start's argv[0] is resolved as it
  # would be executed (along the PATH of the environment the child would
  # get, relative to its working directory), must be one of these programs,
  # and that path is what is executed (argv[0] as the child sees it stays
  # what the start said; `arg0` must be unset or equal to argv[0]). Null:
  # any program. An empty list allows none. See `settableEnv` for the
  # environment of restricted programs: a variable allowed there can still
  # make an allowed program run something else.

  cwdRoots @1 :List(Data);
  # Absolute directories: a start's working directory (its `cwd`, else the
  # server's) must be one of them or below one, after resolving `..` and
  # symlinks; the child starts in that resolved directory. Null: any.

  environment @2 :List(EnvVar);
  # The fixed environment every start gets, instead of the server's: the
  # child has exactly these variables, plus what the start sets in
  # `settableEnv` (minus what it unsets there). Null: the environment of
  # the executor being restricted (for an unrestricted one, the server's).

  settableEnv @3 :List(Data);
  # The only variable names a start may set or unset; a start that sets,
  # unsets or clears anything else is refused. An empty list forbids every
  # change. Null: what the executor being restricted allows (for an
  # unrestricted one, any change), except in a policy that restricts
  # `programs`: then none, since programs take orders from their
  # environment (LD_PRELOAD, GIT_SSH_COMMAND, PAGER...).

  forbidTty @4 :Bool;
  # Starts may not ask for a terminal (`StartParams.tty`).

  maxProcesses @5 :UInt32;
  # At most this many processes started through this executor (and the
  # executors restricted from it) may be running at once; a process counts
  # from its start until its child exits, whether or not it is still held,
  # or, if the child left processes of its group running (for a terminal,
  # of its session), until those end or are ended (by the release, or the
  # run-time limit). A process that leaves its group and session (setsid,
  # setpgid) is not seen, nor ended. 0: no limit of its own.

  maxRunTimeMs @6 :UInt64;
  # Every process started through this executor is ended (as by
  # `StartParams.timeoutMs`, which it caps) this long after its start: a
  # start without a timeout, or with a longer one, gets this one. 0: no
  # limit of its own.

  reserved7 @7 :Void;
  reserved8 @8 :Void;
  # Reserved for rules of their own.

  ports @9 :PortPolicy;
  # Which addresses `dial` and `listen` may use on this executor. Null: what
  # the executor being restricted allows (for an unrestricted one, any
  # address), except in a policy that restricts `programs`: then none,
  # unless this field says otherwise (a program that may run only `make`
  # should not reach the network through the executor either).
}

struct ExecutorInfo {
  version @0 :Text;
  # capexec version of the server that runs the processes (semver).

  features @1 :List(Text);
  # Protocol features supported end to end, as stable names:
  #   "start", "read", "write", "write-id", "close-stdin", "signal",
  #   "terminate", "subscribe", "lossless", "tty", "resize", "process-info",
  #   "info", "environments", "detach" (`Process.detachable` and
  #   `Executor.restore`), "facets" (`Process.observer` and
  #   `Process.stdinWriter`), "timeout" (`StartParams.timeoutMs`), "usage"
  #   (`ExitStatus.usage`), "restrict" (`Executor.restrict`; listed by a
  #   restricted executor as "restricted" too), "ports" (`Executor.dial`,
  #   `Executor.listen`).
  # Clients must ignore names they do not know.

  os @2 :Text;
  # Operating system, as Rust's `std::env::consts::OS` ("linux").

  arch @3 :Text;
  # CPU architecture, as Rust's `std::env::consts::ARCH` ("x86_64").

  hostname @4 :Text;

  defaultShell @5 :Data;
  # `$SHELL` of the server process, else "/bin/sh".

  cwd @6 :Data;
  # The server's working directory: where a start without `cwd` runs.

  tempDir @7 :Data;
  # The server's directory for temporary files (`$TMPDIR`, else "/tmp").

  environment @8 :Text;
  # Where `start` runs, seen from the executor asked: "local" for a server's
  # own engine, else the path of environment names through the hops, such
  # as "b" or "b/c" (that is, `environment("b").environment("c")`).
}

struct Environment {
  name @0 :Text;
  # "local", or an upstream's name: letters, digits, "-", "_" and ".".

  address @1 :Text;
  # The upstream's address (`unix:PATH` or `tcp:HOST:PORT`); empty for
  # "local".

  isDefault @2 :Bool;
  # Plain `start` on this server's root executor runs here.

  state :union {
    local @3 :Void;
    # The server's own engine: always available.

    idle @4 :Void;
    # Not connected yet; connects on first use.

    connecting @5 :Void;

    connected @6 :Void;

    failed :group {
      # The last attempt failed or the connection was lost.
      reason @7 :Text;
      retryInMs @8 :UInt32;
      # Milliseconds until the next use may try again (0: the next use
      # will).
    }
  }
}

struct StartParams {
  argv @0 :List(Data);
  # Program and arguments; must be non-empty. argv[0] is resolved through
  # PATH of the child's environment when it contains no "/".

  cwd @1 :Data;
  # Working directory of the child. Unset or empty: the server's own working
  # directory. A relative path is resolved against the server's.

  clearEnv @2 :Bool;
  # false: the child environment starts as a copy of the server's.
  # true: it starts empty.

  unsetEnv @3 :List(Data);
  # Names removed from the starting environment (applied before `setEnv`).

  setEnv @4 :List(EnvVar);
  # Variables set after `unsetEnv` is applied; later entries win over earlier
  # ones with the same name.

  arg0 @5 :Data;
  # If set, the child sees this as its argv[0] while `argv[0]` is still the
  # program that is executed.

  tty @6 :Bool;
  # Run the child on a new pseudo-terminal instead of pipes. Output is then a
  # single `pty` stream.

  pipeStdin @7 :Bool;
  # For non-tty processes: keep the child's stdin open as a pipe fed by
  # `Process.write`. When false the child's stdin is /dev/null, so its first
  # read sees end-of-file. Stdin is open iff `tty` or `pipeStdin`.

  ptySize @8 :PtySize;
  # Initial terminal size for `tty` processes; the child never sees 0x0.
  # Unset: 24 rows, 80 columns.

  flow @9 :OutputFlow;
  # How the server treats output the client has not consumed yet.

  timeoutMs @10 :UInt64;
  # 0: no limit. Otherwise, if the child has not exited this many
  # milliseconds after its spawn, its process group is terminated (SIGTERM,
  # then SIGKILL after the grace) and its exit status says `timedOut`. A
  # child that exits in time but leaves processes of its session running
  # has them terminated at that moment all the same (its exit status stays
  # its own): what it left in its process group (for a terminal, in its
  # session).

  term @11 :Data;
  # For `tty` starts: the terminal's type, as the client's TERM names it
  # (such as "xterm-256color"), which the child gets as its TERM, as ssh
  # sends it with its terminal request. `setEnv` setting TERM wins over it;
  # so does a TERM in a restricted executor's fixed `environment`; it is
  # not an environment change that `settableEnv` governs. Ignored without
  # `tty`. Unset or empty: the child's TERM is whatever its environment has
  # (the server's, or none). At most 128 bytes of printable ASCII without
  # "/", "\" or "=" (terminfo looks it up as a file name); anything else
  # fails the start with [capexec:invalid-argument]. Servers older than
  # this field ignore it.
}

struct EnvVar {
  name @0 :Data;
  # Non-empty, without "=" or NUL.
  value @1 :Data;
  # Without NUL.
}

struct PtySize {
  rows @0 :UInt16;
  cols @1 :UInt16;
}

enum OutputFlow {
  retain @0;
  # The server always drains the child's output into the retained log; the
  # child never blocks on output. When the log is full, the oldest output is
  # evicted and readers that had not reached it get an explicit gap.

  lossless @1;
  # When the owner has not consumed a full window of output (512 KiB), the
  # server stops draining the child's pipes, so the child blocks in write(2)
  # exactly as it would writing into a local pipe. Consuming output resumes
  # it: a `read` with a later `afterSeq`, or a subscription's `push` once
  # the sink's stream flow control has taken it (at most one stream window,
  # 512 KiB, ahead of the sink's acknowledgements). Nothing the owner has not
  # consumed is ever evicted.
}

# ---------------------------------------------------------------------------
# Process
# ---------------------------------------------------------------------------

interface Process {
  # A running or finished child. All methods stay usable after the child has
  # exited: its retained output, exit status and close event remain readable
  # for as long as the capability is held.
  #
  # Retained log: the server keeps the most recent output of the process,
  # bounded by 1 MiB of payload and 50,000 chunks, evicting the oldest output
  # first. The exit and close events are never evicted.

  read @0 (afterSeq :UInt64, maxBytes :UInt32, waitMs :UInt32) -> (result :ReadResult);
  # Returns retained events with seq > afterSeq, in seq order.
  #
  # - `maxBytes` is a budget over output payload: whole chunks only, the first
  #   output chunk is always returned even if larger, and reading stops after
  #   the chunk that reaches or passes the budget. 0 means no budget (a
  #   response is still bounded by the retained log, about 1 MiB).
  # - `waitMs` > 0 long-polls: if nothing after `afterSeq` exists yet, the call
  #   waits up to `waitMs` milliseconds and returns as soon as any event (new
  #   output, exit or close) appears. At most 3,600,000.
  # - If events after `afterSeq` were evicted, the result starts with a `gap`
  #   event naming exactly the seqs that are lost: never a silent skip.
  # - In lossless mode, a read with `afterSeq` = N tells the server that the
  #   caller has consumed every event up to N.
  # - `afterSeq` greater than the newest seq is an error.
  #
  # Errors: `[capexec:invalid-argument]` for `afterSeq` past the newest event
  # or `waitMs` over the maximum; `[capexec:forbidden]` on a stdin writer.

  write @1 (data :Data, writeId :Text) -> (status :WriteStatus);
  # Appends `data` to the child's stdin. `writeId` is chosen by the caller and
  # must be non-empty; a repeated id (of the last 4096 accepted per process)
  # is answered `accepted` without writing again, so writes can be retried
  # safely. Writes are applied in the order the calls arrive. The result
  # comes once the bytes are in the child's stdin pipe (or pty), which gives
  # callers backpressure. `data` is at most 4 MiB.
  #
  # Errors: `[capexec:invalid-argument]` for an empty or non-UTF-8 `writeId`
  # or `data` over 4 MiB; `[capexec:limit]` when earlier writes the child has
  # not read yet already hold 16 MiB or 4096 writes (wait for their answers);
  # `[capexec:forbidden]` on an observer. A closed stdin or an exited child
  # is not an error but a `status`.

  closeStdin @2 ();
  # Closes the child's stdin after every earlier write, so the child reads
  # end-of-file. Idempotent. For a tty process it sends the terminal's
  # end-of-file character instead. Errors: `[capexec:forbidden]` on an
  # observer.

  signal @3 (signal :Signal);
  # Sends `signal` to the child's process group (for a tty process: the
  # terminal's foreground process group). A no-op success once the process
  # has exited. Errors: `[capexec:invalid-argument]` for `unknown` or a
  # signal this server's schema does not know; `[capexec:forbidden]` on a
  # facet.

  terminate @4 () -> (running :Bool);
  # SIGTERM to the process group, then SIGKILL after a short grace (2 s by
  # default) to whatever is left of the group. Returns at once; the exit is
  # observed through events. `running` is false if the process had already
  # exited (then nothing is sent). Errors: `[capexec:forbidden]` on a facet.

  subscribe @5 (sink :EventSink, afterSeq :UInt64) -> (subscription :Subscription);
  # Delivers every event with seq > afterSeq to `sink`: first the retained
  # ones, then live ones, in seq order and each exactly once. Delivery ends
  # after the `closed` event, or when `subscription` is released.
  #
  # Delivery is paced by the sink: `push` is a streaming call, so a slow sink
  # slows only its own subscription. In retain mode, a subscriber that falls
  # behind the retained log receives a `gap` event naming the lost seqs and
  # continues with the oldest retained event; it never slows the child or
  # other subscribers. In lossless mode, pushes taken by the stream's flow
  # control count as consumption (see `OutputFlow.lossless`); through an
  # `observer` view, reads and subscriptions consume nothing.
  #
  # Errors: `[capexec:invalid-argument]` for `afterSeq` past the newest
  # event; `[capexec:forbidden]` on a stdin writer.

  info @6 () -> (info :ProcessInfo);
  # A snapshot of the process and its retained log.

  resize @7 (size :PtySize);
  # Changes the terminal size of a `tty` process; the kernel sends SIGWINCH
  # to its foreground process group. Errors: `[capexec:invalid-argument]` for
  # a pipe process or an empty size (0 rows or columns);
  # `[capexec:internal]` if the kernel refuses; `[capexec:forbidden]` on a
  # facet.

  detachable @8 (graceSecs :UInt32) -> (restoreToken :Text);
  # Lets the process outlive the loss of every reference to it, for
  # `graceSecs` (1 to 86,400) each time: when the last reference is
  # released (typically because the owner's connection broke), the process
  # keeps running and its output keeps being retained (in lossless mode the
  # child is held back once the owner is a window behind, as always), and
  # `Executor.restore(restoreToken)` returns it. If nobody restores it
  # within the grace period it is terminated, unless it has finished: a
  # finished process stays restorable, with its retained output and exit
  # status, until the later of the grace period's end and the server's
  # retention period (30 s by default) after the release or its close.
  # `terminate` still ends it at once.
  #
  # The token is an unguessable secret (256 random bits, hex), never logged
  # by the server; it is the same on every call (a later call only changes
  # the grace). Processes that never call this keep the plain rule: the last
  # release terminates them.
  #
  # Errors: `[capexec:invalid-argument]` for `graceSecs` outside 1 to
  # 86,400; `[capexec:unavailable]` while the server shuts down;
  # `[capexec:forbidden]` on a facet.

  observer @9 () -> (view :Process);
  # A read-only facet of this process, to hand to someone who may watch but
  # not act (a dashboard, a log shipper): on it `read`, `subscribe`, `info`
  # and `observer` work as here, and every other call fails with an error
  # tagged `[capexec:forbidden]` that names the call. A view does not keep
  # the process alive: when the owner's capability is released, the process
  # ends as usual and its observers see `exited` and `closed` (and can go on
  # reading what is retained while they hold the view; the process's record
  # and its place in its connection's quota stay taken until the last view
  # goes). Through chained executors the view is the far end's. An observer
  # can make more observers.

  stdinWriter @10 () -> (writer :Process);
  # A facet that can only feed the process: `write`, `closeStdin` and `info`
  # work as here, every other call fails with `[capexec:forbidden]`. Only the
  # owner's capability can make one (a view or a writer cannot). It does not
  # keep the process alive either. Its write ids are its own (they never
  # count as repeats of the owner's or another writer's). On a `tty` process
  # the writer types into the terminal, so it can send the terminal's
  # interrupt, quit and suspend characters: hand one out only where that is
  # meant.

}

struct ReadResult {
  events @0 :List(Event);
  # Events with seq > afterSeq in seq order, possibly starting with (or, when
  # the exit event sits among evicted output, containing) `gap` events.

  nextSeq @1 :UInt64;
  # One past the last seq this result covers: pass `nextSeq - 1` as the next
  # `afterSeq`. When everything retained was returned, this is the seq the
  # next event of the process will get.

  closed @2 :Bool;
  # The process has closed (exited, and every output stream reached EOF), so
  # its close event exists; like `exit`, independent of the afterSeq window.

  exit :union {
    # The state of the process, independent of the afterSeq window.
    running @3 :Void;
    exited @4 :ExitStatus;
  }
}

enum WriteStatus {
  accepted @0;
  # The bytes are in the child's stdin (or this writeId was accepted before).

  stdinClosed @1;
  # Stdin is not open: the process was started without `pipeStdin`, stdin was
  # closed with `closeStdin`, or the child closed its end.

  starting @2;
  # The process is not spawned yet. capexec executors never return this: a
  # Process capability exists only after its spawn, and calls pipelined on a
  # pending start are queued, not refused. Kept for wire compatibility with
  # executors that publish processes before their spawn completes.

  exited @3;
  # The process has exited; its stdin is closed.
}

# ---------------------------------------------------------------------------
# Events
# ---------------------------------------------------------------------------

struct Event {
  seq @0 :UInt64;
  # For output, exited and closed: the event's own seq. For a gap: the last
  # lost seq (`gap.fromSeq`..`seq` inclusive are lost), so the seqs of the
  # events a consumer receives still strictly increase and cover every number
  # exactly once.

  union {
    output @1 :Output;
    exited @2 :ExitStatus;
    # The child (the process that was spawned) ended. Output written later by
    # its descendants gets seqs after this one.
    closed @3 :Void;
    # The last event of a process: it has exited and every output stream has
    # reached end-of-file.
    gap @4 :Gap;
  }
}

struct Output {
  stream @0 :OutputStream;
  data @1 :Data;
  # At most 64 KiB: what the child had written by the time the server
  # read, in the order written (several small writes may share a chunk).
}

enum OutputStream {
  stdout @0;
  stderr @1;
  pty @2;
}

struct Gap {
  fromSeq @0 :UInt64;
  # First lost seq. Lost seqs were evicted from the retained log before this
  # consumer got them; they can no longer be read.
}

struct ExitStatus {
  union {
    code @0 :Int32;
    # Normal exit with this code.

    killed :group {
      # Death by signal.
      signal @1 :Signal;
      # `unknown` when the signal has no name below; see `number`.
      number @2 :Int32;
      # The signal number as the server's operating system counts it.
      coreDumped @3 :Bool;
    }
  }

  timedOut @4 :Bool;
  # The process was ended by its `StartParams.timeoutMs` (it then usually
  # dies by SIGTERM or SIGKILL, but may exit with a code of its own choosing
  # when it handles SIGTERM).

  usage @5 :ResourceUsage;
  # What the process tree used. Null when the server does not report it
  # (servers without the "usage" feature, or when waiting for the child
  # failed).
}

struct ResourceUsage {
  # Resource usage as the kernel accounts it when the child is waited for:
  # the child itself plus every descendant the child waited for itself (the
  # figures a shell's `time` reports). Descendants still running when the
  # child exits, or orphaned before they ended, are not included.

  userCpuMicros @0 :UInt64;
  # CPU time spent in user mode, in microseconds.

  systemCpuMicros @1 :UInt64;
  # CPU time spent in the kernel on the tree's behalf, in microseconds.

  peakRssBytes @2 :UInt64;
  # The largest resident set any single accounted process reached, in
  # bytes (resident sets are not summed across processes). It is the
  # kernel's `ru_maxrss`, which counts for each process the memory it had
  # before executing its program too: a child the server starts vfork-style
  # shares the server's memory until it executes, so this is never below
  # the server's own peak resident set at that moment (a few MiB), however
  # small the program.
}

enum Signal {
  unknown @0;
  hup @1;
  int @2;
  quit @3;
  ill @4;
  trap @5;
  abrt @6;
  bus @7;
  fpe @8;
  kill @9;
  usr1 @10;
  segv @11;
  usr2 @12;
  pipe @13;
  alrm @14;
  term @15;
  chld @16;
  cont @17;
  stop @18;
  tstp @19;
  ttin @20;
  ttou @21;
  urg @22;
  xcpu @23;
  xfsz @24;
  vtalrm @25;
  prof @26;
  winch @27;
  io @28;
  sys @29;
}

interface EventSink {
  # Implemented by the subscriber.

  push @0 (events :List(Event)) -> stream;
  # A batch of consecutive events (at most about 256 KiB of output per call).
  # Returning from `push` acknowledges the batch. Throwing ends the
  # subscription.
}

interface Subscription {
  # Releasing this capability stops delivery.
}

struct ProcessInfo {
  pid @0 :UInt32;
  # Operating-system process id of the child on the server's host; it is
  # also the id of its process group and session.

  tty @1 :Bool;
  flow @2 :OutputFlow;
  stdinOpen @3 :Bool;
  nextSeq @4 :UInt64;
  # The seq the next event will get.

  closed @5 :Bool;
  exit :union {
    running @6 :Void;
    exited @7 :ExitStatus;
  }

  retainedBytes @8 :UInt64;
  retainedChunks @9 :UInt32;
  peakRetainedBytes @10 :UInt64;
  # Largest output payload held at once since the start: in retain mode
  # never more than the log's 1 MiB (room is made before a chunk is added).
  evictedThroughSeq @11 :UInt64;
  # Output with seq <= this has been evicted (0: nothing was evicted).
  unconsumedBytes @12 :UInt64;
  # Output bytes the owner has not consumed yet (see `OutputFlow.lossless`).
  uptimeMs @13 :UInt64;
  # Milliseconds since the spawn (frozen at exit).

  timedOut @14 :Bool;
  # The process's `timeoutMs` expired before it exited, and it was
  # terminated for it (the same as `exit.exited.timedOut` once it exited).
}

# ---------------------------------------------------------------------------
# Ports: connections and listeners on the executor's machine
# ---------------------------------------------------------------------------
#
# `Executor.dial` and `Executor.listen` open sockets on the
# machine where the executor runs its processes, as `ssh -L` and `ssh -R`
# do. Addresses are text:
#   tcp:HOST:PORT  HOST is a name (resolved on that machine), an IPv4
#                  address, or an IPv6 address in brackets ("[::1]");
#                  PORT is 1 to 65535, or 0 for `listen` (the kernel
#                  chooses a free port);
#   unix:PATH      an absolute path to a Unix stream socket (abstract
#                  names are not supported).
# At most 4096 bytes; anything else fails with [capexec:invalid-argument].
#
# A connection's bytes travel in two directions, each through a `PortSink`
# implemented by whoever receives them: `toSocket` is the server's (what
# is written to it goes to the socket's peer), `fromSocket` the client's
# (the server writes what the socket's peer sent into it). `dial` takes
# `fromSocket` and returns `toSocket`; a listener hands an accepted
# connection's `toSocket` to `PortAcceptor.accept`, which returns its
# `fromSocket`. Both directions are independent: half-closing one (`end`,
# which the socket's peer reads as end of file, or a peer's
# shutdown(SHUT_WR), which arrives as `end`) leaves the other going.
#
# Flow control: every `write` returns once its receiver has taken the
# bytes (the server: once they are in the socket), so a sender that keeps
# a bounded window of writes unanswered (capnp's `-> stream` flow control
# does) is held back by a slow reader, and no hop buffers more than that.
# capexec's own senders keep at most 1 MiB per direction unanswered, less
# when many connections share one Cap'n Proto connection (16 MiB in all,
# shared fairly, at least 16 KiB each), and write at most 64 KiB per call.
#
# Failures are never a clean end of file: a connection reset by its peer,
# a failed read or write, a `fail` from the client, the client's
# `fromSocket` failing or being released, or the release of the
# `PortConnection` or the `PortListener` it came from, reset the socket
# (TCP: RST, so the socket's peer reads ECONNRESET; a Unix socket's peer
# sees it closed) and report the failure
# on both sinks: `fromSocket` gets `fail` with the reason, and calls on
# `toSocket` fail with `[capexec:socket-failed]` and the reason.

interface PortSink {
  # One direction of a connection's bytes, implemented by the receiver.

  write @0 (bytes :Data) -> stream;
  # The next bytes, at most 1 MiB (more fails with
  # `[capexec:invalid-argument]`, and the connection is reset). Returns
  # once the receiver has taken them. Once a write fails, every later call
  # on the sink fails too. Writes sent without waiting for answers count
  # against the server's bound on a connection's unanswered calls
  # (`capexec serve --max-call-memory-per-connection`), past which it
  # closes the connection.

  end @1 ();
  # No more bytes in this direction, after every earlier write. On
  # `toSocket` the server shuts the socket down for writing (its peer
  # reads end of file) and answers once it has; on `fromSocket` it says
  # that the socket's peer did so. Later writes fail with
  # `[capexec:invalid-argument]`; a second `end` is a no-op.

  fail @2 (reason :Text);
  # This direction broke (after every earlier write): the receiver reports
  # an error with `reason`, never end of file. From a client on
  # `toSocket`, it resets the connection.
}

interface PortConnection {
  # One connection on the executor's machine, from `dial` or a listener.
  # Holding it keeps the connection open (a connection counts against its
  # Cap'n Proto connection's limit until it is released). Releasing it
  # resets the socket unless both directions have ended cleanly (`end` in
  # both), in which case the server has already closed it.
}

struct PortConnectionInfo {
  local @0 :Text;
  # The socket's own address on the executor's machine
  # ("tcp:127.0.0.1:40312"; for an unnamed Unix socket, "unix:").

  peer @1 :Text;
  # The address of the socket's peer: for `dial`, the address connected
  # to (its host resolved, "tcp:127.0.0.1:5432"); for an accepted
  # connection, where it came from ("unix:" when unnamed).
}

interface PortListener {
  # A listening socket on the executor's machine (see `Executor.listen`).
  # Releasing it closes the socket and resets the connections it accepted.
}

interface PortAcceptor {
  # Implemented by the client that called `listen`.

  accept @0 (connection :PortConnection, toSocket :PortSink, info :PortConnectionInfo)
      -> (fromSocket :PortSink);
  # A connection the listener accepted. Return the sink its bytes go to;
  # nothing is read from the socket before the answer. Throwing (or
  # returning no sink) resets the connection; the listener goes on.
}

struct PortPolicy {
  # Which addresses a restricted executor may dial and listen on. Each
  # list holds patterns; an address is allowed if a pattern matches it:
  #   tcp:HOSTS:PORTS  HOSTS is "*" (any), an IP address ("127.0.0.1",
  #                    "[::1]"), a block ("10.0.0.0/8", "[fd00::/8]") or
  #                    "localhost" (127.0.0.0/8 and ::1); host names are
  #                    refused, since what they resolve to can change: a
  #                    dial's host is resolved first and only the addresses
  #                    a pattern matches are tried. PORTS is "*", a port,
  #                    or a range ("8000-8999"); a listen on port 0 needs
  #                    "*".
  #   unix:PATH        that socket; "unix:DIR/" (a trailing slash) any
  #                    socket in DIR or below. Symlinks in the pattern's
  #                    path are resolved when `restrict` is called (the
  #                    path must exist), and those of a dial's or listen's
  #                    path when it is checked.
  # A list of at most 1,024 patterns; a pattern that cannot be read fails
  # `restrict` with `[capexec:invalid-argument]`. When the executor being
  # restricted has a list, each new pattern must lie within one of its
  # patterns, or `restrict` fails with `[capexec:not-allowed]`.

  dial @0 :List(Text);
  # Addresses `dial` may connect to. Null: no rule of its own (but see
  # `Policy.ports`); empty: none.

  listen @1 :List(Text);
  # Addresses `listen` may listen on. Null: no rule of its own; empty:
  # none.
}
