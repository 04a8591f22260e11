//! Faults compiled for the hot path: per RNIC, host, ToR and directed ToR-spine link,
//! the faults on it with their schedules in virtual ns since the scenario start. An
//! element without faults costs one empty-slice check per packet.

use crate::fabric::Fabric;
use crate::rng::Rng;
use crate::scenario::{FaultKind, Scenario};

/// [start, end) in virtual ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    pub start: u64,
    pub end: u64,
}

impl Interval {
    fn of(start_sec: f64, end_sec: f64) -> Self {
        Interval {
            start: secs_to_ns(start_sec),
            end: secs_to_ns(end_sec),
        }
    }
    #[inline]
    pub fn contains(&self, t: u64) -> bool {
        t >= self.start && t < self.end
    }
}

pub fn secs_to_ns(s: f64) -> u64 {
    (s * 1e9).round().max(0.0) as u64
}

/// A flap's cycle: down for `down_ns` of every `period_ns`, the cycle shifted by `phase_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flap {
    pub period_ns: u64,
    pub down_ns: u64,
    pub phase_ns: u64,
}

#[derive(Debug, Clone, Copy)]
struct RnicFault {
    at: Interval,
    flap: Option<Flap>,
    /// Drop probability while down (1 for rnic_down and rnic_flap).
    loss: f64,
}

#[derive(Debug, Clone, Copy)]
struct Stall {
    at: Interval,
    mean_ns: f64,
}

#[derive(Debug, Clone, Copy)]
struct LinkFault {
    at: Interval,
    /// Drop probability (1 for link_down).
    loss: f64,
    add_ns: u64,
}

/// Every fault of a scenario, indexed by the element it sits on.
#[derive(Debug, Default)]
pub struct FaultPlan {
    rnic: Vec<Vec<RnicFault>>,
    host: Vec<Vec<Stall>>,
    tor: Vec<Vec<Interval>>,
    /// Index `tor * spines + spine`: ToR to spine, and spine to ToR.
    link_up: Vec<Vec<LinkFault>>,
    link_down: Vec<Vec<LinkFault>>,
    spines: u32,
}

impl FaultPlan {
    /// Compiles the faults of a validated scenario; `rng` draws the flap phases.
    pub fn new(s: &Scenario, fabric: &Fabric, rng: &mut Rng) -> FaultPlan {
        let spines = fabric.spec.spines;
        let mut p = FaultPlan {
            rnic: vec![Vec::new(); fabric.rnics.len()],
            host: vec![Vec::new(); fabric.hosts.len()],
            tor: vec![Vec::new(); fabric.tors.len()],
            link_up: vec![Vec::new(); (fabric.spec.tors * spines) as usize],
            link_down: vec![Vec::new(); (fabric.spec.tors * spines) as usize],
            spines,
        };
        for f in &s.faults {
            let at = Interval::of(f.start_sec, f.end_sec);
            let link = |p: &FaultPlan| {
                let (t, s) = fabric.link_index(&f.location).expect("validated location");
                (t * p.spines + s) as usize
            };
            match f.kind {
                FaultKind::RnicDown | FaultKind::RnicFlap { .. } | FaultKind::RnicLoss { .. } => {
                    let r = fabric.rnic_index(&f.location).expect("validated location");
                    let loss = match f.kind {
                        FaultKind::RnicLoss { loss } => loss,
                        _ => 1.0,
                    };
                    let flap = match f.kind {
                        FaultKind::RnicFlap {
                            period_sec,
                            down_fraction,
                        } => {
                            let period_ns = secs_to_ns(period_sec).max(1);
                            Some(Flap {
                                period_ns,
                                down_ns: (period_ns as f64 * down_fraction).round() as u64,
                                phase_ns: rng.below(period_ns),
                            })
                        }
                        _ => None,
                    };
                    p.rnic[r as usize].push(RnicFault { at, flap, loss });
                }
                FaultKind::HostStall { delay_us } => {
                    let h = fabric.host_index(&f.location).expect("validated location");
                    p.host[h as usize].push(Stall {
                        at,
                        mean_ns: delay_us * 1e3,
                    });
                }
                FaultKind::TorDown => {
                    let t = fabric.tor_index(&f.location).expect("validated location");
                    p.tor[t as usize].push(at);
                }
                FaultKind::LinkLoss { loss, direction } => {
                    let i = link(&p);
                    let lf = LinkFault {
                        at,
                        loss,
                        add_ns: 0,
                    };
                    if direction.covers_up() {
                        p.link_up[i].push(lf);
                    }
                    if direction.covers_down() {
                        p.link_down[i].push(lf);
                    }
                }
                FaultKind::LinkDown => {
                    let i = link(&p);
                    let lf = LinkFault {
                        at,
                        loss: 1.0,
                        add_ns: 0,
                    };
                    p.link_up[i].push(lf);
                    p.link_down[i].push(lf);
                }
                FaultKind::LinkLatency { add_us, direction } => {
                    let i = link(&p);
                    let lf = LinkFault {
                        at,
                        loss: 0.0,
                        add_ns: (add_us * 1e3).round() as u64,
                    };
                    if direction.covers_up() {
                        p.link_up[i].push(lf);
                    }
                    if direction.covers_down() {
                        p.link_down[i].push(lf);
                    }
                }
            }
        }
        p
    }

    /// Is RNIC `r` down at `t` (down, or in the down part of a flap cycle)?
    #[inline]
    pub fn rnic_down(&self, r: u32, t: u64) -> bool {
        self.rnic_loss(r, t) >= 1.0
    }

    /// The share of RNIC `r`'s packets dropped at `t` (1 while down).
    #[inline]
    pub fn rnic_loss(&self, r: u32, t: u64) -> f64 {
        let fs = &self.rnic[r as usize];
        if fs.is_empty() {
            return 0.0;
        }
        fs.iter()
            .filter(|f| {
                f.at.contains(t)
                    && match f.flap {
                        None => true,
                        Some(fl) => flap_down(&fl, t - f.at.start),
                    }
            })
            .map(|f| f.loss)
            .fold(0.0, f64::max)
    }

    /// Whether a packet to or from RNIC `r` at `t` is dropped by its faults.
    #[inline]
    pub fn rnic_drops(&self, r: u32, t: u64, rng: &mut Rng) -> bool {
        if self.rnic[r as usize].is_empty() {
            return false;
        }
        let loss = self.rnic_loss(r, t);
        loss >= 1.0 || (loss > 0.0 && rng.unit() < loss)
    }

    /// The flap cycle of the RNIC's first flap fault (tests).
    pub fn flap_of(&self, r: u32) -> Option<Flap> {
        self.rnic[r as usize].iter().find_map(|f| f.flap)
    }

    /// Mean extra processing delay (ns) of host `h` stalled at `t`.
    #[inline]
    pub fn stall(&self, h: u32, t: u64) -> Option<f64> {
        let fs = &self.host[h as usize];
        if fs.is_empty() {
            return None;
        }
        fs.iter().find(|f| f.at.contains(t)).map(|f| f.mean_ns)
    }

    #[inline]
    pub fn tor_down(&self, tor: u32, t: u64) -> bool {
        let fs = &self.tor[tor as usize];
        !fs.is_empty() && fs.iter().any(|i| i.contains(t))
    }

    /// A packet entering ToR `tor`'s link to spine `spine` at `t`, going up (ToR to
    /// spine) or down: None when dropped, else the latency the faults add.
    #[inline]
    pub fn cross_link(&self, tor: u32, spine: u32, up: bool, t: u64, rng: &mut Rng) -> Option<u64> {
        let i = (tor * self.spines + spine) as usize;
        let fs = if up {
            &self.link_up[i]
        } else {
            &self.link_down[i]
        };
        if fs.is_empty() {
            return Some(0);
        }
        let mut add = 0;
        for f in fs.iter().filter(|f| f.at.contains(t)) {
            if f.loss >= 1.0 || (f.loss > 0.0 && rng.unit() < f.loss) {
                return None;
            }
            add += f.add_ns;
        }
        Some(add)
    }
}

/// Whether a flap is in its down part `since` ns after the fault started.
#[inline]
pub fn flap_down(f: &Flap, since: u64) -> bool {
    (since + f.phase_ns) % f.period_ns < f.down_ns
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(faults: &str) -> (Scenario, Fabric) {
        let text = format!(
            "seed: 3\nduration_sec: 1000\nfabric: {{tors: 2, spines: 2, hosts_per_tor: 2, rnics_per_host: 2, link_latency_us: 1, link_jitter_us: 0}}\nfaults:\n{faults}"
        );
        let s = Scenario::from_yaml(&text).unwrap();
        let f = Fabric::new(&s.fabric, 0);
        (s, f)
    }

    #[test]
    fn flap_duty_cycle_and_schedule() {
        let (s, fab) = scenario(
            "  - {kind: rnic_flap, location: h1-2/r1, start_sec: 100, end_sec: 700, period_sec: 20, down_fraction: 0.3}\n",
        );
        let p = FaultPlan::new(&s, &fab, &mut Rng::new(9));
        let r = fab.rnic_index("h1-2/r1").unwrap();
        let fl = p.flap_of(r).unwrap();
        assert_eq!(fl.period_ns, 20_000_000_000);
        assert_eq!(fl.down_ns, 6_000_000_000);
        assert!(fl.phase_ns < fl.period_ns);
        // Sampled every 10 ms inside the fault: 30% down, each cycle one down stretch.
        let step = 10_000_000u64;
        let (mut down, mut n, mut edges) = (0u64, 0u64, 0u64);
        let mut prev = false;
        for k in 0..(600_000_000_000 / step) {
            let t = 100_000_000_000 + k * step;
            let d = p.rnic_down(r, t);
            down += d as u64;
            n += 1;
            if d && !prev {
                edges += 1;
            }
            prev = d;
        }
        let duty = down as f64 / n as f64;
        assert!((duty - 0.3).abs() < 0.01, "duty {duty}");
        assert!((30..=31).contains(&edges), "down stretches {edges}");
        // Outside the schedule, and other RNICs: up.
        assert!(!p.rnic_down(r, 99_999_999_999));
        assert!(!p.rnic_down(r, 700_000_000_000));
        assert!((0..fab.rnics.len() as u32)
            .filter(|&o| o != r)
            .all(|o| !p.rnic_down(o, 400_000_000_000)));
        // Another seed, another phase.
        let q = FaultPlan::new(&s, &fab, &mut Rng::new(10));
        assert_ne!(q.flap_of(r).unwrap().phase_ns, fl.phase_ns);
    }

    #[test]
    fn schedules_are_half_open_and_directions_apply() {
        let (s, fab) = scenario(
            "  - {kind: rnic_down, location: h1-1/r0, start_sec: 10, end_sec: 20}\n  - {kind: tor_down, location: tor2, start_sec: 10, end_sec: 20}\n  - {kind: host_stall, location: h2-1, start_sec: 10, end_sec: 20, delay_us: 500}\n  - {kind: link_loss, location: tor1-spine2, start_sec: 10, end_sec: 20, loss: 1, direction: up}\n  - {kind: link_latency, location: tor2-spine1, start_sec: 10, end_sec: 20, add_us: 7, direction: down}\n  - {kind: link_down, location: tor2-spine2, start_sec: 10, end_sec: 20}\n",
        );
        let p = FaultPlan::new(&s, &fab, &mut Rng::new(1));
        let sec = 1_000_000_000u64;
        let mut rng = Rng::new(5);
        let r = fab.rnic_index("h1-1/r0").unwrap();
        assert!(!p.rnic_down(r, 10 * sec - 1));
        assert!(p.rnic_down(r, 10 * sec));
        assert!(p.rnic_down(r, 20 * sec - 1));
        assert!(!p.rnic_down(r, 20 * sec));
        assert!(p.tor_down(1, 15 * sec) && !p.tor_down(0, 15 * sec));
        assert_eq!(
            p.stall(fab.host_index("h2-1").unwrap(), 15 * sec),
            Some(500_000.0)
        );
        assert_eq!(p.stall(fab.host_index("h2-1").unwrap(), 25 * sec), None);
        assert_eq!(p.stall(fab.host_index("h1-1").unwrap(), 15 * sec), None);
        // tor1-spine2 loses everything going up, nothing coming down.
        assert_eq!(p.cross_link(0, 1, true, 15 * sec, &mut rng), None);
        assert_eq!(p.cross_link(0, 1, false, 15 * sec, &mut rng), Some(0));
        assert_eq!(p.cross_link(0, 1, true, 25 * sec, &mut rng), Some(0));
        // tor2-spine1 is 7 us slower coming down only.
        assert_eq!(p.cross_link(1, 0, false, 15 * sec, &mut rng), Some(7_000));
        assert_eq!(p.cross_link(1, 0, true, 15 * sec, &mut rng), Some(0));
        // tor2-spine2 down both ways.
        assert_eq!(p.cross_link(1, 1, true, 15 * sec, &mut rng), None);
        assert_eq!(p.cross_link(1, 1, false, 15 * sec, &mut rng), None);
    }

    #[test]
    fn partial_link_loss_drops_that_share() {
        let (s, fab) = scenario(
            "  - {kind: link_loss, location: tor1-spine1, start_sec: 0, end_sec: 100, loss: 0.05}\n",
        );
        let p = FaultPlan::new(&s, &fab, &mut Rng::new(1));
        let mut rng = Rng::new(77);
        let n = 200_000;
        let lost = (0..n)
            .filter(|_| p.cross_link(0, 0, false, 1, &mut rng).is_none())
            .count();
        let share = lost as f64 / n as f64;
        assert!((share - 0.05).abs() < 0.003, "{share}");
    }
}
