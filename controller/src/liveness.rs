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
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn heartbeat_is_a_third_of_the_active_threshold_within_bounds() {
        assert_eq!(heartbeat_interval_sec(300), 60);
        assert_eq!(heartbeat_interval_sec(900), 60);
        assert_eq!(heartbeat_interval_sec(9), 3);
        assert_eq!(heartbeat_interval_sec(1), 1);
    }

    #[test]
    fn regular_ticks_excuse_nothing_and_a_gap_excuses_its_unwatched_part() {
        let mut w = StallWatch::default();
        assert_eq!(w.observe(10 * S), None, "first observation");
        for k in 1..=5 {
            assert_eq!(w.observe(10 * S + k * S + S / 3), None);
        }
        // Handlers observe between ticks: no gap.
        assert_eq!(w.observe(15 * S + S / 2), None);
        // Stopped for 5 s: the next observation comes 6 s after the last.
        assert_eq!(w.observe(21 * S + S / 2), Some(5));
        assert_eq!(w.observe(22 * S), None, "excused once");
        // Exactly two ticks is still normal (a late tick).
        assert_eq!(w.observe(24 * S), None);
        assert_eq!(w.observe(26 * S + 1), Some(2));
        // The clock never goes back; an earlier reading changes nothing.
        assert_eq!(w.observe(20 * S), None);
        assert_eq!(w.observe(27 * S), None);
    }
}
