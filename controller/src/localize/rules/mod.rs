//! The localization rules over one window (pure). See the module comment of `localize`
//! for the order; each step marks the paths it explains so later steps do not see them.

use std::collections::BTreeMap;

use rpingmesh_proto::controller_agent::PathSummary;
use rpingmesh_proto::operator::{FindingEvidence, FindingPath};

use super::placed::{Placed, PlacedPath, WindowPath};
use super::{Blame, ComponentKind, Inventory, LocalizerParams, Symptom};
use crate::topology::{DirLink, Topology};

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

/// A placed path with the rules' marks on it (it reads as the path: `r.n`, `r.src`...).
struct Rec<'a> {
    path: &'a PlacedPath<'a>,
    explained: bool,
    /// Explained by a blame (not only grazed): the gray detector leaves it out.
    blamed: bool,
}

impl<'a> std::ops::Deref for Rec<'a> {
    type Target = PlacedPath<'a>;
    fn deref(&self) -> &PlacedPath<'a> {
        self.path
    }
}

impl Rec<'_> {
    fn loss(&self) -> f64 {
        ratio(self.n.probe_failed as f64, self.n.probe_total as f64)
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
    p: &'a Placed<'a>,
    recs: Vec<Rec<'a>>,
    blames: Vec<Blame>,
    blamed_links: Vec<DirLink>,
    known_links: &'a [DirLink],
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
    /// Counts path `r` for RNIC `x`, its prober, its target or both.
    fn count(&mut self, r: &Rec<'_>, x: u32, lossy: bool) {
        let (t, f) = (r.n.probe_total as u64, r.n.probe_failed as u64);
        let local = r.tors[0] == r.tors[1];
        let touched = r.n.probe_failed > 0;
        for (end, out) in [(r.src, true), (r.dst, false)] {
            if end != x {
                continue;
            }
            if out {
                self.out_total += t;
                self.out_failed += f;
            } else {
                self.in_total += t;
                self.in_failed += f;
            }
            self.paths += 1;
            self.lossy_paths += lossy as u32;
            self.touched_paths += touched as u32;
            if local {
                self.local_paths += 1;
                self.lossy_local_paths += lossy as u32;
                self.touched_local_paths += touched as u32;
            }
        }
    }

    /// Takes path `r`, counted before, back out of `x`'s counts.
    fn uncount(&mut self, r: &Rec<'_>, x: u32, lossy: bool) {
        let mut p = RnicStat::default();
        p.count(r, x, lossy);
        self.in_total -= p.in_total;
        self.in_failed -= p.in_failed;
        self.out_total -= p.out_total;
        self.out_failed -= p.out_failed;
        self.paths -= p.paths;
        self.lossy_paths -= p.lossy_paths;
        self.local_paths -= p.local_paths;
        self.lossy_local_paths -= p.lossy_local_paths;
        self.touched_paths -= p.touched_paths;
        self.touched_local_paths -= p.touched_local_paths;
    }

    /// How clearly broken: the share of its paths that are lossy, then its loss, then how
    /// many lossy paths it explains (of two RNICs lost only to each other and to a third,
    /// the third explains the most).
    fn clarity(&self) -> (f64, f64, u32) {
        (
            ratio(self.lossy_paths as f64, self.paths as f64),
            self.out_loss() + self.in_loss(),
            self.lossy_paths,
        )
    }

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
    let paths = WindowPath::intern(paths);
    let placed = Placed::new(&paths, inv, topology);
    explain_window(params, topology, &placed, &vec![false; paths.len()], &[]).blames
}

/// What the rules made of a window.
pub struct RulesOutcome {
    pub blames: Vec<Blame>,
    /// Per path of the window: explained by one of the blames.
    pub blamed_paths: Vec<bool>,
    /// Directed links a link blame explained.
    pub blamed_links: Vec<DirLink>,
}

/// The rules over one window (`placed`, of a list of `skip.len()` paths), `skip[i]`
/// marking paths already explained (a stalled host's, a named RNIC's), `known_links` the
/// directed links whose tuples are (links the gray detector named).
pub fn explain_window<'a>(
    params: &'a LocalizerParams,
    topology: Option<&Topology>,
    placed: &'a Placed<'a>,
    skip: &[bool],
    known_links: &'a [DirLink],
) -> RulesOutcome {
    let mut w = Window {
        params,
        p: placed,
        recs: placed
            .paths
            .iter()
            .map(|r| Rec {
                path: r,
                explained: skip[r.index as usize],
                blamed: false,
            })
            .collect(),
        blames: Vec::new(),
        blamed_links: Vec::new(),
        known_links,
    };
    w.hosts_step();
    w.tor_step();
    w.rnic_step();
    match topology {
        Some(t) if t.ecmp().is_some() => w.link_step(t),
        _ => w.tor_side_step(),
    }
    let mut blamed_paths = vec![false; skip.len()];
    for r in w.recs.iter().filter(|r| r.blamed) {
        blamed_paths[r.index as usize] = true;
    }
    RulesOutcome {
        blames: w.blames,
        blamed_paths,
        blamed_links: w.blamed_links,
    }
}

impl Window<'_> {
    fn is_lossy(&self, r: &Rec<'_>) -> bool {
        r.n.probe_failed >= LOSSY_PATH_MIN_FAILED && r.loss() > self.params.loss_ratio
    }

    /// Step 1: a host whose endpoint delays (its prober's on the paths it probes, its
    /// responder's on the paths probing it) are inflated. Its paths are explained: their
    /// timeouts are the host's, not the network's.
    fn hosts_step(&mut self) {
        let n = self.p.hosts.names.len();
        let mut prober: Vec<Vec<u64>> = vec![Vec::new(); n];
        let mut responder: Vec<Vec<u64>> = vec![Vec::new(); n];
        let mut tails: Vec<Vec<u64>> = vec![Vec::new(); n];
        for r in &self.recs {
            if r.n.probe_success == 0 {
                continue;
            }
            let (hs, hd) = (r.hosts[0] as usize, r.hosts[1] as usize);
            prober[hs].push(r.n.prober_delay_p50_ns);
            responder[hd].push(r.n.responder_delay_p50_ns);
            tails[hs].push(r.n.prober_delay_p99_ns);
            tails[hd].push(r.n.responder_delay_p99_ns);
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
                if r.hosts.contains(&h) {
                    r.explained = true;
                }
            }
        }
        for (h, p, q, share) in stalled {
            let mut ev = Evidence::default();
            let mut rtt = Vec::new();
            for r in self.recs.iter_mut() {
                let on = r.hosts;
                if on.contains(&h) {
                    r.explained = true;
                    r.blamed = true;
                    ev.add(r.s);
                    if r.n.probe_success > 0 {
                        rtt.push(r.n.network_rtt_p50_ns);
                    }
                }
            }
            let host = self.p.hosts.names[h as usize].clone();
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

    /// Per-RNIC loss over the paths not yet explained.
    fn rnic_stats(&self) -> Vec<RnicStat> {
        let mut st = vec![RnicStat::default(); self.p.rnics.len()];
        for r in self.recs.iter().filter(|r| !r.explained) {
            let lossy = self.is_lossy(r);
            st[r.src as usize].count(r, r.src, lossy);
            if r.dst != r.src {
                st[r.dst as usize].count(r, r.dst, lossy);
            }
        }
        st
    }

    /// The RNICs that look broken, the most clearly broken first, each one's paths set
    /// aside before the next is judged: a neighbour whose only failures are its paths to a
    /// dead RNIC is not named with it (on a ToR of two, half of the neighbour's paths go to
    /// the dead one). A window where none looks broken costs one pass over its paths.
    fn broken_rnics(&self) -> BrokenRnics {
        let all = self.rnic_stats();
        let mut rest = all.clone();
        let mut chosen = Vec::new();
        if clearest_broken(&rest).is_none() {
            return BrokenRnics { all, chosen, rest };
        }
        let mut on: Vec<Vec<usize>> = vec![Vec::new(); rest.len()];
        for (i, r) in self.recs.iter().enumerate().filter(|(_, r)| !r.explained) {
            on[r.src as usize].push(i);
            if r.dst != r.src {
                on[r.dst as usize].push(i);
            }
        }
        let mut set_aside = vec![false; self.recs.len()];
        // A chosen RNIC has no paths left, so it never looks broken again.
        while let Some(x) = clearest_broken(&rest) {
            chosen.push((x as u32, rest[x]));
            rest[x] = RnicStat::default();
            for &i in &on[x] {
                if !std::mem::replace(&mut set_aside[i], true) {
                    let r = &self.recs[i];
                    let y = if r.src as usize == x { r.dst } else { r.src };
                    rest[y as usize].uncount(r, y, self.is_lossy(r));
                }
            }
        }
        BrokenRnics { all, chosen, rest }
    }

    /// Step 2: a ToR nearly all of whose RNICs nobody reaches and reach nobody, its
    /// ToR-local paths included (dead uplinks spare those).
    fn tor_step(&mut self) {
        // Broken as the RNIC rule sees them: a ToR going down mid-window (or back up)
        // leaves every RNIC under it partly unreachable, not 90% so. One the RNIC rule
        // clears (its failures were a dead neighbour's) still counts when nothing off
        // the ToR probed it: from inside, a dead ToR and a dead RNIC look alike.
        let broken = self.broken_rnics();
        let mut dead = vec![false; broken.all.len()];
        for &(x, _) in &broken.chosen {
            dead[x as usize] = true;
        }
        let mut per_tor: BTreeMap<u32, (u32, u32)> = BTreeMap::new();
        for (i, s) in broken.all.iter().enumerate() {
            if s.paths > 0 {
                let e = per_tor.entry(self.p.rnics[i].tor).or_default();
                e.0 += 1;
                e.1 += (dead[i] || (s.looks_broken() && s.local_paths == s.paths)) as u32;
            }
        }
        for (tor, (seen, dead)) in per_tor {
            if dead < 2 || (dead as f64) < TOR_DOWN_SHARE * seen as f64 {
                continue;
            }
            let mut ev = Evidence::default();
            for r in self.recs.iter_mut() {
                let on = r.tors;
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
                location: self.p.tors.names[tor as usize].clone(),
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
    fn rnic_step(&mut self) {
        let BrokenRnics {
            chosen: blamed,
            rest,
            ..
        } = self.broken_rnics();
        let grazed: Vec<u32> = (0..rest.len() as u32)
            .filter(|&x| rest[x as usize].looks_grazed())
            .collect();
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
                location: self.p.rnics[x as usize].name.clone(),
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
}

/// What the RNIC rule makes of the paths not yet explained.
struct BrokenRnics {
    /// Per RNIC, over all of them.
    all: Vec<RnicStat>,
    /// The broken ones in the order taken, each with its counts when it was.
    chosen: Vec<(u32, RnicStat)>,
    /// Per RNIC, without the chosen ones' paths.
    rest: Vec<RnicStat>,
}

/// The RNIC that looks most clearly broken (the lowest index of equals).
fn clearest_broken(st: &[RnicStat]) -> Option<usize> {
    (0..st.len())
        .filter(|&x| st[x].looks_broken())
        .reduce(|a, b| {
            if st[b].clarity() > st[a].clarity() {
                b
            } else {
                a
            }
        })
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

mod links;
