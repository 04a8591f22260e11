//! Against a controller that knows only the Go contract: ReportServiceFlows answers
//! UNIMPLEMENTED and a SERVICE pinglist request INVALID_ARGUMENT ("unknown pinglist type"),
//! as the Go controller does. It is our controller's state behind the Go RPCs only.
//! The agents say so once, turn service paths off, and keep probing the ToR mesh at the
//! configured rate, with no failed-fetch noise.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use rpingmesh_controller::service::ControllerSvc;
use rpingmesh_controller::{ControllerConfig, ControllerState};
use rpingmesh_e2e::*;
use rpingmesh_proto::controller_agent::controller_service_server::{
    ControllerService, ControllerServiceServer,
};
use rpingmesh_proto::controller_agent::*;
use tonic::{Request, Response, Status};

struct GoController(ControllerSvc);

#[tonic::async_trait]
impl ControllerService for GoController {
    async fn register_agent(
        &self,
        r: Request<AgentRegistrationRequest>,
    ) -> Result<Response<AgentRegistrationResponse>, Status> {
        let mut resp = self.0.register_agent(r).await?;
        // The Go controller has no heartbeat field: the agent falls back to 60 s.
        resp.get_mut().heartbeat_interval_sec = 0;
        Ok(resp)
    }
    async fn get_pinglist(
        &self,
        r: Request<PinglistRequest>,
    ) -> Result<Response<PinglistResponse>, Status> {
        if r.get_ref().r#type == PinglistType::Service as i32 {
            return Err(Status::invalid_argument("unknown pinglist type: 2"));
        }
        self.0.get_pinglist(r).await
    }
    async fn report_probe_analysis(
        &self,
        r: Request<ProbeAnalysisReport>,
    ) -> Result<Response<ProbeAnalysisAck>, Status> {
        self.0.report_probe_analysis(r).await
    }
    async fn report_service_flows(
        &self,
        _: Request<ServiceFlowReport>,
    ) -> Result<Response<ServiceFlowAck>, Status> {
        Err(Status::unimplemented(
            "unknown method ReportServiceFlows for service controller_agent.ControllerService",
        ))
    }
    async fn report_host_health(
        &self,
        _: Request<HostHealthReport>,
    ) -> Result<Response<HostHealthAck>, Status> {
        Err(Status::unimplemented(
            "unknown method ReportHostHealth for service controller_agent.ControllerService",
        ))
    }
}

const IPS: [Ipv4Addr; 2] = [Ipv4Addr::new(127, 0, 7, 1), Ipv4Addr::new(127, 0, 7, 2)];
const RATE: u64 = 10;
const MEASURE: Duration = Duration::from_secs(12);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_turn_our_additions_off_against_a_go_controller_and_keep_probing() {
    let cfg = ControllerConfig {
        listen_addr: "127.0.0.1:0".into(),
        database_uri: "sqlite::memory:".into(),
        metrics_enabled: false,
        ..Default::default()
    };
    let state = Arc::new(
        ControllerState::new(
            &cfg,
            rpingmesh_controller::telemetry::AnalyzerMetrics::noop(),
        )
        .unwrap(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ControllerServiceServer::new(GoController(ControllerSvc(
                state.clone(),
            ))))
            .add_service(
                rpingmesh_proto::operator::operator_service_server::OperatorServiceServer::new(
                    rpingmesh_controller::service::OperatorSvc(state.clone()),
                ),
            )
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );

    let dir = tempfile::tempdir().unwrap();
    let agents: Vec<Proc> = IPS
        .iter()
        .enumerate()
        .map(|(i, ip)| {
            spawn_agent(
                dir.path(),
                None,
                &AgentArgs::new(&format!("go-{i}"), "tor-g", &addr.to_string(), *ip)
                    .flag("--metrics-enabled", "false")
                    // Tracing on where it can be (root: libibverbs uprobes), so the agent
                    // reports service flows and meets the UNIMPLEMENTED answer.
                    .flag("--service-tracing-mode", "auto")
                    .flag("--service-flow-report-interval-ms", 300)
                    .flag("--pinglist-update-interval-sec", 1)
                    .flag("--analysis-window-sec", 2)
                    .flag("--probe-interval-ms", 100)
                    .flag("--tor-mesh-probe-rate-per-second", RATE)
                    .flag("--log-level", if i == 0 { "debug" } else { "info" }),
            )
            .unwrap()
        })
        .collect();
    let endpoint = format!("http://{addr}");
    let mut op = operator(&endpoint).await.unwrap();
    let up = wait_for(Duration::from_secs(20), Duration::from_millis(200), || {
        let mut op = op.clone();
        async move { (list_rnics(&mut op).await.ok()?.len() == 2).then_some(()) }
    })
    .await;
    assert!(up.is_some(), "agents did not register");
    let from = unix_ns_now();
    tokio::time::sleep(MEASURE).await;

    // Full rate on the ToR mesh: windows entirely inside the measurement, both ways.
    let windows = dedupe(all_windows(&mut op).await.unwrap());
    for (s, t) in [(0, 1), (1, 0)] {
        let (gs, gt) = (gid_of(IPS[s]), gid_of(IPS[t]));
        let ws: Vec<_> = windows
            .iter()
            .filter(|w| {
                w.source_gid == gs
                    && w.target_gid == gt
                    && w.window_start_unix_ns >= from
                    && w.pinglist_type == PinglistType::TorMesh as i32
            })
            .collect();
        assert!(ws.len() >= 3, "{gs} -> {gt}: {} windows", ws.len());
        // The rate over all windows (one window on a loaded machine may come short: a
        // CPU hog beside the suite gave 13 of 20 once); no window far below it.
        let total: u64 = ws.iter().map(|w| w.probe_total as u64).sum();
        let want: u64 = ws
            .iter()
            .map(|w| RATE * w.window_duration_ms as u64 / 1000)
            .sum();
        assert!(
            total * 10 >= want * 8,
            "{gs} -> {gt}: {total} probes over {} windows, want about {want}",
            ws.len()
        );
        for w in &ws {
            let want = RATE * w.window_duration_ms as u64 / 1000;
            assert!(
                w.probe_total as u64 * 2 >= want,
                "{gs} -> {gt}: {} probes in a {} ms window, want about {want}",
                w.probe_total,
                w.window_duration_ms
            );
            assert_eq!(w.probe_failed, 0, "{w:?}");
        }
    }

    // The Go agent's per-probe debug line: both GIDs, six timestamps, three results.
    let log0 = agents[0].stderr();
    let line = log0
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["fields"]["message"] == "Probe completed with all 6 timestamps")
        .unwrap_or_else(|| panic!("no per-probe debug line:\n{}", tail_lines(&log0, 20)));
    let f = &line["fields"];
    assert_eq!(f["source_gid"], gid_of(IPS[0]).as_str(), "{f}");
    assert_eq!(f["target_gid"], gid_of(IPS[1]).as_str(), "{f}");
    for k in [
        "t1",
        "t2",
        "t3",
        "t4",
        "t5",
        "t6",
        "network_rtt_ns",
        "prober_delay_ns",
        "responder_delay_ns",
    ] {
        assert!(f[k].as_u64().is_some_and(|v| v > 0), "{k} in {f}");
    }
    assert_eq!(f["rtt_valid"], true, "{f}");

    for a in &agents {
        let log = a.stderr();
        let count = |needle: &str| log.lines().filter(|l| l.contains(needle)).count();
        // One line per RNIC for the missing SERVICE lists, never a failed fetch.
        assert_eq!(
            count("has no SERVICE pinglists"),
            1,
            "{}:\n{}",
            a.name,
            tail_lines(&log, 30)
        );
        assert_eq!(
            count("pinglist fetch failed"),
            0,
            "{}:\n{}",
            a.name,
            tail_lines(&log, 30)
        );
        if log.contains("service tracing on") {
            assert_eq!(
                count("does not take service flows"),
                1,
                "{}:\n{}",
                a.name,
                tail_lines(&log, 30)
            );
        }
    }
    server.abort();
}
