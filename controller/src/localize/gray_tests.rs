//! The gray detector on hand-built windows with known answers: a fabric whose path
//! summaries carry exactly the losses, delays and stalls put on it (failures spread by
//! error diffusion, so a 1% loss over 1,000 crossings is exactly 10 events), routed with
//! the same ECMP model the localizer has. Property: clean paths added to a window never
//! make a finding.

use std::collections::HashMap;

use proptest::prelude::*;
use rpingmesh_proto::controller_agent::{FlowLabelStats, PathSummary};
use rpingmesh_proto::operator::Finding;
use rpingmesh_protocol::aggregate::SLOW_LABEL_EXCESS_NS;

use super::*;
use crate::topology::{EcmpModel, LinkDir, Topology};

const TORS: usize = 8;
const RNICS: usize = 4;
const LABELS: u32 = 32;
const PER_LABEL: u32 = 4;
const LOCAL_PROBES: u32 = 120;
const INTER: usize = 4;
const BASE_RTT: u64 = 16_000;
const WINDOW_NS: u64 = 30_000_000_000;

#[derive(Default, Clone)]
struct Faults {
    /// Directed link -> drop probability per packet crossing.
    link_loss: HashMap<(u32, u32, LinkDir), f64>,
    link_add_ns: HashMap<(u32, u32, LinkDir), u64>,
    /// RNIC GID -> drop probability per packet.
    rnic_loss: HashMap<String, f64>,
    /// Host -> prober/responder delay (ns) and share of its probes timing out.
    host_stall: HashMap<String, (u64, f64)>,
}

struct Fab {
    topo: Topology,
    inv: HashMap<String, (String, String, String)>,
    gids: Vec<Vec<String>>,
    /// Error diffusion per kind of event: the events owed so far.
    owed: HashMap<String, f64>,
}

fn gid(t: usize, i: usize) -> String {
    format!("fd00:0000:0000:0000:0000:0000:{:04x}:{:04x}", t + 1, i + 1)
}

impl Fab {
    fn new() -> Self {
        let tors: Vec<String> = (1..=TORS).map(|t| format!("tor{t}")).collect();
        let spines: Vec<String> = (1..=4).map(|s| format!("spine{s}")).collect();
        let topo = Topology::full_mesh(&tors, &spines, Some(EcmpModel::Fnv1a { seed: 5 }));
        let mut inv = HashMap::new();
        let mut gids = Vec::new();
        for (t, tor) in tors.iter().enumerate() {
            let row: Vec<String> = (0..RNICS).map(|i| gid(t, i)).collect();
            for (i, g) in row.iter().enumerate() {
                inv.insert(
                    g.clone(),
                    (format!("h{}-{}", t + 1, i + 1), "r0".into(), tor.clone()),
                );
            }
            gids.push(row);
        }
        Fab {
            topo,
            inv,
            gids,
            owed: HashMap::new(),
        }
    }

    fn host(&self, g: &str) -> String {
        self.inv[g].0.clone()
    }

    /// Whole events out of `expected` more, carried over (error diffusion).
    fn events(&mut self, key: String, expected: f64) -> u32 {
        let e = self.owed.entry(key).or_default();
        *e += expected;
        let n = e.floor();
        *e -= n;
        n as u32
    }

    /// One path's window summary as an agent would send it.
    fn summary(
        &mut self,
        f: &Faults,
        st: usize,
        si: usize,
        dt: usize,
        di: usize,
        w: u64,
    ) -> PathSummary {
        let (sg, dg) = (self.gids[st][si].clone(), self.gids[dt][di].clone());
        let remote = st != dt;
        let mut s = PathSummary {
            source_gid: sg.clone(),
            target_gid: dg.clone(),
            source_tor_id: format!("tor{}", st + 1),
            target_tor_id: format!("tor{}", dt + 1),
            window_start_unix_ns: w,
            window_duration_ms: 30_000,
            network_rtt_min_ns: BASE_RTT,
            pinglist_type: remote as i32,
            ..Default::default()
        };
        let rnic = |g: &str| f.rnic_loss.get(g).copied().unwrap_or(0.0);
        let stall = |h: String| f.host_stall.get(&h).copied();
        let timeouts =
            stall(self.host(&sg)).map_or(0.0, |x| x.1) + stall(self.host(&dg)).map_or(0.0, |x| x.1);
        let labels: Vec<u32> = if remote {
            (0..LABELS).map(|l| l * 7919 + 3).collect()
        } else {
            vec![0]
        };
        let per = if remote { PER_LABEL } else { LOCAL_PROBES };
        let mut rtts = Vec::new();
        for &label in &labels {
            // Drop probability of the probe (failed) and of one of its ACKs (invalid).
            let (mut p_fwd, mut p_rev, mut add) =
                (rnic(&sg) + rnic(&dg), 2.0 * (rnic(&sg) + rnic(&dg)), 0);
            if remote {
                let (ts, td) = (st as u32, dt as u32);
                let fwd = self.topo.route(ts, td, &sg, &dg, label).unwrap();
                let rev = self.topo.route(td, ts, &dg, &sg, label).unwrap();
                for l in fwd {
                    p_fwd += f.link_loss.get(&l).copied().unwrap_or(0.0);
                    add += f.link_add_ns.get(&l).copied().unwrap_or(0);
                }
                for l in rev {
                    p_rev += 2.0 * f.link_loss.get(&l).copied().unwrap_or(0.0);
                    add += f.link_add_ns.get(&l).copied().unwrap_or(0);
                }
            }
            // One carry per kind of event for the whole fabric: a window's totals are
            // exact, and events land only where a fault is.
            // Both ACKs lost reads as a lost probe.
            let both_acks = (p_rev / 2.0).powi(2);
            let failed = self
                .events("f".into(), per as f64 * (p_fwd + both_acks + timeouts))
                .min(per);
            let invalid = self
                .events("i".into(), per as f64 * p_rev)
                .min(per - failed);
            let answered = per - failed - invalid;
            s.probe_total += per;
            s.probe_failed += failed;
            s.invalid_rtt_count += invalid;
            s.probe_success += per - failed;
            if answered > 0 {
                rtts.push(BASE_RTT + add);
            }
            if remote {
                s.flow_labels.push(FlowLabelStats {
                    flow_label: label,
                    probe_total: per,
                    probe_failed: failed,
                    probe_invalid: invalid,
                    network_rtt_p50_ns: if answered > 0 { BASE_RTT + add } else { 0 },
                    network_rtt_max_ns: if answered > 0 { BASE_RTT + add } else { 0 },
                });
            }
        }
        rtts.sort_unstable();
        s.network_rtt_p50_ns = rtts
            .get(rtts.len().saturating_sub(1) / 2)
            .copied()
            .unwrap_or(0);
        s.network_rtt_p99_ns = rtts.last().copied().unwrap_or(0);
        let delay =
            |g: &str| stall(self.host(g)).map_or(4_000 + (g.len() as u64 % 7) * 100, |x| x.0);
        s.prober_delay_p50_ns = delay(&sg);
        s.prober_delay_p99_ns = delay(&sg) * 5 / 4;
        s.responder_delay_p50_ns = delay(&dg);
        s.responder_delay_p99_ns = delay(&dg) * 5 / 4;
        // As the agent sends them: per-label detail only when it says something.
        let slow = BASE_RTT + SLOW_LABEL_EXCESS_NS;
        let detail = s.probe_failed > 0
            || s.invalid_rtt_count > 0
            || s.flow_labels.iter().any(|l| l.network_rtt_p50_ns >= slow);
        if !detail {
            s.flow_labels.clear();
        }
        s
    }

    fn window(&mut self, f: &Faults, w: u64) -> Vec<PathSummary> {
        let mut out = Vec::new();
        for st in 0..TORS {
            for si in 0..RNICS {
                for di in (0..RNICS).filter(|&d| d != si) {
                    out.push(self.summary(f, st, si, st, di, w));
                }
                for k in 1..=INTER {
                    let dt = (st + k) % TORS;
                    out.push(self.summary(f, st, si, dt, (si + k) % RNICS, w));
                }
            }
        }
        out
    }
}

/// Runs `clean` warm-up windows, then `faulty` windows with `f`; the open findings.
fn run(f: &Faults, clean: u64, faulty: u64) -> Vec<Finding> {
    let mut fab = Fab::new();
    let mut l = Localizer::new(LocalizerParams::default(), Some(fab.topo.clone()));
    for k in 0..clean + faulty {
        let faults = if k < clean {
            Faults::default()
        } else {
            f.clone()
        };
        let w = fab.window(&faults, k * WINDOW_NS);
        l.localize(k * WINDOW_NS, &w, &fab.inv, (k + 1) * WINDOW_NS);
    }
    l.list(0, "").into_iter().filter(|x| x.open).collect()
}

fn one(found: &[Finding]) -> &Finding {
    assert_eq!(found.len(), 1, "{:#?}", found);
    &found[0]
}

#[test]
fn a_one_percent_link_is_named_degraded_with_its_loss_and_direction() {
    let mut f = Faults::default();
    f.link_loss.insert((2, 1, LinkDir::Up), 0.01);
    let found = run(&f, 3, 3);
    let x = one(&found);
    assert_eq!(
        (x.kind.as_str(), x.location.as_str()),
        ("link", "tor3-spine2")
    );
    assert_eq!(
        (x.symptom.as_str(), x.severity.as_str()),
        ("loss", "degraded")
    );
    let e = x.evidence.as_ref().unwrap();
    assert_eq!(e.direction, "up");
    assert!((0.006..0.014).contains(&e.loss_ratio), "{e:?}");
    assert!(
        e.loss_ratio_stderr > 0.0 && e.loss_ratio_stderr < e.loss_ratio,
        "{e:?}"
    );
    assert!(e.score >= GrayParams::default().open_score, "{e:?}");
    assert!(x.confidence > 0.99, "{x:?}");
    assert!(!e.flow_labels.is_empty() && !e.paths.is_empty());
}

#[test]
fn a_lossy_link_owns_the_lost_probes_whose_acks_crossed_it() {
    // A label that lost its probe (or both ACKs: at 16% per packet, 2.6% of the probes
    // whose ACKs come down the link) and had no incomplete probe beside it. Its events
    // count for the probe's links (0, 1) alone, but the ACKs' links (2, 3) explain it
    // as well: a claim by one of them takes it.
    let u = evidence::Unit {
        loss: vec![(0, 1.0), (1, 1.0)],
        latency: vec![0, 1, 2, 3],
        slow: 0.0,
        excess_ns: 0,
        path: 0,
        label: 7,
        inter: true,
        probes: 1.0,
        failed: 1.0,
        invalid: 0.0,
        answered: 0.0,
        in_label_totals: true,
        owner: None,
    };
    for c in [0, 1, 2, 3] {
        assert!(gray::claims(&u, c, Test::Loss), "link {c}");
    }
    assert!(!gray::claims(&u, 4, Test::Loss), "a link it did not cross");
    assert!(!gray::claims(&u, 2, Test::Latency), "it was not slow");
    let answered = evidence::Unit {
        failed: 0.0,
        invalid: 1.0,
        loss: vec![(2, 1.0), (3, 1.0)],
        ..u
    };
    assert!(
        !gray::claims(&answered, 0, Test::Loss),
        "an ACK lost is the ACKs' links'"
    );
}

#[test]
fn a_link_lossy_both_ways_is_one_link_finding() {
    let mut f = Faults::default();
    f.link_loss.insert((5, 3, LinkDir::Up), 0.01);
    f.link_loss.insert((5, 3, LinkDir::Down), 0.01);
    let x = run(&f, 3, 3);
    let x = one(&x);
    assert_eq!(x.location, "tor6-spine4");
    assert_eq!(x.evidence.as_ref().unwrap().direction, "both");
}

#[test]
fn a_small_rnic_loss_is_the_rnic_not_its_links_or_tor() {
    let mut f = Faults::default();
    let g = gid(4, 2);
    f.rnic_loss.insert(g, 0.005);
    let found = run(&f, 3, 3);
    let x = one(&found);
    assert_eq!((x.kind.as_str(), x.location.as_str()), ("rnic", "h5-3/r0"));
    assert_eq!(x.severity, "degraded");
    let e = x.evidence.as_ref().unwrap();
    assert!((0.003..0.008).contains(&e.loss_ratio), "{e:?}");
}

#[test]
fn ten_microseconds_on_a_link_is_named_with_its_excess() {
    let mut f = Faults::default();
    f.link_add_ns.insert((0, 2, LinkDir::Down), 10_000);
    let found = run(&f, 3, 2);
    let x = one(&found);
    assert_eq!(
        (x.kind.as_str(), x.location.as_str()),
        ("link", "tor1-spine3")
    );
    assert_eq!(
        (x.symptom.as_str(), x.severity.as_str()),
        ("latency", "degraded")
    );
    let e = x.evidence.as_ref().unwrap();
    assert_eq!(e.direction, "down");
    assert!((9_000..=11_000).contains(&e.excess_ns), "{e:?}");
}

#[test]
fn a_half_millisecond_stall_is_the_host_and_its_timeouts_are_not_the_network() {
    let mut f = Faults::default();
    f.host_stall.insert("h3-2".into(), (850_000, 0.02));
    let found = run(&f, 3, 3);
    let x = one(&found);
    assert_eq!((x.kind.as_str(), x.location.as_str()), ("host", "h3-2"));
    assert_eq!(
        (x.symptom.as_str(), x.severity.as_str()),
        ("stall", "degraded")
    );
    let e = x.evidence.as_ref().unwrap();
    assert!(e.excess_ns > 800_000, "{e:?}");
}

#[test]
fn three_faults_of_three_kinds_at_once() {
    let mut f = Faults::default();
    f.link_loss.insert((1, 0, LinkDir::Down), 0.01);
    f.rnic_loss.insert(gid(6, 1), 0.01);
    f.host_stall.insert("h4-4".into(), (1_700_000, 0.02));
    let mut found: Vec<(String, String)> = run(&f, 3, 3)
        .into_iter()
        .map(|x| (x.kind, x.location))
        .collect();
    found.sort();
    assert_eq!(
        found,
        [
            ("host".to_string(), "h4-4".to_string()),
            ("link".into(), "tor2-spine1".into()),
            ("rnic".into(), "h7-2/r0".into()),
        ]
    );
}

#[test]
fn a_resolved_fault_lets_its_finding_go() {
    let mut f = Faults::default();
    f.link_loss.insert((3, 2, LinkDir::Up), 0.02);
    let mut fab = Fab::new();
    let mut l = Localizer::new(LocalizerParams::default(), Some(fab.topo.clone()));
    let mut open_per_window = Vec::new();
    for k in 0..10u64 {
        let faults = if (3..6).contains(&k) {
            f.clone()
        } else {
            Faults::default()
        };
        let w = fab.window(&faults, k * WINDOW_NS);
        l.localize(k * WINDOW_NS, &w, &fab.inv, (k + 1) * WINDOW_NS);
        open_per_window.push(l.list(0, "").iter().filter(|x| x.open).count());
    }
    assert_eq!(open_per_window, [0, 0, 0, 1, 1, 1, 1, 0, 0, 0]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Clean paths added to a window (extra probes between any two RNICs, any labels,
    /// RTT within the slow margin) never make a finding, with or without a fault.
    #[test]
    fn clean_paths_never_make_a_finding(
        extra in proptest::collection::vec((0..TORS, 0..RNICS, 0..TORS, 0..RNICS, 1u32..400, 0u64..4_000), 0..60),
        fault in 0usize..3,
    ) {
        let mut f = Faults::default();
        match fault {
            1 => { f.link_loss.insert((2, 1, LinkDir::Up), 0.02); }
            2 => { f.rnic_loss.insert(gid(1, 1), 0.01); }
            _ => {}
        }
        let mut fab = Fab::new();
        let mut l = Localizer::new(LocalizerParams::default(), Some(fab.topo.clone()));
        for k in 0..5u64 {
            let faults = if k < 2 { Faults::default() } else { f.clone() };
            let mut w = fab.window(&faults, k * WINDOW_NS);
            for &(st, si, dt, di, n, jitter) in &extra {
                if (st, si) == (dt, di) {
                    continue;
                }
                w.push(PathSummary {
                    source_gid: gid(st, si),
                    target_gid: gid(dt, di),
                    source_tor_id: format!("tor{}", st + 1),
                    target_tor_id: format!("tor{}", dt + 1),
                    window_start_unix_ns: k * WINDOW_NS,
                    window_duration_ms: 30_000,
                    probe_total: n,
                    probe_success: n,
                    network_rtt_min_ns: BASE_RTT,
                    network_rtt_p50_ns: BASE_RTT + jitter,
                    network_rtt_p99_ns: BASE_RTT + jitter,
                    prober_delay_p50_ns: 4_000,
                    prober_delay_p99_ns: 5_000,
                    responder_delay_p50_ns: 4_000,
                    responder_delay_p99_ns: 5_000,
                    ..Default::default()
                });
            }
            l.localize(k * WINDOW_NS, &w, &fab.inv, (k + 1) * WINDOW_NS);
        }
        let found: Vec<String> = l.list(0, "").into_iter().map(|x| x.location).collect();
        let want: Vec<String> = match fault {
            1 => vec!["tor3-spine2".into()],
            2 => vec!["h2-2/r0".into()],
            _ => vec![],
        };
        prop_assert_eq!(found, want);
    }
}

#[test]
fn the_bar_grows_with_the_tests_a_day_makes() {
    let p = GrayParams::default();
    let bar = |components, window_ms| super::gray::bar_for(&p, components, window_ms);
    // A handful of components: the floor.
    assert_eq!(bar(1, 30_000), p.open_score);
    // The simulator's 2,048-RNIC day (about 4,000 components): 4,000 x 4 runs x 2,880
    // windows a day / 0.01.
    let b = bar(4_000, 30_000);
    assert!(
        (b - (4_000.0f64 * 4.0 * 2_880.0 / 0.01).ln()).abs() < 1e-9,
        "{b}"
    );
    assert!((22.0..22.5).contains(&b), "{b}");
    // 100,000 RNICs (with their links, cables, ToRs and hosts): about 27 nats.
    assert!((27.0..28.0).contains(&bar(700_000, 30_000)));
    // Windows of 10 s make three times the tests; an unknown length is 30 s.
    assert!((bar(4_000, 10_000) - b - 3f64.ln()).abs() < 1e-9);
    assert_eq!(bar(4_000, 0), b);
}
