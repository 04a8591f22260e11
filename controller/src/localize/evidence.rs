//! One window's evidence for the gray detector (pure): for every component a fault could
//! sit on, what the fleet's baseline expects of the probes crossing it (its exposure),
//! and the probe units that lost, came back incomplete or were slow (its events).
//!
//! A unit is one (path, flow label) of an inter-ToR path with per-label detail, else one
//! path. Which components a unit crosses:
//! - its two RNICs and their ToRs (all three packets of a probe cross them);
//! - with an ECMP model, per label: the probe's two directed ToR-spine links (a drop
//!   there loses the probe: `failed`) and the ACKs' two (a drop there loses one of the
//!   two ACKs: `invalid`, twice as likely as a lost probe for the same drop rate);
//! - without one, the ToR sides (`<tor>/uplink`) of its two ToRs.
//!
//! Exposure is in packets a fault would drop (a loss of x per packet crossing makes
//! `x * exposure` more events), so every kind of component is tested on one scale.

use foldhash::HashMap;

use rpingmesh_proto::controller_agent::PathSummary;
use rpingmesh_protocol::aggregate::SLOW_LABEL_EXCESS_NS;

use super::baseline::{Baseline, LossBaseline};
use super::placed::{PathNumbers, Placed};
use crate::topology::{DirLink, LinkDir, Topology};

/// What a fault can sit on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Component {
    /// By GID.
    Rnic(String),
    Host(String),
    Tor(String),
    /// A directed ToR-spine link, by topology indices.
    Link(u32, u32, LinkDir),
    /// A ToR-spine link both ways (a bad cable or optic often is), by topology indices.
    Cable(u32, u32),
    /// Without an ECMP model: a ToR's uplink side, by ToR name.
    TorSide(String),
}

impl Component {
    /// Links and ToR sides are the only places a delay (not a loss) is looked for.
    pub fn carries_latency(&self) -> bool {
        matches!(
            self,
            Component::Link(..) | Component::Cable(..) | Component::TorSide(_)
        )
    }
}

/// Components by id, stable across windows.
#[derive(Default)]
pub struct Components {
    ids: HashMap<Component, u32>,
    pub list: Vec<Component>,
    /// Ids of directed links and cables by the topology's dense indices (`NONE` until
    /// first seen): a window looks links up per label, millions of times.
    link_ids: Vec<u32>,
    cable_ids: Vec<u32>,
    /// Per topology ToR: every link and cable of its uplinks has an id.
    tor_complete: Vec<bool>,
}

const NONE: u32 = u32::MAX;

impl Components {
    /// Sizes the dense tables to the topology (once: a localizer's topology is fixed).
    fn size_for(&mut self, topo: &Topology) {
        if self.link_ids.len() != topo.link_count() {
            self.link_ids = vec![NONE; topo.link_count()];
            self.cable_ids = vec![NONE; topo.cable_count()];
            self.tor_complete = vec![false; topo.tor_count()];
        }
    }

    /// The id of a directed link.
    fn link(&mut self, topo: &Topology, l: DirLink) -> u32 {
        self.size_for(topo);
        let i = topo.link_index(l);
        if self.link_ids[i] == NONE {
            self.link_ids[i] = self.id(Component::Link(l.0, l.1, l.2));
        }
        self.link_ids[i]
    }

    /// The id of a ToR-spine link both ways.
    fn cable(&mut self, topo: &Topology, tor: u32, spine: u32) -> u32 {
        self.size_for(topo);
        let i = topo.cable_index(tor, spine);
        if self.cable_ids[i] == NONE {
            self.cable_ids[i] = self.id(Component::Cable(tor, spine));
        }
        self.cable_ids[i]
    }

    /// Whether ToR `t`'s links and cables all have ids.
    fn complete(&mut self, topo: &Topology, t: u32) -> bool {
        self.size_for(topo);
        if self.tor_complete[t as usize] {
            return true;
        }
        let done = topo.uplinks(t).iter().all(|&s| {
            self.cable_ids[topo.cable_index(t, s)] != NONE
                && [LinkDir::Up, LinkDir::Down]
                    .iter()
                    .all(|&d| self.link_ids[topo.link_index((t, s, d))] != NONE)
        });
        self.tor_complete[t as usize] = done;
        done
    }

    pub fn id(&mut self, c: Component) -> u32 {
        if let Some(&i) = self.ids.get(&c) {
            return i;
        }
        let i = self.list.len() as u32;
        self.ids.insert(c.clone(), i);
        self.list.push(c);
        i
    }

    pub fn get(&self, c: &Component) -> Option<u32> {
        self.ids.get(c).copied()
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }
}

/// A unit with something to say: events (lost or incomplete probes) or slow probes.
#[derive(Debug, Clone)]
pub struct Unit {
    /// (component, its events) for loss: what this unit's loss says about each.
    pub loss: Vec<(u32, f64)>,
    /// Components whose delay this unit's RTT includes.
    pub latency: Vec<u32>,
    /// Answered probes on a slow label, and by how much (ns) it was slow.
    pub slow: f64,
    pub excess_ns: u64,
    /// The path (index into the window's path list) and label, for the evidence.
    pub path: u32,
    pub label: u32,
    /// Local or inter-ToR, and its counts, to leave it out of what the baseline learns.
    pub inter: bool,
    pub probes: f64,
    pub failed: f64,
    pub invalid: f64,
    pub answered: f64,
    /// Whether its answered and slow probes are in the window's label totals.
    pub in_label_totals: bool,
    /// The component it was put down to (sticky: a finding's evidence stays its own).
    pub owner: Option<u32>,
}

/// What one window expects of a component, as the baseline sees it.
#[derive(Debug, Default, Clone, Copy)]
pub struct Exposure {
    /// Background events expected.
    pub mu0: f64,
    /// Packets a fault there would drop, per unit of drop probability.
    pub exposure: f64,
    /// Answered probes whose RTT includes it (latency trials).
    pub answered: f64,
}

/// One window's exposures (dense, by component id) and units.
pub struct WindowEvidence {
    /// By component id; one entry per component (the window touches them at random,
    /// so what it adds to one sits in one cache line).
    pub exposures: Vec<Exposure>,
    pub units: Vec<Unit>,
    /// Window totals per class (local, inter): probes, failed, invalid; and answered /
    /// slow inter-ToR probes with label detail (what the baseline learns from).
    pub totals: [(f64, f64, f64); 2],
    pub label_answered: f64,
    pub label_slow: f64,
}

impl WindowEvidence {
    fn new(n: usize) -> Self {
        WindowEvidence {
            exposures: vec![Exposure::default(); n],
            units: Vec::new(),
            totals: [(0.0, 0.0, 0.0); 2],
            label_answered: 0.0,
            label_slow: 0.0,
        }
    }

    /// Component `c`'s exposure in this window (none for one made after it).
    pub fn at(&self, c: u32) -> Exposure {
        self.exposures.get(c as usize).copied().unwrap_or_default()
    }

    fn grow(&mut self, n: usize) {
        if self.exposures.len() < n {
            self.exposures.resize(n, Exposure::default());
        }
    }

    fn expose(&mut self, c: u32, mu0: f64, exposure: f64) {
        let x = &mut self.exposures[c as usize];
        x.mu0 += mu0;
        x.exposure += exposure;
    }

    fn answer(&mut self, c: u32, answered: f64) {
        self.exposures[c as usize].answered += answered;
    }
}

/// What is left out of the window: paths (by index into the window's list) and links
/// already explained by a rule's finding or a stalled host.
pub struct Skip<'a> {
    pub paths: &'a [bool],
    pub links: &'a [DirLink],
}

/// Builds the window's evidence. `comps` grows with new components; `skip_host[h]` leaves
/// out every path of host `h` (stalled or suspected of it: its timeouts are its own).
pub fn build(
    p: &Placed,
    topo: Option<&Topology>,
    base: &Baseline,
    comps: &mut Components,
    skip: &Skip<'_>,
    skip_host: &[bool],
) -> WindowEvidence {
    let ecmp = topo.filter(|t| t.ecmp().is_some());
    // Component ids of the window's RNICs and ToRs.
    let rnic_ids: Vec<u32> = p
        .rnics
        .iter()
        .map(|r| comps.id(Component::Rnic(r.gid.to_string())))
        .collect();
    let tor_ids: Vec<u32> = p
        .tors
        .names
        .iter()
        .map(|t| comps.id(Component::Tor(t.clone())))
        .collect();
    let side_ids: Vec<u32> = if ecmp.is_none() {
        p.tors
            .names
            .iter()
            .map(|t| comps.id(Component::TorSide(t.clone())))
            .collect()
    } else {
        Vec::new()
    };
    let mut w = WindowEvidence::new(comps.len());
    // Clean inter-ToR paths between ToRs of the same uplinks, per topology ToR as
    // (source, destination): (probes, answered). Their probes spread evenly over the
    // spines, so they are spread once per ToR at the end, not per path and spine.
    let mut spread: Vec<[(f64, f64); 2]> = Vec::new();
    let mut sums = SpineSums::default();
    for r in &p.paths {
        let s = &r.n;
        if skip.paths[r.index as usize]
            || skip_host[r.hosts[0] as usize]
            || skip_host[r.hosts[1] as usize]
        {
            continue;
        }
        let [st, dt] = r.tors;
        let inter = st != dt;
        let lb: &LossBaseline = if inter { &base.inter } else { &base.local };
        let (bf, bi) = (lb.failed_rate(), lb.invalid_rate());
        let n = s.probe_total as f64;
        let (failed, invalid) = (s.probe_failed as f64, s.invalid_rtt_count as f64);
        let t = &mut w.totals[inter as usize];
        t.0 += n;
        t.1 += failed;
        t.2 += invalid;
        // The ends: RNICs and ToRs, for every probe of the path.
        let ends_all = [
            rnic_ids[r.src as usize],
            rnic_ids[r.dst as usize],
            tor_ids[st as usize],
            tor_ids[dt as usize],
        ];
        let ends = &ends_all[..if inter { 4 } else { 3 }];
        for &c in ends {
            w.expose(c, n * (bf + bi), 3.0 * n);
        }
        let routed = match (ecmp, p.topo_tors[st as usize], p.topo_tors[dt as usize]) {
            (Some(e), Some(ts), Some(td)) if inter => Some((e, ts, td)),
            _ => None,
        };
        let shared = routed.map(|(e, ts, td)| e.shared_spines(ts, td));
        let has_route = shared.as_ref().is_some_and(|sp| !sp.is_empty());
        // A label is slow against its own path's median (and fastest probe): a path
        // whose every probe is jittery (software timestamps) has no slow label.
        let base_rtt = s.network_rtt_min_ns.max(s.network_rtt_p50_ns);
        match (routed, shared) {
            (Some((e, ts, td)), Some(_)) if has_route && s.has_labels => {
                let Some(spines) = p.label_spines(r) else {
                    continue;
                };
                let path = LabeledPath {
                    topo: e,
                    ts,
                    td,
                    spines,
                    ends,
                    index: r.index,
                    inter,
                    rates: (bf, bi),
                    base_rtt,
                };
                path.add(r.s, &mut w, comps, skip, &mut sums);
            }
            (Some((e, ts, td)), Some(spines)) if has_route => {
                // No per-label detail (a clean window): its probes spread evenly over
                // the spines; its events (an agent without label detail) name no link.
                // Ids are made in the order a per-path spread would meet them.
                if !(comps.complete(e, ts) && comps.complete(e, td)) {
                    for &sp in spines.iter() {
                        for link in [
                            (ts, sp, LinkDir::Up),
                            (td, sp, LinkDir::Down),
                            (td, sp, LinkDir::Up),
                            (ts, sp, LinkDir::Down),
                        ] {
                            comps.link(e, link);
                            comps.cable(e, link.0, link.1);
                        }
                    }
                    w.grow(comps.len());
                }
                if e.uplinks(ts) == e.uplinks(td) {
                    if spread.is_empty() {
                        spread = vec![[(0.0, 0.0); 2]; e.tor_count()];
                    }
                    let a = s.probe_success as f64;
                    for (t, role) in [(ts, 0), (td, 1)] {
                        let x = &mut spread[t as usize][role];
                        x.0 += n;
                        x.1 += a;
                    }
                } else {
                    let k = spines.len().max(1) as f64;
                    let answered = s.probe_success as f64 / k;
                    for &sp in spines.iter() {
                        for (link, rate, per) in [
                            ((ts, sp, LinkDir::Up), bf, 1.0),
                            ((td, sp, LinkDir::Down), bf, 1.0),
                            ((td, sp, LinkDir::Up), bi, 2.0),
                            ((ts, sp, LinkDir::Down), bi, 2.0),
                        ] {
                            let c = comps.link(e, link);
                            let cable = comps.cable(e, link.0, link.1);
                            for x in [c, cable] {
                                w.expose(x, n / k * rate, n / k * per);
                            }
                            w.answer(c, answered);
                            // Two of the four cross one cable (up and down at one ToR).
                            w.answer(cable, answered / 2.0);
                        }
                    }
                }
                let unit = PathUnit {
                    loss: ends.to_vec(),
                    latency: Vec::new(),
                    slow: 0.0,
                    excess_ns: 0,
                    in_label_totals: false,
                };
                push_path_unit(&mut w, r.index, unit, s, inter);
            }
            _ => {
                let mut unit = PathUnit {
                    loss: ends.to_vec(),
                    latency: Vec::new(),
                    slow: 0.0,
                    excess_ns: 0,
                    in_label_totals: false,
                };
                if inter && !side_ids.is_empty() {
                    // No ECMP model: the two ToR sides, for loss and for latency.
                    let sides = [side_ids[st as usize], side_ids[dt as usize]];
                    for &c in &sides {
                        w.expose(c, n * (bf + bi), 3.0 * n);
                        w.answer(c, s.probe_success as f64);
                    }
                    let slow: f64 =
                        r.s.flow_labels
                            .iter()
                            .map(|l| {
                                let a = l.probe_total as f64
                                    - l.probe_failed as f64
                                    - l.probe_invalid as f64;
                                let slow = l.network_rtt_p50_ns
                                    >= base_rtt.saturating_add(SLOW_LABEL_EXCESS_NS);
                                if slow {
                                    a.max(0.0)
                                } else {
                                    0.0
                                }
                            })
                            .sum();
                    w.label_answered += s.probe_success as f64;
                    w.label_slow += slow;
                    unit.loss.extend(sides);
                    unit.latency = sides.to_vec();
                    unit.slow = slow;
                    unit.excess_ns = s.network_rtt_p99_ns.saturating_sub(base_rtt);
                    unit.in_label_totals = true;
                }
                push_path_unit(&mut w, r.index, unit, s, inter);
            }
        }
    }
    if let Some(e) = ecmp {
        spread_clean(&mut w, e, comps, &spread, &base.inter);
    }
    w.grow(comps.len());
    w
}

/// An inter-ToR path with per-label detail, routed.
struct LabeledPath<'t, 'e> {
    topo: &'t Topology,
    ts: u32,
    td: u32,
    /// Per label, the spines of its probe and of its ACKs.
    spines: &'e [[u32; 2]],
    /// Its RNICs and ToRs (which already have its exposure).
    ends: &'e [u32],
    index: u32,
    inter: bool,
    /// Background (lost, incomplete) probes per probe of its class.
    rates: (f64, f64),
    /// What a slow label is measured against (ns).
    base_rtt: u64,
}

/// One path's labels summed per spine (a path has up to 64 labels over a few spines):
/// the probes' way, up at the source ToR and down at the destination, and the ACKs' way
/// back. Each label's links get their share once per spine, not once per label.
#[derive(Default)]
struct SpineSums {
    /// Probes and answered probes per spine, the probes' way and the ACKs'.
    fwd: Vec<(f64, f64)>,
    rev: Vec<(f64, f64)>,
    /// Answered probes whose probe and ACKs crossed the same spine (the cable counts them
    /// once).
    same: Vec<f64>,
    fwd_touched: Vec<u32>,
    rev_touched: Vec<u32>,
}

impl SpineSums {
    fn reset(&mut self, spines: usize) {
        if self.fwd.len() != spines {
            self.fwd = vec![(0.0, 0.0); spines];
            self.rev = vec![(0.0, 0.0); spines];
            self.same = vec![0.0; spines];
        }
        for &x in &self.fwd_touched {
            self.fwd[x as usize] = (0.0, 0.0);
        }
        for &x in &self.rev_touched {
            self.rev[x as usize] = (0.0, 0.0);
            self.same[x as usize] = 0.0;
        }
        self.fwd_touched.clear();
        self.rev_touched.clear();
    }

    fn touch(&mut self, fwd: u32, rev: u32) {
        if !self.fwd_touched.contains(&fwd) {
            self.fwd_touched.push(fwd);
        }
        if !self.rev_touched.contains(&rev) {
            self.rev_touched.push(rev);
        }
    }
}

impl LabeledPath<'_, '_> {
    /// Per label: its own links' exposure and answered probes (summed per spine), and a
    /// unit for each label that lost, came back incomplete or was slow.
    fn add(
        &self,
        s: &PathSummary,
        w: &mut WindowEvidence,
        comps: &mut Components,
        skip: &Skip<'_>,
        sums: &mut SpineSums,
    ) {
        let (e, ts, td) = (self.topo, self.ts, self.td);
        let (bf, bi) = self.rates;
        sums.reset(e.spine_count());
        // Ids are made in the order a label-by-label pass meets them.
        let fresh = !(comps.complete(e, ts) && comps.complete(e, td));
        for (l, &[sf, sr]) in s.flow_labels.iter().zip(self.spines) {
            let links = [
                (ts, sf, LinkDir::Up),
                (td, sf, LinkDir::Down),
                (td, sr, LinkDir::Up),
                (ts, sr, LinkDir::Down),
            ];
            if !skip.links.is_empty() && links.iter().any(|k| skip.links.contains(k)) {
                continue;
            }
            if fresh {
                for k in links {
                    comps.link(e, k);
                }
                for k in links {
                    comps.cable(e, k.0, k.1);
                }
            }
            let ln = l.probe_total as f64;
            let (lf, li) = (l.probe_failed as f64, l.probe_invalid as f64);
            let answered = (ln - lf - li).max(0.0);
            sums.fwd[sf as usize].0 += ln;
            sums.fwd[sf as usize].1 += answered;
            sums.rev[sr as usize].0 += ln;
            sums.rev[sr as usize].1 += answered;
            if sf == sr {
                sums.same[sf as usize] += answered;
            }
            sums.touch(sf, sr);
            w.label_answered += answered;
            let slow = answered > 0.0
                && l.network_rtt_p50_ns >= self.base_rtt.saturating_add(SLOW_LABEL_EXCESS_NS);
            if slow {
                w.label_slow += answered;
            }
            if lf + li > 0.0 || slow {
                let ids = links.map(|k| comps.link(e, k));
                let cables = links.map(|k| comps.cable(e, k.0, k.1));
                let mut loss: Vec<(u32, f64)> = self.ends.iter().map(|&c| (c, lf + li)).collect();
                loss.extend([(ids[0], lf), (ids[1], lf), (ids[2], li), (ids[3], li)]);
                // A cable the probe and its ACKs both crossed counts both.
                for (i, &c) in cables.iter().enumerate() {
                    let ev = if i < 2 { lf } else { li };
                    match loss.iter_mut().find(|(x, _)| *x == c) {
                        Some(entry) => entry.1 += ev,
                        None => loss.push((c, ev)),
                    }
                }
                loss.retain(|&(_, ev)| ev > 0.0);
                let (distinct, nd) = dedup4(cables);
                let mut latency = ids.to_vec();
                latency.extend_from_slice(&distinct[..nd]);
                w.units.push(Unit {
                    loss,
                    latency,
                    slow: if slow { answered } else { 0.0 },
                    excess_ns: l.network_rtt_p50_ns.saturating_sub(self.base_rtt),
                    path: self.index,
                    label: l.flow_label,
                    inter: self.inter,
                    probes: ln,
                    failed: lf,
                    invalid: li,
                    answered,
                    in_label_totals: true,
                    owner: None,
                });
            }
        }
        w.grow(comps.len());
        // A probe crosses up at ts and down at td on its spine (drops lose it: the lost
        // rate, once per probe), its ACKs up at td and down at ts on theirs (drops make it
        // incomplete: the incomplete rate, two ACKs per probe). A cable carries both.
        for &x in &sums.fwd_touched {
            let (fp, fa) = sums.fwd[x as usize];
            for link in [(ts, x, LinkDir::Up), (td, x, LinkDir::Down)] {
                let c = comps.link(e, link);
                w.expose(c, fp * bf, fp);
                w.answer(c, fa);
            }
            for t in [ts, td] {
                let c = comps.cable(e, t, x);
                w.expose(c, fp * bf, fp);
                w.answer(c, fa);
            }
        }
        for &x in &sums.rev_touched {
            let (rp, ra) = sums.rev[x as usize];
            for link in [(td, x, LinkDir::Up), (ts, x, LinkDir::Down)] {
                let c = comps.link(e, link);
                w.expose(c, rp * bi, 2.0 * rp);
                w.answer(c, ra);
            }
            // A label whose probe and ACKs crossed one spine is answered once on a cable.
            let cable_answered = ra - sums.same[x as usize];
            for t in [ts, td] {
                let c = comps.cable(e, t, x);
                w.expose(c, rp * bi, 2.0 * rp);
                w.answer(c, cable_answered);
            }
        }
    }
}

/// Spreads the clean paths summed per ToR over its links: per path and spine, a probe
/// crosses its source ToR's uplink and the destination's downlink, its ACKs the other
/// two, each on `1/k` of the probes (k spines).
fn spread_clean(
    w: &mut WindowEvidence,
    topo: &Topology,
    comps: &mut Components,
    spread: &[[(f64, f64); 2]],
    lb: &LossBaseline,
) {
    let (bf, bi) = (lb.failed_rate(), lb.invalid_rate());
    for (t, &[(src_n, src_a), (dst_n, dst_a)]) in spread.iter().enumerate() {
        if src_n == 0.0 && dst_n == 0.0 {
            continue;
        }
        let t = t as u32;
        let ups = topo.uplinks(t);
        let k = ups.len().max(1) as f64;
        let answered = (src_a + dst_a) / k;
        for &sp in ups {
            let up = comps.link(topo, (t, sp, LinkDir::Up));
            let down = comps.link(topo, (t, sp, LinkDir::Down));
            let cable = comps.cable(topo, t, sp);
            w.grow(comps.len());
            // Up: the probes it sends, the ACKs of the probes it receives; down: the
            // other way round. The cable carries all of them.
            w.expose(up, (src_n * bf + dst_n * bi) / k, (src_n + 2.0 * dst_n) / k);
            w.expose(
                down,
                (src_n * bi + dst_n * bf) / k,
                (2.0 * src_n + dst_n) / k,
            );
            w.expose(
                cable,
                (src_n + dst_n) * (bf + bi) / k,
                3.0 * (src_n + dst_n) / k,
            );
            for c in [up, down, cable] {
                w.answer(c, answered);
            }
        }
    }
}

/// The distinct ids of four (a probe and its ACKs may cross one cable twice), in order.
fn dedup4(v: [u32; 4]) -> ([u32; 4], usize) {
    let mut out = [0u32; 4];
    let mut n = 0;
    for x in v {
        if !out[..n].contains(&x) {
            out[n] = x;
            n += 1;
        }
    }
    (out, n)
}

/// What a whole-path unit says: the components its events count for, and (no ECMP
/// model) the ToR sides its slow labels count for.
struct PathUnit {
    loss: Vec<u32>,
    latency: Vec<u32>,
    slow: f64,
    excess_ns: u64,
    in_label_totals: bool,
}

/// A whole path as one unit, when it has something to say.
fn push_path_unit(w: &mut WindowEvidence, path: u32, u: PathUnit, s: &PathNumbers, inter: bool) {
    let events = s.probe_failed as f64 + s.invalid_rtt_count as f64;
    if events <= 0.0 && u.slow <= 0.0 {
        return;
    }
    w.units.push(Unit {
        loss: if events > 0.0 {
            u.loss.iter().map(|&c| (c, events)).collect()
        } else {
            Vec::new()
        },
        latency: u.latency,
        slow: u.slow,
        excess_ns: u.excess_ns,
        path,
        label: 0,
        inter,
        probes: s.probe_total as f64,
        failed: s.probe_failed as f64,
        invalid: s.invalid_rtt_count as f64,
        answered: s.probe_success as f64,
        in_label_totals: u.in_label_totals,
        owner: None,
    });
}
