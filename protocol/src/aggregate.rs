//! Per-path aggregation over fixed windows into PathSummary-shaped records.

use std::collections::HashMap;
use std::hash::Hash;

use crate::prober::ProbeResult;

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
}

pub struct PathAggregator<K> {
    _k: core::marker::PhantomData<K>,
    _m: HashMap<(), ()>,
}

impl<K: Hash + Eq + Clone> PathAggregator<K> {
    /// Windows are aligned to multiples of `window_ns` of unix time.
    pub fn new(window_ns: u64) -> Self {
        todo!()
    }
    pub fn record(&mut self, key: &K, result: &ProbeResult, now_unix_ns: u64) {
        todo!()
    }
    /// Summaries of every window that ended at or before `now_unix_ns`.
    pub fn take_closed(&mut self, now_unix_ns: u64) -> Vec<(K, WindowSummary)> {
        todo!()
    }
}
