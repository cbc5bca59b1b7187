//! A capexec server on its own thread of the test process.

use std::sync::mpsc;
use std::thread::JoinHandle;

use capexec::engine::Engine;
use capexec::net::{Address, Server, ServerConfig, Token, UpstreamConfig};
use tokio::sync::oneshot;

use super::data::TempDir;

pub struct ServerThread {
    pub address: Address,
    pub token: Option<Token>,
    /// Every address served (Unix first when both are asked for).
    pub addresses: Vec<Address>,
    pub dir: TempDir,
    config: ServerConfig,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl ServerThread {
    /// Serves a Unix socket, or TCP on loopback with a fresh token.
    pub fn start(tcp: bool) -> ServerThread {
        let dir = TempDir::new("server");
        let listen = if tcp {
            vec!["tcp:127.0.0.1:0".parse().expect("address")]
        } else {
            vec![Address::Unix(dir.path().join("capexec.sock"))]
        };
        ServerThread::start_with(dir, listen)
    }

    pub fn start_with(dir: TempDir, listen: Vec<Address>) -> ServerThread {
        ServerThread::start_forwarding(dir, listen, Vec::new(), None)
    }

    /// A Unix-socket server that forwards plain starts to `upstream` (its
    /// environment "b", made the default).
    pub fn start_in_front_of(upstream: &ServerThread) -> ServerThread {
        let dir = TempDir::new("front");
        let listen = vec![Address::Unix(dir.path().join("capexec.sock"))];
        let upstreams = vec![UpstreamConfig::new(
            "b",
            upstream.address.clone(),
            upstream.token.clone(),
        )];
        ServerThread::start_forwarding(dir, listen, upstreams, Some("b"))
    }

    pub fn start_forwarding(
        dir: TempDir,
        listen: Vec<Address>,
        upstreams: Vec<UpstreamConfig>,
        default_environment: Option<&str>,
    ) -> ServerThread {
        let config = ServerConfig {
            listen,
            token_file: Some(dir.path().join("token")),
            upstreams,
            default_environment: default_environment.map(str::to_string),
            // Room for one connection's most port connections through
            // direct channels (two descriptors each), which the share of
            // a 20,000 limit (1,250 a connection) does not carry.
            holding_limits: Some(capexec::rpc::HoldingLimits {
                descriptors: 8192,
                memory: capexec::rpc::MAX_HELD_MEMORY,
            }),
            ..ServerConfig::default()
        };
        ServerThread::serve(dir, config)
    }

    /// Serves TCP on loopback over TLS, with a fresh token.
    pub fn start_tls(dir: TempDir, tls: capexec::net::TlsServer) -> ServerThread {
        let config = ServerConfig {
            listen: vec!["tcp:127.0.0.1:0".parse().expect("address")],
            token_file: Some(dir.path().join("token")),
            tls: Some(tls),
            ..ServerConfig::default()
        };
        ServerThread::serve(dir, config)
    }

    /// A Unix-socket server with an admin socket too (`name`: its temporary
    /// directory's), and the admin socket's path.
    pub fn with_admin(name: &str) -> (ServerThread, std::path::PathBuf) {
        let dir = TempDir::new(name);
        let admin = dir.path().join("admin.sock");
        let config = ServerConfig {
            listen: vec![Address::Unix(dir.path().join("capexec.sock"))],
            admin: Some(admin.clone()),
            ..ServerConfig::default()
        };
        (ServerThread::serve(dir, config), admin)
    }

    /// Serves `config` (TCP listeners need its token file, kept in `dir`).
    pub fn serve(dir: TempDir, config: ServerConfig) -> ServerThread {
        let (addresses, stop, thread) = serve_on_thread(config.clone());
        let token = addresses.iter().any(Address::is_tcp).then(|| {
            let file = config.token_file.as_ref().expect("tcp needs a token file");
            Token::load(file).expect("token")
        });
        ServerThread {
            address: addresses[0].clone(),
            token,
            addresses,
            dir,
            config,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Starts the server again, as configured, after [`ServerThread::stop`]
    /// (Unix sockets come back at the same paths).
    pub fn restart(&mut self) {
        self.stop();
        let (_, stop, thread) = serve_on_thread(self.config.clone());
        self.stop = Some(stop);
        self.thread = Some(thread);
    }

    /// Stops the server (terminating its processes) and waits for it.
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            thread.join().expect("server thread");
        }
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs a server for `config` on a thread of its own; returns once it
/// listens.
fn serve_on_thread(config: ServerConfig) -> (Vec<Address>, oneshot::Sender<()>, JoinHandle<()>) {
    let (ready, addresses) = mpsc::channel();
    let (stop, stopped) = oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("test-server".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("server runtime");
            let local = tokio::task::LocalSet::new();
            local.block_on(&runtime, async move {
                let server = Server::bind(config, Engine::default())
                    .await
                    .expect("bind the test server");
                ready.send(server.addresses()).expect("report addresses");
                server
                    .serve_until(async move {
                        let _ = stopped.await;
                    })
                    .await;
            });
        })
        .expect("server thread");
    let addresses = addresses.recv().expect("server addresses");
    (addresses, stop, thread)
}
