//! `capexec servers` (the named servers of the configuration file) and
//! `capexec client-config` (what a new client needs, to paste).

use std::path::PathBuf;

use clap::Args;

use crate::cli::EXIT_CAPEXEC_FAILURE;
use crate::cli::config::{self, Config};
use crate::cli::named::Named;
use capexec::net::{Address, TlsServer, Token};

#[derive(Args, Debug)]
pub struct ListArgs {
    /// One JSON array of objects instead of a table (see the README's
    /// "JSON output").
    #[arg(long)]
    json: bool,
}

/// The servers that can be reached, and a line on stderr for each part
/// of the file that is wrong (exit 125 then).
pub fn list_main(args: ListArgs) -> i32 {
    let config = match Config::load() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("capexec: {error}");
            return EXIT_CAPEXEC_FAILURE;
        }
    };
    let text = if args.json {
        crate::cli::inspect::json_line(&servers_json(&config))
    } else {
        table(&config)
    };
    let code = crate::cli::stdio::print_answer(text, "the answer");
    if code != 0 {
        return code;
    }
    for broken in &config.broken {
        eprintln!("capexec: {}", broken.message);
    }
    if config.broken.is_empty() {
        0
    } else {
        EXIT_CAPEXEC_FAILURE
    }
}

/// One line per server: name, address, how TLS is trusted, environment;
/// then `local` unless the file names it.
fn table(config: &Config) -> String {
    let mut rows = vec![[
        "NAME".to_string(),
        "ADDRESS".to_string(),
        "TLS".to_string(),
        "ENVIRONMENT".to_string(),
    ]];
    for entry in &config.servers {
        rows.push([
            entry.name.clone(),
            entry.server.address.to_string(),
            trust(&entry.server),
            entry
                .server
                .environment
                .clone()
                .unwrap_or_else(|| "-".to_string()),
        ]);
    }
    if let Some(local) = local_row(config) {
        rows.push([
            crate::cli::named::LOCAL.to_string(),
            local.to_string(),
            "-".to_string(),
            "-".to_string(),
        ]);
    }
    let widths: Vec<usize> = (0..4)
        .map(|column| rows.iter().map(|row| row[column].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let line = format!(
            "{:w0$}  {:w1$}  {:w2$}  {}",
            row[0],
            row[1],
            row[2],
            row[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2]
        );
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `servers --json`: one object per server, as the table lists them:
/// `name`, `address`, `tls` ("pin", "ca", "first-use", "none"; null for a
/// Unix socket), `tls_pin`, `tls_ca`, `token_file`, `environment`, and
/// where it is defined, `file` and `line` (null for the built-in `local`).
fn servers_json(config: &Config) -> serde_json::Value {
    let path = |path: &Option<PathBuf>| {
        path.as_ref()
            .map(|path| path.to_string_lossy().into_owned())
    };
    let mut objects: Vec<serde_json::Value> = config
        .servers
        .iter()
        .map(|entry| {
            let server = &entry.server;
            let trusted = trust(server);
            let tls = match trusted.split(' ').next() {
                Some("-") => None,
                Some("first") => Some("first-use"),
                other => other,
            };
            serde_json::json!({
                "name": entry.name,
                "address": server.address.to_string(),
                "tls": tls,
                "tls_pin": server.tls_pin,
                "tls_ca": path(&server.tls_ca),
                "token_file": path(&server.token_file),
                "environment": server.environment,
                "file": server.origin.as_ref().map(|origin| origin.file.to_string_lossy()),
                "line": entry.line,
            })
        })
        .collect();
    if let Some(local) = local_row(config) {
        objects.push(serde_json::json!({
            "name": crate::cli::named::LOCAL,
            "address": local.to_string(),
            "tls": null,
            "tls_pin": null,
            "tls_ca": null,
            "token_file": null,
            "environment": null,
            "file": null,
            "line": null,
        }));
    }
    serde_json::Value::Array(objects)
}

/// The default socket `local` reaches, unless the file names `local`.
fn local_row(config: &Config) -> Option<Address> {
    if config.get(crate::cli::named::LOCAL).is_some() {
        return None;
    }
    capexec::net::default_socket_path().ok().map(Address::Unix)
}

fn trust(entry: &Named) -> String {
    if !entry.address.is_tcp() {
        "-".to_string()
    } else if let Some(ca) = &entry.tls_ca {
        format!("ca {}", ca.display())
    } else if let Some(pin) = &entry.tls_pin {
        let short: String = pin.chars().take(16).collect();
        format!("pin {short}...")
    } else if entry.insecure_plaintext {
        "none".to_string()
    } else {
        "first use".to_string()
    }
}

#[derive(Args, Debug)]
pub struct ClientConfigArgs {
    /// The name the client will know this server by.
    name: String,
    /// The address the client reaches this server at (tcp:HOST:PORT as
    /// seen from the client).
    #[arg(long, value_name = "ADDR")]
    address: String,
    /// The server's token file. Default: $XDG_CONFIG_HOME/capexec/token or
    /// ~/.config/capexec/token.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Pin the certificate the server serves with (its --tls-cert).
    #[arg(long, value_name = "FILE", conflicts_with = "tls_self_signed")]
    tls_cert: Option<PathBuf>,
    /// Pin the certificate `capexec serve --tls-self-signed` made.
    #[arg(long)]
    tls_self_signed: bool,
    /// One JSON object (name, address, token, tls_pin) instead of the
    /// lines to paste, for provisioning tools.
    #[arg(long)]
    json: bool,
}

pub fn client_config_main(args: ClientConfigArgs) -> i32 {
    match client_config(&args) {
        Ok(text) => crate::cli::stdio::print_answer(text, "the configuration"),
        Err(error) => {
            eprintln!("capexec: {error}");
            EXIT_CAPEXEC_FAILURE
        }
    }
}

fn client_config(args: &ClientConfigArgs) -> Result<String, String> {
    if !config::valid_name(&args.name) {
        return Err(format!(
            "{:?} is not a server name: letters, digits, '-', '_' and '.'",
            args.name
        ));
    }
    let address: Address = args
        .address
        .parse()
        .map_err(|error| format!("--address {error}"))?;
    if !address.is_tcp() {
        return Err(format!(
            "--address {address}: a client on another machine reaches the server over tcp: \
             (a Unix socket needs only `address = \"{address}\"` in its configuration)"
        ));
    }
    let token_file = args
        .token_file
        .clone()
        .or_else(capexec::net::default_token_path)
        .ok_or("no token file: give --token-file FILE")?;
    let token =
        Token::load(&token_file).map_err(|error| crate::cli::target::token_problem("", &error))?;
    let cert = match (&args.tls_cert, args.tls_self_signed) {
        (Some(cert), _) => Some(cert.clone()),
        (None, true) => Some(crate::cli::self_signed::paths()?.0),
        (None, false) => None,
    };
    let pin = match cert {
        Some(cert) => Some(TlsServer::certificate_fingerprint(&cert).map_err(|e| e.to_string())?),
        None => None,
    };
    let name = &args.name;
    if args.json {
        return Ok(crate::cli::inspect::json_line(&serde_json::json!({
            "name": name,
            "address": address.to_string(),
            "token": token.as_str(),
            "tls_pin": pin,
        })));
    }
    // The client's directory, wherever its XDG_CONFIG_HOME puts it; the
    // token file beside the configuration file, where a relative
    // token-file is looked for.
    let dir = "\"${XDG_CONFIG_HOME:-$HOME/.config}/capexec\"";
    let mut out = format!(
        "# On the client, save the token (readable only by its user):\n\
         #   mkdir -p {dir} && (umask 077 && echo '{}' > {dir}/{name}.token)\n\
         # then add these lines to {dir}/config.toml:\n\
         [servers.{name}]\n\
         address = \"{address}\"\n\
         token-file = \"{name}.token\"\n",
        token.as_str()
    );
    match pin {
        Some(pin) => out.push_str(&format!("tls-pin = \"{pin}\"\n")),
        None => out.push_str(
            "# no TLS: the token crosses the network in clear text (loopback or a tunnel only)\n\
             insecure-plaintext = true\n",
        ),
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn servers_are_listed_as_a_table() {
        let config = Config::parse(
            Path::new("/c/config.toml"),
            "[servers.build]\naddress = \"tcp:build-box:7000\"\ntls-pin = \"ab\"\n",
        );
        assert!(
            config.servers.is_empty() && config.broken.len() == 1,
            "a short pin is refused"
        );
        let config = Config::parse(
            Path::new("/c/config.toml"),
            &format!(
                "[servers.build]\naddress = \"tcp:build-box:7000\"\ntls-pin = \"{}\"\n\
                 environment = \"gpu\"\n[servers.local]\naddress = \"unix:/s\"\n",
                "ab".repeat(32)
            ),
        );
        assert!(config.broken.is_empty(), "{:?}", config.broken);
        assert_eq!(
            table(&config),
            "NAME   ADDRESS             TLS                      ENVIRONMENT\n\
             build  tcp:build-box:7000  pin abababababababab...  gpu\n\
             local  unix:/s             -                        -\n"
        );
    }
}
