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

fn read_opt(fs: &dyn Sysfs, path: &str) -> Option<String> {
    fs.read(path).ok().map(|s| s.trim().to_string())
}

fn parse_hex(path: &str, text: &str) -> Result<u32, TopologyError> {
    let t = text.trim();
    u32::from_str_radix(t.trim_start_matches("0x"), 16)
        .map_err(|_| bad(path, format!("expected a hex number, found {t:?}")))
}

/// "0-3,8-11" -> its first CPU.
fn first_cpu(path: &str, list: &str) -> Result<Option<u32>, TopologyError> {
    let t = list.trim();
    if t.is_empty() {
        return Ok(None); // a memory-only node
    }
    let first = t.split([',', '-']).next().unwrap_or("");
    first
        .parse()
        .map(Some)
        .map_err(|_| bad(path, format!("expected a CPU list, found {t:?}")))
}

fn read_numa(fs: &dyn Sysfs) -> Result<Vec<NumaNode>, TopologyError> {
    let names = match fs.list(NODES) {
        Ok(n) => n,
        // A kernel without NUMA: one node, socket 0.
        Err(_) => {
            return Ok(vec![NumaNode {
                id: 0,
                socket: 0,
                cpus: String::new(),
                mem_total_kib: None,
            }])
        }
    };
    let mut nodes = Vec::new();
    for name in names {
        let Some(id) = name
            .strip_prefix("node")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let dir = format!("{NODES}/{name}");
        let cpus_path = format!("{dir}/cpulist");
        let cpus = fs
            .read(&cpus_path)
            .map_err(|e| bad(&cpus_path, e.to_string()))?;
        let socket = match first_cpu(&cpus_path, &cpus)? {
            Some(cpu) => {
                let p = format!("/sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id");
                match fs.read(&p) {
                    Ok(t) => t.trim().parse().map_err(|_| {
                        bad(
                            &p,
                            format!("expected a socket number, found {:?}", t.trim()),
                        )
                    })?,
                    Err(_) => id,
                }
            }
            None => id,
        };
        let mem_path = format!("{dir}/meminfo");
        let mem_total_kib = match fs.read(&mem_path) {
            Ok(text) => Some(parse_mem_total(&mem_path, &text)?),
            Err(_) => None,
        };
        nodes.push(NumaNode {
            id,
            socket,
            cpus: cpus.trim().to_string(),
            mem_total_kib,
        });
    }
    if nodes.is_empty() {
        return Err(bad(NODES, "no node<N> directory"));
    }
    nodes.sort_by_key(|n| n.id);
    Ok(nodes)
}

fn parse_mem_total(path: &str, text: &str) -> Result<u64, TopologyError> {
    for line in text.lines() {
        if let Some(rest) = line.split_once("MemTotal:").map(|(_, r)| r) {
            let num = rest.split_whitespace().next().unwrap_or("");
            return num
                .parse()
                .map_err(|_| bad(path, format!("MemTotal is not a number: {num:?}")));
        }
    }
    Err(bad(path, "no MemTotal line"))
}

fn is_bdf(s: &str) -> bool {
    // dddd:bb:dd.f
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && s.chars().filter(|c| c.is_ascii_hexdigit()).count() == 9
}

/// "16.0 GT/s PCIe" -> 16.0; "Unknown" -> None.
pub fn parse_speed(path: &str, text: &str) -> Result<Option<f64>, TopologyError> {
    let t = text.trim();
    if t.is_empty() || t.starts_with("Unknown") {
        return Ok(None);
    }
    let num = t.split_whitespace().next().unwrap_or("");
    match num.parse::<f64>() {
        Ok(v) if v > 0.0 && v < 1000.0 && t.contains("GT/s") => Ok(Some(v)),
        _ => Err(bad(
            path,
            format!("expected a link speed like \"16.0 GT/s PCIe\", found {t:?}"),
        )),
    }
}

fn parse_width(path: &str, text: &str) -> Result<Option<u32>, TopologyError> {
    let t = text.trim();
    if t.is_empty() {
        return Ok(None);
    }
    match t.parse::<u32>() {
        Ok(w) if w <= 32 => Ok(Some(w)),
        _ => Err(bad(
            path,
            format!("expected a link width (lanes), found {t:?}"),
        )),
    }
}

fn read_link_caps(fs: &dyn Sysfs, dir: &str) -> Result<Option<PcieLink>, TopologyError> {
    let get = |name: &str| {
        (
            format!("{dir}/{name}"),
            read_opt(fs, &format!("{dir}/{name}")),
        )
    };
    let (cs_p, cs) = get("current_link_speed");
    let (ms_p, ms) = get("max_link_speed");
    let (cw_p, cw) = get("current_link_width");
    let (mw_p, mw) = get("max_link_width");
    if cs.is_none() && ms.is_none() && cw.is_none() && mw.is_none() {
        return Ok(None);
    }
    let speed = |p: &str, v: Option<String>| v.map_or(Ok(None), |t| parse_speed(p, &t));
    let width = |p: &str, v: Option<String>| v.map_or(Ok(None), |t| parse_width(p, &t));
    Ok(Some(PcieLink {
        current: LinkCaps {
            speed_gts: speed(&cs_p, cs)?,
            width: width(&cw_p, cw)?,
        },
        max: LinkCaps {
            speed_gts: speed(&ms_p, ms)?,
            width: width(&mw_p, mw)?,
        },
    }))
}

fn read_pci(fs: &dyn Sysfs) -> Result<(Vec<PciDevice>, BTreeMap<String, usize>), TopologyError> {
    let names = match fs.list(PCI_DEVICES) {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok((Vec::new(), BTreeMap::new()))
        }
        Err(e) => return Err(bad(PCI_DEVICES, e.to_string())),
    };
    // (bdf, root complex, parent bdf) from each device's place under /sys/devices.
    let mut placed = Vec::new();
    for name in &names {
        if !is_bdf(name) {
            return Err(bad(
                &format!("{PCI_DEVICES}/{name}"),
                "not a PCI address (dddd:bb:dd.f)",
            ));
        }
        let link_path = format!("{PCI_DEVICES}/{name}");
        let target = fs
            .read_link(&link_path)
            .map_err(|e| bad(&link_path, format!("not a link into /sys/devices: {e}")))?;
        let full = resolve_link(&link_path, &target);
        let parts: Vec<&str> = full.split('/').collect();
        let Some(rc_at) = parts
            .iter()
            .position(|p| p.starts_with("pci") && p.contains(':'))
        else {
            return Err(bad(
                &link_path,
                format!("target {full} has no pci<domain>:<bus> host bridge"),
            ));
        };
        let chain: Vec<&str> = parts[rc_at + 1..]
            .iter()
            .copied()
            .filter(|p| is_bdf(p))
            .collect();
        if chain.last() != Some(&name.as_str()) {
            return Err(bad(
                &link_path,
                format!("target {full} does not end in {name}"),
            ));
        }
        let parent = chain.len().checked_sub(2).map(|k| chain[k].to_string());
        placed.push((name.clone(), parts[rc_at].to_string(), parent));
    }
    let by_bdf: BTreeMap<String, usize> = placed
        .iter()
        .enumerate()
        .map(|(i, p)| (p.0.clone(), i))
        .collect();
    let mut pci = Vec::new();
    for (bdf, rc, parent) in &placed {
        let dir = format!("{PCI_DEVICES}/{bdf}");
        let hex = |name: &str| -> Result<u32, TopologyError> {
            let p = format!("{dir}/{name}");
            let t = fs.read(&p).map_err(|e| bad(&p, e.to_string()))?;
            parse_hex(&p, &t)
        };
        let numa_path = format!("{dir}/numa_node");
        let numa_node = match read_opt(fs, &numa_path) {
            Some(t) => {
                let v: i64 = t
                    .parse()
                    .map_err(|_| bad(&numa_path, format!("expected a node number, found {t:?}")))?;
                u32::try_from(v).ok()
            }
            None => None,
        };
        let parent_idx = match parent {
            Some(p) => Some(
                *by_bdf
                    .get(p)
                    .ok_or_else(|| bad(&dir, format!("parent {p} is not in {PCI_DEVICES}")))?,
            ),
            None => None,
        };
        pci.push(PciDevice {
            bdf: bdf.clone(),
            root_complex: rc.clone(),
            parent: parent_idx,
            role: PciRole::Other,
            class: hex("class")?,
            vendor: hex("vendor")?,
            device: hex("device")?,
            numa_node,
            link: read_link_caps(fs, &dir)?,
        });
    }
    // Bridge roles by their place: under a host bridge a root port, under a root port
    // or a downstream port a switch's upstream port, under that a downstream port.
    // Repeated until stable, so the order the kernel lists functions in does not matter.
    for _ in 0..16 {
        let mut changed = false;
        for i in 0..pci.len() {
            if pci[i].class >> 8 != 0x0604 {
                continue;
            }
            let role = match pci[i].parent.map(|p| pci[p].role) {
                None => PciRole::RootPort,
                Some(PciRole::RootPort) | Some(PciRole::SwitchDownstream) => {
                    PciRole::SwitchUpstream
                }
                Some(PciRole::SwitchUpstream) => PciRole::SwitchDownstream,
                Some(_) => PciRole::Bridge,
            };
            if role != pci[i].role {
                pci[i].role = role;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    Ok((pci, by_bdf))
}

fn read_rnics(
    fs: &dyn Sysfs,
    pci: &mut [PciDevice],
    by_bdf: &BTreeMap<String, usize>,
) -> Result<Vec<Rnic>, TopologyError> {
    let names = match fs.list(INFINIBAND) {
        Ok(n) => n,
        Err(_) => return Ok(Vec::new()), // no RDMA stack loaded: no RNICs
    };
    let mut rnics = Vec::new();
    for name in names {
        let link_path = format!("{INFINIBAND}/{name}");
        let target = fs
            .read_link(&link_path)
            .map_err(|e| bad(&link_path, format!("not a link: {e}")))?;
        let full = resolve_link(&link_path, &target);
        let bdf = full.split('/').rfind(|p| is_bdf(p)).map(str::to_string);
        let pci_idx = match &bdf {
            Some(b) => Some(*by_bdf.get(b).ok_or_else(|| {
                bad(
                    &link_path,
                    format!("PCI function {b} is not in {PCI_DEVICES}"),
                )
            })?),
            None => None,
        };
        let netdevs = match &bdf {
            Some(b) => fs
                .list(&format!("{PCI_DEVICES}/{b}/net"))
                .unwrap_or_default(),
            None => read_opt(fs, &format!("{link_path}/parent"))
                .into_iter()
                .collect(),
        };
        let mut ports = Vec::new();
        for p in fs.list(&format!("{link_path}/ports")).unwrap_or_default() {
            let Ok(port) = p.parse::<u32>() else { continue };
            let dir = format!("{link_path}/ports/{p}");
            // "4: ACTIVE"
            let state = read_opt(fs, &format!("{dir}/state"))
                .map(|s| {
                    s.split_once(':')
                        .map_or(s.clone(), |(_, t)| t.trim().to_string())
                })
                .unwrap_or_else(|| "?".into());
            // "200 Gb/sec (4X HDR)"
            let rate_gbps = read_opt(fs, &format!("{dir}/rate"))
                .and_then(|r| r.split_whitespace().next()?.parse().ok());
            ports.push(RnicPort {
                port,
                state,
                rate_gbps,
            });
        }
        if let Some(i) = pci_idx {
            pci[i].role = PciRole::Rnic;
        }
        rnics.push(Rnic {
            name,
            pci: pci_idx,
            netdevs,
            ports,
        });
    }
    Ok(rnics)
}

#[cfg(test)]
mod tests;
