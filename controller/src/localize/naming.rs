//! The gray detector's blames as findings' blames (pure): where (the name operators use),
//! which symptom, how sure, and the evidence: the loss or delay it adds, the paths and
//! labels behind it. A link's two directions are one finding.

use std::collections::BTreeMap;

use rpingmesh_proto::operator::{FindingEvidence, FindingPath};

use super::evidence::Component;
use super::gray::GrayBlame;
use super::placed::{Placed, WindowPath};
use super::stats::confidence;
use super::tally::Test;
use super::{Blame, ComponentKind, Symptom};
use crate::topology::{LinkDir, Topology};

/// Paths kept as evidence on a finding.
const EVIDENCE_PATHS: usize = 8;
/// Flow labels kept as evidence.
const EVIDENCE_LABELS: usize = 16;
/// Above this drop probability a component is down rather than lossy.
const DOWN_LOSS: f64 = 0.9;

/// The finding's kind and location of a component.
fn place(c: &Component, p: &Placed, topo: Option<&Topology>) -> (ComponentKind, String) {
    match c {
        Component::Rnic(gid) => {
            let name = p
                .rnics
                .iter()
                .find(|r| r.gid == gid)
                .map_or_else(|| gid.clone(), |r| r.name.clone());
            (ComponentKind::Rnic, name)
        }
        Component::Host(h) => (ComponentKind::Host, h.clone()),
        Component::Tor(t) => (ComponentKind::Tor, t.clone()),
        Component::Link(t, s, _) | Component::Cable(t, s) => (
            ComponentKind::Link,
            topo.map_or_else(|| format!("{t}-{s}"), |tp| tp.link_name(*t, *s)),
        ),
        Component::TorSide(t) => (ComponentKind::Link, format!("{t}/uplink")),
    }
}

fn directions(c: &Component) -> Vec<LinkDir> {
    match c {
        Component::Link(_, _, d) => vec![*d],
        Component::Cable(..) => vec![LinkDir::Up, LinkDir::Down],
        _ => Vec::new(),
    }
}

/// Events per probe when each of a probe's three packets (the probe, two ACKs) is dropped
/// with `p`: lost (the probe, or both ACKs) or incomplete (one ACK).
fn events_per_probe(p: f64) -> f64 {
    let lost = 1.0 - (1.0 - p) * (1.0 - p * p);
    lost + 2.0 * p * (1.0 - p) * (1.0 - p)
}

/// The drop probability per packet behind a detector's linear estimate (events per probe
/// / 3, exact for small losses; a component that drops everything reads 1/3 on it).
fn per_packet(linear: f64) -> f64 {
    let r = (3.0 * linear).clamp(0.0, 1.0);
    let (mut lo, mut hi) = (0.0, 1.0);
    for _ in 0..50 {
        let mid = 0.5 * (lo + hi);
        if events_per_probe(mid) < r {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// Turns one window's gray blames into blames, merging a link's directions.
pub fn blames(
    gray: Vec<GrayBlame>,
    p: &Placed,
    paths: &[WindowPath<'_>],
    topo: Option<&Topology>,
    open_score: f64,
) -> Vec<Blame> {
    let mut by_place: BTreeMap<(ComponentKind, String, u8), Vec<GrayBlame>> = BTreeMap::new();
    for g in gray {
        let (kind, location) = place(&g.component, p, topo);
        // A link's loss and its latency are one finding (the loss decides the symptom).
        by_place.entry((kind, location, 0)).or_default().push(g);
    }
    by_place
        .into_iter()
        .map(|((kind, location, _), gs)| one(kind, location, gs, paths, open_score))
        .collect()
}

fn one(
    kind: ComponentKind,
    location: String,
    mut gs: Vec<GrayBlame>,
    paths: &[WindowPath<'_>],
    open_score: f64,
) -> Blame {
    // Loss before latency: a lossy link is a lossy link first.
    gs.sort_by_key(|g| g.test);
    let lead = &gs[0];
    let mut e = FindingEvidence {
        windows: 1,
        score: gs.iter().map(|g| g.score).fold(0.0, f64::max),
        ..Default::default()
    };
    let dirs: Vec<LinkDir> = gs.iter().flat_map(|g| directions(&g.component)).collect();
    e.direction = match (dirs.contains(&LinkDir::Up), dirs.contains(&LinkDir::Down)) {
        (true, true) => "both",
        (true, false) => "up",
        (false, true) => "down",
        _ => "",
    }
    .to_string();
    // The paths and labels behind it, worst first.
    let mut seen: BTreeMap<u32, ()> = BTreeMap::new();
    let mut labels: BTreeMap<u32, ()> = BTreeMap::new();
    for g in gs.iter() {
        for &(path, label) in &g.units {
            seen.insert(path, ());
            if kind == ComponentKind::Link {
                labels.insert(label, ());
            }
        }
        e.probe_total += g.probes.round() as u64;
        e.probe_failed += g.events.round() as u64;
    }
    let mut fp: Vec<FindingPath> = seen
        .keys()
        .map(|&i| {
            let s = paths[i as usize].summary;
            FindingPath {
                source_gid: s.source_gid.clone(),
                target_gid: s.target_gid.clone(),
                probe_total: s.probe_total,
                probe_failed: s.probe_failed,
                network_rtt_p50_ns: s.network_rtt_p50_ns,
            }
        })
        .collect();
    e.paths_total = fp.len() as u32;
    fp.sort_by(|a, b| {
        (b.probe_failed as u64 * a.probe_total.max(1) as u64)
            .cmp(&(a.probe_failed as u64 * b.probe_total.max(1) as u64))
            .then(b.network_rtt_p50_ns.cmp(&a.network_rtt_p50_ns))
            .then((&a.source_gid, &a.target_gid).cmp(&(&b.source_gid, &b.target_gid)))
    });
    fp.truncate(EVIDENCE_PATHS);
    e.paths = fp;
    e.flow_labels = labels.keys().copied().take(EVIDENCE_LABELS).collect();
    let symptom = match lead.test {
        Test::Loss => {
            let (linear, se) = gs
                .iter()
                .filter(|g| g.test == Test::Loss)
                .map(|g| g.loss)
                .fold((0.0, 0.0), |a, b| if b.0 > a.0 { b } else { a });
            let x = per_packet(linear);
            e.loss_ratio = x;
            // The same standard error through the curve's slope there.
            e.loss_ratio_stderr = se * (per_packet(linear + 1e-6) - x) / 1e-6;
            let se = e.loss_ratio_stderr;
            e.detail = format!(
                "loss {:.2}% +- {:.2} per packet crossing it, not explained by the fleet's baseline ({:.0} nats; {} events over {} probes this window, {} paths)",
                100.0 * x,
                100.0 * se,
                e.score,
                e.probe_failed,
                e.probe_total,
                e.paths_total
            );
            if x >= DOWN_LOSS {
                Symptom::Down
            } else {
                Symptom::Loss
            }
        }
        Test::Latency => {
            e.excess_ns = lead.excess_ns;
            e.detail = format!(
                "+{:.1} us (median) on the probes crossing it, not explained by the fleet's baseline ({:.0} nats; {} slow probes on {} labels, {} paths this window)",
                lead.excess_ns as f64 / 1000.0,
                e.score,
                lead.events as u64,
                e.flow_labels.len(),
                e.paths_total
            );
            Symptom::Latency
        }
        Test::Stall => {
            e.excess_ns = lead.excess_ns;
            e.probe_total = lead.probes as u64;
            e.probe_failed = 0;
            e.detail = format!(
                "endpoint delay +{:.0} us over the fleet's on {} of its {} path ends ({:.0} nats); network RTT normal",
                lead.excess_ns as f64 / 1000.0,
                lead.events as u64,
                lead.probes as u64,
                e.score
            );
            Symptom::Stall
        }
    };
    Blame {
        kind,
        location,
        symptom,
        confidence: confidence(e.score, open_score),
        evidence: e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_losses_read_as_they_are_and_everything_lost_is_down() {
        assert!(
            (per_packet(0.01) - 0.01).abs() < 0.0005,
            "{}",
            per_packet(0.01)
        );
        assert!(per_packet(1.0 / 3.0) > 0.99);
        assert!(per_packet(0.2) > 0.2 && per_packet(0.2) < 0.9);
        assert!(per_packet(0.0) < 1e-12);
    }
}
