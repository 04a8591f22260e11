//! The host tree from sysfs: CPU sockets and NUMA nodes with their memory, PCIe root
//! complexes, root ports and switches, RNICs (RDMA and netdev names), GPUs, and every
//! PCIe link's current and maximum speed and width. No vendor tool is needed.
//!
//! What the kernel gives (and what we make of it):
//! - `/sys/bus/pci/devices/<bdf>` links into `/sys/devices/pci<dom>:<bus>/<bdf>/<bdf>...`:
//!   the chain of addresses is the device's place in the tree. A bridge (class 0x0604)
//!   right under a host bridge is a root port; a bridge under a root port or a switch's
//!   downstream port is a switch's upstream port; a bridge under that is a downstream port.
//! - `current_link_speed` ("16.0 GT/s PCIe"), `max_link_speed`, `current_link_width`,
//!   `max_link_width` on each PCIe function describe its link; on a port, the link below
//!   it. A link's best is what *both* ends can do, so a Gen4 card in a Gen3 slot is not a
//!   downgrade, and an x16 card trained at x8 in an x16 slot is.
//! - NUMA nodes: `/sys/devices/system/node/node<N>` (`cpulist`, `meminfo`), the socket of
//!   a node from its first CPU's `topology/physical_package_id`.
//! - RNICs: `/sys/class/infiniband/<dev>` links to the PCI function (or to
//!   `devices/virtual` for soft-RoCE, whose `parent` file names its netdev).
//! - GPUs: PCI class 0x0302 or 0x0300 from vendor 0x10de.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::Serialize;

use crate::sysfs::{resolve_link, Sysfs};

mod read;

pub use read::parse_speed;
use read::{read_numa, read_pci, read_rnics};

/// Where discovery starts.
pub const PCI_DEVICES: &str = "/sys/bus/pci/devices";
const NODES: &str = "/sys/devices/system/node";
const INFINIBAND: &str = "/sys/class/infiniband";
const NVIDIA: u32 = 0x10de;

/// A tree that cannot be read: the path and what is wrong with it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("host topology: {path}: {reason}")]
pub struct TopologyError {
    pub path: String,
    pub reason: String,
}

fn bad(path: &str, reason: impl Into<String>) -> TopologyError {
    TopologyError {
        path: path.to_string(),
        reason: reason.into(),
    }
}

/// A NUMA node and its memory.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NumaNode {
    pub id: u32,
    pub socket: u32,
    pub cpus: String,
    pub mem_total_kib: Option<u64>,
}

/// What a PCI function is in the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PciRole {
    RootPort,
    SwitchUpstream,
    SwitchDownstream,
    /// A bridge of no PCIe role we can tell (e.g. under a device).
    Bridge,
    Rnic,
    Gpu,
    Other,
}

/// One side's view of a PCIe link.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct LinkCaps {
    /// GT/s per lane, `None` when the kernel says "Unknown" or the file is absent.
    pub speed_gts: Option<f64>,
    pub width: Option<u32>,
}

/// The link above a device (for a port: the link below it, as the kernel reports it).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct PcieLink {
    pub current: LinkCaps,
    pub max: LinkCaps,
}

/// A PCI function of interest: an RNIC, a GPU, or a bridge above one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PciDevice {
    pub bdf: String,
    /// `pci0000:3a`: the host bridge the device sits under.
    pub root_complex: String,
    /// The bridge above, by index into [`HostTopology::pci`].
    pub parent: Option<usize>,
    pub role: PciRole,
    pub class: u32,
    pub vendor: u32,
    pub device: u32,
    pub numa_node: Option<u32>,
    /// The link as this function reports it (`None`: not a PCIe function, e.g. virtio).
    pub link: Option<PcieLink>,
}

/// An RDMA device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rnic {
    pub name: String,
    /// Index into [`HostTopology::pci`]; `None` for a virtual device (soft-RoCE).
    pub pci: Option<usize>,
    pub netdevs: Vec<String>,
    /// Port number, state text ("ACTIVE"), rate in Gb/s.
    pub ports: Vec<RnicPort>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RnicPort {
    pub port: u32,
    pub state: String,
    pub rate_gbps: Option<f64>,
}

/// The whole host.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct HostTopology {
    pub numa_nodes: Vec<NumaNode>,
    /// RNICs, GPUs and the bridges above them (other functions are left out).
    pub pci: Vec<PciDevice>,
    pub rnics: Vec<Rnic>,
    /// Indexes into `pci`.
    pub gpus: Vec<usize>,
}

/// A PCIe link trained below what both its ends can do.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinkDowngrade {
    /// The device below the link (its upstream link).
    pub bdf: String,
    /// "rnic mlx5_0", "gpu", "switch", ...
    pub what: String,
    pub current: LinkCaps,
    /// What both ends can do.
    pub capable: LinkCaps,
    /// Per-direction bandwidth now and at best, Gb/s.
    pub current_gbps: Option<f64>,
    pub capable_gbps: Option<f64>,
}

impl LinkDowngrade {
    /// One line for an operator.
    pub fn describe(&self) -> String {
        format!(
            "PCIe link above {} ({}) runs at {} of {} ({} of {} Gb/s)",
            self.bdf,
            self.what,
            caps_text(&self.current),
            caps_text(&self.capable),
            self.current_gbps.map_or("?".into(), |g| format!("{g:.0}")),
            self.capable_gbps.map_or("?".into(), |g| format!("{g:.0}")),
        )
    }
}

/// Gb/s one direction of a link carries: GT/s x lanes x line-code efficiency (8b/10b up
/// to 5 GT/s, 128b/130b up to 32 GT/s, FLIT 242/256 at 64 GT/s).
pub fn link_gbps(c: &LinkCaps) -> Option<f64> {
    let (s, w) = (c.speed_gts?, c.width?);
    let code = if s <= 5.0 {
        0.8
    } else if s < 64.0 {
        128.0 / 130.0
    } else {
        242.0 / 256.0
    };
    Some(s * w as f64 * code)
}

fn caps_text(c: &LinkCaps) -> String {
    format!(
        "{} x{}",
        c.speed_gts.map_or("?".into(), |s| format!("{s} GT/s")),
        c.width.map_or("?".into(), |w| w.to_string())
    )
}

fn min_opt<T: PartialOrd + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(x), Some(y)) => Some(if y < x { y } else { x }),
        (x, None) => x,
        (None, y) => y,
    }
}

impl HostTopology {
    /// Reads the tree. A missing optional file leaves its field empty; a present file
    /// that says something unreadable is an error naming it.
    pub fn discover(fs: &dyn Sysfs) -> Result<Self, TopologyError> {
        let numa_nodes = read_numa(fs)?;
        let (mut pci, by_bdf) = read_pci(fs)?;
        let rnics = read_rnics(fs, &mut pci, &by_bdf)?;
        // GPUs are found by class; then only RNICs, GPUs and their ancestors are kept.
        for d in pci.iter_mut() {
            if d.role == PciRole::Other
                && d.vendor == NVIDIA
                && matches!(d.class >> 8, 0x0302 | 0x0300)
            {
                d.role = PciRole::Gpu;
            }
        }
        let mut topo = HostTopology {
            numa_nodes,
            pci,
            rnics,
            gpus: Vec::new(),
        };
        topo.prune();
        let single_node = topo.numa_nodes.len() == 1;
        for d in topo.pci.iter_mut() {
            if d.numa_node.is_none() && single_node {
                d.numa_node = Some(topo.numa_nodes[0].id);
            }
        }
        topo.gpus = (0..topo.pci.len())
            .filter(|&i| topo.pci[i].role == PciRole::Gpu)
            .collect();
        Ok(topo)
    }

    /// Keeps RNICs, GPUs and the bridges above them; re-indexes parents and RNICs.
    fn prune(&mut self) {
        let mut keep = vec![false; self.pci.len()];
        for i in 0..self.pci.len() {
            if matches!(self.pci[i].role, PciRole::Rnic | PciRole::Gpu) {
                let mut at = Some(i);
                while let Some(j) = at {
                    keep[j] = true;
                    at = self.pci[j].parent;
                }
            }
        }
        let mut new_index = vec![None; self.pci.len()];
        let mut kept = Vec::new();
        for (i, d) in self.pci.iter().enumerate() {
            if keep[i] {
                new_index[i] = Some(kept.len());
                kept.push(d.clone());
            }
        }
        for d in kept.iter_mut() {
            d.parent = d.parent.and_then(|p| new_index[p]);
        }
        for r in self.rnics.iter_mut() {
            r.pci = r.pci.and_then(|p| new_index[p]);
        }
        self.pci = kept;
    }

    /// The socket a NUMA node belongs to.
    pub fn socket_of_node(&self, node: u32) -> Option<u32> {
        self.numa_nodes
            .iter()
            .find(|n| n.id == node)
            .map(|n| n.socket)
    }

    /// The socket a PCI function hangs off (through its NUMA node).
    pub fn socket_of_pci(&self, i: usize) -> Option<u32> {
        self.socket_of_node(self.pci[i].numa_node?)
    }

    /// The chain from `i` up to its root port, `i` first.
    pub fn ancestry(&self, i: usize) -> Vec<usize> {
        let mut out = vec![i];
        let mut at = self.pci[i].parent;
        while let Some(j) = at {
            out.push(j);
            at = self.pci[j].parent;
        }
        out
    }

    /// The root port above `i` (itself if it is one).
    pub fn root_port_of(&self, i: usize) -> Option<usize> {
        self.ancestry(i)
            .into_iter()
            .find(|&j| self.pci[j].role == PciRole::RootPort)
    }

    /// The link above function `i`, with what both ends can do.
    pub fn upstream_link(&self, i: usize) -> Option<(LinkCaps, LinkCaps)> {
        let d = &self.pci[i];
        let own = d.link?;
        let parent_max = d
            .parent
            .and_then(|p| self.pci[p].link)
            .map(|l| l.max)
            .unwrap_or_default();
        let capable = LinkCaps {
            speed_gts: min_opt(own.max.speed_gts, parent_max.speed_gts),
            width: min_opt(own.max.width, parent_max.width),
        };
        Some((own.current, capable))
    }

    /// Every PCIe link trained below what both ends can do (one per slot: the functions
    /// of one card share their link).
    pub fn downgrades(&self) -> Vec<LinkDowngrade> {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for i in 0..self.pci.len() {
            let d = &self.pci[i];
            // A root port's and a downstream port's own attributes describe the link
            // below them, which the device below reports too.
            if matches!(d.role, PciRole::RootPort | PciRole::SwitchDownstream) {
                continue;
            }
            let slot = d
                .bdf
                .rsplit_once('.')
                .map_or(d.bdf.as_str(), |(s, _)| s)
                .to_string();
            let Some((current, capable)) = self.upstream_link(i) else {
                continue;
            };
            let slow = matches!((current.speed_gts, capable.speed_gts), (Some(c), Some(m)) if c + 1e-9 < m);
            let narrow = matches!((current.width, capable.width), (Some(c), Some(m)) if c < m);
            if (slow || narrow) && seen.insert(slot) {
                out.push(LinkDowngrade {
                    bdf: d.bdf.clone(),
                    what: self.describe_pci(i),
                    current,
                    capable,
                    current_gbps: link_gbps(&current),
                    capable_gbps: link_gbps(&capable),
                });
            }
        }
        out
    }

    /// "rnic mlx5_0", "gpu", "switch upstream port", ...
    pub fn describe_pci(&self, i: usize) -> String {
        match self.pci[i].role {
            PciRole::Rnic => {
                let names: Vec<&str> = self
                    .rnics
                    .iter()
                    .filter(|r| r.pci == Some(i))
                    .map(|r| r.name.as_str())
                    .collect();
                format!("rnic {}", names.join(","))
            }
            PciRole::Gpu => "gpu".into(),
            PciRole::RootPort => "root port".into(),
            PciRole::SwitchUpstream => "switch".into(),
            PciRole::SwitchDownstream => "switch port".into(),
            PciRole::Bridge => "bridge".into(),
            PciRole::Other => "device".into(),
        }
    }

    /// The tree as text: sockets, NUMA nodes, root complexes and everything under them.
    /// `state` may add a note to a PCIe link (by the bdf below it) or to a logical link
    /// (by its [`crate::paths::LinkId`] text).
    pub fn render(&self, state: &dyn Fn(&str) -> Option<String>) -> String {
        let mut out = String::new();
        let sockets: BTreeSet<u32> = self.numa_nodes.iter().map(|n| n.socket).collect();
        let note = |key: &str| state(key).map(|s| format!("  [{s}]")).unwrap_or_default();
        for s in &sockets {
            let _ = writeln!(out, "socket {s}");
            for n in self.numa_nodes.iter().filter(|n| n.socket == *s) {
                let mem = n
                    .mem_total_kib
                    .map_or("?".into(), |k| format!("{:.1} GiB", k as f64 / 1048576.0));
                let _ = writeln!(
                    out,
                    "  numa node {} (cpus {}, memory {mem}){}",
                    n.id,
                    n.cpus,
                    note(&format!("mem:{}", n.id))
                );
            }
            let complexes: BTreeSet<&str> = self
                .pci
                .iter()
                .enumerate()
                .filter(|(i, d)| d.parent.is_none() && self.socket_of_pci(*i).unwrap_or(0) == *s)
                .map(|(_, d)| d.root_complex.as_str())
                .collect();
            for rc in complexes {
                let _ = writeln!(out, "  {rc}");
                for (i, d) in self.pci.iter().enumerate() {
                    if d.parent.is_none()
                        && d.root_complex == rc
                        && self.socket_of_pci(i).unwrap_or(0) == *s
                    {
                        self.render_pci(&mut out, i, 2, state);
                    }
                }
            }
        }
        if sockets.len() > 1 {
            let list: Vec<String> = sockets.iter().map(|s| s.to_string()).collect();
            let key = format!("upi:{}", list.join("-"));
            let _ = writeln!(
                out,
                "socket interconnect {}{}",
                list.join(" <-> "),
                note(&key)
            );
        }
        let virtual_rnics: Vec<&Rnic> = self.rnics.iter().filter(|r| r.pci.is_none()).collect();
        if !virtual_rnics.is_empty() {
            let _ = writeln!(out, "virtual RDMA devices");
            for r in virtual_rnics {
                let _ = writeln!(
                    out,
                    "  {}{}",
                    rnic_text(r),
                    note(&format!("rnic:{}", r.name))
                );
            }
        }
        out
    }

    fn render_pci(
        &self,
        out: &mut String,
        i: usize,
        depth: usize,
        state: &dyn Fn(&str) -> Option<String>,
    ) {
        let d = &self.pci[i];
        let pad = "  ".repeat(depth);
        let mut line = format!("{pad}{} {}", d.bdf, self.describe_pci(i));
        for r in self.rnics.iter().filter(|r| r.pci == Some(i)) {
            let _ = write!(line, " ({})", rnic_text(r));
        }
        if !matches!(d.role, PciRole::RootPort | PciRole::SwitchDownstream) {
            if let Some((cur, cap)) = self.upstream_link(i) {
                let _ = write!(line, "  link {}", caps_text(&cur));
                if cur != cap {
                    let _ = write!(line, " (capable {})", caps_text(&cap));
                }
            }
            if let Some(s) = state(&format!("pcie:{}", d.bdf)) {
                let _ = write!(line, "  [{s}]");
            }
        }
        if d.role == PciRole::RootPort {
            if let Some(s) = state(&format!("rp:{}", d.bdf)) {
                let _ = write!(line, "  [transit {s}]");
            }
        }
        if d.role == PciRole::SwitchUpstream {
            if let Some(s) = state(&format!("p2p:{}", d.bdf)) {
                let _ = write!(line, "  [p2p {s}]");
            }
        }
        out.push_str(&line);
        out.push('\n');
        for (j, c) in self.pci.iter().enumerate() {
            if c.parent == Some(i) {
                self.render_pci(out, j, depth + 1, state);
            }
        }
    }
}

fn rnic_text(r: &Rnic) -> String {
    let mut s = r.name.clone();
    if !r.netdevs.is_empty() {
        let _ = write!(s, " netdev {}", r.netdevs.join(","));
    }
    for p in &r.ports {
        let _ = write!(s, " port {} {}", p.port, p.state);
        if let Some(g) = p.rate_gbps {
            let _ = write!(s, " {g} Gb/s");
        }
    }
    s
}

#[cfg(test)]
mod tests;
