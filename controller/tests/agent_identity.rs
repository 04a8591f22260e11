//! Agent identity under mTLS: a real controller with certificates made by the openssl
//! CLI, two agents, and agent A trying to speak for agent B on every agent RPC. Each try
//! is refused (PERMISSION_DENIED naming both), counted in the metric and audited, B's
//! data stays as B left it, and A's own calls go through. And A's storms (registrations,
//! RNICs, summaries) are capped while B goes on.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use rpingmesh_controller::telemetry::Telemetry;
use rpingmesh_controller::{start, ControllerConfig};
use rpingmesh_e2e::pki::{mtls_channel, CertSpec};
use rpingmesh_proto::controller_agent::controller_service_client::ControllerServiceClient;
use rpingmesh_proto::controller_agent::{
    AgentRegistrationRequest, HostHealthReport, PathSummary, PinglistRequest, PinglistType,
    ProbeAnalysisReport, RnicInfo, ServiceFlowReport,
};
use tonic::transport::Channel;

const GA: &str = "fd00:0000:0000:0000:0000:0000:0000:00a1";
const GB: &str = "fd00:0000:0000:0000:0000:0000:0000:00b1";

/// A CA, the controller's certificate and one client certificate per (file, subject, SAN).
fn make_pki(dir: &Path, clients: &[(&str, &str, &str)]) {
    let mut certs = vec![CertSpec {
        name: "server",
        subject: "/CN=controller",
        extensions: "subjectAltName=IP:127.0.0.1,DNS:localhost",
    }];
    certs.extend(clients.iter().map(|&(name, subject, extensions)| CertSpec {
        name,
        subject,
        extensions,
    }));
    rpingmesh_e2e::pki::make_pki(dir, &certs).unwrap();
}

async fn client(
    addr: std::net::SocketAddr,
    dir: &Path,
    name: &str,
) -> ControllerServiceClient<Channel> {
    ControllerServiceClient::new(mtls_channel(addr, dir, name, "localhost").await.unwrap())
}

fn registration(agent: &str, host: &str, gids: &[&str]) -> AgentRegistrationRequest {
    AgentRegistrationRequest {
        agent_id: agent.into(),
        hostname: host.into(),
        tor_id: "tor-0".into(),
        rnics: gids
            .iter()
            .map(|g| RnicInfo {
                gid: g.to_string(),
                device_name: "mlx5_0".into(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

fn report(agent: &str, src: &str, dst: &str) -> ProbeAnalysisReport {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    ProbeAnalysisReport {
        agent_id: agent.into(),
        summaries: vec![PathSummary {
            source_gid: src.into(),
            source_tor_id: "tor-0".into(),
            target_gid: dst.into(),
            target_tor_id: "tor-0".into(),
            window_start_unix_ns: now.as_nanos() as u64 - 20_000_000_000,
            window_duration_ms: 10_000,
            probe_total: 100,
            probe_success: 100,
            network_rtt_p50_ns: 3_000,
            network_rtt_p99_ns: 8_000,
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn host(agent: &str, hostname: &str) -> HostHealthReport {
    HostHealthReport {
        agent_id: agent.into(),
        hostname: hostname.into(),
        mode: "idle".into(),
        tree: format!("{hostname}: ok"),
        ..Default::default()
    }
}

fn pinglist(agent: &str, gid: &str) -> PinglistRequest {
    PinglistRequest {
        agent_id: agent.into(),
        tor_id: "tor-0".into(),
        requester_gid: gid.into(),
        r#type: PinglistType::TorMesh as i32,
    }
}

fn flows(agent: &str) -> ServiceFlowReport {
    ServiceFlowReport {
        agent_id: agent.into(),
        full_sync: true,
        ..Default::default()
    }
}

fn mtls_config(d: &Path) -> ControllerConfig {
    let p = |f: &str| d.join(f).display().to_string();
    ControllerConfig {
        listen_addr: "127.0.0.1:0".into(),
        database_uri: "sqlite::memory:".into(),
        metrics_exporter: "prometheus".into(),
        prometheus_listen_addr: "127.0.0.1:0".into(),
        tls_mode: "mtls".into(),
        tls_cert_file: p("server.pem"),
        tls_key_file: p("server.key"),
        tls_ca_file: p("ca.pem"),
        audit_log_file: p("audit.jsonl"),
        ..Default::default()
    }
}

/// The sum of a Prometheus counter's series whose line contains every one of `has`.
fn counter(text: &str, name: &str, has: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && has.iter().all(|h| l.contains(h)))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// The denial's code and message, or "ok".
fn verdict<T>(r: Result<tonic::Response<T>, tonic::Status>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(s) => format!("{:?}: {}", s.code(), s.message()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_certificate_speaks_only_for_its_own_agent() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    make_pki(
        d,
        &[
            ("a", "/CN=ignored-a", "subjectAltName=DNS:agent-a"),
            ("b", "/CN=ignored-b", "subjectAltName=DNS:agent-b"),
            ("cn-only", "/CN=agent-c", "basicConstraints=CA:FALSE"),
        ],
    );
    let cfg = mtls_config(d);
    cfg.validate().unwrap();
    let telemetry = Telemetry::init(&cfg);
    let srv = start(&cfg, telemetry.metrics.clone()).await.unwrap();
    let (mut a, mut b) = (
        client(srv.local_addr, d, "a").await,
        client(srv.local_addr, d, "b").await,
    );

    assert_eq!(
        verdict(
            b.register_agent(registration("agent-b", "host-b", &[GB]))
                .await
        ),
        "ok"
    );
    assert_eq!(
        verdict(b.report_probe_analysis(report("agent-b", GB, GB)).await),
        "ok"
    );
    assert_eq!(
        verdict(b.report_host_health(host("agent-b", "host-b")).await),
        "ok"
    );
    assert_eq!(
        verdict(
            a.register_agent(registration("agent-a", "host-a", &[GA]))
                .await
        ),
        "ok"
    );

    // A speaking for B, on every agent RPC.
    let tries = [
        verdict(
            a.register_agent(registration("agent-b", "host-b", &[GB]))
                .await,
        ),
        verdict(
            a.register_agent(registration("agent-a", "host-a", &[GA, GB]))
                .await,
        ),
        verdict(
            a.register_agent(registration("agent-a", "host-b", &[GA]))
                .await,
        ),
        verdict(a.get_pinglist(pinglist("agent-b", "")).await),
        verdict(a.get_pinglist(pinglist("agent-a", GB)).await),
        verdict(a.report_probe_analysis(report("agent-a", GB, GA)).await),
        verdict(a.report_probe_analysis(report("agent-b", GB, GA)).await),
        verdict(a.report_service_flows(flows("agent-b")).await),
        verdict(a.report_host_health(host("agent-a", "host-b")).await),
        verdict(a.report_host_health(host("agent-b", "host-b")).await),
    ];
    for t in &tries {
        assert!(t.starts_with("PermissionDenied: "), "{t}");
        assert!(t.contains("\"agent-a\""), "names the caller: {t}");
        assert!(
            t.contains("agent-b") || t.contains("host-b"),
            "names the other: {t}"
        );
    }
    assert_eq!(
        tries[5],
        format!(
            "PermissionDenied: ReportProbeAnalysis: certificate names agent \"agent-a\", a summary's source GID {GB} is agent \"agent-b\"'s"
        )
    );

    // A's own calls.
    assert_eq!(verdict(a.get_pinglist(pinglist("agent-a", GA)).await), "ok");
    assert_eq!(
        verdict(a.report_probe_analysis(report("agent-a", GA, GB)).await),
        "ok"
    );
    assert_eq!(
        verdict(a.report_service_flows(flows("agent-a")).await),
        "ok"
    );
    assert_eq!(
        verdict(a.report_host_health(host("agent-a", "host-a")).await),
        "ok"
    );
    // No SAN: the subject CN names the agent.
    let mut c = client(srv.local_addr, d, "cn-only").await;
    assert_eq!(
        verdict(
            c.register_agent(registration("agent-c", "host-c", &["fd00::c1"]))
                .await
        ),
        "ok"
    );

    // B's data as B left it.
    {
        let idx = srv.state.registry.index();
        assert_eq!(idx.rnic(GB).unwrap().agent_id, "agent-b");
        assert_eq!(idx.agent("agent-b").unwrap().hostname, "host-b");
        assert_eq!(idx.agent_gids("agent-a"), [GA.to_string()]);
    }
    assert_eq!(srv.state.host("host-b").unwrap().agent_id, "agent-b");

    // The counter, the metric and the audit log agree.
    assert_eq!(
        srv.state
            .auth_denied
            .load(std::sync::atomic::Ordering::Relaxed),
        tries.len() as u64
    );
    let registry = telemetry
        .prometheus_registry()
        .expect("prometheus exporter");
    let (_, text) = rpingmesh_metrics_export::scrape(&registry, "text/plain");
    let denied: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("rpingmesh_controller_auth_denied_total{"))
        .collect();
    let total = counter(&text, "rpingmesh_controller_auth_denied_total", &[]);
    assert_eq!(total, tries.len() as f64, "{denied:?}");
    for (rpc, reason, n) in [
        ("RegisterAgent", "agent_id", 1.0),
        ("RegisterAgent", "rnic_owner", 1.0),
        ("RegisterAgent", "hostname", 1.0),
        ("ReportProbeAnalysis", "source_gid", 1.0),
        ("ReportHostHealth", "hostname", 1.0),
    ] {
        let line = denied
            .iter()
            .find(|l| {
                l.contains(&format!("rpc=\"{rpc}\"")) && l.contains(&format!("reason=\"{reason}\""))
            })
            .unwrap_or_else(|| panic!("no {rpc}/{reason} series in {denied:?}"));
        assert!(line.ends_with(&format!(" {n}")), "{line}");
    }
    let audit = std::fs::read_to_string(d.join("audit.jsonl")).unwrap();
    let entries: Vec<serde_json::Value> = audit
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let denied_lines: Vec<_> = entries
        .iter()
        .filter(|e| e["result"].as_str().unwrap().starts_with("denied: "))
        .collect();
    assert_eq!(denied_lines.len(), tries.len());
    assert!(denied_lines
        .iter()
        .all(|e| e["who"] == "agent-a" && e["role"] == "agent"));
    let registered: Vec<_> = entries
        .iter()
        .filter(|e| e["rpc"] == "RegisterAgent" && e["result"] == "ok")
        .map(|e| e["who"].as_str().unwrap())
        .collect();
    assert_eq!(registered, ["agent-b", "agent-a", "agent-c"]);
    srv.shutdown().await.unwrap();
    telemetry.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_agents_storm_is_capped_while_the_others_register() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    make_pki(
        d,
        &[
            ("a", "/CN=a", "subjectAltName=DNS:agent-a"),
            ("b", "/CN=b", "subjectAltName=DNS:agent-b"),
        ],
    );
    let cfg = ControllerConfig {
        max_registrations_per_minute: 5,
        max_rnics_per_agent: 4,
        max_summaries_per_report: 3,
        ..mtls_config(d)
    };
    cfg.validate().unwrap();
    let telemetry = Telemetry::init(&cfg);
    let srv = start(&cfg, telemetry.metrics.clone()).await.unwrap();
    let (mut a, mut b) = (
        client(srv.local_addr, d, "a").await,
        client(srv.local_addr, d, "b").await,
    );
    // 40 registrations from A as fast as it can: a minute's budget, then refusals.
    let mut storm = Vec::new();
    for _ in 0..40 {
        storm.push(verdict(
            a.register_agent(registration("agent-a", "host-a", &[GA]))
                .await,
        ));
    }
    assert_eq!(storm.iter().filter(|v| *v == "ok").count(), 5, "{storm:?}");
    let refused = storm.iter().find(|v| *v != "ok").unwrap();
    assert!(
        refused.starts_with("ResourceExhausted: RegisterAgent: \"agent-a\" registered 5 times within a minute; the next is taken in ")
            && refused.ends_with(" s (max_registrations_per_minute)"),
        "{refused}"
    );
    // B is not slowed by A's storm.
    assert_eq!(
        verdict(
            b.register_agent(registration("agent-b", "host-b", &[GB]))
                .await
        ),
        "ok"
    );
    // Too many RNICs, too many summaries (B's own budget).
    let many: Vec<String> = (1..=5).map(|i| format!("fd00::b{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let v = verdict(
        b.register_agent(registration("agent-b", "host-b", &many))
            .await,
    );
    assert_eq!(
        v,
        "ResourceExhausted: RegisterAgent: agent \"agent-b\" registers 5 RNICs, at most 4 (max_rnics_per_agent)"
    );
    let mut big = report("agent-b", GB, GA);
    big.summaries = vec![big.summaries[0].clone(); 4];
    let v = verdict(b.report_probe_analysis(big).await);
    assert!(v.starts_with("ResourceExhausted: ReportProbeAnalysis: agent \"agent-b\" reports 4 path summaries at once, at most 3"), "{v}");
    assert_eq!(
        verdict(b.report_probe_analysis(report("agent-b", GB, GA)).await),
        "ok"
    );
    assert_eq!(
        srv.state.registry.index().agent_gids("agent-b"),
        [GB.to_string()]
    );

    let registry = telemetry
        .prometheus_registry()
        .expect("prometheus exporter");
    let (_, text) = rpingmesh_metrics_export::scrape(&registry, "text/plain");
    let name = "rpingmesh_controller_limited_total";
    assert_eq!(
        counter(&text, name, &["limit=\"max_registrations_per_minute\""]),
        35.0
    );
    assert_eq!(
        counter(&text, name, &["limit=\"max_rnics_per_agent\""]),
        1.0
    );
    assert_eq!(
        counter(&text, name, &["limit=\"max_summaries_per_report\""]),
        1.0
    );
    let audit = std::fs::read_to_string(d.join("audit.jsonl")).unwrap();
    assert_eq!(
        audit
            .lines()
            .filter(|l| l.contains("\"result\":\"limited: "))
            .count(),
        37
    );
    srv.shutdown().await.unwrap();
    telemetry.shutdown();
}
