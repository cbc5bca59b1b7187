//! `capexec serve` processes for the benchmarks, and what /proc says about
//! them.

use std::error::Error;
use std::fmt;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use capexec::capexec_capnp::executor;
use capexec::net::{Address, Connection, Token};

pub const CAPEXEC: &str = env!("CARGO_BIN_EXE_capexec");

/// The server binary: `$CAPEXEC_BENCH_SERVER` (for profiling a build with
/// symbols), else the one cargo built.
fn server_binary() -> String {
    std::env::var("CAPEXEC_BENCH_SERVER").unwrap_or_else(|_| CAPEXEC.to_string())
}

/// One `capexec serve`, stopped (SIGTERM, then waited for) on drop.
pub struct Serve {
    child: Child,
    pub address: Address,
    pub token: Option<Token>,
    _dir: tempfile::TempDir,
}

impl Serve {
    /// Serves a Unix socket, or TCP on loopback (with a fresh token), with
    /// `extra` arguments.
    pub fn start(tcp: bool, extra: &[String]) -> Result<Serve, Box<dyn Error>> {
        let dir = tempfile::tempdir()?;
        let token_file = dir.path().join("token");
        let listen = if tcp {
            "tcp:127.0.0.1:0".to_string()
        } else {
            format!("unix:{}", dir.path().join("capexec.sock").display())
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
            _dir: dir,
        };
        let stdout = serve.child.stdout.take().ok_or("no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        serve.address = line
            .trim()
            .parse()
            .map_err(|error| format!("capexec serve printed {line:?}: {error}"))?;
        if tcp {
            serve.token = Some(Token::load(&token_file)?);
        }
        Ok(serve)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub async fn connect(&self) -> Result<(executor::Client, Connection), Box<dyn Error>> {
        let connection = capexec::net::connect(&self.address, self.token.as_ref()).await?;
        Ok((connection.executor(), connection))
    }

    /// `--connect ADDR` and, for TCP, the token in the environment.
    pub fn cli_args(&self) -> (Vec<String>, Option<(&'static str, String)>) {
        let args = vec!["--connect".to_string(), self.address.to_string()];
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

/// The servers every section shares: Unix, TCP, and a chain A -> B whose
/// front forwards plain starts to B.
pub struct Servers {
    pub unix: Serve,
    pub tcp: Serve,
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
            "unix {}, tcp {}, chain {} -> {}",
            self.unix.address, self.tcp.address, self.chain_front.address, self._chain_back.address
        )
    }
}

pub use crate::procfs::Usage;
