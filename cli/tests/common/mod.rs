//! Shared by the CLI tests: an in-process controller, the CLI run as a process, a PKI.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use rpingmesh_controller::telemetry::AnalyzerMetrics;
use rpingmesh_controller::ControllerConfig;
use rpingmesh_proto::controller_agent::{AgentRegistrationRequest, RnicInfo};

pub const GID_A: &str = "fd00:0000:0000:0000:0000:0000:000a:0001";
pub const GID_B: &str = "fd00:0000:0000:0000:0000:0000:000b:0001";
pub const GID_X: &str = "fd00:0000:0000:0000:0000:0000:dead:beef";

/// Every variable rpingmeshctl reads, removed so the caller's environment cannot leak in.
pub const CLI_VARS: [&str; 6] = [
    "RPINGMESH_CONTROLLER_ADDR",
    "RPINGMESH_TLS_MODE",
    "RPINGMESH_TLS_CERT_FILE",
    "RPINGMESH_TLS_KEY_FILE",
    "RPINGMESH_TLS_CA_FILE",
    "RPINGMESH_TLS_SERVER_NAME",
];

pub fn plain_config() -> ControllerConfig {
    ControllerConfig {
        listen_addr: "127.0.0.1:0".into(),
        database_uri: "sqlite::memory:".into(),
        metrics_enabled: false,
        ..Default::default()
    }
}

pub async fn start(cfg: &ControllerConfig) -> rpingmesh_controller::ServerHandle {
    cfg.validate().unwrap();
    rpingmesh_controller::start(cfg, AnalyzerMetrics::noop())
        .await
        .unwrap()
}

pub fn reg(agent: &str, tor: &str, gid: &str) -> AgentRegistrationRequest {
    AgentRegistrationRequest {
        agent_id: agent.into(),
        agent_ip: "10.0.0.1".into(),
        hostname: agent.into(),
        tor_id: tor.into(),
        rnics: vec![RnicInfo {
            gid: gid.into(),
            qpn: 7,
            ip_address: "10.0.0.1".into(),
            device_name: "mlx5_0".into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The CLI as a process, with `env` as its only rpingmeshctl variables.
/// Registers agent-a (tor-1, GID_A) and agent-b (tor-2, GID_B): the two ends of the
/// service paths the tests seed.
pub async fn register_a_and_b<T>(
    c: &mut rpingmesh_proto::controller_agent::controller_service_client::ControllerServiceClient<
        T,
    >,
) where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    c.register_agent(reg("agent-a", "tor-1", GID_A))
        .await
        .unwrap();
    c.register_agent(reg("agent-b", "tor-2", GID_B))
        .await
        .unwrap();
}

pub fn ctl_cmd(args: &[String], env: &[(&str, String)]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rpingmeshctl"));
    c.args(args);
    for v in CLI_VARS {
        c.env_remove(v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// Runs the CLI off the async workers (it blocks until the process exits); also returns
/// how long it ran.
pub async fn ctl_env(args: Vec<String>, env: Vec<(&'static str, String)>) -> (Output, Duration) {
    tokio::task::spawn_blocking(move || {
        let t0 = Instant::now();
        let o = ctl_cmd(&args, &env).output().expect("run rpingmeshctl");
        (o, t0.elapsed())
    })
    .await
    .unwrap()
}

pub async fn ctl(args: Vec<String>) -> Output {
    ctl_env(args, vec![]).await.0
}

pub fn args(addr: &str, rest: &[&str]) -> Vec<String> {
    let mut v = vec!["--controller".to_string(), addr.to_string()];
    v.extend(rest.iter().map(|s| s.to_string()));
    v
}

pub fn stdout(o: &Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}, stderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// Asserts the exit status and that stderr is exactly one line; returns that line.
pub fn fails(o: &Output, code: i32) -> String {
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(o.status.code(), Some(code), "stderr: {err}");
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("rpingmeshctl: "), "{err}");
    err
}

/// A port nothing listens on (it was free a moment ago).
pub fn dead_addr() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("127.0.0.1:{port}")
}

pub fn have_openssl() -> bool {
    rpingmesh_test_pki::have_openssl()
}

/// In `dir`: ca.pem/ca.key, server.pem/server.key (SAN 127.0.0.1 and localhost) and
/// client.pem/client.key, both signed by the CA.
pub fn make_pki(dir: &Path) {
    rpingmesh_test_pki::make_server_client_pki(dir).unwrap();
}
