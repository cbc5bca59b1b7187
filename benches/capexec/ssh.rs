//! OpenSSH on this machine, for the sections that compare with it: an sshd
//! of our own on a loopback port (its own host key, config and authorized
//! key, in a temporary directory), and its clients, every one with the
//! cipher the comparisons name ([`CIPHER`]): scp (files), one `ssh -N -L`
//! holding its connection open (ports), and a multiplexed master whose
//! clients run whole commands (cli). Each ends with its value.

use std::error::Error;
use std::ffi::{OsStr, OsString};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::wall::time_process;

/// The cipher of every ssh connection the benchmarks make: AES-GCM, which
/// the CPU does in hardware, as capexec's TLS does.
pub const CIPHER: &str = "aes128-gcm@openssh.com";

const SSHD: &str = "/usr/sbin/sshd";

/// An sshd of the benchmarks' own on a free loopback port; killed on drop.
pub struct Sshd {
    child: Child,
    port: u16,
    key: PathBuf,
    dir: tempfile::TempDir,
}

fn free_port() -> Result<u16, Box<dyn Error>> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn keygen(path: &Path) -> Result<(), Box<dyn Error>> {
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

/// Who we are: ssh logs in as us (an sshd not run as root can log in no
/// one else).
fn whoami() -> String {
    nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map_or_else(|| "root".to_string(), |user| user.name)
}

impl Sshd {
    /// Starts it and waits until it accepts connections.
    pub fn start() -> Result<Sshd, Box<dyn Error>> {
        if !Path::new(SSHD).exists() {
            return Err(format!("{SSHD} is missing (apt-get install openssh-server)").into());
        }
        let dir = tempfile::tempdir()?;
        let host_key = dir.path().join("host_key");
        let key = dir.path().join("user_key");
        keygen(&host_key)?;
        keygen(&key)?;
        let authorized = dir.path().join("authorized_keys");
        std::fs::copy(dir.path().join("user_key.pub"), &authorized)?;
        let port = free_port()?;
        // sshd runs every command (and scp's sftp-server) through the
        // user's shell, and bash then reads ~/.bashrc: a home of its own,
        // empty, keeps what the user's rc files do out of ssh's figures
        // (one that runs `pyenv init` costs 0.2 s a command).
        let home = dir.path().join("home");
        std::fs::create_dir(&home)?;
        let config = dir.path().join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nAuthorizedKeysFile {}\n\
                 PidFile none\nStrictModes no\nUsePAM no\nPermitRootLogin prohibit-password\n\
                 PasswordAuthentication no\nAllowTcpForwarding yes\nCiphers {CIPHER}\n\
                 SetEnv HOME={}\nSubsystem sftp /usr/lib/openssh/sftp-server\n",
                host_key.display(),
                authorized.display(),
                home.display()
            ),
        )?;
        // Its privilege separation directory, which a root sshd needs.
        if nix::unistd::getuid().is_root() {
            std::fs::create_dir_all("/run/sshd").map_err(|e| format!("/run/sshd: {e}"))?;
        }
        let child = Command::new(SSHD)
            .args(["-D", "-e", "-f"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        // Owned from here on, so that an early return stops it.
        let sshd = Sshd {
            child,
            port,
            key,
            dir,
        };
        wait_for(port, "sshd")?;
        Ok(sshd)
    }

    /// Who ssh logs in as, at our sshd: `USER@127.0.0.1`.
    pub fn destination(&self) -> String {
        format!("{}@127.0.0.1", whoami())
    }

    /// A path on the sshd's side, as scp names it.
    pub fn remote(&self, path: &Path) -> OsString {
        format!("{}:{}", self.destination(), path.display()).into()
    }

    /// What every client says: no questions, no host key kept, our key,
    /// the cipher.
    fn client_options(&self) -> Vec<OsString> {
        let mut options: Vec<OsString> = [
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            "-o",
        ]
        .iter()
        .map(Into::into)
        .collect();
        options.push(format!("Ciphers={CIPHER}").into());
        options.push("-i".into());
        options.push(self.key.clone().into());
        options
    }

    /// Times `scp ARGS` to or from our sshd.
    pub fn scp(&self, args: &[&OsStr]) -> Result<Duration, Box<dyn Error>> {
        let mut all: Vec<OsString> = vec!["-q".into()];
        all.extend(self.client_options());
        all.push("-P".into());
        all.push(self.port.to_string().into());
        all.extend(args.iter().map(|a| a.to_os_string()));
        time_process("scp", &all, None)
    }

    /// `ssh -N -L PORT:127.0.0.1:target`, once the forward accepts
    /// connections.
    pub fn forward(&self, target: u16) -> Result<SshForward, Box<dyn Error>> {
        let port = free_port()?;
        let client = Command::new("ssh")
            .arg("-N")
            .args(self.client_options())
            .args(["-o", "ExitOnForwardFailure=yes"])
            .args(["-p", &self.port.to_string()])
            .args(["-L", &format!("{port}:127.0.0.1:{target}")])
            .arg(self.destination())
            .stdin(Stdio::null())
            .spawn()?;
        let forward = SshForward { port, client };
        wait_for(port, "ssh -L")?;
        Ok(forward)
    }

    /// A ControlMaster connection (`ssh -M -S CTL -N`) whose clients run
    /// commands through it, as ssh's own multiplexing does: each command
    /// is a new channel on the open connection, without a handshake or a
    /// login of its own. Ready once `ssh -O check` says so.
    pub fn multiplexed(&self) -> Result<SshMux, Box<dyn Error>> {
        let control = self.dir.path().join("control");
        let master = Command::new("ssh")
            .args(["-M", "-N", "-S"])
            .arg(&control)
            .args(self.client_options())
            .args(["-o", "ControlPersist=no", "-p", &self.port.to_string()])
            .arg(self.destination())
            .stdin(Stdio::null())
            .spawn()?;
        let mux = SshMux {
            control,
            destination: self.destination(),
            master,
            sshd: self.child.id(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let status = Command::new("ssh")
                .arg("-S")
                .arg(&mux.control)
                .args(["-o", "LogLevel=QUIET", "-O", "check"])
                .arg(&mux.destination)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()?;
            if status.success() {
                return Ok(mux);
            }
            if Instant::now() > deadline {
                return Err("the ssh ControlMaster did not come up within 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One `ssh -N -L` client holding its connection open; killed on drop.
pub struct SshForward {
    /// The local port `ssh -L` listens on.
    pub port: u16,
    client: Child,
}

impl Drop for SshForward {
    fn drop(&mut self) {
        let _ = self.client.kill();
        let _ = self.client.wait();
    }
}

/// An ssh ControlMaster; killed on drop (which ends its sessions).
pub struct SshMux {
    control: PathBuf,
    destination: String,
    master: Child,
    sshd: u32,
}

impl SshMux {
    /// The processes whose CPU time a command through the master costs,
    /// besides its client: the master and the sshd (whose trees hold the
    /// connection's server side and the commands).
    pub fn pids(&self) -> [u32; 2] {
        [self.master.id(), self.sshd]
    }

    /// `ssh -S CTL -o Ciphers=… USER@127.0.0.1` as arguments of `ssh`,
    /// followed by `command`. Should the master be gone, ssh would connect
    /// on its own, to port 22 with no key and no questions (BatchMode):
    /// that fails, and the run with it, instead of timing another path.
    pub fn args(&self, command: &[&str]) -> Vec<String> {
        let mut args = vec![
            "-S".to_string(),
            self.control.display().to_string(),
            "-o".to_string(),
            format!("Ciphers={CIPHER}"),
            "-o".to_string(),
            "BatchMode=yes".to_string(),
            self.destination.clone(),
        ];
        args.extend(command.iter().map(|word| word.to_string()));
        args
    }

    /// The same as words of a shell line (the paths are temporary
    /// directories', without spaces): `ssh -S CTL … CMD`.
    pub fn shell_line(&self, command: &str) -> String {
        format!("ssh {} {command}", self.args(&[]).join(" "))
    }
}

impl Drop for SshMux {
    fn drop(&mut self) {
        let _ = self.master.kill();
        let _ = self.master.wait();
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
