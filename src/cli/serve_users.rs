//! `capexec serve --user-map FILE`: the root process binds the listeners,
//! starts the front as `--privsep-user` (the same `capexec serve`, with
//! `--front` and the listeners' descriptors), and stays as the monitor,
//! which starts each user's worker (see `capexec::users`).

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use capexec::net::activation::InheritedSocket;
use capexec::net::{
    Address, BoundUnixSocket, BoundUnixSocketState, Token, UsersConfig, bind_unix_for_another,
};
use capexec::sys::low_slots::KeepsItsSlot;
use capexec::users::{
    Account, Evidence, MonitorSetup, MonitorUpgrade, Program, TokenCheck, UserMap, WorkerRecord,
    spawn_as,
};

use crate::cli::EXIT_CAPEXEC_FAILURE;

/// `--front FD` and `--monitor-requests FD`: the monitor's sockets;
/// `--failed-upgrade TEXT`: what it says of its last upgrade.
pub fn front_config(
    monitor: i32,
    requests: Option<i32>,
    per_user: Option<usize>,
    failed_upgrade: Option<String>,
) -> Result<UsersConfig, String> {
    let socket = inherited(monitor, "--front")?;
    let requests = requests
        .map(|fd| inherited(fd, "--monitor-requests"))
        .transpose()?;
    Ok(UsersConfig {
        monitor: Arc::new(socket),
        requests: requests.map(|fd| Arc::new(Mutex::new(fd))),
        connections_per_user: per_user.unwrap_or(UsersConfig::CONNECTIONS_PER_USER),
        failed_upgrade,
    })
}

/// `--listen-fd FD[=NAME]`: the listening sockets the monitor bound.
pub fn front_sockets(given: &[String]) -> Result<Vec<InheritedSocket>, String> {
    given
        .iter()
        .map(|text| {
            let (number, name) = text.split_once('=').unwrap_or((text, "listener"));
            let fd = number
                .parse::<i32>()
                .map_err(|_| format!("--listen-fd {text}: not a descriptor number"))?;
            Ok(InheritedSocket {
                fd: Arc::new(KeepsItsSlot::new(inherited(fd, "--listen-fd")?)),
                name: name.to_string(),
                path: None,
            })
        })
        .collect()
}

/// Descriptor `fd`, passed by the process that started this one (with
/// `flag`, which the error names).
pub fn inherited(fd: i32, flag: &str) -> Result<OwnedFd, String> {
    // SAFETY: F_GETFD reads a flag, and fails cleanly on a closed number.
    if fd < 3 || unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
        return Err(format!(
            "{flag} {fd}: no open descriptor {fd} was inherited"
        ));
    }
    // SAFETY: open (checked above), and nothing else in this process owns
    // it; made close-on-exec, so no child inherits it.
    unsafe {
        libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// The monitor: binds `listen` (Unix sockets open to every local user)
/// and `admin`, starts the front as `privsep_user`, prints the addresses,
/// and serves the front's requests until it ends; its exit code is the
/// front's. With `handover`, an upgrade's monitor: it takes the listeners
/// and workers the monitor before handed over at that descriptor instead
/// of binding, and starts a front of this binary on them.
pub fn monitor_main(
    map_file: &Path,
    privsep_user: &str,
    listen: &[Address],
    admin: Option<PathBuf>,
    tls: bool,
    handover: Option<i32>,
) -> i32 {
    capexec::users::handle_monitor_signals();
    let started =
        prepare(map_file, privsep_user, listen, tls).and_then(|prepared| match handover {
            None => bind(listen, admin)
                .and_then(|bound| Ok((bound, make_socket_dir()?, (Vec::new(), 0), None)))
                .and_then(|(bound, dir, workers, failed)| {
                    launch(prepared, bound, dir, listen, workers, failed)
                }),
            Some(fd) => take_over(fd).and_then(|(bound, dir, workers, failed)| {
                launch(prepared, bound, dir, listen, workers, failed)
            }),
        });
    match started {
        Ok(Started {
            socket,
            requests,
            setup,
            front,
            bound,
            workers,
        }) => {
            let listeners: Vec<_> = bound.logins.iter().map(|bound| &bound.listener).collect();
            let code = capexec::users::serve_monitor(
                socket,
                Some(requests),
                &listeners,
                &setup,
                front,
                workers,
            );
            drop(bound);
            code
        }
        Err(error) => {
            eprintln!("capexec: {error}");
            EXIT_CAPEXEC_FAILURE
        }
    }
}

/// `serve --user-map FILE --handover-check`: whether this binary would
/// take over as the monitor with these arguments (the map, its token
/// files and the front's user as they are now), without binding.
pub fn check_monitor(
    map_file: &Path,
    privsep_user: &str,
    listen: &[Address],
    tls: bool,
) -> Result<(), String> {
    prepare(map_file, privsep_user, listen, tls).map(drop)
}

struct Started {
    socket: OwnedFd,
    /// Where the front asks which worker a token logs in to.
    requests: OwnedFd,
    setup: MonitorSetup,
    front: nix::unistd::Pid,
    /// The listeners; their files go when the monitor ends.
    bound: Bound,
    workers: HandedWorkers,
}

/// The workers an upgrade handed over, and how many had been started.
type HandedWorkers = (Vec<WorkerRecord>, u64);

/// What the monitor reads before it binds anything (again at an upgrade).
struct Prepared {
    map: UserMap,
    tokens: Vec<(TokenCheck, Account)>,
    /// Whether the map has `cert` lines.
    certificates: bool,
    front_account: Account,
    program: Program,
}

/// The sockets the monitor binds: the Unix ones it accepts logins on
/// itself, and the TCP and admin ones the front serves (kept here too, so
/// that a new front can take them at an upgrade).
struct Bound {
    logins: Vec<BoundUnixSocket>,
    tcp: Vec<std::net::TcpListener>,
    admin: Option<BoundUnixSocket>,
}

fn prepare(
    map_file: &Path,
    privsep_user: &str,
    listen: &[Address],
    tls: bool,
) -> Result<Prepared, String> {
    let uid = nix::unistd::geteuid();
    if !uid.is_root() {
        return Err(format!(
            "--user-map needs a server started as root: it starts each login's processes as \
             that login's user, which only root can do, and this server runs as uid {uid}"
        ));
    }
    let map = UserMap::read(map_file)?;
    // Whoever may write the map may log in as anyone it names.
    {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(map_file)
            .map_err(|error| format!("--user-map {}: {error}", map_file.display()))?;
        if meta.uid() != 0 || meta.mode() & 0o022 != 0 {
            return Err(format!(
                "--user-map {}: it is uid {}'s with mode {:04o}: whoever may write it may log in \
                 as any user; make it root's and writable by root only",
                map_file.display(),
                meta.uid(),
                meta.mode() & 0o7777
            ));
        }
    }
    let mut tokens: Vec<(TokenCheck, Account)> = Vec::new();
    let mut certificates = false;
    for (evidence, account) in map.entries() {
        if account.uid.is_root() {
            return Err(format!(
                "--user-map {}: a line maps logins to {} (uid 0): no login runs as root on a \
                 server that runs logins as users (a front taken over could reach its worker); \
                 root uses a server of its own",
                map_file.display(),
                account.name
            ));
        }
        match evidence {
            Evidence::UnixUid(_) => {}
            Evidence::TokenFile(path) => {
                private_to(path, account)
                    .map_err(|why| format!("--user-map {}: {why}", map_file.display()))?;
                let token = Token::load(path)
                    .map_err(|error| format!("--user-map {}: {error}", map_file.display()))?;
                tokens.push((
                    Box::new(move |candidate| token.matches(candidate)),
                    account.clone(),
                ));
            }
            Evidence::Certificate(_) if !tls => {
                return Err(format!(
                    "--user-map {}: a `cert` line (for {}) maps a TLS client certificate, \
                     and this server serves no TLS: give --tls-cert and --tls-key (or \
                     --tls-self-signed)",
                    map_file.display(),
                    account.name
                ));
            }
            Evidence::Certificate(_) => certificates = true,
        }
    }
    if listen.iter().any(Address::is_tcp) && tokens.is_empty() && !certificates {
        return Err(format!(
            "--user-map {}: a tcp: listener, and no `token FILE USER` or `cert SHA256 USER` \
             line: no TCP login could log in",
            map_file.display()
        ));
    }
    let front_account = Account::by_name(privsep_user).map_err(|_| {
        format!(
            "--privsep-user {privsep_user}: no such user for the front, the part that reads \
             every peer's messages: make one of its own (`useradd --system --no-create-home \
             --shell /usr/sbin/nologin {privsep_user}`) or name another"
        )
    })?;
    if front_account.uid.is_root() {
        return Err(format!(
            "--privsep-user {privsep_user}: the front must not run as root"
        ));
    }
    // The path the monitor was started by (where its upgrade looks, too):
    // the name its front and workers go by; they run its own binary.
    let program = crate::cli::upgrade::started_from()
        .map(Program::own)
        .map_err(|error| format!("--user-map: cannot find capexec's own binary: {error}"))?;
    Ok(Prepared {
        map,
        tokens,
        certificates,
        front_account,
        program,
    })
}

/// Binds the listeners: TCP ones (for the front, which does TLS and the
/// login), Unix ones open to every local user (the kernel tells the
/// monitor who each one is), and the admin socket, root's alone.
fn bind(listen: &[Address], admin: Option<PathBuf>) -> Result<Bound, String> {
    let mut tcp = Vec::new();
    for address in listen {
        let Address::Tcp { host, port } = address else {
            continue;
        };
        let listener = std::net::TcpListener::bind((host.as_str(), *port)).map_err(|error| {
            format!("--listen {address}: {}", capexec::model::io_message(&error))
        })?;
        tcp.push(listener);
    }
    let mut logins = Vec::new();
    for address in listen {
        let Address::Unix(path) = address else {
            continue;
        };
        let socket = bind_unix_for_another(path, 0o666)
            .and_then(|socket| socket.listener.set_nonblocking(true).map(|()| socket))
            .map_err(|error| {
                format!("--listen {address}: {}", capexec::model::io_message(&error))
            })?;
        logins.push(socket);
    }
    let admin = match &admin {
        Some(path) => Some(bind_unix_for_another(path, 0o600).map_err(|error| {
            format!(
                "--admin {}: {}",
                path.display(),
                capexec::model::io_message(&error)
            )
        })?),
        None => None,
    };
    Ok(Bound { logins, tcp, admin })
}

/// Makes the directory of the workers' sockets.
fn make_socket_dir() -> Result<PathBuf, String> {
    let run = PathBuf::from(RUN_DIR);
    let socket_dir = run.join(format!("workers.{}", std::process::id()));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&run)
        .map_err(|error| {
            format!(
                "--user-map: cannot make {}: {}",
                run.display(),
                capexec::model::io_message(&error)
            )
        })?;
    root_only_directory(&run)?;
    remove_dead_monitors_dirs(&run);
    std::fs::DirBuilder::new()
        .mode(0o711)
        .create(&socket_dir)
        .and_then(|()| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&socket_dir, std::fs::Permissions::from_mode(0o711))
        })
        .map_err(|error| {
            format!(
                "--user-map: cannot make {}: {}",
                socket_dir.display(),
                capexec::model::io_message(&error)
            )
        })?;
    Ok(socket_dir)
}

/// Removes the workers' directories of monitors that are gone (killed
/// with SIGKILL, say: nothing of theirs runs any more, their workers died
/// with them). A directory whose number is a live process's is left, a
/// monitor's or not.
fn remove_dead_monitors_dirs(run: &Path) {
    let Ok(entries) = std::fs::read_dir(run) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|name| name.strip_prefix("workers."))
            .and_then(|pid| pid.parse::<i32>().ok())
            .filter(|pid| *pid > 0)
        else {
            continue;
        };
        let gone = matches!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
            Err(nix::errno::Errno::ESRCH)
        );
        if gone {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// The monitor's own arguments, as given, less an upgrade's hand-over.
fn own_args() -> Vec<OsString> {
    crate::cli::upgrade::args_without("--monitor-handover")
}

/// Starts the front as the privsep user on `bound`, prints the addresses,
/// and puts together what the monitor serves with.
fn launch(
    prepared: Prepared,
    bound: Bound,
    socket_dir: PathBuf,
    listen: &[Address],
    workers: HandedWorkers,
    failed_upgrade: Option<String>,
) -> Result<Started, String> {
    let Prepared {
        map,
        tokens,
        certificates,
        front_account,
        program,
    } = prepared;
    let (ours, theirs) = seqpacket_pair()?;
    // The front: this same command line, as the front, with the sockets.
    let mut args = own_args();
    args.push("--front".into());
    args.push(theirs.as_raw_fd().to_string().into());
    let (requests, their_requests) = seqpacket_pair()?;
    args.push("--monitor-requests".into());
    args.push(their_requests.as_raw_fd().to_string().into());
    if certificates {
        // The front asks TLS peers for a certificate.
        args.push("--client-certificates".into());
    }
    if let Some(why) = failed_upgrade {
        // For `Admin.lastUpgrade`, which the front serves.
        args.push("--failed-upgrade".into());
        args.push(why.into());
    }
    let mut keep = vec![theirs.as_raw_fd(), their_requests.as_raw_fd()];
    for listener in &bound.tcp {
        let fd = listener.as_raw_fd();
        args.push("--listen-fd".into());
        args.push(format!("{fd}=tcp").into());
        keep.push(fd);
    }
    if let Some(admin) = &bound.admin {
        let fd = admin.listener.as_raw_fd();
        args.push("--listen-fd".into());
        args.push(format!("{fd}=admin").into());
        keep.push(fd);
    }
    let privsep_user = front_account.name.clone();
    // The front ends cleanly if the monitor dies.
    let mut front = spawn_as(&front_account, &program, &args, &keep, libc::SIGTERM, None)
        .map_err(|error| format!("--privsep-user {privsep_user}: {error}"))?;
    capexec::users::relay_stderr(&mut front, capexec::users::log_label(&front_account));
    drop((theirs, their_requests));
    // As bound: a port of 0 is the one the kernel chose. A closed stdout
    // (whoever started us read what it wanted) ends nothing.
    let mut bound_tcp = bound.tcp.iter();
    let mut stdout = std::io::stdout().lock();
    for address in listen {
        match address {
            Address::Tcp { .. } => {
                if let Some(Ok(local)) = bound_tcp.next().map(|listener| listener.local_addr()) {
                    let _ = writeln!(stdout, "{}", Address::from_socket_addr(local));
                }
            }
            _ => {
                let _ = writeln!(stdout, "{address}");
            }
        }
    }
    let _ = stdout.flush();
    drop(stdout);
    tracing::info!(
        front = front.id(),
        user = %privsep_user,
        "serving logins as users: the front reads the peers, this process starts their workers"
    );
    let upgrade = monitor_upgrade(&bound, &socket_dir);
    Ok(Started {
        socket: ours,
        setup: MonitorSetup {
            map,
            program,
            socket_dir,
            front_uid: front_account.uid,
            front_gid: front_account.gid,
            tokens,
            upgrade,
        },
        requests,
        front: nix::unistd::Pid::from_raw(front.id() as i32),
        bound,
        workers,
    })
}

/// What a monitor hands over to the next binary at an upgrade (the same
/// process): its listeners, the workers' directory and cgroup root, and
/// the workers, which stay its children.
#[derive(serde::Serialize, serde::Deserialize)]
struct MonitorState {
    version: String,
    logins: Vec<BoundUnixSocketState>,
    tcp: Vec<RawFd>,
    admin: Option<BoundUnixSocketState>,
    socket_dir: PathBuf,
    cgroup_root: Option<capexec::sandbox::RootState>,
    workers: Vec<WorkerRecord>,
    started: u64,
    /// Set when the exec of the new binary failed and this hand-over goes
    /// back to the binary that wrote it: why the new one did not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    failed_upgrade: Option<String>,
}

/// How long the new binary may take to answer `--handover-check`.
const CHECK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// How this monitor upgrades: the binary at the path it was started by,
/// with its own arguments.
fn monitor_upgrade(bound: &Bound, socket_dir: &Path) -> MonitorUpgrade {
    let exe = crate::cli::upgrade::started_from();
    let args = own_args();
    let logins: Vec<_> = bound
        .logins
        .iter()
        .map(BoundUnixSocket::handover_state)
        .collect();
    let tcp: Vec<RawFd> = bound.tcp.iter().map(AsRawFd::as_raw_fd).collect();
    let admin = bound.admin.as_ref().map(BoundUnixSocket::handover_state);
    let socket_dir = socket_dir.to_path_buf();
    let check = {
        let (exe, args) = (exe.clone(), args.clone());
        Box::new(move || check_binary(exe.as_ref().map_err(Clone::clone)?, &args))
    };
    let exec = Box::new(move |workers: &[WorkerRecord], started: u64| {
        let exe = match &exe {
            Ok(exe) => exe,
            Err(why) => return why.clone(),
        };
        let state = MonitorState {
            version: capexec::net::HANDOVER_VERSION.to_string(),
            logins: logins.clone(),
            tcp: tcp.clone(),
            admin: admin.clone(),
            socket_dir: socket_dir.clone(),
            cgroup_root: capexec::sandbox::root_for_handover(),
            workers: workers.to_vec(),
            started,
            failed_upgrade: None,
        };
        exec_monitor(exe, &args, state)
    });
    MonitorUpgrade { check, exec }
}

/// Asks the binary at `exe` (as `serve ARGS --handover-check`, in this
/// process's directory) whether it takes the hand-over.
fn check_binary(exe: &Path, args: &[OsString]) -> Result<(), String> {
    use std::io::Read;
    let mut child = std::process::Command::new(exe)
        .args(args)
        .arg("--handover-check")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|error| {
            format!(
                "cannot run {}: {}",
                exe.display(),
                capexec::model::io_message(&error)
            )
        })?;
    // Read on threads of their own: a binary that writes much and waits
    // cannot hold the check up past its deadline.
    fn read_some(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<String> {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(pipe) = pipe {
                let _ = pipe.take(4096).read_to_end(&mut text);
            }
            String::from_utf8_lossy(&text).trim().to_string()
        })
    }
    let said = read_some(child.stdout.take());
    let complained = read_some(child.stderr.take());
    let deadline = std::time::Instant::now() + CHECK_PATIENCE;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{} did not answer `serve --handover-check`",
                    exe.display()
                ));
            }
        }
    };
    let said = said.join().unwrap_or_default();
    let complained = complained.join().unwrap_or_default();
    if status.success() && said == capexec::net::HANDOVER_VERSION {
        return Ok(());
    }
    let status = match status.code() {
        Some(code) => format!("exit code {code}"),
        None => "a signal".to_string(),
    };
    Err(format!(
        "{} cannot take the hand-over: `serve --handover-check` ended with {status} and said \
         {said:?} (expected {:?}){}",
        exe.display(),
        capexec::net::HANDOVER_VERSION,
        if complained.is_empty() {
            String::new()
        } else {
            format!(": {complained}")
        }
    ))
}

/// Writes `state` to a memfd and re-executes `exe` with `args` plus
/// `--monitor-handover FD`, keeping the descriptors the state names open;
/// if that binary cannot be executed, this one (`/proc/self/exe`) takes the
/// same hand-over, which says why the new one did not run. Returns only if
/// neither could, saying why.
fn exec_monitor(exe: &Path, args: &[OsString], mut state: MonitorState) -> String {
    let memfd = match monitor_memfd(&state) {
        Ok(memfd) => memfd,
        Err(error) => return format!("cannot write the hand-over: {error}"),
    };
    let mut keep = vec![memfd.as_raw_fd()];
    for socket in state.logins.iter().chain(&state.admin) {
        keep.extend([socket.listener, socket.lock]);
    }
    keep.extend(&state.tcp);
    keep.extend(state.workers.iter().filter_map(|worker| worker.log));
    if let Some(root) = &state.cgroup_root {
        keep.extend([root.lock_fd(), root.sentinel_fd()]);
    }
    for fd in keep {
        capexec::net::keep_across_exec(fd);
    }
    let mut argv: Vec<OsString> = vec![exe.as_os_str().to_owned()];
    argv.extend(args.iter().cloned());
    argv.push("--monitor-handover".into());
    argv.push(memfd.as_raw_fd().to_string().into());
    let error = exec(exe, &argv);
    let failed = format!("cannot execute {}: {error}", exe.display());
    // The state is small (no bytes follow it): written again, saying why.
    state.failed_upgrade = Some(failed.clone());
    let back = monitor_memfd(&state).ok();
    if let Some(back) = &back {
        capexec::net::keep_across_exec(back.as_raw_fd());
        if let Some(last) = argv.last_mut() {
            *last = back.as_raw_fd().to_string().into();
        }
        drop(memfd);
    }
    let _ = exec(Path::new("/proc/self/exe"), &argv);
    failed
}

/// `state` in a new memfd (close-on-exec), read from its start.
fn monitor_memfd(state: &MonitorState) -> Result<OwnedFd, String> {
    use std::io::{Seek, Write};
    let text = serde_json::to_vec(state).map_err(|error| error.to_string())?;
    let memfd = nix::sys::memfd::memfd_create(
        c"capexec-monitor-handover",
        nix::sys::memfd::MFdFlags::MFD_CLOEXEC,
    )
    .map_err(|errno| errno.desc().to_string())?;
    let mut file = std::fs::File::from(memfd);
    file.write_all(&text)
        .and_then(|()| file.rewind())
        .map_err(|error| error.to_string())?;
    Ok(OwnedFd::from(file))
}

fn exec(exe: &Path, argv: &[OsString]) -> std::io::Error {
    use std::os::unix::process::CommandExt;
    std::process::Command::new(exe)
        .arg0(&argv[0])
        .args(&argv[1..])
        .exec()
}

/// `--monitor-handover FD`: the listeners, the workers' directory and the
/// workers the monitor before left at FD (same process).
fn take_over(fd: i32) -> Result<(Bound, PathBuf, HandedWorkers, Option<String>), String> {
    use std::io::Read;
    let fd = inherited(fd, "--monitor-handover")?;
    let mut text = Vec::new();
    std::fs::File::from(fd)
        .read_to_end(&mut text)
        .map_err(|error| format!("the monitor's hand-over: {error}"))?;
    let state: MonitorState = serde_json::from_slice(&text)
        .map_err(|error| format!("the monitor's hand-over: {error}"))?;
    if state.version != capexec::net::HANDOVER_VERSION {
        return Err(format!(
            "the monitor's hand-over is {:?}, this binary takes {:?}",
            state.version,
            capexec::net::HANDOVER_VERSION
        ));
    }
    if let Some(root) = state.cgroup_root {
        capexec::sandbox::take_over_root(root)?;
    }
    // SAFETY: kept open across the exec for this process and taken once.
    let taken = |socket: BoundUnixSocketState| unsafe { BoundUnixSocket::taken_over(socket) };
    let bound = Bound {
        logins: state.logins.into_iter().map(taken).collect(),
        tcp: state
            .tcp
            .into_iter()
            .map(|fd| {
                // SAFETY: as above; close-on-exec again (each front gets
                // it by `keep`).
                unsafe {
                    libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                    <std::net::TcpListener as FromRawFd>::from_raw_fd(fd)
                }
            })
            .collect(),
        admin: state.admin.map(taken),
    };
    if let Some(why) = &state.failed_upgrade {
        tracing::error!(
            "the upgrade did not execute the new binary ({why}): \
             serving on from the binary before, which took everything back"
        );
    }
    Ok((
        bound,
        state.socket_dir,
        (state.workers, state.started),
        state.failed_upgrade,
    ))
}

/// Where the workers' sockets go, in a directory of the monitor's own.
const RUN_DIR: &str = "/run/capexec";

/// Whether `path` is a directory only root may change: the workers'
/// sockets go in it, and whoever could rename or replace what is there
/// could put a socket of theirs where the front looks for a user's worker
/// and read that user's logins. Not a symbolic link, root's, no group or
/// other write bit.
fn root_only_directory(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::symlink_metadata(path).map_err(|error| {
        format!(
            "--user-map: {}: {}",
            path.display(),
            capexec::model::io_message(&error)
        )
    })?;
    let (owner, mode) = (metadata.uid(), metadata.mode() & 0o7777);
    if !metadata.is_dir() || owner != 0 || mode & 0o022 != 0 {
        let what = if metadata.file_type().is_symlink() {
            "a symbolic link".to_string()
        } else if !metadata.is_dir() {
            "not a directory".to_string()
        } else {
            format!("uid {owner}'s with mode {mode:04o}")
        };
        return Err(format!(
            "--user-map: {} is {what}: the users' workers' sockets go there, and whoever may \
             change it could stand in for a user's worker; make it a directory of root's, \
             writable by root only (or remove it: the server makes it)",
            path.display()
        ));
    }
    Ok(())
}

/// Whether the token file at `path`, which logs in as `account`, is kept
/// from every other user: whoever reads it logs in as `account`, and
/// whoever writes it can make a token of theirs do so. Only root or
/// `account` may own it, and no group or other bit may be set.
fn private_to(path: &Path, account: &Account) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::metadata(path).map_err(|error| {
        format!(
            "the token file {}: {}",
            path.display(),
            capexec::model::io_message(&error)
        )
    })?;
    let (owner, mode) = (metadata.uid(), metadata.mode() & 0o7777);
    if mode & 0o077 != 0 {
        return Err(format!(
            "the token file {} (for {user}) has mode {mode:04o}: another user could read or \
             write it and log in as {user}; chmod 600 it",
            path.display(),
            user = account.name
        ));
    }
    if owner != 0 && owner != account.uid.as_raw() {
        return Err(format!(
            "the token file {} (for {user}) is uid {owner}'s: that user could write a token of \
             theirs in it and log in as {user}; make it root's or {user}'s",
            path.display(),
            user = account.name
        ));
    }
    Ok(())
}

/// A socketpair between the monitor and the front: messages keep their
/// bounds, and carry descriptors.
fn seqpacket_pair() -> Result<(OwnedFd, OwnedFd), String> {
    nix::sys::socket::socketpair(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::SeqPacket,
        None,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|errno| format!("--user-map: the monitor's socket: {}", errno.desc()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// Root's own directory passes; one another user owns, one others may
    /// write and a symbolic link are refused, each saying why.
    #[test]
    fn the_run_directory_must_be_roots_alone() {
        // Only root can give a directory away: the CI runs as root, as
        // the servers this check guards do.
        assert!(nix::unistd::geteuid().is_root(), "this test needs root");
        let scratch = tempfile::tempdir().expect("scratch");
        let dir = scratch.path().join("run");
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert_eq!(root_only_directory(&dir), Ok(()));

        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let refused = root_only_directory(&dir).expect_err("world-writable");
        assert!(refused.contains("uid 0's with mode 0777"), "{refused}");

        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::os::unix::fs::chown(&dir, Some(65534), None).expect("chown");
        let refused = root_only_directory(&dir).expect_err("another user's");
        assert!(refused.contains("uid 65534's with mode 0755"), "{refused}");
        assert!(
            refused.contains("could stand in for a user's worker"),
            "{refused}"
        );

        let link = scratch.path().join("link");
        std::fs::create_dir(scratch.path().join("target")).expect("mkdir");
        std::os::unix::fs::symlink(scratch.path().join("target"), &link).expect("symlink");
        let refused = root_only_directory(&link).expect_err("a link");
        assert!(refused.contains("is a symbolic link"), "{refused}");
    }
}
