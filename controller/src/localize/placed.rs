//! One window's path summaries with every endpoint placed (RNIC, host, ToR), interned
//! once for every stage of localization (pure).
//!
//! Paths arrive with their two RNICs as ids the caller already interned (the analyzer's
//! GID ids), so placing a window of a million paths costs an array lookup per end; a
//! GID string is hashed once per RNIC, for the inventory.

// Windows hold millions of lookups: a fast hasher, no DoS concern on our own keys.
use foldhash::{HashMap, HashMapExt};

use rpingmesh_proto::controller_agent::PathSummary;

use super::Inventory;
use crate::topology::Topology;

/// One path of a window: its summary and its two RNICs as ids interned by the caller
/// (equal GIDs, equal ids), dense: placing allocates a table as long as the largest.
#[derive(Debug, Clone, Copy)]
pub struct WindowPath<'a> {
    pub src: u32,
    pub dst: u32,
    pub summary: &'a PathSummary,
}

impl<'a> WindowPath<'a> {
    /// Paths whose GIDs are not interned yet (tests, callers without ids).
    pub fn intern(paths: impl IntoIterator<Item = &'a PathSummary>) -> Vec<WindowPath<'a>> {
        let mut ids: HashMap<&'a str, u32> = HashMap::new();
        let mut id = |g: &'a str| {
            let n = ids.len() as u32;
            *ids.entry(g).or_insert(n)
        };
        paths
            .into_iter()
            .map(|s| WindowPath {
                src: id(&s.source_gid),
                dst: id(&s.target_gid),
                summary: s,
            })
            .collect()
    }
}

/// Interned names (ToRs, hosts): windows see each many times.
#[derive(Default)]
pub struct Names {
    ids: HashMap<String, u32>,
    pub names: Vec<String>,
}

impl Names {
    pub fn id(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.ids.get(name) {
            return i;
        }
        let i = self.names.len() as u32;
        self.ids.insert(name.to_string(), i);
        self.names.push(name.to_string());
        i
    }
}

pub struct RnicPlace<'a> {
    pub gid: &'a str,
    pub host: u32,
    pub tor: u32,
    /// `<host>/<device>` (the GID when the inventory does not know it).
    pub name: String,
}

/// The numbers of a summary every stage reads, copied out once: a window's summaries lie
/// scattered over the heap, and each stage's pass over a million of them waited on
/// memory more than it computed.
#[derive(Debug, Clone, Copy)]
pub struct PathNumbers {
    pub probe_total: u32,
    pub probe_failed: u32,
    pub probe_success: u32,
    pub invalid_rtt_count: u32,
    pub network_rtt_min_ns: u64,
    pub network_rtt_p50_ns: u64,
    pub network_rtt_p99_ns: u64,
    pub prober_delay_p50_ns: u64,
    pub prober_delay_p99_ns: u64,
    pub responder_delay_p50_ns: u64,
    pub responder_delay_p99_ns: u64,
    /// Whether the summary has per-label detail.
    pub has_labels: bool,
}

impl PathNumbers {
    pub fn of(s: &PathSummary) -> Self {
        PathNumbers {
            probe_total: s.probe_total,
            probe_failed: s.probe_failed,
            probe_success: s.probe_success,
            invalid_rtt_count: s.invalid_rtt_count,
            network_rtt_min_ns: s.network_rtt_min_ns,
            network_rtt_p50_ns: s.network_rtt_p50_ns,
            network_rtt_p99_ns: s.network_rtt_p99_ns,
            prober_delay_p50_ns: s.prober_delay_p50_ns,
            prober_delay_p99_ns: s.prober_delay_p99_ns,
            responder_delay_p50_ns: s.responder_delay_p50_ns,
            responder_delay_p99_ns: s.responder_delay_p99_ns,
            has_labels: !s.flow_labels.is_empty(),
        }
    }
}

pub struct PlacedPath<'a> {
    /// The summary, for what is read rarely (GIDs, per-label detail).
    pub s: &'a PathSummary,
    pub n: PathNumbers,
    /// Index into the window's path list.
    pub index: u32,
    pub src: u32,
    pub dst: u32,
    /// Hosts and ToRs of `src` and `dst` (as `host_of`, `tor_of` say).
    pub hosts: [u32; 2],
    pub tors: [u32; 2],
    /// Where its labels' spines start in `Placed::label_spines`, when it has per-label
    /// detail and the topology routes it (an ECMP model, an inter-ToR path).
    routed: Option<u32>,
}

pub struct Placed<'a> {
    pub rnics: Vec<RnicPlace<'a>>,
    pub hosts: Names,
    pub tors: Names,
    /// Per ToR (as interned here), its index in the topology, when it has one.
    pub topo_tors: Vec<Option<u32>>,
    pub paths: Vec<PlacedPath<'a>>,
    /// The window's length (ms), as its summaries say (the longest).
    pub window_ms: u64,
    /// Per label of each routed path, in order: the spines of its probe and of its ACKs.
    /// Hashed once here for every stage (a window has millions of labels).
    label_spines: Vec<[u32; 2]>,
}

const UNPLACED: u32 = u32::MAX;

impl<'a> Placed<'a> {
    /// Places every path with probes whose two ends differ.
    pub fn new(paths: &[WindowPath<'a>], inv: &dyn Inventory, topo: Option<&Topology>) -> Self {
        let mut p = Placed {
            rnics: Vec::new(),
            hosts: Names::default(),
            tors: Names::default(),
            topo_tors: Vec::new(),
            paths: Vec::with_capacity(paths.len()),
            window_ms: 0,
            label_spines: Vec::new(),
        };
        let ecmp = topo.filter(|t| t.ecmp().is_some());
        // Caller's RNIC id -> index in `rnics`.
        let mut slot: Vec<u32> = Vec::new();
        for (i, w) in paths.iter().enumerate() {
            let s = w.summary;
            if s.probe_total == 0 {
                continue;
            }
            let src = p.rnic(&mut slot, w.src, &s.source_gid, &s.source_tor_id, inv, topo);
            let dst = p.rnic(&mut slot, w.dst, &s.target_gid, &s.target_tor_id, inv, topo);
            if src == dst {
                continue;
            }
            p.window_ms = p.window_ms.max(s.window_duration_ms as u64);
            let (a, b) = (&p.rnics[src as usize], &p.rnics[dst as usize]);
            let (hosts, tors) = ([a.host, b.host], [a.tor, b.tor]);
            let routed = match (
                ecmp,
                p.topo_tors[tors[0] as usize],
                p.topo_tors[tors[1] as usize],
            ) {
                (Some(e), Some(ts), Some(td)) if !s.flow_labels.is_empty() => {
                    p.route_labels(e, ts, td, s)
                }
                _ => None,
            };
            p.paths.push(PlacedPath {
                s,
                n: PathNumbers::of(s),
                index: i as u32,
                src,
                dst,
                hosts,
                tors,
                routed,
            });
        }
        p
    }

    /// Appends the spines of `s`'s labels, probe's way (`ts` to `td`) and back; `None`
    /// when the topology does not route the pair (ToR-local, no spine shared).
    fn route_labels(&mut self, e: &Topology, ts: u32, td: u32, s: &PathSummary) -> Option<u32> {
        let (fwd, rev) = (
            e.pair_route(ts, td, &s.source_gid, &s.target_gid)?,
            e.pair_route(td, ts, &s.target_gid, &s.source_gid)?,
        );
        let start = self.label_spines.len() as u32;
        self.label_spines.extend(
            s.flow_labels
                .iter()
                .map(|l| [fwd.spine(l.flow_label), rev.spine(l.flow_label)]),
        );
        Some(start)
    }

    /// Per label of a routed path (in the order of its `flow_labels`): the spine of its
    /// probe and of its ACKs.
    pub fn label_spines(&self, r: &PlacedPath<'_>) -> Option<&[[u32; 2]]> {
        let start = r.routed? as usize;
        Some(&self.label_spines[start..start + r.s.flow_labels.len()])
    }

    fn rnic(
        &mut self,
        slot: &mut Vec<u32>,
        id: u32,
        gid: &'a str,
        reported_tor: &str,
        inv: &dyn Inventory,
        topo: Option<&Topology>,
    ) -> u32 {
        let k = id as usize;
        if k >= slot.len() {
            slot.resize(k + 1, UNPLACED);
        }
        if slot[k] != UNPLACED {
            return slot[k];
        }
        let (host, tor, name) = match inv.place(gid) {
            Some(pl) => (
                self.hosts.id(pl.host),
                self.tors.id(pl.tor),
                format!("{}/{}", pl.host, pl.device),
            ),
            // Unknown to the registry: its own host, the ToR its peers reported.
            None => (
                self.hosts.id(gid),
                self.tors.id(reported_tor),
                gid.to_string(),
            ),
        };
        if tor as usize == self.topo_tors.len() {
            let name = &self.tors.names[tor as usize];
            self.topo_tors.push(topo.and_then(|t| t.tor_index(name)));
        }
        let i = self.rnics.len() as u32;
        self.rnics.push(RnicPlace {
            gid,
            host,
            tor,
            name,
        });
        slot[k] = i;
        i
    }

    /// The topology indices of a path's two ToRs.
    pub fn topo_tors_of(&self, r: &PlacedPath<'_>) -> (Option<u32>, Option<u32>) {
        let [a, b] = r.tors;
        (self.topo_tors[a as usize], self.topo_tors[b as usize])
    }
}
