//! One window's path summaries with every endpoint placed (RNIC, host, ToR), interned
//! once for the gray detector's stages (pure).

// Windows hold millions of GID lookups: a fast hasher, no DoS concern on our own keys.
use foldhash::{HashMap, HashMapExt};

use rpingmesh_proto::controller_agent::PathSummary;

use super::Inventory;

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
    /// Index into `Placed::paths`' input (the window's path list).
    pub index: u32,
    pub src: u32,
    pub dst: u32,
}

pub struct Placed<'a> {
    pub rnics: Vec<RnicPlace<'a>>,
    rnic_ids: HashMap<&'a str, u32>,
    pub hosts: Names,
    pub tors: Names,
    pub paths: Vec<PlacedPath<'a>>,
}

impl<'a> Placed<'a> {
    /// Places every path with probes whose two ends differ.
    pub fn new(paths: &[&'a PathSummary], inv: &dyn Inventory) -> Self {
        let mut p = Placed {
            rnics: Vec::new(),
            rnic_ids: HashMap::with_capacity(paths.len() / 4),
            hosts: Names::default(),
            tors: Names::default(),
            paths: Vec::with_capacity(paths.len()),
        };
        for (i, s) in paths.iter().enumerate() {
            if s.probe_total == 0 {
                continue;
            }
            let src = p.rnic(&s.source_gid, &s.source_tor_id, inv);
            let dst = p.rnic(&s.target_gid, &s.target_tor_id, inv);
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
        p
    }

    fn rnic(&mut self, gid: &'a str, reported_tor: &str, inv: &dyn Inventory) -> u32 {
        if let Some(&i) = self.rnic_ids.get(gid) {
            return i;
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
        self.rnic_ids.insert(gid, i);
        i
    }

    pub fn host_of(&self, r: u32) -> u32 {
        self.rnics[r as usize].host
    }

    pub fn tor_of(&self, r: u32) -> u32 {
        self.rnics[r as usize].tor
    }
}
