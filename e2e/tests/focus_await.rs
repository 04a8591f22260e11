//! Adaptive probing end to end: a real controller (in process, SQLite in memory, settle
//! 1 s) takes windows from six RNICs on two ToRs over gRPC. After clean windows, one in
//! which RNIC x lost a probe on six of its paths makes x a suspect short of a finding.
//! One agent reports that window through the agent's own reporter (`run_reporter`), and
//! no later window is reported by anyone: the agent still learns the FOCUS generation
//! planned from the window, because its reporter held an empty report open until the
//! controller had localized it (`await_window_unix_ns`). The FOCUS pinglists then probe
//! x. Awaits with nothing to wait for are answered at once.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rpingmesh_agent::config::AgentConfig;
use rpingmesh_agent::controller_client::ControllerClient;
use rpingmesh_agent::report;
use rpingmesh_controller::telemetry::Telemetry;
use rpingmesh_controller::{start, ControllerConfig};
use rpingmesh_proto::controller_agent::controller_service_client::ControllerServiceClient;
use rpingmesh_proto::controller_agent::{
    AgentRegistrationRequest, PathSummary, PinglistRequest, PinglistType, ProbeAnalysisReport,
    RnicInfo,
};

const WINDOW_NS: u64 = 1_000_000_000;
const PROBES: u32 = 200;
/// RNIC x (index) and the agent whose window goes through the agent's reporter.
const X: usize = 0;
const REPORTER: usize = 4;

/// (agent = host, ToR, GID) of the six RNICs.
fn nics() -> Vec<(String, &'static str, String)> {
    (0..6)
        .map(|i| {
            (
                format!("h{i}"),
                if i < 3 { "tor-a" } else { "tor-b" },
                rpingmesh_proto::gid::normalize_gid(&format!("fd00::f:{}", i + 1)).unwrap(),
            )
        })
        .collect()
}

/// Agent `i`'s summaries of window `start`. With `lossy`, x lost one probe on its paths
/// to and from h1..h3 (six of its ten paths): evidence for a suspect (about 14 nats
/// here), short of naming it (20 nats for this fleet).
fn summaries(i: usize, start: u64, lossy: bool) -> Vec<PathSummary> {
    let n = nics();
    let (_, tor, gid) = &n[i];
    n.iter()
        .enumerate()
        .filter(|(j, _)| *j != i)
        .map(|(j, (_, ttor, tgid))| {
            let failed = u32::from(lossy && ((i == X && j <= 3) || (j == X && i <= 3)));
            PathSummary {
                source_gid: gid.clone(),
                source_tor_id: tor.to_string(),
                target_gid: tgid.clone(),
                target_tor_id: ttor.to_string(),
                target_qpn: 7,
                pinglist_type: if tor == ttor {
                    PinglistType::TorMesh as i32
                } else {
                    PinglistType::InterTor as i32
                },
                window_start_unix_ns: start,
                window_duration_ms: (WINDOW_NS / 1_000_000) as u32,
                probe_total: PROBES,
                probe_success: PROBES - failed,
                probe_failed: failed,
                network_rtt_min_ns: 9_000,
                network_rtt_max_ns: 12_000,
                network_rtt_p50_ns: 10_000,
                network_rtt_p99_ns: 11_500,
                prober_delay_p50_ns: 5_000,
                prober_delay_p99_ns: 6_000,
                responder_delay_p50_ns: 5_000,
                responder_delay_p99_ns: 6_000,
                ..Default::default()
            }
        })
        .collect()
}

fn report_of(i: usize, summaries: Vec<PathSummary>) -> ProbeAnalysisReport {
    ProbeAnalysisReport {
        agent_id: nics()[i].0.clone(),
        summaries,
        ..Default::default()
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_learns_the_focus_planned_from_the_window_it_reported() {
    let cfg = ControllerConfig {
        listen_addr: "127.0.0.1:0".into(),
        database_uri: "sqlite::memory:".into(),
        metrics_enabled: false,
        analyzer_localize_settle_sec: 1,
        ..Default::default()
    };
    cfg.validate().unwrap();
    let telemetry = Telemetry::init(&cfg);
    let srv = start(&cfg, telemetry.metrics.clone()).await.unwrap();
    let mut c = ControllerServiceClient::connect(format!("http://{}", srv.local_addr))
        .await
        .unwrap();
    for (agent, tor, gid) in nics() {
        c.register_agent(AgentRegistrationRequest {
            agent_id: agent.clone(),
            hostname: agent.clone(),
            tor_id: tor.into(),
            rnics: vec![RnicInfo {
                gid,
                qpn: 7,
                device_name: "mlx5_0".into(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let awaiter = c.clone();
    let await_ack = |w: u64| {
        let mut c = awaiter.clone();
        async move {
            c.report_probe_analysis(ProbeAnalysisReport {
                agent_id: "h5".into(),
                await_window_unix_ns: w,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
        }
    };

    // Clean windows in the past (the baseline learns from them): localized at once.
    let now = now_ns() / WINDOW_NS * WINDOW_NS;
    let first = now - 40 * WINDOW_NS;
    for k in 0..30 {
        for i in 0..6 {
            let ack = c
                .report_probe_analysis(report_of(i, summaries(i, first + k * WINDOW_NS, false)))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(ack.focus_generation, 0, "no suspect in clean windows");
        }
    }
    let last_clean = first + 29 * WINDOW_NS;
    for _ in 0..50 {
        if srv.state.localized_through() >= last_clean {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(srv.state.localized_through(), last_clean);
    // Long past its settle time: answered at once, with what was localized.
    let ack = await_ack(last_clean).await;
    assert_eq!(ack.localized_through_unix_ns, last_clean, "{ack:?}");

    // The lossy window, just ended: the others report it directly, the reporter agent
    // through its own reporter, which then awaits the window.
    let w = now_ns() / WINDOW_NS * WINDOW_NS - WINDOW_NS;
    for i in (0..6).filter(|&i| i != REPORTER) {
        c.report_probe_analysis(report_of(i, summaries(i, w, true)))
            .await
            .unwrap();
    }
    let agent_cfg = AgentConfig {
        agent_id: nics()[REPORTER].0.clone(),
        controller_addr: srv.local_addr.to_string(),
        ..Default::default()
    };
    let client = ControllerClient::connect_lazy(&agent_cfg).unwrap();
    let (sink, rx) = report::channel(64);
    let (focus_tx, mut focus_rx) = tokio::sync::watch::channel(0u64);
    let reporter = tokio::spawn(report::run_reporter(
        client,
        agent_cfg.agent_id.clone(),
        rx,
        256,
        focus_tx,
        true,
    ));
    for s in summaries(REPORTER, w, true) {
        sink.offer(s);
    }
    let moved = tokio::time::timeout(Duration::from_secs(10), focus_rx.changed()).await;
    assert!(
        matches!(moved, Ok(Ok(()))),
        "the reporter never learned a FOCUS generation; suspects: {:?}",
        srv.state
            .analyzer
            .as_ref()
            .unwrap()
            .lock()
            .unwrap()
            .localizer()
            .suspects()
    );
    let generation = *focus_rx.borrow();
    assert!(generation > 0);
    // Learned from the window it reported, with nothing reported after it.
    assert!(
        srv.state.localized_through() >= w,
        "{} < {w}",
        srv.state.localized_through()
    );

    // The FOCUS lists probe x.
    let x_gid = nics()[X].2.clone();
    let mut focus_targets = Vec::new();
    for (agent, tor, gid) in nics() {
        let list = c
            .get_pinglist(PinglistRequest {
                agent_id: agent,
                tor_id: tor.into(),
                requester_gid: gid.clone(),
                r#type: PinglistType::Focus as i32,
            })
            .await
            .unwrap()
            .into_inner();
        focus_targets.extend(
            list.targets
                .into_iter()
                .map(|t| (gid.clone(), t.target_gid)),
        );
    }
    assert!(
        !focus_targets.is_empty()
            && focus_targets
                .iter()
                .all(|(s, t)| *s == x_gid || *t == x_gid),
        "FOCUS targets {focus_targets:?} should all cross x {x_gid}"
    );

    // Nothing to wait for: a future window, a window nobody reported.
    let ack = await_ack(now_ns() + 3_600 * WINDOW_NS).await;
    assert_eq!(ack.focus_generation, generation);
    assert!(ack.localized_through_unix_ns >= w);
    let ack = await_ack(first - 100 * WINDOW_NS).await;
    assert_eq!(ack.focus_generation, generation);

    drop(sink);
    tokio::time::timeout(Duration::from_secs(15), reporter)
        .await
        .expect("the reporter ends once its channel closes")
        .unwrap();
    srv.shutdown().await.unwrap();
}
