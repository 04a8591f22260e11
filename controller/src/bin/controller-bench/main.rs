//! controller-bench: controller performance, one JSON object per line on stdout.
//!
//! - get_pinglist: GetPinglist p50/p99 over real gRPC on 127.0.0.1 (in-memory SQLite),
//!   10,000 RNICs / 1,000 ToRs and 100,000 RNICs / 10,000 ToRs, both pinglist types,
//!   against a trivial unary RPC (ListViolations limit 0) measured interleaved in the
//!   same run. The registry is filled through the registry API directly (same code
//!   path as RegisterAgent minus gRPC) to keep the fill fast.
//! - web_json: the web page's JSON endpoints (HTTP/1.1, a connection per request) with
//!   100,000 RNICs and 200,000 paths, next to GetPinglist on the same server (100 rounds).
//! - register_agent: sequential RegisterAgent RPCs/s, one agent with one RNIC per call.
//! - analyzer_ingest: PathSummary ingest rate on one thread vs. moving the same
//!   summaries into a Vec.
//!
//! - service_flows: ReportServiceFlows table updates (full syncs of every agent, GIDs in
//!   compressed form so they are parsed) in flows/s on one thread vs. moving the same
//!   reports into a Vec, and SERVICE pinglist construction time per requester.
//!
//! - analyzer_localize: one 30 s window of a 100,000-RNIC fabric (8 RNICs per ToR, ToR
//!   mesh + 5 inter-ToR targets each, 16 spines, a dead RNIC and a dead ToR-spine link
//!   with per-label detail on the paths they touch, and a fifth of the other inter-ToR
//!   paths with detail for a slow label or a lost ACK, as the background makes agents
//!   send): ingest of every summary plus the localization of the window (rules and the
//!   gray detector), on one thread, as a share of the window's length; six windows in a
//!   row, the worse of the first (cold) and the median once the detector's history of
//!   four windows is full.
//!
//! - identity_check (`identity.rs`): GetPinglist p99 and ReportProbeAnalysis ingest of a
//!   controller binding agents to their certificates (mtls) against the same calls to one
//!   without client identities (tls), 100,000 RNICs.
//!
//! `--quick` runs a smaller version (CI smoke); `--web-only` the web_json bench alone, `--localize-only` analyzer_localize alone, `--identity-only` identity_check alone. Run in release: `cargo xtask bench`.

use std::time::{Duration, Instant};

use rpingmesh_controller::analyzer::{Analyzer, AnalyzerParams};
use rpingmesh_controller::registry::{AgentRecord, RegistryIndex, RnicRecord};
use rpingmesh_controller::service_paths::{ServicePathParams, ServicePathTable};
use rpingmesh_controller::telemetry::AnalyzerMetrics;
use rpingmesh_controller::{start, ServerHandle};
use rpingmesh_proto::controller_agent::controller_service_client::ControllerServiceClient;
use rpingmesh_proto::controller_agent::{
    PathSummary, PinglistRequest, PinglistType, ServiceFlow, ServiceFlowReport,
};
use rpingmesh_proto::operator::operator_service_client::OperatorServiceClient;
use rpingmesh_proto::operator::ListViolationsRequest;
use serde_json::json;

mod common;
mod identity;
mod impact;
mod localize;
use common::{
    emit, gid_of, percentile, registration, server, time_pinglists, time_registrations, XorShift,
};
use identity::bench_identity;
use impact::bench_impact;
use localize::{bench_localize, LOCALIZE_WINDOWS};

/// Registers `rnics` agents of one RNIC each, `rnics / tors` per ToR, through the
/// registry API.
fn fill(srv: &ServerHandle, rnics: u64, tors: u64) -> Duration {
    let per_tor = rnics / tors;
    let now = srv.state.now_sec();
    let fill_start = Instant::now();
    for n in 0..rnics {
        let tor = format!("tor-{}", n / per_tor);
        let agent = AgentRecord {
            agent_id: format!("agent-{n}"),
            agent_ip: "127.0.0.1".into(),
            hostname: format!("host-{n}"),
            tor_id: tor.clone(),
            last_updated: 0,
        };
        let r = RnicRecord {
            gid: gid_of(n),
            qpn: 1000,
            ip_address: "127.0.0.1".into(),
            host_name: format!("host-{n}"),
            tor_id: tor,
            device_name: "mlx5_0".into(),
            agent_id: agent.agent_id.clone(),
            last_updated: 0,
        };
        srv.state
            .registry
            .register_agent(&agent, &[r], now)
            .expect("fill");
    }
    fill_start.elapsed()
}

async fn bench_pinglist(rnics: u64, tors: u64, samples: usize) {
    let srv = server("sqlite::memory:").await;
    let per_tor = rnics / tors;
    let fill = fill(&srv, rnics, tors);
    let req = |n: u64, ty: PinglistType| PinglistRequest {
        agent_id: format!("agent-{n}"),
        tor_id: format!("tor-{}", n / per_tor),
        requester_gid: gid_of(n),
        r#type: ty as i32,
    };
    let times = time_pinglists(&srv, rnics, samples, req).await;
    let (base, mesh, inter) = (&times.base, &times.mesh, &times.inter);
    let (mesh_targets, inter_targets) = (times.mesh_targets, times.inter_targets);
    let (b50, b99) = (percentile(base, 0.5), percentile(base, 0.99));
    for (ty, lat, targets) in [
        ("tor_mesh", mesh, mesh_targets),
        ("inter_tor", inter, inter_targets),
    ] {
        let (p50, p99) = (percentile(lat, 0.5), percentile(lat, 0.99));
        emit(json!({
            "bench": "get_pinglist",
            "pinglist_type": ty,
            "rnics": rnics,
            "tors": tors,
            "samples": samples,
            "avg_targets": targets as f64 / samples as f64,
            "p50_ns": p50,
            "p99_ns": p99,
            "baseline": "ListViolations(limit=0) on the same server",
            "baseline_p50_ns": b50,
            "baseline_p99_ns": b99,
            "ratio_p50": p50 as f64 / b50.max(1) as f64,
            "ratio_p99": p99 as f64 / b99.max(1) as f64,
            "fill": "registry API (not RPC)",
            "fill_ms": fill.as_millis() as u64,
        }));
    }
    srv.shutdown().await.expect("shutdown");
}

async fn bench_register(max_calls: u64, budget: Duration) {
    let srv = server("sqlite::memory:").await;
    let url = format!("http://{}", srv.local_addr);
    let mut ctl = ControllerServiceClient::connect(url.clone())
        .await
        .expect("connect");
    let mut op = OperatorServiceClient::connect(url).await.expect("connect");
    let reg = |n: u64| registration("agent", format!("tor-{}", n / 10), n);
    for n in 0..100 {
        ctl.register_agent(reg(1_000_000 + n))
            .await
            .expect("warm-up");
    }
    let (calls, secs) = time_registrations(&mut ctl, reg, max_calls, budget).await;
    // Trivial RPC rate on the same connection type, for scale.
    let tstart = Instant::now();
    let mut trivial = 0u64;
    while trivial < calls && tstart.elapsed() < budget / 4 {
        op.list_violations(ListViolationsRequest { limit: 0 })
            .await
            .expect("baseline");
        trivial += 1;
    }
    let tsecs = tstart.elapsed().as_secs_f64();
    emit(json!({
        "bench": "register_agent",
        "calls": calls,
        "seconds": secs,
        "per_sec": calls as f64 / secs,
        "rnics_per_call": 1,
        "client": "sequential",
        "baseline": "ListViolations(limit=0) sequential",
        "baseline_per_sec": trivial as f64 / tsecs,
        "ratio": (calls as f64 / secs) / (trivial as f64 / tsecs),
    }));
    srv.shutdown().await.expect("shutdown");
}

/// One GET over a fresh connection (as the page's browser may): (latency, body bytes).
fn http_get(addr: std::net::SocketAddr, path: &str) -> (Duration, usize) {
    use std::io::{Read, Write};
    let start = Instant::now();
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).expect("read");
    assert!(
        buf.starts_with(b"HTTP/1.1 200"),
        "GET {path}: {}",
        String::from_utf8_lossy(&buf[..buf.len().min(200)])
    );
    (start.elapsed(), buf.len())
}

/// The web page's JSON endpoints with `rnics` RNICs registered and the latest windows of
/// two paths per RNIC (one ToR-mesh, one inter-ToR) in the analyzer, next to GetPinglist
/// (ToR-mesh) on the same server, interleaved.
async fn bench_web(rnics: u64, tors: u64, samples: usize) {
    let mut cfg = common::bench_config("sqlite::memory:");
    cfg.http_listen_addr = "127.0.0.1:0".into();
    let srv = start(&cfg, AnalyzerMetrics::noop())
        .await
        .expect("start controller");
    let per_tor = rnics / tors;
    fill(&srv, rnics, tors);
    let tor = |n: u64| format!("tor-{}", n / per_tor);
    let mut batch = Vec::with_capacity(2 * rnics as usize);
    for n in 0..rnics {
        let same = n / per_tor * per_tor + (n + 1) % per_tor;
        let next = (n + per_tor) % rnics;
        for dst in [same, next] {
            batch.push(PathSummary {
                source_gid: gid_of(n),
                source_tor_id: tor(n),
                target_gid: gid_of(dst),
                target_tor_id: tor(dst),
                target_qpn: 1000,
                window_start_unix_ns: srv.state.now_ns() / 10_000_000_000 * 10_000_000_000,
                window_duration_ms: 10_000,
                probe_total: 100,
                probe_success: 100 - (n % 50 == 0) as u32 * 10,
                probe_failed: (n % 50 == 0) as u32 * 10,
                network_rtt_p50_ns: 5_000,
                network_rtt_p99_ns: 20_000,
                ..Default::default()
            });
        }
    }
    let paths = batch.len();
    {
        let mut a = srv
            .state
            .analyzer
            .as_ref()
            .expect("analyzer")
            .lock()
            .unwrap();
        let now = srv.state.now_ns();
        for b in batches(batch) {
            a.ingest(b, now);
        }
    }
    let http = srv.http_addr.expect("http listener");
    let url = format!("http://{}", srv.local_addr);
    let mut ctl = ControllerServiceClient::connect(url)
        .await
        .expect("connect");
    let endpoints = [
        "/api/overview".to_string(),
        "/api/tor-pairs".to_string(),
        format!(
            "/api/paths?source_tor={}&target_tor={}",
            tor(0),
            tor(per_tor)
        ),
        "/api/findings".to_string(),
        "/api/service-paths".to_string(),
        "/api/rnics?limit=500".to_string(),
    ];
    let mut lat: Vec<Vec<u64>> = vec![Vec::with_capacity(samples); endpoints.len()];
    let mut bytes = vec![0usize; endpoints.len()];
    let mut pinglist = Vec::with_capacity(samples);
    let mut rng = XorShift(0x2545_F491_4F6C_DD1D);
    for round in 0..samples + 5 {
        let n = rng.below(rnics);
        let t = Instant::now();
        ctl.get_pinglist(PinglistRequest {
            agent_id: format!("agent-{n}"),
            tor_id: tor(n),
            requester_gid: gid_of(n),
            r#type: PinglistType::TorMesh as i32,
        })
        .await
        .expect("pinglist");
        let p = t.elapsed().as_nanos() as u64;
        for (i, e) in endpoints.iter().enumerate() {
            let e = e.clone();
            let (d, b) = tokio::task::spawn_blocking(move || http_get(http, &e))
                .await
                .unwrap();
            if round >= 5 {
                lat[i].push(d.as_nanos() as u64);
                bytes[i] = b;
            }
        }
        if round >= 5 {
            pinglist.push(p);
        }
    }
    pinglist.sort_unstable();
    let (g50, g99) = (percentile(&pinglist, 0.5), percentile(&pinglist, 0.99));
    for (i, e) in endpoints.iter().enumerate() {
        lat[i].sort_unstable();
        let (p50, p99) = (percentile(&lat[i], 0.5), percentile(&lat[i], 0.99));
        let name = e.split('?').next().unwrap_or(e);
        emit(json!({
            "bench": "web_json",
            "endpoint": name,
            "rnics": rnics,
            "tors": tors,
            "paths": paths,
            "samples": samples,
            "bytes": bytes[i],
            "p50_ns": p50,
            "p99_ns": p99,
            "baseline": "GetPinglist (ToR-mesh) on the same server, interleaved",
            "baseline_p50_ns": g50,
            "baseline_p99_ns": g99,
            "ratio_p99": p99 as f64 / g99.max(1) as f64,
        }));
    }
    srv.shutdown().await.expect("shutdown");
}

/// Summaries for `paths` paths x `windows` windows, in arrival order (window-major).
fn summaries(paths: u64, windows: u64) -> Vec<PathSummary> {
    let mut out = Vec::with_capacity((paths * windows) as usize);
    for w in 0..windows {
        for p in 0..paths {
            let src = p / 16;
            let dst = 100_000 + p;
            out.push(PathSummary {
                source_gid: gid_of(src),
                source_tor_id: format!("tor-{}", src / 10),
                target_gid: gid_of(dst),
                target_tor_id: format!("tor-{}", dst / 10),
                target_qpn: 1000,
                window_start_unix_ns: 1_700_000_000_000_000_000 + w * 10_000_000_000,
                window_duration_ms: 10_000,
                probe_total: 100,
                probe_success: 100 - (p % 4) as u32,
                probe_failed: (p % 4) as u32,
                network_rtt_min_ns: 2_000,
                network_rtt_max_ns: 50_000,
                network_rtt_p50_ns: 5_000,
                network_rtt_p99_ns: if p % 97 == 0 { 900_000 } else { 20_000 },
                invalid_rtt_count: 0,
                prober_delay_p50_ns: 1_000,
                prober_delay_p99_ns: 3_000,
                responder_delay_p50_ns: 800,
                responder_delay_p99_ns: 2_000,
                pinglist_type: 0,
                service: String::new(),
                flow_labels: Vec::new(),
                rc_ring: None,
            });
        }
    }
    out
}

fn batches(all: Vec<PathSummary>) -> Vec<Vec<PathSummary>> {
    let mut it = all.into_iter();
    let mut out = Vec::new();
    loop {
        let b: Vec<PathSummary> = it.by_ref().take(256).collect();
        if b.is_empty() {
            return out;
        }
        out.push(b);
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn bench_ingest(paths: u64, windows: u64, reps: usize) {
    let total = paths * windows;
    let mut rates = Vec::new();
    let mut base_rates = Vec::new();
    let mut violations = 0usize;
    for _ in 0..reps {
        let input = batches(summaries(paths, windows));
        let mut a = Analyzer::new(AnalyzerParams::default());
        let t = Instant::now();
        for b in input {
            violations += a.ingest(b, 0).violations.len();
        }
        rates.push(total as f64 / t.elapsed().as_secs_f64());
        drop(a);

        let input = batches(summaries(paths, windows));
        let mut sink: Vec<PathSummary> = Vec::new();
        let t = Instant::now();
        for b in input {
            sink.extend(b);
        }
        base_rates.push(total as f64 / t.elapsed().as_secs_f64());
        std::hint::black_box(&sink);
    }
    let (r, b) = (median(rates), median(base_rates));
    emit(json!({
        "bench": "analyzer_ingest",
        "summaries": total,
        "paths": paths,
        "windows_per_path": windows,
        "batch": 256,
        "reps": reps,
        "violations_per_rep": violations / reps,
        "per_sec": r,
        "baseline": "Vec::extend with the same batches",
        "baseline_per_sec": b,
        "ratio": r / b,
        "threads": 1,
    }));
}

fn service_reports(agents: u64, flows: u64) -> Vec<ServiceFlowReport> {
    (0..agents)
        .map(|a| ServiceFlowReport {
            agent_id: format!("agent-{a}"),
            full_sync: true,
            upserts: (0..flows)
                .map(|f| {
                    let remote = (a + 1 + f % 64) % agents;
                    ServiceFlow {
                        // Compressed text: the controller has to parse it.
                        local_gid: format!("fd00::{:x}:{:x}", a >> 16, a & 0xffff),
                        local_qpn: 1000 + f as u32,
                        remote_gid: format!("fd00::{:x}:{:x}", remote >> 16, remote & 0xffff),
                        remote_qpn: 2000 + f as u32,
                        flow_label: (f * 7919) as u32 & 0xF_FFFF,
                        traffic_class: 96,
                        service_level: 3,
                        comm: format!("svc-{}", f % 8),
                        ..Default::default()
                    }
                })
                .collect(),
            removals: Vec::new(),
        })
        .collect()
}

fn bench_service_flows(agents: u64, flows: u64, reps: usize) {
    let now_sec = 1_700_000_000u64;
    let mut idx = RegistryIndex::default();
    for a in 0..agents {
        let agent = AgentRecord {
            agent_id: format!("agent-{a}"),
            tor_id: format!("tor-{}", a / 16),
            ..Default::default()
        };
        let r = RnicRecord {
            gid: gid_of(a),
            qpn: 1000,
            ip_address: "127.0.0.1".into(),
            host_name: format!("host-{a}"),
            tor_id: agent.tor_id.clone(),
            device_name: "mlx5_0".into(),
            agent_id: agent.agent_id.clone(),
            last_updated: 0,
        };
        idx.register_agent(&agent, &[r], now_sec);
    }
    let total = agents * flows;
    let (mut rates, mut base_rates, mut pl_ns) = (Vec::new(), Vec::new(), Vec::new());
    let mut targets = 0usize;
    for _ in 0..reps {
        let input = service_reports(agents, flows);
        let mut t = ServicePathTable::new(ServicePathParams::default());
        let now = now_sec * 1_000_000_000;
        let start = Instant::now();
        for r in input {
            let id = r.agent_id.clone();
            let out = t.apply(&id, idx.agent_gids(&id), r, now);
            assert_eq!(out.flows_known as u64, flows.min(4096));
        }
        rates.push(total as f64 / start.elapsed().as_secs_f64());
        let start = Instant::now();
        for a in 0..agents {
            let id = format!("agent-{a}");
            targets += t.pinglist(&idx, &id, &gid_of(a), now, 300).len();
        }
        pl_ns.push(start.elapsed().as_nanos() as f64 / agents as f64);
        drop(t);

        let input = service_reports(agents, flows);
        let mut sink: Vec<ServiceFlow> = Vec::new();
        let start = Instant::now();
        for r in input {
            sink.extend(r.upserts);
        }
        base_rates.push(total as f64 / start.elapsed().as_secs_f64());
        std::hint::black_box(&sink);
    }
    let (r, b) = (median(rates), median(base_rates));
    emit(json!({
        "bench": "service_flows",
        "agents": agents,
        "flows_per_agent": flows,
        "reps": reps,
        "apply_flows_per_sec": r,
        "baseline": "Vec::extend with the same flows",
        "baseline_per_sec": b,
        "ratio": r / b,
        "service_pinglist_avg_ns": median(pl_ns),
        "avg_service_targets": targets as f64 / (agents as f64 * reps as f64),
        "threads": 1,
    }));
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let web_only = std::env::args().any(|a| a == "--web-only");
    let localize_only = std::env::args().any(|a| a == "--localize-only");
    let identity_only = std::env::args().any(|a| a == "--identity-only");
    let impact_only = std::env::args().any(|a| a == "--impact-only");
    if let Some(bad) = std::env::args().skip(1).find(|a| {
        !matches!(
            a.as_str(),
            "--quick" | "--web-only" | "--localize-only" | "--identity-only" | "--impact-only"
        )
    }) {
        eprintln!(
            "controller-bench: unknown argument {bad:?} (--quick, --web-only, --localize-only, --identity-only, --impact-only)"
        );
        std::process::exit(2);
    }
    if impact_only {
        match quick {
            true => bench_impact(2_000, 200, 3),
            false => bench_impact(100_000, 10_000, 5),
        }
        return;
    }
    if localize_only {
        bench_localize(
            if quick { 2_000 } else { 100_000 },
            if quick { 2 } else { LOCALIZE_WINDOWS },
        );
        return;
    }
    if identity_only {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        match quick {
            true => rt.block_on(bench_identity(1_000, 100, 300, 20)),
            false => rt.block_on(bench_identity(100_000, 10_000, 3_000, 200)),
        }
        return;
    }
    if web_only {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        rt.block_on(bench_web(100_000, 10_000, 100));
        return;
    }
    // The analyzer bench is single-threaded by design; run it before the runtime exists.
    if quick {
        bench_localize(2_000, 2);
        bench_ingest(1_000, 10, 3);
        bench_service_flows(200, 256, 3);
        bench_impact(2_000, 200, 3);
    } else {
        bench_localize(100_000, LOCALIZE_WINDOWS);
        bench_ingest(5_000, 40, 3);
        bench_service_flows(2_000, 1_024, 3);
        bench_impact(100_000, 10_000, 5);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        if quick {
            bench_pinglist(1_000, 100, 300).await;
            bench_web(1_000, 100, 30).await;
            bench_register(1_000, Duration::from_secs(2)).await;
            bench_identity(1_000, 100, 300, 20).await;
        } else {
            bench_pinglist(10_000, 1_000, 3_000).await;
            bench_pinglist(100_000, 10_000, 3_000).await;
            bench_web(100_000, 10_000, 100).await;
            bench_register(20_000, Duration::from_secs(5)).await;
            bench_identity(100_000, 10_000, 3_000, 200).await;
        }
    });
}
