//! What a packet meets between two RNICs: endpoint delays and host stalls, background
//! loss and queueing, and the scenario's faults on RNICs, ToRs and ToR-spine links.

use std::collections::HashMap;
use std::sync::Arc;

use rpingmesh_controller::pinglist::PinglistParams;
use rpingmesh_controller::registry::RegistryIndex;

use super::noise;
use crate::fabric::Fabric;
use crate::faults::FaultPlan;
use crate::rng::{threshold, Rng};
use crate::scenario::background::Background;

/// Fixed numbers of a run, in ns.
pub(super) struct Consts {
    pub(super) base: u64,
    pub(super) timeout: u64,
    pub(super) link: u64,
    pub(super) jitter: u64,
    pub(super) bg_local: u64,
    pub(super) bg_inter: u64,
    /// With a loss spread: the two host-link traversals of an inter-ToR packet (its
    /// ToR-spine traversals are drawn per link from `World::link_bg`).
    pub(super) bg_hosts: u64,
    /// A queueing delay on a ToR-local / inter-ToR packet (2 / 4 traversals).
    pub(super) queue_local: u64,
    pub(super) queue_inter: u64,
    pub(super) queue_mean_ns: f64,
    pub(super) hiccup: u64,
    pub(super) beyond: u64,
    pub(super) rotation_sec: u64,
    pub(super) refresh: u64,
    pub(super) duration: u64,
    pub(super) rate: f64,
    pub(super) seed: u64,
}

/// What does not change while RNICs run: the fabric, the faults, the registry.
pub(super) struct World {
    pub(super) fabric: Fabric,
    pub(super) plan: FaultPlan,
    /// Per directed ToR-spine link (`2 * (tor * spines + spine) + down`), its background
    /// loss threshold; empty when every link has the same (the old single draw).
    pub(super) link_bg: Vec<u64>,
    pub(super) host_off: Vec<u64>,
    pub(super) k: Consts,
    pub(super) index: RegistryIndex,
    pub(super) gid_index: HashMap<String, u32>,
    pub(super) pinglist: PinglistParams,
    pub(super) focus_rate: f64,
    /// Unix seconds every agent registered (and keeps heartbeating) at.
    pub(super) registered_sec: u64,
    pub(super) empty: Arc<str>,
}

/// Per directed ToR-spine link, its background loss threshold (empty without a spread:
/// every link then has the same, drawn once per packet as before).
pub(super) fn link_backgrounds(fabric: &Fabric, bg: &Background, rng: &mut Rng) -> Vec<u64> {
    if bg.loss_spread <= 1.0 {
        return Vec::new();
    }
    let links = 2 * (fabric.spec.tors * fabric.spec.spines) as usize;
    let ln = bg.loss_spread.ln();
    (0..links)
        .map(|_| threshold(bg.loss_per_link * (ln * (2.0 * rng.unit() - 1.0)).exp()))
        .collect()
}

impl World {
    /// An endpoint processing delay: base + uniform jitter, sometimes a hiccup.
    #[inline]
    pub(super) fn endpoint(&self, (base, span): (u64, u64), rng: &mut Rng) -> u64 {
        let mut d = base + rng.below(span.max(1));
        if rng.hit(self.k.hiccup) {
            d += rng.exp(noise::HICCUP_MEAN_NS) as u64;
        }
        d
    }

    /// Extra processing delay of host `h` handling a packet at `t`.
    #[inline]
    pub(super) fn stall(&self, h: u32, t: u64, rng: &mut Rng) -> u64 {
        match self.plan.stall(h, t) {
            None => 0,
            Some(mean) => {
                if rng.hit(self.k.beyond) {
                    // Late beyond the probe timeout: the probe times out.
                    self.k.timeout + rng.below(self.k.timeout)
                } else {
                    rng.exp(mean) as u64
                }
            }
        }
    }

    /// Carries a packet from RNIC `src` to RNIC `dst` (each with its ToR) over spine
    /// `spine` (None: both under one ToR), leaving at `t`: its arrival, or None when it
    /// is dropped.
    #[inline]
    pub(super) fn traverse(
        &self,
        (src, st): (u32, u32),
        (dst, dt): (u32, u32),
        spine: Option<u32>,
        t: u64,
        rng: &mut Rng,
    ) -> Option<u64> {
        let p = &self.plan;
        let k = &self.k;
        if p.rnic_drops(src, t, rng) {
            return None;
        }
        match spine {
            Some(s) if !self.link_bg.is_empty() => {
                let i = 2 * (st * self.fabric.spec.spines + s) as usize;
                let j = 2 * (dt * self.fabric.spec.spines + s) as usize + 1;
                if rng.hit(k.bg_hosts) || rng.hit(self.link_bg[i]) || rng.hit(self.link_bg[j]) {
                    return None;
                }
            }
            _ => {
                let bg = if spine.is_some() {
                    k.bg_inter
                } else {
                    k.bg_local
                };
                if rng.hit(bg) {
                    return None;
                }
            }
        }
        let j = rng.next_u64();
        let lat = |i: u32| k.link + ((((j >> (16 * i)) & 0xFFFF) * k.jitter) >> 16);
        let mut t = t + lat(0);
        let queue = if spine.is_some() {
            k.queue_inter
        } else {
            k.queue_local
        };
        if queue > 0 && rng.hit(queue) {
            t += rng.exp(k.queue_mean_ns) as u64;
        }
        if p.tor_down(st, t) {
            return None;
        }
        if let Some(s) = spine {
            t += p.cross_link(st, s, true, t, rng)?;
            t += lat(1);
            t += p.cross_link(dt, s, false, t, rng)?;
            t += lat(2);
            if p.tor_down(dt, t) {
                return None;
            }
            t += lat(3);
        } else {
            t += lat(1);
        }
        if p.rnic_drops(dst, t, rng) {
            return None;
        }
        Some(t)
    }
}
