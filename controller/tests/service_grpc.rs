//! Service paths over real gRPC: a tonic server on 127.0.0.1:0 and real clients.

mod common;

use common::{full, Harness, SEC};
use std::sync::atomic::Ordering;

use rpingmesh_controller::ControllerConfig;
use rpingmesh_proto::controller_agent::{
    AgentRegistrationRequest, PathSummary, PinglistRequest, PinglistType, ProbeAnalysisReport,
    RnicInfo, ServiceFlow, ServiceFlowKey, ServiceFlowReport,
};
use rpingmesh_proto::operator::{ListPathsRequest, ListServicePathsRequest, ListTorPairsRequest};
use tonic::Code;

async fn harness() -> Harness {
    let cfg = ControllerConfig {
        listen_addr: "127.0.0.1:0".into(),
        database_uri: "sqlite::memory:".into(),
        metrics_enabled: false,
        service_flow_ttl_sec: 60,
        ..Default::default()
    };
    common::harness(cfg).await
}

const GID_A: &str = "fd00::a:1";
const GID_B: &str = "fd00::b:1";
const GID_X: &str = "fd00::dead:beef"; // no agent

fn registration(agent: &str, tor: &str, gid: &str, qpn: u32) -> AgentRegistrationRequest {
    AgentRegistrationRequest {
        agent_version: String::new(),
        agent_id: agent.into(),
        agent_ip: "10.0.0.1".into(),
        hostname: format!("host-{agent}"),
        tor_id: tor.into(),
        rnics: vec![RnicInfo {
            gid: gid.into(),
            qpn,
            ip_address: format!("10.0.0.{qpn}"),
            host_name: String::new(),
            tor_id: String::new(),
            device_name: "mlx5_0".into(),
        }],
    }
}

fn flow(local_qpn: u32, remote: &str) -> ServiceFlow {
    ServiceFlow {
        local_gid: GID_A.into(),
        local_qpn,
        remote_gid: remote.into(),
        remote_qpn: 777,
        flow_label: 0x12345,
        traffic_class: 96,
        service_level: 3,
        pid: 4242,
        comm: "python3".into(),
        cgroup_id: 9,
        first_seen_unix_ns: 1,
        last_seen_unix_ns: 2,
        service: "allreduce".into(),
        workload: None,
    }
}

fn report(
    full_sync: bool,
    upserts: Vec<ServiceFlow>,
    removals: Vec<ServiceFlowKey>,
) -> ServiceFlowReport {
    ServiceFlowReport {
        agent_id: "agent-a".into(),
        full_sync,
        upserts,
        removals,
    }
}

fn service_pl_req() -> PinglistRequest {
    PinglistRequest {
        agent_id: "agent-a".into(),
        tor_id: "tor-1".into(),
        requester_gid: GID_A.into(),
        r#type: PinglistType::Service as i32,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_flows_become_service_targets_and_listed_paths() {
    let mut h = harness().await;
    h.ctl
        .register_agent(registration("agent-a", "tor-1", GID_A, 11))
        .await
        .unwrap();
    h.ctl
        .register_agent(registration("agent-b", "tor-2", GID_B, 22))
        .await
        .unwrap();

    // First report is incremental on a fresh controller: accepted, but resync asked.
    let ack = h
        .ctl
        .report_service_flows(report(false, vec![flow(100, GID_B)], vec![]))
        .await
        .unwrap()
        .into_inner();
    assert!(ack.accepted && ack.resync_required);
    let ack = h
        .ctl
        .report_service_flows(report(
            true,
            vec![flow(100, GID_B), flow(101, GID_X)],
            vec![],
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(ack.accepted && !ack.resync_required);
    assert_eq!(ack.flows_known, 2);

    let pl = h
        .ctl
        .get_pinglist(service_pl_req())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(pl.r#type, PinglistType::Service as i32);
    assert_eq!(
        pl.targets.len(),
        1,
        "unregistered remote GID is not probed: {pl:?}"
    );
    let t = &pl.targets[0];
    assert_eq!(t.target_gid, full(GID_B));
    assert_eq!(
        t.target_qpn, 22,
        "B's probe responder QPN, not the service QPN"
    );
    assert_eq!(
        (t.target_tor_id.as_str(), t.target_ip.as_str()),
        ("tor-2", "10.0.0.22")
    );
    assert_eq!(
        (t.flow_label, t.flow_label_count, t.flow_label_seed),
        (0x12345, 1, 0x12345)
    );
    assert_eq!((t.service_level, t.traffic_class), (3, 96));
    assert_eq!(t.pinglist_type, PinglistType::Service as i32);
    assert_eq!((t.service.as_str(), t.priority), ("allreduce", 0));
    // B has no flows: its SERVICE pinglist is empty; the ToR mesh is unaffected.
    let mut b = service_pl_req();
    b.agent_id = "agent-b".into();
    b.requester_gid = GID_B.into();
    assert!(h
        .ctl
        .get_pinglist(b)
        .await
        .unwrap()
        .into_inner()
        .targets
        .is_empty());

    let rows =
        h.op.list_service_paths(ListServicePathsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .paths;
    assert_eq!(rows.len(), 2);
    let to_b = rows.iter().find(|r| r.target_gid == full(GID_B)).unwrap();
    assert!(to_b.monitored);
    assert_eq!(
        (
            to_b.source_agent_id.as_str(),
            to_b.source_tor_id.as_str(),
            to_b.target_tor_id.as_str()
        ),
        ("agent-a", "tor-1", "tor-2")
    );
    assert_eq!(
        (to_b.flows, to_b.flow_label, to_b.service.as_str()),
        (1, 0x12345, "allreduce")
    );
    assert!(to_b.latest.is_none(), "no SERVICE window yet");
    let to_x = rows.iter().find(|r| r.target_gid == full(GID_X)).unwrap();
    assert!(!to_x.monitored);
    assert_eq!(to_x.target_tor_id, "");

    // A SERVICE window for A->B and a ToR-mesh window for the same pair.
    let window = |ty: PinglistType, service: &str, failed: u32| PathSummary {
        source_gid: GID_A.into(),
        source_tor_id: "tor-1".into(),
        target_gid: GID_B.into(),
        target_tor_id: "tor-2".into(),
        target_qpn: 22,
        // Near the harness clock (1,000,000 s): older windows are not measured any more.
        window_start_unix_ns: 1_000_000 * SEC + 50 * SEC,
        window_duration_ms: 30_000,
        probe_total: 100,
        probe_success: 100 - failed,
        probe_failed: failed,
        network_rtt_p50_ns: 4_000,
        network_rtt_p99_ns: 9_000,
        pinglist_type: ty as i32,
        service: service.into(),
        ..Default::default()
    };
    let ack = h
        .ctl
        .report_probe_analysis(ProbeAnalysisReport {
            agent_id: "agent-a".into(),
            summaries: vec![
                window(PinglistType::Service, "allreduce", 7),
                window(PinglistType::InterTor, "", 0),
            ],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ack.sla_violations, 1, "7% loss on the service path");
    let rows =
        h.op.list_service_paths(ListServicePathsRequest {
            service: "allreduce".into(),
            gid: GID_B.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .paths;
    assert_eq!(rows.len(), 1);
    let latest = rows[0].latest.as_ref().expect("SERVICE window joined");
    assert_eq!(
        (latest.probe_failed, latest.service.as_str()),
        (7, "allreduce")
    );
    // Both windows are in ListPaths; the ToR-pair view counts the mesh path only.
    let paths =
        h.op.list_paths(ListPathsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .paths;
    assert_eq!(
        paths.len(),
        2,
        "service window did not overwrite the inter-ToR one"
    );
    let pairs =
        h.op.list_tor_pairs(ListTorPairsRequest {})
            .await
            .unwrap()
            .into_inner()
            .pairs;
    assert_eq!((pairs.len(), pairs[0].probe_failed), (1, 0));

    // Filters: ToR pair, unknown service, bad GID.
    let by_pair = |s: &str, d: &str| ListServicePathsRequest {
        source_tor_id: s.into(),
        target_tor_id: d.into(),
        ..Default::default()
    };
    assert_eq!(
        h.op.list_service_paths(by_pair("tor-1", "tor-2"))
            .await
            .unwrap()
            .into_inner()
            .paths
            .len(),
        1
    );
    assert_eq!(
        h.op.list_service_paths(by_pair("tor-2", ""))
            .await
            .unwrap()
            .into_inner()
            .paths
            .len(),
        0
    );
    let none = ListServicePathsRequest {
        service: "nope".into(),
        ..Default::default()
    };
    assert!(h
        .op
        .list_service_paths(none)
        .await
        .unwrap()
        .into_inner()
        .paths
        .is_empty());
    let bad = ListServicePathsRequest {
        gid: "zzz".into(),
        ..Default::default()
    };
    assert_eq!(
        h.op.list_service_paths(bad).await.unwrap_err().code(),
        Code::InvalidArgument
    );

    // Removal: the target disappears from the pinglist and the listing.
    let ack = h
        .ctl
        .report_service_flows(report(
            false,
            vec![],
            vec![ServiceFlowKey {
                local_gid: GID_A.into(),
                local_qpn: 100,
            }],
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((ack.flows_known, ack.resync_required), (1, false));
    assert!(h
        .ctl
        .get_pinglist(service_pl_req())
        .await
        .unwrap()
        .into_inner()
        .targets
        .is_empty());
    let rows =
        h.op.list_service_paths(ListServicePathsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .paths;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].target_gid, full(GID_X));

    // Silent past the TTL: flows expire; the next incremental report asks for a resync.
    h.ctl
        .report_service_flows(report(false, vec![flow(100, GID_B)], vec![]))
        .await
        .unwrap();
    assert_eq!(
        h.ctl
            .get_pinglist(service_pl_req())
            .await
            .unwrap()
            .into_inner()
            .targets
            .len(),
        1
    );
    h.clock.fetch_add(61 * SEC, Ordering::Relaxed);
    assert!(h
        .ctl
        .get_pinglist(service_pl_req())
        .await
        .unwrap()
        .into_inner()
        .targets
        .is_empty());
    assert_eq!(h.server.state.expire_service_flows(), 2);
    let ack = h
        .ctl
        .report_service_flows(report(false, vec![], vec![]))
        .await
        .unwrap()
        .into_inner();
    assert!(ack.resync_required);
    h.server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_service_flow_reports() {
    let mut h = harness().await;
    let e = h
        .ctl
        .report_service_flows(ServiceFlowReport {
            agent_id: " ".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("agent_id"), "{}", e.message());
    let e = h
        .ctl
        .report_service_flows(report(true, vec![flow(1, GID_B)], vec![]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert!(
        e.message().contains("agent-a") && e.message().contains("register"),
        "{}",
        e.message()
    );

    h.ctl
        .register_agent(registration("agent-a", "tor-1", GID_A, 11))
        .await
        .unwrap();
    h.ctl
        .register_agent(registration("agent-b", "tor-2", GID_B, 22))
        .await
        .unwrap();
    let mut bad_remote = flow(2, GID_B);
    bad_remote.remote_gid = "not-a-gid".into();
    let mut foreign = flow(3, GID_A);
    foreign.local_gid = GID_B.into(); // B's GID reported by A
    let ack = h
        .ctl
        .report_service_flows(report(
            true,
            vec![bad_remote, flow(1, GID_B), foreign],
            vec![],
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(ack.accepted);
    assert_eq!(
        ack.flows_known, 1,
        "bad flows dropped, the good one applied"
    );
    let stats = h.server.state.service_table().stats();
    assert_eq!(
        (stats.dropped_bad_gid, stats.dropped_foreign_source),
        (1, 1)
    );
    // A pinglist with no requester GID covers every RNIC of the agent.
    let mut req = service_pl_req();
    req.requester_gid.clear();
    let pl = h.ctl.get_pinglist(req).await.unwrap().into_inner();
    assert_eq!(pl.targets.len(), 1);
    h.server.shutdown().await.unwrap();
}
