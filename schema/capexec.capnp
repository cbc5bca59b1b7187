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
#   and on `Directory` calls (see there), each naming the path:
#     not-found        no file or directory by that name;
#     not-a-directory  a path component (or the target) is not a directory;
#     is-a-directory   a file was expected, the path names a directory;
#     exists           the target exists and the call may not replace it;
#     not-empty        a directory to remove or replace is not empty;
#     too-large        a file is larger than a one-shot call may carry;
#     conflict         the file changed since the version the call names
#                      (`ifVersion`): somebody else wrote it meanwhile;
#     outside-directory the path would leave the directory (`..`, an
#                      absolute path, a symlink pointing out, a magic link
#                      of /proc, a mount point beneath it): the kernel
#                      refused to resolve it there;
#     no-space         the file system is full (or a quota is reached);
#     busy             the file is in use (a mount point, a running program).
#   On `Directory` calls, `permission-denied` means the operating system
#   refused (EACCES, EPERM, a read-only file system), `forbidden` that the
#   capability is read-only, and `limit` a limit of the server's.
#   Each method below says which codes it raises. Errors without a tag come
#   from the RPC system itself: `disconnected` (the connection or a link of a
#   chain broke), `overloaded` (the connection was closed for exceeding a
#   limit; the description names it), `unimplemented` (an older server), and
#   malformed messages.
# - A server that shuts down cleanly (`capexec serve` receives SIGTERM or
#   SIGINT) accepts no new connection, terminates every process (each exit
#   then says `ExitStatus.serverShutdown`), gives every subscription up to
#   2 s to deliver what its process logged (exits included), then closes
#   each connection with a Cap'n Proto abort message of type
#   `disconnected` whose reason ends with `the server is shutting down`.
#   A connection that ends without one (a reset, end-of-file) means the
#   server stopped without saying why (it was killed, or crashed), or the
#   network broke.
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

  start @0 (params :StartParams) -> (process :Process, stdioPassed :Bool);
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
  #                                in a sandbox, it or an interpreter of its
  #                                `#!` lines lies outside the readable
  #                                roots: the description names that file
  #                                and ends "(add WHAT as a read-only root:
  #                                DIR)", DIR being what makes it run: its
  #                                directory; a version manager's shim's
  #                                (`M/shims/NAME`) M; a program of an
  #                                installation's `bin` beside its `lib`,
  #                                the installation; a virtualenv's
  #                                program, the virtualenv (`pyvenv.cfg`
  #                                above its `bin`); the CLI exits 126);
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
  #                                description names the rule; or its
  #                                sandbox has a root no sandbox may have
  #                                (see `Sandbox`);
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
  #
  # `stdioPassed`: the child's standard descriptors named by
  # `params.passedStdio` are the ones the client sent (see there); false
  # when the start has pipes as usual, and always false from a server
  # older than that field.

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
  # restricted at most 64 times over. The rules a restricted executor keeps
  # (every policy before it included) count against its connection's and
  # the server's memory for capabilities (see `Directory`'s limits) for as
  # long as it, or a directory it made, is held: past that,
  # `restrict` fails with `[capexec:limit]`. Through a forwarding executor the
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

  directory @6 (path :Data) -> (dir :Directory);
  # The directory at `path` on the machine where this executor's processes
  # run (a relative path is taken from the server's working directory, as a
  # start without `cwd` would be), as a `Directory` capability: every call
  # on it names paths beneath it and nothing else (see `Directory`). `path`
  # itself is resolved as the server's user would (symlinks followed), once,
  # when the call is made; the directory stays the same one if it is renamed
  # later. Pipelined: `directory(p).readFile(q)` costs one trip per hop.
  #
  # A restricted executor (see `restrict`) hands out only directories in or
  # below its `cwdRoots` (its path is resolved beneath the root, by the
  # kernel), else fails with `[capexec:not-allowed]`, whether or not the
  # path exists (`not-found` and its kin only for a path inside a root).
  # Through a forwarding
  # executor the call is forwarded, pipelined, like `start`, and the
  # `Directory` is the far end's.
  #
  # Errors: `[capexec:not-found]`, `[capexec:not-a-directory]`,
  # `[capexec:permission-denied]`, `[capexec:invalid-argument]` (empty, NUL),
  # `[capexec:not-allowed]`; `[capexec:unsupported]` on a kernel without
  # openat2 (Linux < 5.6), where no confinement could be enforced.

  dial @7 PortDialParams -> PortDialResults;
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
  # allow (the description names the rule: `ports.dial`; outside the
  # rule's Unix paths the answer is the same whether or not the path
  # exists), and for a socket the executor's own server serves on (its
  # Cap'n Proto listeners, admin socket and metrics endpoint, by address,
  # by a TCP port on an address of the machine, or by the inode of a Unix
  # socket whatever path names it), whatever the rules;
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

  listen @8 PortListenParams -> PortListenResults;
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
  # symlinks; the child starts in that resolved directory, and a start
  # outside them fails with `[capexec:not-allowed]` whether or not its
  # working directory exists (only a missing one inside a root is
  # `[capexec:bad-cwd]`), so that a start tells nothing of what exists
  # outside. Null: any.

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

  sandbox @7 :Sandbox;
  # Every process started through this executor is sandboxed, within this
  # sandbox (resolved when `restrict` is called: roots must exist and are
  # symlink-resolved). A start without a sandbox of its own gets this one
  # (with its defaults, the working directory's access as said below); a
  # start with one gets its own, which must ask for nothing this one does
  # not allow: a `readOnly` root must be readable here, a `writable` root
  # writable here, `network = all` needs `all` here, else the start fails
  # with `[capexec:not-allowed]` naming the root. What a start gets by
  # default (the system directories, its working directory as writable)
  # is narrowed to what this sandbox allows, silently. The start's working
  # directory, wherever it is, is readable; it is writable only where a
  # `writable` root of this sandbox contains it, or, if this sandbox lists
  # no `writable` root and leaves `readOnlyCwd` unset, wherever it is. So
  # `writable = [X]` alone confines every start's writes to X (and the
  # default devices), whatever working directory it picks; `cwdRoots`
  # confines where it may run. The sandbox must be enforced unless both
  # this and the start's say `bestEffort`. Restricting again only narrows:
  # a narrower policy's sandbox is checked against this one the same way,
  # on `restrict` for its roots and network and on every start for the
  # rest, and a process gets one Landlock layer: the narrowest. Null: no
  # sandbox of its own.

  limits @8 :Limits;
  # The most each start may have: a start's limits are the smaller of its
  # own and these (a start without limits gets these), narrowed by every
  # policy before. Null: no limits of its own.

  ports @9 :PortPolicy;
  # Which addresses `dial` and `listen` may use on this executor. Null: what
  # the executor being restricted allows (for an unrestricted one, any
  # address), except in a policy that sets `programs`, `cwdRoots` or
  # `sandbox`: then none, unless this field names some (what such a policy
  # confines would be worth nothing if its holder could still reach any
  # address, its own server's socket included: a program that may run only
  # `make`, or in one directory, should not reach the network through the
  # executor either). A policy whose `sandbox` has network `none` allows
  # no dial and no listen at all, and one that also names addresses here
  # is refused with `[capexec:invalid-argument]` (give the sandbox network
  # `all` to name them). Whatever the rules, no executor dials a socket
  # its own server serves on (see `Executor.dial`).
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
  #   restricted executor as "restricted" too), "directory"
  #   (`Executor.directory`), "files" (every `Directory` method up to
  #   `info`, with `FileStat.version` and `ifVersion`), "file-watch"
  #   (`Directory.watch`), "directory-executor" (`Directory.executor`), "file-batches"
  #   (`Directory.writeFiles`, `Directory.readFiles`), "file-search"
  #   (`Directory.search`), "ports" (`Executor.dial`, `Executor.listen`),
  #   "process-ports" (`Process.dial`, `Process.listen`), "close-output"
  #   (`Process.closeOutput`), "shutdown-reason" (`ExitStatus.serverShutdown`
  #   and the abort message of a clean shutdown, see the conventions above).
  # Clients must ignore names they do not know.

  os @2 :Text;
  # Operating system, as Rust's `std::env::consts::OS` ("linux").

  arch @3 :Text;
  # CPU architecture, as Rust's `std::env::consts::ARCH` ("x86_64").

  hostname @4 :Text;

  defaultShell @5 :Data;
  # The login shell of the account the server runs as (its password
  # database entry, as ssh uses), else `$SHELL` of the server process, else
  # "/bin/sh".

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

  sandbox @12 :Sandbox;
  # Confine the process and everything it starts (see `Sandbox`). Null: no
  # sandbox, unless the executor is restricted by a policy with one (see
  # `Policy.sandbox`). A sandbox the kernel cannot enforce fails the start
  # with `[capexec:unsupported]` naming what is missing, unless
  # `bestEffort`; a sandbox whose roots would expose the server's login
  # token fails with `[capexec:not-allowed]`. Servers older than this
  # field ignore it: check for the "sandbox" feature (`Executor.info`)
  # first.

  limits @13 :Limits;
  # Resource limits of the process tree, enforced by a cgroup (see
  # `Limits`); they work with or without a sandbox. Limits the server
  # cannot enforce fail the start with `[capexec:unsupported]`, unless
  # `limits.bestEffort`. Servers older than this field ignore it: check
  # for the "limits" feature first.

  passedStdio @14 :PassedStdio;
  # Only for a client on the server's machine, over a Unix socket: the
  # child's stdin, stdout and stderr (those `passedStdio` names) are
  # descriptors the client sent over this connection with SCM_RIGHTS
  # instead of pipes the server relays, as `systemd-run --pipe` does: a
  # pipeline through capexec then runs at the speed of a local one, and
  # the child sees what a local child would (the client's pipe, file or
  # socket; never a terminal: a client passes none). The server takes
  # them all or none, before anything else about the start is checked
  # (a refused start closes them too), and says which in the start's
  # `stdioPassed`. None are taken (the start has pipes as usual and the
  # descriptors are closed) by a server older than this field, over a
  # connection that carries no descriptors (TCP, TLS, an in-process
  # executor without them), by a restricted executor, by a `tty` start,
  # by a start forwarded to another machine (`environment`, an upstream
  # default, a forwarded directory's `executor`: closed on this machine,
  # at the latest when the connection ends), or when a descriptor is
  # missing or not a pipe, socket, regular file or character device (for
  # a sandboxed start: not a pipe or regular file, since through a socket
  # the child could reach, or be sent, what its sandbox denies it).
  # Taken descriptors are the child's own: its output on them is not
  # retained and produces no `output` events (the exit and close events
  # still come), and a taken stdin is not piped (`write` answers
  # `stdinClosed`, as without `pipeStdin`).
}

struct PassedStdio {
  # Which of the child's standard descriptors the client sent, and where
  # they are among the descriptors it sent over the connection.

  first @0 :UInt64;
  # The connection-wide number of the first of them: the client numbers
  # every descriptor it sends over the connection from 0, in the order it
  # sends them; they follow in the order stdin, stdout, stderr (those
  # named below). Send them no later than the start (with its bytes or an
  # earlier message's), and only once the server has answered on the
  # connection: one that never reads them holds them, and so the client's
  # pipes, open. A server keeps at most 16 descriptors no start has taken
  # per connection (the oldest are closed first) and 1,024 over all its
  # connections (beyond, they are closed as they arrive), and none beyond
  # the connection's end.

  stdin @1 :Bool;
  stdout @2 :Bool;
  stderr @3 :Bool;
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
  # must be non-empty and at most 256 bytes (the last 4096 accepted per
  # process are remembered whole); a repeated id (of those)
  # is answered `accepted` without writing again, so writes can be retried
  # safely. Writes are applied in the order the calls arrive. The result
  # comes once the bytes are in the child's stdin pipe (or pty), which gives
  # callers backpressure. `data` is at most 4 MiB.
  #
  # Errors: `[capexec:invalid-argument]` for an empty, non-UTF-8 or longer
  # than 256 bytes `writeId` or `data` over 4 MiB; `[capexec:limit]` when earlier writes the child has
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
  # Terminates the process's tree: SIGTERM to the process group (a
  # terminal's session) and, with cgroup tracking, to everything in its
  # cgroup; then SIGKILL after a short grace (2 s by default) to whatever
  # is left of them. Returns at once; the exit is observed through events.
  # `running` is true if anything of the tree was running (the child, or
  # after its exit what it left in its cgroup or group, see
  # `ProcessInfo.treeRunning`): then the termination starts (or goes on,
  # if one had started), and an exited child's exit status stays as it
  # was. It is false if nothing of the tree runs; then nothing is sent.
  # Errors: `[capexec:forbidden]` on a facet.

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

  dial @11 PortDialParams -> PortDialResults;
  # `Executor.dial` tied to this capability: a connection opened from the
  # machine of the executor that started (or restored) the process, under
  # that executor's rules (`ports.dial`) and counted against its
  # connection's limits, exactly as that executor's `dial` would open it,
  # which also ends when this `Process` capability is released (its last
  # reference, whoever holds it): the server then resets the connection
  # (see "Ports") unless both directions have already ended, whether or
  # not the `PortConnection` is still held. For a forward that lives
  # exactly as long as the work it serves (a debugger, a dev server), so
  # nothing keeps it open after the process's owner let go. The forward
  # does not end when the child exits: bytes the child wrote before it
  # exited still reach the caller. A capability from `restore` is another
  # capability: forwards made through an earlier one ended with it.
  # Through chained executors the call is the far end's, as every
  # `Process` call is. Feature "process-ports".
  #
  # Errors: as `Executor.dial`, and `[capexec:forbidden]` on a facet.

  listen @12 PortListenParams -> PortListenResults;
  # `Executor.listen` tied to this capability, as `dial` above: when this
  # `Process` capability is released, the socket stops listening (a Unix
  # socket's file is removed) and every connection it accepted that is
  # still open is reset. Feature "process-ports".
  #
  # Errors: as `Executor.listen`, and `[capexec:forbidden]` on a facet.

  closeOutput @13 (stream :OutputStream);
  # Stops reading the child's `stream` (`stdout` or `stderr`) for good, as
  # a reader that goes away does in a local pipeline (`command | head`):
  # the server closes its end of that pipe, so the next write to it by the
  # child (or anything of its tree that shares the pipe) gets SIGPIPE, or
  # EPIPE where SIGPIPE is ignored, exactly as it would locally. What the
  # pipe held unread is dropped and no more output of that stream is
  # logged; what was logged before stays readable. The other stream, the
  # exit and the close event go on (`closed` no longer waits for this
  # stream). `capexec run` calls it when its own stdout's reader went away.
  # Idempotent, and a no-op success once the stream has ended, when the
  # start's stdio was passed (the child writes to the caller's descriptor
  # itself, see `StartParams.passedStdio`). Feature "close-output".
  #
  # Errors: `[capexec:invalid-argument]` for `pty`, or on a `tty` process
  # (its one terminal carries both streams: send `signal` instead);
  # `[capexec:forbidden]` on a facet.
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

  killedByMemoryLimit @6 :Bool;
  # The tree's memory limit (`StartParams.limits.memoryBytes`, or a
  # policy's) ended the child: the kernel's out-of-memory killer killed a
  # process of the tree for exceeding the limit, and the child died of
  # SIGKILL, or exited 137 as a shell does when the command it waited for
  # died that way. Counted by the kernel (the cgroup's `oom_kill`), not
  # guessed from the signal. `capexec run` says so and exits 137.

  serverShutdown @7 :Bool;
  # The server terminated the process because it was shutting down
  # cleanly (its operator stopped it: SIGTERM or SIGINT to `capexec
  # serve`), as `terminate` would (SIGTERM to the tree, SIGKILL after the
  # grace); the status is what the child made of it. False for a process
  # that exited before the shutdown reached it, and for every other
  # ending. `capexec run` says so in one line and exits with the status.
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

  confinement @15 :Confinement;
  # What confines the process and how its tree is followed, as enforced
  # (null from servers older than the "sandbox" feature).

  treeRunning @16 :Bool;
  # Processes of its tree are still running: the child, or what it left
  # behind. With cgroup tracking that is everything it started, through
  # `setsid` and double forks; with process-group tracking, what stayed in
  # its process group (a terminal: its session).
}

# ---------------------------------------------------------------------------
# Confinement: sandboxes, limits, tracking
# ---------------------------------------------------------------------------
#
# A sandboxed process is confined by the kernel, before it executes its
# program: Landlock rules (what it may read, write and execute; TCP bind and
# connect; signals and abstract Unix sockets scoped to the sandbox),
# `no_new_privs`, a seccomp filter (socket families when the network is off,
# io_uring, and for a root server's children the calls that change the
# kernel), and every capability dropped when the server has any. What it
# starts inherits all of it. capexec servers refuse Unix-socket connections
# from sandboxed processes (their cgroup says what they are; on hosts
# without cgroup tracking, `no_new_privs` with a seccomp filter does), so a
# sandboxed process cannot ask its own server for an unsandboxed one, and a
# sandbox whose roots contain the server's token file is refused.
#
# Where the server can write a cgroup2 hierarchy, every process, sandboxed
# or not, gets a cgroup of its own: its tree is tracked through `setsid` and
# double forks, terminating it (terminate, release, timeouts) ends all of it
# (`cgroup.kill`), it counts as running until its cgroup is empty, and the
# cgroup is removed afterwards. If the server is killed, a small sentinel
# process it left kills and removes every cgroup of it at once. `Limits` are
# cgroup limits (cgroup v2 controllers, or v1 controllers on hybrid hosts).
# `Executor.info` lists what the server can enforce:
#   "sandbox" and "limits"       the protocol fields are understood;
#   "sandbox-landlock-N"         Landlock ABI N (filesystem rules from 1,
#                                TCP from 4, scoping from 6);
#   "seccomp"                    seccomp filters;
#   "cgroup-tracking"            a cgroup per process, or
#   "process-group-tracking"     process groups only (no writable cgroup2);
#   "limits:memory,pids,cpu"     the limits it can enforce (those it can);
#   "peer-check:cgroup"          how it recognises sandboxed peers (or
#                                "peer-check:no-new-privs").

struct Sandbox {
  # Paths are absolute and resolved on the server (symlinks followed); a
  # root that does not exist fails the start with `[capexec:invalid-argument]`.
  # A root is a directory (and everything below it) or a file. Landlock
  # rules are unions: a path is readable if it is in or below any readable
  # root, writable if in or below any writable one; there is no way to
  # exclude a path below a root. A writable root may neither contain nor
  # lie on a kernel interface file system (proc, sysfs, a cgroup
  # hierarchy, devtmpfs /dev...: a process could change the kernel or
  # leave its cgroup), and no root may contain a secret file of the
  # server: a login token file (its own, or one it logs in to an upstream
  # with) or the private key of its TLS certificate (`--tls-key`, or the
  # one `--tls-self-signed` keeps); either fails the start (or `restrict`)
  # with `[capexec:not-allowed]`, naming the root. Devices are roots like
  # any file: the default ones (below) count among the writable and
  # readable roots and are listed in `Confinement.sandbox`; /dev/null,
  # /dev/zero, /dev/full, /dev/tty, /dev/ptmx and /dev/pts may also be
  # given as writable roots (alone with `noSystemRoots`), no other file of
  # devtmpfs may (a tmpfs mounted below /dev, such as /dev/shm, is no
  # device: it may).
  #
  # A sandboxed process holds no capability and has `no_new_privs`. On a
  # root server it also stops being root (unless `keepRoot`): uid 0 keeps
  # the owner's access to every root-owned file without any capability
  # (`/etc/shadow`, private keys) and every daemon that trusts its peer's
  # uid trusts it (root-owned Unix sockets such as docker's or systemd's,
  # which Landlock before ABI 9 does not guard), so the process runs as
  # the unprivileged user `nobody` (uid and gid 65534, no supplementary
  # groups). What root owns in the sandbox's own roots stays within its
  # reach: in a mount namespace of its own, its working directory, its
  # writable roots and its read-only roots outside the system directories
  # are idmapped mounts on which root's files are the process's (and
  # `nobody`'s are root's), so a build in a root-owned checkout reads and
  # writes it as root would and what it makes is root's on disk. A root
  # under a root-owned directory `nobody` could not search (`/root`) is
  # reached through that directory, mapped as a whole (Landlock still
  # allows only the roots). The system directories, devices and /proc are
  # seen as `nobody` sees them: root-only files there are unreadable, and
  # other sessions' terminals are out of reach. Enforced under the name
  # "unprivileged-user"; a root whose file system cannot be idmapped, or a
  # server without CAP_SYS_ADMIN (a container's root), cannot have it, and
  # such a start is refused with `[capexec:unsupported]` unless
  # `bestEffort` (then it runs as root without capabilities and
  # `notEnforced` says "unprivileged-user") or `keepRoot`.

  readOnly @0 :List(Data);
  # Readable and executable, beyond the system directories: /usr, /bin,
  # /sbin, /lib, /lib32, /lib64, /libx32, /etc, /opt and /proc (those that
  # exist), and the devices programs need (/dev/null, /dev/zero, /dev/full,
  # /dev/tty, /dev/ptmx and /dev/pts writable; /dev/random and
  # /dev/urandom readable).

  writable @1 :List(Data);
  # Writable (create, delete, rename, truncate...), readable and
  # executable, beyond the working directory.

  network @2 :SandboxNetwork;

  noSystemRoots @3 :Bool;
  # The system directories and devices are not readable unless listed.

  readOnlyCwd @4 :Bool;
  # The working directory is readable but not writable (unless a writable
  # root contains it).

  bestEffort @5 :Bool;
  # Start even if the kernel cannot enforce all of the sandbox (an old
  # kernel, Landlock disabled, no seccomp), and say what was not enforced
  # in `ProcessInfo.confinement.notEnforced`. Without it such a start fails
  # with `[capexec:unsupported]`, naming what is missing and why, and
  # ending "bestEffort (capexec run --best-effort) starts it without
  # them". Never silently unconfined.

  allowNamespaces @6 :Bool;
  # The process may make namespaces. Without it (the default) its seccomp
  # filter refuses every new namespace with EPERM: `unshare` and `clone`
  # with any `CLONE_NEW*` flag (user, mount, network, pid, ipc, uts,
  # cgroup, time), and `setns`; `clone3`, whose flags a filter cannot
  # read, fails with ENOSYS, which makes the C library fall back to
  # `clone` (threads and processes are made as usual). A user namespace
  # would give the process every capability inside it, and with them
  # kernel code no unprivileged process reaches otherwise; Landlock's
  # rules and the filter hold inside namespaces all the same. Enforced
  # under the name "namespaces". A policy's sandbox without it refuses a
  # start that asks for it (`[capexec:not-allowed]`).

  keepRoot @7 :Bool;
  # On a root server, the process stays root (uid 0, every capability
  # dropped, no mount namespace) instead of becoming `nobody` (see above):
  # for programs that insist on uid 0. It can then read root-only files in
  # the system directories and reach root-owned Unix sockets. No effect on
  # other servers. A policy's sandbox without it refuses a start that asks
  # for it (`[capexec:not-allowed]`).

  leaveOutSecrets @8 :Bool;
  # A root that contains a secret file of the server (see above) is split
  # instead of refused: it gives its access to each of its entries but the
  # one leading to the secret, and so on down to the secret, which is left
  # out; the directories on the way are not roots (nothing can be made or
  # removed in them), a symbolic link among the entries is not followed
  # (its target has what its own roots give it), and an entry that vanishes
  # meanwhile is not a root. Stricter than the root asked for, never
  # weaker: for a client whose roots come from elsewhere (the Codex bridge:
  # `/tmp` writable, every directory of `/` readable). More than 4096 roots
  # in all fail the start with `[capexec:not-allowed]`, as without it.
  # Servers from before it ignore it and refuse such a root.

  readOnlyInside @9 :List(Data);
  # Paths inside a writable root (or the writable working directory) that
  # stay read-only with all below them, while the root around them stays
  # writable as a whole (new entries beside them can be made): Codex's
  # `.git` inside a writable workspace. Each is mounted read-only over
  # itself in a mount namespace of the process's own (a bind mount with
  # `MOUNT_ATTR_RDONLY`, idmapped as its root is when the process runs as
  # `nobody`): writing, making or removing anything beneath it fails with
  # EROFS, whatever path or link reaches it, and it cannot be removed,
  # renamed or replaced (EBUSY), nor unmounted (the process holds no
  # capability, and mounts it did not make are locked in any namespace it
  # makes). Paths are resolved on the server (symbolic links followed) and
  # must exist (`[capexec:invalid-argument]` otherwise); one outside every
  # writable root is read-only already and is not mounted. It needs a root
  # server with CAP_SYS_ADMIN and a kernel with `open_tree` and
  # `mount_setattr` (Linux 5.12): elsewhere a start that asks for it is
  # refused with `[capexec:unsupported]` unless `bestEffort` (then
  # `notEnforced` says "read-only-inside"). Servers that can list the
  # feature "sandbox-read-only-inside" in `ExecutorInfo.features`; a
  # client of a server without it splits the root instead (as
  # `leaveOutSecrets` splits one around a secret). Enforced under the name
  # "read-only-inside". Servers from before it ignore it.
}

enum SandboxNetwork {
  none @0;
  # No IP socket can be made (TCP, UDP, raw), nor netlink, packet or vsock
  # ones; Unix sockets and socket pairs work (abstract Unix sockets only
  # within the sandbox).
  all @1;
  # The server host's network.
}

struct Limits {
  # Limits of the whole process tree, enforced by its cgroup. 0: no limit.

  memoryBytes @0 :UInt64;
  # Memory the tree may use (page cache included, no swap). Beyond it the
  # kernel kills a process of the tree; see `ExitStatus.killedByMemoryLimit`.

  maxPids @1 :UInt32;
  # Processes and threads the tree may have at once; a fork beyond fails
  # (EAGAIN), so a fork bomb fails fast.

  cpuMillis @2 :UInt32;
  # CPU time the tree may use, in thousandths of one CPU per period (500:
  # half a CPU, 2000: two). At least 10 (the kernel's least quota, 1 ms in
  # each 100 ms period): 1 to 9 fail the start, or `restrict` for a
  # policy's limits, with `[capexec:invalid-argument]`, never run at 10
  # while saying less. `Confinement.limits.cpuMillis` is the value asked.

  bestEffort @3 :Bool;
  # Start even if the server cannot enforce them, and say so in
  # `ProcessInfo.confinement.notEnforced`.
}

enum ProcessTracking {
  processGroup @0;
  # The process group (a terminal: the session): what leaves it is not
  # seen, nor ended.
  cgroup @1;
  # A cgroup of its own: everything the process starts. On a server that
  # may make namespaces (root), the process also gets a cgroup namespace
  # rooted at that cgroup, and the server turns on the cgroup2 hierarchy's
  # `nsdelegate` (as systemd mounts it) if it is off: the kernel then
  # refuses, with ENOENT, any move of the process or what it starts to a
  # cgroup outside (the hierarchy's root, another process's cgroup) by
  # `cgroup.procs`, and any change to its own cgroup's limits from inside
  # ("cgroup-namespace" among what is enforced). An unsandboxed child of a
  # root server still holds every capability: it could enter another
  # cgroup namespace (`setns`, `nsenter -t 1 -C`) or ask a process outside
  # to move it; a sandbox is what confines a process against itself.
}

struct Confinement {
  # What the server enforced for one process.

  tracking @0 :ProcessTracking;

  sandbox @1 :Sandbox;
  # The sandbox as applied, every default made explicit (`noSystemRoots`
  # and `readOnlyCwd` set, every root listed); null if not sandboxed.

  limits @2 :Limits;
  # The limits in force (after every policy).

  enforced @3 :List(Text);
  # What is enforced, by name: "cgroup", "cgroup-namespace", "filesystem",
  # "network-tcp", "network-sockets", "scope-signals",
  # "scope-abstract-sockets", "no-new-privs", "capabilities",
  # "unprivileged-user", "io-uring", "kernel-calls",
  # "namespaces", "server-isolation", "limit-memory", "limit-pids",
  # "limit-cpu".
  # Clients must ignore names they do not know.

  notEnforced @4 :List(Text);
  # What was asked for (best effort) but is not enforced, by the same
  # names.
}

# ---------------------------------------------------------------------------
# Administration (`capexec serve --admin unix:PATH`)
# ---------------------------------------------------------------------------
#
# The operator's view of every process a server holds, whoever started it.
# `Admin` is the bootstrap of the admin socket alone (a Unix socket created
# mode 0600, given by `--admin`); no method of any other interface returns
# one, so a client of the ordinary listeners can never reach it. A process
# is named by its pid, which is unique among the processes a server holds
# at once. Nothing here carries tokens, environment values, working
# directories or output: a record says what `ps` would.

interface Admin {
  list @0 () -> (processes :List(ProcessRecord));
  # Every process the server holds (running, or finished and not yet
  # released by its owner, or parked after a detach), in pid order.

  observe @1 (pid :UInt32) -> (view :Process);
  # An observer facet of the process (see `Process.observer`): `read`,
  # `subscribe`, `info` and `observer` only; it does not keep the process
  # alive. Errors: `[capexec:invalid-argument]` for a pid the server does not
  # hold.

  terminate @2 (pid :UInt32) -> (wasRunning :Bool);
  # Terminates the process's tree (SIGTERM, then SIGKILL after the usual
  # grace) as `Process.terminate` does, answering as it does (`wasRunning`
  # is its `running`); its owner sees it exit. Errors:
  # `[capexec:invalid-argument]` for a pid the server does not hold.

  upgrade @3 () -> ();
  # Re-executes the server, in the same process, into the binary now at
  # the path it was started from, handing over its listeners, its cgroups
  # and every detachable process (`Process.detachable`) with its pipes or
  # terminal, its retained output and sequence numbers, its stdin queue and
  # write ids, and its restore token and grace (counted anew). The new
  # binary is asked first, with the server's own arguments (`capexec serve
  # ARGS --handover-check`); the answer
  # comes once it said yes, before anything is handed over; from then on
  # the server accepts no connection on any listener (one made after the
  # answer waits in the backlog for the new binary). Then every
  # connection (this one too) is closed with the reason "the server is
  # upgrading"; a client that restores its processes
  # after reconnecting loses no byte and repeats none. Processes no one
  # can restore (not detachable) end as on any lost connection. Errors
  # (the server keeps serving as before): `[capexec:unavailable]` when the
  # new binary cannot take the hand-over (the sentence says what it
  # answered), when the server cannot be upgraded in place (one that runs
  # logins as users), or when it was not started by `capexec serve`.

  lastUpgrade @4 () -> (failure :Text);
  # Null, unless the upgrade that started this server's binary did not
  # execute the new binary: the exec failed after `upgrade` had answered
  # (the file removed or replaced between its check and the exec), the
  # server re-executed the binary it ran before, which took everything
  # back and serves on, and `failure` says why the new one did not run
  # (as "cannot execute PATH: REASON"). Null too for a server no upgrade
  # started. On a server that runs logins as users this is its monitor's
  # upgrade (a user's worker that goes back to its binary says so in the
  # server's log only). `capexec upgrade` asks once it has reconnected,
  # and fails if it is set; a server from before this method answers
  # `unimplemented`.
}

struct ProcessRecord {
  pid @0 :UInt32;
  argv @1 :List(Data);
  # As started (`StartParams.argv`), whole if its arguments' bytes total at
  # most 4,096; else cut to exactly 4,096 bytes in all, the "..." that
  # ends the last kept argument included (the arguments that fit in 4,093
  # bytes, then the start of the next one and "...").

  environment @2 :Text;
  # The environment of the server it runs in ("local": this server's own).

  startedMs @3 :UInt64;
  # When it was started, in milliseconds since the Unix epoch.

  state :union {
    running @4 :Void;
    exited @5 :ExitStatus;
  }

  owner :union {
    connection @6 :Text;
    # The connection holding its capability: the server's connection number
    # (as its log names it) and the peer ("unix" or the TCP address).
    detached @7 :Void;
    # Parked after `Process.detach` until someone restores it.
  }

  cpuMs @8 :UInt64;
  # User plus system CPU time of the child so far (0 once it has exited).

  memoryBytes @9 :UInt64;
  # Resident memory of the child now (0 once it has exited).
}

# ---------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------
#
# Conventions of every `Directory` call:
# - Paths are `Data` (bytes without NUL, at most 4,096), relative to the
#   directory: "" and "." name the directory itself, "a/b" a path beneath
#   it. The kernel resolves every path beneath the directory
#   (`openat2(RESOLVE_BENEATH | RESOLVE_NO_XDEV | RESOLVE_NO_MAGICLINKS)`):
#   an absolute path, ".." past the directory, a symlink that points out
#   (also one swapped in while the call runs) and /proc's magic links all
#   fail with `[capexec:outside-directory]`. So does a path through a mount
#   point beneath the directory ("crosses a mount point beneath the
#   directory"): another file system, or a bind mount, which may lead
#   anywhere, is not part of it. Calls stay on the directory's own mount: a
#   walk reports a mount point with an `error` and does not enter it, a
#   recursive `remove` or `copy` fails when it reaches one (what it did
#   before stays done) and never touches what is mounted there, and a bind
#   mount over a file is `busy` to remove or replace. Open a file system
#   mounted beneath as a directory of its own (`Executor.directory`).
#   Symlinks that stay inside are followed,
#   except for the last component where a call says otherwise (`remove`,
#   `rename`, `symlink`, `readlink`, `stat` with `noFollow`, walks). The
#   final component of a call that creates, removes or renames is always
#   operated on relative to its parent directory's descriptor; nothing is
#   ever joined into a path string.
# - Errors say what and where in one line (`read "a/b": not found`), tagged
#   (see the codes at the top of this file): `not-found`, `not-a-directory`,
#   `is-a-directory`, `exists`, `not-empty`, `too-large`, `conflict`,
#   `outside-directory`, `permission-denied`, `no-space`, `busy`,
#   `invalid-argument`, `forbidden` (a read-only directory), `limit`,
#   `internal`.
# - Limits: one-shot `readFile` and `writeFile` carry at most 4 MiB of
#   data; an upload's `write` at most 1 MiB. One connection may have at most
#   64 transfers (uploads not yet done or dropped, downloads, lists and
#   walks in progress) and 32 watches at once; more fail with
#   `[capexec:limit]`. Each `Directory` capability, transfer, level a walk
#   is in and watch holds a descriptor, and each transfer 2 MiB of memory,
#   counted against the connection (at most half of the server's share)
#   and the server (a share of its descriptor limit, 512 MiB): past either,
#   the call fails with `[capexec:limit]`; the last quarter of the
#   server's share is kept for connections that hold little (16
#   descriptors, 8 MiB), so one client's directory still opens while
#   others hold the rest. Through a chain these count at the server that
#   serves the directory, where the link is one connection.
# - Blocking file system calls run off the server's RPC thread, at most 16
#   of one connection at once (4,096 more wait, then `[capexec:limit]`) and
#   256 of the server: a slow disk or a huge tree delays only the calls
#   that touch it. A transfer waiting for its client (a sink that does not
#   acknowledge, an upload's next chunk) holds no thread.
# - Only regular files are read and written: a FIFO, socket or device
#   where a file is meant fails with `[capexec:invalid-argument]` ("not a
#   regular file"), and is never opened for writing, replaced or removed
#   in a file's place.

interface Directory {
  # A directory on the server's machine and everything beneath it, and
  # nothing else: the capability cannot name a path outside it. Obtained
  # from `Executor.directory`, narrowed with `subdirectory`, attenuated
  # with `readOnly`.

  stat @0 (path :Data, noFollow :Bool) -> (stat :FileStat);
  # What `path` is. With `noFollow` a final symlink is described itself
  # (lstat), else the file it leads to (within the directory).

  list @1 (path :Data, sink :EntrySink) -> (entries :UInt64);
  # The entries of directory `path` (not "." and ".."), pushed into `sink`
  # in batches (at most 1,024 entries each), in the order the file system
  # returns them, each with its `stat` (symlinks not followed). The answer
  # comes once every batch was pushed and acknowledged, and counts them.
  # Memory on the server stays bounded whatever the directory's size: a
  # slow sink slows the listing. A sink that throws ends it with that
  # error. Counts as a transfer (see the limits above).

  walk @2 (path :Data, options :WalkOptions, sink :EntrySink) -> (entries :UInt64, truncated :Bool);
  # Every entry beneath directory `path`, depth first, pushed like `list`;
  # `DirEntry.path` is relative to `path`. Symlinks are reported, never
  # followed; a directory that is replaced while the walk runs (by a
  # symlink, say) is reported with an `error` and not entered, and a
  # directory that cannot be read is reported with its `error`; the walk
  # goes on. `truncated` tells that `maxEntries` ended it. A directory
  # being entered holds one descriptor of the server per level.

  readFile @3 (path :Data, offset :UInt64, length :UInt64) -> (data :Data, stat :FileStat);
  # Bytes `offset` .. `offset + length` of file `path` (fewer at its end;
  # none past it), or with `length` 0 everything from `offset` to the end.
  # `stat` describes the file as it was opened. At most 4 MiB: a `length`
  # over that fails with `[capexec:limit]`, and a `length` 0 read of more
  # with `[capexec:too-large]` (use `download`). `[capexec:is-a-directory]`
  # for a directory.

  writeFile @4 (path :Data, data :Data, options :WriteOptions) -> (stat :FileStat);
  # Makes `data` (at most 4 MiB, else `[capexec:limit]`) the content of
  # file `path`, as `options` say, and answers with the new file's `stat`.
  # By default atomically: the content is written to a new file that has
  # no name (O_TMPFILE; on file systems without it, a hidden temporary
  # ".capexec-*.tmp" in the same directory, removed on every failure),
  # which then replaces the target in one rename. Readers see the old
  # content or the new, never a mix; if the server dies first, the target
  # is untouched (and an unnamed file vanishes with it; only a hidden
  # temporary, on a file system without O_TMPFILE, can stay behind, until
  # a server's first write into that directory removes it (or a later
  # one, while it is younger than 10 s): a writer holds a lock on its
  # temporary for as long as it lives, and temporaries nobody holds and
  # nobody changed for 10 s are swept; writes in progress never are). A
  # symlink as the target is replaced, not followed. Durability is
  # `sync`'s: without it the new content survives the server's death (it
  # is in the kernel's page cache, written back as the kernel sees fit),
  # not a power loss.

  upload @5 (path :Data, options :WriteOptions, size :UInt64, sizeKnown :Bool) -> (sink :UploadSink);
  # `writeFile` for content of any size, streamed: the client pushes the
  # content into `sink` and commits it with `UploadSink.done`. The target's
  # conditions (`exclusive`, `mustExist`, `ifVersion`, its parent directory)
  # are checked now and again at `done`. Until `done` answers, nothing is
  # visible: a sink released without `done`, a connection that breaks, a
  # write that fails or, with `sizeKnown`, a total other than `size` leave
  # the old file (or no file) as it was, and no temporary behind. That
  # total fails with `[capexec:invalid-argument]`: more bytes than `size`
  # fail the write that goes past it (or a later call, `done` at the
  # latest), fewer fail `done` ("N bytes arrived, SIZE were announced").
  # Memory stays bounded: writes are acknowledged as the disk takes them.
  # With `inPlace` the writes go to the target as they come (not atomic),
  # and an aborted upload leaves what was written. Counts as a transfer
  # until done or released.

  download @6 (path :Data, offset :UInt64, length :UInt64, sink :ByteSink) -> (size :UInt64, stat :FileStat);
  # Pushes bytes `offset` .. `offset + length` of file `path` (`length` 0:
  # to the end) into `sink` in chunks of at most 256 KiB, paced by the
  # sink's stream flow control, and answers once every chunk has been
  # acknowledged, with the number of bytes and the `stat` of the file as
  # opened. A file that grows while it is read is read up to the size it
  # had when opened. A sink that throws ends the download with that error.
  # Counts as a transfer.

  mkdir @7 (path :Data, recursive :Bool, mode :UInt32 = 511) -> ();
  # Creates directory `path` with permission bits `mode` (less the server's
  # umask; 511 is 0o777). `recursive`: its missing parents too, and an existing directory
  # is no error (mkdir -p). Else `[capexec:exists]` if it exists and
  # `[capexec:not-found]` without its parent.

  remove @8 (path :Data, recursive :Bool, missingOk :Bool) -> (removed :UInt64);
  # Removes a file, a symlink (not what it points to) or an empty
  # directory; with `recursive` a directory and everything in it (never
  # following symlinks; `[capexec:not-empty]` without it). Answers how many
  # entries were removed. `missingOk`: a missing `path` removes 0 and is no
  # error. The directory itself ("" or ".") cannot be removed
  # (`[capexec:invalid-argument]`).

  rename @9 (from :Data, to :Data, noReplace :Bool) -> ();
  # Renames `from` to `to` (both beneath this directory) atomically,
  # replacing what `to` names unless `noReplace` (`[capexec:exists]`).
  # A directory replaces only an empty directory (`[capexec:not-empty]`).

  copy @10 (from :Data, to :Data, options :CopyOptions) -> (copied :UInt64);
  # Copies file `from` (or with `recursive` a tree) to `to`, on the server
  # (copy_file_range: no data crosses the connection; reflinks where the
  # file system makes them). Each file is written atomically as by
  # `writeFile`; symlinks are copied as symlinks. Answers the number of
  # entries copied, the top one included: 1 for a file or a symlink, and
  # for a tree the directory itself plus every directory, file and symlink
  # beneath it (an empty directory copies 1). `to` is the copy's own name,
  # not a directory to put it in. A directory without `recursive` fails
  # with `[capexec:is-a-directory]`; a directory into itself with
  # `[capexec:invalid-argument]`.

  symlink @11 (target :Data, path :Data) -> ();
  # Creates symlink `path` pointing to `target`, stored as given (it may
  # point anywhere; following it later is confined like any path).
  # `[capexec:exists]` if `path` exists.

  readlink @12 (path :Data) -> (target :Data);
  # The target of symlink `path`, as stored. `[capexec:invalid-argument]`
  # if `path` is not a symlink.

  setPermissions @13 (path :Data, mode :UInt32) -> ();
  # Sets the permission bits (07777) of `path` (a symlink's target, within
  # the directory).

  setTimes @14 (path :Data, accessedNs :Int64, modifiedNs :Int64) -> ();
  # Sets the access and modification times of `path` (nanoseconds since
  # the Unix epoch; a symlink's target, within the directory).

  canonicalize @15 (path :Data) -> (path :Data);
  # `path` with ".", ".." and symlinks resolved, relative to this directory
  # ("" for the directory itself). It must exist.

  subdirectory @16 (path :Data) -> (dir :Directory);
  # The directory `path` as a capability of its own, confined to it: it
  # cannot name its parent. A subdirectory of a read-only directory is
  # read-only. Pipelined: `subdirectory(p).readFile(q)` costs no extra trip.

  readOnly @17 () -> (dir :Directory);
  # The same directory, read-only: `stat`, `list`, `walk`, `readFile`,
  # `download`, `readlink`, `canonicalize`, `subdirectory`, `readOnly`,
  # `watch`, `info`, `readFiles` and `search` work; every other call fails with
  # `[capexec:forbidden]` naming the call, and so do the same calls on
  # everything derived from it.

  watch @18 (path :Data, options :WatchOptions, sink :WatchSink) -> (watch :Watch);
  # Reports changes beneath directory `path` (inotify) to `sink` until
  # `watch` is released or the sink throws. Events come in batches, paced
  # by the sink's flow control, and are coalesced (repeated `modified`
  # events of one file in one batch become one). Nothing is lost silently:
  # when the kernel drops events (its queue overflowed) or the client is
  # too slow (16,384 events wait), the client gets an `overflow` event and
  # should look again (`list`, `walk`). The answer comes once the watch is
  # in place: changes after it are reported. If the watched directory is
  # removed or moved away, a `gone` event is the last. Counts against the
  # connection's 32 watches. Every watch of the server shares one inotify
  # instance, and together they hold at most the server's share of the
  # user's inotify watches (one per directory watched; by default half of
  # `fs.inotify.max_user_watches`): a watch that would need more fails with
  # `[capexec:limit]`, and a recursive watch that could not watch every
  # directory beneath it (then or later) reports an `overflow` for what it
  # could not.

  info @19 () -> (info :DirectoryInfo);
  # Where this directory is and what it allows.

  executor @20 () -> (executor :Executor);
  # An executor whose processes run inside this directory and can write
  # only there: hand an agent a directory, and everything it runs and
  # touches stays inside it. It is the executor this directory came from
  # (for a directory of a restricted executor: that one), restricted with
  # `cwdRoots` = this directory and a `sandbox` whose only writable root is
  # this directory (none for a read-only directory, whose processes may
  # read it only), the system directories read-only and no network (so
  # its `dial` and `listen` allow no address either); so
  # everything of `restrict` holds (narrowing only, `[capexec:not-allowed]`
  # for a start asking for more, `[capexec:unsupported]` where the kernel
  # cannot enforce the sandbox). A start without `cwd` runs in this
  # directory; a relative `cwd` is taken from it. Its `directory` hands out
  # only directories beneath this one. The directory is named by its path
  # when the call is made (the sandbox's rules are opened from it).
  # Through a forwarding hop the call is forwarded, pipelined: the executor
  # is the far end's. Feature "directory-executor".

  writeFiles @21 (files :List(FileContent)) -> (outcomes :List(WriteOutcome));
  # Many small `writeFile`s in one call (a tree of small files costs a
  # round trip per batch, not per file): each file is written exactly as
  # `writeFile` would write it, atomically and with its own options, in
  # the order given, and has its own outcome at the same index; a file
  # that fails does not stop the others. At most 1,024 files and 4 MiB of
  # data in all, else the call fails with `[capexec:limit]` and nothing
  # is written. Feature "file-batches".

  readFiles @22 (paths :List(Data)) -> (outcomes :List(ReadOutcome));
  # Many small whole-file `readFile`s in one call: each file is read as
  # `readFile(path, 0, 0)` reads it, in the order given, with its own
  # outcome at the same index. At most 1,024 paths, else
  # `[capexec:limit]`. The answer carries at most 4 MiB of data in all: a
  # file that would take it past that fails alone with
  # `[capexec:too-large]` (read it on its own). Feature "file-batches".

  search @23 (path :Data, options :SearchOptions) -> (result :SearchResult);
  # Searches the content of the regular files beneath directory `path` for
  # a regular expression, on the server: only the matching lines cross the
  # connection. The files are those `walk(path, ...)` would report with
  # `options`' `maxDepth`, `include` and `exclude` (depth first, in the
  # order the file system gives them; `include` chooses the files searched,
  # `exclude` prunes), of kind `file`: symlinks are never followed (neither
  # to a file nor into a directory), mount points beneath are not entered,
  # and each file is opened beneath the directory without following a
  # symlink swapped in meanwhile. Each file's content is split into lines
  # at "\n" (the "\n" not part of the line; a "\r" before it is), and the
  # pattern is matched against each line on its own (never across lines):
  # a line with a match gives one `SearchMatch` (its first match), in file
  # order. A file holding a NUL byte is binary and skipped
  # (`binarySkipped`); a file larger than `maxFileBytes` is skipped
  # without being read (`tooLargeSkipped`); a file or directory that
  # cannot be opened or read is skipped (`unreadable`, and the first such
  # error in `firstError`); the search goes on past each. It stops once
  # `maxMatches` lines matched (`truncated`: there may be more). A
  # malformed pattern, or one too large to compile, fails with
  # `[capexec:invalid-argument]` before any file is read, as do bad globs
  # (see `WalkOptions`). A read, allowed on read-only directories. Runs on
  # the server a bounded step at a time (at most 256 files or 4 MiB of
  # content each), holds a descriptor per level it is in, as `walk` does,
  # and counts as a transfer. Feature "file-search".
}

struct SearchOptions {
  # What `Directory.search` looks for, and where.
  pattern @0 :Text;
  # A regular expression in the syntax of the Rust `regex` crate
  # (https://docs.rs/regex, Unicode-aware; `(?i)` and the other inline
  # flags work), at most 4,096 bytes, compiled with a size limit of 1 MiB
  # (and matched with a cache of at most 1 MiB).
  # Matched against the bytes of a line: bytes that are not UTF-8 match
  # only escapes such as `(?-u:\xff)`, never `.`.
  caseInsensitive @1 :Bool;
  # Letters match either case (as the `i` flag does).
  maxDepth @2 :UInt32;
  include @3 :List(Data);
  exclude @4 :List(Data);
  # As in `WalkOptions`: which files are searched, relative to `path`.
  maxMatches @5 :UInt32;
  # Stop after this many matching lines. 0, or more than 1,000: 1,000.
  maxFileBytes @6 :UInt64;
  # Skip files larger than this. 0, or more than 4 MiB: 4 MiB.
}

struct SearchResult {
  matches @0 :List(SearchMatch);
  # In the order they were found.
  filesSearched @1 :UInt64;
  # Regular files read and matched (binary ones not counted).
  binarySkipped @2 :UInt64;
  tooLargeSkipped @3 :UInt64;
  unreadable @4 :UInt64;
  # Files and directories skipped (see `search`).
  firstError @5 :Text;
  # Empty, or why the first unreadable one could not be read.
  truncated @6 :Bool;
  # `maxMatches` ended the search.
}

struct SearchMatch {
  # A line with a match.
  path @0 :Data;
  # The file, relative to the searched directory.
  lineNumber @1 :UInt64;
  # 1 for the file's first line.
  lineBytes @2 :UInt64;
  # The line's whole length in bytes.
  text @3 :Data;
  # The line; where it is longer than 512 bytes, the 512 bytes of it that
  # begin 128 bytes before the match (or at the line's start, or earlier
  # so as to end at the line's end).
  textOffset @4 :UInt64;
  # Where `text` begins in the line (0 unless cut).
  matchStart @5 :UInt64;
  matchEnd @6 :UInt64;
  # The match: bytes `matchStart .. matchEnd` of the line.
}

struct FileContent {
  # One file of `Directory.writeFiles`.
  path @0 :Data;
  data @1 :Data;
  options @2 :WriteOptions;
}

struct WriteOutcome {
  # What became of one file of `Directory.writeFiles`.
  union {
    stat @0 :FileStat;
    # Written: the new file's stat, as `writeFile` answers it.
    failure @1 :Text;
    # Not written (the target as it was): the error `writeFile` would have
    # failed with, tagged the same way (`read "a": not found [capexec:not-found]`).
  }
}

struct ReadOutcome {
  # What one file of `Directory.readFiles` held.
  union {
    file :group {
      data @0 :Data;
      stat @1 :FileStat;
      # As `readFile` answers them.
    }
    failure @2 :Text;
    # The error `readFile` would have failed with, tagged the same way.
  }
}

struct FileStat {
  kind @0 :FileKind;
  size @1 :UInt64;
  # In bytes (a symlink: its target's length).
  permissions @2 :UInt32;
  # The mode's permission bits (07777).
  modifiedNs @3 :Int64;
  accessedNs @4 :Int64;
  changedNs @5 :Int64;
  # Times in nanoseconds since the Unix epoch (`changed`: the inode's).
  uid @6 :UInt32;
  gid @7 :UInt32;
  links @8 :UInt64;
  inode @9 :UInt64;
  device @10 :UInt64;
  version @11 :Data;
  # Opaque (at most 64 bytes; compare for equality only): changes whenever
  # the content could have changed (it is made of the device, inode, size,
  # and modification and change times in nanoseconds). Give it as
  # `WriteOptions.ifVersion` to write only over this very content.
}

enum FileKind {
  unknown @0;
  file @1;
  directory @2;
  symlink @3;
  fifo @4;
  socket @5;
  charDevice @6;
  blockDevice @7;
}

struct DirEntry {
  path @0 :Data;
  # `list`: the entry's name; `walk`: its path relative to the walked
  # directory.
  stat @1 :FileStat;
  # Of the entry itself (a symlink is not followed). Null when `error` says
  # why it could not be had.
  linkTarget @2 :Data;
  # A symlink's target, as stored.
  error @3 :Text;
  # Empty, or why this entry (a directory `walk` could not enter, an entry
  # gone before its stat) is incomplete.
}

struct WalkOptions {
  maxDepth @0 :UInt32;
  # 1: the entries of the directory only; 2: theirs too... 0: up to the
  # server's limit of 256 levels (deeper directories are reported, not
  # entered).
  maxEntries @1 :UInt64;
  # Stop after this many entries (`truncated`); 0: no limit.
  include @2 :List(Data);
  # Glob patterns matched against each entry's relative path (`*` does not
  # cross "/", `**` does, `?`, `[...]`, `{a,b}`): only matching entries are
  # reported (directories are entered all the same). Null or empty: every
  # entry. `**` as a whole component matches zero or more directories:
  # `**/x` matches `x` at the top as well as `a/b/x`, `a/**/x` matches
  # `a/x`, and `a/**` everything below `a` but not `a` itself.
  exclude @3 :List(Data);
  # Entries matching any of these are neither reported nor entered. At most
  # 256 patterns in all, each at most 4,096 bytes
  # (`[capexec:invalid-argument]`, as for a malformed pattern).
}

struct WriteOptions {
  # How `writeFile` and `upload` treat the target. The defaults: create or
  # replace, atomically, keeping a replaced file's permissions.

  exclusive @0 :Bool;
  # Fail with `[capexec:exists]` if the target exists (decided atomically
  # when the content is committed: of two exclusive writers, one wins).
  mustExist @1 :Bool;
  # Fail with `[capexec:not-found]` unless the target exists.
  inPlace @2 :Bool;
  # Not atomic: truncate the existing file (or create it) and write into it,
  # keeping its inode, hard links and owner; readers may see partial
  # content. Only for files that must keep their identity.
  permissions :union {
    keep @3 :Void;
    # A replaced file's permission bits; a new file's are 0666 less the
    # server's umask.
    set @4 :UInt32;
    newFile @10 :UInt32;
    # A replaced file keeps its permission bits; a new file gets these
    # (the low nine bits only), less the server's umask: what `cp` and
    # `scp` do without `-p`.
  }
  ifVersion @5 :Data;
  # Non-empty: write only if the target's `FileStat.version` is this one
  # (checked when the content is committed, under the server's commit
  # lock, so that of two writers holding the same version only one
  # succeeds); else `[capexec:conflict]`, naming the file. A missing file
  # is a conflict too.
  createParents @6 :Bool;
  # Create missing parent directories (mode 0777 less the umask) first.
  modified :union {
    now @7 :Void;
    at @8 :Int64;
    # The new file's modification time (ns since the epoch), set before it
    # becomes visible.
  }
  sync @9 :Bool;
  # Flush the file and its directory to stable storage before answering
  # (fsync), so the new content survives a power loss.
}

struct CopyOptions {
  recursive @0 :Bool;
  # Copy a directory and everything in it.
  noReplace @1 :Bool;
  # Fail with `[capexec:exists]` where the copy would replace something.
  preserve @2 :Bool;
  # Keep permission bits and modification times (else files get the
  # source's permission bits and directories 0777, less the server's
  # umask, and the time of the copy).
}

struct WatchOptions {
  recursive @0 :Bool;
  # Watch subdirectories too, including those created later (their
  # entries made before their watch was in place are reported `created`).
}

struct WatchEvent {
  kind @0 :WatchEventKind;
  path @1 :Data;
  # Relative to the watched directory ("" for the directory itself).
  toPath @2 :Data;
  # `renamed`: the new path.
  isDirectory @3 :Bool;
}

enum WatchEventKind {
  created @0;
  modified @1;
  # Content written (reported when written, and when the file is closed).
  removed @2;
  renamed @3;
  # Within the watched tree, `path` to `toPath`; a rename into the tree is
  # `created`, one out of it `removed`.
  attributes @4;
  # Permissions, owner or times changed.
  overflow @5;
  # Events were lost (the kernel's queue, or a client too slow): look again.
  gone @6;
  # The watched directory was removed or moved away; the last event.
}

struct DirectoryInfo {
  path @0 :Data;
  # The directory's absolute path on the server's machine, as the kernel
  # names it now (after renames).
  readOnly @1 :Bool;
}

interface EntrySink {
  # Implemented by the client of `list` and `walk`.
  push @0 (entries :List(DirEntry)) -> stream;
  # A batch of entries. Returning acknowledges it; throwing ends the call.
}

interface ByteSink {
  # Implemented by the client of `download`.
  write @0 (data :Data) -> stream;
  # The next chunk. Returning acknowledges it; throwing ends the download.
}

interface UploadSink {
  # Returned by `upload`; implemented by the server.
  write @0 (data :Data) -> stream;
  # Appends the next chunk (at most 1 MiB, else `[capexec:limit]`). A
  # failed write (the disk is full...) fails this call or a later one, and
  # the upload with it.
  done @1 () -> (stat :FileStat);
  # Commits the upload once every earlier write has reached the file: it
  # replaces the target as `writeFile` would (with its checks), and answers
  # with the new file's `stat`. After `done`, or a failure, further calls
  # fail with `[capexec:invalid-argument]`.
}

interface WatchSink {
  # Implemented by the client of `watch`.
  push @0 (events :List(WatchEvent)) -> stream;
  # A batch of events, in the order they happened. Returning acknowledges
  # it; throwing ends the watch.
}

interface Watch {
  # Releasing this capability ends the watch.
}

# ---------------------------------------------------------------------------
# Ports: connections and listeners on the executor's machine
# ---------------------------------------------------------------------------
#
# `Executor.dial` and `Executor.listen` open sockets on the
# machine where the executor runs its processes, as `ssh -L` and `ssh -R`
# do; `Process.dial` and `Process.listen` do the same for as long as a
# process's capability is held. Addresses are text:
#   tcp:HOST:PORT  HOST is a name (resolved on that machine), an IPv4
#                  address, or an IPv6 address in brackets ("[::1]"; an
#                  unbracketed one, "tcp:::1:80", is refused);
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
# shared fairly, at least 16 KiB each), and write at most 256 KiB per
# call, gathering small writes of their program into one.
#
# Failures are never a clean end of file: a connection reset by its peer,
# a failed read or write, a `fail` from the client, the client's
# `fromSocket` failing or being released, or the release of the
# `PortConnection`, of the `PortListener` it came from or of the
# `Process` it was made through, reset the socket
# (TCP: RST, so the socket's peer reads ECONNRESET; a Unix socket's peer
# sees it closed) and report the failure
# on both sinks: `fromSocket` gets `fail` with the reason, and calls on
# `toSocket` fail with `[capexec:socket-failed]` and the reason.

struct PortDialParams {
  # `Executor.dial` and `Process.dial`. (Once their parameter list: the
  # struct is encoded as the list was, so old peers speak it unchanged.)

  address @0 :Text;
  # Where to connect, as above.

  fromSocket @1 :PortSink;
  # The caller's sink for what the socket's peer sends.

  direct @2 :Bool;
  # The caller will carry the connection's bytes over a direct channel
  # of its own if the server grants one (see "Direct channels" below):
  # set it only when the caller can open a new connection to the Unix
  # socket this Cap'n Proto connection came through.
}

struct PortDialResults {
  connection @0 :PortConnection;
  # Holding it keeps the connection open.

  toSocket @1 :PortSink;
  # The server's sink: what is written to it goes to the socket's peer.

  info @2 :PortConnectionInfo;

  directTicket @3 :Data;
  # Null unless `direct` was asked for and granted: then the 32 bytes
  # that claim the connection's direct channel, and `toSocket` carries
  # no bytes (see "Direct channels").
}

# Direct channels.
#
# A port connection's bytes may skip Cap'n Proto: the server relays them
# between the socket and a connection of their own, kernel to kernel
# (splice(2)), with no message built or read per chunk. A server grants
# one to a `dial` that asks (`direct`) when it dials the socket itself
# (not through an upstream) and the Cap'n Proto connection is a Unix
# socket: a client on the same machine, which can open another. Never
# over TCP: a channel there would need its own login and TLS, and on
# loopback it measured no faster than the messages.
#
# The caller then opens a new connection to the same socket and writes
# the 8 bytes FF FF FF FF 63 78 64 31 (a segment count no Cap'n Proto
# message has, then "cxd1") followed by the ticket; the server answers
# the one byte 01, and from there on the channel carries the socket's
# bytes both ways. A ticket claims one channel, once, within 10 s of the
# `dial`'s answer; an unknown, used or late ticket gets its channel
# closed unanswered (as when a capability this server only passes on,
# such as an upstream's `Process`, granted the ticket). The 40 bytes must
# arrive within 10 s of the channel's connect. Until the channel is
# claimed nothing moves; a `toSocket.write` (an empty one will do) or
# `toSocket.end` before then declines it, and the sinks carry the bytes
# as without `direct`. (capexec's client declines a channel that was
# closed unanswered, or that it could not connect and send within 3 s.) A ticket neither claimed nor declined in time
# resets the connection (`fromSocket` gets `fail`). A server holds at
# most 1,024 unclaimed tickets; past that it grants none.
#
# The sinks keep the connection's meaning, so that a failure is never
# taken for an end of file: the caller half-closes its direction with
# shutdown(SHUT_WR) on the channel *and* `toSocket.end`, and the server
# shuts the socket down for writing once it has both (the channel's end
# of file alone waits for `end`, `fail` or a release). When the socket's
# peer half-closes, the server shuts the channel down for writing and
# calls `fromSocket.end`; an end of file read from the channel is clean
# only once that `end` has arrived, and a failure is `fromSocket.fail`
# as before (the channel is reset or closed too). `toSocket.write`
# on a claimed channel's connection fails with
# `[capexec:invalid-argument]` and resets it. Releasing the
# `PortConnection` closes (or resets) the socket and the channel.

struct PortListenParams {
  # `Executor.listen` and `Process.listen` (encoded as their parameter
  # list was).

  address @0 :Text;
  # Where to listen, as above.

  acceptor @1 :PortAcceptor;
  # The caller's, handed each accepted connection.
}

struct PortListenResults {
  listener @0 :PortListener;
  # Holding it keeps the socket listening.

  address @1 :Text;
  # The address it listens on, with the port the kernel chose.
}

interface PortSink {
  # One direction of a connection's bytes, implemented by the receiver.

  write @0 (bytes :Data) -> stream;
  # The next bytes, at most 1 MiB (more fails with
  # `[capexec:invalid-argument]`, and the connection is reset). capexec's
  # own senders (a server writing `fromSocket`, the client library writing
  # `toSocket`) put at most 256 KiB in one write. Returns once the receiver
  # has taken them. Once a write fails, every later call on the sink fails
  # too. Writes sent without waiting for answers count against the
  # server's bound on a connection's unanswered calls (`capexec serve
  # --max-call-memory-per-connection`), past which it closes the
  # connection.

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
  #                    "[::1]"), a block ("10.0.0.0/8", "[fd00::/8]";
  #                    IPv6 only in brackets) or
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
