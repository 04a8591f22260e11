//! The two rxe devices behind a bridge that the service, bench, fault, Hostping and RC ring
//! scenarios share (one "host" address each, policy routing so traffic crosses the bridge).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;
use rpingmesh_e2e::vm::*;

use crate::harness::*;

/// Two rxe devices behind a bridge, one per "host" address, with policy routing so that
/// traffic between the two local addresses leaves by its own device and crosses the
/// bridge (notes/rdma-vm.md). Idempotent: the second service scenario reuses it.
pub(crate) fn svc_network() -> Result<BTreeMap<String, u32>> {
    bridged_rxe("brs", &SVC_NETDEVS, &SVC_IPS, &SVC_DEVICES, 20)
}

/// rxe devices on veths behind one bridge (a "ToR"), each on its own address of one /24,
/// with the policy routing that makes them talk to each other inside one kernel (see
/// ../shared/notes/rdma-vm.md). Idempotent. Returns device -> GID index of its address.
pub(crate) fn bridged_rxe(
    bridge: &str,
    netdevs: &[&str],
    ips: &[std::net::Ipv4Addr],
    devices: &[&str],
    table_base: usize,
) -> Result<BTreeMap<String, u32>> {
    let gid_indexes = || -> Result<BTreeMap<String, u32>> {
        let mut all = BTreeMap::new();
        for (dev, ip) in devices.iter().zip(ips) {
            let t = wait_gids(dev, &[v4_gid(*ip)])?;
            all.insert(dev.to_string(), t[&v4_gid(*ip)]);
        }
        Ok(all)
    };
    if Path::new(&format!("/sys/class/infiniband/{}", devices[0])).exists() {
        return gid_indexes();
    }
    sh(&["ip", "link", "add", bridge, "type", "bridge"])?;
    sh(&["ip", "link", "set", bridge, "up"])?;
    for k in ["all", "default"] {
        sysctl(&format!("net.ipv4.conf.{k}.accept_local"), "1")?;
        sysctl(&format!("net.ipv4.conf.{k}.rp_filter"), "0")?;
    }
    sysctl("net.ipv4.conf.all.arp_ignore", "1")?;
    sysctl("net.ipv4.conf.all.arp_announce", "2")?;
    if !sh(&["ip", "rule", "show"])?.contains("100:\tfrom all lookup local") {
        sh(&["ip", "rule", "add", "pref", "100", "lookup", "local"])?;
        sh(&["ip", "rule", "del", "pref", "0"])?;
    }
    let o = ips[0].octets();
    let subnet = format!("{}.{}.{}.0/24", o[0], o[1], o[2]);
    for (i, ((v, ip), dev)) in netdevs.iter().zip(ips).zip(devices).enumerate() {
        let p = format!("{v}p");
        sh(&["ip", "link", "add", v, "type", "veth", "peer", "name", &p])?;
        sh(&["ip", "link", "set", &p, "master", bridge])?;
        sh(&["ip", "addr", "add", &format!("{ip}/24"), "dev", v])?;
        sysctl(&format!("net.ipv4.conf.{v}.accept_local"), "1")?;
        sysctl(&format!("net.ipv4.conf.{v}.rp_filter"), "0")?;
        sh(&["ip", "link", "set", v, "up"])?;
        sh(&["ip", "link", "set", &p, "up"])?;
        let table = (table_base + i).to_string();
        let src = ip.to_string();
        sh(&[
            "ip", "route", "add", &subnet, "dev", v, "src", &src, "table", &table,
        ])?;
        sh(&[
            "ip", "rule", "add", "pref", "10", "from", &src, "iif", "lo", "lookup", &table,
        ])?;
        // Its own address stays local: a QP connected to itself (Hostping's loopback
        // tests) resolves its own GID, which would otherwise be ARPed for on the bridge.
        sh(&[
            "ip", "route", "add", "local", &src, "dev", v, "table", &table,
        ])?;
        sh(&["rdma", "link", "add", dev, "type", "rxe", "netdev", v])?;
    }
    gid_indexes()
}

pub(crate) fn svc_gid_index(device: usize) -> u32 {
    gid_table(SVC_DEVICES[device])
        .into_iter()
        .find(|(_, g)| *g == v4_gid(SVC_IPS[device]))
        .map(|(i, _)| i)
        .unwrap_or(1)
}
