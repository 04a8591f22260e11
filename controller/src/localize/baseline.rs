//! What the fleet looks like when nothing is broken, learned from the windows the gray
//! detector judged clean (pure; no clock: a window is the unit of time). Every rate is a
//! pair of decayed sums (about the last `MEMORY_WINDOWS` windows) plus a weak prior, so
//! a cold controller starts cautious and the data take over within a few windows. It is
//! serialized (JSON) to the store, so a restarted controller does not start cold.

use serde::{Deserialize, Serialize};

/// Windows a learned rate remembers (e-folding), two hours of 30 s windows.
pub const MEMORY_WINDOWS: f64 = 240.0;
/// Observations a delay sketch needs before it replaces the current window's own.
const WARM_DELAYS: f64 = 500.0;

/// A rate learned as decayed (events, trials) with a prior worth `prior_trials` trials
/// at `prior_rate`.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Rate {
    pub events: f64,
    pub trials: f64,
}

impl Rate {
    pub const EMPTY: Rate = Rate {
        events: 0.0,
        trials: 0.0,
    };

    fn estimate(&self, prior_rate: f64, prior_trials: f64) -> f64 {
        (self.events + prior_rate * prior_trials) / (self.trials + prior_trials)
    }

    fn learn(&mut self, events: f64, trials: f64) {
        self.events += events;
        self.trials += trials;
    }

    fn decay(&mut self, keep: f64) {
        self.events *= keep;
        self.trials *= keep;
    }
}

/// Background events per probe of one class of paths: lost probes, and probes that came
/// back incomplete (one ACK lost: "invalid").
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LossBaseline {
    pub failed: Rate,
    pub invalid: Rate,
}

/// A cautious prior: 1e-4 per probe, worth 20,000 probes.
const PRIOR_LOSS: (f64, f64) = (1e-4, 20_000.0);
/// Slow labels: 1%, worth 1,000 answered probes.
const PRIOR_SLOW: (f64, f64) = (0.01, 1_000.0);
/// Endpoint delays past the host test's bar: 1e-3, worth 1,000 observations.
const PRIOR_EXCEED: (f64, f64) = (1e-3, 1_000.0);

impl LossBaseline {
    const EMPTY: LossBaseline = LossBaseline {
        failed: Rate::EMPTY,
        invalid: Rate::EMPTY,
    };
    /// Lost probes per probe.
    pub fn failed_rate(&self) -> f64 {
        self.failed.estimate(PRIOR_LOSS.0, PRIOR_LOSS.1)
    }
    /// Incomplete probes per probe.
    pub fn invalid_rate(&self) -> f64 {
        self.invalid.estimate(2.0 * PRIOR_LOSS.0, PRIOR_LOSS.1)
    }
    pub fn learn(&mut self, probes: f64, failed: f64, invalid: f64) {
        self.failed.learn(failed, probes);
        self.invalid.learn(invalid, probes);
    }
    fn decay(&mut self, keep: f64) {
        self.failed.decay(keep);
        self.invalid.decay(keep);
    }
}

/// Buckets of a delay sketch: sixteen per octave (4% wide) from 256 ns (bucket 0 holds
/// everything below) to about 17 s.
const PER_OCTAVE: f64 = 16.0;
const BUCKETS: usize = 416;
const BUCKET0_NS: f64 = 256.0;

/// A decayed log-scale histogram of one kind of path-level endpoint delay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DelaySketch {
    pub counts: Vec<f64>,
}

impl Default for DelaySketch {
    fn default() -> Self {
        DelaySketch {
            counts: vec![0.0; BUCKETS],
        }
    }
}

fn bucket_of(ns: u64) -> usize {
    let x = (ns as f64).max(1.0) / BUCKET0_NS;
    if x <= 1.0 {
        return 0;
    }
    ((x.log2() * PER_OCTAVE).ceil() as usize).min(BUCKETS - 1)
}

fn bucket_top_ns(i: usize) -> f64 {
    BUCKET0_NS * 2f64.powf(i as f64 / PER_OCTAVE)
}

impl DelaySketch {
    pub fn add(&mut self, ns: u64, weight: f64) {
        if self.counts.len() != BUCKETS {
            self.counts = vec![0.0; BUCKETS];
        }
        self.counts[bucket_of(ns)] += weight;
    }

    pub fn total(&self) -> f64 {
        self.counts.iter().sum()
    }

    /// The q-quantile (upper bucket bound, ns); 0 when empty.
    pub fn quantile(&self, q: f64) -> f64 {
        let total = self.total();
        if total <= 0.0 {
            return 0.0;
        }
        let want = q.clamp(0.0, 1.0) * total;
        let mut seen = 0.0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= want && *c > 0.0 {
                return bucket_top_ns(i);
            }
        }
        bucket_top_ns(BUCKETS - 1)
    }

    fn decay(&mut self, keep: f64) {
        for c in &mut self.counts {
            *c *= keep;
        }
    }

    /// Whether it has seen enough to stand for the fleet.
    pub fn warm(&self) -> bool {
        self.total() >= WARM_DELAYS
    }
}

/// One kind of endpoint delay: its sketch and how often healthy hosts pass the bar.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct DelayBaseline {
    pub sketch: DelaySketch,
    pub exceed: Rate,
}

impl DelayBaseline {
    /// The bar a stalled host's paths clear: the p99 plus four times its distance from
    /// the median, and at least a quarter of the median (robust to a few stalled hosts
    /// in the data, which a p99.9 is not; and not a hair above a tight fleet's p99).
    pub fn bar(sketch: &DelaySketch) -> f64 {
        let (p50, p99) = (sketch.quantile(0.5), sketch.quantile(0.99));
        p99 + (4.0 * (p99 - p50)).max(0.25 * p50)
    }
    pub fn exceed_rate(&self) -> f64 {
        self.exceed
            .estimate(PRIOR_EXCEED.0, PRIOR_EXCEED.1)
            .max(PRIOR_EXCEED.0)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Baseline {
    /// Windows learned from.
    pub windows: u64,
    /// ToR-local paths (no ToR-spine link).
    pub local: LossBaseline,
    /// Inter-ToR paths.
    pub inter: LossBaseline,
    /// Share of answered inter-ToR probes on a label slower than the path's fastest by
    /// the slow margin.
    pub slow: Rate,
    /// Path-level p50 and p99 of the prober's and the responder's delays.
    pub prober_p50: DelayBaseline,
    pub responder_p50: DelayBaseline,
    pub prober_p99: DelayBaseline,
    pub responder_p99: DelayBaseline,
}

impl Default for Baseline {
    fn default() -> Self {
        Baseline {
            windows: 0,
            local: LossBaseline::EMPTY,
            inter: LossBaseline::EMPTY,
            slow: Rate::EMPTY,
            prober_p50: DelayBaseline::default(),
            responder_p50: DelayBaseline::default(),
            prober_p99: DelayBaseline::default(),
            responder_p99: DelayBaseline::default(),
        }
    }
}

impl Baseline {
    pub fn slow_rate(&self) -> f64 {
        self.slow.estimate(PRIOR_SLOW.0, PRIOR_SLOW.1)
    }

    pub fn learn_slow(&mut self, slow: f64, answered: f64) {
        self.slow.learn(slow, answered);
    }

    /// Ages every learned sum by one window.
    pub fn end_window(&mut self) {
        let keep = 1.0 - 1.0 / MEMORY_WINDOWS;
        self.windows += 1;
        self.local.decay(keep);
        self.inter.decay(keep);
        self.slow.decay(keep);
        for d in self.delays_mut() {
            d.sketch.decay(keep);
            d.exceed.decay(keep);
        }
    }

    fn delays_mut(&mut self) -> [&mut DelayBaseline; 4] {
        [
            &mut self.prober_p50,
            &mut self.responder_p50,
            &mut self.prober_p99,
            &mut self.responder_p99,
        ]
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a baseline serializes")
    }

    /// A stored baseline; a damaged one is refused with the parser's message.
    pub fn from_json(bytes: &[u8]) -> Result<Baseline, String> {
        let b: Baseline = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        let finite = |r: &Rate| r.events.is_finite() && r.trials.is_finite();
        let ok = [
            b.local.failed,
            b.local.invalid,
            b.inter.failed,
            b.inter.invalid,
            b.slow,
        ]
        .iter()
        .all(finite);
        if !ok {
            return Err("a learned rate is not a finite number".into());
        }
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prior_gives_way_to_data_and_decays() {
        let mut b = Baseline::default();
        assert!((b.inter.failed_rate() - 1e-4).abs() < 1e-12);
        b.inter.learn(1_000_000.0, 10.0, 20.0);
        assert!(b.inter.failed_rate() < 2e-5, "{}", b.inter.failed_rate());
        for _ in 0..2000 {
            b.end_window();
        }
        assert!((b.inter.failed_rate() - 1e-4).abs() < 1e-5, "forgotten");
        assert_eq!(b.windows, 2000);
    }

    #[test]
    fn sketch_quantiles_and_bar() {
        let mut s = DelaySketch::default();
        for i in 0..1000u64 {
            s.add(4_000 + i, 1.0);
        }
        let p50 = s.quantile(0.5);
        assert!((4_000.0..6_000.0).contains(&p50), "{p50}");
        s.add(1_000_000, 5.0); // a stalled host's few paths
        let bar = DelayBaseline::bar(&s);
        assert!(bar < 20_000.0, "robust to a few outliers: {bar}");
        assert_eq!(DelaySketch::default().quantile(0.5), 0.0);
        assert!(s.warm());
    }

    #[test]
    fn json_round_trip_and_damage() {
        let mut b = Baseline::default();
        b.inter.learn(100.0, 1.0, 0.0);
        b.prober_p50.sketch.add(5_000, 3.0);
        let back = Baseline::from_json(&b.to_json()).unwrap();
        assert_eq!(back, b);
        assert!(Baseline::from_json(b"{\"windows\": 1}").is_err());
        assert!(Baseline::from_json(b"not json").is_err());
    }
}
