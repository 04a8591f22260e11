//! Child processes for demo and bench: output to log files, SIGTERM then SIGKILL on drop,
//! and SIGKILL from the kernel if xtask itself dies (no orphans, ever).

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub struct Proc {
    pub name: String,
    child: Child,
    pub log: PathBuf,
    exited: Option<ExitStatus>,
}

impl Proc {
    /// Spawns from the calling thread (the death signal is tied to it: call this from
    /// the main thread only).
    pub fn spawn(dir: &Path, name: &str, program: &Path, args: &[String]) -> Result<Proc> {
        let log = dir.join(format!("{name}.log"));
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: prctl/getppid are async-signal-safe and the closure does not allocate.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    return Err(std::io::Error::other("parent exited"));
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name} ({})", program.display()))?;
        Ok(Proc {
            name: name.into(),
            child,
            log,
            exited: None,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            if let Ok(Some(st)) = self.child.try_wait() {
                self.exited = Some(st);
            }
        }
        self.exited
    }

    pub fn log_text(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    pub fn log_tail(&self, n: usize) -> String {
        let t = self.log_text();
        let lines: Vec<&str> = t.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    pub fn stop(&mut self) {
        if self.exit_status().is_some() {
            return;
        }
        // SAFETY: our own unreaped child.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if self.exit_status().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        if let Ok(st) = self.child.wait() {
            self.exited = Some(st);
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Stops processes in reverse start order (agents before the controller).
pub fn stop_all(procs: &mut Vec<Proc>) {
    while let Some(mut p) = procs.pop() {
        p.stop();
    }
}

/// Waits for the controller's "controller listening" log line.
pub fn wait_listening(p: &mut Proc, timeout: Duration) -> Result<SocketAddr> {
    let deadline = Instant::now() + timeout;
    loop {
        let log = p.log_text();
        for line in log.lines().filter(|l| l.contains("controller listening")) {
            let found = line
                .split(|c: char| c.is_whitespace() || matches!(c, '"' | ',' | '=' | '{' | '}'))
                .find_map(|w| w.parse::<SocketAddr>().ok());
            if let Some(a) = found {
                return Ok(a);
            }
        }
        if let Some(st) = p.exit_status() {
            bail!(
                "{} exited ({st}) before listening:\n{}",
                p.name,
                p.log_tail(20)
            );
        }
        if Instant::now() >= deadline {
            bail!(
                "{} logged no \"controller listening\" line within {timeout:?}:\n{}",
                p.name,
                p.log_tail(20)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(l.local_addr()?.port())
}

pub async fn operator(
    addr: SocketAddr,
) -> Result<
    rpingmesh_proto::operator::operator_service_client::OperatorServiceClient<
        tonic::transport::Channel,
    >,
> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ep = tonic::transport::Channel::from_shared(format!("http://{addr}"))?
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(10));
        match ep.connect().await {
            Ok(ch) => {
                return Ok(
                    rpingmesh_proto::operator::operator_service_client::OperatorServiceClient::new(
                        ch,
                    ),
                )
            }
            Err(e) if Instant::now() >= deadline => bail!("cannot reach controller {addr}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Release binary path; errors when it was not built.
pub fn release_bin(name: &str) -> Result<PathBuf> {
    let p = crate::target_dir().join("release").join(name);
    if !p.is_file() {
        bail!("{} not found after the release build", p.display());
    }
    Ok(p)
}
