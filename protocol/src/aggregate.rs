//! Per-path aggregation over fixed windows into PathSummary-shaped records.
//!
//! Counting is exact. Percentiles are exact nearest-rank over the kept samples: up to
//! `SAMPLE_CAP` successful probes per (key, window) are all kept; beyond that a uniform
//! reservoir (Algorithm R, deterministic xorshift PRNG) of `SAMPLE_CAP` probes is kept, so
//! memory per path stays bounded at any probe rate. Min/max RTT stay exact.
//!
//! Probes recorded with a flow label are also counted per label (inter-ToR paths), so the
//! controller can tell which ECMP paths of a pair lose or slow probes: a bad ToR-spine link
//! shows only on the labels hashed across it.

use std::collections::BTreeMap;

use foldhash::HashMap;
use std::hash::Hash;

use crate::prober::ProbeResult;
use crate::rtt::RttSample;

/// Samples kept per (key, window) before reservoir sampling starts.
pub const SAMPLE_CAP: usize = 16_384;

/// Distinct flow labels counted per (key, window); probes on further labels count in the
/// path totals only (the flow-label set is capped at 64 by default, plus rotation).
pub const LABEL_CAP: usize = 256;

/// RTT samples kept per label and window for its median (first ones win; labels see a
/// few probes per window at pinglist rates).
const LABEL_SAMPLE_CAP: usize = 64;

/// A label whose RTT median exceeds its path's fastest probe by this much is slow: its
/// window is worth its per-label detail, and the controller counts its probes as slow
/// (both sides read this one constant, so a window without detail has no slow label).
pub const SLOW_LABEL_EXCESS_NS: u64 = 5_000;

/// One flow label's share of a path window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSummary {
    pub flow_label: u32,
    pub probe_total: u32,
    pub probe_failed: u32,
    /// Answered but invalid (one ACK lost, or a bad timestamp).
    pub probe_invalid: u32,
    pub network_rtt_p50_ns: u64,
    pub network_rtt_max_ns: u64,
}

#[derive(Debug, Default)]
struct LabelAcc {
    label: u32,
    total: u32,
    failed: u32,
    invalid: u32,
    rtt_max: u64,
    rtts: Vec<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WindowSummary {
    pub window_start_unix_ns: u64,
    pub window_duration_ms: u32,
    pub probe_total: u32,
    pub probe_success: u32,
    /// Lost probes.
    pub probe_failed: u32,
    /// Answered probes whose result was invalid (never reported as numbers).
    pub invalid_rtt_count: u32,
    pub network_rtt_min_ns: u64,
    pub network_rtt_max_ns: u64,
    pub network_rtt_p50_ns: u64,
    pub network_rtt_p99_ns: u64,
    pub prober_delay_p50_ns: u64,
    pub prober_delay_p99_ns: u64,
    pub responder_delay_p50_ns: u64,
    pub responder_delay_p99_ns: u64,
    /// Per flow label, sorted by label; empty unless probes were recorded with labels.
    pub labels: Vec<LabelSummary>,
}

impl WindowSummary {
    /// Whether the per-label detail says something: a lost or incomplete probe, or a
    /// slow label (its median [`SLOW_LABEL_EXCESS_NS`] over the path's fastest probe).
    /// Clean windows leave it out, which keeps reports from 100,000 RNICs small.
    pub fn label_detail_needed(&self) -> bool {
        if self.labels.is_empty() {
            return false;
        }
        if self.probe_failed > 0
            || self.invalid_rtt_count > 0
            || self
                .labels
                .iter()
                .any(|l| l.probe_failed > 0 || l.probe_invalid > 0)
        {
            return true;
        }
        let slow = self.network_rtt_min_ns.saturating_add(SLOW_LABEL_EXCESS_NS);
        self.labels.iter().any(|l| {
            l.probe_total > l.probe_failed + l.probe_invalid && l.network_rtt_p50_ns >= slow
        })
    }
}

#[derive(Debug, Default)]
struct Acc {
    total: u32,
    success: u32,
    failed: u32,
    invalid: u32,
    rtt_min: u64,
    rtt_max: u64,
    network: Vec<u64>,
    prober: Vec<u64>,
    responder: Vec<u64>,
    labels: Vec<LabelAcc>,
    rng: u64,
}

impl Acc {
    fn add_sample(&mut self, s: &RttSample, cap: usize) {
        if self.success == 0 {
            self.rtt_min = s.network_rtt_ns;
            self.rtt_max = s.network_rtt_ns;
        } else {
            self.rtt_min = self.rtt_min.min(s.network_rtt_ns);
            self.rtt_max = self.rtt_max.max(s.network_rtt_ns);
        }
        self.success += 1;
        if self.network.len() < cap {
            self.network.push(s.network_rtt_ns);
            self.prober.push(s.prober_delay_ns);
            self.responder.push(s.responder_delay_ns);
            return;
        }
        // Algorithm R: the k-th sample replaces a random slot with probability cap/k.
        let j = (self.next_rand() % self.success as u64) as usize;
        if j < cap {
            self.network[j] = s.network_rtt_ns;
            self.prober[j] = s.prober_delay_ns;
            self.responder[j] = s.responder_delay_ns;
        }
    }

    fn add_label(&mut self, label: u32, result: &ProbeResult) {
        // Linear scan: a path sees tens of labels per window.
        let i = match self.labels.iter().position(|l| l.label == label) {
            Some(i) => i,
            None if self.labels.len() < LABEL_CAP => {
                self.labels.push(LabelAcc {
                    label,
                    ..Default::default()
                });
                self.labels.len() - 1
            }
            None => return,
        };
        let l = &mut self.labels[i];
        l.total = l.total.saturating_add(1);
        match result {
            ProbeResult::Success(s) => {
                l.rtt_max = l.rtt_max.max(s.network_rtt_ns);
                if l.rtts.len() < LABEL_SAMPLE_CAP {
                    l.rtts.push(s.network_rtt_ns);
                }
            }
            ProbeResult::Lost => l.failed = l.failed.saturating_add(1),
            ProbeResult::Invalid(_) => l.invalid = l.invalid.saturating_add(1),
        }
    }

    fn next_rand(&mut self) -> u64 {
        // xorshift64*; seeded lazily with a fixed non-zero constant.
        if self.rng == 0 {
            self.rng = 0x2545_F491_4F6C_DD1D;
        }
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn summary(mut self, start: u64, window_ns: u64) -> WindowSummary {
        let (n50, n99) = p50_p99(&mut self.network);
        let (p50, p99) = p50_p99(&mut self.prober);
        let (r50, r99) = p50_p99(&mut self.responder);
        let mut labels: Vec<LabelSummary> = self
            .labels
            .into_iter()
            .map(|mut l| {
                l.rtts.sort_unstable();
                LabelSummary {
                    flow_label: l.label,
                    probe_total: l.total,
                    probe_failed: l.failed,
                    probe_invalid: l.invalid,
                    network_rtt_p50_ns: nearest_rank(&l.rtts, 50),
                    network_rtt_max_ns: l.rtt_max,
                }
            })
            .collect();
        labels.sort_unstable_by_key(|l| l.flow_label);
        WindowSummary {
            window_start_unix_ns: start,
            window_duration_ms: (window_ns / 1_000_000).min(u32::MAX as u64) as u32,
            probe_total: self.total,
            probe_success: self.success,
            probe_failed: self.failed,
            invalid_rtt_count: self.invalid,
            network_rtt_min_ns: self.rtt_min,
            network_rtt_max_ns: self.rtt_max,
            network_rtt_p50_ns: n50,
            network_rtt_p99_ns: n99,
            prober_delay_p50_ns: p50,
            prober_delay_p99_ns: p99,
            responder_delay_p50_ns: r50,
            responder_delay_p99_ns: r99,
            labels,
        }
    }
}

/// Nearest-rank percentile of sorted data: the value at rank ceil(p/100 * n).
pub fn nearest_rank(sorted: &[u64], p: u32) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let n = sorted.len() as u64;
    let rank = (p.min(100) as u64 * n).div_ceil(100).max(1);
    sorted[(rank - 1) as usize]
}

fn p50_p99(v: &mut [u64]) -> (u64, u64) {
    v.sort_unstable();
    (nearest_rank(v, 50), nearest_rank(v, 99))
}

/// Accumulates probe outcomes per key in windows aligned to multiples of `window_ns`.
pub struct PathAggregator<K> {
    window_ns: u64,
    cap: usize,
    /// window start -> per-key accumulators.
    windows: BTreeMap<u64, HashMap<K, Acc>>,
}

impl<K: Hash + Eq + Clone> PathAggregator<K> {
    /// Windows are aligned to multiples of `window_ns` of unix time (0 is treated as 1 ns).
    pub fn new(window_ns: u64) -> Self {
        Self::with_sample_cap(window_ns, SAMPLE_CAP)
    }

    /// Like `new` with another per-window sample cap (at least 1).
    pub fn with_sample_cap(window_ns: u64, cap: usize) -> Self {
        PathAggregator {
            window_ns: window_ns.max(1),
            cap: cap.max(1),
            windows: BTreeMap::new(),
        }
    }

    /// Counts `result` in the window containing `now_unix_ns`: every result adds to
    /// probe_total; Success to probe_success (and the samples), Lost to probe_failed,
    /// Invalid to invalid_rtt_count.
    pub fn record(&mut self, key: &K, result: &ProbeResult, now_unix_ns: u64) {
        self.record_labelled(key, result, None, now_unix_ns);
    }

    /// Like `record`, and also counts the probe under its flow label when one is given.
    pub fn record_labelled(
        &mut self,
        key: &K,
        result: &ProbeResult,
        flow_label: Option<u32>,
        now_unix_ns: u64,
    ) {
        let start = now_unix_ns - now_unix_ns % self.window_ns;
        let cap = self.cap;
        let window = self.windows.entry(start).or_default();
        let acc = match window.get_mut(key) {
            Some(a) => a,
            None => window.entry(key.clone()).or_default(),
        };
        acc.total = acc.total.saturating_add(1);
        match result {
            ProbeResult::Success(s) => acc.add_sample(s, cap),
            ProbeResult::Lost => acc.failed = acc.failed.saturating_add(1),
            ProbeResult::Invalid(_) => acc.invalid = acc.invalid.saturating_add(1),
        }
        if let Some(label) = flow_label {
            acc.add_label(label, result);
        }
    }

    /// Summaries of every window that ended at or before `now_unix_ns`, oldest first.
    pub fn take_closed(&mut self, now_unix_ns: u64) -> Vec<(K, WindowSummary)> {
        let mut out = Vec::new();
        while let Some(entry) = self.windows.first_entry() {
            let start = *entry.key();
            if start.saturating_add(self.window_ns) > now_unix_ns {
                break;
            }
            for (k, acc) in entry.remove() {
                out.push((k, acc.summary(start, self.window_ns)));
            }
        }
        out
    }

    /// Windows still open (for tests and shutdown flushes).
    pub fn open_windows(&self) -> usize {
        self.windows.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rtt::InvalidReason;

    const W: u64 = 30_000_000_000;

    fn ok(n: u64, p: u64, r: u64) -> ProbeResult {
        ProbeResult::Success(RttSample {
            network_rtt_ns: n,
            prober_delay_ns: p,
            responder_delay_ns: r,
        })
    }

    #[test]
    fn nearest_rank_values() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(nearest_rank(&v, 50), 50);
        assert_eq!(nearest_rank(&v, 99), 99);
        assert_eq!(nearest_rank(&[7], 99), 7);
        assert_eq!(nearest_rank(&[1, 2], 50), 1);
        assert_eq!(nearest_rank(&[1, 2, 3], 50), 2);
        assert_eq!(nearest_rank(&[1, 2, 3], 99), 3);
        assert_eq!(nearest_rank(&[], 50), 0);
    }

    #[test]
    fn window_counts_and_percentiles() {
        let mut a: PathAggregator<&str> = PathAggregator::new(W);
        let base = 1_700_000_010 * 1_000_000_000; // inside window [..., +30 s)
        let start = base - base % W;
        // 100 successes with rtt 1..=100 us, in shuffled order.
        for i in 0..100u64 {
            let v = (i * 37) % 100 + 1;
            a.record(&"p", &ok(v * 1_000, v * 10, v), base + i);
        }
        a.record(&"p", &ProbeResult::Lost, base + 200);
        a.record(
            &"p",
            &ProbeResult::Invalid(InvalidReason::Negative),
            base + 300,
        );
        assert!(a.take_closed(start + W - 1).is_empty());
        let out = a.take_closed(start + W);
        assert_eq!(out.len(), 1);
        let (k, s) = &out[0];
        assert_eq!(*k, "p");
        assert_eq!(
            *s,
            WindowSummary {
                window_start_unix_ns: start,
                window_duration_ms: 30_000,
                probe_total: 102,
                probe_success: 100,
                probe_failed: 1,
                invalid_rtt_count: 1,
                network_rtt_min_ns: 1_000,
                network_rtt_max_ns: 100_000,
                network_rtt_p50_ns: 50_000,
                network_rtt_p99_ns: 99_000,
                prober_delay_p50_ns: 500,
                prober_delay_p99_ns: 990,
                responder_delay_p50_ns: 50,
                responder_delay_p99_ns: 99,
                labels: vec![],
            }
        );
        assert_eq!(a.open_windows(), 0);
        assert!(a.take_closed(u64::MAX).is_empty());
    }

    #[test]
    fn windows_and_keys_are_separate() {
        let mut a: PathAggregator<u32> = PathAggregator::new(10);
        a.record(&1, &ok(5, 0, 0), 3);
        a.record(&2, &ProbeResult::Lost, 9);
        a.record(&1, &ok(7, 0, 0), 10); // next window
        a.record(&1, &ok(9, 0, 0), 25); // third window; key 2 silent there
        let mut first = a.take_closed(20);
        first.sort_by_key(|(k, s)| (s.window_start_unix_ns, *k));
        assert_eq!(first.len(), 3);
        assert_eq!(
            (
                first[0].0,
                first[0].1.window_start_unix_ns,
                first[0].1.network_rtt_p50_ns
            ),
            (1, 0, 5)
        );
        assert_eq!(
            (
                first[1].0,
                first[1].1.probe_failed,
                first[1].1.probe_success
            ),
            (2, 1, 0)
        );
        assert_eq!(first[1].1.network_rtt_p99_ns, 0);
        assert_eq!((first[2].0, first[2].1.window_start_unix_ns), (1, 10));
        let rest = a.take_closed(30);
        assert_eq!(
            rest.len(),
            1,
            "a key without probes in a window produces nothing"
        );
        assert_eq!(
            (
                rest[0].0,
                rest[0].1.window_start_unix_ns,
                rest[0].1.network_rtt_max_ns
            ),
            (1, 20, 9)
        );
    }

    #[test]
    fn labelled_probes_are_counted_per_label_too() {
        let mut a: PathAggregator<u8> = PathAggregator::new(10);
        a.record_labelled(&0, &ok(30, 0, 0), Some(7), 1);
        a.record_labelled(&0, &ok(10, 0, 0), Some(7), 2);
        a.record_labelled(&0, &ok(20, 0, 0), Some(7), 2);
        a.record_labelled(&0, &ProbeResult::Lost, Some(3), 3);
        a.record_labelled(&0, &ok(5, 0, 0), Some(3), 3);
        a.record_labelled(
            &0,
            &ProbeResult::Invalid(InvalidReason::Negative),
            Some(9),
            4,
        );
        a.record(&0, &ProbeResult::Lost, 5); // unlabelled: path totals only
        let s = &a.take_closed(10)[0].1;
        assert_eq!((s.probe_total, s.probe_failed), (7, 2));
        let l = |label, total, failed, invalid, p50, max| LabelSummary {
            flow_label: label,
            probe_total: total,
            probe_failed: failed,
            probe_invalid: invalid,
            network_rtt_p50_ns: p50,
            network_rtt_max_ns: max,
        };
        assert_eq!(
            s.labels,
            vec![
                l(3, 2, 1, 0, 5, 5),
                l(7, 3, 0, 0, 20, 30),
                l(9, 1, 0, 1, 0, 0)
            ]
        );
    }

    #[test]
    fn label_detail_only_when_it_says_something() {
        let l = |p50, failed, invalid| LabelSummary {
            flow_label: 1,
            probe_total: 2,
            probe_failed: failed,
            probe_invalid: invalid,
            network_rtt_p50_ns: p50,
            network_rtt_max_ns: p50,
        };
        let w = |labels: Vec<LabelSummary>| WindowSummary {
            probe_failed: labels.iter().map(|l| l.probe_failed).sum(),
            network_rtt_min_ns: 9_000,
            labels,
            ..Default::default()
        };
        assert!(!w(vec![]).label_detail_needed());
        // Within the slow margin of the fastest probe: nothing to say.
        assert!(!w(vec![l(10_000, 0, 0), l(13_999, 0, 0)]).label_detail_needed());
        assert!(w(vec![l(10_000, 0, 0), l(10_000, 1, 0)]).label_detail_needed());
        assert!(w(vec![l(10_000, 0, 0), l(10_000, 0, 1)]).label_detail_needed());
        assert!(w(vec![l(10_000, 0, 0), l(14_000, 0, 0)]).label_detail_needed());
        // A label whose probes all failed has no RTT to be slow with.
        assert!(w(vec![l(10_000, 0, 0), l(90_000, 2, 0)]).label_detail_needed());
    }

    #[test]
    fn labels_beyond_the_cap_count_in_the_path_only() {
        let mut a: PathAggregator<u8> = PathAggregator::new(10);
        for label in 0..(LABEL_CAP as u32 + 10) {
            a.record_labelled(&0, &ProbeResult::Lost, Some(label), 1);
        }
        let s = &a.take_closed(10)[0].1;
        assert_eq!(s.probe_failed as usize, LABEL_CAP + 10);
        assert_eq!(s.labels.len(), LABEL_CAP);
    }

    #[test]
    fn sample_cap_keeps_counting_and_reservoir_is_representative() {
        let cap = 1_000;
        let mut a: PathAggregator<u8> = PathAggregator::with_sample_cap(W, cap);
        let n = 100_000u64;
        for i in 0..n {
            // Uniform 1..=100_000 in a scrambled order.
            let v = (i * 7_919) % n + 1;
            a.record(&0, &ok(v, v, v), 5);
        }
        let out = a.take_closed(W);
        let s = &out[0].1;
        assert_eq!(s.probe_success as u64, n);
        assert_eq!(s.probe_total as u64, n);
        assert_eq!((s.network_rtt_min_ns, s.network_rtt_max_ns), (1, n));
        // Reservoir of 1000 uniform samples: p50 near 50_000, p99 near 99_000.
        assert!(
            (44_000..=56_000).contains(&s.network_rtt_p50_ns),
            "p50 {}",
            s.network_rtt_p50_ns
        );
        assert!(
            (97_000..=100_000).contains(&s.network_rtt_p99_ns),
            "p99 {}",
            s.network_rtt_p99_ns
        );
        // All three vectors were sampled from the same probes.
        assert_eq!(s.network_rtt_p50_ns, s.prober_delay_p50_ns);
        assert_eq!(s.network_rtt_p99_ns, s.responder_delay_p99_ns);
    }
}
