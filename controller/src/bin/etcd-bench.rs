//! etcd-bench: the controller on etcd next to SQLite, JSON lines on stdout.
//!
//! A real etcd (Debian's etcd-server) runs here on loopback with its data in a temp dir.
//! - get_pinglist: p50/p99 with 100,000 RNICs (25,000 hosts of 4 RNICs, 10 RNICs per
//!   ToR) per store, each against ListViolations(limit=0) on the same server: the index
//!   answers, so the store must not show;
//! - registry_fill: registrations per second through the registry API (the fill);
//! - register_agent: sequential RegisterAgent RPCs per second per store;
//! - replica_convergence: a second replica started on the filled etcd, until its index
//!   holds every RNIC, against a controller restarted on a SQLite file of the same size.
//!
//! `--quick`: 6,000 RNICs (two pages of the etcd load), fewer samples.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rpingmesh_controller::registry::{AgentRecord, RnicRecord};
use rpingmesh_controller::ServerHandle;
use rpingmesh_proto::controller_agent::controller_service_client::ControllerServiceClient;
use rpingmesh_proto::controller_agent::{PinglistRequest, PinglistType};
use serde_json::json;

#[path = "controller-bench/common.rs"]
mod common;
use common::{
    emit, gid_of, percentile, registration, server, time_pinglists, time_registrations, Scratch,
};

const RNICS_PER_HOST: u64 = 4;
const RNICS_PER_TOR: u64 = 10;

/// Debian's etcd on loopback; killed on drop.
struct Etcd {
    child: Child,
    port: u16,
    _dir: Scratch,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("an ephemeral port")
}

fn start_etcd() -> Result<Etcd, String> {
    let dir = Scratch::new("etcd")?;
    let (port, peer) = (free_port(), free_port());
    let client = format!("http://127.0.0.1:{port}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let child = Command::new("etcd")
        .args(["--name", "bench", "--data-dir"])
        .arg(dir.path().join("data"))
        .args([
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
        ])
        .args([
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
        ])
        .args(["--initial-cluster", &format!("bench={peer_url}")])
        .args([
            "--log-level",
            "error",
            "--quota-backend-bytes",
            "4294967296",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("etcd (apt install etcd-server): {e}"))?;
    let etcd = Etcd {
        child,
        port,
        _dir: dir,
    };
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        if Instant::now() >= deadline {
            return Err("etcd did not listen within 20 s".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(etcd)
}

fn tor_of(n: u64) -> String {
    format!("tor-{}", n / RNICS_PER_TOR)
}

/// Registers `rnics` RNICs as hosts of RNICS_PER_HOST through the registry API (off the
/// async workers: the etcd store blocks); returns the time it took.
async fn fill(srv: &ServerHandle, rnics: u64) -> Duration {
    let state = srv.state.clone();
    tokio::task::spawn_blocking(move || {
        let now = state.now_sec();
        let t = Instant::now();
        for h in 0..rnics / RNICS_PER_HOST {
            let agent = AgentRecord {
                agent_id: format!("agent-{h}"),
                agent_ip: "127.0.0.1".into(),
                hostname: format!("host-{h}"),
                tor_id: tor_of(h * RNICS_PER_HOST),
                last_updated: 0,
            };
            let rs: Vec<RnicRecord> = (0..RNICS_PER_HOST)
                .map(|j| {
                    let n = h * RNICS_PER_HOST + j;
                    RnicRecord {
                        gid: gid_of(n),
                        qpn: 1000,
                        ip_address: "127.0.0.1".into(),
                        host_name: format!("host-{h}"),
                        tor_id: tor_of(n),
                        device_name: format!("mlx5_{j}"),
                        agent_id: agent.agent_id.clone(),
                        last_updated: 0,
                    }
                })
                .collect();
            state
                .registry
                .register_agent(&agent, &rs, now)
                .expect("fill");
        }
        t.elapsed()
    })
    .await
    .expect("fill task")
}

async fn bench_pinglist(store: &str, srv: &ServerHandle, rnics: u64, samples: usize) {
    let req = |n: u64, ty: PinglistType| PinglistRequest {
        agent_id: format!("agent-{}", n / RNICS_PER_HOST),
        tor_id: tor_of(n),
        requester_gid: gid_of(n),
        r#type: ty as i32,
    };
    let times = time_pinglists(srv, rnics, samples, req).await;
    let b99 = percentile(&times.base, 0.99);
    for (ty, lat) in [("tor_mesh", &times.mesh), ("inter_tor", &times.inter)] {
        let p99 = percentile(lat, 0.99);
        emit(json!({
            "bench": "get_pinglist",
            "store": store,
            "pinglist_type": ty,
            "rnics": rnics,
            "samples": samples,
            "p50_ns": percentile(lat, 0.5),
            "p99_ns": p99,
            "baseline": "ListViolations(limit=0) on the same server",
            "baseline_p99_ns": b99,
            "ratio_p99": p99 as f64 / b99.max(1) as f64,
        }));
    }
}

async fn bench_register_rpc(store: &str, srv: &ServerHandle, budget: Duration) {
    let url = format!("http://{}", srv.local_addr);
    let mut ctl = ControllerServiceClient::connect(url)
        .await
        .expect("connect");
    let reg = |n: u64| registration("rpc-agent", format!("rpc-tor-{}", n / 10), 50_000_000 + n);
    let (calls, secs) = time_registrations(&mut ctl, reg, u64::MAX, budget).await;
    emit(json!({
        "bench": "register_agent",
        "store": store,
        "calls": calls,
        "per_sec": calls as f64 / secs,
        "client": "sequential",
    }));
}

async fn wait_len(srv: &ServerHandle, n: usize, bound: Duration) -> Option<Duration> {
    let t = Instant::now();
    while t.elapsed() < bound {
        if srv.state.registry.index().len() >= n {
            return Some(t.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

async fn run(quick: bool) -> Result<(), String> {
    // Quick: still more than one page (1,000 agents) of the etcd load.
    let rnics: u64 = if quick { 6_000 } else { 100_000 };
    let samples = if quick { 300 } else { 3_000 };
    let budget = Duration::from_secs(if quick { 1 } else { 3 });
    let etcd = start_etcd()?;
    let etcd_uri = format!("etcd://127.0.0.1:{}", etcd.port);
    let dir = Scratch::new("sqlite")?;
    let sqlite_file = format!("sqlite:{}", dir.path().join("bench.db").display());

    for (store, uri) in [
        ("sqlite", sqlite_file.as_str()),
        ("etcd", etcd_uri.as_str()),
    ] {
        let srv = server(uri).await;
        let took = fill(&srv, rnics).await;
        emit(json!({
            "bench": "registry_fill",
            "store": store,
            "rnics": rnics,
            "hosts": rnics / RNICS_PER_HOST,
            "seconds": took.as_secs_f64(),
            "hosts_per_sec": (rnics / RNICS_PER_HOST) as f64 / took.as_secs_f64(),
        }));
        bench_pinglist(store, &srv, rnics, samples).await;
        bench_register_rpc(store, &srv, budget).await;
        // A second replica (etcd) or a restarted controller (SQLite file) until its index
        // holds every RNIC.
        let n = srv.state.registry.index().len();
        let second_uri = uri.to_string();
        let first = if store == "sqlite" {
            srv.shutdown().await.map_err(|e| e.to_string())?;
            None
        } else {
            Some(srv)
        };
        let t = Instant::now();
        let second = server(&second_uri).await;
        let ready = wait_len(&second, n, Duration::from_secs(120)).await;
        let secs = ready.map(|_| t.elapsed().as_secs_f64());
        emit(json!({
            "bench": "replica_convergence",
            "store": store,
            "rnics": n,
            "how": if store == "etcd" { "a second replica started on the filled etcd" } else { "the controller restarted on its SQLite file" },
            "seconds": secs,
        }));
        second.shutdown().await.map_err(|e| e.to_string())?;
        if let Some(srv) = first {
            srv.shutdown().await.map_err(|e| e.to_string())?;
        }
    }
    drop(etcd);
    Ok(())
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    if let Some(bad) = std::env::args().skip(1).find(|a| a != "--quick") {
        eprintln!("etcd-bench: unknown argument {bad:?} (--quick)");
        std::process::exit(2);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = rt.block_on(run(quick)) {
        eprintln!("etcd-bench: {e}");
        std::process::exit(1);
    }
}
