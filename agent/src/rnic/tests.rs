//! Tests of `rnic.rs`.

use super::*;
use rpingmesh_protocol::rtt::{InvalidReason, RttSample};

#[test]
fn datagrams_are_classified() {
    let probe = ProbePacket::probe(7, 9).encode();
    assert_eq!(classify_datagram(40, &probe).unwrap().sequence, 7);
    let mut buf = [0u8; 64];
    buf[..40].copy_from_slice(&probe);
    assert_eq!(classify_datagram(40, &buf).unwrap().t1, 9);
    // Length must be exactly 40, even when the bytes would decode.
    assert_eq!(classify_datagram(41, &buf), Err(DropReason::BadLength));
    assert_eq!(classify_datagram(39, &buf), Err(DropReason::BadLength));
    assert_eq!(
        classify_datagram(40, &buf[..10]),
        Err(DropReason::BadLength)
    );
    let mut bad = probe;
    bad[0] = 2;
    assert_eq!(classify_datagram(40, &bad), Err(DropReason::BadVersion));
    let mut bad = probe;
    bad[1] = 9;
    assert_eq!(classify_datagram(40, &bad), Err(DropReason::UnknownMsgType));
    let mut bad = probe;
    bad[2] = 7;
    assert_eq!(classify_datagram(40, &bad), Err(DropReason::UnknownAckType));
    let mut bad = probe;
    bad[2] = 1;
    assert_eq!(classify_datagram(40, &bad), Err(DropReason::Inconsistent));
}

#[test]
fn failure_reasons() {
    let s = RttSample {
        network_rtt_ns: 1,
        prober_delay_ns: 2,
        responder_delay_ns: 3,
    };
    assert_eq!(fail_reason(&ProbeResult::Success(s), false), None);
    assert_eq!(
        fail_reason(&ProbeResult::Lost, false),
        Some(FailReason::Timeout)
    );
    assert_eq!(
        fail_reason(&ProbeResult::Lost, true),
        Some(FailReason::SendError)
    );
    assert_eq!(
        fail_reason(&ProbeResult::Invalid(InvalidReason::Negative), false),
        Some(FailReason::NegativeRtt)
    );
    assert_eq!(
        fail_reason(&ProbeResult::Invalid(InvalidReason::MissingTimestamp), true),
        Some(FailReason::MissingTimestamp)
    );
    assert_eq!(
        fail_reason(&ProbeResult::Invalid(InvalidReason::Absurd), false),
        Some(FailReason::AbsurdRtt)
    );
}

#[test]
fn send_table_tracks_ids_in_any_completion_order() {
    let mut t: SendTable<u8> = SendTable::default();
    assert!(t.insert(10, 1, 0));
    assert!(t.insert(11, 2, 0));
    assert!(t.insert(13, 4, 0)); // id 12 failed to send: a gap
    assert_eq!(t.len(), 3);
    assert_eq!(t.remove(11), Some(2));
    assert_eq!(t.remove(11), None, "removed once");
    assert_eq!(t.remove(12), None, "never inserted");
    assert_eq!(t.remove(10), Some(1));
    assert_eq!(t.remove(9), None, "before the window");
    assert_eq!(t.remove(13), Some(4));
    assert!(t.is_empty());
    assert_eq!(t.slots.len(), 0, "done slots are popped");
    // Empty again: the next id starts a new window anywhere.
    assert!(t.insert(500, 5, 0));
    assert_eq!(t.remove(500), Some(5));
}

#[test]
fn send_table_wraps_and_bounds() {
    let mut t: SendTable<u8> = SendTable::default();
    assert!(t.insert(u32::MAX - 1, 1, 0));
    assert!(t.insert(u32::MAX, 2, 0));
    assert!(t.insert(0, 3, 0));
    assert_eq!(t.remove(0), Some(3));
    assert_eq!(t.remove(u32::MAX - 1), Some(1));
    assert_eq!(t.remove(u32::MAX), Some(2));
    assert!(t.insert(7, 1, 0));
    assert!(!t.insert(7 + SEND_TABLE_SPAN, 2, 0), "absurdly far ahead");
    assert!(!t.insert(6, 2, 0), "behind the oldest tracked send");
    assert_eq!(t.len(), 1);
}

#[test]
fn send_table_expires_lost_completions() {
    let mut t: SendTable<u8> = SendTable::default();
    t.insert(1, 1, 100);
    t.insert(2, 2, 900);
    t.insert(3, 3, 150);
    t.expire(1_000, 500);
    assert_eq!(t.len(), 1);
    assert_eq!(t.remove(1), None);
    assert_eq!(t.remove(3), None);
    assert_eq!(t.remove(2), Some(2));
    assert!(t.is_empty());
    assert_eq!(t.slots.len(), 0);
}

#[test]
fn params_from_config_resolve_inherited_rates() {
    let cfg = AgentConfig {
        tor_id: "t".into(),
        inter_tor_probe_rate_per_second: 1.0,
        analysis_report_enabled: false,
        service_level: 3,
        traffic_class: 184,
        ..AgentConfig::default()
    };
    let p = DriverParams::from_config(&cfg, 5);
    assert_eq!(p.service_rate, 10.0, "inherited");
    assert_eq!(p.tor_mesh_rate, 10.0);
    assert_eq!(p.inter_tor_rate, 1.0);
    assert_eq!(p.round_interval_ns, 500_000_000);
    assert_eq!(p.probe_timeout_ns, 1_000_000_000);
    assert_eq!(p.analysis_window_ns, None);
    assert_eq!((p.service_level, p.traffic_class, p.seq_epoch), (3, 184, 5));
    assert!(p.rate_multiplier.is_none());
}

#[test]
fn scaled_rates_follow_the_multiplier() {
    let p = DriverParams::from_config(
        &AgentConfig {
            inter_tor_probe_rate_per_second: 1.0,
            ..AgentConfig::default()
        },
        0,
    );
    assert_eq!(p.scaled_rates(1.0), [10.0, 1.0, 10.0, 20.0, 0.0]);
    assert_eq!(p.scaled_rates(0.5), [5.0, 0.5, 5.0, 10.0, 0.0]);
    assert_eq!(p.scaled_rates(0.1), [1.0, 0.1, 1.0, 2.0, 0.0]);
    // Never stop, never speed up.
    assert_eq!(p.scaled_rates(0.0), [10.0, 1.0, 10.0, 20.0, 0.0]);
    assert_eq!(p.scaled_rates(2.0), [10.0, 1.0, 10.0, 20.0, 0.0]);
}

/// Probes the scheduler hands out over [from, to) polled every ms.
fn polls(s: &mut ProbeScheduler, from: u64, to: u64) -> usize {
    let mut n = 0;
    for t in (from..to).step_by(1_000_000) {
        while s.poll(t).is_some() {
            n += 1;
        }
    }
    n
}

#[test]
fn driver_halves_its_probe_rate_when_the_multiplier_drops_to_half() {
    const S: u64 = 1_000_000_000;
    let shared = SharedMultiplier::default();
    let mut params = DriverParams::from_config(
        &AgentConfig {
            tor_id: "tor-a".into(),
            probe_interval_ms: 10,
            tor_mesh_probe_rate_per_second: 20.0,
            inter_tor_probe_rate_per_second: 10.0,
            ..AgentConfig::default()
        },
        0,
    );
    params.rate_multiplier = Some(shared.clone());
    // The endpoint registers with tokio; the driver loop itself is not run.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _rt = rt.enter();
    let ep = rpingmesh_verbs::udp::UdpEndpoint::bind(
        std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0)),
        "udp0",
    )
    .unwrap();
    let RnicDriver {
        endpoint,
        state: mut st,
    } = RnicDriver::new(ep, params, Metrics::disabled());
    let target = |last: u8, kind| {
        let mut gid = [0u8; 16];
        gid[15] = last;
        ProbeTarget::new(Ipv6Addr::from(gid), 100 + u32::from(last), "tor-b", kind)
    };
    let lists = Pinglists {
        focus: Vec::new(),
        tor_mesh: vec![target(1, PinglistKind::TorMesh)],
        inter_tor: vec![target(2, PinglistKind::InterTor)],
        service: vec![],
        host: vec![],
    };
    st.apply_pinglists(&endpoint, &lists, 0);
    // Unthrottled: 20/s + 10/s over 10 s.
    let full = polls(&mut st.scheduler, 0, 10 * S);
    assert!((295..=305).contains(&full), "{full}");
    // An unchanged multiplier changes nothing.
    st.follow_multiplier(10 * S);
    assert_eq!(st.applied_multiplier_bits, 1.0f64.to_bits());
    shared.set(0.5);
    st.follow_multiplier(10 * S);
    let half = polls(&mut st.scheduler, 10 * S, 20 * S);
    assert!((145..=155).contains(&half), "{half}");
    // New pinglists keep the multiplier in force.
    st.apply_pinglists(&endpoint, &lists, 20 * S);
    let still = polls(&mut st.scheduler, 20 * S, 30 * S);
    assert!((145..=155).contains(&still), "{still}");
    // Release restores the configured rates.
    shared.set(1.0);
    st.follow_multiplier(30 * S);
    let back = polls(&mut st.scheduler, 30 * S, 40 * S);
    assert!((295..=305).contains(&back), "{back}");
}
