//! Self-protection throttle (sans-IO): from one resource sample per watchdog interval to a
//! probe-rate multiplier on the ladder 1.0 -> 0.5 -> 0.25 -> 0.1.
//!
//! Fail-slow, not fail-closed: the multiplier is floored at 0.1 and never reaches 0, since
//! a silent agent is a monitoring blind spot. It moves at most one rung per interval, and
//! climbs back only once usage is below `RECOVERY_FRACTION` of the engage threshold, so a
//! reading that hovers at a threshold cannot make it flap.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The multiplier rungs, unthrottled first. The last one is the floor.
pub const LADDER: [f64; 4] = [1.0, 0.5, 0.25, 0.1];

/// Recovery needs usage below this fraction of the engage threshold (hysteresis band).
pub const RECOVERY_FRACTION: f64 = 0.75;

/// Engage thresholds, resolved from the config keys.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// Fraction of the available CPU capacity (1.0 = every allowed core busy).
    pub cpu_fraction: f64,
    /// RSS in bytes; None = memory throttling off (max_memory_mb = 0).
    pub memory_bytes: Option<u64>,
}

impl Thresholds {
    /// `throttle_cpu_percent` (0-100], `max_memory_mb` (0 = no memory throttling) and
    /// `throttle_memory_ratio` (0-1], as validated by the config.
    pub fn new(throttle_cpu_percent: f64, max_memory_mb: u64, throttle_memory_ratio: f64) -> Self {
        let memory_bytes = (max_memory_mb > 0).then(|| {
            let budget = max_memory_mb.saturating_mul(1024 * 1024) as f64;
            (budget * throttle_memory_ratio) as u64
        });
        Thresholds {
            cpu_fraction: throttle_cpu_percent / 100.0,
            memory_bytes,
        }
    }
}

/// One interval's usage of this process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// CPU time used / (wall time x available cores); may exceed 1.0 briefly.
    pub cpu_fraction: f64,
    pub rss_bytes: u64,
}

/// A change worth a warn line: throttling started, or it ended completely.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Left 1.0.
    Engaged,
    /// Back at 1.0.
    Released,
}

/// The result of one observation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    pub multiplier: f64,
    /// The multiplier moved this interval.
    pub changed: bool,
    pub transition: Option<Transition>,
}

/// The throttle state: which rung of `LADDER` is in force.
#[derive(Debug, Clone)]
pub struct Throttle {
    thresholds: Thresholds,
    rung: usize,
}

impl Throttle {
    pub fn new(thresholds: Thresholds) -> Self {
        Throttle {
            thresholds,
            rung: 0,
        }
    }

    pub fn multiplier(&self) -> f64 {
        LADDER[self.rung]
    }

    /// At or over a threshold.
    fn pressured(&self, s: &Sample) -> bool {
        let cpu = s.cpu_fraction >= self.thresholds.cpu_fraction;
        let mem = self
            .thresholds
            .memory_bytes
            .is_some_and(|t| s.rss_bytes >= t);
        cpu || mem
    }

    /// Clearly under every threshold. A NaN CPU reading is neither pressured nor calm:
    /// the multiplier holds.
    fn calm(&self, s: &Sample) -> bool {
        let cpu = s.cpu_fraction < self.thresholds.cpu_fraction * RECOVERY_FRACTION;
        let mem = self
            .thresholds
            .memory_bytes
            .is_none_or(|t| (s.rss_bytes as f64) < t as f64 * RECOVERY_FRACTION);
        cpu && mem
    }

    /// Feeds one interval's sample; moves at most one rung.
    pub fn observe(&mut self, s: Sample) -> Step {
        let before = self.rung;
        if self.pressured(&s) {
            self.rung = (self.rung + 1).min(LADDER.len() - 1);
        } else if self.calm(&s) {
            self.rung = self.rung.saturating_sub(1);
        }
        let transition = match (before, self.rung) {
            (0, r) if r > 0 => Some(Transition::Engaged),
            (b, 0) if b > 0 => Some(Transition::Released),
            _ => None,
        };
        Step {
            multiplier: self.multiplier(),
            changed: before != self.rung,
            transition,
        }
    }
}

/// The live multiplier, shared between the watchdog (writer) and the drivers (readers):
/// one relaxed atomic load per driver turn.
#[derive(Debug, Clone)]
pub struct SharedMultiplier(Arc<AtomicU64>);

impl Default for SharedMultiplier {
    fn default() -> Self {
        SharedMultiplier(Arc::new(AtomicU64::new(1.0f64.to_bits())))
    }
}

impl SharedMultiplier {
    pub fn get(&self) -> f64 {
        f64::from_bits(self.bits())
    }

    /// The raw bits: a cheap change detector for readers.
    pub fn bits(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Stores `m` clamped to [floor, 1.0]; NaN is ignored (probing must never stop).
    pub fn set(&self, m: f64) {
        if m.is_nan() {
            return;
        }
        let m = m.clamp(LADDER[LADDER.len() - 1], 1.0);
        self.0.store(m.to_bits(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1024 * 1024;

    fn cpu(f: f64) -> Sample {
        Sample {
            cpu_fraction: f,
            rss_bytes: 0,
        }
    }

    fn mem(bytes: u64) -> Sample {
        Sample {
            cpu_fraction: 0.0,
            rss_bytes: bytes,
        }
    }

    fn cpu_only() -> Throttle {
        Throttle::new(Thresholds::new(90.0, 0, 0.9))
    }

    #[test]
    fn thresholds_resolve_from_config_keys() {
        let t = Thresholds::new(90.0, 100, 0.5);
        assert!((t.cpu_fraction - 0.9).abs() < 1e-12);
        assert_eq!(t.memory_bytes, Some(50 * MB));
        assert_eq!(Thresholds::new(90.0, 0, 0.5).memory_bytes, None);
    }

    #[test]
    fn ladder_steps_one_rung_per_interval_down_to_the_floor() {
        let mut t = cpu_only();
        let got: Vec<_> = (0..6).map(|_| t.observe(cpu(0.95))).collect();
        let ms: Vec<f64> = got.iter().map(|s| s.multiplier).collect();
        assert_eq!(ms, [0.5, 0.25, 0.1, 0.1, 0.1, 0.1]);
        assert_eq!(got[0].transition, Some(Transition::Engaged));
        assert!(got[1..].iter().all(|s| s.transition.is_none()));
        assert!(got[2].changed && !got[3].changed);
        // Floor: never 0, whatever the pressure.
        assert!(got.iter().all(|s| s.multiplier >= 0.1));
    }

    #[test]
    fn recovery_climbs_one_rung_per_interval_and_releases_at_one() {
        let mut t = cpu_only();
        for _ in 0..3 {
            t.observe(cpu(1.0));
        }
        let got: Vec<_> = (0..4).map(|_| t.observe(cpu(0.1))).collect();
        let ms: Vec<f64> = got.iter().map(|s| s.multiplier).collect();
        assert_eq!(ms, [0.25, 0.5, 1.0, 1.0]);
        assert_eq!(got[2].transition, Some(Transition::Released));
        assert_eq!(got[3].transition, None);
        assert!(!got[3].changed);
    }

    #[test]
    fn hysteresis_band_holds_the_multiplier() {
        let mut t = cpu_only();
        t.observe(cpu(0.9)); // at the threshold: engages
        assert_eq!(t.multiplier(), 0.5);
        // 0.675 = 75% of 0.9: not below it, so no recovery; below 0.9, so no step down.
        for f in [0.8, 0.7, 0.675, 0.89] {
            let s = t.observe(cpu(f));
            assert_eq!((s.multiplier, s.changed), (0.5, false), "at {f}");
        }
        assert_eq!(t.observe(cpu(0.67)).multiplier, 1.0);
    }

    #[test]
    fn hovering_at_the_threshold_does_not_flap() {
        let mut t = cpu_only();
        // Alternating just over and just under the threshold only ever steps down.
        let mut changes = 0;
        let mut last = 1.0;
        for i in 0..20 {
            let s = t.observe(cpu(if i % 2 == 0 { 0.91 } else { 0.89 }));
            assert!(s.multiplier <= last, "went back up at {i}");
            changes += usize::from(s.changed);
            last = s.multiplier;
        }
        assert_eq!(changes, 3);
        assert_eq!(last, 0.1);
    }

    #[test]
    fn memory_throttles_only_with_a_budget() {
        // No budget: any RSS is fine.
        let mut t = cpu_only();
        assert_eq!(t.observe(mem(u64::MAX)).multiplier, 1.0);
        // 100 MiB budget, engage at 90 MiB, recover below 67.5 MiB.
        let mut t = Throttle::new(Thresholds::new(90.0, 100, 0.9));
        assert_eq!(t.observe(mem(89 * MB)).multiplier, 1.0);
        let s = t.observe(mem(90 * MB));
        assert_eq!(
            (s.multiplier, s.transition),
            (0.5, Some(Transition::Engaged))
        );
        assert_eq!(t.observe(mem(70 * MB)).multiplier, 0.5, "in the band");
        assert_eq!(t.observe(mem(60 * MB)).multiplier, 1.0);
    }

    #[test]
    fn either_resource_engages_and_both_must_calm_down() {
        let mut t = Throttle::new(Thresholds::new(50.0, 100, 0.5));
        t.observe(Sample {
            cpu_fraction: 0.6,
            rss_bytes: 0,
        });
        assert_eq!(t.multiplier(), 0.5);
        // CPU calm, memory in its band: hold.
        let s = t.observe(Sample {
            cpu_fraction: 0.0,
            rss_bytes: 40 * MB,
        });
        assert_eq!(s.multiplier, 0.5);
        // CPU in its band, memory calm: hold.
        let s = t.observe(Sample {
            cpu_fraction: 0.4,
            rss_bytes: 0,
        });
        assert_eq!(s.multiplier, 0.5);
        let s = t.observe(Sample {
            cpu_fraction: 0.3,
            rss_bytes: 30 * MB,
        });
        assert_eq!(s.multiplier, 1.0);
    }

    #[test]
    fn nan_cpu_holds() {
        let mut t = cpu_only();
        t.observe(cpu(1.0));
        let s = t.observe(cpu(f64::NAN));
        assert_eq!((s.multiplier, s.changed), (0.5, false));
    }

    #[test]
    fn shared_multiplier_clamps_and_ignores_nan() {
        let m = SharedMultiplier::default();
        assert_eq!(m.get(), 1.0);
        let other = m.clone();
        other.set(0.25);
        assert_eq!(m.get(), 0.25);
        m.set(0.0);
        assert_eq!(m.get(), 0.1);
        m.set(f64::NAN);
        assert_eq!(m.get(), 0.1);
        m.set(3.0);
        assert_eq!(m.get(), 1.0);
    }
}
