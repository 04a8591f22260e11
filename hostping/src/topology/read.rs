//! Reading the host tree out of sysfs: NUMA nodes and their memory, PCI functions and
//! their place in the tree, PCIe link speeds and widths, RNICs and their ports.

use super::*;

pub(super) fn read_opt(fs: &dyn Sysfs, path: &str) -> Option<String> {
    fs.read(path).ok().map(|s| s.trim().to_string())
}

pub(super) fn parse_hex(path: &str, text: &str) -> Result<u32, TopologyError> {
    let t = text.trim();
    u32::from_str_radix(t.trim_start_matches("0x"), 16)
        .map_err(|_| bad(path, format!("expected a hex number, found {t:?}")))
}

/// "0-3,8-11" -> its first CPU.
pub(super) fn first_cpu(path: &str, list: &str) -> Result<Option<u32>, TopologyError> {
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

pub(super) fn read_numa(fs: &dyn Sysfs) -> Result<Vec<NumaNode>, TopologyError> {
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

pub(super) fn parse_mem_total(path: &str, text: &str) -> Result<u64, TopologyError> {
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

pub(super) fn is_bdf(s: &str) -> bool {
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

pub(super) fn parse_width(path: &str, text: &str) -> Result<Option<u32>, TopologyError> {
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

pub(super) fn read_link_caps(fs: &dyn Sysfs, dir: &str) -> Result<Option<PcieLink>, TopologyError> {
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

pub(super) fn read_pci(
    fs: &dyn Sysfs,
) -> Result<(Vec<PciDevice>, BTreeMap<String, usize>), TopologyError> {
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

pub(super) fn read_rnics(
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
