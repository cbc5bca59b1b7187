//! `--connect ADDR [--token-file FILE]`: the executor a command talks to,
//! embedded in this process unless an address is given.

use capexec::capexec_capnp::executor;
use capexec::engine::{self, Engine};
use capexec::net::{self, Address, Connection, Token};
use capexec::rpc;

use crate::cli::ConnectArgs;

/// An executor and, for a remote one, the connection it lives on (dropping
/// it closes the connection).
pub struct Target {
    pub executor: executor::Client,
    pub _connection: Option<Connection>,
}

/// Connects as `args` say; the embedded executor if there is no address.
pub async fn target(args: &ConnectArgs) -> Result<Target, String> {
    let Some(address) = &args.connect else {
        if let Err(error) = engine::become_subreaper() {
            tracing::warn!(%error, "cannot become a subreaper; orphaned grandchildren will not be reaped here");
        }
        return Ok(Target {
            executor: rpc::local_executor(Engine::default()),
            _connection: None,
        });
    };
    let address: Address = address
        .parse()
        .map_err(|error| format!("--connect {error}"))?;
    let token = if address.is_tcp() {
        login_token(args.token_file.as_deref())?
    } else {
        None
    };
    let tls = client_tls(args)?;
    if let Address::Tcp { host, .. } = &address
        && tls.is_none()
        && !args.insecure_plaintext
        && !is_loopback(host)
    {
        return Err(format!(
            "refusing to send the login token in clear text to {host}: give --tls-ca FILE or \
             --tls-pin SHA256 (or --insecure-plaintext over a network you trust)"
        ));
    }
    let connection = net::connect_with(&address, token.as_ref(), tls.as_ref())
        .await
        .map_err(|error| error.to_string())?;
    Ok(Target {
        executor: connection.executor(),
        _connection: Some(connection),
    })
}

/// Whether `host` names this machine, where a token cannot be overheard.
pub fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `--tls-ca FILE` or `--tls-pin SHA256`, if either is given.
fn client_tls(args: &ConnectArgs) -> Result<Option<net::TlsClient>, String> {
    let trust = match (&args.tls_ca, &args.tls_pin) {
        (Some(ca), _) => net::ServerTrust::Ca(ca.clone()),
        (None, Some(pin)) => net::ServerTrust::Pin(pin.clone()),
        (None, None) => return Ok(None),
    };
    net::TlsClient::new(trust)
        .map(Some)
        .map_err(|error| error.to_string())
}

/// `file`, else `$CAPEXEC_TOKEN`, else the default token file if it exists.
pub fn login_token(file: Option<&std::path::Path>) -> Result<Option<Token>, String> {
    if let Some(path) = file {
        return Token::load(path).map(Some).map_err(|e| e.to_string());
    }
    if let Some(secret) = std::env::var_os("CAPEXEC_TOKEN") {
        let secret = secret.to_string_lossy().trim().to_string();
        if !secret.is_empty() {
            return Ok(Some(Token::new(secret)));
        }
    }
    match net::default_token_path() {
        Some(path) if path.exists() => Token::load(&path).map(Some).map_err(|e| e.to_string()),
        _ => Ok(None),
    }
}
