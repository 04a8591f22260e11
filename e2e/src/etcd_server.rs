//! A real etcd server for the tests (Debian's etcd-server), on loopback ports.

use super::*;

/// A real etcd (Debian's etcd-server) on loopback, with its data in `<dir>/<name>.etcd`.
/// `restart` starts it again on the same ports and data after a kill.
pub struct Etcd {
    pub proc: Proc,
    pub client_port: u16,
    peer_port: u16,
    dir: PathBuf,
    name: String,
}

impl Etcd {
    pub fn start(dir: &Path, name: &str) -> Result<Etcd> {
        let (client_port, peer_port) = (
            free_tcp_port(Ipv4Addr::LOCALHOST),
            free_tcp_port(Ipv4Addr::LOCALHOST),
        );
        let proc = Self::spawn(dir, name, client_port, peer_port)?;
        Ok(Etcd {
            proc,
            client_port,
            peer_port,
            dir: dir.to_path_buf(),
            name: name.to_string(),
        })
    }

    fn spawn(dir: &Path, name: &str, client_port: u16, peer_port: u16) -> Result<Proc> {
        let client = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let data = dir.join(format!("{name}.etcd"));
        let args: Vec<String> = [
            "--name",
            name,
            "--data-dir",
            &data.to_string_lossy(),
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
            "--initial-cluster",
            &format!("{name}={peer}"),
            "--log-level",
            "warn",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut p = Proc::spawn(dir, name, None, Path::new("etcd"), &args)?;
        // Healthy when it takes a client connection and answers /health.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let addr: SocketAddr = format!("127.0.0.1:{client_port}").parse()?;
            if let Ok((200, _, body)) = http_get(addr, "/health", "application/json") {
                if body.contains("true") {
                    return Ok(p);
                }
            }
            if let Some(st) = p.poll_exit() {
                bail!("etcd exited ({st}):\n{}", tail_lines(&p.stderr(), 20));
            }
            if Instant::now() >= deadline {
                bail!("etcd not healthy in 20 s:\n{}", tail_lines(&p.stderr(), 20));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `etcd://127.0.0.1:<port>`, the controllers' database_uri.
    pub fn uri(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.client_port)
    }

    /// Starts etcd again (same ports, same data) after `proc` was killed.
    pub fn restart(&mut self) -> Result<()> {
        self.proc.signal(libc::SIGKILL);
        self.proc.wait_exit(Duration::from_secs(10));
        self.proc = Self::spawn(&self.dir, &self.name, self.client_port, self.peer_port)?;
        Ok(())
    }
}
