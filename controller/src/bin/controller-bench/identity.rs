//! identity_check: what binding agents to their certificates costs. Two controllers over
//! the same 100,000-RNIC registry, one in `tls_mode: tls` (server certificate only: no
//! identity) and one in `mtls` (each call's client certificate read and the agent rules
//! applied), both on 127.0.0.1 with one client (agent-7's certificate under mTLS), calls
//! interleaved so drift hits both alike: GetPinglist p50/p99 and ReportProbeAnalysis
//! ingest (summaries/s, batches of 500 from agent-7's RNIC). Certificates are made with
//! the openssl CLI in a scratch directory.

use std::path::Path;
use std::time::Instant;

use rpingmesh_controller::telemetry::AnalyzerMetrics;
use rpingmesh_controller::{start, ControllerConfig, ServerHandle};
use rpingmesh_proto::controller_agent::controller_service_client::ControllerServiceClient;
use rpingmesh_proto::controller_agent::{
    PathSummary, PinglistRequest, PinglistType, ProbeAnalysisReport,
};
use rpingmesh_test_pki::CertSpec;
use serde_json::json;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use super::common::{bench_config, emit, gid_of, percentile, Scratch};
use super::fill;

/// The requester: its certificate names it, its one RNIC is `gid_of(AGENT)`.
const AGENT: u64 = 7;

fn make_pki(dir: &Path) {
    let agent_san = format!("subjectAltName=DNS:agent-{AGENT}");
    let certs = [
        CertSpec {
            name: "server",
            subject: "/CN=x",
            extensions: "subjectAltName=IP:127.0.0.1",
        },
        CertSpec {
            name: "agent",
            subject: "/CN=x",
            extensions: &agent_san,
        },
    ];
    rpingmesh_test_pki::make_pki(dir, &certs).expect("test certificates (the openssl CLI)");
}

async fn server(dir: &Path, mode: &str) -> ServerHandle {
    let p = |f: &str| dir.join(f).display().to_string();
    let cfg = ControllerConfig {
        tls_mode: mode.into(),
        tls_cert_file: p("server.pem"),
        tls_key_file: p("server.key"),
        tls_ca_file: if mode == "mtls" {
            p("ca.pem")
        } else {
            String::new()
        },
        ..bench_config("sqlite::memory:")
    };
    start(&cfg, AnalyzerMetrics::noop())
        .await
        .expect("start controller")
}

async fn client(dir: &Path, srv: &ServerHandle, mtls: bool) -> ControllerServiceClient<Channel> {
    let read = |f: &str| std::fs::read(dir.join(f)).unwrap();
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read("ca.pem")))
        .domain_name("127.0.0.1");
    if mtls {
        tls = tls.identity(Identity::from_pem(read("agent.pem"), read("agent.key")));
    }
    let ch = Channel::from_shared(format!("https://{}", srv.local_addr))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .expect("connect");
    ControllerServiceClient::new(ch)
}

fn report(batch: u64, round: u64) -> ProbeAnalysisReport {
    let summaries = (0..batch)
        .map(|i| PathSummary {
            source_gid: gid_of(AGENT),
            source_tor_id: "tor-0".into(),
            target_gid: gid_of(1_000 + i),
            target_tor_id: format!("tor-{}", (1_000 + i) / 10),
            window_start_unix_ns: 1_700_000_000_000_000_000 + round * 10_000_000_000,
            window_duration_ms: 10_000,
            probe_total: 100,
            probe_success: 100,
            network_rtt_p50_ns: 5_000,
            network_rtt_p99_ns: 20_000,
            ..Default::default()
        })
        .collect();
    ProbeAnalysisReport {
        agent_id: format!("agent-{AGENT}"),
        summaries,
        ..Default::default()
    }
}

pub async fn bench_identity(rnics: u64, tors: u64, samples: usize, reports: u64) {
    let dir = Scratch::new("pki").expect("scratch directory");
    make_pki(dir.path());
    let (plain, bound) = (
        server(dir.path(), "tls").await,
        server(dir.path(), "mtls").await,
    );
    fill(&plain, rnics, tors);
    fill(&bound, rnics, tors);
    let mut c = [
        client(dir.path(), &plain, false).await,
        client(dir.path(), &bound, true).await,
    ];
    let req = |ty: PinglistType| PinglistRequest {
        agent_id: format!("agent-{AGENT}"),
        tor_id: String::new(),
        requester_gid: gid_of(AGENT),
        r#type: ty as i32,
    };
    for _ in 0..200 {
        for cl in c.iter_mut() {
            cl.get_pinglist(req(PinglistType::TorMesh))
                .await
                .expect("pinglist");
        }
    }
    let mut lat = [Vec::with_capacity(samples), Vec::with_capacity(samples)];
    for i in 0..samples {
        let ty = if i % 2 == 0 {
            PinglistType::TorMesh
        } else {
            PinglistType::InterTor
        };
        for (k, cl) in c.iter_mut().enumerate() {
            let t = Instant::now();
            cl.get_pinglist(req(ty)).await.expect("pinglist");
            lat[k].push(t.elapsed().as_nanos() as u64);
        }
    }
    let mut rate = [0.0f64; 2];
    let mut took = [0f64; 2];
    for round in 0..reports {
        let r = report(500, round);
        for (k, cl) in c.iter_mut().enumerate() {
            let t = Instant::now();
            let ack = cl
                .report_probe_analysis(r.clone())
                .await
                .expect("report")
                .into_inner();
            assert!(ack.accepted);
            took[k] += t.elapsed().as_secs_f64();
        }
    }
    for k in 0..2 {
        lat[k].sort_unstable();
        rate[k] = (reports * 500) as f64 / took[k];
    }
    let p = |k: usize, q| percentile(&lat[k], q);
    emit(json!({
        "bench": "identity_check",
        "rnics": rnics,
        "tors": tors,
        "samples": samples,
        "baseline": "the same calls to a tls_mode=tls controller (no client identity), interleaved",
        "pinglist_p50_ns": p(1, 0.5),
        "pinglist_p99_ns": p(1, 0.99),
        "baseline_pinglist_p50_ns": p(0, 0.5),
        "baseline_pinglist_p99_ns": p(0, 0.99),
        "ratio_pinglist_p99": p(1, 0.99) as f64 / p(0, 0.99).max(1) as f64,
        "ingest_summaries_per_sec": rate[1],
        "baseline_ingest_summaries_per_sec": rate[0],
        "ratio_ingest": rate[1] / rate[0],
    }));
    plain.shutdown().await.expect("shutdown");
    bound.shutdown().await.expect("shutdown");
}
