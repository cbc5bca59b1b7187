//! `capexec serve` processes for the benchmarks, and what /proc says about
//! them.

use std::error::Error;
use std::fmt;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use capexec::capexec_capnp::executor;
use capexec::net::{Address, Connection, ServerTrust, TlsClient, TlsServer, Token};

pub const CAPEXEC: &str = env!("CARGO_BIN_EXE_capexec");

/// The server binary: `$CAPEXEC_BENCH_SERVER` (for profiling a build with
/// symbols), else the one cargo built.
fn server_binary() -> String {
    std::env::var("CAPEXEC_BENCH_SERVER").unwrap_or_else(|_| CAPEXEC.to_string())
}

/// What a server listens on.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Listen {
    Unix,
    /// TCP on loopback, with a fresh token.
    Tcp,
    /// The same over TLS, with a certificate made for the run, which
    /// clients pin.
    Tls,
}

/// One `capexec serve`, stopped (SIGTERM, then waited for) on drop.
pub struct Serve {
    child: Child,
    pub address: Address,
    pub token: Option<Token>,
    /// A TLS server's certificate, as clients pin it (SHA-256), and a
    /// client config pinning it.
    tls: Option<(String, TlsClient)>,
    _dir: tempfile::TempDir,
}

impl Serve {
    /// Serves a Unix socket, or TCP on loopback (with a fresh token), with
    /// `extra` arguments.
    pub fn start(tcp: bool, extra: &[String]) -> Result<Serve, Box<dyn Error>> {
        Serve::listening(if tcp { Listen::Tcp } else { Listen::Unix }, extra)
    }

    /// Serves as `listen` says, with `extra` arguments.
    pub fn listening(listen: Listen, extra: &[String]) -> Result<Serve, Box<dyn Error>> {
        let dir = tempfile::tempdir()?;
        let token_file = dir.path().join("token");
        let mut tls_args = Vec::new();
        let mut tls = None;
        if listen == Listen::Tls {
            // As `--tls-self-signed` makes its own (ECDSA P-256).
            let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()])?;
            let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
            std::fs::write(&key, made.signing_key.serialize_pem())?;
            std::fs::write(&cert, made.cert.pem())?;
            let pin = TlsServer::certificate_fingerprint(&cert)?;
            let client = TlsClient::new(ServerTrust::Pin(pin.clone()))?;
            tls = Some((pin, client));
            tls_args.push("--tls-cert".into());
            tls_args.push(cert.into_os_string());
            tls_args.push("--tls-key".into());
            tls_args.push(key.into_os_string());
        }
        let listen = match listen {
            Listen::Tcp | Listen::Tls => "tcp:127.0.0.1:0".to_string(),
            Listen::Unix => format!("unix:{}", dir.path().join("capexec.sock").display()),
        };
        let mut command = std::process::Command::new(server_binary());
        // SAFETY: prctl is async-signal-safe; the server dies with us, even
        // if the watchdog ends the run without dropping anything.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command
            .arg("serve")
            .args(["--listen", &listen])
            .arg("--token-file")
            .arg(&token_file)
            .args(tls_args)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .env("RUST_LOG", "warn")
            .spawn()?;
        // Owned from here on, so every early return below stops it.
        let mut serve = Serve {
            child,
            address: Address::Unix(dir.path().join("capexec.sock")),
            token: None,
            tls,
            _dir: dir,
        };
        let stdout = serve.child.stdout.take().ok_or("no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        serve.address = line
            .trim()
            .parse()
            .map_err(|error| format!("capexec serve printed {line:?}: {error}"))?;
        if matches!(serve.address, Address::Tcp { .. }) {
            serve.token = Some(Token::load(&token_file)?);
        }
        Ok(serve)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub async fn connect(&self) -> Result<(executor::Client, Connection), Box<dyn Error>> {
        let tls = self.tls.as_ref().map(|(_, client)| client);
        let connection =
            capexec::net::connect_with(&self.address, self.token.as_ref(), tls).await?;
        Ok((connection.executor(), connection))
    }

    /// `--connect ADDR` (and `--tls-pin SHA256` over TLS) and, for TCP,
    /// the token in the environment.
    pub fn cli_args(&self) -> (Vec<String>, Option<(&'static str, String)>) {
        let mut args = vec!["--connect".to_string(), self.address.to_string()];
        if let Some((pin, _)) = &self.tls {
            args.extend(["--tls-pin".to_string(), pin.clone()]);
        }
        let token = self
            .token
            .as_ref()
            .map(|token| ("CAPEXEC_TOKEN", token.as_str().to_string()));
        (args, token)
    }

    /// What /proc says about the server now.
    pub fn usage(&self) -> std::io::Result<Usage> {
        Ok(crate::procfs::usage(self.pid()))
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        // SIGTERM so the server shuts down cleanly (and removes its socket).
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The servers every section shares: Unix, TCP, TLS, and a chain A -> B
/// whose front forwards plain starts to B.
pub struct Servers {
    pub unix: Serve,
    pub tcp: Serve,
    pub tls: Serve,
    pub chain_front: Serve,
    _chain_back: Serve,
}

impl Servers {
    pub async fn start() -> Result<Servers, Box<dyn Error>> {
        let back = Serve::start(false, &[])?;
        let front = Serve::start(
            false,
            &[
                "--upstream".to_string(),
                format!("b={}", back.address),
                "--default".to_string(),
                "b".to_string(),
            ],
        )?;
        Ok(Servers {
            unix: Serve::start(false, &[])?,
            tcp: Serve::start(true, &[])?,
            tls: Serve::listening(Listen::Tls, &[])?,
            chain_front: front,
            _chain_back: back,
        })
    }
}

/// Connections to the Unix and TCP servers, for the cases that compare
/// the two.
pub struct Direct {
    pub unix: executor::Client,
    pub tcp: executor::Client,
    /// Where the Unix connection's dials open their direct channels.
    pub unix_route: Option<capexec::net::DirectRoute>,
    _connections: [Connection; 2],
}

impl Servers {
    pub async fn connect_direct(&self) -> Result<Direct, Box<dyn Error>> {
        let (unix, unix_connection) = self.unix.connect().await?;
        let (tcp, tcp_connection) = self.tcp.connect().await?;
        Ok(Direct {
            unix,
            tcp,
            unix_route: unix_connection.direct_route(),
            _connections: [unix_connection, tcp_connection],
        })
    }
}

impl fmt::Display for Servers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unix {}, tcp {}, tls {}, chain {} -> {}",
            self.unix.address,
            self.tcp.address,
            self.tls.address,
            self.chain_front.address,
            self._chain_back.address
        )
    }
}

pub use crate::procfs::Usage;
