//! `capexec serve`: an executor on Unix sockets and TCP until SIGTERM or
//! SIGINT.

use std::io::Write;

use tokio::signal::unix::{SignalKind, signal};

use std::collections::HashMap;
use std::path::PathBuf;

use crate::cli::capacity::{self, Asked, Capacity};
use crate::cli::config::Lookup;
use crate::cli::{EXIT_CAPEXEC_FAILURE, ServeArgs, target};
use capexec::engine::descriptors::DescriptorBudget;
use capexec::engine::{self, ChildSetup, Engine, ProcessLimits};
use capexec::net::activation;
use capexec::net::{
    Address, CallLimits, Server, ServerConfig, ServerTrust, TlsClient, TlsServer, Token,
    UpstreamConfig,
};
use capexec::sys::low_slots::KeepsItsSlot;
use std::time::{Duration, SystemTime};

pub fn main(args: ServeArgs) -> i32 {
    // An upgrading server asks with its own arguments: they are read as
    // far as they can be without serving (below); a user map's monitor
    // would bind, so it reads its map, token files and users only. A
    // worker's or a front's descriptors are not open for the check: their
    // arguments are the monitor's making.
    if args.handover_check {
        if args.worker.is_some() || args.front.is_some() {
            return handover_check_answer();
        }
        if let Some(map) = &args.user_map {
            let listen: Vec<Address> = args
                .listen
                .iter()
                .filter_map(|text| text.parse().ok())
                .collect();
            let tls = args.tls_cert.is_some() || args.tls_self_signed;
            return match crate::cli::serve_users::check_monitor(
                map,
                &args.privsep_user,
                &listen,
                tls,
            ) {
                Ok(()) => handover_check_answer(),
                Err(error) => {
                    eprintln!("capexec: {error}");
                    EXIT_CAPEXEC_FAILURE
                }
            };
        }
    }
    // Taken before anything else owns a descriptor: what the binary before
    // kept open for us.
    let handover = match args
        .handover
        .map(crate::cli::upgrade::handed_over)
        .transpose()
    {
        Ok(handover) => handover,
        Err(error) => {
            eprintln!("capexec: cannot take over from the binary before: {error}");
            return EXIT_CAPEXEC_FAILURE;
        }
    };
    // Every process starts as the server's user: a set-user-ID install (or
    // a wrapper that changed only the effective identity) would hand its
    // clients another user's authority without anyone asking for it.
    let (real, effective) = (nix::unistd::getuid(), nix::unistd::geteuid());
    let (real_group, effective_group) = (nix::unistd::getgid(), nix::unistd::getegid());
    if real != effective || real_group != effective_group {
        eprintln!(
            "capexec: refusing to serve as user {effective} (group {effective_group}) on behalf \
             of user {real} (group {real_group}): set-user-ID or set-group-ID? Run capexec \
             serve as the user whose processes it starts"
        );
        return EXIT_CAPEXEC_FAILURE;
    }
    if (args.worker.is_some() || args.front.is_some())
        && let Err(error) = not_dumpable()
    {
        eprintln!(
            "capexec: cannot keep this process's memory and descriptors from its user's other processes: {error}"
        );
        return EXIT_CAPEXEC_FAILURE;
    }
    // (After an upgrade the root is the one handed over.)
    if let Some(group) = args.cgroup_parent.clone().filter(|_| handover.is_none())
        && let Err(error) = capexec::sandbox::make_root_in(group)
    {
        eprintln!("capexec: --cgroup-parent: {error}");
        return EXIT_CAPEXEC_FAILURE;
    }
    let inherited = match (args.worker, args.front) {
        _ if handover.is_some() => Ok(handover
            .as_ref()
            .map(crate::cli::upgrade::listeners)
            .unwrap_or_default()),
        (Some(fd), _) => worker_socket(fd, args.worker_admin),
        (None, Some(_)) => crate::cli::serve_users::front_sockets(&args.listen_fds),
        // SAFETY: nothing has started a thread yet (logging writes from
        // this one), and this is the only place that takes them.
        (None, None) => unsafe {
            activation::take_notify_socket();
            activation::take_listen_fds()
        }
        .map_err(|error| format!("socket activation: {error}")),
    };
    let inherited = match inherited {
        Ok(inherited) => inherited,
        Err(error) => {
            eprintln!("capexec: {error}");
            return EXIT_CAPEXEC_FAILURE;
        }
    };
    let mut listen = Vec::new();
    // (A front's listeners are its monitor's.)
    if args.listen.is_empty() && inherited.is_empty() && args.front.is_none() && handover.is_none()
    {
        match default_listener() {
            Ok(address) => listen.push(address),
            Err(error) => {
                eprintln!("capexec: {error}");
                return EXIT_CAPEXEC_FAILURE;
            }
        }
    }
    for text in &args.listen {
        match text.parse::<Address>() {
            // Printed as resolved: a relative path means nothing to a
            // client started elsewhere.
            Ok(Address::Unix(path)) => match std::path::absolute(&path) {
                Ok(path) => listen.push(Address::Unix(path)),
                Err(error) => {
                    eprintln!(
                        "capexec: --listen {text}: {}",
                        capexec::model::io_message(&error)
                    );
                    return EXIT_CAPEXEC_FAILURE;
                }
            },
            Ok(address) => listen.push(address),
            Err(error) => {
                eprintln!("capexec: --listen {error}");
                return EXIT_CAPEXEC_FAILURE;
            }
        }
    }
    let admin = match args.admin.as_deref().map(admin_socket).transpose() {
        Ok(admin) => admin,
        Err(error) => {
            eprintln!("capexec: {error}");
            return EXIT_CAPEXEC_FAILURE;
        }
    };
    // The front of a server that runs logins as users: its listeners (and
    // the admin socket) came from the monitor, which bound them.
    let (users, listen, admin) = match args.front {
        Some(monitor) => {
            match crate::cli::serve_users::front_config(
                monitor,
                args.monitor_requests,
                args.max_connections_per_user,
                args.failed_upgrade.clone(),
            ) {
                Ok(users) => (Some(users), Vec::new(), None),
                Err(error) => {
                    eprintln!("capexec: {error}");
                    return EXIT_CAPEXEC_FAILURE;
                }
            }
        }
        // An upgrade's listeners (admin and metrics too) are handed over.
        None if handover.is_some() => (None, Vec::new(), None),
        None => (None, listen, admin),
    };
    // As root with --user-map: bind, start the front, and stay the monitor.
    if let (Some(map), None) = (&args.user_map, args.front) {
        let tls = args.tls_cert.is_some() || args.tls_self_signed;
        return crate::cli::serve_users::monitor_main(
            map,
            &args.privsep_user,
            &listen,
            admin,
            tls,
            args.monitor_handover,
        );
    }
    let metrics = match args.metrics.as_deref().map(metrics_address).transpose() {
        Ok(metrics) => metrics,
        Err(error) => {
            eprintln!("capexec: {error}");
            return EXIT_CAPEXEC_FAILURE;
        }
    };
    let upstreams = match upstreams(&args) {
        Ok(upstreams) => upstreams,
        Err(error) => {
            eprintln!("capexec: {error}");
            return EXIT_CAPEXEC_FAILURE;
        }
    };
    let policy = match args.restrictions.policy() {
        Ok(policy) => policy,
        Err(error) => {
            eprintln!("capexec: {error}");
            return EXIT_CAPEXEC_FAILURE;
        }
    };
    if let Some(policy) = &policy
        && (policy
            .sandbox
            .as_ref()
            .is_some_and(|sandbox| sandbox.best_effort)
            || policy.limits.best_effort)
    {
        tracing::warn!(
            "--best-effort: starts run without what this server cannot enforce of the policy's \
             sandbox and limits (their ProcessInfo says what)"
        );
    }
    let mut tls_files = args.tls_cert.clone().zip(args.tls_key.clone());
    if args.tls_self_signed {
        match crate::cli::self_signed::load_or_make() {
            Ok((cert, key, made)) => {
                if made {
                    tracing::info!(certificate = %cert.display(), "made a self-signed certificate");
                }
                tls_files = Some((cert, key));
            }
            Err(error) => {
                eprintln!("capexec: {error}");
                return EXIT_CAPEXEC_FAILURE;
            }
        }
    }
    let client_certificates = args.client_certificates;
    let tls = match &tls_files {
        Some((cert, key)) => match load_tls(cert, key, client_certificates) {
            Ok(tls) => Some(tls),
            Err(error) => {
                eprintln!("capexec: {error}");
                return EXIT_CAPEXEC_FAILURE;
            }
        },
        _ => None,
    };
    if let Some(tls) = &tls {
        if !listen.iter().any(Address::is_tcp) && inherited.is_empty() {
            let flag = if args.tls_self_signed {
                "--tls-self-signed"
            } else {
                "--tls-cert"
            };
            eprintln!("capexec: {flag} applies to tcp: listeners, and there is none");
            return EXIT_CAPEXEC_FAILURE;
        }
        if args.tls_self_signed {
            // On stderr, so that stdout stays the list of addresses.
            eprintln!(
                "capexec: TLS certificate SHA-256 {}: clients pin it with --tls-pin or trust \
                 it on first use",
                tls.fingerprint()
            );
        }
        tracing::info!(
            sha256 = tls.fingerprint(),
            "serving TLS; clients can pin this certificate with --tls-pin"
        );
        if let (Some(expires), Some((cert, _))) = (tls.expires(), &tls_files) {
            warn_about_expiry(cert, expires, std::time::SystemTime::now());
        }
    }
    if args.handover_check {
        return handover_check_answer();
    }
    // (After an upgrade the server does it once it has taken the
    // processes over: their exits must not be reaped as nobody's.)
    if handover.is_none()
        && let Err(error) = engine::become_subreaper()
    {
        tracing::warn!(%error, "cannot become a subreaper; orphaned grandchildren will not be reaped here");
    }
    if let Some(max) = args.max_inotify_watches {
        capexec::files::limit_watches(max);
    }
    let descriptor_limit = raise_descriptor_limit();
    // Before the server takes in anything, and counted in its budget
    // below as its own.
    keep_first_slots();
    let held = handover
        .as_ref()
        .map(capexec::net::HandedOver::processes_held);
    let capacity = match descriptor_capacity(&args, held) {
        Ok(capacity) => capacity,
        Err(error) => {
            eprintln!("capexec: {error}");
            return EXIT_CAPEXEC_FAILURE;
        }
    };
    capexec::engine::keep_session_members_at_most(capacity.budget.members as usize);
    if let Some(handover) = &handover
        && handover.closes_below(capexec::engine::SPAWNER_COPIES_BELOW)
    {
        // The spawner's table would start with copies of them.
        capexec::engine::forgo_spawner(
            "the binary before left descriptors (maybe clients') to close among the first 64",
        );
    }
    let engine = engine(&args, &capacity, descriptor_limit);
    // One user may hold at most half the server's connections by
    // default, so that the others' logins find a place.
    let users = users.map(|mut users| {
        if args.max_connections_per_user.is_none() {
            users.connections_per_user = users
                .connections_per_user
                .min((capacity.max_connections / 2).max(1));
        }
        users
    });
    let config = ServerConfig {
        listen,
        token_file: args.token_file,
        upstreams,
        default_environment: args.default_environment,
        retention: Some(std::time::Duration::from_secs(args.retention)),
        tls,
        call_limits: CallLimits {
            max_calls: args.max_calls_per_connection,
            max_bytes: args.max_call_memory_per_connection << 20,
        },
        pending_logins: capacity.pending,
        max_connections: Some(capacity.max_connections),
        max_processes_per_connection: Some(capacity.per_connection),
        port_limits: capexec::rpc::PortLimits {
            max_connections: args.max_port_connections_per_connection,
            max_listeners: args.max_listeners_per_connection,
        },
        holding_limits: Some(capexec::rpc::HoldingLimits {
            descriptors: capacity.budget.held as usize,
            memory: capexec::rpc::MAX_HELD_MEMORY,
        }),
        login_deadline: None,
        policy,
        admin,
        inherited,
        // Handed over with the listeners after an upgrade.
        metrics: if handover.is_some() { None } else { metrics },
        users,
        handover: handover.map(std::sync::Arc::new),
    };
    // A user's worker upgrades itself when its monitor tells it to.
    let upgrades = crate::cli::upgrade::Upgrading::prepare(None);
    crate::cli::run_local(serve(
        config,
        engine,
        capacity,
        tls_files,
        upgrades,
        client_certificates,
    ))
}

/// `serve --handover-check`: the hand-over format this binary takes.
fn handover_check_answer() -> i32 {
    println!("{}", capexec::net::HANDOVER_VERSION);
    0
}

/// A worker runs with its user's uid, as the user's commands and other
/// processes do; the front with the privsep user's. Non-dumpable, neither
/// can be traced nor have its memory, environment or descriptors (the
/// worker's listener, on which every login of the user arrives; the
/// front's TLS key and every user's connection) read through /proc by
/// another process of that uid: the kernel asks for root then. A
/// command's exec makes it dumpable again, as any process.
fn not_dumpable() -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `--worker FD`: the listening socket a user's worker was handed, its
/// only listener, and `--worker-admin FD`, where it serves `Admin` to the
/// front.
fn worker_socket(fd: i32, admin: Option<i32>) -> Result<Vec<activation::InheritedSocket>, String> {
    let mut sockets = vec![activation::InheritedSocket {
        fd: std::sync::Arc::new(KeepsItsSlot::new(crate::cli::serve_users::inherited(
            fd, "--worker",
        )?)),
        name: "worker".to_string(),
        path: None,
    }];
    if let Some(admin) = admin {
        // Named so: the server serves `Admin` on it.
        sockets.push(activation::InheritedSocket {
            fd: std::sync::Arc::new(KeepsItsSlot::new(crate::cli::serve_users::inherited(
                admin,
                "--worker-admin",
            )?)),
            name: "admin".to_string(),
            path: None,
        });
    }
    Ok(sockets)
}

/// The engine a server starts processes with: its
/// process limit and the descriptors its children may hold.
fn engine(args: &ServeArgs, capacity: &Capacity, descriptor_limit: Option<(u64, u64)>) -> Engine {
    let limits = ProcessLimits {
        max_processes: Some(capacity.max_processes),
        child: ChildSetup {
            // Every start comes from this (the main) thread, which lives as
            // long as the server.
            die_with_parent: true,
            descriptor_limit,
        },
        ..ProcessLimits::default()
    };
    // What tests pretend the kernel lacks (--hide-kernel-feature).
    let host = capexec::sandbox::HostConfig::hiding(args.hide_kernel_features.iter().copied());
    Engine::with_host(limits, host)
}

/// `--metrics tcp:HOST:PORT` (or HOST:PORT).
fn metrics_address(text: &str) -> Result<Address, String> {
    let spelled = if text.starts_with("tcp:") || text.starts_with("unix:") {
        text.to_string()
    } else {
        format!("tcp:{text}")
    };
    match spelled.parse::<Address>() {
        Ok(address @ Address::Tcp { .. }) => Ok(address),
        Ok(Address::Unix(_)) => Err(format!(
            "--metrics {text}: metrics are served over HTTP on tcp:HOST:PORT"
        )),
        Err(error) => Err(format!("--metrics {error}")),
    }
}

/// `--admin unix:PATH` (or a plain path), made absolute.
fn admin_socket(text: &str) -> Result<PathBuf, String> {
    let path = match text.strip_prefix("unix:") {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        Some(_) => return Err("--admin unix: needs a socket path".to_string()),
        None if text.starts_with("tcp:") => {
            return Err(format!(
                "--admin {text}: the admin capability is served on a Unix socket only \
                 (its file permissions protect it): give unix:PATH"
            ));
        }
        None => PathBuf::from(text),
    };
    std::path::absolute(&path)
        .map_err(|error| format!("--admin {text}: {}", capexec::model::io_message(&error)))
}

/// The default socket (see `net::default_socket_path`), its directory
/// made private first.
fn default_listener() -> Result<Address, String> {
    let path =
        capexec::net::default_socket_path().map_err(|why| format!("no --listen, and {why}"))?;
    if let Some(dir) = path.parent() {
        capexec::net::ensure_private_dir(dir).map_err(|error| {
            format!(
                "the default socket's directory {}: {}",
                dir.display(),
                capexec::model::io_message(&error)
            )
        })?;
    }
    Ok(Address::Unix(path))
}

/// Clients refuse an expired certificate: say so at start, and two weeks
/// ahead.
fn warn_about_expiry(cert: &std::path::Path, expires: SystemTime, now: SystemTime) {
    match expiry_warning(expires, now) {
        Some(Expiry::Expired(days)) => tracing::warn!(
            certificate = %cert.display(),
            "the TLS certificate expired {days} ago: clients will refuse it; renew it"
        ),
        Some(Expiry::Soon(days)) => tracing::warn!(
            certificate = %cert.display(),
            "the TLS certificate expires in {days}: renew it before clients refuse it"
        ),
        None => {}
    }
}

/// How close to expiry a certificate is, if within [`EXPIRY_WARNING`].
#[derive(Debug, PartialEq, Eq)]
enum Expiry {
    /// Expired this long ago ("3 days", "less than a day").
    Expired(String),
    /// Expires within this.
    Soon(String),
}

/// Warn about certificates that expire within this.
const EXPIRY_WARNING: Duration = Duration::from_secs(14 * 24 * 3600);

fn expiry_warning(expires: SystemTime, now: SystemTime) -> Option<Expiry> {
    let days = |span: Duration| match span.as_secs() / 86_400 {
        0 => "less than a day".to_string(),
        1 => "1 day".to_string(),
        n => format!("{n} days"),
    };
    match expires.duration_since(now) {
        Err(past) => Some(Expiry::Expired(days(past.duration()))),
        Ok(left) if left <= EXPIRY_WARNING => Some(Expiry::Soon(days(left))),
        Ok(_) => None,
    }
}

/// `--upstream NAME=ADDR` with their `--upstream-token-file NAME=FILE`.
fn upstreams(args: &ServeArgs) -> Result<Vec<UpstreamConfig>, String> {
    let mut token_files = HashMap::new();
    for pair in &args.upstream_token_files {
        let (name, file) = split_pair(pair, "--upstream-token-file", "NAME=FILE")?;
        if token_files.insert(name, PathBuf::from(file)).is_some() {
            return Err(format!("--upstream-token-file {name}: given twice"));
        }
    }
    let mut trusts: HashMap<&str, ServerTrust> = HashMap::new();
    let pairs = [
        ("--upstream-tls-ca", &args.upstream_tls_cas),
        ("--upstream-tls-pin", &args.upstream_tls_pins),
    ];
    for (flag, values) in pairs {
        for pair in values {
            let (name, value) = split_pair(pair, flag, "NAME=VALUE")?;
            let trust = if flag == "--upstream-tls-ca" {
                ServerTrust::Ca(PathBuf::from(value))
            } else {
                ServerTrust::Pin(value.to_string())
            };
            if trusts.insert(name, trust).is_some() {
                return Err(format!("{flag} {name}: TLS for {name} is given twice"));
            }
        }
    }
    let mut upstreams = Vec::new();
    for pair in &args.upstreams {
        let (name, address) = split_pair(pair, "--upstream", "NAME=ADDR")?;
        // An address, or a server named in the configuration file, with
        // its token file and TLS trust unless flags give them.
        let (address, named) = match address.parse::<Address>() {
            Ok(address) => (address, None),
            Err(error) => match crate::cli::config::Config::load()?.lookup(address) {
                Lookup::Found(entry) => (entry.server.address.clone(), Some(entry.server.clone())),
                Lookup::Broken(why) => return Err(format!("--upstream {name}: {why}")),
                Lookup::Unknown => {
                    return Err(format!(
                        "--upstream {name}: {error}, or the name of a server in the \
                         configuration file"
                    ));
                }
            },
        };
        if let Some(named) = &named
            && !trusts.contains_key(name)
            && let Some(trust) = named_trust(name, named)?
        {
            trusts.insert(name, trust);
        }
        let named_token = named.as_ref().and_then(|named| {
            let file = named.token_file.clone()?;
            let place = named.origin.as_ref()?.of("token-file");
            Some((file, place))
        });
        // Each upstream has its own secret: never fall back to this
        // server's own token (or anything else that could leak it).
        let token_file = match token_files.remove(name) {
            Some(file) => Some((file, format!("--upstream-token-file {name}="))),
            None => named_token.map(|(file, place)| (file, format!("{place} "))),
        };
        let token = match (token_file, address.is_tcp()) {
            (Some((file, place)), true) => Some(
                {
                    // What this server logs in with is no sandbox's to read.
                    capexec::sandbox::protect(&file, capexec::sandbox::Secret::LoginToken);
                    Token::load(&file)
                }
                .map_err(|error| target::token_problem(&place, &error))?,
            ),
            (None, true) => {
                return Err(format!(
                    "--upstream {name} ({address}) needs a login token: give \
                     --upstream-token-file {name}=FILE"
                ));
            }
            (Some(_), false) => {
                return Err(format!(
                    "--upstream-token-file {name}: {address} needs no token (a Unix socket \
                     is protected by its file permissions)"
                ));
            }
            (None, false) => None,
        };
        let tls = match trusts.remove(name) {
            Some(_) if !address.is_tcp() => {
                return Err(format!(
                    "--upstream-tls-ca/--upstream-tls-pin {name}: TLS is for tcp: upstreams"
                ));
            }
            Some(trust) => {
                let flag = match trust {
                    ServerTrust::Ca(_) => "--upstream-tls-ca",
                    _ => "--upstream-tls-pin",
                };
                Some(TlsClient::new(trust).map_err(|e| format!("{flag} {name}={e}"))?)
            }
            None => None,
        };
        if let Address::Tcp { host, .. } = &address
            && tls.is_none()
            && !resolves_to_loopback(host)
        {
            tracing::warn!(
                upstream = name,
                "the login token for this upstream travels in clear text: give \
                 --upstream-tls-ca or --upstream-tls-pin"
            );
        }
        let mut upstream = UpstreamConfig::new(name, address, token);
        upstream.tls = tls;
        upstreams.push(upstream);
    }
    if let Some(name) = trusts.keys().next() {
        return Err(format!(
            "TLS for upstream {name}: no --upstream {name}=ADDR"
        ));
    }
    if let Some(name) = token_files.keys().next() {
        return Err(format!(
            "--upstream-token-file {name}: no --upstream {name}=ADDR"
        ));
    }
    Ok(upstreams)
}

/// How the configuration file says to trust the upstream `name`: its CA
/// or pin, or the certificate remembered for it (trust on first use needs
/// one: a server cannot ask anyone).
fn named_trust(
    name: &str,
    named: &crate::cli::named::Named,
) -> Result<Option<ServerTrust>, String> {
    if let Some(ca) = &named.tls_ca {
        return Ok(Some(ServerTrust::Ca(ca.clone())));
    }
    if let Some(pin) = &named.tls_pin {
        return Ok(Some(ServerTrust::Pin(pin.clone())));
    }
    let Some(file) = crate::cli::known_servers::path() else {
        return Ok(None);
    };
    match crate::cli::known_servers::lookup(&file, &named.address)? {
        Some(known) => Ok(Some(ServerTrust::FirstUse(Some(known.fingerprint)))),
        None if named.tls => Err(format!(
            "--upstream {name}: {} is trusted on first use and its certificate is not \
             remembered yet: connect once with `capexec run --connect {} --tls-accept-new -- \
             true`, or give --upstream-tls-pin {name}=SHA256",
            named.address, named.address
        )),
        None => Ok(None),
    }
}

/// Whether `host` names only loopback addresses (a name is resolved).
fn resolves_to_loopback(host: &str) -> bool {
    use std::net::ToSocketAddrs;
    (host, 0)
        .to_socket_addrs()
        .map(|mut addresses| addresses.all(|address| address.ip().is_loopback()))
        .unwrap_or(false)
}

fn split_pair<'a>(pair: &'a str, flag: &str, form: &str) -> Result<(&'a str, &'a str), String> {
    match pair.split_once('=') {
        Some((name, value)) if !name.is_empty() && !value.is_empty() => Ok((name, value)),
        _ => Err(format!("{flag} expects {form}, got {pair:?}")),
    }
}

/// Keeps the first 64 descriptor slots for the server's own
/// (`sys::low_slots`: no client's descriptor there for the spawner's
/// table to start with, after an upgrade too), where the descriptor limit
/// is at least 16 times that: under a smaller one they are a share of it
/// worth more to clients.
fn keep_first_slots() {
    use nix::sys::resource::{Resource, getrlimit};
    const AT_LEAST: u64 = 16 * capexec::engine::SPAWNER_COPIES_BELOW as u64;
    let limit = getrlimit(Resource::RLIMIT_NOFILE).map_or(0, |(soft, _)| soft);
    const UNKEPT: &str = "an upgrade that hands over clients' descriptors there leaves the \
                          new binary cloning its children from its own descriptor table";
    if limit < AT_LEAST {
        // A server this small is a test's or a choice: said, not warned of.
        tracing::debug!(
            descriptor_limit = limit,
            "the first 64 descriptor slots are not kept for the server's own under a \
             descriptor limit below {AT_LEAST}: {UNKEPT}"
        );
    } else if let Err(error) = capexec::sys::low_slots::reserve() {
        tracing::warn!(
            "the first 64 descriptor slots cannot be kept for the server's own ({error}): \
             {UNKEPT}"
        );
    }
}

/// Every process costs the server descriptors (see
/// `engine::descriptors`): lift the soft limit to the hard one, which the
/// process limits are then fitted into. Returns the limit as it was, for
/// the children: a huge soft limit slows programs that close every
/// descriptor up to it.
fn raise_descriptor_limit() -> Option<(u64, u64)> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => Some((soft, hard)),
            Err(error) => {
                tracing::warn!(%error, soft, hard, "cannot raise the descriptor limit");
                None
            }
        },
        Ok(_) => None,
        Err(error) => {
            tracing::warn!(%error, "cannot read the descriptor limit");
            None
        }
    }
}

/// The limits of `args`, fitted into the descriptor limit and the task
/// limits (see `cli::capacity`); after an upgrade, with the processes
/// handed over and the descriptors they hold (`held`) counted as
/// processes', not as the server's own.
fn descriptor_capacity(args: &ServeArgs, held: Option<(u64, u64)>) -> Result<Capacity, String> {
    let (processes, descriptors) = held.unwrap_or_default();
    let budget = DescriptorBudget::of_this_process(descriptors)
        .map_err(|error| format!("cannot work out the descriptor budget: {error}"))?;
    capacity::fit(
        Asked {
            max_connections: args.max_connections,
            max_processes: args.max_processes,
            per_connection: args.max_processes_per_connection,
            pending: args.max_pending_logins,
            pending_per_address: args.max_pending_logins_per_address,
            handed_over: held.is_some(),
        },
        budget,
        capexec::engine::tasks::TaskBudget::of_this_process(processes),
    )
}

/// Says at start what the server holds, and what was lowered to fit.
fn log_capacity(capacity: &Capacity) {
    let budget = capacity.budget;
    // A default fitted to the limit is how the server runs on most
    // machines; a value the operator gave and did not get is worth a look.
    for lowered in capacity.lowered.iter().flatten() {
        if lowered.asked {
            tracing::warn!(descriptor_limit = budget.limit, "{lowered}");
        } else {
            tracing::info!(descriptor_limit = budget.limit, "{lowered}");
        }
    }
    if let Some(tasks) = &capacity.tasks {
        tracing::info!(
            task_limit = tasks.limit,
            set_by = %tasks.set_by,
            tasks_in_use = tasks.used,
            processes_carried = tasks.processes,
            "the task limit"
        );
    }
    for short in budget.short_shares() {
        tracing::warn!(descriptor_limit = budget.limit, "{short}");
    }
    tracing::info!(
        descriptor_limit = budget.limit,
        kept_for_connections = budget.connections,
        kept_for_capabilities = budget.held,
        kept_for_received_descriptors = budget.received,
        kept_for_pipes = budget.pipes,
        kept_for_session_members = budget.members,
        max_connections = capacity.max_connections,
        max_processes = capacity.max_processes,
        max_processes_per_connection = capacity.per_connection,
        max_pending_logins = capacity.pending.total,
        "process and connection limits"
    );
}

async fn serve(
    config: ServerConfig,
    engine: Engine,
    capacity: Capacity,
    tls_files: Option<(PathBuf, PathBuf)>,
    upgrading: crate::cli::upgrade::Upgrading,
    client_certificates: bool,
) -> i32 {
    // Registered before binding, so a signal that arrives as soon as the
    // addresses are printed is not lost.
    let (mut terminate, mut interrupt, mut hangup) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) {
        (Ok(terminate), Ok(interrupt), Ok(hangup)) => (terminate, interrupt, hangup),
        (Err(error), _, _) | (_, Err(error), _) | (_, _, Err(error)) => {
            eprintln!("capexec: cannot handle signals: {error}");
            return EXIT_CAPEXEC_FAILURE;
        }
    };
    let server = match Server::bind(config, engine).await {
        Ok(server) => server,
        Err(error) => {
            eprintln!("capexec: {error}");
            return EXIT_CAPEXEC_FAILURE;
        }
    };
    // Binding closed the sockets passed in (a service manager's, a
    // monitor's, the binary before's) once it had copies, each putting a
    // placeholder in its slot (`KeepsItsSlot`); should anything else
    // below 64 have been let go of since the slots were kept, it is
    // filled here, before anything is taken in (nothing is accepted until
    // `serve_until_or_upgraded`).
    if let Err(error) = capexec::sys::low_slots::refill() {
        tracing::warn!(
            "the first 64 descriptor slots cannot be kept for the server's own ({error}): a \
             client's descriptor may land there"
        );
    }
    log_capacity(&capacity);
    if let Some(Address::Tcp { host, port }) = server.metrics_address() {
        // On stderr, so that stdout stays the list of listeners.
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.clone()
        };
        eprintln!("capexec: metrics at http://{host}:{port}/metrics");
    }
    if let Some(address) = server.admin_address() {
        tracing::info!(%address, "the admin capability is served here only");
    }
    if let Some(path) = server.token_path() {
        tracing::info!(path = %path.display(), "tcp logins use the token in this file");
    }
    let mut stdout = std::io::stdout().lock();
    for address in server.addresses() {
        let _ = writeln!(stdout, "{address}");
    }
    let _ = stdout.flush();
    drop(stdout);
    let reloader = server.reloader();
    let upgrades = match upgrading.start() {
        Ok(upgrades) => Some(upgrades),
        Err(error) => {
            tracing::warn!("upgrades are not available: {error}");
            None
        }
    };
    // Every signal is handled from here: what an upgrade held back before
    // its exec comes in now.
    capexec::net::unblock_serving_signals();
    server
        .serve_until_or_upgraded(
            async move {
                activation::notify(&format!("READY=1\nMAINPID={}", std::process::id()));
                loop {
                    tokio::select! {
                        _ = terminate.recv() => {
                            tracing::info!("SIGTERM received");
                            break;
                        }
                        _ = interrupt.recv() => {
                            tracing::info!("SIGINT received");
                            break;
                        }
                        _ = hangup.recv() => {
                            activation::notify(&activation::reloading_state());
                            reload(&reloader, tls_files.as_ref(), client_certificates);
                            activation::notify("READY=1");
                        }
                    }
                }
                activation::notify("STOPPING=1");
            },
            upgrades,
        )
        .await;
    0
}

/// SIGHUP: the token file and the TLS certificate and key are read again;
/// what cannot be read is logged and the old one kept. Connections and
/// processes are not touched (a connection logged in with the old token
/// stays); nothing else is reloaded (listeners, limits, upstreams,
/// restrictions need a restart).
/// The TLS certificate and key, asking clients for certificates of their
/// own if `client_certificates` (a front whose user map has `cert` lines).
fn load_tls(
    cert: &std::path::Path,
    key: &std::path::Path,
    client_certificates: bool,
) -> Result<TlsServer, capexec::net::TlsError> {
    let tls = TlsServer::from_files(cert, key)?;
    if client_certificates {
        return tls.asking_client_certificates();
    }
    Ok(tls)
}

fn reload(
    reloader: &capexec::net::Reloader,
    tls_files: Option<&(PathBuf, PathBuf)>,
    client_certificates: bool,
) {
    tracing::info!("SIGHUP received: reloading the token and the TLS certificate");
    if let Err(error) = reloader.reload_token() {
        tracing::warn!("keeping the old token: {error}");
    }
    if let Some((cert, key)) = tls_files {
        match load_tls(cert, key, client_certificates) {
            Ok(tls) => {
                tracing::info!(
                    sha256 = tls.fingerprint(),
                    "serving the reloaded TLS certificate"
                );
                if let Some(expires) = tls.expires() {
                    warn_about_expiry(cert, expires, SystemTime::now());
                }
                reloader.replace_tls(tls);
            }
            Err(error) => tracing::warn!("keeping the old TLS certificate: {error}"),
        }
    }
    tracing::info!("reloaded");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificates_near_or_past_expiry_are_warned_about() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let day = Duration::from_secs(86_400);
        assert_eq!(expiry_warning(now + 30 * day, now), None);
        assert_eq!(
            expiry_warning(now + 14 * day, now),
            Some(Expiry::Soon("14 days".into()))
        );
        assert_eq!(
            expiry_warning(now + day + day / 2, now),
            Some(Expiry::Soon("1 day".into()))
        );
        assert_eq!(
            expiry_warning(now - 3 * day, now),
            Some(Expiry::Expired("3 days".into()))
        );
        assert_eq!(
            expiry_warning(now - day / 3, now),
            Some(Expiry::Expired("less than a day".into()))
        );
    }
}
