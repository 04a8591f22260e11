//! What controller-bench and etcd-bench share: the JSON-line output, made-up GIDs and
//! registrations, a scratch directory, a controller on a given store, and the
//! interleaved GetPinglist timing against a trivial RPC on the same server.
//! (etcd-bench takes this file with `#[path]`; not every bench uses every piece.)
#![allow(dead_code)]

use std::time::{Duration, Instant};

use rpingmesh_controller::telemetry::AnalyzerMetrics;
use rpingmesh_controller::{start, ControllerConfig, ServerHandle};
use rpingmesh_proto::controller_agent::controller_service_client::ControllerServiceClient;
use rpingmesh_proto::controller_agent::{
    AgentRegistrationRequest, PinglistRequest, PinglistType, RnicInfo,
};
use rpingmesh_proto::gid::format_gid;
use rpingmesh_proto::operator::operator_service_client::OperatorServiceClient;
use rpingmesh_proto::operator::ListViolationsRequest;
use tonic::transport::Channel;

/// Small deterministic PRNG for choosing requesters (no shared RNG state to contend).
pub struct XorShift(pub u64);

impl XorShift {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The `n`th made-up RNIC's GID, fd00::/64 with `n` in the low bits.
pub fn gid_of(n: u64) -> String {
    let a = std::net::Ipv6Addr::new(
        0xfd00,
        0,
        0,
        0,
        0,
        (n >> 32) as u16,
        (n >> 16) as u16,
        n as u16,
    );
    format_gid(&a)
}

pub fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub fn emit(v: serde_json::Value) {
    println!("{v}");
}

/// A controller on loopback with `database_uri` as its store, quiet.
pub fn bench_config(database_uri: &str) -> ControllerConfig {
    ControllerConfig {
        listen_addr: "127.0.0.1:0".into(),
        database_uri: database_uri.into(),
        metrics_enabled: false,
        log_level: "error".into(),
        ..Default::default()
    }
}

pub async fn server(database_uri: &str) -> ServerHandle {
    start(&bench_config(database_uri), AnalyzerMetrics::noop())
        .await
        .unwrap_or_else(|e| panic!("controller on {database_uri}: {e:#}"))
}

/// A RegisterAgent request for agent `agent` with one RNIC of GID `gid_of(rnic)`.
pub fn registration(agent: &str, tor: String, rnic: u64) -> AgentRegistrationRequest {
    AgentRegistrationRequest {
        agent_version: String::new(),
        agent_id: format!("{agent}-{rnic}"),
        agent_ip: "127.0.0.1".into(),
        hostname: format!("host-{agent}-{rnic}"),
        tor_id: tor,
        rnics: vec![RnicInfo {
            gid: gid_of(rnic),
            qpn: 1000,
            ip_address: "127.0.0.1".into(),
            host_name: String::new(),
            tor_id: String::new(),
            device_name: "mlx5_0".into(),
        }],
    }
}

/// A scratch directory of this process, removed on drop.
pub struct Scratch(std::path::PathBuf);

impl Scratch {
    pub fn new(what: &str) -> Result<Self, String> {
        let bench = std::env::args().next().unwrap_or_default();
        let bench = std::path::Path::new(&bench)
            .file_name()
            .map_or("bench".into(), |n| n.to_string_lossy().into_owned());
        let p = std::env::temp_dir().join(format!("{bench}-{}-{what}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        Ok(Scratch(p))
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Latencies (ns, sorted) of the trivial RPC and of both pinglist types, and the targets
/// the pinglists held in all.
pub struct PinglistTimes {
    pub base: Vec<u64>,
    pub mesh: Vec<u64>,
    pub inter: Vec<u64>,
    pub mesh_targets: usize,
    pub inter_targets: usize,
}

/// After a warm-up, `samples` rounds of ListViolations(limit=0), a ToR-mesh and an
/// inter-ToR GetPinglist of random requesters among `rnics`, interleaved so drift
/// affects the three series equally.
pub async fn time_pinglists(
    srv: &ServerHandle,
    rnics: u64,
    samples: usize,
    req: impl Fn(u64, PinglistType) -> PinglistRequest,
) -> PinglistTimes {
    let url = format!("http://{}", srv.local_addr);
    let mut ctl: ControllerServiceClient<Channel> = ControllerServiceClient::connect(url.clone())
        .await
        .expect("connect");
    let mut op = OperatorServiceClient::connect(url).await.expect("connect");
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    // Warm-up: connection, allocator, caches.
    for _ in 0..200 {
        let n = rng.below(rnics);
        ctl.get_pinglist(req(n, PinglistType::TorMesh))
            .await
            .expect("pinglist");
        op.list_violations(ListViolationsRequest { limit: 0 })
            .await
            .expect("baseline");
    }
    let mut t = PinglistTimes {
        base: Vec::with_capacity(samples),
        mesh: Vec::with_capacity(samples),
        inter: Vec::with_capacity(samples),
        mesh_targets: 0,
        inter_targets: 0,
    };
    for _ in 0..samples {
        let start = Instant::now();
        op.list_violations(ListViolationsRequest { limit: 0 })
            .await
            .expect("baseline");
        t.base.push(start.elapsed().as_nanos() as u64);
        for (ty, out, targets) in [
            (PinglistType::TorMesh, &mut t.mesh, &mut t.mesh_targets),
            (PinglistType::InterTor, &mut t.inter, &mut t.inter_targets),
        ] {
            let n = rng.below(rnics);
            let start = Instant::now();
            let r = ctl.get_pinglist(req(n, ty)).await.expect("pinglist");
            out.push(start.elapsed().as_nanos() as u64);
            let got = r.into_inner().targets.len();
            assert!(got > 0, "an empty {ty:?} pinglist");
            *targets += got;
        }
    }
    for v in [&mut t.base, &mut t.mesh, &mut t.inter] {
        v.sort_unstable();
    }
    t
}

/// Sequential RegisterAgent calls `reg(0)`, `reg(1)`, ... on `srv` until `max_calls` or
/// `budget`: (calls, seconds).
pub async fn time_registrations(
    ctl: &mut ControllerServiceClient<Channel>,
    reg: impl Fn(u64) -> AgentRegistrationRequest,
    max_calls: u64,
    budget: Duration,
) -> (u64, f64) {
    let start = Instant::now();
    let mut calls = 0u64;
    while calls < max_calls && start.elapsed() < budget {
        ctl.register_agent(reg(calls)).await.expect("register");
        calls += 1;
    }
    (calls, start.elapsed().as_secs_f64())
}
