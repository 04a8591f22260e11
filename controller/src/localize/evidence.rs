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
use super::placed::Placed;
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

/// One window's exposures (dense, by component id) and units.
pub struct WindowEvidence {
    /// Background events expected on each component.
    pub mu0: Vec<f64>,
    /// Packets a fault there would drop, per unit of drop probability.
    pub exposure: Vec<f64>,
    /// Answered probes whose RTT includes it (latency trials).
    pub answered: Vec<f64>,
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
            mu0: vec![0.0; n],
            exposure: vec![0.0; n],
            answered: vec![0.0; n],
            units: Vec::new(),
            totals: [(0.0, 0.0, 0.0); 2],
            label_answered: 0.0,
            label_slow: 0.0,
        }
    }

    fn grow(&mut self, n: usize) {
        if self.mu0.len() < n {
            self.mu0.resize(n, 0.0);
            self.exposure.resize(n, 0.0);
            self.answered.resize(n, 0.0);
        }
    }

    fn expose(&mut self, c: u32, mu0: f64, exposure: f64) {
        let i = c as usize;
        self.mu0[i] += mu0;
        self.exposure[i] += exposure;
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
    for r in &p.paths {
        let s = r.s;
        if skip.paths[r.index as usize]
            || skip_host[p.host_of(r.src) as usize]
            || skip_host[p.host_of(r.dst) as usize]
        {
            continue;
        }
        let (st, dt) = (p.tor_of(r.src), p.tor_of(r.dst));
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
            (Some((e, ts, td)), Some(_)) if has_route && !s.flow_labels.is_empty() => {
                let (Some(fwd), Some(rev)) = (
                    e.pair_route(ts, td, r.src_gid(p), r.dst_gid(p)),
                    e.pair_route(td, ts, r.dst_gid(p), r.src_gid(p)),
                ) else {
                    continue;
                };
                // Per label: its own links. The path's ends already have its exposure.
                for l in &s.flow_labels {
                    let (sf, sr) = (fwd.spine(l.flow_label), rev.spine(l.flow_label));
                    let links = [
                        (ts, sf, LinkDir::Up),
                        (td, sf, LinkDir::Down),
                        (td, sr, LinkDir::Up),
                        (ts, sr, LinkDir::Down),
                    ];
                    if links.iter().any(|k| skip.links.contains(k)) {
                        continue;
                    }
                    let ln = l.probe_total as f64;
                    let (lf, li) = (l.probe_failed as f64, l.probe_invalid as f64);
                    let answered = (ln - lf - li).max(0.0);
                    let ids = links.map(|k| comps.link(e, k));
                    let cables = links.map(|k| comps.cable(e, k.0, k.1));
                    w.grow(comps.len());
                    for (i, c) in ids.into_iter().zip(cables).enumerate() {
                        let (rate, per) = if i < 2 { (bf, 1.0) } else { (bi, 2.0) };
                        for x in [c.0, c.1] {
                            w.expose(x, ln * rate, per * ln);
                        }
                    }
                    let (distinct, nd) = dedup4(cables);
                    for &c in ids.iter().chain(&distinct[..nd]) {
                        w.answered[c as usize] += answered;
                    }
                    w.label_answered += answered;
                    let slow = answered > 0.0
                        && l.network_rtt_p50_ns >= base_rtt.saturating_add(SLOW_LABEL_EXCESS_NS);
                    if slow {
                        w.label_slow += answered;
                    }
                    if lf + li > 0.0 || slow {
                        let mut loss: Vec<(u32, f64)> =
                            ends.iter().map(|&c| (c, lf + li)).collect();
                        loss.extend([(ids[0], lf), (ids[1], lf), (ids[2], li), (ids[3], li)]);
                        // A cable the probe and its ACKs both crossed counts both.
                        for (i, &c) in cables.iter().enumerate() {
                            let e = if i < 2 { lf } else { li };
                            match loss.iter_mut().find(|(x, _)| *x == c) {
                                Some(entry) => entry.1 += e,
                                None => loss.push((c, e)),
                            }
                        }
                        loss.retain(|&(_, e)| e > 0.0);
                        let mut latency = ids.to_vec();
                        latency.extend_from_slice(&distinct[..nd]);
                        w.units.push(Unit {
                            loss,
                            latency,
                            slow: if slow { answered } else { 0.0 },
                            excess_ns: l.network_rtt_p50_ns.saturating_sub(base_rtt),
                            path: r.index,
                            label: l.flow_label,
                            inter,
                            probes: ln,
                            failed: lf,
                            invalid: li,
                            answered,
                            in_label_totals: true,
                            owner: None,
                        });
                    }
                }
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
                            w.answered[c as usize] += answered;
                            // Two of the four cross one cable (up and down at one ToR).
                            w.answered[cable as usize] += answered / 2.0;
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
                        w.answered[c as usize] += s.probe_success as f64;
                    }
                    let slow: f64 = s
                        .flow_labels
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
                w.answered[c as usize] += answered;
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
fn push_path_unit(w: &mut WindowEvidence, path: u32, u: PathUnit, s: &PathSummary, inter: bool) {
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
