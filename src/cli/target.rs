//! `--connect ADDR` and the options that go with it: the executor a
//! command talks to, embedded in this process unless an address is given.

use std::rc::Rc;
use std::time::Duration;

use capexec::capexec_capnp::executor;
use capexec::engine::{self, Engine};
use capexec::net::{self, Address, ConnectError, ConnectOptions, Connection, Token, TokenError};
use capexec::rpc;

use crate::cli::ConnectArgs;
use crate::cli::known_servers;
use crate::cli::named::{self, Named};

/// Silence after which a connection counts as lost, unless `--keepalive`
/// says otherwise (see `net::ConnectOptions::keepalive`).
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(15);

/// An executor and, for a remote one, the connection it lives on (dropping
/// it closes the connection).
pub struct Target {
    pub executor: executor::Client,
    pub connection: Option<Connection>,
    /// How to hand the executor descriptors for a start's stdio: the
    /// embedded one's, or a Unix socket's.
    pub stdio_route: Option<rpc::StdioRoute>,
    /// The environment the configuration file names for the server, used
    /// when no --environment is given.
    pub environment: Option<String>,
}

impl Target {
    /// Resolves once the server has answered, or fails with the one line
    /// to print (see `Connection::established`); at once when embedded.
    pub fn established(&self) -> impl Future<Output = Result<(), String>> + 'static + use<> {
        let established = self.connection.as_ref().map(Connection::established);
        async move {
            match established {
                Some(established) => established.await.map_err(|error| error.to_string()),
                None => Ok(()),
            }
        }
    }
}

/// The trust and timing options that only mean something with
/// `--connect`, or only with a `tcp:` one: given where they cannot apply,
/// they are refused rather than ignored.
fn check(args: &ConnectArgs, address: Option<&Address>) -> Result<(), String> {
    let given = [
        ("--token-file", args.token_file.is_some()),
        ("--tls-ca", args.tls_ca.is_some()),
        ("--tls-pin", args.tls_pin.is_some()),
        ("--insecure-plaintext", args.insecure_plaintext),
        ("--tls", args.tls),
        ("--tls-accept-new", args.tls_accept_new),
        ("--connect-timeout", args.connect_timeout.is_some()),
        ("--keepalive", args.keepalive.is_some()),
    ];
    let first = |flags: &[&str]| {
        given
            .iter()
            .find(|(flag, set)| *set && flags.contains(flag))
            .map(|(flag, _)| *flag)
    };
    match address {
        None => match first(&given.map(|(flag, _)| flag)) {
            Some(flag) => Err(format!(
                "{flag} needs --connect ADDR: the embedded executor has no connection"
            )),
            None => Ok(()),
        },
        Some(Address::Unix(_)) => {
            match first(&[
                "--token-file",
                "--tls-ca",
                "--tls-pin",
                "--insecure-plaintext",
                "--tls",
                "--tls-accept-new",
            ]) {
                Some(flag) => Err(format!(
                    "{flag} is for tcp: addresses: a Unix socket needs no token and no TLS \
                     (its file permissions protect it)"
                )),
                None => Ok(()),
            }
        }
        Some(Address::Tcp { .. }) => Ok(()),
    }
}

/// Connects as `args` say; the embedded executor if there is no address.
/// The login travels pipelined with the caller's first calls: race them
/// against [`Target::established`].
pub async fn target(args: &ConnectArgs) -> Result<Target, String> {
    let named = args
        .connect
        .as_deref()
        .map(|text| named::resolve_given(text, args.connect_given()))
        .transpose()?;
    check(args, named.as_ref().map(|named| &named.address))?;
    let Some(named) = named else {
        tracing::debug!("no --connect: the embedded executor, in this process");
        if let Err(error) = engine::become_subreaper() {
            tracing::warn!(%error, "cannot become a subreaper; orphaned grandchildren will not be reaped here");
        }
        let (executor, route) = rpc::local_executor_with_stdio_route(Engine::default());
        return Ok(Target {
            executor,
            connection: None,
            stdio_route: Some(route),
            environment: None,
        });
    };
    let address = named.address.clone();
    if tracing::enabled!(tracing::Level::DEBUG) {
        let from = match &named.origin {
            Some(origin) => format!("the server {} of {}", origin.server, origin.file.display()),
            None => "an address".to_string(),
        };
        tracing::debug!("connecting to {address} ({}: {from})", args.connect_given());
    }
    let token =
        match (&args.token_file, &named.token_file, &named.origin) {
            _ if !address.is_tcp() => None,
            (None, Some(file), Some(origin)) => {
                tracing::debug!("the login token: {}", origin.of("token-file"));
                Some(Token::load(file).map_err(|error| {
                    token_problem(&format!("{} ", origin.of("token-file")), &error)
                })?)
            }
            // A client certificate logs in by itself: no token is taken
            // from CAPEXEC_TOKEN or the default file (it would be tried
            // instead, and refused).
            (None, _, _) if args.tls_client_cert.is_some() || named.tls_client.is_some() => None,
            (given, _, _) => login_token(given.as_deref())?,
        };
    let identity = match (
        &args.tls_client_cert,
        &args.tls_client_key,
        &named.tls_client,
    ) {
        _ if !address.is_tcp() => None,
        (Some(cert), Some(key), _) => Some(
            net::ClientIdentity::from_files(cert, key)
                .map_err(|error| format!("--tls-client-cert: {error}"))?,
        ),
        (_, _, Some((cert, key))) => {
            let place = named.origin.as_ref().map_or_else(
                || "tls-client-cert".to_string(),
                |o| o.of("tls-client-cert"),
            );
            Some(
                net::ClientIdentity::from_files(cert, key)
                    .map_err(|error| format!("{place}: {error}"))?,
            )
        }
        _ => None,
    };
    // A certificate logs in by itself: an empty token says so.
    let token = match token {
        None if identity.is_some() => Some(Token::new(String::new())),
        token => token,
    };
    let trust = trust(args, &named, &address).await?;
    if identity.is_some() && matches!(trust, Trust::Plaintext) {
        return Err(format!(
            "--tls-client-cert: {address} is reached without TLS; give --tls-pin, --tls-ca or \
             --tls"
        ));
    }
    if tracing::enabled!(tracing::Level::DEBUG) && address.is_tcp() {
        tracing::debug!("{}", trust.describe());
    }
    let mut options = ConnectOptions {
        tls: match &trust {
            Trust::Given(flag, trust) => Some(
                net::TlsClient::presenting(trust.clone(), identity.clone())
                    .map_err(|error| format!("{flag} {error}"))?,
            ),
            Trust::FirstUse(_, known, _) => Some(first_use(
                known.as_ref().map(|k| k.fingerprint),
                identity.clone(),
            )?),
            Trust::Plaintext => None,
        },
        deadline: args.connect_timeout.unwrap_or(net::CONNECT_TIMEOUT),
        keepalive: Some(args.keepalive.unwrap_or(DEFAULT_KEEPALIVE)),
        plaintext_only_to_loopback: !(args.insecure_plaintext || named.insecure_plaintext),
    };
    let connection = match net::connect_to(&address, token.as_ref(), &options).await {
        Err(ConnectError::UnknownCertificate(_, offered)) => {
            let Trust::FirstUse(file, _, _) = &trust else {
                return Err(format!(
                    "{address}: the server's certificate is not trusted"
                ));
            };
            known_servers::accept_new(&address, &offered, file, args.tls_accept_new).await?;
            let fingerprint = net::parse_fingerprint(&offered)?;
            options.tls = Some(first_use(Some(fingerprint), identity)?);
            net::connect_to(&address, token.as_ref(), &options).await
        }
        Err(ConnectError::ChangedCertificate { known, offered, .. }) => {
            let (file, line) = match &trust {
                Trust::FirstUse(file, Some(known), _) => (file.display().to_string(), known.line),
                _ => ("the known-servers file".to_string(), 0),
            };
            return Err(format!(
                "the TLS certificate of {address} has CHANGED: it was {known}, it is now \
                 {offered}; nothing was sent to it. Someone may be intercepting the \
                 connection, or the server has a new certificate: if you know it has, \
                 delete line {line} of {file} and connect again"
            ));
        }
        Err(ConnectError::NoTls(_)) => return Err(no_tls(&address, &trust)),
        other => other,
    }
    .map_err(|error| error.to_string())?;
    if tracing::enabled!(tracing::Level::DEBUG) {
        let established = connection.established();
        let began = std::time::Instant::now();
        if address.is_tcp() {
            tracing::debug!("connected; the login travels with the first calls");
        } else {
            tracing::debug!("connected (a Unix socket: no login)");
        }
        tokio::task::spawn_local(async move {
            let after_ms = began.elapsed().as_millis() as u64;
            match established.await {
                Ok(()) => tracing::debug!(after_ms, "the server answered"),
                Err(error) => tracing::debug!(after_ms, %error, "the server did not answer"),
            }
        });
    }
    Ok(Target {
        executor: connection.executor(),
        stdio_route: connection.stdio_route(),
        connection: Some(connection),
        environment: named.environment,
    })
}

/// How a tcp: server's certificate is trusted.
enum Trust {
    /// `--tls-ca` or `--tls-pin` (the flag or the configuration file's
    /// key, for errors).
    Given(String, net::ServerTrust),
    /// Trust on first use, against the known-servers file (what it
    /// remembers for this address, if anything), and the flag or key that
    /// asked for it (none: the address is remembered there).
    FirstUse(
        std::path::PathBuf,
        Option<known_servers::Known>,
        Option<String>,
    ),
    /// No TLS (a loopback address, or --insecure-plaintext).
    Plaintext,
}

/// The command line's TLS options, else the configuration file's, else
/// trust on first use where it is asked for (`--tls`, `tls = true`) or a
/// certificate is remembered for the address.
async fn trust(args: &ConnectArgs, named: &Named, address: &Address) -> Result<Trust, String> {
    if !address.is_tcp() {
        return Ok(Trust::Plaintext);
    }
    let tls_flag = args.tls || args.tls_accept_new;
    let from_flags =
        args.tls_ca.is_some() || args.tls_pin.is_some() || tls_flag || args.insecure_plaintext;
    let place = |flag: &str, key: &str| match (&named.origin, from_flags) {
        (Some(origin), false) => origin.of(key),
        _ => flag.to_string(),
    };
    let (ca, pin, tls, insecure) = if from_flags {
        (
            args.tls_ca.clone(),
            args.tls_pin.clone(),
            tls_flag,
            args.insecure_plaintext,
        )
    } else {
        (
            named.tls_ca.clone(),
            named.tls_pin.clone(),
            named.tls,
            named.insecure_plaintext,
        )
    };
    if let Some(ca) = ca {
        return Ok(Trust::Given(
            place("--tls-ca", "tls-ca"),
            net::ServerTrust::Ca(ca),
        ));
    }
    if let Some(pin) = pin {
        return Ok(Trust::Given(
            place("--tls-pin", "tls-pin"),
            net::ServerTrust::Pin(pin),
        ));
    }
    if insecure {
        return Ok(Trust::Plaintext);
    }
    let file = known_servers::path().ok_or_else(|| {
        "no known-servers file for trust on first use (HOME is not set): give --tls-ca or \
         --tls-pin"
            .to_string()
    })?;
    let known = known_servers::lookup(&file, address)?;
    let asked = match (from_flags, args.tls_accept_new) {
        _ if !tls => None,
        (true, true) => Some("--tls-accept-new".to_string()),
        _ => Some(place("--tls", "tls")),
    };
    if tls || known.is_some() {
        Ok(Trust::FirstUse(file, known, asked))
    } else {
        Ok(Trust::Plaintext)
    }
}

impl Trust {
    /// How the server's certificate is trusted, for -v.
    fn describe(&self) -> String {
        match self {
            Trust::Given(flag, _) => format!("TLS, trusting {flag}"),
            Trust::FirstUse(file, Some(known), _) => format!(
                "TLS, trusting the certificate remembered in {} (line {})",
                file.display(),
                known.line
            ),
            Trust::FirstUse(file, None, _) => format!(
                "TLS, trusting on first use (nothing remembered for it in {})",
                file.display()
            ),
            Trust::Plaintext => "no TLS".to_string(),
        }
    }
}

/// A server that does not speak TLS, reached with TLS: what asked for it
/// (a flag, the configuration file, or a remembered certificate).
fn no_tls(address: &Address, trust: &Trust) -> String {
    match trust {
        Trust::Given(flag, _) | Trust::FirstUse(_, _, Some(flag)) => {
            format!("the server at {address} does not speak TLS: remove {flag}")
        }
        Trust::FirstUse(file, known, None) => format!(
            "the server at {address} does not speak TLS, yet its certificate is remembered in \
             {}{}; nothing was sent to it (if it no longer serves TLS, delete that line)",
            file.display(),
            known
                .as_ref()
                .map_or(String::new(), |known| format!(" (line {})", known.line))
        ),
        Trust::Plaintext => format!("the server at {address} does not speak TLS"),
    }
}

fn first_use(
    known: Option<[u8; 32]>,
    identity: Option<net::ClientIdentity>,
) -> Result<net::TlsClient, String> {
    net::TlsClient::presenting(net::ServerTrust::FirstUse(known), identity)
        .map_err(|error| error.to_string())
}

/// [`target`], once the server has answered: for commands that make one
/// call and gain nothing from pipelining it with the login.
pub async fn established_target(args: &ConnectArgs) -> Result<Target, String> {
    let target = target(args).await?;
    target.established().await?;
    Ok(target)
}

/// Whether the error of a failed connection is worth another attempt
/// (the server may be back soon) rather than final (wrong token, bad
/// address, TLS refused).
pub fn worth_retrying(error: &Rc<ConnectError>) -> bool {
    matches!(
        **error,
        ConnectError::Io(..)
            | ConnectError::Timeout(..)
            | ConnectError::NotASocket(..)
            | ConnectError::Closed(..)
    )
}

/// `file`, else `$CAPEXEC_TOKEN` (the token itself), else the default
/// token file if it exists.
pub fn login_token(file: Option<&std::path::Path>) -> Result<Option<Token>, String> {
    if let Some(path) = file {
        tracing::debug!("the login token: --token-file {}", path.display());
        return Token::load(path)
            .map(Some)
            .map_err(|error| token_problem("--token-file ", &error));
    }
    if let Some(secret) = std::env::var_os("CAPEXEC_TOKEN") {
        let secret = secret.to_string_lossy().trim().to_string();
        if !secret.is_empty() {
            tracing::debug!("the login token: CAPEXEC_TOKEN");
            return Ok(Some(Token::new(secret)));
        }
    }
    match net::default_token_path() {
        Some(path) if path.exists() => {
            tracing::debug!("the login token: the default token file {}", path.display());
            Token::load(&path)
                .map(Some)
                .map_err(|error| token_problem("the default token file ", &error))
        }
        _ => {
            tracing::debug!("no login token");
            Ok(None)
        }
    }
}

/// A token file's problem, naming where the file came from.
pub fn token_problem(source: &str, error: &TokenError) -> String {
    match error {
        TokenError::Read(path, error) => {
            format!(
                "{source}{}: {}",
                path.display(),
                capexec::model::io_message(error)
            )
        }
        TokenError::Create(path, error) => format!(
            "{source}{}: cannot create it: {}",
            path.display(),
            capexec::model::io_message(error)
        ),
        TokenError::Empty(path) => format!("{source}{}: the file is empty", path.display()),
        TokenError::TooShort(path, length) => format!(
            "{source}{}: it holds a token of {length} bytes; a token has at least {} (copy \
             the server's token file)",
            path.display(),
            net::MIN_TOKEN_BYTES
        ),
    }
}
