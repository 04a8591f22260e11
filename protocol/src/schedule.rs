//! Probe pacing. Every `round_interval` each target is due once; one token bucket per
//! pinglist kind (aggregate rate = per-target rate x targets of that kind) caps the sends.
//! The kinds are independent: an exhausted ToR-mesh bucket never delays inter-ToR probes.

use crate::{PinglistKind, TargetId};

#[derive(Debug, Clone)]
pub struct TokenBucket {
    _private: (),
}

impl TokenBucket {
    /// `rate_per_sec` tokens per second, at most `burst` saved.
    pub fn new(rate_per_sec: f64, burst: f64, now_ns: u64) -> Self {
        todo!()
    }
    pub fn try_take(&mut self, now_ns: u64) -> bool {
        todo!()
    }
    /// When the next token is available (now_ns if one is).
    pub fn next_available_ns(&self, now_ns: u64) -> u64 {
        todo!()
    }
}

pub struct ProbeScheduler {
    _private: (),
}

impl ProbeScheduler {
    pub fn new(round_interval_ns: u64) -> Self {
        todo!()
    }
    /// Replaces the targets of one kind. `per_target_rate` is probes/s per target (> 0).
    pub fn set_targets(&mut self, kind: PinglistKind, targets: Vec<TargetId>, per_target_rate: f64, now_ns: u64) {
        todo!()
    }
    /// Next target due at `now_ns`, if any kind has one and a token for it.
    pub fn poll(&mut self, now_ns: u64) -> Option<(PinglistKind, TargetId)> {
        todo!()
    }
    /// Earliest time `poll` may return something.
    pub fn next_wakeup_ns(&self, now_ns: u64) -> Option<u64> {
        todo!()
    }
}
