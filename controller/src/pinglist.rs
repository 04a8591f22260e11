//! Pinglist generation (pure: index + clock value + RNG in, targets out).
//!
//! ToR mesh: every active RNIC on the requester's ToR except the requester itself.
//! Inter-ToR: `inter_tor_sample_size` distinct other ToRs chosen uniformly among ToRs
//! with at least one active RNIC, and one uniformly chosen active RNIC from each.

use rand::Rng;
use rpingmesh_proto::controller_agent::{PingTarget, PinglistType};

use crate::registry::{RegistryIndex, RnicRecord};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinglistParams {
    pub active_threshold_sec: u64,
    pub inter_tor_sample_size: usize,
    /// Eq.(1) result, already capped.
    pub flow_label_count: u32,
}

/// An RNIC is active when it was refreshed within the active threshold.
pub fn is_active(r: &RnicRecord, now: u64, active_threshold_sec: u64) -> bool {
    now.saturating_sub(r.last_updated) <= active_threshold_sec
}

/// The flow-label seed of the (requester, target) pair: FNV-1a (32 bit) over the two
/// GIDs' text, as the Go controller derives it. Stable across pinglist refreshes, so a
/// target's label set (and its time series) changes only by the agent's rotation.
pub fn flow_label_seed(requester: &str, target_gid: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in requester.bytes().chain(target_gid.bytes()) {
        h = (h ^ b as u32).wrapping_mul(0x0100_0193);
    }
    h
}

/// Builds a target stamped with its pinglist type and the pair's flow-label seed.
pub fn make_target(
    r: &RnicRecord,
    ty: PinglistType,
    flow_label_count: u32,
    requester: &str,
) -> PingTarget {
    let seed = flow_label_seed(requester, &r.gid);
    PingTarget {
        target_gid: r.gid.clone(),
        target_qpn: r.qpn,
        target_ip: r.ip_address.clone(),
        target_hostname: r.host_name.clone(),
        target_tor_id: r.tor_id.clone(),
        target_device_name: r.device_name.clone(),
        source_port: 0,
        // Legacy single label for peers that ignore flow_label_count.
        flow_label: seed & 0xF_FFFF,
        priority: 0,
        flow_label_count,
        flow_label_seed: seed,
        pinglist_type: ty as i32,
        traffic_class: 0,
        service_level: 0,
        service: String::new(),
        flow_labels: Vec::new(),
    }
}

/// Active RNICs on `tor_id` minus the `exclude`d GIDs (the requester's); `requester`
/// (its GID, or agent id) keys the flow-label seeds.
pub fn tor_mesh(
    index: &RegistryIndex,
    tor_id: &str,
    exclude: &[&str],
    requester: &str,
    now: u64,
    p: &PinglistParams,
) -> Vec<PingTarget> {
    let gids = index.tor_gids(tor_id);
    let mut out = Vec::with_capacity(gids.len().saturating_sub(1));
    for g in gids {
        if exclude.contains(&g.as_str()) {
            continue;
        }
        if let Some(r) = index.rnic(g) {
            if is_active(r, now, p.active_threshold_sec) {
                out.push(make_target(
                    r,
                    PinglistType::TorMesh,
                    p.flow_label_count,
                    requester,
                ));
            }
        }
    }
    out
}

/// One random active RNIC of a ToR (reservoir sampling: no allocation).
fn pick_active<'a, R: Rng + ?Sized>(
    index: &'a RegistryIndex,
    gids: &[String],
    now: u64,
    active: u64,
    rng: &mut R,
) -> Option<&'a RnicRecord> {
    let mut chosen = None;
    let mut seen = 0u32;
    for g in gids {
        if let Some(r) = index.rnic(g) {
            if is_active(r, now, active) {
                seen += 1;
                if rng.random_range(0..seen) == 0 {
                    chosen = Some(r);
                }
            }
        }
    }
    chosen
}

fn has_active(index: &RegistryIndex, gids: &[String], now: u64, active: u64) -> bool {
    gids.iter()
        .any(|g| index.rnic(g).is_some_and(|r| is_active(r, now, active)))
}

/// One active RNIC from each of up to `inter_tor_sample_size` distinct ToRs other than
/// `requester_tor`. Rejection sampling over the dense ToR list keeps the common case
/// O(sample size); when eligible ToRs are scarce it falls back to one scan.
pub fn inter_tor<R: Rng + ?Sized>(
    index: &RegistryIndex,
    requester_tor: &str,
    requester: &str,
    now: u64,
    p: &PinglistParams,
    rng: &mut R,
) -> Vec<PingTarget> {
    let n = index.tor_count();
    let k = p.inter_tor_sample_size;
    let act = p.active_threshold_sec;
    let mut chosen: Vec<usize> = Vec::with_capacity(k);
    if n == 0 || k == 0 {
        return Vec::new();
    }
    let max_attempts = 4 * k + 16;
    let mut attempts = 0;
    while chosen.len() < k && attempts < max_attempts {
        attempts += 1;
        let i = rng.random_range(0..n);
        if chosen.contains(&i) {
            continue;
        }
        let (id, gids) = index.tor_at(i);
        if id == requester_tor || !has_active(index, gids, now, act) {
            continue;
        }
        chosen.push(i);
    }
    if chosen.len() < k {
        // Uniform over the remaining eligible ToRs, so the overall sample stays uniform.
        let mut eligible: Vec<usize> = (0..n)
            .filter(|i| !chosen.contains(i))
            .filter(|&i| {
                let (id, gids) = index.tor_at(i);
                id != requester_tor && has_active(index, gids, now, act)
            })
            .collect();
        while chosen.len() < k && !eligible.is_empty() {
            let j = rng.random_range(0..eligible.len());
            chosen.push(eligible.swap_remove(j));
        }
    }
    let mut out = Vec::with_capacity(chosen.len());
    for i in chosen {
        let (_, gids) = index.tor_at(i);
        if let Some(r) = pick_active(index, gids, now, act, rng) {
            out.push(make_target(
                r,
                PinglistType::InterTor,
                p.flow_label_count,
                requester,
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::AgentRecord;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;
    use std::collections::HashSet;

    fn gid(tor: u32, i: u32) -> String {
        rpingmesh_proto::gid::normalize_gid(&format!("fd00::{tor:x}:{i:x}")).unwrap()
    }

    /// `tors` ToRs with `per` RNICs each, one agent per RNIC, all registered at `now`.
    fn build(tors: u32, per: u32, now: u64) -> RegistryIndex {
        let mut idx = RegistryIndex::default();
        for t in 0..tors {
            for i in 0..per {
                let agent = AgentRecord {
                    agent_id: format!("a-{t}-{i}"),
                    tor_id: format!("tor-{t}"),
                    ..Default::default()
                };
                let r = RnicRecord {
                    gid: gid(t, i),
                    qpn: 100 + i,
                    ip_address: format!("10.{t}.0.{i}"),
                    host_name: format!("h-{t}-{i}"),
                    tor_id: format!("tor-{t}"),
                    device_name: "mlx5_0".into(),
                    agent_id: String::new(),
                    last_updated: 0,
                };
                idx.register_agent(&agent, &[r], now);
            }
        }
        idx.check();
        idx
    }

    fn params(k: usize) -> PinglistParams {
        PinglistParams {
            active_threshold_sec: 300,
            inter_tor_sample_size: k,
            flow_label_count: 64,
        }
    }

    #[test]
    fn tor_mesh_excludes_requester_and_inactive() {
        let mut idx = build(3, 4, 1000);
        // tor-0 RNIC 3 was last refreshed long ago: inactive (but not yet removed).
        idx.touch("a-0-3", 500);
        let me = gid(0, 0);
        let list = tor_mesh(&idx, "tor-0", &[me.as_str()], &me, 1000, &params(5));
        let got: HashSet<_> = list.iter().map(|t| t.target_gid.clone()).collect();
        assert_eq!(got, HashSet::from([gid(0, 1), gid(0, 2)]));
        for t in &list {
            assert_eq!(t.pinglist_type, PinglistType::TorMesh as i32);
            assert_eq!(t.target_tor_id, "tor-0");
            assert_eq!(t.flow_label_count, 64);
            assert_eq!(t.flow_label, t.flow_label_seed & 0xFFFFF);
        }
        // Exactly at the threshold is still active.
        assert_eq!(
            tor_mesh(&idx, "tor-0", &[me.as_str()], &me, 800, &params(5)).len(),
            3
        );
        assert!(tor_mesh(&idx, "no-such-tor", &[], "x", 1000, &params(5)).is_empty());
    }

    #[test]
    fn inter_tor_picks_distinct_other_tors_one_rnic_each() {
        let idx = build(50, 3, 1000);
        let mut rng = SmallRng::seed_from_u64(7);
        for _ in 0..200 {
            let list = inter_tor(&idx, "tor-0", "req", 1000, &params(5), &mut rng);
            assert_eq!(list.len(), 5);
            let tors: HashSet<_> = list.iter().map(|t| t.target_tor_id.as_str()).collect();
            assert_eq!(tors.len(), 5, "distinct ToRs");
            assert!(!tors.contains("tor-0"), "never the requester's ToR");
            for t in &list {
                assert_eq!(t.pinglist_type, PinglistType::InterTor as i32);
                let r = idx.rnic(&t.target_gid).unwrap();
                assert_eq!(r.tor_id, t.target_tor_id);
            }
        }
    }

    #[test]
    fn inter_tor_covers_all_tors_and_rnics_over_time() {
        let idx = build(10, 3, 1000);
        let mut rng = SmallRng::seed_from_u64(3);
        let mut seen_tors = HashSet::new();
        let mut seen_gids = HashSet::new();
        for _ in 0..500 {
            for t in inter_tor(&idx, "tor-0", "req", 1000, &params(2), &mut rng) {
                seen_tors.insert(t.target_tor_id);
                seen_gids.insert(t.target_gid);
            }
        }
        assert_eq!(seen_tors.len(), 9);
        assert_eq!(seen_gids.len(), 27);
    }

    #[test]
    fn inter_tor_sample_larger_than_available() {
        let mut idx = build(4, 2, 1000);
        // tor-3 has only inactive RNICs: not eligible.
        idx.touch("a-3-0", 10);
        idx.touch("a-3-1", 10);
        let mut rng = SmallRng::seed_from_u64(9);
        let list = inter_tor(&idx, "tor-0", "req", 1000, &params(10), &mut rng);
        let tors: HashSet<_> = list.iter().map(|t| t.target_tor_id.as_str()).collect();
        assert_eq!(tors, HashSet::from(["tor-1", "tor-2"]));
        assert_eq!(list.len(), 2);
        // Requester alone in the fabric: nothing to probe.
        let solo = build(1, 2, 1000);
        assert!(inter_tor(&solo, "tor-0", "req", 1000, &params(5), &mut rng).is_empty());
    }

    #[test]
    fn inactive_rnic_never_chosen_inter_tor() {
        let mut idx = build(3, 2, 1000);
        idx.touch("a-1-0", 1);
        let mut rng = SmallRng::seed_from_u64(11);
        for _ in 0..100 {
            for t in inter_tor(&idx, "tor-0", "req", 1000, &params(2), &mut rng) {
                assert_ne!(t.target_gid, gid(1, 0));
            }
        }
    }

    #[test]
    fn seeded_rng_is_deterministic_and_seeds_vary_per_target() {
        let idx = build(20, 4, 1000);
        let seeded = || {
            let mut rng = SmallRng::seed_from_u64(42);
            inter_tor(&idx, "tor-0", "req", 1000, &params(5), &mut rng)
        };
        let (a, b) = (seeded(), seeded());
        assert_eq!(a, b);
        let seeds: HashSet<_> = a.iter().map(|t| t.flow_label_seed).collect();
        assert_eq!(seeds.len(), a.len());
    }

    #[test]
    fn flow_label_seeds_are_stable_per_pair_as_go() {
        // FNV-1a 32 of the two texts (reference value computed by hand for "ab"+"c").
        assert_eq!(flow_label_seed("ab", "c"), 0x1a47_e90b);
        assert_eq!(flow_label_seed("", ""), 0x811c_9dc5);
        let idx = build(3, 4, 1000);
        let me = gid(0, 0);
        let once = tor_mesh(&idx, "tor-0", &[me.as_str()], &me, 1000, &params(5));
        let again = tor_mesh(&idx, "tor-0", &[me.as_str()], &me, 1000, &params(5));
        assert_eq!(once, again, "a refresh hands out the same seeds");
        for t in &once {
            assert_eq!(t.flow_label_seed, flow_label_seed(&me, &t.target_gid));
            assert_eq!(t.flow_label, t.flow_label_seed & 0xF_FFFF);
        }
        // Another requester, other seeds for the same targets.
        let other = gid(0, 1);
        let theirs = tor_mesh(&idx, "tor-0", &[other.as_str()], &other, 1000, &params(5));
        let t = &theirs[1];
        let mine = once.iter().find(|m| m.target_gid == t.target_gid).unwrap();
        assert_ne!(mine.flow_label_seed, t.flow_label_seed);
    }
}
