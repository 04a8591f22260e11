//! When a UD QP that fell into the error state is reset in place (its QPN stays, so no
//! peer needs a new pinglist) and when the endpoint fails instead, to be re-opened by the
//! agent with back-off. Decisions only: no verbs calls, the caller passes the time.
//!
//! Why in place: soft-RoCE puts a UD QP in the error state when a send finds its netdev
//! down (before IBV_EVENT_PORT_ERR reaches the agent) or a datagram overflows a receive
//! slot (an MTU raised under a running agent). Re-opening costs a new QPN, a
//! re-registration and a pinglist refresh on every peer (seconds to a minute of lost
//! paths); a reset costs the probes in flight.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// In-place recoveries allowed per `RECOVERY_WINDOW`; one more fails the endpoint, so a
/// QP that keeps breaking is re-opened with back-off instead of reset in a loop.
pub const MAX_RECOVERIES: usize = 3;
pub const RECOVERY_WINDOW: Duration = Duration::from_secs(60);

/// Async events (`enum ibv_event_type`) that mean the QP itself fell into the error
/// state: QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR. CQ_ERR and DEVICE_FATAL are not: nothing
/// on the QP can mend those.
pub fn async_event_breaks_qp_only(ty: u32) -> bool {
    matches!(ty, 1..=3)
}

/// A sliding-window budget of in-place recoveries.
#[derive(Debug, Clone)]
pub struct RecoveryBudget {
    max: usize,
    window: Duration,
    recent: VecDeque<Instant>,
    total: u64,
}

impl Default for RecoveryBudget {
    fn default() -> Self {
        RecoveryBudget::new(MAX_RECOVERIES, RECOVERY_WINDOW)
    }
}

impl RecoveryBudget {
    pub fn new(max: usize, window: Duration) -> RecoveryBudget {
        RecoveryBudget {
            max,
            window,
            recent: VecDeque::with_capacity(max),
            total: 0,
        }
    }

    /// True (and counted) when one more in-place recovery at `now` is within the budget.
    pub fn try_take(&mut self, now: Instant) -> bool {
        while self
            .recent
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= self.window)
        {
            self.recent.pop_front();
        }
        if self.recent.len() >= self.max {
            return false;
        }
        self.recent.push_back(now);
        self.total += 1;
        true
    }

    /// Recoveries granted so far.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The budget, for messages: "3 in 60 s".
    pub fn describe(&self) -> String {
        format!("{} in {} s", self.max, self.window.as_secs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_recoveries_a_minute_then_the_endpoint_fails() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut b = RecoveryBudget::default();
        assert!(b.try_take(t0));
        assert!(b.try_take(t0 + s(1)));
        assert!(b.try_take(t0 + s(2)));
        // A QP that keeps breaking is not reset in a loop.
        assert!(!b.try_take(t0 + s(3)));
        assert!(!b.try_take(t0 + s(59)));
        // The first one ages out after a minute: one more is allowed, not two.
        assert!(b.try_take(t0 + s(60)));
        assert!(!b.try_take(t0 + s(60)));
        assert_eq!(b.total(), 4);
        assert_eq!(b.describe(), "3 in 60 s");
    }

    #[test]
    fn a_budget_of_zero_never_recovers() {
        let mut b = RecoveryBudget::new(0, Duration::from_secs(60));
        assert!(!b.try_take(Instant::now()));
        assert_eq!(b.total(), 0);
    }

    #[test]
    fn only_qp_events_are_mended_in_place() {
        for ty in [1, 2, 3] {
            assert!(async_event_breaks_qp_only(ty), "{ty}");
        }
        // CQ_ERR, DEVICE_FATAL, WQ_FATAL, PORT_ERR: not a QP reset's business.
        for ty in [0, 8, 19, 10] {
            assert!(!async_event_breaks_qp_only(ty), "{ty}");
        }
    }
}
