//! `--connect ADDR` and the options that go with it: the executor a
//! command talks to, embedded in this process unless an address is given.

use std::rc::Rc;
use std::time::Duration;

use capexec::capexec_capnp::executor;
use capexec::engine::{self, Engine};
use capexec::net::{self, Address, ConnectError, ConnectOptions, Connection, Token, TokenError};
use capexec::rpc;

use crate::cli::ConnectArgs;

/// Silence after which a connection counts as lost, unless `--keepalive`
/// says otherwise (see `net::ConnectOptions::keepalive`).
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(15);

/// An executor and, for a remote one, the connection it lives on (dropping
/// it closes the connection).
pub struct Target {
    pub executor: executor::Client,
    pub connection: Option<Connection>,
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
    let address = match &args.connect {
        None => None,
        Some(text) => Some(
            text.parse::<Address>()
                .map_err(|error| format!("--connect {error}"))?,
        ),
    };
    check(args, address.as_ref())?;
    let Some(address) = address else {
        if let Err(error) = engine::become_subreaper() {
            tracing::warn!(%error, "cannot become a subreaper; orphaned grandchildren will not be reaped here");
        }
        return Ok(Target {
            executor: rpc::local_executor(Engine::default()),
            connection: None,
        });
    };
    let token = if address.is_tcp() {
        login_token(args.token_file.as_deref())?
    } else {
        None
    };
    let options = ConnectOptions {
        tls: client_tls(args)?,
        deadline: args.connect_timeout.unwrap_or(net::CONNECT_TIMEOUT),
        keepalive: Some(args.keepalive.unwrap_or(DEFAULT_KEEPALIVE)),
        plaintext_only_to_loopback: !args.insecure_plaintext,
    };
    let connection = net::connect_to(&address, token.as_ref(), &options)
        .await
        .map_err(|error| error.to_string())?;
    Ok(Target {
        executor: connection.executor(),
        connection: Some(connection),
    })
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

/// `--tls-ca FILE` or `--tls-pin SHA256`, if either is given.
fn client_tls(args: &ConnectArgs) -> Result<Option<net::TlsClient>, String> {
    let (flag, trust) = match (&args.tls_ca, &args.tls_pin) {
        (Some(ca), _) => ("--tls-ca", net::ServerTrust::Ca(ca.clone())),
        (None, Some(pin)) => ("--tls-pin", net::ServerTrust::Pin(pin.clone())),
        (None, None) => return Ok(None),
    };
    net::TlsClient::new(trust)
        .map(Some)
        .map_err(|error| format!("{flag} {error}"))
}

/// `file`, else `$CAPEXEC_TOKEN` (the token itself), else the default
/// token file if it exists.
pub fn login_token(file: Option<&std::path::Path>) -> Result<Option<Token>, String> {
    if let Some(path) = file {
        return Token::load(path)
            .map(Some)
            .map_err(|error| token_problem("--token-file ", &error));
    }
    if let Some(secret) = std::env::var_os("CAPEXEC_TOKEN") {
        let secret = secret.to_string_lossy().trim().to_string();
        if !secret.is_empty() {
            return Ok(Some(Token::new(secret)));
        }
    }
    match net::default_token_path() {
        Some(path) if path.exists() => Token::load(&path)
            .map(Some)
            .map_err(|error| token_problem("the default token file ", &error)),
        _ => Ok(None),
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
