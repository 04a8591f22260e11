//! The simulated fabric: ToRs, spines, hosts and RNICs with their names, GIDs and QPNs,
//! the ECMP topology (the controller's own [`Topology`] with the `fnv1a` model: the
//! fabric's hash IS `Topology::spine_of`) and the registry index the pinglists are
//! computed from.
//!
//! Names: ToRs `tor1..`, spines `spine1..`, links `tor<t>-spine<s>`, hosts `h<g>-<i>`,
//! RNICs `h<g>-<i>/r<j>` (device `r<j>`, j from 0). Without rail optimization host
//! `h<t>-<i>` has all its RNICs on `tor<t>`; with it, the ToRs form groups ("rails") of
//! `rnics_per_host` consecutive ToRs and host `h<g>-<i>` puts RNIC `j` on
//! `tor<(g-1)*rnics_per_host + j + 1>`.

use std::net::Ipv6Addr;
use std::sync::Arc;

use rpingmesh_controller::registry::{AgentRecord, RegistryIndex, RnicRecord};
use rpingmesh_controller::topology::{EcmpModel, Topology};
use rpingmesh_proto::gid::format_gid;

/// A location as scenario files write it (numbers are the 1-based name numbers; `j` is
/// the device number, from 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    Tor { t: u32 },
    Link { t: u32, s: u32 },
    Host { g: u32, i: u32 },
    Rnic { g: u32, i: u32, j: u32 },
}

impl Location {
    pub(crate) fn describe(&self) -> &'static str {
        match self {
            Location::Tor { .. } => "a ToR",
            Location::Link { .. } => "a ToR-spine link",
            Location::Host { .. } => "a host",
            Location::Rnic { .. } => "an RNIC",
        }
    }
}

/// A decimal without sign or leading zero (names are canonical: `tor01` is not `tor1`).
fn canonical_number(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || (s.len() > 1 && s.starts_with('0'))
    {
        return None;
    }
    s.parse().ok()
}

/// Parses a location's form (not whether it exists): `tor<t>`, `tor<t>-spine<s>`,
/// `h<g>-<i>`, `h<g>-<i>/r<j>`.
pub fn parse_location(s: &str) -> Option<Location> {
    if let Some(rest) = s.strip_prefix("tor") {
        return match rest.split_once("-spine") {
            Some((t, sp)) => Some(Location::Link {
                t: canonical_number(t)?,
                s: canonical_number(sp)?,
            }),
            None => Some(Location::Tor {
                t: canonical_number(rest)?,
            }),
        };
    }
    let rest = s.strip_prefix('h')?;
    let (host, dev) = match rest.split_once('/') {
        Some((h, d)) => (h, Some(d)),
        None => (rest, None),
    };
    let (g, i) = host.split_once('-')?;
    let (g, i) = (canonical_number(g)?, canonical_number(i)?);
    match dev {
        None => Some(Location::Host { g, i }),
        Some(d) => Some(Location::Rnic {
            g,
            i,
            j: canonical_number(d.strip_prefix('r')?)?,
        }),
    }
}

/// One RNIC of the fabric.
#[derive(Debug, Clone)]
pub struct Rnic {
    /// `h<g>-<i>/r<j>`: what the localizer names it.
    pub name: String,
    pub host: u32,
    pub device: String,
    /// ToR index (0-based; the ToR is named `tor<tor+1>`).
    pub tor: u32,
    /// Full GID text form.
    pub gid: Arc<str>,
    pub qpn: u32,
}

#[derive(Debug, Clone)]
pub struct Host {
    /// `h<g>-<i>`
    pub name: String,
    /// Indices into `Fabric::rnics`, by device number.
    pub rnics: Vec<u32>,
}

/// The two-tier Clos fabric (see the crate documentation for the naming and the rail
/// layout).
#[derive(Debug, Clone, PartialEq)]
pub struct FabricSpec {
    pub tors: u32,
    pub spines: u32,
    pub hosts_per_tor: u32,
    pub rnics_per_host: u32,
    pub rail_optimized: bool,
    /// Per link traversal (host-ToR, ToR-spine, spine-ToR, ToR-host).
    pub link_latency_us: f64,
    /// Each traversal adds uniform [0, link_jitter_us).
    pub link_jitter_us: f64,
}

impl FabricSpec {
    /// Hosts per rail group (rail_optimized) or per ToR.
    pub fn host_groups(&self) -> u32 {
        if self.rail_optimized {
            self.tors / self.rnics_per_host
        } else {
            self.tors
        }
    }
}

/// The built fabric.
#[derive(Debug, Clone)]
pub struct Fabric {
    pub spec: FabricSpec,
    pub tors: Vec<Arc<str>>,
    pub spines: Vec<String>,
    pub hosts: Vec<Host>,
    pub rnics: Vec<Rnic>,
    /// The RNICs under each ToR.
    pub tor_rnics: Vec<Vec<u32>>,
    pub topology: Topology,
}

impl Fabric {
    /// Builds the fabric of `spec` (assumed valid); `ecmp_seed` seeds the ECMP hash.
    pub fn new(spec: &FabricSpec, ecmp_seed: u32) -> Fabric {
        let tors: Vec<Arc<str>> = (1..=spec.tors)
            .map(|t| Arc::from(format!("tor{t}")))
            .collect();
        let spines: Vec<String> = (1..=spec.spines).map(|s| format!("spine{s}")).collect();
        let mut hosts = Vec::new();
        let mut rnics = Vec::new();
        let mut tor_rnics = vec![Vec::new(); spec.tors as usize];
        let r = spec.rnics_per_host;
        for g in 1..=spec.host_groups() {
            for i in 1..=spec.hosts_per_tor {
                let name = format!("h{g}-{i}");
                let host_idx = hosts.len() as u32;
                let mut own = Vec::with_capacity(r as usize);
                for j in 0..r {
                    let tor = if spec.rail_optimized {
                        (g - 1) * r + j
                    } else {
                        g - 1
                    };
                    let idx = rnics.len() as u32;
                    // fd00::<g>:<i>:<j>:1 in the full text form; unique per RNIC.
                    let gid = format_gid(&Ipv6Addr::new(
                        0xfd00, 0, 0, 0, g as u16, i as u16, j as u16, 1,
                    ));
                    rnics.push(Rnic {
                        name: format!("{name}/r{j}"),
                        host: host_idx,
                        device: format!("r{j}"),
                        tor,
                        gid: gid.into(),
                        qpn: 0x100 + idx,
                    });
                    tor_rnics[tor as usize].push(idx);
                    own.push(idx);
                }
                hosts.push(Host { name, rnics: own });
            }
        }
        let tor_names: Vec<String> = tors.iter().map(|t| t.to_string()).collect();
        let topology = Topology::full_mesh(
            &tor_names,
            &spines,
            Some(EcmpModel::Fnv1a { seed: ecmp_seed }),
        );
        Fabric {
            spec: spec.clone(),
            tors,
            spines,
            hosts,
            rnics,
            tor_rnics,
            topology,
        }
    }

    /// The RNIC index of `h<g>-<i>/r<j>`.
    pub fn rnic_index(&self, name: &str) -> Option<u32> {
        match parse_location(name)? {
            Location::Rnic { g, i, j } => {
                let h = self.host_index_of(g, i)?;
                self.hosts[h as usize].rnics.get(j as usize).copied()
            }
            _ => None,
        }
    }

    /// The host index of `h<g>-<i>`.
    pub fn host_index(&self, name: &str) -> Option<u32> {
        match parse_location(name)? {
            Location::Host { g, i } => self.host_index_of(g, i),
            _ => None,
        }
    }

    fn host_index_of(&self, g: u32, i: u32) -> Option<u32> {
        let (groups, per) = (self.spec.host_groups(), self.spec.hosts_per_tor);
        if g == 0 || g > groups || i == 0 || i > per {
            return None;
        }
        Some((g - 1) * per + (i - 1))
    }

    /// The ToR index of `tor<t>`.
    pub fn tor_index(&self, name: &str) -> Option<u32> {
        match parse_location(name)? {
            Location::Tor { t } if t >= 1 && t <= self.spec.tors => Some(t - 1),
            _ => None,
        }
    }

    /// (ToR index, spine index) of `tor<t>-spine<s>`.
    pub fn link_index(&self, name: &str) -> Option<(u32, u32)> {
        match parse_location(name)? {
            Location::Link { t, s }
                if t >= 1 && t <= self.spec.tors && s >= 1 && s <= self.spec.spines =>
            {
                Some((t - 1, s - 1))
            }
            _ => None,
        }
    }

    /// The spine a packet from RNIC `src` to RNIC `dst` with `label` crosses (None when
    /// both are under one ToR): the controller topology's hash.
    pub fn spine_of(&self, src: u32, dst: u32, label: u32) -> Option<u32> {
        let (a, b) = (&self.rnics[src as usize], &self.rnics[dst as usize]);
        self.topology.spine_of(a.tor, b.tor, &a.gid, &b.gid, label)
    }

    /// The registry index the controller would hold after every agent (one per host)
    /// registered its RNICs at `now_sec`.
    pub fn registry_index(&self, now_sec: u64) -> RegistryIndex {
        let mut idx = RegistryIndex::default();
        for h in &self.hosts {
            let first_tor = &self.tors[self.rnics[h.rnics[0] as usize].tor as usize];
            let agent = AgentRecord {
                agent_id: h.name.clone(),
                agent_ip: String::new(),
                hostname: h.name.clone(),
                tor_id: first_tor.to_string(),
                last_updated: now_sec,
            };
            let recs: Vec<RnicRecord> = h
                .rnics
                .iter()
                .map(|&r| {
                    let r = &self.rnics[r as usize];
                    RnicRecord {
                        gid: r.gid.to_string(),
                        qpn: r.qpn,
                        ip_address: r.gid.to_string(),
                        host_name: h.name.clone(),
                        tor_id: self.tors[r.tor as usize].to_string(),
                        device_name: r.device.clone(),
                        agent_id: h.name.clone(),
                        last_updated: now_sec,
                    }
                })
                .collect();
            idx.register_agent(&agent, &recs, now_sec);
        }
        idx
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rpingmesh_controller::localize::Inventory;
    use std::collections::{BTreeMap, HashSet};

    fn spec(tors: u32, hosts: u32, rnics: u32, rail: bool) -> FabricSpec {
        FabricSpec {
            tors,
            spines: 4,
            hosts_per_tor: hosts,
            rnics_per_host: rnics,
            rail_optimized: rail,
            link_latency_us: 2.0,
            link_jitter_us: 0.3,
        }
    }

    #[test]
    fn locations_parse_by_form() {
        assert_eq!(parse_location("tor3"), Some(Location::Tor { t: 3 }));
        assert_eq!(
            parse_location("tor12-spine4"),
            Some(Location::Link { t: 12, s: 4 })
        );
        assert_eq!(parse_location("h3-2"), Some(Location::Host { g: 3, i: 2 }));
        assert_eq!(
            parse_location("h3-2/r1"),
            Some(Location::Rnic { g: 3, i: 2, j: 1 })
        );
        for bad in [
            "",
            "tor",
            "tor-1",
            "tor01",
            "spine1",
            "tor1-spine",
            "h3",
            "h3-",
            "h-2",
            "h3-2/",
            "h3-2/1",
            "h3-2/r",
            "x3-2",
            "h3-2/r1/x",
            "tor1-spine1-x",
            "h+3-2",
            "tor 1",
        ] {
            assert_eq!(parse_location(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn plain_fabric_puts_a_hosts_rnics_on_its_tor() {
        let f = Fabric::new(&spec(3, 2, 2, false), 0);
        assert_eq!(f.rnics.len(), 12);
        assert_eq!(f.hosts.len(), 6);
        let r = &f.rnics[f.rnic_index("h2-1/r1").unwrap() as usize];
        assert_eq!(
            (r.name.as_str(), r.device.as_str(), &*f.tors[r.tor as usize]),
            ("h2-1/r1", "r1", "tor2")
        );
        assert_eq!(f.hosts[r.host as usize].name, "h2-1");
        assert_eq!(&*r.gid, "fd00:0000:0000:0000:0002:0001:0001:0001");
        for t in 0..3 {
            let names: Vec<_> = f.tor_rnics[t]
                .iter()
                .map(|&r| f.rnics[r as usize].name.as_str())
                .collect();
            let n = t + 1;
            assert_eq!(
                names,
                [
                    format!("h{n}-1/r0"),
                    format!("h{n}-1/r1"),
                    format!("h{n}-2/r0"),
                    format!("h{n}-2/r1")
                ]
            );
        }
        // GIDs and QPNs are unique.
        let gids: HashSet<_> = f.rnics.iter().map(|r| r.gid.clone()).collect();
        let qpns: HashSet<_> = f.rnics.iter().map(|r| r.qpn).collect();
        assert_eq!((gids.len(), qpns.len()), (12, 12));
        assert_eq!(f.host_index("h3-2"), Some(5));
        assert_eq!(f.host_index("h4-1"), None);
        assert_eq!(f.tor_index("tor3"), Some(2));
        assert_eq!(f.tor_index("tor4"), None);
        assert_eq!(f.link_index("tor3-spine4"), Some((2, 3)));
        assert_eq!(f.link_index("tor3-spine5"), None);
        assert_eq!(f.rnic_index("h1-1/r2"), None);
    }

    #[test]
    fn rail_fabric_spreads_a_hosts_rnics_over_its_rail_group() {
        // 8 ToRs in rails of 4: groups 1 and 2; host h2-3 has r0..r3 on tor5..tor8.
        let f = Fabric::new(&spec(8, 3, 4, true), 0);
        assert_eq!(f.hosts.len(), 2 * 3);
        assert_eq!(f.rnics.len(), 8 * 3);
        let h = &f.hosts[f.host_index("h2-3").unwrap() as usize];
        let tors: Vec<_> = h
            .rnics
            .iter()
            .map(|&r| f.tors[f.rnics[r as usize].tor as usize].to_string())
            .collect();
        assert_eq!(tors, ["tor5", "tor6", "tor7", "tor8"]);
        let h = &f.hosts[f.host_index("h1-1").unwrap() as usize];
        assert_eq!(f.rnics[h.rnics[3] as usize].tor, 3);
        // Every ToR has one RNIC of each host of its group: hosts_per_tor RNICs.
        for t in 0..8 {
            assert_eq!(f.tor_rnics[t].len(), 3, "tor{}", t + 1);
            let devs: HashSet<_> = f.tor_rnics[t]
                .iter()
                .map(|&r| f.rnics[r as usize].device.clone())
                .collect();
            assert_eq!(devs.len(), 1, "one rail per ToR");
        }
        assert_eq!(f.host_index("h3-1"), None);
    }

    #[test]
    fn registry_index_places_every_rnic() {
        let f = Fabric::new(&spec(4, 2, 2, true), 0);
        let idx = f.registry_index(1000);
        assert_eq!(idx.len(), f.rnics.len());
        assert_eq!(idx.tor_count(), 4);
        for r in &f.rnics {
            let p = idx.place(&r.gid).unwrap();
            assert_eq!(format!("{}/{}", p.host, p.device), r.name);
            assert_eq!(p.tor, &*f.tors[r.tor as usize]);
        }
    }

    #[test]
    fn ecmp_spreads_the_labels_of_a_pair_over_every_spine() {
        use rpingmesh_protocol::flowlabel::FlowLabelSet;
        let f = Fabric::new(&spec(4, 2, 2, false), 7);
        let (a, b) = (
            f.rnic_index("h1-1/r0").unwrap(),
            f.rnic_index("h3-2/r1").unwrap(),
        );
        // The 64 labels the controller's seed gives this pair, in both directions,
        // and over many pairs: every spine, roughly a quarter each.
        let mut total: BTreeMap<u32, usize> = BTreeMap::new();
        let mut n = 0;
        for (src, dst) in [(a, b), (b, a)] {
            let seed = rpingmesh_controller::pinglist::flow_label_seed(
                &f.rnics[src as usize].gid,
                &f.rnics[dst as usize].gid,
            );
            let set = FlowLabelSet::new(seed, 64, seed);
            let mut per: BTreeMap<u32, usize> = BTreeMap::new();
            for i in 0..64 {
                *per.entry(f.spine_of(src, dst, set.label(i, 0)).unwrap())
                    .or_default() += 1;
            }
            assert_eq!(per.len(), 4, "{per:?}");
            assert!(per.values().all(|&c| (6..=26).contains(&c)), "{per:?}");
        }
        for src in 0..f.rnics.len() as u32 {
            for dst in 0..f.rnics.len() as u32 {
                if f.rnics[src as usize].tor == f.rnics[dst as usize].tor {
                    assert_eq!(f.spine_of(src, dst, 1), None, "ToR-local");
                    continue;
                }
                for label in 0..64 {
                    *total
                        .entry(f.spine_of(src, dst, label * 4099).unwrap())
                        .or_default() += 1;
                    n += 1;
                }
            }
        }
        for (s, c) in &total {
            let share = *c as f64 / n as f64;
            assert!((share - 0.25).abs() < 0.02, "spine {s}: {share}");
        }
    }
}
