//! `ssh -L` on this machine, for the ports section to compare with: an
//! sshd of our own on a loopback port (its own host key, config and
//! authorized key, in a temporary directory), and one `ssh -N -L` client
//! holding its connection open. Both end with the value.

use std::error::Error;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct SshForward {
    /// The local port `ssh -L` listens on.
    pub port: u16,
    sshd: Child,
    client: Child,
    _dir: tempfile::TempDir,
}

fn free_port() -> Result<u16, Box<dyn Error>> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn keygen(path: &std::path::Path) -> Result<(), Box<dyn Error>> {
    let status = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .stdin(Stdio::null())
        .status()?;
    if !status.success() {
        return Err(format!("ssh-keygen: {status}").into());
    }
    Ok(())
}

impl SshForward {
    /// `ssh -L PORT:127.0.0.1:target` through an sshd of our own, once
    /// the forward accepts connections.
    pub fn start(target: u16) -> Result<SshForward, Box<dyn Error>> {
        let dir = tempfile::tempdir()?;
        let host_key = dir.path().join("host_key");
        let user_key = dir.path().join("user_key");
        keygen(&host_key)?;
        keygen(&user_key)?;
        std::fs::copy(
            dir.path().join("user_key.pub"),
            dir.path().join("authorized_keys"),
        )?;
        let sshd_port = free_port()?;
        let config = dir.path().join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "Port {sshd_port}\nListenAddress 127.0.0.1\nHostKey {}\nAuthorizedKeysFile {}\n\
                 PidFile none\nStrictModes no\nUsePAM no\nPermitRootLogin prohibit-password\n\
                 PasswordAuthentication no\nAllowTcpForwarding yes\n",
                host_key.display(),
                dir.path().join("authorized_keys").display()
            ),
        )?;
        let sshd = Command::new("/usr/sbin/sshd")
            .args(["-D", "-e", "-f"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let port = free_port()?;
        let mut forward = SshForward {
            port,
            sshd,
            // Replaced below once sshd listens.
            client: Command::new("true").spawn()?,
            _dir: dir,
        };
        wait_for(sshd_port, "sshd")?;
        forward.client = Command::new("ssh")
            .args([
                "-N",
                "-o",
                "BatchMode=yes",
                "-o",
                "StrictHostKeyChecking=no",
            ])
            .args(["-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"])
            .args(["-o", "ExitOnForwardFailure=yes", "-i"])
            .arg(&user_key)
            .args(["-p", &sshd_port.to_string()])
            .args([
                "-L",
                &format!("{port}:127.0.0.1:{target}"),
                "root@127.0.0.1",
            ])
            .stdin(Stdio::null())
            .spawn()?;
        wait_for(port, "ssh -L")?;
        Ok(forward)
    }
}

/// Polls until something accepts on `port` (within 20 s).
fn wait_for(port: u16, what: &str) -> Result<(), Box<dyn Error>> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return Err(format!("{what} does not listen on port {port}").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

impl Drop for SshForward {
    fn drop(&mut self) {
        for child in [&mut self.client, &mut self.sshd] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
