//! The link rules (pure): per-label tomography over the ToR-spine links with an ECMP
//! model, the ToR's uplink side without one.

use std::collections::{BTreeMap, BTreeSet};

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};

use rpingmesh_proto::controller_agent::FlowLabelStats;

use super::{
    median, ratio, Evidence, Rec, Window, DOWN_LOSS, EVIDENCE_LABELS, MANY_LINKS,
    MIN_LINK_FAILURES, MIN_SLOW_TUPLES, SLOW_LINK_SHARE,
};
use crate::localize::{Blame, ComponentKind, LocalizerParams, Symptom};
use crate::topology::{DirLink, LinkDir, Topology};

impl Window<'_> {
    /// Step 4 with an ECMP model: per-label tomography over the ToR-spine links.
    pub(super) fn link_step(&mut self, topo: &Topology) {
        let excess = self.params.latency_excess_ns;
        let mut tomo = Tomography::new(topo);
        let mut per_spine = PerSpine::default();
        // Label-less paths per ToR at either end: (probes, failed, answered).
        let mut spread: Vec<(f64, f64, f64)> = vec![(0.0, 0.0, 0.0); topo.tor_count()];
        for (ri, r) in self.recs.iter().enumerate() {
            let [st, dt] = r.tors;
            if r.explained || st == dt {
                continue;
            }
            let (Some(ts), Some(td)) = self.p.topo_tors_of(r) else {
                continue;
            };
            if !r.n.has_labels {
                // No per-label detail (a clean window, or an agent without it): its
                // probes spread evenly over the spines the two ToRs share. Most paths
                // are like this; they are summed per (ToR, direction) and spread over
                // the links once, at the end.
                if topo.uplinks(ts) == topo.uplinks(td) {
                    for t in [ts, td] {
                        let e = &mut spread[t as usize];
                        e.0 += r.n.probe_total as f64;
                        e.1 += r.n.probe_failed as f64;
                        e.2 += r.n.probe_success as f64;
                    }
                    continue;
                }
                let shared = topo.shared_spines(ts, td);
                let k = shared.len().max(1) as f64;
                for &s in shared.iter() {
                    for l in [
                        (ts, s, LinkDir::Up),
                        (td, s, LinkDir::Down),
                        (td, s, LinkDir::Up),
                        (ts, s, LinkDir::Down),
                    ] {
                        let a = tomo.acc(l);
                        a.total += r.n.probe_total as f64 / k;
                        a.failed += r.n.probe_failed as f64 / k;
                        a.answered += r.n.probe_success as f64 / k;
                    }
                }
                continue;
            }
            let Some(spines) = self.p.label_spines(r) else {
                continue;
            };
            let base = r.n.network_rtt_min_ns;
            let labeled = Labeled {
                rec: ri as u32,
                ts,
                td,
                spines,
                base,
            };
            // Summed per spine first (a path's labels share a few spines), then once
            // into each link: the counts are whole probes, so the order cannot matter.
            per_spine.reset(topo.spine_count());
            for (l, &[sf, sr]) in r.s.flow_labels.iter().zip(spines) {
                let t = LabelCounts::new(l, base, excess);
                per_spine.fwd[sf as usize].add(&t, 1.0);
                per_spine.rev[sr as usize].add(&t, 1.0);
                per_spine.touch(sf);
                per_spine.touch(sr);
            }
            for &x in &per_spine.touched {
                let (f, b) = (&per_spine.fwd[x as usize], &per_spine.rev[x as usize]);
                tomo.acc((ts, x, LinkDir::Up)).merge(f);
                tomo.acc((td, x, LinkDir::Down)).merge(f);
                tomo.acc((td, x, LinkDir::Up)).merge(b);
                tomo.acc((ts, x, LinkDir::Down)).merge(b);
            }
            tomo.labeled.push(labeled);
        }
        // A probe from ToR t goes up one of its links and its ACKs come down one; a probe
        // to t comes down one and its ACKs go up one: both directions carry the path.
        for (t, &(total, failed, answered)) in spread.iter().enumerate() {
            if total == 0.0 && failed == 0.0 && answered == 0.0 {
                continue;
            }
            let ups = topo.uplinks(t as u32);
            let k = ups.len().max(1) as f64;
            for &s in ups {
                for dir in [LinkDir::Up, LinkDir::Down] {
                    let a = tomo.acc((t as u32, s, dir));
                    a.total += total / k;
                    a.failed += failed / k;
                    a.answered += answered / k;
                }
            }
        }
        // Links the gray detector has already named explain their tuples: a link another
        // lossy link's probes also crossed must not pass the bar on those.
        for &link in self.known_links {
            tomo.take(link, &self.recs, excess, |_, _, _| {});
        }
        let mut found: BTreeMap<(u32, u32), LinkBlame> = BTreeMap::new();
        // Loss first: a dead link also has no RTT to speak of.
        for symptom in [Symptom::Loss, Symptom::Latency] {
            while let Some(link) = tomo.worst(symptom, self.params) {
                let lb = found
                    .entry((link.0, link.1))
                    .or_insert_with(|| LinkBlame::new(symptom));
                lb.dirs.insert(link.2);
                let acc = tomo.take(link, &self.recs, excess, |t, rec, label| {
                    let bad = match symptom {
                        Symptom::Latency => t.slow_answered > 0.0,
                        _ => t.failed > 0.0,
                    };
                    if bad {
                        lb.labels.insert(label);
                        lb.recs.insert(rec);
                        if t.slow_answered > 0.0 {
                            lb.excess.push(t.excess);
                        }
                    }
                });
                lb.total += acc.total;
                lb.failed += acc.failed;
                lb.answered += acc.answered;
                lb.slow_answered += acc.slow_answered;
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
        let mut sides: HashMap<u32, SideAcc> = HashMap::new();
        let mut tuples: Vec<SideTuple> = Vec::new();
        for (ri, r) in self.recs.iter().enumerate() {
            let [st, dt] = r.tors;
            if r.explained || st == dt {
                continue;
            }
            let slow_labels =
                r.s.flow_labels
                    .iter()
                    .filter(|l| {
                        l.probe_total > l.probe_failed
                            && l.network_rtt_p50_ns >= r.n.network_rtt_min_ns.saturating_add(excess)
                    })
                    .count();
            let slow = if r.s.flow_labels.is_empty() {
                r.n.probe_success > 0
                    && r.n.network_rtt_p50_ns >= r.n.network_rtt_min_ns.saturating_add(excess)
            } else {
                slow_labels * 5 >= r.s.flow_labels.len()
            };
            let answered = r.n.probe_success as f64;
            let t = SideTuple {
                tors: [st, dt],
                counts: LabelCounts {
                    total: r.n.probe_total as f64,
                    failed: r.n.probe_failed as f64,
                    answered,
                    slow_answered: if slow { answered } else { 0.0 },
                    excess: r
                        .n
                        .network_rtt_p99_ns
                        .saturating_sub(r.n.network_rtt_min_ns),
                },
                rec: ri as u32,
                removed: false,
            };
            let id = tuples.len() as u32;
            for tor in [st, dt] {
                let a = sides.entry(tor).or_default();
                a.acc.add(&t.counts, 1.0);
                a.tuples.push(id);
            }
            tuples.push(t);
        }
        for symptom in [Symptom::Loss, Symptom::Latency] {
            loop {
                let best = sides
                    .iter()
                    .filter_map(|(tor, a)| a.acc.score(symptom, self.params).map(|s| (s, *tor)))
                    .max_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
                let Some((_, tor)) = best else { break };
                let acc = sides.remove(&tor).expect("present");
                let mut lb = LinkBlame::new(symptom);
                lb.dirs.insert(LinkDir::Up);
                lb.dirs.insert(LinkDir::Down);
                lb.total = acc.acc.total;
                lb.failed = acc.acc.failed;
                lb.answered = acc.acc.answered;
                lb.slow_answered = acc.acc.slow_answered;
                for &ti in &acc.tuples {
                    let t = &mut tuples[ti as usize];
                    if t.removed {
                        continue;
                    }
                    t.removed = true;
                    if t.counts.failed > 0.0 || t.counts.slow_answered > 0.0 {
                        lb.recs.insert(t.rec);
                        if t.counts.slow_answered > 0.0 {
                            lb.excess.push(t.counts.excess);
                        }
                    }
                    let other = if t.tors[0] == tor {
                        t.tors[1]
                    } else {
                        t.tors[0]
                    };
                    if let Some(a) = sides.get_mut(&other) {
                        a.acc.add(&t.counts, -1.0);
                    }
                }
                let location = format!("{}/uplink", self.p.tors.names[tor as usize]);
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

/// What one (pair, label) (or, without an ECMP model, one path) counts for the links it
/// crosses.
struct LabelCounts {
    total: f64,
    failed: f64,
    answered: f64,
    /// Answered probes on a slow label.
    slow_answered: f64,
    excess: u64,
}

impl LabelCounts {
    /// A label of a path whose fastest probe took `base` ns: slow `excess` ns over it.
    fn new(l: &FlowLabelStats, base: u64, excess: u64) -> Self {
        let answered = l.probe_total.saturating_sub(l.probe_failed);
        let slow = answered > 0 && l.network_rtt_p50_ns >= base.saturating_add(excess);
        LabelCounts {
            total: l.probe_total as f64,
            failed: l.probe_failed as f64,
            answered: answered as f64,
            slow_answered: if slow { answered as f64 } else { 0.0 },
            excess: l.network_rtt_p50_ns.saturating_sub(base),
        }
    }
}

/// An inter-ToR path with per-label detail, routed: its labels' tuples are walked again
/// when a link they cross is taken.
struct Labeled<'a> {
    /// Index into the window's records.
    rec: u32,
    ts: u32,
    td: u32,
    /// Per label, the spines of its probe and of its ACKs.
    spines: &'a [[u32; 2]],
    /// Its fastest probe (ns), what a slow label is measured against.
    base: u64,
}

impl Labeled<'_> {
    /// The four directed links label `i`'s probe and ACKs cross: up and down of the
    /// probe, up and down of the ACKs (which take the probe's label, so usually another
    /// spine).
    fn links(&self, i: usize) -> [DirLink; 4] {
        let [sf, sr] = self.spines[i];
        [
            (self.ts, sf, LinkDir::Up),
            (self.td, sf, LinkDir::Down),
            (self.td, sr, LinkDir::Up),
            (self.ts, sr, LinkDir::Down),
        ]
    }
}

/// Per-label tomography over one window: every directed link's sums, dense by the
/// topology's link index, and the labeled paths. A (pair, label) tuple is not stored: a
/// window has millions, and only the few crossing a taken link are ever looked at again,
/// found by walking the labeled paths at that link's ToR.
struct Tomography<'t> {
    topo: &'t Topology,
    links: Vec<LinkAcc>,
    taken: Vec<bool>,
    labeled: Vec<Labeled<'t>>,
    /// Per topology ToR, the labeled paths at either end (built at the first take).
    by_tor: Vec<Vec<u32>>,
    /// Tuples already taken: (labeled path, label index).
    gone: HashSet<(u32, u32)>,
}

impl<'t> Tomography<'t> {
    fn new(topo: &'t Topology) -> Self {
        Tomography {
            topo,
            links: vec![LinkAcc::default(); topo.link_count()],
            taken: vec![false; topo.link_count()],
            labeled: Vec::new(),
            by_tor: Vec::new(),
            gone: HashSet::new(),
        }
    }

    fn acc(&mut self, link: DirLink) -> &mut LinkAcc {
        &mut self.links[self.topo.link_index(link)]
    }

    /// The link to blame next for `symptom`: the worst not taken yet that passes the bar
    /// (ties to the lowest link).
    fn worst(&self, symptom: Symptom, p: &LocalizerParams) -> Option<DirLink> {
        self.links
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.taken[*i])
            .filter_map(|(i, a)| a.score(symptom, p).map(|s| (s, self.topo.link_at(i))))
            .max_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)))
            .map(|(_, l)| l)
    }

    /// Takes `link` out: each tuple crossing it that no earlier take claimed goes to `f`
    /// (its counts, record and label) and leaves the sums of the other links it crossed.
    /// Returns the link's sums as they were.
    fn take(
        &mut self,
        link: DirLink,
        recs: &[Rec<'_>],
        excess: u64,
        mut f: impl FnMut(&LabelCounts, u32, u32),
    ) -> LinkAcc {
        let i = self.topo.link_index(link);
        if self.taken[i] {
            return LinkAcc::default();
        }
        self.taken[i] = true;
        if self.by_tor.is_empty() {
            self.by_tor = vec![Vec::new(); self.topo.tor_count()];
            for (e, l) in self.labeled.iter().enumerate() {
                self.by_tor[l.ts as usize].push(e as u32);
                self.by_tor[l.td as usize].push(e as u32);
            }
        }
        let Tomography {
            topo,
            links,
            taken,
            labeled,
            by_tor,
            gone,
        } = self;
        for &e in &by_tor[link.0 as usize] {
            let lab = &labeled[e as usize];
            for (li, l) in recs[lab.rec as usize].s.flow_labels.iter().enumerate() {
                let crossed = lab.links(li);
                if !crossed.contains(&link) || !gone.insert((e, li as u32)) {
                    continue;
                }
                let t = LabelCounts::new(l, lab.base, excess);
                f(&t, lab.rec, l.flow_label);
                for other in crossed {
                    let j = topo.link_index(other);
                    if !taken[j] {
                        links[j].add(&t, -1.0);
                    }
                }
            }
        }
        links[i].clone()
    }
}

/// One path's labels summed per spine: the probes' way and the ACKs' way.
#[derive(Default)]
struct PerSpine {
    fwd: Vec<LinkAcc>,
    rev: Vec<LinkAcc>,
    touched: Vec<u32>,
}

impl PerSpine {
    fn reset(&mut self, spines: usize) {
        if self.fwd.len() != spines {
            self.fwd = vec![LinkAcc::default(); spines];
            self.rev = vec![LinkAcc::default(); spines];
        }
        for &x in &self.touched {
            self.fwd[x as usize] = LinkAcc::default();
            self.rev[x as usize] = LinkAcc::default();
        }
        self.touched.clear();
    }

    fn touch(&mut self, x: u32) {
        if !self.touched.contains(&x) {
            self.touched.push(x);
        }
    }
}

/// Without an ECMP model: one path between two ToR sides.
struct SideTuple {
    tors: [u32; 2],
    counts: LabelCounts,
    rec: u32,
    removed: bool,
}

#[derive(Default)]
struct SideAcc {
    acc: LinkAcc,
    tuples: Vec<u32>,
}

#[derive(Default, Clone)]
struct LinkAcc {
    total: f64,
    failed: f64,
    answered: f64,
    slow_answered: f64,
    slow_tuples: f64,
}

impl LinkAcc {
    fn merge(&mut self, o: &LinkAcc) {
        self.total += o.total;
        self.failed += o.failed;
        self.answered += o.answered;
        self.slow_answered += o.slow_answered;
        self.slow_tuples += o.slow_tuples;
    }

    fn add(&mut self, t: &LabelCounts, sign: f64) {
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
