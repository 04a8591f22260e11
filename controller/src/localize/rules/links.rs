//! The link rules (pure): per-label tomography over the ToR-spine links with an ECMP
//! model, the ToR's uplink side without one.

use std::collections::{BTreeMap, BTreeSet};

use foldhash::{HashMap, HashMapExt};

use super::{
    median, ratio, Evidence, Rec, Window, DOWN_LOSS, EVIDENCE_LABELS, MANY_LINKS,
    MIN_LINK_FAILURES, MIN_SLOW_TUPLES, SLOW_LINK_SHARE,
};
use crate::localize::{Blame, ComponentKind, LocalizerParams, Symptom};
use crate::topology::{DirLink, LinkDir, Topology};

impl Window<'_> {
    /// Step 4 with an ECMP model: per-label tomography over the ToR-spine links.
    pub(super) fn link_step(&mut self, topo: &Topology) {
        let mut tor_index: HashMap<u32, Option<u32>> = HashMap::new();
        let mut links: HashMap<DirLink, LinkAcc> = HashMap::new();
        let mut tuples: Vec<Tuple> = Vec::new();
        let excess = self.params.latency_excess_ns;
        // Label-less paths per ToR at either end: (probes, failed, answered).
        let mut spread: HashMap<u32, (f64, f64, f64)> = HashMap::new();
        for (ri, r) in self.recs.iter().enumerate() {
            let (st, dt) = (self.tor_of(r.src), self.tor_of(r.dst));
            if r.explained || st == dt {
                continue;
            }
            let mut topo_tor = |t: u32| {
                *tor_index
                    .entry(t)
                    .or_insert_with(|| topo.tor_index(&self.tors.names[t as usize]))
            };
            let (Some(ts), Some(td)) = (topo_tor(st), topo_tor(dt)) else {
                continue;
            };
            let (sg, dg) = (
                self.rnics[r.src as usize].gid,
                self.rnics[r.dst as usize].gid,
            );
            if r.s.flow_labels.is_empty() {
                // No per-label detail (a clean window, or an agent without it): its
                // probes spread evenly over the spines the two ToRs share. Most paths
                // are like this; they are summed per (ToR, direction) and spread over
                // the links once, at the end.
                if topo.uplinks(ts) == topo.uplinks(td) {
                    for t in [ts, td] {
                        let e = spread.entry(t).or_default();
                        e.0 += r.s.probe_total as f64;
                        e.1 += r.s.probe_failed as f64;
                        e.2 += r.s.probe_success as f64;
                    }
                    continue;
                }
                let shared: Vec<u32> = topo
                    .uplinks(ts)
                    .iter()
                    .copied()
                    .filter(|s| topo.uplinks(td).contains(s))
                    .collect();
                let k = shared.len().max(1) as f64;
                for s in shared {
                    for l in round_trip(
                        [(ts, s, LinkDir::Up), (td, s, LinkDir::Down)],
                        [(td, s, LinkDir::Up), (ts, s, LinkDir::Down)],
                    ) {
                        let a = links.entry(l).or_default();
                        a.total += r.s.probe_total as f64 / k;
                        a.failed += r.s.probe_failed as f64 / k;
                        a.answered += r.s.probe_success as f64 / k;
                    }
                }
                continue;
            }
            let base = r.s.network_rtt_min_ns;
            for l in &r.s.flow_labels {
                let (Some(fwd), Some(rev)) = (
                    topo.route(ts, td, sg, dg, l.flow_label),
                    topo.route(td, ts, dg, sg, l.flow_label),
                ) else {
                    continue;
                };
                let answered = l.probe_total.saturating_sub(l.probe_failed);
                let slow = answered > 0 && l.network_rtt_p50_ns >= base.saturating_add(excess);
                let t = Tuple {
                    links: round_trip(fwd, rev),
                    total: l.probe_total as f64,
                    failed: l.probe_failed as f64,
                    answered: answered as f64,
                    slow_answered: if slow { answered as f64 } else { 0.0 },
                    excess: l.network_rtt_p50_ns.saturating_sub(base),
                    rec: ri as u32,
                    label: l.flow_label,
                    removed: false,
                };
                let id = tuples.len() as u32;
                for link in t.links {
                    let a = links.entry(link).or_default();
                    a.add(&t, 1.0);
                    a.tuples.push(id);
                }
                tuples.push(t);
            }
        }
        // A probe from ToR t goes up one of its links and its ACKs come down one; a probe
        // to t comes down one and its ACKs go up one: both directions carry the path.
        for (&t, &(total, failed, answered)) in &spread {
            let ups = topo.uplinks(t);
            let k = ups.len().max(1) as f64;
            for &s in ups {
                for dir in [LinkDir::Up, LinkDir::Down] {
                    let a = links.entry((t, s, dir)).or_default();
                    a.total += total / k;
                    a.failed += failed / k;
                    a.answered += answered / k;
                }
            }
        }
        // Links the gray detector has already named explain their tuples: a link another
        // lossy link's probes also crossed must not pass the bar on those.
        for link in self.known_links {
            let Some(acc) = links.remove(link) else {
                continue;
            };
            for &ti in &acc.tuples {
                let t = &mut tuples[ti as usize];
                if !t.removed {
                    t.removed = true;
                    for other in t.links {
                        if let Some(a) = links.get_mut(&other) {
                            a.add(t, -1.0);
                        }
                    }
                }
            }
        }
        let mut found: BTreeMap<(u32, u32), LinkBlame> = BTreeMap::new();
        // Loss first: a dead link also has no RTT to speak of.
        for symptom in [Symptom::Loss, Symptom::Latency] {
            loop {
                let best = links
                    .iter()
                    .filter_map(|(l, a)| a.score(symptom, self.params).map(|s| (s, *l)))
                    .max_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
                let Some((_, link)) = best else { break };
                let acc = links.remove(&link).expect("present");
                let lb = found
                    .entry((link.0, link.1))
                    .or_insert_with(|| LinkBlame::new(symptom));
                lb.dirs.insert(link.2);
                lb.total += acc.total;
                lb.failed += acc.failed;
                lb.answered += acc.answered;
                lb.slow_answered += acc.slow_answered;
                for &ti in &acc.tuples {
                    let t = &mut tuples[ti as usize];
                    if t.removed {
                        continue;
                    }
                    t.removed = true;
                    let bad = match symptom {
                        Symptom::Latency => t.slow_answered > 0.0,
                        _ => t.failed > 0.0,
                    };
                    if bad {
                        lb.labels.insert(t.label);
                        lb.recs.insert(t.rec);
                        if t.slow_answered > 0.0 {
                            lb.excess.push(t.excess);
                        }
                    }
                    for other in t.links {
                        if let Some(a) = links.get_mut(&other) {
                            a.add(t, -1.0);
                        }
                    }
                }
            }
        }
        // Many uplinks of one ToR at once point below the links: an RNIC, host or the
        // ToR itself, seen in a window that only grazed the fault (a second of it), too
        // little for their own rules. One broken link is one link.
        let mut per_tor: BTreeMap<u32, usize> = BTreeMap::new();
        for &(tor, _) in found.keys() {
            *per_tor.entry(tor).or_default() += 1;
        }
        for ((tor, spine), lb) in found {
            let uplinks = topo.uplinks(tor).len();
            let n = per_tor[&tor];
            if n >= MANY_LINKS && 2 * n >= uplinks {
                continue;
            }
            let location = topo.link_name(tor, spine);
            self.blamed_links
                .extend(lb.dirs.iter().map(|&d| (tor, spine, d)));
            let blame = lb.into_blame(location, &self.recs, self.params);
            self.blames.push(blame);
        }
    }

    /// Step 4 without an ECMP model: the ToR whose remote paths (both ways) fail or slow
    /// is named by its uplink side, `<tor>/uplink`. Round trips cannot tell the two
    /// directions apart.
    pub(super) fn tor_side_step(&mut self) {
        let excess = self.params.latency_excess_ns;
        let mut sides: HashMap<u32, LinkAcc> = HashMap::new();
        let mut tuples: Vec<Tuple> = Vec::new();
        for (ri, r) in self.recs.iter().enumerate() {
            let (st, dt) = (self.tor_of(r.src), self.tor_of(r.dst));
            if r.explained || st == dt {
                continue;
            }
            let slow_labels =
                r.s.flow_labels
                    .iter()
                    .filter(|l| {
                        l.probe_total > l.probe_failed
                            && l.network_rtt_p50_ns >= r.s.network_rtt_min_ns.saturating_add(excess)
                    })
                    .count();
            let slow = if r.s.flow_labels.is_empty() {
                r.s.probe_success > 0
                    && r.s.network_rtt_p50_ns >= r.s.network_rtt_min_ns.saturating_add(excess)
            } else {
                slow_labels * 5 >= r.s.flow_labels.len()
            };
            let answered = r.s.probe_success as f64;
            let t = Tuple {
                links: [
                    (st, 0, LinkDir::Up),
                    (dt, 0, LinkDir::Up),
                    (st, 0, LinkDir::Up),
                    (dt, 0, LinkDir::Up),
                ],
                total: r.s.probe_total as f64,
                failed: r.s.probe_failed as f64,
                answered,
                slow_answered: if slow { answered } else { 0.0 },
                excess: r
                    .s
                    .network_rtt_p99_ns
                    .saturating_sub(r.s.network_rtt_min_ns),
                rec: ri as u32,
                label: 0,
                removed: false,
            };
            let id = tuples.len() as u32;
            for tor in [st, dt] {
                let a = sides.entry(tor).or_default();
                a.add(&t, 1.0);
                a.tuples.push(id);
            }
            tuples.push(t);
        }
        for symptom in [Symptom::Loss, Symptom::Latency] {
            loop {
                let best = sides
                    .iter()
                    .filter_map(|(tor, a)| a.score(symptom, self.params).map(|s| (s, *tor)))
                    .max_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
                let Some((_, tor)) = best else { break };
                let acc = sides.remove(&tor).expect("present");
                let mut lb = LinkBlame::new(symptom);
                lb.dirs.insert(LinkDir::Up);
                lb.dirs.insert(LinkDir::Down);
                lb.total = acc.total;
                lb.failed = acc.failed;
                lb.answered = acc.answered;
                lb.slow_answered = acc.slow_answered;
                for &ti in &acc.tuples {
                    let t = &mut tuples[ti as usize];
                    if t.removed {
                        continue;
                    }
                    t.removed = true;
                    if t.failed > 0.0 || t.slow_answered > 0.0 {
                        lb.recs.insert(t.rec);
                        if t.slow_answered > 0.0 {
                            lb.excess.push(t.excess);
                        }
                    }
                    let other = if t.links[0].0 == tor {
                        t.links[1].0
                    } else {
                        t.links[0].0
                    };
                    if let Some(a) = sides.get_mut(&other) {
                        a.add(t, -1.0);
                    }
                }
                let location = format!("{}/uplink", self.tors.names[tor as usize]);
                for &ri in &lb.recs {
                    self.recs[ri as usize].blamed = true;
                }
                let mut blame = lb.into_blame(location, &self.recs, self.params);
                // The side, not the link: half as sure.
                blame.confidence *= 0.5;
                self.blames.push(blame);
            }
        }
    }
}

/// The four directed links a probe and its ACKs cross: up and down of the probe, up and
/// down of the ACKs (which take the probe's label, so usually another spine).
fn round_trip(fwd: [DirLink; 2], rev: [DirLink; 2]) -> [DirLink; 4] {
    [fwd[0], fwd[1], rev[0], rev[1]]
}

/// One (pair, label) of a window, crossing four directed links.
struct Tuple {
    links: [DirLink; 4],
    total: f64,
    failed: f64,
    answered: f64,
    /// Answered probes on a slow label.
    slow_answered: f64,
    excess: u64,
    rec: u32,
    label: u32,
    removed: bool,
}

#[derive(Default)]
struct LinkAcc {
    total: f64,
    failed: f64,
    answered: f64,
    slow_answered: f64,
    slow_tuples: f64,
    tuples: Vec<u32>,
}

impl LinkAcc {
    fn add(&mut self, t: &Tuple, sign: f64) {
        self.total += sign * t.total;
        self.failed += sign * t.failed;
        self.answered += sign * t.answered;
        self.slow_answered += sign * t.slow_answered;
        if t.slow_answered > 0.0 {
            self.slow_tuples += sign;
        }
    }

    /// How bad the link looks for `symptom`, when it is bad enough to blame.
    fn score(&self, symptom: Symptom, p: &LocalizerParams) -> Option<f64> {
        match symptom {
            Symptom::Latency => {
                let share = ratio(self.slow_answered, self.answered);
                (self.answered >= p.min_link_probes as f64 / 2.0
                    && self.slow_tuples >= MIN_SLOW_TUPLES - 1e-9
                    && share >= SLOW_LINK_SHARE)
                    .then_some(share)
            }
            _ => {
                let loss = ratio(self.failed, self.total);
                // Ranked by the failures it explains (its votes), the rate breaking ties:
                // by rate, a link a few of the lossy link's probes also crossed could win
                // on a small count.
                (self.total >= p.min_link_probes as f64
                    && self.failed >= MIN_LINK_FAILURES - 1e-9
                    && loss > p.loss_ratio)
                    .then_some(self.failed + loss)
            }
        }
    }
}

struct LinkBlame {
    symptom: Symptom,
    dirs: BTreeSet<LinkDir>,
    total: f64,
    failed: f64,
    answered: f64,
    slow_answered: f64,
    labels: BTreeSet<u32>,
    recs: BTreeSet<u32>,
    excess: Vec<u64>,
}

impl LinkBlame {
    fn new(symptom: Symptom) -> Self {
        LinkBlame {
            symptom,
            dirs: BTreeSet::new(),
            total: 0.0,
            failed: 0.0,
            answered: 0.0,
            slow_answered: 0.0,
            labels: BTreeSet::new(),
            recs: BTreeSet::new(),
            excess: Vec::new(),
        }
    }

    fn into_blame(mut self, location: String, recs: &[Rec<'_>], p: &LocalizerParams) -> Blame {
        let direction = match (
            self.dirs.contains(&LinkDir::Up),
            self.dirs.contains(&LinkDir::Down),
        ) {
            (true, true) => "both",
            (true, false) => "up",
            _ => "down",
        };
        let loss = ratio(self.failed, self.total);
        let mut ev = Evidence::default();
        for &ri in &self.recs {
            ev.add(recs[ri as usize].s);
        }
        let mut e = ev.finish();
        e.probe_total = self.total.round() as u64;
        e.probe_failed = self.failed.round() as u64;
        e.flow_labels = self.labels.iter().copied().take(EVIDENCE_LABELS).collect();
        e.direction = direction.to_string();
        e.excess_ns = median(&mut self.excess);
        let (symptom, confidence) = match self.symptom {
            Symptom::Latency => {
                e.detail = format!(
                    "{:.0}% of probes across it slow by a median {} us ({} labels, {} paths)",
                    100.0 * ratio(self.slow_answered, self.answered),
                    e.excess_ns / 1000,
                    self.labels.len(),
                    self.recs.len()
                );
                let n = self.labels.len() as f64;
                (Symptom::Latency, n / (n + MIN_SLOW_TUPLES))
            }
            _ => {
                e.detail = format!(
                    "loss {:.1}% across it ({} of {} probes; {} labels, {} paths)",
                    100.0 * loss,
                    e.probe_failed,
                    e.probe_total,
                    self.labels.len(),
                    self.recs.len()
                );
                let symptom = if loss >= DOWN_LOSS {
                    Symptom::Down
                } else {
                    Symptom::Loss
                };
                // Evidence strength: lost probes explained, against the floor to blame,
                // and how far the loss is over the SLA.
                let strength = self.failed / (self.failed + MIN_LINK_FAILURES);
                let margin = (loss / (loss + p.loss_ratio)).min(1.0);
                (symptom, strength * margin)
            }
        };
        Blame {
            kind: ComponentKind::Link,
            location,
            symptom,
            confidence: confidence.clamp(0.0, 1.0),
            evidence: e,
        }
    }
}
