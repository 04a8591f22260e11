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

pub struct PlacedPath<'a> {
    pub s: &'a PathSummary,
    /// Index into the window's path list.
    pub index: u32,
    pub src: u32,
    pub dst: u32,
}

impl PlacedPath<'_> {
    pub fn src_gid<'p>(&self, p: &'p Placed<'_>) -> &'p str {
        p.rnics[self.src as usize].gid
    }
    pub fn dst_gid<'p>(&self, p: &'p Placed<'_>) -> &'p str {
        p.rnics[self.dst as usize].gid
    }
}

pub struct Placed<'a> {
    pub rnics: Vec<RnicPlace<'a>>,
    pub hosts: Names,
    pub tors: Names,
    /// Per ToR (as interned here), its index in the topology, when it has one.
    pub topo_tors: Vec<Option<u32>>,
    pub paths: Vec<PlacedPath<'a>>,
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
        };
        // Caller's RNIC id -> index in `rnics`.
        let mut slot: Vec<u32> = Vec::new();
        for (i, w) in paths.iter().enumerate() {
            let s = w.summary;
            if s.probe_total == 0 {
                continue;
            }
            let src = p.rnic(&mut slot, w.src, &s.source_gid, &s.source_tor_id, inv);
            let dst = p.rnic(&mut slot, w.dst, &s.target_gid, &s.target_tor_id, inv);
            if src == dst {
                continue;
            }
            p.paths.push(PlacedPath {
                s,
                index: i as u32,
                src,
                dst,
            });
        }
        p.topo_tors = p
            .tors
            .names
            .iter()
            .map(|t| topo.and_then(|tp| tp.tor_index(t)))
            .collect();
        p
    }

    fn rnic(
        &mut self,
        slot: &mut Vec<u32>,
        id: u32,
        gid: &'a str,
        reported_tor: &str,
        inv: &dyn Inventory,
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

    pub fn host_of(&self, r: u32) -> u32 {
        self.rnics[r as usize].host
    }

    pub fn tor_of(&self, r: u32) -> u32 {
        self.rnics[r as usize].tor
    }

    /// The topology index of RNIC `r`'s ToR.
    pub fn topo_tor_of(&self, r: u32) -> Option<u32> {
        self.topo_tors[self.tor_of(r) as usize]
    }
}
