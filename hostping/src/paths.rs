//! The intra-host links a loopback test between an RNIC and an endpoint crosses.
//!
//! Links, named as the text tree and the findings name them:
//! - `pcie:<bdf>`: the PCIe link above a device or a switch (the physical link);
//! - `rp:<bdf>`: a CPU root port's transit, which peer-to-peer traffic between root
//!   ports crosses (the paper's CPU root port fault: paths to memory through the port
//!   are fine, paths through it to another port are not);
//! - `p2p:<bdf>`: a PCIe switch's peer-to-peer routing between its ports (ACS redirects
//!   it up to the root complex when misconfigured);
//! - `mem:<node>`: a NUMA node's memory channels;
//! - `upi:<a>-<b>`: the socket interconnect.

use std::fmt;

use serde::Serialize;

use crate::topology::{link_gbps, HostTopology, PciRole};

/// One intra-host link.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(into = "String")]
pub enum LinkId {
    Pcie(String),
    RootPortTransit(String),
    SwitchP2p(String),
    Memory(u32),
    Upi(u32, u32),
}

impl fmt::Display for LinkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkId::Pcie(b) => write!(f, "pcie:{b}"),
            LinkId::RootPortTransit(b) => write!(f, "rp:{b}"),
            LinkId::SwitchP2p(b) => write!(f, "p2p:{b}"),
            LinkId::Memory(n) => write!(f, "mem:{n}"),
            LinkId::Upi(a, b) => write!(f, "upi:{a}-{b}"),
        }
    }
}

impl From<LinkId> for String {
    fn from(l: LinkId) -> String {
        l.to_string()
    }
}

impl LinkId {
    /// The interconnect between two sockets, whichever way round.
    pub fn upi(a: u32, b: u32) -> Self {
        LinkId::Upi(a.min(b), a.max(b))
    }

    /// What kind of link it is, for findings and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            LinkId::Pcie(_) => "pcie",
            LinkId::RootPortTransit(_) => "root_port",
            LinkId::SwitchP2p(_) => "switch_p2p",
            LinkId::Memory(_) => "memory_channel",
            LinkId::Upi(..) => "upi",
        }
    }
}

/// Where a loopback test writes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    /// A NUMA node's memory.
    Memory(u32),
    /// A GPU's memory, by its PCI address.
    Gpu(String),
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Memory(n) => write!(f, "mem{n}"),
            Endpoint::Gpu(b) => write!(f, "gpu {b}"),
        }
    }
}

/// How far a path goes, which sets what a healthy path of it carries (the paper's
/// Figure 4: a GPU behind the RNIC's own switch at line rate, through the CPU's root
/// complex about 64%, across the sockets about 60%).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Distance {
    SameSwitch,
    LocalMemory,
    RemoteMemory,
    SameSocketRootComplex,
    CrossSocket,
}

impl Distance {
    /// The share of the RNIC's line rate a healthy path of this distance carries.
    pub fn healthy_share(self) -> f64 {
        match self {
            Distance::SameSwitch | Distance::LocalMemory => 1.0,
            Distance::RemoteMemory => 0.9,
            Distance::SameSocketRootComplex => 0.64,
            Distance::CrossSocket => 0.6,
        }
    }
}

/// One RNIC-to-endpoint path.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostPath {
    pub rnic: String,
    pub endpoint: Endpoint,
    pub links: Vec<LinkId>,
    pub distance: Distance,
    /// Whether the endpoint is affinitive to the RNIC (tested when the host is busy):
    /// memory, and GPUs under the RNIC's root port.
    pub affinitive: bool,
    /// The most a healthy path of this kind can carry, Gb/s (line rate x distance share,
    /// capped by the best of every PCIe link it crosses); `None` when nothing is known.
    pub nominal_gbps: Option<f64>,
}

/// The endpoints of the host: every NUMA node's memory, every GPU.
pub fn endpoints(topo: &HostTopology) -> Vec<Endpoint> {
    let mut out: Vec<Endpoint> = topo
        .numa_nodes
        .iter()
        .map(|n| Endpoint::Memory(n.id))
        .collect();
    out.extend(
        topo.gpus
            .iter()
            .map(|&g| Endpoint::Gpu(topo.pci[g].bdf.clone())),
    );
    out
}

/// The physical links from `i` up to (not including) its root port.
fn links_up(topo: &HostTopology, i: usize, stop_at: Option<usize>) -> Vec<LinkId> {
    let mut out = Vec::new();
    let mut at = Some(i);
    while let Some(j) = at {
        if Some(j) == stop_at {
            break;
        }
        let d = &topo.pci[j];
        if matches!(
            d.role,
            PciRole::Rnic
                | PciRole::Gpu
                | PciRole::SwitchUpstream
                | PciRole::Other
                | PciRole::Bridge
        ) {
            out.push(LinkId::Pcie(d.bdf.clone()));
        }
        at = d.parent;
    }
    out
}

fn pcie_cap_gbps(topo: &HostTopology, i: usize, stop_at: Option<usize>) -> Option<f64> {
    let mut best: Option<f64> = None;
    let mut at = Some(i);
    while let Some(j) = at {
        if Some(j) == stop_at {
            break;
        }
        if let Some(g) = topo.upstream_link(j).and_then(|(_, cap)| link_gbps(&cap)) {
            best = Some(best.map_or(g, |b: f64| b.min(g)));
        }
        at = topo.pci[j].parent;
    }
    best
}

/// The path from RNIC `rnic` (index into `topo.rnics`) to `endpoint`.
pub fn path(topo: &HostTopology, rnic: usize, endpoint: &Endpoint) -> Option<HostPath> {
    let r = &topo.rnics[rnic];
    let line = r
        .ports
        .iter()
        .filter_map(|p| p.rate_gbps)
        .fold(None, |a: Option<f64>, g| Some(a.map_or(g, |x| x.max(g))));
    let rnic_socket = match r.pci {
        Some(i) => topo.socket_of_pci(i),
        None => topo.numa_nodes.first().map(|n| n.socket),
    };
    let mut links = Vec::new();
    let mut cap = line;
    let min_cap = |cap: Option<f64>, other: Option<f64>| match (cap, other) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let (distance, affinitive) = match endpoint {
        Endpoint::Memory(node) => {
            let mem_socket = topo.socket_of_node(*node);
            if let Some(i) = r.pci {
                links.extend(links_up(topo, i, None));
                cap = min_cap(cap, pcie_cap_gbps(topo, i, None));
            }
            let remote = matches!((rnic_socket, mem_socket), (Some(a), Some(b)) if a != b);
            if remote {
                links.push(LinkId::upi(rnic_socket?, mem_socket?));
            }
            links.push(LinkId::Memory(*node));
            (
                if remote {
                    Distance::RemoteMemory
                } else {
                    Distance::LocalMemory
                },
                true,
            )
        }
        Endpoint::Gpu(bdf) => {
            let ri = r.pci?;
            let gi = topo.pci.iter().position(|d| &d.bdf == bdf)?;
            let up_r = topo.ancestry(ri);
            let up_g = topo.ancestry(gi);
            // The lowest switch both sit under, if any: traffic turns there.
            let common_switch = up_r
                .iter()
                .copied()
                .find(|a| up_g.contains(a) && topo.pci[*a].role == PciRole::SwitchUpstream);
            let rp_r = topo.root_port_of(ri);
            let rp_g = topo.root_port_of(gi);
            if let Some(sw) = common_switch {
                links.extend(links_up(topo, ri, Some(sw)));
                links.push(LinkId::SwitchP2p(topo.pci[sw].bdf.clone()));
                links.extend(links_up(topo, gi, Some(sw)));
                cap = min_cap(cap, pcie_cap_gbps(topo, ri, Some(sw)));
                cap = min_cap(cap, pcie_cap_gbps(topo, gi, Some(sw)));
                (Distance::SameSwitch, rp_r == rp_g)
            } else {
                links.extend(links_up(topo, ri, None));
                links.push(LinkId::RootPortTransit(topo.pci[rp_r?].bdf.clone()));
                let gs = topo.socket_of_pci(gi);
                let cross = matches!((rnic_socket, gs), (Some(a), Some(b)) if a != b);
                if cross {
                    links.push(LinkId::upi(rnic_socket?, gs?));
                }
                if rp_g != rp_r {
                    links.push(LinkId::RootPortTransit(topo.pci[rp_g?].bdf.clone()));
                }
                links.extend(links_up(topo, gi, None));
                cap = min_cap(cap, pcie_cap_gbps(topo, ri, None));
                cap = min_cap(cap, pcie_cap_gbps(topo, gi, None));
                (
                    if cross {
                        Distance::CrossSocket
                    } else {
                        Distance::SameSocketRootComplex
                    },
                    rp_r == rp_g,
                )
            }
        }
    };
    let nominal_gbps = match (line, cap) {
        (Some(l), Some(c)) => Some((l * distance.healthy_share()).min(c)),
        (None, Some(c)) => Some(c * distance.healthy_share()),
        (Some(l), None) => Some(l * distance.healthy_share()),
        (None, None) => None,
    };
    Some(HostPath {
        rnic: r.name.clone(),
        endpoint: endpoint.clone(),
        links,
        distance,
        affinitive,
        nominal_gbps,
    })
}

/// Every RNIC x endpoint path (the idle-host full mesh).
pub fn full_mesh(topo: &HostTopology) -> Vec<HostPath> {
    let eps = endpoints(topo);
    let mut out = Vec::new();
    for r in 0..topo.rnics.len() {
        for e in &eps {
            if let Some(p) = path(topo, r, e) {
                out.push(p);
            }
        }
    }
    out
}
