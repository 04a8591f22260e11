//! Tests of `analyzer.rs`.

use super::*;

fn s(src: &str, dst: &str, start: u64, total: u32, failed: u32, p99: u64) -> PathSummary {
    PathSummary {
        source_gid: src.into(),
        source_tor_id: format!("tor-{}", &src[..1]),
        target_gid: dst.into(),
        target_tor_id: format!("tor-{}", &dst[..1]),
        target_qpn: 1,
        window_start_unix_ns: start,
        window_duration_ms: 10_000,
        probe_total: total,
        probe_success: total - failed,
        probe_failed: failed,
        network_rtt_p50_ns: p99 / 2,
        network_rtt_p99_ns: p99,
        ..Default::default()
    }
}

/// A path that stopped reporting leaves the ToR-pair view after 3 of its windows, and
/// its open finding closes as no longer measured.
#[test]
fn paths_no_longer_measured_leave_the_pair_view() {
    const W: u64 = 10_000_000_000; // the summaries' 10 s windows
    let mut a = analyzer(20);
    // 1a -> 2b is lossy and then not probed any more; 1a -> 2c stays measured.
    a.ingest(vec![s("1a", "2b", 0, 100, 50, 1_000)], W);
    assert_eq!(a.finding_book().open_count(), 1);
    for k in 1..6 {
        a.ingest(vec![s("1a", "2c", k * W, 100, 0, 1_000)], (k + 1) * W);
        let pairs = a.tor_pairs((k + 1) * W);
        assert_eq!(pairs.len(), 1);
        // The lossy window counts until it is 3 windows past its end.
        let stale = (k + 1) * W > W + 3 * W;
        assert_eq!(pairs[0].paths, if stale { 1 } else { 2 }, "at window {k}");
        assert_eq!(pairs[0].probe_failed, if stale { 0 } else { 50 });
    }
    assert_eq!(a.finding_book().open_count(), 0);
    let f = &a.findings(0)[0];
    assert!(!f.is_open() && f.resolved_by.is_none());
}

/// An agent's RC ring record joins the UD window of the same path and start, in
/// either order, and never resolves a finding the UD window opened.
#[test]
fn rc_ring_records_join_the_ud_window_and_decide_nothing() {
    const W: u64 = 10_000_000_000;
    let rc = |start: u64, total: u32| PathSummary {
        rc_ring: Some(rpingmesh_proto::controller_agent::RcRingStats {
            probe_total: total,
            network_rtt_p50_ns: 7_000,
            ..Default::default()
        }),
        ..s("1a", "2b", start, 0, 0, 0)
    };
    let mut a = analyzer(20);
    // UD first (lossy: a finding opens), then RC for the same window.
    a.ingest(vec![s("1a", "2b", 0, 100, 50, 1_000)], W);
    assert_eq!(a.finding_book().open_count(), 1);
    a.ingest(vec![rc(0, 10)], W + 1);
    assert_eq!(
        a.finding_book().open_count(),
        1,
        "an RC record resolves nothing"
    );
    let all = |a: &Analyzer| a.paths(&PathFilter::default(), true);
    let p = all(&a);
    assert_eq!(p.len(), 1);
    assert_eq!((p[0].probe_total, p[0].probe_failed), (100, 50));
    assert_eq!(p[0].rc_ring.unwrap().probe_total, 10);
    // RC first, then UD: one window, both parts.
    a.ingest(vec![rc(W, 9)], 2 * W);
    a.ingest(vec![s("1a", "2b", W, 100, 50, 1_000)], 2 * W);
    let p = all(&a);
    assert_eq!(p.len(), 2);
    assert_eq!(p[1].probe_total, 100);
    assert_eq!(p[1].rc_ring.unwrap().probe_total, 9);
    assert_eq!(
        a.violations(usize::MAX).len(),
        2,
        "one per lossy UD window, none from RC"
    );
}

fn analyzer(retention: usize) -> Analyzer {
    Analyzer::new(AnalyzerParams {
        window_retention: retention,
        ..Default::default()
    })
}

#[test]
fn loss_and_rtt_violations() {
    let mut a = analyzer(20);
    let r = a.ingest(
        vec![
            s("a1", "b1", 0, 100, 2, 1000),    // 2% == threshold: not a violation
            s("a1", "b2", 0, 100, 3, 1000),    // 3% loss
            s("a1", "b3", 0, 100, 0, 600_000), // p99 over 500 us
            s("a1", "b4", 0, 100, 100, 900_000), // all lost: loss only, p99 meaningless
            s("a1", "b5", 0, 0, 0, 0),         // no probes: nothing
        ],
        7,
    );
    assert_eq!(r.ingested, 5);
    let kinds: Vec<_> = r
        .violations
        .iter()
        .map(|v| (v.summary.target_gid.as_str(), v.kind))
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("b2", ViolationKind::Loss),
            ("b3", ViolationKind::Rtt),
            ("b4", ViolationKind::Loss)
        ]
    );
    assert_eq!(a.violations(0).len(), 3);
    assert_eq!(a.violations(1)[0].summary.target_gid, "b4", "newest first");
    assert_eq!(a.violations(1)[0].detected_unix_ns, 7);
    assert_eq!(a.summaries_total(), 5);
}

#[test]
fn rtt_check_disabled_by_zero() {
    let mut a = Analyzer::new(AnalyzerParams {
        sla_network_rtt_p99_ns: 0,
        ..Default::default()
    });
    assert!(a
        .ingest(vec![s("a1", "b1", 0, 10, 0, u64::MAX)], 0)
        .violations
        .is_empty());
}

#[test]
fn resent_window_is_idempotent() {
    let mut a = analyzer(20);
    let w = s("a1", "b1", 100, 100, 50, 0);
    assert_eq!(a.ingest(vec![w.clone()], 0).violations.len(), 1);
    assert_eq!(
        a.ingest(vec![w.clone()], 0).violations.len(),
        0,
        "same window re-sent"
    );
    assert_eq!(a.paths(&PathFilter::default(), true).len(), 1);
    // A corrected re-send replaces the content.
    let fixed = s("a1", "b1", 100, 100, 0, 0);
    a.ingest(vec![fixed.clone()], 0);
    assert_eq!(a.paths(&PathFilter::default(), true), vec![fixed]);
    assert_eq!(a.violations(0).len(), 1);
}

#[test]
fn retention_keeps_newest_windows_in_order() {
    let mut a = analyzer(3);
    for start in [1u64, 2, 3, 4, 5] {
        a.ingest(vec![s("a1", "b1", start, 10, 0, 0)], 0);
    }
    // Late window inside the range is inserted in order; one older than all is dropped.
    a.ingest(vec![s("a1", "b1", 0, 10, 0, 0)], 0);
    let starts: Vec<_> = a
        .paths(&PathFilter::default(), true)
        .iter()
        .map(|s| s.window_start_unix_ns)
        .collect();
    assert_eq!(starts, vec![3, 4, 5]);
    a.ingest(vec![s("a1", "b1", 4, 10, 1, 0)], 0);
    let latest = a.paths(&PathFilter::default(), false);
    assert_eq!(latest.len(), 1);
    assert_eq!(latest[0].window_start_unix_ns, 5);
    a.ingest(
        vec![s("a1", "b1", 9, 10, 0, 0), s("a1", "b1", 7, 10, 0, 0)],
        0,
    );
    let starts: Vec<_> = a
        .paths(&PathFilter::default(), true)
        .iter()
        .map(|s| s.window_start_unix_ns)
        .collect();
    assert_eq!(starts, vec![5, 7, 9]);
}

#[test]
fn filters() {
    let mut a = analyzer(5);
    a.ingest(
        vec![
            s("a1", "b1", 1, 10, 0, 0),
            s("a1", "c1", 1, 10, 0, 0),
            s("b2", "a2", 1, 10, 0, 0),
        ],
        0,
    );
    let f = PathFilter {
        source_tor_id: "tor-a",
        ..Default::default()
    };
    assert_eq!(a.paths(&f, false).len(), 2);
    let f = PathFilter {
        target_tor_id: "tor-c",
        ..Default::default()
    };
    assert_eq!(a.paths(&f, false)[0].target_gid, "c1");
    let f = PathFilter {
        source_gid: "b2",
        target_gid: "a2",
        ..Default::default()
    };
    assert_eq!(a.paths(&f, false).len(), 1);
    let f = PathFilter {
        source_gid: "zz",
        ..Default::default()
    };
    assert!(a.paths(&f, false).is_empty());
}

#[test]
fn tor_pair_aggregation_uses_latest_window() {
    let mut a = analyzer(5);
    let mut x = s("a1", "b1", 1, 100, 50, 9_000);
    x.prober_delay_p50_ns = 999;
    a.ingest(vec![x], 0); // superseded below
    let mut y = s("a1", "b1", 2, 100, 10, 4_000);
    y.prober_delay_p50_ns = 7;
    y.responder_delay_p50_ns = 3;
    y.invalid_rtt_count = 2;
    let mut z = s("a2", "b2", 2, 300, 0, 6_000);
    z.prober_delay_p50_ns = 5;
    z.responder_delay_p50_ns = 8;
    a.ingest(vec![y, z, s("b1", "a1", 2, 10, 0, 100)], 0);
    let pairs = a.tor_pairs(0);
    assert_eq!(pairs.len(), 2);
    let ab = &pairs[0];
    assert_eq!(
        (ab.source_tor_id.as_str(), ab.target_tor_id.as_str()),
        ("tor-a", "tor-b")
    );
    assert_eq!(ab.paths, 2);
    assert_eq!(ab.probe_total, 400);
    assert_eq!(ab.probe_failed, 10);
    assert_eq!(ab.probe_success, 390);
    assert!((ab.loss_ratio - 0.025).abs() < 1e-12);
    assert_eq!(ab.network_rtt_p99_ns, 6_000);
    assert_eq!(ab.network_rtt_p50_ns, 3_000);
    assert_eq!(ab.prober_delay_p50_ns, 7);
    assert_eq!(ab.responder_delay_p50_ns, 8);
    assert_eq!(ab.invalid_rtt_count, 2);
    assert_eq!(pairs[1].source_tor_id, "tor-b");
    assert_eq!(pairs[1].loss_ratio, 0.0);
}

fn svc(mut x: PathSummary, name: &str) -> PathSummary {
    x.pinglist_type = PinglistType::Service as i32;
    x.service = name.into();
    x
}

#[test]
fn service_windows_do_not_overwrite_mesh_windows() {
    let mut a = analyzer(5);
    let mesh = s("a1", "b1", 10, 100, 0, 1_000);
    let sa = svc(s("a1", "b1", 10, 100, 5, 2_000), "alpha");
    let sb = svc(s("a1", "b1", 10, 100, 0, 3_000), "beta");
    a.ingest(vec![mesh.clone(), sa.clone(), sb.clone()], 0);
    assert_eq!(a.path_count(), 3);
    let all = a.paths(&PathFilter::default(), false);
    assert_eq!(all, vec![mesh.clone(), sa.clone(), sb.clone()]);
    assert_eq!(a.latest_service("a1", "b1", "alpha"), Some(&sa));
    assert_eq!(a.latest_service("a1", "b1", "beta"), Some(&sb));
    assert_eq!(a.latest_service("a1", "b1", "gamma"), None);
    assert_eq!(a.latest_service("b1", "a1", "alpha"), None);
    // A newer alpha window becomes the latest; the mesh path is untouched.
    let sa2 = svc(s("a1", "b1", 20, 100, 0, 2_500), "alpha");
    a.ingest(vec![sa2.clone()], 0);
    assert_eq!(a.latest_service("a1", "b1", "alpha"), Some(&sa2));
    // ToR pairs count the mesh path only.
    let pairs = a.tor_pairs(0);
    assert_eq!(pairs.len(), 1);
    assert_eq!((pairs[0].paths, pairs[0].probe_failed), (1, 0));
}

#[test]
fn violation_log_is_bounded() {
    let mut a = Analyzer::new(AnalyzerParams {
        violation_log_capacity: 10,
        ..Default::default()
    });
    let batch: Vec<_> = (0..50).map(|i| s("a1", "b1", i, 10, 10, 0)).collect();
    assert_eq!(a.ingest(batch, 0).violations.len(), 50);
    let v = a.violations(0);
    assert_eq!(v.len(), 10);
    assert_eq!(v[0].summary.window_start_unix_ns, 49);
}
