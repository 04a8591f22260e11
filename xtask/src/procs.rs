//! Child processes for demo and bench: the e2e tests' `Proc` (output in files, SIGTERM then
//! SIGKILL on drop, SIGKILL from the kernel if xtask itself dies), with what demo and bench
//! add: reverse-order stop, the controller's listening address, release binaries.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
pub use rpingmesh_e2e::Proc;

/// Stops processes in reverse start order (agents before the controller).
pub fn stop_all(procs: &mut Vec<Proc>) {
    while let Some(mut p) = procs.pop() {
        p.stop();
    }
}

/// The last `n` lines a process logged (the binaries log to stderr).
pub fn log_tail(p: &Proc, n: usize) -> String {
    rpingmesh_e2e::tail_lines(&p.stderr(), n)
}

/// Waits for the controller's "controller listening" log line.
pub fn wait_listening(p: &mut Proc, timeout: Duration) -> Result<SocketAddr> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(a) = rpingmesh_e2e::listening_addr(&p.stderr()) {
            return Ok(a);
        }
        if let Some(st) = p.poll_exit() {
            bail!(
                "{} exited ({st}) before listening:\n{}",
                p.name,
                log_tail(p, 20)
            );
        }
        if Instant::now() >= deadline {
            bail!(
                "{} logged no \"controller listening\" line within {timeout:?}:\n{}",
                p.name,
                log_tail(p, 20)
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
