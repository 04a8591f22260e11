//! The impact of a finding (pure): which workloads' live service paths cross its
//! component, how many of their paths, and what their SERVICE probes measured.
//!
//! A path crosses an RNIC, a host or a ToR when either end is on it. A link is crossed
//! as the fabric's ECMP selection routes the path: the service's own flow label (for a
//! QP left at label 0, the label its NIC derives, as the service-path table keeps it)
//! hashed over the spines the two ToRs share, as the localizer's topology models it.
//! Where that cannot be told (a topology without a hash model, a ToR side named without
//! a topology, a remote end no agent registered), the path is counted as uncertain, not
//! guessed.

use std::collections::BTreeMap;

use rpingmesh_proto::operator::{Finding, FindingImpact, ServicePath};

use crate::registry::RegistryIndex;
use crate::topology::{LinkDir, Topology};

/// Workloads listed per finding, at most (the worst first).
pub const MAX_IMPACT: usize = 64;

/// Whether a path crosses the component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crosses {
    Yes,
    No,
    /// The fabric's routing as known here cannot tell.
    Maybe,
}

/// The component a finding names, resolved once.
enum Target {
    Rnic {
        host: String,
        device: String,
    },
    Host(String),
    Tor(String),
    /// A ToR-spine link, by topology index, and the directions that are faulty.
    Link {
        tor: u32,
        spine: u32,
        up: bool,
        down: bool,
    },
    /// A ToR's uplink or downlink side (no topology to name the link).
    Side {
        tor: String,
        up: bool,
    },
    /// A location this controller cannot place (a topology changed since).
    Unknown,
}

fn target(f: &Finding, topo: Option<&Topology>) -> Target {
    let dir = f.evidence.as_ref().map_or("both", |e| e.direction.as_str());
    let (up, down) = match dir {
        "up" => (true, false),
        "down" => (false, true),
        _ => (true, true),
    };
    match f.kind.as_str() {
        "rnic" => match f.location.rsplit_once('/') {
            Some((h, d)) => Target::Rnic {
                host: h.to_string(),
                device: d.to_string(),
            },
            None => Target::Unknown,
        },
        "host" => Target::Host(f.location.clone()),
        "tor" => Target::Tor(f.location.clone()),
        "link" => {
            if let Some(t) = f.location.strip_suffix("/uplink") {
                return Target::Side {
                    tor: t.to_string(),
                    up: true,
                };
            }
            if let Some(t) = f.location.strip_suffix("/downlink") {
                return Target::Side {
                    tor: t.to_string(),
                    up: false,
                };
            }
            let Some(topo) = topo else {
                return Target::Unknown;
            };
            (0..topo.tor_count() as u32)
                .find_map(|t| {
                    let rest = f
                        .location
                        .strip_prefix(topo.tor_name(t))?
                        .strip_prefix('-')?;
                    let s = topo
                        .uplinks(t)
                        .iter()
                        .copied()
                        .find(|&s| topo.spine_name(s) == rest)?;
                    Some(Target::Link {
                        tor: t,
                        spine: s,
                        up,
                        down,
                    })
                })
                .unwrap_or(Target::Unknown)
        }
        _ => Target::Unknown,
    }
}

fn crosses(t: &Target, p: &ServicePath, idx: &RegistryIndex, topo: Option<&Topology>) -> Crosses {
    let yes = |b: bool| if b { Crosses::Yes } else { Crosses::No };
    // The remote end: known only when an agent registered it.
    let dst_known = p.monitored && !p.target_tor_id.is_empty();
    match t {
        Target::Rnic { host, device } => {
            let is = |gid: &str| {
                idx.rnic(gid)
                    .is_some_and(|r| &r.host_name == host && &r.device_name == device)
            };
            yes(is(&p.source_gid) || is(&p.target_gid))
        }
        Target::Host(h) => {
            let on = |gid: &str| idx.rnic(gid).is_some_and(|r| &r.host_name == h);
            yes(on(&p.source_gid) || on(&p.target_gid))
        }
        Target::Tor(tor) => {
            if &p.source_tor_id == tor || (dst_known && &p.target_tor_id == tor) {
                Crosses::Yes
            } else if dst_known {
                Crosses::No
            } else {
                Crosses::Maybe
            }
        }
        Target::Side { tor, up } => {
            // Inter-ToR paths leaving (up) or entering (down) the ToR; which of its
            // links they take is not known here.
            let leaves = &p.source_tor_id == tor && (!dst_known || &p.target_tor_id != tor);
            let enters = &p.source_tor_id != tor && (!dst_known || &p.target_tor_id == tor);
            if (*up && leaves) || (!*up && enters) {
                Crosses::Maybe
            } else {
                Crosses::No
            }
        }
        Target::Link {
            tor,
            spine,
            up,
            down,
        } => {
            let Some(topo) = topo else {
                return Crosses::Maybe;
            };
            let src = topo.tor_index(&p.source_tor_id);
            let dst = dst_known
                .then(|| topo.tor_index(&p.target_tor_id))
                .flatten();
            let could =
                (*up && src == Some(*tor)) || (*down && (dst == Some(*tor) || dst.is_none()));
            let (Some(s), Some(d)) = (src, dst) else {
                return if could { Crosses::Maybe } else { Crosses::No };
            };
            if s == d {
                return Crosses::No;
            }
            match topo.route(s, d, &p.source_gid, &p.target_gid, p.flow_label) {
                Some(links) => yes(links.iter().any(|&(t, sp, dir)| {
                    t == *tor
                        && sp == *spine
                        && ((dir == LinkDir::Up && *up) || (dir == LinkDir::Down && *down))
                })),
                None if could => Crosses::Maybe,
                None => Crosses::No,
            }
        }
        Target::Unknown => Crosses::No,
    }
}

/// The newest SERVICE window of `p`, when it falls in the finding's windows (from a
/// window before the first blamed one to its last sighting).
fn measured(f: &Finding, p: &ServicePath) -> Option<(u64, u64, u64)> {
    let s = p.latest.as_ref()?;
    let window_ns = (s.window_duration_ms.max(1) as u64) * 1_000_000;
    let windows = f.evidence.as_ref().map_or(1, |e| e.windows.max(1)) as u64;
    let from = f
        .opened_unix_ns
        .saturating_sub((windows + 1).saturating_mul(window_ns));
    let end = s.window_start_unix_ns.saturating_add(window_ns);
    (end > from && s.window_start_unix_ns <= f.last_seen_unix_ns).then_some((
        s.probe_total as u64,
        s.probe_failed as u64,
        s.network_rtt_p99_ns,
    ))
}

/// The workloads whose live service paths (`paths`, with their newest SERVICE window
/// joined) cross `f`'s component, worst first, at most [`MAX_IMPACT`].
pub fn impact(
    f: &Finding,
    paths: &[ServicePath],
    idx: &RegistryIndex,
    topo: Option<&Topology>,
) -> Vec<FindingImpact> {
    let t = target(f, topo);
    if matches!(t, Target::Unknown) {
        return Vec::new();
    }
    let mut by: BTreeMap<&str, FindingImpact> = BTreeMap::new();
    for p in paths {
        let c = crosses(&t, p, idx, topo);
        let e = by
            .entry(p.service.as_str())
            .or_insert_with(|| FindingImpact {
                service: p.service.clone(),
                workload: p.workload.clone(),
                ..Default::default()
            });
        e.paths_total += 1;
        match c {
            Crosses::No => {}
            Crosses::Maybe => e.paths_uncertain += 1,
            Crosses::Yes => {
                e.paths_affected += 1;
                if let Some((total, failed, p99)) = measured(f, p) {
                    e.probe_total += total;
                    e.probe_failed += failed;
                    e.network_rtt_p99_ns = e.network_rtt_p99_ns.max(p99);
                }
            }
        }
    }
    let mut out: Vec<FindingImpact> = by
        .into_values()
        .filter(|e| e.paths_affected + e.paths_uncertain > 0)
        .collect();
    out.sort_by(|a, b| {
        (b.paths_affected, b.probe_failed, b.paths_uncertain)
            .cmp(&(a.paths_affected, a.probe_failed, a.paths_uncertain))
            .then_with(|| a.service.cmp(&b.service))
    });
    out.truncate(MAX_IMPACT);
    out
}

#[cfg(test)]
mod tests;
