//! Localization rules on hand-built windows: a small fabric whose path summaries are
//! computed from which links, RNICs, hosts or ToRs are broken, routed with the same
//! ECMP model the localizer is given.

use std::collections::HashMap;

use rpingmesh_proto::controller_agent::{FlowLabelStats, PathSummary};
use rpingmesh_proto::operator::FindingPath;

use super::*;
use crate::topology::{EcmpModel, LinkDir, Topology};

const PROBES_PER_LABEL: u32 = 4;
const LABELS: u32 = 16;
const BASE_RTT: u64 = 16_000;

#[derive(Clone, Copy, Default)]
struct Fault {
    /// (tor, spine, dir) links with this loss (1.0 = down) ...
    loss: f64,
    /// ... or this extra latency.
    add_ns: u64,
}

/// A test fabric: `tors` ToRs x `rnics` RNICs each (one host per RNIC unless
/// `rnics_per_host` groups them), 4 spines.
struct Fab {
    topo: Topology,
    inv: HashMap<String, (String, String, String)>,
    /// (tor, index) -> gid
    gids: Vec<Vec<String>>,
    links: HashMap<(u32, u32, LinkDir), Fault>,
    rnic_loss: HashMap<String, f64>,
    host_delay: HashMap<String, u64>,
    /// p99 endpoint delay (a stall in part of the window).
    host_tail: HashMap<String, u64>,
    host_loss: HashMap<String, f64>,
    dead_tors: Vec<u32>,
    /// Inter-ToR targets per RNIC.
    inter: usize,
}

fn gid(t: usize, i: usize) -> String {
    format!("fd00:0000:0000:0000:0000:0000:{:04x}:{:04x}", t + 1, i + 1)
}

impl Fab {
    fn new(tors: usize, rnics: usize, rnics_per_host: usize) -> Self {
        let tor_names: Vec<String> = (1..=tors).map(|t| format!("tor{t}")).collect();
        let spines: Vec<String> = (1..=4).map(|s| format!("spine{s}")).collect();
        let topo = Topology::full_mesh(&tor_names, &spines, Some(EcmpModel::Fnv1a { seed: 1 }));
        let mut inv = HashMap::new();
        let mut gids = Vec::new();
        for (t, tor) in tor_names.iter().enumerate() {
            let mut row = Vec::new();
            for i in 0..rnics {
                let g = gid(t, i);
                let host = format!("h{}-{}", t + 1, i / rnics_per_host + 1);
                let dev = format!("r{}", i % rnics_per_host);
                inv.insert(g.clone(), (host, dev, tor.clone()));
                row.push(g);
            }
            gids.push(row);
        }
        Fab {
            topo,
            inv,
            gids,
            links: HashMap::new(),
            rnic_loss: HashMap::new(),
            host_delay: HashMap::new(),
            host_tail: HashMap::new(),
            host_loss: HashMap::new(),
            dead_tors: Vec::new(),
            inter: 3,
        }
    }

    fn host(&self, g: &str) -> &str {
        &self.inv[g].0
    }

    fn link(&mut self, tor: u32, spine: u32, dirs: &[LinkDir], f: Fault) {
        for &d in dirs {
            self.links.insert((tor, spine, d), f);
        }
    }

    /// Expected probes lost (fractional) and added RTT of one probe round trip.
    fn path_effect(&self, st: u32, dt: u32, sg: &str, dg: &str, label: u32) -> (f64, u64) {
        let mut keep = 1.0;
        let mut add = 0;
        for g in [sg, dg] {
            keep *= 1.0 - self.rnic_loss.get(g).copied().unwrap_or(0.0);
            keep *= 1.0 - self.host_loss.get(self.host(g)).copied().unwrap_or(0.0);
        }
        if self.dead_tors.contains(&st) || self.dead_tors.contains(&dt) {
            keep = 0.0;
        }
        if st != dt {
            let fwd = self.topo.route(st, dt, sg, dg, label).unwrap();
            let rev = self.topo.route(dt, st, dg, sg, label).unwrap();
            for l in fwd.iter().chain(rev.iter()) {
                if let Some(f) = self.links.get(l) {
                    keep *= 1.0 - f.loss;
                    add += f.add_ns;
                }
            }
        }
        (1.0 - keep, add)
    }

    fn summary(&self, st: usize, si: usize, dt: usize, di: usize) -> PathSummary {
        let (sg, dg) = (&self.gids[st][si], &self.gids[dt][di]);
        let remote = st != dt;
        let labels: Vec<u32> = if remote {
            (0..LABELS).map(|l| l * 4099 + 7).collect()
        } else {
            vec![0]
        };
        let per_label = if remote {
            PROBES_PER_LABEL
        } else {
            PROBES_PER_LABEL * LABELS
        };
        let mut s = PathSummary {
            source_gid: sg.clone(),
            target_gid: dg.clone(),
            source_tor_id: format!("tor{}", st + 1),
            target_tor_id: format!("tor{}", dt + 1),
            window_start_unix_ns: 0,
            window_duration_ms: 30_000,
            network_rtt_min_ns: BASE_RTT,
            ..Default::default()
        };
        let mut rtts = Vec::new();
        for &label in &labels {
            let (loss, add) = self.path_effect(st as u32, dt as u32, sg, dg, label);
            let failed = (loss * per_label as f64).round() as u32;
            s.probe_total += per_label;
            s.probe_failed += failed;
            if failed < per_label {
                rtts.push(BASE_RTT + add);
            }
            if remote {
                s.flow_labels.push(FlowLabelStats {
                    flow_label: label,
                    probe_total: per_label,
                    probe_failed: failed,
                    probe_invalid: 0,
                    network_rtt_p50_ns: if failed < per_label {
                        BASE_RTT + add
                    } else {
                        0
                    },
                    network_rtt_max_ns: if failed < per_label {
                        BASE_RTT + add
                    } else {
                        0
                    },
                });
            }
        }
        s.probe_success = s.probe_total - s.probe_failed;
        rtts.sort_unstable();
        s.network_rtt_p50_ns = rtts
            .get(rtts.len().saturating_sub(1) / 2)
            .copied()
            .unwrap_or(0);
        s.network_rtt_p99_ns = rtts.last().copied().unwrap_or(0);
        let delay = |g: &str| self.host_delay.get(self.host(g)).copied().unwrap_or(3_000);
        let tail = |g: &str| self.host_tail.get(self.host(g)).copied().unwrap_or(9_000);
        if s.probe_success > 0 {
            s.prober_delay_p50_ns = delay(sg);
            s.responder_delay_p50_ns = delay(dg);
            s.prober_delay_p99_ns = tail(sg).max(delay(sg));
            s.responder_delay_p99_ns = tail(dg).max(delay(dg));
        }
        // As the agent sends them: per-label detail only when it says something.
        let spread = s
            .flow_labels
            .iter()
            .filter(|l| l.probe_total > l.probe_failed)
            .map(|l| l.network_rtt_p50_ns);
        let (lo, hi) = spread.fold((u64::MAX, 0), |(lo, hi), v| (lo.min(v), hi.max(v)));
        if s.probe_failed == 0 && !(hi > lo && hi - lo > 20_000) {
            s.flow_labels.clear();
        }
        s
    }

    /// ToR mesh for every RNIC, plus `inter` inter-ToR targets each (next ToRs round).
    fn window(&self) -> Vec<PathSummary> {
        let tors = self.gids.len();
        let mut out = Vec::new();
        for st in 0..tors {
            let n = self.gids[st].len();
            for si in 0..n {
                for di in 0..n {
                    if di != si {
                        out.push(self.summary(st, si, st, di));
                    }
                }
                for k in 1..=self.inter.min(tors - 1) {
                    let dt = (st + k) % tors;
                    let di = (si + k) % self.gids[dt].len();
                    out.push(self.summary(st, si, dt, di));
                }
            }
        }
        out
    }

    fn explain(&self, topo: bool) -> Vec<Blame> {
        let w = self.window();
        explain(
            &LocalizerParams::default(),
            topo.then_some(&self.topo),
            &w,
            &self.inv,
        )
    }
}

fn named(blames: &[Blame]) -> Vec<(ComponentKind, String, Symptom)> {
    let mut v: Vec<_> = blames
        .iter()
        .map(|b| (b.kind, b.location.clone(), b.symptom))
        .collect();
    v.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    v
}

#[test]
fn a_clean_window_blames_nothing() {
    let f = Fab::new(6, 4, 1);
    assert!(f.explain(true).is_empty());
    assert!(f.explain(false).is_empty());
}

#[test]
fn a_dead_rnic_is_named_and_its_neighbours_are_not() {
    let mut f = Fab::new(6, 4, 1);
    f.rnic_loss.insert(gid(2, 1), 1.0);
    let b = f.explain(true);
    assert_eq!(
        named(&b),
        vec![(ComponentKind::Rnic, "h3-2/r0".into(), Symptom::Down)]
    );
    let e = b[0].evidence.clone();
    assert!(
        e.paths_total >= 6 && e.probe_failed == e.probe_total,
        "{e:?}"
    );
    assert!(b[0].confidence > 0.9);
}

#[test]
fn a_dead_rnic_on_a_tor_of_two() {
    // R-Pingmesh's ToR-mesh cannot tell which of two RNICs is dead; the inter-ToR paths can.
    let mut f = Fab::new(6, 2, 1);
    f.rnic_loss.insert(gid(0, 0), 1.0);
    assert_eq!(
        named(&f.explain(true)),
        vec![(ComponentKind::Rnic, "h1-1/r0".into(), Symptom::Down)]
    );
    let mut f = Fab::new(6, 2, 1);
    f.rnic_loss.insert(gid(0, 1), 1.0);
    assert_eq!(
        named(&f.explain(false)),
        vec![(ComponentKind::Rnic, "h1-2/r0".into(), Symptom::Down)]
    );
}

#[test]
fn a_dead_rnic_whose_neighbour_has_one_path_off_the_tor() {
    // Its one neighbour's paths are half to the dead RNIC: the neighbour looks broken as
    // well until the dead RNIC's paths are set aside, and two broken RNICs of two read
    // as a dead ToR. The neighbour's healthy inter-ToR paths say it is neither.
    let mut f = Fab::new(2, 2, 1);
    f.inter = 1;
    f.rnic_loss.insert(gid(1, 1), 1.0);
    for topo in [true, false] {
        assert_eq!(
            named(&f.explain(topo)),
            vec![(ComponentKind::Rnic, "h2-2/r0".into(), Symptom::Down)],
            "topology known: {topo}"
        );
    }
}

#[test]
fn a_tor_of_two_seen_only_from_inside_is_named_whole() {
    // Only the two RNICs probe each other: a dead RNIC and a dead ToR look alike, and
    // naming one of the two at random would be wrong half of the time.
    let mut f = Fab::new(2, 2, 1);
    f.inter = 0;
    f.rnic_loss.insert(gid(1, 1), 1.0);
    assert_eq!(
        named(&f.explain(true)),
        vec![(ComponentKind::Tor, "tor2".into(), Symptom::Down)]
    );
}

#[test]
fn a_dead_rnic_probed_only_by_two_peers_that_see_nothing_else() {
    // x's peers A and B have no path but to x: each looks as broken as x, and x alone
    // explains the four lost paths (the window an operator sees while the rest of A's
    // and B's paths still fall in other windows).
    let mut f = Fab::new(2, 2, 1);
    let x = gid(1, 0);
    f.rnic_loss.insert(x.clone(), 1.0);
    let mut w = vec![
        f.summary(0, 0, 1, 0),
        f.summary(1, 0, 0, 0),
        f.summary(0, 1, 1, 0),
        f.summary(1, 0, 0, 1),
    ];
    for _ in 0..2 {
        let b = explain(&LocalizerParams::default(), Some(&f.topo), &w, &f.inv);
        assert_eq!(
            named(&b),
            vec![(ComponentKind::Rnic, "h2-1/r0".into(), Symptom::Down)]
        );
        w.reverse();
    }
}

#[test]
fn a_flapping_rnic() {
    let mut f = Fab::new(6, 4, 1);
    f.rnic_loss.insert(gid(4, 3), 0.3);
    assert_eq!(
        named(&f.explain(true)),
        vec![(ComponentKind::Rnic, "h5-4/r0".into(), Symptom::Flapping)]
    );
}

#[test]
fn a_stalled_host_is_named_and_suppresses_the_network_findings_it_causes() {
    let mut f = Fab::new(6, 4, 2);
    f.host_delay.insert("h2-1".into(), 5_000_000);
    f.host_loss.insert("h2-1".into(), 0.25);
    // Without the host rule these losses name its two RNICs.
    let b = f.explain(true);
    assert_eq!(
        named(&b),
        vec![(ComponentKind::Host, "h2-1".into(), Symptom::Stall)]
    );
    assert_eq!(b[0].evidence.excess_ns, 5_000_000);
}

#[test]
fn a_dead_tor_is_one_finding_not_one_per_rnic() {
    let mut f = Fab::new(6, 4, 1);
    f.dead_tors.push(3);
    let b = f.explain(true);
    assert_eq!(
        named(&b),
        vec![(ComponentKind::Tor, "tor4".into(), Symptom::Down)]
    );
    let mut f = Fab::new(6, 2, 1);
    f.dead_tors.push(0);
    assert_eq!(
        named(&f.explain(false)),
        vec![(ComponentKind::Tor, "tor1".into(), Symptom::Down)]
    );
}

#[test]
fn a_dead_link_is_named_with_its_labels_and_both_directions() {
    let mut f = Fab::new(8, 4, 1);
    f.link(
        1,
        0,
        &[LinkDir::Up, LinkDir::Down],
        Fault {
            loss: 1.0,
            add_ns: 0,
        },
    );
    let b = f.explain(true);
    assert_eq!(
        named(&b),
        vec![(ComponentKind::Link, "tor2-spine1".into(), Symptom::Down)]
    );
    let e = &b[0].evidence;
    assert_eq!(e.direction, "both");
    assert!(!e.flow_labels.is_empty());
    // Every label it names really crosses the link one way or the other.
    let crosses = |p: &FindingPath, l: u32| {
        let (st, dt) = (
            f.topo.tor_index(&f.inv[&p.source_gid].2).unwrap(),
            f.topo.tor_index(&f.inv[&p.target_gid].2).unwrap(),
        );
        let fwd = f
            .topo
            .route(st, dt, &p.source_gid, &p.target_gid, l)
            .unwrap();
        let rev = f
            .topo
            .route(dt, st, &p.target_gid, &p.source_gid, l)
            .unwrap();
        fwd.iter().chain(rev.iter()).any(|x| (x.0, x.1) == (1, 0))
    };
    let p = &e.paths[0];
    assert!(f.window().iter().any(|s| s.source_gid == p.source_gid
        && s.target_gid == p.target_gid
        && s.flow_labels
            .iter()
            .filter(|l| l.probe_failed > 0)
            .all(|l| crosses(p, l.flow_label))));
}

#[test]
fn a_lossy_uplink_only_one_way() {
    let mut f = Fab::new(8, 4, 1);
    f.link(
        2,
        2,
        &[LinkDir::Up],
        Fault {
            loss: 0.25,
            add_ns: 0,
        },
    );
    let b = f.explain(true);
    assert_eq!(
        named(&b),
        vec![(ComponentKind::Link, "tor3-spine3".into(), Symptom::Loss)]
    );
    assert_eq!(b[0].evidence.direction, "up");
}

#[test]
fn a_slow_link() {
    let mut f = Fab::new(8, 4, 1);
    f.link(
        5,
        1,
        &[LinkDir::Up, LinkDir::Down],
        Fault {
            loss: 0.0,
            add_ns: 200_000,
        },
    );
    let b = f.explain(true);
    assert_eq!(
        named(&b),
        vec![(ComponentKind::Link, "tor6-spine2".into(), Symptom::Latency)]
    );
    assert_eq!(b[0].evidence.excess_ns, 200_000);
    assert_eq!(b[0].evidence.direction, "both");
}

#[test]
fn without_an_ecmp_model_the_tor_side_is_named() {
    let mut f = Fab::new(8, 4, 1);
    f.link(
        1,
        0,
        &[LinkDir::Up, LinkDir::Down],
        Fault {
            loss: 1.0,
            add_ns: 0,
        },
    );
    let b = f.explain(false);
    assert_eq!(
        named(&b),
        vec![(ComponentKind::Link, "tor2/uplink".into(), Symptom::Loss)]
    );
    assert!(b[0].confidence <= 0.5);
}

#[test]
fn two_faults_at_once() {
    let mut f = Fab::new(8, 4, 1);
    f.rnic_loss.insert(gid(6, 0), 1.0);
    f.link(
        3,
        3,
        &[LinkDir::Down],
        Fault {
            loss: 1.0,
            add_ns: 0,
        },
    );
    assert_eq!(
        named(&f.explain(true)),
        vec![
            (ComponentKind::Rnic, "h7-1/r0".into(), Symptom::Down),
            (ComponentKind::Link, "tor4-spine4".into(), Symptom::Down),
        ]
    );
}

fn blame(loc: &str) -> Blame {
    Blame {
        kind: ComponentKind::Rnic,
        location: loc.into(),
        symptom: Symptom::Down,
        confidence: 0.9,
        evidence: FindingEvidence::default(),
    }
}

fn changes(ev: &[FindingEvent]) -> Vec<(String, u64, String)> {
    ev.iter()
        .map(|e| {
            let f = e.finding.as_ref().unwrap();
            (e.change.clone(), f.id, f.location.clone())
        })
        .collect()
}

#[test]
fn hysteresis_opens_after_k_and_resolves_after_m() {
    let params = LocalizerParams {
        open_after_windows: 2,
        resolve_after_windows: 3,
        ..Default::default()
    };
    let mut l = Localizer::new(params, None);
    let w = 30_000_000_000u64;
    assert!(l.apply(0, vec![blame("a")], 1).is_empty(), "1 of K=2");
    assert!(l.apply(w, vec![], 2).is_empty(), "the streak broke");
    assert!(l.apply(2 * w, vec![blame("a")], 3).is_empty());
    let ev = l.apply(3 * w, vec![blame("a")], 4);
    assert_eq!(changes(&ev), vec![("opened".into(), 1, "a".into())]);
    let f = ev[0].finding.as_ref().unwrap();
    assert_eq!(
        (
            f.opened_unix_ns,
            f.open,
            f.evidence.as_ref().unwrap().windows
        ),
        (4, true, 2)
    );
    let ev = l.apply(4 * w, vec![blame("a")], 5);
    assert_eq!(changes(&ev), vec![("updated".into(), 1, "a".into())]);
    assert_eq!(ev[0].finding.as_ref().unwrap().last_seen_unix_ns, 5);
    // Two clean windows, a blaming one (the clean count restarts), then three clean.
    assert!(l.apply(5 * w, vec![], 6).is_empty());
    assert!(l.apply(6 * w, vec![], 7).is_empty());
    assert_eq!(l.apply(7 * w, vec![blame("a")], 8).len(), 1);
    assert!(l.apply(8 * w, vec![], 9).is_empty());
    assert!(l.apply(9 * w, vec![], 10).is_empty());
    let ev = l.apply(10 * w, vec![], 11);
    assert_eq!(changes(&ev), vec![("resolved".into(), 1, "a".into())]);
    let f = ev[0].finding.as_ref().unwrap();
    assert_eq!(
        (f.open, f.resolved_unix_ns, f.last_seen_unix_ns),
        (false, 11, 8)
    );
    assert_eq!(f.evidence.as_ref().unwrap().windows, 4);
    assert_eq!(l.list(0, "").len(), 1);
    assert_eq!(l.open_by_kind()["rnic"], 0);
}

#[test]
fn restored_findings_continue_and_ids_do_not_repeat() {
    let mut l = Localizer::new(LocalizerParams::default(), None);
    let ev = l.apply(0, vec![blame("a"), blame("b")], 1);
    assert_eq!(ev.len(), 2);
    l.apply(1, vec![blame("a")], 2);
    l.apply(2, vec![blame("a")], 3); // b resolves (M=2)
    let stored = l.list(0, "");
    assert_eq!(stored.iter().filter(|f| f.open).count(), 1);

    let mut again = Localizer::new(LocalizerParams::default(), None);
    again.restore(stored.clone());
    assert_eq!(again.list(0, ""), stored);
    assert_eq!(again.open_by_kind()["rnic"], 1);
    // "a" keeps its id when blamed again; a new component gets a fresh one.
    let ev = again.apply(3, vec![blame("a"), blame("c")], 4);
    assert_eq!(
        changes(&ev),
        vec![
            ("updated".into(), 1, "a".into()),
            ("opened".into(), 3, "c".into())
        ]
    );
    // And "a" resolves after M clean windows.
    again.apply(4, vec![blame("c")], 5);
    let ev = again.apply(5, vec![blame("c")], 6);
    assert_eq!(
        changes(&ev),
        vec![
            ("updated".into(), 3, "c".into()),
            ("resolved".into(), 1, "a".into())
        ]
    );
}

#[test]
fn kind_filter_and_resolved_limit() {
    let mut l = Localizer::new(
        LocalizerParams {
            resolve_after_windows: 1,
            ..Default::default()
        },
        None,
    );
    let mut host = blame("h");
    host.kind = ComponentKind::Host;
    l.apply(0, vec![blame("a"), host], 1);
    l.apply(1, vec![], 2);
    l.apply(2, vec![blame("b")], 3);
    assert_eq!(l.list(0, "").len(), 3);
    assert_eq!(l.list(1, "").len(), 2, "open b + one resolved");
    assert_eq!(l.list(0, "host").len(), 1);
    assert_eq!(l.list(0, "link").len(), 0);
}

#[test]
fn the_analyzer_localizes_a_window_once_it_settled() {
    use crate::analyzer::{Analyzer, AnalyzerParams};
    let params = AnalyzerParams {
        localize_settle_ns: 5_000_000_000,
        ..Default::default()
    };
    let mut f = Fab::new(4, 3, 1);
    let mut a = Analyzer::with_topology(params, Some(f.topo.clone()));
    let w = 30_000_000_000u64;
    let at = |f: &Fab, start: u64| {
        let mut v = f.window();
        for s in &mut v {
            s.window_start_unix_ns = start;
        }
        v
    };
    a.ingest(at(&f, 0), w + 1);
    assert!(a.tick(w + 4_999_999_999, &f.inv).is_empty(), "not settled");
    assert!(
        a.tick(w + 5_000_000_000, &f.inv).is_empty(),
        "settled, clean"
    );
    f.rnic_loss.insert(gid(1, 2), 1.0);
    let bad = at(&f, w);
    a.ingest(bad.clone(), 2 * w + 1);
    let ev = a.tick(2 * w + 5_000_000_000, &f.inv);
    assert_eq!(changes(&ev), vec![("opened".into(), 1, "h2-3/r0".into())]);
    // A window re-sent after it was localized moves nothing.
    a.ingest(bad, 3 * w);
    assert!(a.tick(3 * w + 5_000_000_000, &f.inv).is_empty());
    f.rnic_loss.clear();
    a.ingest(at(&f, 2 * w), 3 * w + 1);
    a.ingest(at(&f, 3 * w), 4 * w + 1);
    let ev = a.tick(4 * w + 5_000_000_000, &f.inv);
    assert_eq!(changes(&ev), vec![("resolved".into(), 1, "h2-3/r0".into())]);
    assert_eq!(
        a.localizer().list(0, "rnic")[0].resolved_unix_ns,
        4 * w + 5_000_000_000
    );
}

#[test]
fn every_uplink_of_a_tor_at_once_is_not_that_many_links() {
    // A dead RNIC seen for a second of a window: 3% loss on its paths, too little for the
    // RNIC rule, spread over all its ToR's uplinks; no link is blamed.
    let mut f = Fab::new(8, 2, 1);
    f.inter = 6;
    f.rnic_loss.insert(gid(3, 0), 0.26);
    let mut w = f.window();
    for s in &mut w {
        if s.source_gid == gid(3, 0) || s.target_gid == gid(3, 0) {
            // Keep the loss on the inter-ToR paths only, at a few percent.
            if s.source_tor_id == s.target_tor_id {
                s.probe_failed = 0;
                s.probe_success = s.probe_total;
            }
        }
    }
    let b = explain(&LocalizerParams::default(), Some(&f.topo), &w, &f.inv);
    assert!(
        b.iter().all(|b| b.kind != ComponentKind::Link),
        "{:?}",
        named(&b)
    );
}

#[test]
fn down_is_not_taken_back_by_a_partial_window() {
    let mut l = Localizer::new(LocalizerParams::default(), None);
    let mut partial = blame("a");
    partial.symptom = Symptom::Flapping;
    let ev = l.apply(0, vec![partial.clone()], 1);
    assert_eq!(ev[0].finding.as_ref().unwrap().symptom, "flapping");
    let ev = l.apply(1, vec![blame("a")], 2);
    assert_eq!(
        ev[0].finding.as_ref().unwrap().symptom,
        "down",
        "worse is shown"
    );
    let ev = l.apply(2, vec![partial], 3);
    assert_eq!(ev[0].finding.as_ref().unwrap().symptom, "down", "kept");
}

#[test]
fn a_host_stalled_for_part_of_the_window_is_not_blamed_nor_its_timeouts_on_the_network() {
    let mut f = Fab::new(8, 4, 2);
    f.inter = 6;
    f.host_tail.insert("h3-1".into(), 6_000_000);
    f.host_loss.insert("h3-1".into(), 0.15);
    assert!(f.explain(true).is_empty(), "{:?}", named(&f.explain(true)));
    // Stalled the whole window: named.
    f.host_delay.insert("h3-1".into(), 6_000_000);
    assert_eq!(
        named(&f.explain(true)),
        vec![(ComponentKind::Host, "h3-1".into(), Symptom::Stall)]
    );
}

#[test]
fn an_rnic_down_for_a_moment_of_the_window_leaves_no_link_finding() {
    // Two or three probes lost on every path of one RNIC (a flap that began at the end of
    // the window): too little to name it, and not the links' either.
    let mut f = Fab::new(8, 4, 1);
    f.inter = 6;
    let x = gid(5, 2);
    let mut w = f.window();
    for s in &mut w {
        if s.source_gid == x || s.target_gid == x {
            s.probe_failed = 2;
            s.probe_success = s.probe_total - 2;
            for l in s.flow_labels.iter_mut().take(2) {
                l.probe_failed = 1;
            }
            if s.flow_labels.is_empty() && s.source_tor_id != s.target_tor_id {
                s.flow_labels = (0..LABELS)
                    .map(|i| FlowLabelStats {
                        flow_label: i * 4099 + 7,
                        probe_total: PROBES_PER_LABEL,
                        probe_failed: (i < 2) as u32,
                        network_rtt_p50_ns: BASE_RTT,
                        network_rtt_max_ns: BASE_RTT,
                        probe_invalid: 0,
                    })
                    .collect();
            }
        }
    }
    let b = explain(&LocalizerParams::default(), Some(&f.topo), &w, &f.inv);
    assert!(b.is_empty(), "{:?}", named(&b));
}
