//! `transport: rdma` on a host without RDMA devices (or in a build without the `rdma`
//! feature): the agent exits 1 with one clear line and never contacts the controller, so
//! no half-registered agent is left behind.

use std::io::ErrorKind;
use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn rdma_without_devices_exits_before_contacting_the_controller() {
    // A stand-in controller: any connection attempt would land in its accept queue.
    let controller = TcpListener::bind("127.0.0.1:0").unwrap();
    controller.set_nonblocking(true).unwrap();
    let addr = controller.local_addr().unwrap().to_string();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rpingmesh-agent"));
    for (k, _) in std::env::vars() {
        if k.starts_with("RPINGMESH_") || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    let started = Instant::now();
    let out = cmd
        .args([
            "--transport",
            "rdma",
            "--tor-id",
            "tor-t",
            "--controller-addr",
            &addr,
            "--metrics-enabled",
            "false",
            "--allowed-device-names",
            "mlx5_0,rxe0",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(started.elapsed() < Duration::from_secs(20));
    // JSON log lines aside, exactly one line: the error.
    let plain: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('{'))
        .collect();
    assert_eq!(plain.len(), 1, "stderr: {stderr}");
    let line = plain[0];
    if cfg!(feature = "rdma") {
        assert!(
            line.starts_with("rpingmesh-agent: no RDMA devices: ")
                && line.ends_with("; use transport: udp"),
            "{line}"
        );
    } else {
        assert_eq!(
            line,
            "rpingmesh-agent: transport rdma is not available in this build: rebuild with the `rdma` feature on an RDMA host, or use transport: udp"
        );
    }
    match controller.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("the agent contacted the controller: {other:?}"),
    }
}
