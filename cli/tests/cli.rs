//! rpingmeshctl run as a process against a real controller on 127.0.0.1:0.

use std::process::{Command, Output};

use rpingmesh_controller::telemetry::AnalyzerMetrics;
use rpingmesh_controller::ControllerConfig;
use rpingmesh_proto::controller_agent::controller_service_client::ControllerServiceClient;
use rpingmesh_proto::controller_agent::{
    AgentRegistrationRequest, PathSummary, PinglistType, ProbeAnalysisReport, RnicInfo,
    ServiceFlow, ServiceFlowReport,
};

const GID_A: &str = "fd00:0000:0000:0000:0000:0000:000a:0001";
const GID_B: &str = "fd00:0000:0000:0000:0000:0000:000b:0001";
const GID_X: &str = "fd00:0000:0000:0000:0000:0000:dead:beef";

fn reg(agent: &str, tor: &str, gid: &str) -> AgentRegistrationRequest {
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
    }
}

fn flow(qpn: u32, remote: &str) -> ServiceFlow {
    ServiceFlow {
        local_gid: GID_A.into(),
        local_qpn: qpn,
        remote_gid: remote.into(),
        remote_qpn: 900,
        flow_label: 0x12345,
        traffic_class: 96,
        service_level: 3,
        comm: "nccl-test".into(),
        service: "allreduce".into(),
        ..Default::default()
    }
}

/// Runs the CLI off the async workers (it blocks until the process exits).
async fn ctl(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_rpingmeshctl"))
            .args(&args)
            .env_remove("RPINGMESH_CONTROLLER_ADDR")
            .output()
            .expect("run rpingmeshctl")
    })
    .await
    .unwrap()
}

fn args(addr: &str, rest: &[&str]) -> Vec<String> {
    let mut v = vec!["--controller".to_string(), addr.to_string()];
    v.extend(rest.iter().map(|s| s.to_string()));
    v
}

fn stdout(o: &Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}, stderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_lists_service_paths_of_a_real_controller() {
    let cfg = ControllerConfig {
        listen_addr: "127.0.0.1:0".into(),
        database_uri: "sqlite::memory:".into(),
        metrics_enabled: false,
        ..Default::default()
    };
    let server = rpingmesh_controller::start(&cfg, AnalyzerMetrics::noop())
        .await
        .unwrap();
    let addr = server.local_addr.to_string();
    let mut c = ControllerServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    c.register_agent(reg("agent-a", "tor-1", GID_A))
        .await
        .unwrap();
    c.register_agent(reg("agent-b", "tor-2", GID_B))
        .await
        .unwrap();
    c.report_service_flows(ServiceFlowReport {
        agent_id: "agent-a".into(),
        full_sync: true,
        upserts: vec![flow(100, GID_B), flow(101, GID_B), flow(102, GID_X)],
        removals: vec![],
    })
    .await
    .unwrap();
    c.report_probe_analysis(ProbeAnalysisReport {
        agent_id: "agent-a".into(),
        summaries: vec![PathSummary {
            source_gid: GID_A.into(),
            source_tor_id: "tor-1".into(),
            target_gid: GID_B.into(),
            target_tor_id: "tor-2".into(),
            window_start_unix_ns: 1_700_000_000_000_000_000,
            probe_total: 200,
            probe_success: 195,
            probe_failed: 5,
            network_rtt_p50_ns: 4_200,
            network_rtt_p99_ns: 12_500,
            pinglist_type: PinglistType::Service as i32,
            service: "allreduce".into(),
            ..Default::default()
        }],
    })
    .await
    .unwrap();

    // Table: header plus one row per path, aligned, RTT in us and loss in %.
    let out = stdout(&ctl(args(&addr, &["service-paths"])).await);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines[0].starts_with("SERVICE") && lines[0].contains("RTT_P99_US"),
        "{out}"
    );
    let row_b = lines.iter().find(|l| l.contains(GID_B)).expect("path to B");
    for want in [
        "allreduce",
        "tor-1",
        "tor-2",
        GID_A,
        "yes",
        "0x12345",
        "200",
        "2.50",
        "4.2",
        "12.5",
        "100->900 0/nccl-test, 101->900 0/nccl-test",
    ] {
        assert!(row_b.contains(want), "{want} missing in {row_b:?}");
    }
    let col = lines[0].find("DST_GID").unwrap();
    assert_eq!(
        &row_b[col..col + GID_B.len()],
        GID_B,
        "columns aligned under their header"
    );
    let row_x = lines
        .iter()
        .find(|l| l.contains(GID_X))
        .expect("unmonitored path");
    assert!(row_x.contains(" no "), "{row_x}");

    // JSON rows, filtered by ToR pair.
    let out = stdout(
        &ctl(args(
            &addr,
            &["service-paths", "--json", "--tor-pair", "tor-1,tor-2"],
        ))
        .await,
    );
    let rows: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 1, "{out}");
    assert_eq!(rows[0]["target_gid"], GID_B);
    assert_eq!(rows[0]["flows"], 2);
    assert_eq!(rows[0]["qps"][1]["local_qpn"], 101);
    assert_eq!(rows[0]["qps"][1]["remote_qpn"], 900);
    assert_eq!(rows[0]["qps"][1]["comm"], "nccl-test");
    assert_eq!(rows[0]["monitored"], true);
    assert_eq!(rows[0]["flow_label"], 0x12345);
    assert_eq!(rows[0]["latest"]["probe_failed"], 5);
    assert_eq!(rows[0]["latest"]["loss_ratio"], 0.025);
    let out = stdout(
        &ctl(args(
            &addr,
            &["service-paths", "--json", "--service", "nope"],
        ))
        .await,
    );
    assert!(out.is_empty(), "{out}");

    // The other subcommands answer too.
    let out = stdout(&ctl(args(&addr, &["rnics", "--tor", "tor-2"])).await);
    assert!(out.contains(GID_B) && !out.contains(GID_A), "{out}");
    let out = stdout(&ctl(args(&addr, &["paths", "--gid", "fd00::b:1"])).await);
    assert!(out.contains("service") && out.contains("2.50"), "{out}");
    let out = stdout(&ctl(args(&addr, &["violations", "--json", "--limit", "5"])).await);
    let v: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(v["kind"], "loss");
    assert_eq!(v["summary"]["service"], "allreduce");
    let out = stdout(&ctl(args(&addr, &["tor-pairs"])).await);
    assert_eq!(
        out.lines().count(),
        1,
        "service windows are not ToR-pair rows: {out}"
    );

    // A bad filter is the server's one-line InvalidArgument, exit 1.
    let o = ctl(args(&addr, &["service-paths", "--gid", "zzz"])).await;
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("InvalidArgument") && err.contains("zzz"),
        "{err}"
    );

    // Address from the environment.
    let addr2 = addr.clone();
    let o = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_rpingmeshctl"))
            .args(["service-paths", "--json"])
            .env("RPINGMESH_CONTROLLER_ADDR", addr2)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(stdout(&o).lines().count(), 2);

    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_controller_is_one_line_and_exit_1() {
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let o = ctl(args(&addr, &["service-paths"])).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stdout.is_empty());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("rpingmeshctl: cannot reach controller at ") && err.contains(&addr),
        "{err}"
    );
}
