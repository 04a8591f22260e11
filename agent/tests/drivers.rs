//! Two real drivers over UDP on 127.0.0.1 with static pinglists (no controller).

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use rpingmesh_agent::config::AgentConfig;
use rpingmesh_agent::report;
use rpingmesh_agent::rnic::{DriverParams, RnicDriver, StaticDriver, TargetOutcome};
use rpingmesh_agent::targets::{Pinglists, ProbeTarget};
use rpingmesh_agent::telemetry::Metrics;
use rpingmesh_protocol::prober::ProbeResult;
use rpingmesh_protocol::PinglistKind;
use rpingmesh_verbs::udp::UdpEndpoint;
use tokio::sync::mpsc;

fn params(tor: &str, window_sec: Option<u64>) -> DriverParams {
    DriverParams {
        focus_rate: 0.0,
        source_tor: tor.into(),
        round_interval_ns: 10_000_000,
        tor_mesh_rate: 100.0,
        inter_tor_rate: 100.0,
        service_rate: 100.0,
        host_rate: 0.0,
        host_round_ns: 1_000_000_000,
        probe_timeout_ns: 1_000_000_000,
        max_in_flight: 64,
        flow_label_rotation_period_sec: 3600,
        service_level: 0,
        traffic_class: 0,
        analysis_window_ns: window_sec.map(|s| s * 1_000_000_000),
        responder_only: false,
        seq_epoch: 0xabcd_0123,
        service_names: std::sync::Arc::new(std::sync::Mutex::new(
            rpingmesh_agent::service::ServiceNameCap::new(4),
        )),
        rate_multiplier: None,
    }
}

fn bind() -> UdpEndpoint {
    UdpEndpoint::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), "udp0").unwrap()
}

fn target_of(ep: &rpingmesh_verbs::Endpoint, tor: &str, kind: PinglistKind) -> ProbeTarget {
    ProbeTarget::new(ep.gid, ep.qpn, tor, kind)
}

async fn collect(
    rx: &mut mpsc::UnboundedReceiver<TargetOutcome>,
    n: usize,
    limit: Duration,
) -> Vec<TargetOutcome> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + limit;
    while out.len() < n {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(o)) => out.push(o),
            _ => break,
        }
    }
    out
}

#[tokio::test(flavor = "current_thread")]
async fn probes_succeed_and_network_rtt_is_below_the_round_trip() {
    let a = RnicDriver::new(bind(), params("tor-a", None), Metrics::disabled());
    let b = RnicDriver::new(bind(), params("tor-b", None), Metrics::disabled());
    let (a_ep, b_ep) = (a.local(), b.local());
    let (otx, mut orx) = mpsc::unbounded_channel();
    let lists = Pinglists {
        focus: Vec::new(),
        tor_mesh: vec![],
        inter_tor: vec![target_of(&b_ep, "tor-b", PinglistKind::InterTor)],
        service: vec![],
        host: vec![],
    };
    let (ha, ta) = StaticDriver::spawn(a, lists, None, Some(otx));
    // B only answers (empty pinglist).
    let (hb, tb) = StaticDriver::spawn(b, Pinglists::default(), None, None);

    let outs = collect(&mut orx, 30, Duration::from_secs(10)).await;
    assert_eq!(outs.len(), 30, "stats {:?}", ha.stats.snapshot());
    let mut ok = 0;
    let mut pairs = Vec::new();
    for o in &outs {
        assert_eq!(&*o.target_gid, rpingmesh_proto::gid::format_gid(&b_ep.gid));
        assert_eq!(o.target_qpn, b_ep.qpn);
        assert_eq!(o.outcome.sequence >> 32, 0xabcd_0123);
        if let ProbeResult::Success(s) = o.outcome.result {
            ok += 1;
            let ts = o.outcome.timestamps;
            let round_trip = ts.t6.unwrap() - ts.t1.unwrap();
            assert!(
                s.network_rtt_ns < round_trip,
                "network {} >= T6-T1 {round_trip}",
                s.network_rtt_ns
            );
            assert_eq!(s.responder_delay_ns, ts.t4.unwrap() - ts.t3.unwrap());
            pairs.push((s.network_rtt_ns, round_trip));
        }
    }
    // Loopback loses nothing; allow a stray invalid result, never a majority.
    assert!(
        ok >= 28,
        "only {ok}/30 succeeded: {:?}",
        ha.stats.snapshot()
    );
    // The protocol removes endpoint delay: the median network RTT is a small fraction of
    // the median user-space round trip (on loopback: ~2 us against ~100 us or more).
    let median = |mut v: Vec<u64>| {
        v.sort_unstable();
        v[v.len() / 2]
    };
    let net = median(pairs.iter().map(|p| p.0).collect());
    let rt = median(pairs.iter().map(|p| p.1).collect());
    assert!(
        net * 4 < rt,
        "median network RTT {net} ns is not a small fraction of T6-T1 {rt} ns"
    );
    let sa = ha.stats.snapshot();
    let sb = hb.stats.snapshot();
    assert!(sb.probes_answered >= 30);
    assert_eq!(sb.probes_sent, 0);
    assert_eq!(sa.dropped_malformed + sb.dropped_malformed, 0);
    let _ = a_ep;
    ha.stop();
    hb.stop();
    ta.await.unwrap();
    tb.await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn garbage_is_counted_and_dropped_while_probing_continues() {
    let a = RnicDriver::new(bind(), params("tor-a", None), Metrics::disabled());
    let b = RnicDriver::new(bind(), params("tor-a", None), Metrics::disabled());
    let (a_ep, b_ep) = (a.local(), b.local());
    let (otx, mut orx) = mpsc::unbounded_channel();
    // Both probe each other (ToR mesh).
    let (ha, ta) = StaticDriver::spawn(
        a,
        Pinglists {
            focus: Vec::new(),
            tor_mesh: vec![target_of(&b_ep, "tor-a", PinglistKind::TorMesh)],
            inter_tor: vec![],
            service: vec![],
            host: vec![],
        },
        None,
        Some(otx),
    );
    let (hb, tb) = StaticDriver::spawn(
        b,
        Pinglists {
            focus: Vec::new(),
            tor_mesh: vec![target_of(&a_ep, "tor-a", PinglistKind::TorMesh)],
            inter_tor: vec![],
            service: vec![],
            host: vec![],
        },
        None,
        None,
    );
    assert!(!collect(&mut orx, 5, Duration::from_secs(5))
        .await
        .is_empty());

    let port = u16::try_from(b_ep.qpn).unwrap();
    let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let mut bad_version = rpingmesh_protocol::wire::ProbePacket::probe(1, 1).encode();
    bad_version[0] = 9;
    let mut unknown_ack = rpingmesh_protocol::wire::ProbePacket::probe(1, 1).encode();
    unknown_ack[1] = 1;
    unknown_ack[2] = 5;
    let garbage: Vec<Vec<u8>> = vec![
        vec![],
        vec![0xff; 3],
        vec![1; 39],
        vec![1; 41],
        vec![0xAA; 1500],
        bad_version.to_vec(),
        unknown_ack.to_vec(),
    ];
    for g in &garbage {
        sock.send_to(g, (Ipv4Addr::LOCALHOST, port)).unwrap();
    }
    // An ACK for a sequence nobody sent: well-formed, so the prober (not the parser) drops it.
    let stray = rpingmesh_protocol::wire::ProbePacket::first_ack(
        &rpingmesh_protocol::wire::ProbePacket::probe(42, 1),
        5,
    );
    sock.send_to(&stray.encode(), (Ipv4Addr::LOCALHOST, port))
        .unwrap();

    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while hb.stats.snapshot().dropped_malformed < garbage.len() as u64
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(hb.stats.snapshot().dropped_malformed, garbage.len() as u64);

    // Probing goes on, in both directions.
    let before_b = hb.stats.snapshot().probe_success;
    let after = collect(&mut orx, 10, Duration::from_secs(5)).await;
    assert_eq!(after.len(), 10);
    assert!(after
        .iter()
        .any(|o| matches!(o.outcome.result, ProbeResult::Success(_))));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(hb.stats.snapshot().probe_success > before_b);
    ha.stop();
    hb.stop();
    ta.await.unwrap();
    tb.await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn windows_become_path_summaries_and_shutdown_flushes() {
    let a = RnicDriver::new(bind(), params("tor-a", Some(3600)), Metrics::disabled());
    let b = RnicDriver::new(bind(), params("tor-b", None), Metrics::disabled());
    let (a_ep, b_ep) = (a.local(), b.local());
    let (sink, mut rx) = report::channel(16);
    let (otx, mut orx) = mpsc::unbounded_channel();
    let lists = Pinglists {
        focus: Vec::new(),
        tor_mesh: vec![],
        inter_tor: vec![target_of(&b_ep, "tor-b", PinglistKind::InterTor)],
        service: vec![],
        host: vec![],
    };
    let (ha, ta) = StaticDriver::spawn(a, lists, Some(sink), Some(otx));
    let (hb, tb) = StaticDriver::spawn(b, Pinglists::default(), None, None);
    let outs = collect(&mut orx, 10, Duration::from_secs(5)).await;
    assert_eq!(outs.len(), 10);
    // The hour-long window is still open: nothing reported yet.
    assert!(rx.try_recv().is_err());
    ha.stop();
    ta.await.unwrap();
    let s = rx.recv().await.expect("shutdown flushes the open window");
    assert_eq!(s.source_gid, rpingmesh_proto::gid::format_gid(&a_ep.gid));
    assert_eq!(s.source_tor_id, "tor-a");
    assert_eq!(s.target_gid, rpingmesh_proto::gid::format_gid(&b_ep.gid));
    assert_eq!(s.target_tor_id, "tor-b");
    assert_eq!(s.target_qpn, b_ep.qpn);
    assert!(s.probe_total >= 10, "{s:?}");
    assert!(s.probe_success >= 9, "{s:?}");
    assert!(s.network_rtt_p50_ns > 0 && s.network_rtt_p50_ns <= s.network_rtt_p99_ns);
    assert!(s.prober_delay_p50_ns > 0);
    hb.stop();
    tb.await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn pinglist_updates_retarget_and_self_is_never_probed() {
    let a = RnicDriver::new(bind(), params("tor-a", None), Metrics::disabled());
    let b = RnicDriver::new(bind(), params("tor-b", None), Metrics::disabled());
    let c = RnicDriver::new(bind(), params("tor-c", None), Metrics::disabled());
    let (a_ep, b_ep, c_ep) = (a.local(), b.local(), c.local());
    let (otx, mut orx) = mpsc::unbounded_channel();
    // A's own entry in its list must be ignored.
    let lists = Pinglists {
        focus: Vec::new(),
        tor_mesh: vec![target_of(&a_ep, "tor-a", PinglistKind::TorMesh)],
        inter_tor: vec![target_of(&b_ep, "tor-b", PinglistKind::InterTor)],
        service: vec![],
        host: vec![],
    };
    let (ha, ta) = StaticDriver::spawn(a, lists, None, Some(otx));
    let (hb, tb) = StaticDriver::spawn(b, Pinglists::default(), None, None);
    let (hc, tc) = StaticDriver::spawn(c, Pinglists::default(), None, None);
    let first = collect(&mut orx, 5, Duration::from_secs(5)).await;
    assert_eq!(first.len(), 5);
    assert!(first.iter().all(|o| o.target_qpn == b_ep.qpn));
    ha.pinglists.send_replace(Arc::new(Pinglists {
        focus: Vec::new(),
        tor_mesh: vec![],
        inter_tor: vec![target_of(&c_ep, "tor-c", PinglistKind::InterTor)],
        service: vec![],
        host: vec![],
    }));
    let answered_b = hb.stats.snapshot().probes_answered;
    // Drain in-flight results for B, then only C is probed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    while orx.try_recv().is_ok() {}
    let next = collect(&mut orx, 5, Duration::from_secs(5)).await;
    assert_eq!(next.len(), 5);
    assert!(next.iter().all(|o| o.target_qpn == c_ep.qpn));
    assert!(hb.stats.snapshot().probes_answered <= answered_b + 1);
    assert_eq!(ha.stats.snapshot().probes_answered, 0, "A probed itself");
    for h in [&ha, &hb, &hc] {
        h.stop();
    }
    for t in [ta, tb, tc] {
        t.await.unwrap();
    }
}

#[tokio::test(flavor = "current_thread")]
async fn agent_answers_probes_with_an_unreachable_controller() {
    // A port nothing listens on: bind, read the port, close.
    let dead = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap();
    let cfg = AgentConfig {
        tor_id: "tor-x".into(),
        controller_addr: dead.to_string(),
        udp_port: 0,
        metrics_enabled: false,
        ..AgentConfig::default()
    };
    cfg.validate().unwrap();
    let eps = rpingmesh_agent::open::bind_udp(&cfg).unwrap();
    let agent_ep = eps[0].local();
    let running = rpingmesh_agent::agent::start(&cfg, eps, Metrics::disabled()).unwrap();

    let p = RnicDriver::new(bind(), params("tor-p", None), Metrics::disabled());
    let (otx, mut orx) = mpsc::unbounded_channel();
    let lists = Pinglists {
        focus: Vec::new(),
        tor_mesh: vec![],
        inter_tor: vec![target_of(&agent_ep, "tor-x", PinglistKind::InterTor)],
        service: vec![],
        host: vec![],
    };
    let (hp, tp) = StaticDriver::spawn(p, lists, None, Some(otx));
    let outs = collect(&mut orx, 5, Duration::from_secs(5)).await;
    assert_eq!(outs.len(), 5);
    assert!(
        outs.iter()
            .filter(|o| matches!(o.outcome.result, ProbeResult::Success(_)))
            .count()
            >= 4
    );
    assert!(!running.registrar.is_registered().await);
    assert!(running.stats[0].snapshot().probes_answered >= 5);
    hp.stop();
    tp.await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), running.shutdown())
        .await
        .expect("shutdown is prompt");
}
