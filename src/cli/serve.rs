//! `capexec serve`: an executor on Unix sockets and TCP until SIGTERM or
//! SIGINT.

use std::io::Write;

use tokio::signal::unix::{SignalKind, signal};

use std::collections::HashMap;
use std::path::PathBuf;

use crate::cli::capacity::{self, Asked, Capacity};
use crate::cli::{EXIT_CAPEXEC_FAILURE, ServeArgs, target};
use capexec::engine::descriptors::DescriptorBudget;
use capexec::engine::{self, ChildSetup, Engine, ProcessLimits};
use capexec::net::{
    Address, CallLimits, Server, ServerConfig, ServerTrust, TlsClient, TlsServer, Token,
    UpstreamConfig,
};
use std::time::{Duration, SystemTime};

pub fn main(args: ServeArgs) -> i32 {
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
    if !args.hide_kernel_features.is_empty() {
        let config = capexec::sandbox::HostConfig {
            hidden: args.hide_kernel_features.iter().copied().collect(),
        };
        let _ = capexec::sandbox::configure(config);
    }
    let mut listen = Vec::new();
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
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => match TlsServer::from_files(cert, key) {
            Ok(tls) => Some(tls),
            Err(error) => {
                eprintln!("capexec: {error}");
                return EXIT_CAPEXEC_FAILURE;
            }
        },
        _ => None,
    };
    if let Some(tls) = &tls {
        if !listen.iter().any(Address::is_tcp) {
            eprintln!("capexec: --tls-cert applies to tcp: listeners, and there is none");
            return EXIT_CAPEXEC_FAILURE;
        }
        tracing::info!(
            sha256 = tls.fingerprint(),
            "serving TLS; clients can pin this certificate with --tls-pin"
        );
        if let (Some(expires), Some(cert)) = (tls.expires(), &args.tls_cert) {
            warn_about_expiry(cert, expires, std::time::SystemTime::now());
        }
    }
    if let Err(error) = engine::become_subreaper() {
        tracing::warn!(%error, "cannot become a subreaper; orphaned grandchildren will not be reaped here");
    }
    let descriptor_limit = raise_descriptor_limit();
    let capacity = match descriptor_capacity(&args) {
        Ok(capacity) => capacity,
        Err(error) => {
            eprintln!("capexec: {error}");
            return EXIT_CAPEXEC_FAILURE;
        }
    };
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
        max_processes_per_connection: Some(capacity.per_connection),
        login_deadline: None,
        policy,
    };
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

    crate::cli::run_local(serve(config, Engine::new(limits), capacity))
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
        let address: Address = address
            .parse()
            .map_err(|error| format!("--upstream {name}: {error}"))?;
        // Each upstream has its own secret: never fall back to this
        // server's own token (or anything else that could leak it).
        let token = match (token_files.remove(name), address.is_tcp()) {
            (Some(file), true) => Some(
                {
                    // What this server logs in with is no sandbox's to read.
                    capexec::sandbox::protect(&file);
                    Token::load(&file)
                }
                .map_err(|error| {
                    target::token_problem(&format!("--upstream-token-file {name}="), &error)
                })?,
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
                    ServerTrust::Pin(_) => "--upstream-tls-pin",
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

/// The limits of `args`, fitted into the descriptor limit (see
/// `cli::capacity`).
fn descriptor_capacity(args: &ServeArgs) -> Result<Capacity, String> {
    let budget = DescriptorBudget::of_this_process()
        .map_err(|error| format!("cannot work out the descriptor budget: {error}"))?;
    capacity::fit(
        Asked {
            max_processes: args.max_processes,
            per_connection: args.max_processes_per_connection,
            pending: args.max_pending_logins,
            pending_per_address: args.max_pending_logins_per_address,
        },
        budget,
    )
}

/// Says at start what the server holds, and what was lowered to fit.
fn log_capacity(capacity: &Capacity) {
    let budget = capacity.budget;
    for lowered in capacity.lowered.iter().flatten() {
        tracing::warn!(descriptor_limit = budget.limit, "{lowered}");
    }
    tracing::info!(
        descriptor_limit = budget.limit,
        kept_for_connections = budget.connections,
        max_processes = capacity.max_processes,
        max_processes_per_connection = capacity.per_connection,
        max_pending_logins = capacity.pending.total,
        "process and connection limits"
    );
}

async fn serve(config: ServerConfig, engine: Engine, capacity: Capacity) -> i32 {
    // Registered before binding, so a signal that arrives as soon as the
    // addresses are printed is not lost.
    let (mut terminate, mut interrupt) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(terminate), Ok(interrupt)) => (terminate, interrupt),
        (Err(error), _) | (_, Err(error)) => {
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
    log_capacity(&capacity);
    if let Some(path) = server.token_path() {
        tracing::info!(path = %path.display(), "tcp logins use the token in this file");
    }
    let mut stdout = std::io::stdout().lock();
    for address in server.addresses() {
        let _ = writeln!(stdout, "{address}");
    }
    let _ = stdout.flush();
    drop(stdout);
    server
        .serve_until(async move {
            tokio::select! {
                _ = terminate.recv() => tracing::info!("SIGTERM received"),
                _ = interrupt.recv() => tracing::info!("SIGINT received"),
            }
        })
        .await;
    0
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
