//! Adaptive probing (pure): while the gray detector suspects a component but cannot name
//! it yet, a few agents get FOCUS targets whose probes cross it: flow labels the ECMP
//! model routes over a suspect link, or paths from and to a suspect RNIC or ToR. The
//! extra rate is bounded (`max_components` x `sources` targets, each at the agents'
//! `focus_probe_rate_per_second`), held for `hold_windows` windows after the last
//! suspicion, then dropped: the fleet's steady load does not change.
//!
//! Choices are deterministic (hashes of the component's name): the same suspicion gives
//! the same lists, so a window that changes nothing bumps no generation and sends no
//! agent fetching.

use std::collections::{BTreeMap, HashMap};

use rpingmesh_proto::controller_agent::{PingTarget, PinglistType};

use crate::localize::{Component, Suspect, Test};
use crate::pinglist::{is_active, make_target};
use crate::registry::{RegistryIndex, RnicRecord};
use crate::topology::{LinkDir, Topology};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FocusParams {
    /// Components focused at once (the strongest suspects); 0 turns it off.
    pub max_components: usize,
    /// FOCUS targets per component (one per source RNIC).
    pub sources: usize,
    /// Flow labels per FOCUS target.
    pub labels: usize,
    /// Windows a component stays focused after it was last suspected.
    pub hold_windows: u32,
    pub active_threshold_sec: u64,
}

impl Default for FocusParams {
    fn default() -> Self {
        FocusParams {
            max_components: 8,
            sources: 4,
            labels: 8,
            hold_windows: 2,
            active_threshold_sec: 300,
        }
    }
}

pub struct FocusPlanner {
    params: FocusParams,
    /// Focused components and the windows each has left.
    held: BTreeMap<Component, u32>,
    /// The suspects' targets, by source GID.
    planned: HashMap<String, Vec<PingTarget>>,
    /// Operators' on-demand traces (`crate::trace`): (source GID, target) by trace id.
    traces: BTreeMap<u64, (String, PingTarget)>,
    /// `planned` and the traces: what agents get.
    lists: HashMap<String, Vec<PingTarget>>,
    generation: u64,
}

fn hash(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
        h = (h ^ 0xff).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^ (h >> 29)
}

fn key_of(c: &Component) -> String {
    format!("{c:?}")
}

impl FocusPlanner {
    pub fn new(params: FocusParams) -> Self {
        FocusPlanner {
            params,
            held: BTreeMap::new(),
            planned: HashMap::new(),
            traces: BTreeMap::new(),
            lists: HashMap::new(),
            generation: 0,
        }
    }

    /// Changes whenever the lists change (0: never any list).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The FOCUS list of the RNIC with GID `gid`.
    pub fn targets_for(&self, gid: &str) -> &[PingTarget] {
        self.lists.get(gid).map_or(&[], |v| v.as_slice())
    }

    /// FOCUS targets handed out now, over every RNIC.
    pub fn target_count(&self) -> usize {
        self.lists.values().map(Vec::len).sum()
    }

    pub fn focused(&self) -> impl Iterator<Item = &Component> {
        self.held.keys()
    }

    /// One localized window: the suspects focus (or stay focused), the others age out.
    /// Returns whether the lists changed.
    pub fn update(
        &mut self,
        suspects: &[Suspect],
        index: &RegistryIndex,
        topo: Option<&Topology>,
        now_sec: u64,
    ) -> bool {
        let p = self.params;
        for n in self.held.values_mut() {
            *n = n.saturating_sub(1);
        }
        self.held.retain(|_, n| *n > 0);
        if p.max_components > 0 {
            for s in suspects.iter().filter(|s| s.test != Test::Stall) {
                if !matches!(s.component, Component::Host(_)) {
                    self.held.insert(s.component.clone(), p.hold_windows.max(1));
                }
            }
        }
        // The strongest first (suspects come sorted), the held ones after, up to the cap.
        let mut order: Vec<Component> = Vec::new();
        for s in suspects {
            if self.held.contains_key(&s.component) && !order.contains(&s.component) {
                order.push(s.component.clone());
            }
        }
        for c in self.held.keys() {
            if !order.contains(c) {
                order.push(c.clone());
            }
        }
        order.truncate(p.max_components);
        self.held.retain(|c, _| order.contains(c));
        let mut lists: HashMap<String, Vec<PingTarget>> = HashMap::new();
        for c in &order {
            for (src, t) in self.plan(c, index, topo, now_sec) {
                let l = lists.entry(src).or_default();
                if !l.iter().any(|x| x.target_gid == t.target_gid) {
                    l.push(t);
                }
            }
        }
        self.planned = lists;
        self.rebuild()
    }

    /// Adds an on-demand trace's target (probed by `src`); returns whether the lists
    /// changed.
    pub fn start_trace(&mut self, id: u64, src: String, t: PingTarget) -> bool {
        self.traces.insert(id, (src, t));
        self.rebuild()
    }

    /// Drops trace `id`'s target; returns whether the lists changed.
    pub fn end_trace(&mut self, id: u64) -> bool {
        self.traces.remove(&id).is_some() && self.rebuild()
    }

    /// The lists from the suspects' targets and the traces'; a new generation when they
    /// changed.
    fn rebuild(&mut self) -> bool {
        let mut lists = self.planned.clone();
        for (src, t) in self.traces.values() {
            let l = lists.entry(src.clone()).or_default();
            // A trace replaces a suspect's target to the same RNIC: its labels are asked for.
            l.retain(|x| x.target_gid != t.target_gid);
            l.push(t.clone());
        }
        let changed = lists != self.lists;
        if changed {
            self.lists = lists;
            self.generation += 1;
        }
        changed
    }

    /// (source GID, target) pairs whose probes cross `c`.
    fn plan(
        &self,
        c: &Component,
        index: &RegistryIndex,
        topo: Option<&Topology>,
        now: u64,
    ) -> Vec<(String, PingTarget)> {
        let key = key_of(c);
        let p = self.params;
        let active = |tor: &str| -> Vec<&RnicRecord> {
            index
                .tor_gids(tor)
                .iter()
                .filter_map(|g| index.rnic(g))
                .filter(|r| is_active(r, now, p.active_threshold_sec))
                .collect()
        };
        let pick = |v: &[&'_ RnicRecord], salt: usize| -> Option<RnicRecord> {
            if v.is_empty() {
                return None;
            }
            let h = hash(&[key.as_bytes(), &salt.to_le_bytes()]);
            Some(v[(h % v.len() as u64) as usize].clone())
        };
        // Other ToRs with an active RNIC, in a stable order.
        let other_tors = |tor: &str| -> Vec<String> {
            (0..index.tor_count())
                .map(|i| index.tor_at(i).0.to_string())
                .filter(|t| t != tor && !active(t).is_empty())
                .collect()
        };
        let mut out = Vec::new();
        let mut pair = |src: &RnicRecord, dst: &RnicRecord, labels: Vec<u32>| {
            if src.gid == dst.gid || labels.is_empty() {
                return;
            }
            let mut t = make_target(dst, PinglistType::Focus, labels.len() as u32, &src.gid);
            t.flow_label = labels[0];
            t.flow_labels = labels;
            out.push((src.gid.clone(), t));
        };
        let any_labels = |salt: usize| -> Vec<u32> {
            (0..p.labels)
                .map(|i| {
                    (hash(&[key.as_bytes(), &salt.to_le_bytes(), &i.to_le_bytes()]) & 0xF_FFFF)
                        as u32
                })
                .collect()
        };
        match c {
            Component::Link(t, s, _) | Component::Cable(t, s) => {
                let dirs: &[LinkDir] = match c {
                    Component::Link(_, _, LinkDir::Up) => &[LinkDir::Up],
                    Component::Link(_, _, LinkDir::Down) => &[LinkDir::Down],
                    _ => &[LinkDir::Up, LinkDir::Down],
                };
                let Some(topo) = topo else { return out };
                let tor = topo.tor_name(*t).to_string();
                let here = active(&tor);
                let others = other_tors(&tor);
                for j in 0..p.sources {
                    if others.is_empty() {
                        break;
                    }
                    let h = hash(&[key.as_bytes(), b"tor", &j.to_le_bytes()]);
                    let far = &others[(h % others.len() as u64) as usize];
                    let there = active(far);
                    let (Some(a), Some(b)) = (pick(&here, j), pick(&there, j + 1000)) else {
                        continue;
                    };
                    let Some(ft) = topo.tor_index(far) else {
                        continue;
                    };
                    // Up: the probe leaves `tor` over the link; down: it arrives over it.
                    let (src, dst, ts, td) = match dirs[j % dirs.len()] {
                        LinkDir::Up => (&a, &b, *t, ft),
                        LinkDir::Down => (&b, &a, ft, *t),
                    };
                    let labels = labels_over(topo, ts, td, &src.gid, &dst.gid, *s, p.labels, &key);
                    pair(src, dst, labels);
                }
            }
            Component::Rnic(gid) => {
                let Some(me) = index.rnic(gid).cloned() else {
                    return out;
                };
                let mut peers: Vec<&RnicRecord> = active(&me.tor_id);
                for t in other_tors(&me.tor_id).iter().take(p.sources) {
                    peers.extend(active(t).into_iter().take(1));
                }
                peers.retain(|r| r.gid != me.gid);
                for j in 0..p.sources {
                    let Some(peer) = pick(&peers, j) else { break };
                    // Half from it, half to it: both directions of its link.
                    if j % 2 == 0 {
                        pair(&me, &peer, any_labels(j));
                    } else {
                        pair(&peer, &me, any_labels(j));
                    }
                }
            }
            Component::Tor(tor) | Component::TorSide(tor) => {
                let here = active(tor);
                let others = other_tors(tor);
                for j in 0..p.sources {
                    if others.is_empty() {
                        break;
                    }
                    let h = hash(&[key.as_bytes(), b"tor", &j.to_le_bytes()]);
                    let there = active(&others[(h % others.len() as u64) as usize]);
                    let (Some(a), Some(b)) = (pick(&here, j), pick(&there, j + 1000)) else {
                        continue;
                    };
                    if j % 2 == 0 {
                        pair(&a, &b, any_labels(j));
                    } else {
                        pair(&b, &a, any_labels(j));
                    }
                }
            }
            Component::Host(_) => {}
        }
        out
    }
}

/// Up to `n` flow labels whose probe from `src` (on ToR `ts`) to `dst` (on `td`) crosses
/// spine `spine`, by the topology's ECMP model.
#[allow(clippy::too_many_arguments)]
fn labels_over(
    topo: &Topology,
    ts: u32,
    td: u32,
    src: &str,
    dst: &str,
    spine: u32,
    n: usize,
    key: &str,
) -> Vec<u32> {
    let Some(route) = topo.pair_route(ts, td, src, dst) else {
        return Vec::new();
    };
    let base = hash(&[key.as_bytes(), src.as_bytes(), dst.as_bytes()]);
    let mut out = Vec::new();
    for i in 0..(64 * n as u64).max(64) {
        let label = ((base.wrapping_add(i.wrapping_mul(0x9E37_79B9))) & 0xF_FFFF) as u32;
        if route.spine(label) == spine && !out.contains(&label) {
            out.push(label);
            if out.len() >= n {
                break;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{AgentRecord, RnicRecord};
    use crate::topology::EcmpModel;

    fn fabric() -> (RegistryIndex, Topology) {
        let mut idx = RegistryIndex::default();
        let tors: Vec<String> = (1..=4).map(|t| format!("tor{t}")).collect();
        for (ti, t) in tors.iter().enumerate() {
            for i in 0..4 {
                let agent = format!("a{ti}-{i}");
                let rec = RnicRecord {
                    gid: format!("fd00:0000:0000:0000:0000:0000:{:04x}:{:04x}", ti + 1, i + 1),
                    qpn: 1,
                    ip_address: String::new(),
                    host_name: agent.clone(),
                    tor_id: t.clone(),
                    device_name: "r0".into(),
                    agent_id: agent.clone(),
                    last_updated: 1000,
                };
                let a = AgentRecord {
                    agent_id: agent.clone(),
                    agent_ip: String::new(),
                    hostname: agent,
                    tor_id: t.clone(),
                    last_updated: 1000,
                };
                idx.register_agent(&a, &[rec], 1000);
            }
        }
        let spines: Vec<String> = (1..=4).map(|s| format!("spine{s}")).collect();
        (
            idx,
            Topology::full_mesh(&tors, &spines, Some(EcmpModel::Fnv1a { seed: 3 })),
        )
    }

    fn suspect(c: Component) -> Suspect {
        Suspect {
            component: c,
            test: Test::Loss,
            score: 8.0,
        }
    }

    #[test]
    fn a_suspect_link_gets_labels_that_cross_it_then_ages_out() {
        let (idx, topo) = fabric();
        let mut f = FocusPlanner::new(FocusParams::default());
        assert_eq!(f.generation(), 0);
        for dir in [LinkDir::Up, LinkDir::Down] {
            let link = Component::Link(1, 2, dir);
            assert!(f.update(&[suspect(link.clone())], &idx, Some(&topo), 1000));
            let mut n = 0;
            for r in idx.rnics() {
                for t in f.targets_for(&r.gid) {
                    n += 1;
                    assert_eq!(t.pinglist_type, PinglistType::Focus as i32);
                    assert_eq!(t.flow_labels.len(), 8);
                    let src = idx.rnic(&r.gid).unwrap();
                    let (ts, td) = (
                        topo.tor_index(&src.tor_id).unwrap(),
                        topo.tor_index(&t.target_tor_id).unwrap(),
                    );
                    // Up from tor2 (index 1), or down into it, over spine3 (index 2).
                    match dir {
                        LinkDir::Up => assert_eq!(ts, 1),
                        LinkDir::Down => assert_eq!(td, 1),
                    }
                    for &l in &t.flow_labels {
                        assert_eq!(topo.spine_of(ts, td, &r.gid, &t.target_gid, l), Some(2));
                    }
                }
            }
            assert!((1..=4).contains(&n), "{n}");
            // The same suspicion again changes nothing; then it is held, then dropped.
            let g = f.generation();
            assert!(!f.update(&[suspect(link.clone())], &idx, Some(&topo), 1000));
            assert_eq!(f.generation(), g);
            assert!(!f.update(&[], &idx, Some(&topo), 1000), "held a window");
            assert!(f.update(&[], &idx, Some(&topo), 1000), "then dropped");
            assert_eq!(f.target_count(), 0);
        }
    }

    #[test]
    fn bounded_and_off() {
        let (idx, topo) = fabric();
        let many: Vec<Suspect> = (0..4)
            .flat_map(|t| (0..4).map(move |s| suspect(Component::Link(t, s, LinkDir::Up))))
            .collect();
        let mut f = FocusPlanner::new(FocusParams::default());
        f.update(&many, &idx, Some(&topo), 1000);
        assert_eq!(f.focused().count(), 8);
        assert!(f.target_count() <= 8 * 4);
        let mut off = FocusPlanner::new(FocusParams {
            max_components: 0,
            ..FocusParams::default()
        });
        assert!(!off.update(&many, &idx, Some(&topo), 1000));
        assert_eq!(off.target_count(), 0);
        // An RNIC: probes from it and to it; a stall: nothing to probe.
        let gid = idx.tor_gids("tor1")[0].clone();
        let mut r = FocusPlanner::new(FocusParams::default());
        r.update(
            &[suspect(Component::Rnic(gid.clone()))],
            &idx,
            Some(&topo),
            1000,
        );
        let from = r.targets_for(&gid).len();
        let to: usize = idx
            .rnics()
            .map(|x| {
                r.targets_for(&x.gid)
                    .iter()
                    .filter(|t| t.target_gid == gid)
                    .count()
            })
            .sum();
        assert!(from >= 1 && to >= 1, "{from} {to}");
        let mut h = FocusPlanner::new(FocusParams::default());
        assert!(!h.update(
            &[Suspect {
                component: Component::Host("h".into()),
                test: Test::Stall,
                score: 9.0
            }],
            &idx,
            Some(&topo),
            1000
        ));
    }
}
