//! Liveness policy (pure): the heartbeat the controller asks of agents, and how it
//! notices that it was not itself watching (stopped, paused, stalled), so that the time
//! it could not hear heartbeats never counts against the agents.

/// The heartbeat the controller asks of agents: three per active threshold (two may be
/// lost before the agent goes inactive), at most the Go agent's 60 s, at least 1 s.
pub fn heartbeat_interval_sec(active_threshold_sec: u64) -> u32 {
    (active_threshold_sec / 3).clamp(1, 60) as u32
}

/// Period of the controller's own watch tick.
pub const WATCH_TICK_NS: u64 = 1_000_000_000;

/// Notices gaps in the controller's own timeline. It is observed every
/// [`WATCH_TICK_NS`] by a ticker and before every liveness decision; a gap between two
/// observations longer than two ticks means the process did not run (SIGSTOP, a paused
/// VM, a stall), and the unwatched part (the gap minus one tick) is returned, rounded up
/// to whole seconds, for the registry to excuse.
#[derive(Debug, Default)]
pub struct StallWatch {
    last_ns: Option<u64>,
}

impl StallWatch {
    /// `mono_ns`: a monotonic clock. Returns the seconds to excuse, if any.
    pub fn observe(&mut self, mono_ns: u64) -> Option<u64> {
        let prev = self
            .last_ns
            .replace(mono_ns.max(self.last_ns.unwrap_or(0)))?;
        let gap = mono_ns.saturating_sub(prev);
        (gap > 2 * WATCH_TICK_NS).then(|| (gap - WATCH_TICK_NS).div_ceil(1_000_000_000))
    }
}

#[cfg(test)]
mod tests;
