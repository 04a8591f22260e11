//! The localization rules over one window (pure). See the module comment of `localize`
//! for the order; each step marks the paths it explains so later steps do not see them.

use std::collections::{BTreeMap, BTreeSet};

// Windows hold millions of GID lookups: a fast hasher, no DoS concern on our own keys.
use foldhash::{HashMap, HashMapExt};

use rpingmesh_proto::controller_agent::PathSummary;
use rpingmesh_proto::operator::{FindingEvidence, FindingPath};

use super::placed::Names;
use super::{Blame, ComponentKind, Inventory, LocalizerParams, Symptom};
use crate::topology::{DirLink, LinkDir, Topology};

/// Paths kept as evidence on a finding.
const EVIDENCE_PATHS: usize = 8;
/// Flow labels kept as evidence on a link finding.
const EVIDENCE_LABELS: usize = 16;
/// Above this loss a component is down rather than flapping or lossy.
const DOWN_LOSS: f64 = 0.9;
/// A path is lossy with at least this many lost probes (and a loss above the ratio).
const LOSSY_PATH_MIN_FAILED: u32 = 2;
/// RNIC: least loss on its paths, each way.
const RNIC_MIN_LOSS: f64 = 0.05;
/// RNIC: least share of its paths (to and from it) that are lossy. A neighbour of a dead
/// RNIC has one or two lossy paths among many; the dead one has all of them.
const RNIC_LOSSY_SHARE: f64 = 0.5;
/// ToR: least share of its RNICs that nobody reaches (and that reach nobody).
const TOR_DOWN_SHARE: f64 = 0.75;
/// A link is blamed for loss only when it explains at least this many lost probes.
const MIN_LINK_FAILURES: f64 = 5.0;
/// Share of the answered probes across a link that must be slow to blame it for latency.
const SLOW_LINK_SHARE: f64 = 0.5;
/// Links of one ToR blamed at once (and at least half of its uplinks) that are read as a
/// problem below the ToR's uplinks rather than that many broken links.
const MANY_LINKS: usize = 3;
/// Slow (pair, label) tuples a link needs before it is blamed for latency.
const MIN_SLOW_TUPLES: f64 = 3.0;

struct Rnic<'a> {
    gid: &'a str,
    host: u32,
    tor: u32,
}

struct Rec<'a> {
    s: &'a PathSummary,
    /// Index in the window's path list.
    index: u32,
    src: u32,
    dst: u32,
    explained: bool,
    /// Explained by a blame (not only grazed): the gray detector leaves it out.
    blamed: bool,
}

impl Rec<'_> {
    fn loss(&self) -> f64 {
        ratio(self.s.probe_failed as f64, self.s.probe_total as f64)
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

fn median(v: &mut [u64]) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[(v.len() - 1) / 2]
}

struct Window<'a> {
    params: &'a LocalizerParams,
    rnics: Vec<Rnic<'a>>,
    rnic_ids: HashMap<&'a str, u32>,
    tors: Names,
    hosts: Names,
    recs: Vec<Rec<'a>>,
    blames: Vec<Blame>,
    blamed_links: Vec<DirLink>,
}

/// Per-RNIC loss over the paths not yet explained.
#[derive(Debug, Default, Clone, Copy)]
struct RnicStat {
    in_total: u64,
    in_failed: u64,
    out_total: u64,
    out_failed: u64,
    paths: u32,
    lossy_paths: u32,
    local_paths: u32,
    lossy_local_paths: u32,
    /// Paths with any lost probe (the lossy ones and those with one or a few).
    touched_paths: u32,
    touched_local_paths: u32,
}

impl RnicStat {
    /// Its peers fail to reach it and it fails to reach them: loss both ways, on most of
    /// its paths, ToR-local ones included (an uplink problem spares those).
    fn looks_broken(&self) -> bool {
        if self.paths == 0 || self.out_total == 0 {
            return false;
        }
        let both_ways = self.out_loss() >= RNIC_MIN_LOSS
            && (self.in_total == 0 || self.in_loss() >= RNIC_MIN_LOSS);
        let spread = self.lossy_paths as f64 >= RNIC_LOSSY_SHARE * self.paths as f64;
        let local = self.local_paths == 0 || 2 * self.lossy_local_paths >= self.local_paths;
        both_ways && spread && local
    }

    /// Broken for a moment of the window only (a fault starting or ending in it): most
    /// of its paths, ToR-local ones included, lost something both ways, too little for
    /// `looks_broken`. Not named, but those losses are its, not the links'.
    fn looks_grazed(&self) -> bool {
        self.paths >= 2
            && self.out_failed > 0
            && (self.in_total == 0 || self.in_failed > 0)
            && 2 * self.touched_paths >= self.paths
            && (self.local_paths == 0 || 2 * self.touched_local_paths >= self.local_paths)
    }

    fn in_loss(&self) -> f64 {
        ratio(self.in_failed as f64, self.in_total as f64)
    }
    fn out_loss(&self) -> f64 {
        ratio(self.out_failed as f64, self.out_total as f64)
    }
}

/// The blames of one window (pure; see the module comment of `localize` for the order).
pub fn explain<'a>(
    params: &LocalizerParams,
    topology: Option<&Topology>,
    paths: impl IntoIterator<Item = &'a PathSummary>,
    inv: &dyn Inventory,
) -> Vec<Blame> {
    let paths: Vec<&PathSummary> = paths.into_iter().collect();
    explain_window(params, topology, &paths, inv, &vec![false; paths.len()]).blames
}

/// What the rules made of a window.
pub struct RulesOutcome {
    pub blames: Vec<Blame>,
    /// Per path of the window: explained by one of the blames.
    pub blamed_paths: Vec<bool>,
    /// Directed links a link blame explained.
    pub blamed_links: Vec<DirLink>,
}

/// The rules over one window, `skip[i]` marking paths already explained (a stalled host's).
pub fn explain_window(
    params: &LocalizerParams,
    topology: Option<&Topology>,
    paths: &[&PathSummary],
    inv: &dyn Inventory,
    skip: &[bool],
) -> RulesOutcome {
    let mut w = Window {
        params,
        rnics: Vec::new(),
        rnic_ids: HashMap::new(),
        tors: Names::default(),
        hosts: Names::default(),
        recs: Vec::new(),
        blames: Vec::new(),
        blamed_links: Vec::new(),
    };
    for (i, &s) in paths.iter().enumerate() {
        if s.probe_total == 0 {
            continue;
        }
        let src = w.rnic(&s.source_gid, &s.source_tor_id, inv);
        let dst = w.rnic(&s.target_gid, &s.target_tor_id, inv);
        if src == dst {
            continue;
        }
        w.recs.push(Rec {
            s,
            index: i as u32,
            src,
            dst,
            explained: skip[i],
            blamed: false,
        });
    }
    w.hosts_step();
    w.tor_step();
    w.rnic_step(inv);
    match topology {
        Some(t) if t.ecmp().is_some() => w.link_step(t),
        _ => w.tor_side_step(),
    }
    let mut blamed_paths = vec![false; paths.len()];
    for r in w.recs.iter().filter(|r| r.blamed) {
        blamed_paths[r.index as usize] = true;
    }
    RulesOutcome {
        blames: w.blames,
        blamed_paths,
        blamed_links: w.blamed_links,
    }
}

impl<'a> Window<'a> {
    fn rnic(&mut self, gid: &'a str, reported_tor: &str, inv: &dyn Inventory) -> u32 {
        if let Some(&i) = self.rnic_ids.get(gid) {
            return i;
        }
        let (host, tor) = match inv.place(gid) {
            Some(p) => (self.hosts.id(p.host), self.tors.id(p.tor)),
            // Unknown to the registry: its own host, the ToR its peers reported.
            None => (self.hosts.id(gid), self.tors.id(reported_tor)),
        };
        let i = self.rnics.len() as u32;
        self.rnics.push(Rnic { gid, host, tor });
        self.rnic_ids.insert(gid, i);
        i
    }

    fn host_of(&self, r: u32) -> u32 {
        self.rnics[r as usize].host
    }

    fn tor_of(&self, r: u32) -> u32 {
        self.rnics[r as usize].tor
    }

    fn is_lossy(&self, r: &Rec<'_>) -> bool {
        r.s.probe_failed >= LOSSY_PATH_MIN_FAILED && r.loss() > self.params.loss_ratio
    }

    /// Step 1: a host whose endpoint delays (its prober's on the paths it probes, its
    /// responder's on the paths probing it) are inflated. Its paths are explained: their
    /// timeouts are the host's, not the network's.
    fn hosts_step(&mut self) {
        let n = self.hosts.names.len();
        let mut prober: Vec<Vec<u64>> = vec![Vec::new(); n];
        let mut responder: Vec<Vec<u64>> = vec![Vec::new(); n];
        let mut tails: Vec<Vec<u64>> = vec![Vec::new(); n];
        for r in &self.recs {
            if r.s.probe_success == 0 {
                continue;
            }
            let (hs, hd) = (self.host_of(r.src) as usize, self.host_of(r.dst) as usize);
            prober[hs].push(r.s.prober_delay_p50_ns);
            responder[hd].push(r.s.responder_delay_p50_ns);
            tails[hs].push(r.s.prober_delay_p99_ns);
            tails[hd].push(r.s.responder_delay_p99_ns);
        }
        let threshold = self.params.host_delay_ns;
        let mut stalled = Vec::new();
        let mut grazed = Vec::new();
        for h in 0..n {
            let inflated = prober[h].iter().filter(|&&d| d > threshold).count()
                + responder[h].iter().filter(|&&d| d > threshold).count();
            let measured = prober[h].len() + responder[h].len();
            let p = median(&mut prober[h]);
            let q = median(&mut responder[h]);
            if p.max(q) > threshold {
                stalled.push((h as u32, p, q, ratio(inflated as f64, measured as f64)));
            } else if median(&mut tails[h]) > threshold {
                // Stalled for part of the window only (a stall starting or ending in it):
                // too little to name the host, but its paths' timeouts are still its own,
                // not the network's.
                grazed.push(h as u32);
            }
        }
        for h in grazed {
            for r in self.recs.iter_mut() {
                if [r.src, r.dst]
                    .map(|x| self.rnics[x as usize].host)
                    .contains(&h)
                {
                    r.explained = true;
                }
            }
        }
        for (h, p, q, share) in stalled {
            let mut ev = Evidence::default();
            let mut rtt = Vec::new();
            for r in self.recs.iter_mut() {
                let on = [r.src, r.dst].map(|x| self.rnics[x as usize].host);
                if on.contains(&h) {
                    r.explained = true;
                    r.blamed = true;
                    ev.add(r.s);
                    if r.s.probe_success > 0 {
                        rtt.push(r.s.network_rtt_p50_ns);
                    }
                }
            }
            let host = self.hosts.names[h as usize].clone();
            let mut e = ev.finish();
            e.excess_ns = p.max(q);
            e.detail = format!(
                "endpoint delay p50 {} us as prober, {} us as responder over {} paths; network RTT p50 {} us",
                p / 1000,
                q / 1000,
                e.paths_total,
                median(&mut rtt) / 1000
            );
            self.blames.push(Blame {
                kind: ComponentKind::Host,
                location: host,
                symptom: Symptom::Stall,
                confidence: share.clamp(0.0, 1.0),
                evidence: e,
            });
        }
    }

    fn rnic_stats(&self) -> Vec<RnicStat> {
        let mut st = vec![RnicStat::default(); self.rnics.len()];
        for r in self.recs.iter().filter(|r| !r.explained) {
            let lossy = self.is_lossy(r) as u32;
            let touched = (r.s.probe_failed > 0) as u32;
            let local = self.tor_of(r.src) == self.tor_of(r.dst);
            let (t, f) = (r.s.probe_total as u64, r.s.probe_failed as u64);
            for (x, out) in [(r.src, true), (r.dst, false)] {
                let s = &mut st[x as usize];
                if out {
                    s.out_total += t;
                    s.out_failed += f;
                } else {
                    s.in_total += t;
                    s.in_failed += f;
                }
                s.paths += 1;
                s.lossy_paths += lossy;
                s.touched_paths += touched;
                if local {
                    s.local_paths += 1;
                    s.lossy_local_paths += lossy;
                    s.touched_local_paths += touched;
                }
            }
        }
        st
    }

    /// Step 2: a ToR nearly all of whose RNICs nobody reaches and reach nobody, its
    /// ToR-local paths included (dead uplinks spare those).
    fn tor_step(&mut self) {
        let st = self.rnic_stats();
        let mut per_tor: BTreeMap<u32, (u32, u32)> = BTreeMap::new();
        for (i, s) in st.iter().enumerate() {
            if s.paths == 0 {
                continue;
            }
            let e = per_tor.entry(self.rnics[i].tor).or_default();
            e.0 += 1;
            // As the RNIC rule sees one: a ToR going down mid-window (or back up) leaves
            // every RNIC under it partly unreachable, not 90% so.
            e.1 += s.looks_broken() as u32;
        }
        for (tor, (seen, dead)) in per_tor {
            if dead < 2 || (dead as f64) < TOR_DOWN_SHARE * seen as f64 {
                continue;
            }
            let mut ev = Evidence::default();
            for r in self.recs.iter_mut() {
                let on = [r.src, r.dst].map(|x| self.rnics[x as usize].tor);
                if on.contains(&tor) {
                    r.blamed = true;
                    if !r.explained {
                        r.explained = true;
                        ev.add(r.s);
                    }
                }
            }
            let mut e = ev.finish();
            let loss = ratio(e.probe_failed as f64, e.probe_total as f64);
            e.detail = format!(
                "{dead} of its {seen} RNICs unreachable; loss {:.0}% over {} paths",
                100.0 * loss,
                e.paths_total
            );
            self.blames.push(Blame {
                kind: ComponentKind::Tor,
                location: self.tors.names[tor as usize].clone(),
                // Partly down in a window it went down or came back in.
                symptom: if loss >= DOWN_LOSS {
                    Symptom::Down
                } else {
                    Symptom::Loss
                },
                confidence: ratio(dead as f64, seen as f64),
                evidence: e,
            });
        }
    }

    /// Step 3: an RNIC its peers fail to reach and that fails to reach them: most of its
    /// paths lossy both ways, ToR-local ones too.
    fn rnic_step(&mut self, inv: &dyn Inventory) {
        let st = self.rnic_stats();
        let mut blamed = Vec::new();
        let mut grazed = Vec::new();
        for (i, s) in st.iter().enumerate() {
            if s.looks_broken() {
                blamed.push((i as u32, *s));
            } else if s.looks_grazed() {
                grazed.push(i as u32);
            }
        }
        for x in grazed {
            for r in self.recs.iter_mut().filter(|r| r.src == x || r.dst == x) {
                r.explained = true;
            }
        }
        for (x, s) in blamed {
            let mut ev = Evidence::default();
            for r in self.recs.iter_mut().filter(|r| r.src == x || r.dst == x) {
                r.blamed = true;
                if !r.explained {
                    r.explained = true;
                    ev.add(r.s);
                }
            }
            let down = s.out_loss() >= DOWN_LOSS && (s.in_total == 0 || s.in_loss() >= DOWN_LOSS);
            let mut e = ev.finish();
            e.detail = format!(
                "loss {:.0}% to its peers, {:.0}% from them; {} of {} paths lossy",
                100.0 * s.out_loss(),
                100.0 * s.in_loss(),
                s.lossy_paths,
                s.paths
            );
            // Without a peer probing it, only half of the rule is seen.
            let seen = if s.in_total == 0 { 0.5 } else { 1.0 };
            self.blames.push(Blame {
                kind: ComponentKind::Rnic,
                location: rnic_location(self.rnics[x as usize].gid, inv),
                symptom: if down {
                    Symptom::Down
                } else {
                    Symptom::Flapping
                },
                confidence: (seen * ratio(s.lossy_paths as f64, s.paths as f64)).clamp(0.0, 1.0),
                evidence: e,
            });
        }
    }

    /// Step 4 with an ECMP model: per-label tomography over the ToR-spine links.
    fn link_step(&mut self, topo: &Topology) {
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
    fn tor_side_step(&mut self) {
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

/// `<host>/<device>`, or the GID when the inventory does not know the RNIC.
fn rnic_location(gid: &str, inv: &dyn Inventory) -> String {
    match inv.place(gid) {
        Some(p) => format!("{}/{}", p.host, p.device),
        None => gid.to_string(),
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
                (self.total >= p.min_link_probes as f64
                    && self.failed >= MIN_LINK_FAILURES - 1e-9
                    && loss > p.loss_ratio)
                    .then_some(loss)
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

/// Collects the paths behind a blame; keeps the worst few.
#[derive(Default)]
struct Evidence {
    paths: Vec<FindingPath>,
    total: u64,
    failed: u64,
    count: u32,
}

impl Evidence {
    fn add(&mut self, s: &PathSummary) {
        self.total += s.probe_total as u64;
        self.failed += s.probe_failed as u64;
        self.count += 1;
        self.paths.push(FindingPath {
            source_gid: s.source_gid.clone(),
            target_gid: s.target_gid.clone(),
            probe_total: s.probe_total,
            probe_failed: s.probe_failed,
            network_rtt_p50_ns: s.network_rtt_p50_ns,
        });
        if self.paths.len() >= 4 * EVIDENCE_PATHS {
            self.trim();
        }
    }

    fn trim(&mut self) {
        self.paths.sort_by(|a, b| {
            ratio(b.probe_failed as f64, b.probe_total as f64)
                .total_cmp(&ratio(a.probe_failed as f64, a.probe_total as f64))
                .then(b.network_rtt_p50_ns.cmp(&a.network_rtt_p50_ns))
                .then((&a.source_gid, &a.target_gid).cmp(&(&b.source_gid, &b.target_gid)))
        });
        self.paths.truncate(EVIDENCE_PATHS);
    }

    fn finish(mut self) -> FindingEvidence {
        self.trim();
        FindingEvidence {
            windows: 1,
            paths: self.paths,
            paths_total: self.count,
            probe_total: self.total,
            probe_failed: self.failed,
            ..Default::default()
        }
    }
}
