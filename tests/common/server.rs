//! A capexec server on its own thread of the test process.

use std::sync::mpsc;
use std::thread::JoinHandle;

use capexec::engine::Engine;
use capexec::net::{Address, Server, ServerConfig, Token};
use tokio::sync::oneshot;

use super::data::TempDir;

pub struct ServerThread {
    pub address: Address,
    pub token: Option<Token>,
    /// Every address served (Unix first when both are asked for).
    pub addresses: Vec<Address>,
    pub dir: TempDir,
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
        let token_file = dir.path().join("token");
        let config = ServerConfig {
            listen,
            token_file: Some(token_file.clone()),
        };
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
        let addresses: Vec<Address> = addresses.recv().expect("server addresses");
        let token = addresses
            .iter()
            .any(Address::is_tcp)
            .then(|| Token::load(&token_file).expect("token"));
        ServerThread {
            address: addresses[0].clone(),
            token,
            addresses,
            dir,
            stop: Some(stop),
            thread: Some(thread),
        }
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
