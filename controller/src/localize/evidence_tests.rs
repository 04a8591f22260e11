//! The window evidence against a plain label-by-label reference: `evidence::build` sums a
//! path's labels per spine and the clean paths per ToR before they reach the links, and
//! its ids, exposures and answered probes must come out as if every label and every path
//! had been added one at a time. Partial meshes take the per-path route, full meshes the
//! per-ToR one: both are covered.

use std::collections::HashMap;

use proptest::prelude::*;
use rpingmesh_proto::controller_agent::{FlowLabelStats, PathSummary};

use super::baseline::Baseline;
use super::evidence::{build, Component, Components, Exposure, Skip};
use super::placed::{Placed, WindowPath};
use crate::topology::{LinkDir, Topology};

const TORS: usize = 4;
const RNICS: usize = 3;

fn gid(t: usize, i: usize) -> String {
    format!("fd00::{:x}:{:x}", t + 1, i + 1)
}

fn topology(partial: bool) -> Topology {
    let ecmp = "ecmp: {model: fnv1a, seed: 3}\n";
    let text = if partial {
        // tor1 and tor2 share s2 only with tor3/tor4.
        "spines: [s1, s2, s3]\ntors:\n  tor1: [s1, s2]\n  tor2: [s2, s3]\n  tor3: [s1, s2, s3]\n  tor4: [s1, s2, s3]\n"
    } else {
        "spines: [s1, s2, s3]\ntors:\n  tor1: [s1, s2, s3]\n  tor2: [s1, s2, s3]\n  tor3: [s1, s2, s3]\n  tor4: [s1, s2, s3]\n"
    };
    Topology::from_yaml(&format!("{text}{ecmp}")).expect("topology")
}

/// A path's shape: (source ToR, source RNIC, ToR offset, target RNIC, probes, labels as
/// (label, lost, incomplete)).
type Shape = (usize, usize, usize, usize, u32, Vec<(u32, u32, u32)>);

fn summary(shape: &Shape) -> PathSummary {
    let (st, si, off, di, probes, labels) = shape;
    let dt = (st + off) % TORS;
    let mut s = PathSummary {
        source_gid: gid(*st, *si),
        target_gid: gid(dt, *di),
        source_tor_id: format!("tor{}", st + 1),
        target_tor_id: format!("tor{}", dt + 1),
        network_rtt_min_ns: 10_000,
        network_rtt_p50_ns: 10_000,
        ..Default::default()
    };
    if dt != *st && !labels.is_empty() {
        for &(label, lost, incomplete) in labels {
            s.flow_labels.push(FlowLabelStats {
                flow_label: label,
                probe_total: 4,
                probe_failed: lost.min(4),
                probe_invalid: incomplete.min(4 - lost.min(4)),
                network_rtt_p50_ns: 10_000,
                network_rtt_max_ns: 10_000,
            });
        }
        s.probe_total = s.flow_labels.iter().map(|l| l.probe_total).sum();
        s.probe_failed = s.flow_labels.iter().map(|l| l.probe_failed).sum();
        s.invalid_rtt_count = s.flow_labels.iter().map(|l| l.probe_invalid).sum();
    } else {
        s.probe_total = *probes;
    }
    s.probe_success = s.probe_total - s.probe_failed;
    s
}

/// Exposures of every link and cable, label by label and path by path.
fn reference(
    topo: &Topology,
    paths: &[PathSummary],
    rates: (f64, f64),
) -> HashMap<Component, Exposure> {
    let (bf, bi) = rates;
    let mut out: HashMap<Component, Exposure> = HashMap::new();
    let mut add = |c: Component, mu0: f64, exposure: f64, answered: f64| {
        let x = out.entry(c).or_default();
        x.mu0 += mu0;
        x.exposure += exposure;
        x.answered += answered;
    };
    for s in paths {
        let ts = topo.tor_index(&s.source_tor_id).unwrap();
        let td = topo.tor_index(&s.target_tor_id).unwrap();
        if ts == td {
            continue;
        }
        if s.flow_labels.is_empty() {
            let spines = topo.shared_spines(ts, td);
            let k = spines.len() as f64;
            let (n, a) = (s.probe_total as f64 / k, s.probe_success as f64 / k);
            for &sp in spines.iter() {
                for (link, rate, per) in [
                    ((ts, sp, LinkDir::Up), bf, 1.0),
                    ((td, sp, LinkDir::Down), bf, 1.0),
                    ((td, sp, LinkDir::Up), bi, 2.0),
                    ((ts, sp, LinkDir::Down), bi, 2.0),
                ] {
                    add(
                        Component::Link(link.0, link.1, link.2),
                        n * rate,
                        n * per,
                        a,
                    );
                    add(Component::Cable(link.0, link.1), n * rate, n * per, a / 2.0);
                }
            }
            continue;
        }
        for l in &s.flow_labels {
            let sf = topo
                .spine_of(ts, td, &s.source_gid, &s.target_gid, l.flow_label)
                .unwrap();
            let sr = topo
                .spine_of(td, ts, &s.target_gid, &s.source_gid, l.flow_label)
                .unwrap();
            let ln = l.probe_total as f64;
            let a = ln - l.probe_failed as f64 - l.probe_invalid as f64;
            let links = [
                (ts, sf, LinkDir::Up),
                (td, sf, LinkDir::Down),
                (td, sr, LinkDir::Up),
                (ts, sr, LinkDir::Down),
            ];
            let mut cables_answered = Vec::new();
            for (i, k) in links.into_iter().enumerate() {
                let (rate, per) = if i < 2 { (bf, 1.0) } else { (bi, 2.0) };
                add(Component::Link(k.0, k.1, k.2), ln * rate, per * ln, a);
                let cable = Component::Cable(k.0, k.1);
                let answered = if cables_answered.contains(&cable) {
                    0.0
                } else {
                    cables_answered.push(cable.clone());
                    a
                };
                add(cable, ln * rate, per * ln, answered);
            }
        }
    }
    out
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        0..TORS,
        0..RNICS,
        0..TORS,
        0..RNICS,
        1u32..100,
        prop::collection::vec((0u32..1_000_000, 0u32..3, 0u32..3), 0..12),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn per_spine_and_per_tor_sums_equal_label_by_label(
        shapes in prop::collection::vec(shape(), 1..40),
        partial in any::<bool>(),
    ) {
        let topo = topology(partial);
        let paths: Vec<PathSummary> = shapes.iter().map(summary).collect();
        let inv: HashMap<String, (String, String, String)> = (0..TORS)
            .flat_map(|t| (0..RNICS).map(move |i| (t, i)))
            .map(|(t, i)| (gid(t, i), (format!("h{t}-{i}"), "r0".into(), format!("tor{}", t + 1))))
            .collect();
        let window = WindowPath::intern(&paths);
        let placed = Placed::new(&window, &inv, Some(&topo));
        let base = Baseline::default();
        let mut comps = Components::default();
        let skip_paths = vec![false; paths.len()];
        let skip = Skip { paths: &skip_paths, links: &[] };
        let w = build(&placed, Some(&topo), &base, &mut comps, &skip, &vec![false; placed.hosts.names.len()]);
        let want = reference(&topo, &paths, (base.inter.failed_rate(), base.inter.invalid_rate()));
        for (c, x) in &want {
            let id = comps.get(c);
            prop_assert!(id.is_some(), "{c:?} has no id");
            let got = w.at(id.unwrap());
            prop_assert!(close(got.mu0, x.mu0), "{c:?} mu0 {} != {}", got.mu0, x.mu0);
            prop_assert!(close(got.exposure, x.exposure), "{c:?} exposure {} != {}", got.exposure, x.exposure);
            prop_assert!(close(got.answered, x.answered), "{c:?} answered {} != {}", got.answered, x.answered);
        }
        // Nothing else crossed a link.
        for (id, c) in comps.list.iter().enumerate() {
            if matches!(c, Component::Link(..) | Component::Cable(..)) && !want.contains_key(c) {
                let got = w.at(id as u32);
                prop_assert!(got.exposure == 0.0 && got.answered == 0.0, "{c:?}: {got:?}");
            }
        }
    }
}
