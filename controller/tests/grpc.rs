//! In-process gRPC tests: a real tonic server on 127.0.0.1:0 and real clients.

mod common;

use common::{full, harness, SEC};
use std::collections::HashSet;
use std::sync::atomic::Ordering;

use rpingmesh_controller::telemetry::AnalyzerMetrics;
use rpingmesh_controller::ControllerConfig;
use rpingmesh_proto::controller_agent::controller_service_client::ControllerServiceClient;
use rpingmesh_proto::controller_agent::{
    AgentRegistrationRequest, PathSummary, PinglistRequest, PinglistType, ProbeAnalysisReport,
    RnicInfo,
};
use rpingmesh_proto::operator::{
    ListPathsRequest, ListRnicsRequest, ListTorPairsRequest, ListViolationsRequest,
};
use tonic::Code;

fn test_config() -> ControllerConfig {
    ControllerConfig {
        listen_addr: "127.0.0.1:0".into(),
        database_uri: "sqlite::memory:".into(),
        metrics_enabled: false,
        inter_tor_sample_size: 2,
        ..Default::default()
    }
}

/// GID of RNIC `i` on ToR `t`, in a compressed form (the controller normalizes).
fn gid(t: u32, i: u32) -> String {
    format!("fd00::{t}:{i}")
}

fn registration(t: u32, i: u32) -> AgentRegistrationRequest {
    AgentRegistrationRequest {
        agent_version: String::new(),
        agent_id: format!("agent-{t}-{i}"),
        agent_ip: format!("10.0.{t}.{i}"),
        hostname: format!("host-{t}-{i}"),
        tor_id: format!("tor-{t}"),
        rnics: vec![RnicInfo {
            gid: gid(t, i),
            qpn: 1000 + i,
            ip_address: format!("10.0.{t}.{i}"),
            host_name: String::new(),
            tor_id: String::new(),
            device_name: "mlx5_0".into(),
        }],
    }
}

fn pl_req(t: u32, i: u32, ty: PinglistType) -> PinglistRequest {
    PinglistRequest {
        agent_id: format!("agent-{t}-{i}"),
        tor_id: format!("tor-{t}"),
        requester_gid: gid(t, i),
        r#type: ty as i32,
    }
}

fn summary(src: (u32, u32), dst: (u32, u32), start: u64, total: u32, failed: u32) -> PathSummary {
    PathSummary {
        source_gid: gid(src.0, src.1),
        source_tor_id: format!("tor-{}", src.0),
        target_gid: gid(dst.0, dst.1),
        target_tor_id: format!("tor-{}", dst.0),
        target_qpn: 1000 + dst.1,
        // Near the harness clock (1,000,000 s): older windows are not measured any more.
        window_start_unix_ns: 1_000_000 * SEC + start,
        window_duration_ms: 10_000,
        probe_total: total,
        probe_success: total - failed,
        probe_failed: failed,
        network_rtt_p50_ns: 3_000,
        network_rtt_p99_ns: 8_000,
        prober_delay_p50_ns: 900,
        responder_delay_p50_ns: 400,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_pinglists_report_and_query() {
    let mut h = harness(test_config()).await;
    // 3 ToRs x 3 RNICs, one agent per RNIC.
    for t in 0..3 {
        for i in 0..3 {
            let r = h
                .ctl
                .register_agent(registration(t, i))
                .await
                .unwrap()
                .into_inner();
            assert!(r.success, "{}", r.message);
        }
    }

    let mesh = h
        .ctl
        .get_pinglist(pl_req(0, 0, PinglistType::TorMesh))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(mesh.r#type, PinglistType::TorMesh as i32);
    let got: HashSet<_> = mesh.targets.iter().map(|t| t.target_gid.clone()).collect();
    assert_eq!(got, HashSet::from([full(&gid(0, 1)), full(&gid(0, 2))]));
    for t in &mesh.targets {
        assert_eq!(t.flow_label_count, 64, "Eq.(1) 78 capped at 64");
        assert_eq!(t.flow_label, t.flow_label_seed & 0xFFFFF);
        assert_eq!(t.pinglist_type, PinglistType::TorMesh as i32);
        assert_eq!(t.target_tor_id, "tor-0");
        assert!(
            t.target_hostname.starts_with("host-0-"),
            "hostname inherited from the agent"
        );
        assert_eq!(t.target_device_name, "mlx5_0");
    }

    let inter = h
        .ctl
        .get_pinglist(pl_req(0, 0, PinglistType::InterTor))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(inter.targets.len(), 2);
    let tors: HashSet<_> = inter
        .targets
        .iter()
        .map(|t| t.target_tor_id.clone())
        .collect();
    assert_eq!(
        tors,
        HashSet::from(["tor-1".to_string(), "tor-2".to_string()])
    );
    assert!(inter
        .targets
        .iter()
        .all(|t| t.pinglist_type == PinglistType::InterTor as i32));

    // Report: one healthy path, one lossy path (5%), re-sent once (idempotent).
    let batch = vec![
        summary((0, 0), (0, 1), 10 * SEC, 100, 0),
        summary((0, 0), (1, 0), 10 * SEC, 100, 5),
    ];
    let ack = h
        .ctl
        .report_probe_analysis(ProbeAnalysisReport {
            agent_id: "agent-0-0".into(),
            summaries: batch.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(ack.accepted);
    assert_eq!(ack.sla_violations, 1);
    let ack = h
        .ctl
        .report_probe_analysis(ProbeAnalysisReport {
            agent_id: "agent-0-0".into(),
            summaries: batch,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        ack.sla_violations, 0,
        "re-sent window is not a new violation"
    );

    let paths =
        h.op.list_paths(ListPathsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .paths;
    assert_eq!(paths.len(), 2);
    assert!(
        paths.iter().all(|p| p.source_gid == full(&gid(0, 0))),
        "GIDs normalized on ingest"
    );
    let filtered =
        h.op.list_paths(ListPathsRequest {
            target_gid: gid(1, 0),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .paths;
    assert_eq!(filtered.len(), 1);
    assert_eq!(filtered[0].probe_failed, 5);

    let pairs =
        h.op.list_tor_pairs(ListTorPairsRequest {})
            .await
            .unwrap()
            .into_inner()
            .pairs;
    assert_eq!(pairs.len(), 2);
    let p01 = pairs.iter().find(|p| p.target_tor_id == "tor-1").unwrap();
    assert_eq!(
        (p01.source_tor_id.as_str(), p01.paths, p01.probe_total),
        ("tor-0", 1, 100)
    );
    assert!((p01.loss_ratio - 0.05).abs() < 1e-9);
    assert_eq!(p01.network_rtt_p99_ns, 8_000);
    assert_eq!(p01.prober_delay_p50_ns, 900);

    let v =
        h.op.list_violations(ListViolationsRequest { limit: 10 })
            .await
            .unwrap()
            .into_inner();
    assert_eq!(v.violations.len(), 1);
    assert_eq!(v.violations[0].kind, "loss");

    let rnics =
        h.op.list_rnics(ListRnicsRequest {
            tor_id: "tor-2".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rnics.rnics.len(), 3);
    assert!(rnics
        .rnics
        .iter()
        .all(|r| r.active && r.agent_id.starts_with("agent-2-")));

    // Time passes: everyone but agent-0-0 and agent-0-2 goes quiet and becomes inactive.
    h.clock.fetch_add(400 * SEC, Ordering::Relaxed);
    h.ctl.register_agent(registration(0, 0)).await.unwrap();
    h.ctl.register_agent(registration(0, 2)).await.unwrap();
    let mesh = h
        .ctl
        .get_pinglist(pl_req(0, 0, PinglistType::TorMesh))
        .await
        .unwrap()
        .into_inner();
    let got: Vec<_> = mesh.targets.iter().map(|t| t.target_gid.clone()).collect();
    assert_eq!(
        got,
        vec![full(&gid(0, 2))],
        "inactive RNIC dropped from the ToR mesh"
    );
    let inter = h
        .ctl
        .get_pinglist(pl_req(0, 0, PinglistType::InterTor))
        .await
        .unwrap()
        .into_inner();
    assert!(inter.targets.is_empty(), "no other ToR has an active RNIC");

    // Past the stale threshold the sweep removes them from the registry.
    h.clock.fetch_add(600 * SEC, Ordering::Relaxed);
    h.ctl.register_agent(registration(0, 0)).await.unwrap();
    let removed = h.server.state.remove_stale().unwrap();
    assert_eq!(removed, 7);
    let all =
        h.op.list_rnics(ListRnicsRequest::default())
            .await
            .unwrap()
            .into_inner();
    assert_eq!(all.rnics.len(), 2);
    let err = h
        .ctl
        .get_pinglist(pl_req(1, 1, PinglistType::TorMesh))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    h.server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_get_clear_errors_and_nothing_is_stored() {
    let mut h = harness(test_config()).await;

    let mut no_rnics = registration(0, 0);
    no_rnics.rnics.clear();
    let e = h.ctl.register_agent(no_rnics).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("no RNICs") && e.message().contains("agent-0-0"),
        "{}",
        e.message()
    );

    let mut no_id = registration(0, 0);
    no_id.agent_id.clear();
    let e = h.ctl.register_agent(no_id).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("agent_id"), "{}", e.message());

    let mut no_tor = registration(0, 0);
    no_tor.tor_id = " ".into();
    let e = h.ctl.register_agent(no_tor).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("tor_id"), "{}", e.message());

    let mut bad_gid = registration(0, 0);
    bad_gid.rnics[0].gid = "not-a-gid".into();
    let e = h.ctl.register_agent(bad_gid).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("not-a-gid"), "{}", e.message());

    let rnics =
        h.op.list_rnics(ListRnicsRequest::default())
            .await
            .unwrap()
            .into_inner();
    assert!(
        rnics.rnics.is_empty(),
        "nothing stored after rejected registrations"
    );

    // Unknown agent / requester.
    let e = h
        .ctl
        .get_pinglist(pl_req(5, 5, PinglistType::TorMesh))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert!(e.message().contains("agent-5-5"), "{}", e.message());
    h.ctl.register_agent(registration(0, 0)).await.unwrap();
    let mut req = pl_req(0, 0, PinglistType::TorMesh);
    req.requester_gid = gid(9, 9);
    let e = h.ctl.get_pinglist(req).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert!(e.message().contains(&full(&gid(9, 9))), "{}", e.message());
    let mut req = pl_req(0, 0, PinglistType::TorMesh);
    req.requester_gid = "zzz".into();
    assert_eq!(
        h.ctl.get_pinglist(req).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    let mut req = pl_req(0, 0, PinglistType::TorMesh);
    req.r#type = 7;
    assert_eq!(
        h.ctl.get_pinglist(req).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    // Requester identified by agent_id only still works (alone on its ToR: empty list).
    let mut req = pl_req(0, 0, PinglistType::TorMesh);
    req.requester_gid.clear();
    assert!(h
        .ctl
        .get_pinglist(req)
        .await
        .unwrap()
        .into_inner()
        .targets
        .is_empty());

    // Garbage GIDs in a report: those summaries are dropped and counted, the rest kept.
    let mut bad1 = summary((0, 0), (0, 1), SEC, 10, 0);
    bad1.target_gid = "garbage".into();
    let mut bad2 = summary((0, 0), (0, 2), SEC, 10, 0);
    bad2.source_gid = String::new();
    let good = summary((0, 0), (1, 1), SEC, 10, 0);
    let ack = h
        .ctl
        .report_probe_analysis(ProbeAnalysisReport {
            agent_id: "agent-0-0".into(),
            summaries: vec![bad1, good, bad2],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(ack.accepted);
    assert_eq!(h.server.state.dropped_summaries.load(Ordering::Relaxed), 2);
    let paths =
        h.op.list_paths(ListPathsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .paths;
    assert_eq!(paths.len(), 1);
    assert_eq!(paths[0].target_gid, full(&gid(1, 1)));
    let e =
        h.op.list_paths(ListPathsRequest {
            source_gid: "nope".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);

    h.server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_pinglists_are_deterministic_and_analyzer_can_be_disabled() {
    let cfg = ControllerConfig {
        pinglist_seed: Some(1234),
        analyzer_enabled: false,
        inter_tor_sample_size: 3,
        ..test_config()
    };
    let mut h = harness(cfg).await;
    for t in 0..10 {
        for i in 0..2 {
            h.ctl.register_agent(registration(t, i)).await.unwrap();
        }
    }
    let a = h
        .ctl
        .get_pinglist(pl_req(0, 0, PinglistType::InterTor))
        .await
        .unwrap()
        .into_inner();
    let b = h
        .ctl
        .get_pinglist(pl_req(0, 0, PinglistType::InterTor))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(a, b);
    assert_eq!(a.targets.len(), 3);
    let other = h
        .ctl
        .get_pinglist(pl_req(0, 1, PinglistType::InterTor))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(
        a.targets
            .iter()
            .map(|t| t.flow_label_seed)
            .collect::<Vec<_>>(),
        other
            .targets
            .iter()
            .map(|t| t.flow_label_seed)
            .collect::<Vec<_>>()
    );

    let ack = h
        .ctl
        .report_probe_analysis(ProbeAnalysisReport {
            agent_id: "agent-0-0".into(),
            summaries: vec![summary((0, 0), (1, 0), SEC, 10, 10)],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!ack.accepted, "analyzer disabled: nothing accepted");
    assert!(h
        .op
        .list_paths(ListPathsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .paths
        .is_empty());
    h.server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_file_survives_a_controller_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ControllerConfig {
        database_uri: format!("sqlite:{}", dir.path().join("c.db").display()),
        ..test_config()
    };
    let server = rpingmesh_controller::start(&cfg, AnalyzerMetrics::noop())
        .await
        .unwrap();
    let mut ctl = ControllerServiceClient::connect(format!("http://{}", server.local_addr))
        .await
        .unwrap();
    ctl.register_agent(registration(0, 0)).await.unwrap();
    ctl.register_agent(registration(0, 1)).await.unwrap();
    server.shutdown().await.unwrap();

    let server = rpingmesh_controller::start(&cfg, AnalyzerMetrics::noop())
        .await
        .unwrap();
    let mut ctl = ControllerServiceClient::connect(format!("http://{}", server.local_addr))
        .await
        .unwrap();
    let mesh = ctl
        .get_pinglist(pl_req(0, 0, PinglistType::TorMesh))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(mesh.targets.len(), 1);
    assert_eq!(mesh.targets[0].target_gid, full(&gid(0, 1)));
    server.shutdown().await.unwrap();
}

#[test]
fn shipped_config_file_loads_and_documents_every_key() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/controller.yaml");
    let cli = rpingmesh_controller::CliArgs {
        config: Some(path.clone()),
        ..Default::default()
    };
    let cfg = ControllerConfig::load(&cli, Vec::<(String, String)>::new()).unwrap();
    assert_eq!(cfg.database_uri, "sqlite:/var/lib/rpingmesh/controller.db");
    let defaults = ControllerConfig::default();
    assert_eq!(
        ControllerConfig {
            database_uri: defaults.database_uri.clone(),
            ..cfg
        },
        defaults
    );
    let text = std::fs::read_to_string(path).unwrap();
    for key in rpingmesh_controller::config::KEYS {
        assert!(
            text.contains(&format!("{key}:")),
            "configs/controller.yaml misses {key}"
        );
    }
}

/// The page's RNIC table: pages of the (ToR, GID) order, each the same rows as the full
/// list at that position, and the counts the header shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rnic_pages_follow_the_full_order() {
    let mut h = harness(test_config()).await;
    for t in 0..3 {
        for i in 0..7 {
            h.ctl.register_agent(registration(t, i)).await.unwrap();
        }
    }
    let st = &h.server.state;
    let all = st.rnic_statuses("");
    assert_eq!(all.len(), 21);
    let gid = |r: &rpingmesh_proto::operator::RnicStatus| r.rnic.as_ref().unwrap().gid.clone();
    for (offset, limit) in [(0, 5), (5, 5), (19, 5), (0, 100), (30, 5)] {
        let (page, total) = st.rnic_page("", offset, limit);
        assert_eq!(total, 21);
        let want: Vec<String> = all.iter().skip(offset).take(limit).map(gid).collect();
        assert_eq!(
            page.iter().map(gid).collect::<Vec<_>>(),
            want,
            "offset {offset} limit {limit}"
        );
    }
    let (tor1, n) = st.rnic_page("tor-1", 0, 3);
    assert_eq!((tor1.len(), n), (3, 7));
    let c = st.liveness_counts();
    assert_eq!(
        (c.rnics, c.rnics_active, c.agents, c.agents_active),
        (21, 21, 21, 21)
    );
}
