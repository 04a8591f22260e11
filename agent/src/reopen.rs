//! Re-opening a failed RNIC endpoint (rdma: QP in error state, device gone): the
//! decisions only, without I/O or clocks, so that they are unit-tested. The async loop
//! in `agent.rs` sleeps, opens and re-registers as told.

use std::time::Duration;

use rpingmesh_verbs::rdma::Backoff;
use rpingmesh_verbs::Endpoint;

/// What the supervisor does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReopenStep {
    /// Shutdown was asked for: stop this RNIC.
    Stop,
    /// Wait this long, then try to open the device again.
    Wait(Duration),
}

/// The re-open state machine of one RNIC.
#[derive(Debug, Clone)]
pub struct Reopener {
    backoff: Backoff,
    /// A driver that ran at least this long was healthy: its failure starts a fresh
    /// back-off. Shorter runs keep doubling, so a flapping device cannot spin.
    stable_after: Duration,
    failures: u64,
}

impl Reopener {
    pub fn new(backoff: Backoff, stable_after: Duration) -> Reopener {
        Reopener {
            backoff,
            stable_after,
            failures: 0,
        }
    }

    /// The driver returned after running for `ran_for`; `failed` says whether the
    /// transport failed (else it was a shutdown).
    pub fn on_driver_exit(&mut self, failed: bool, ran_for: Duration) -> ReopenStep {
        if !failed {
            return ReopenStep::Stop;
        }
        self.failures += 1;
        if ran_for >= self.stable_after {
            self.backoff.reset();
        }
        ReopenStep::Wait(self.backoff.next_delay())
    }

    /// An open attempt failed. Every failure is retried (the device may come back, e.g.
    /// after a driver reload); the delay keeps growing up to the back-off cap.
    pub fn on_open_failed(&mut self) -> ReopenStep {
        ReopenStep::Wait(self.backoff.next_delay())
    }

    /// The device is open again. True when the controller must be told: the QPN (or
    /// GID) changed, so the old registration points at a dead QP.
    pub fn on_opened(&mut self, old: Endpoint, new: Endpoint) -> bool {
        old != new
    }

    /// Transport failures seen so far.
    pub fn failures(&self) -> u64 {
        self.failures
    }

    /// Open attempts since the back-off was last reset.
    pub fn attempts(&self) -> u32 {
        self.backoff.attempts()
    }
}

impl Default for Reopener {
    /// 1 s doubling to 60 s; a run of 5 minutes counts as healthy.
    fn default() -> Self {
        Reopener::new(Backoff::default(), Duration::from_secs(300))
    }
}

#[cfg(test)]
mod tests;
