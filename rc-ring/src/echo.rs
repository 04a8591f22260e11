//! The depth-one echo probe over a pair of rings, and the polling budget around it.
//!
//! The prober writes a probe into the peer's ring; the peer's poller writes an echo into
//! ours. Both sides poll, so both bound their polling to short windows:
//! - the prober polls hot from its write until the echo or `hot_wait`, then cold;
//! - each probe tells the responder when the next one comes (`next_gap`), and the
//!   responder polls hot only from `lead` before that moment to `grace` after it.
//!
//! A sample is exact only when both sides caught the message while polling hot: the
//! responder reports, in the echo, whether it saw the slot empty in the same hot window
//! before the probe appeared (so arrival is bracketed by one poll), and its turnaround
//! (detection to echo write). Network RTT = total − turnaround.
//!
//! Message (ring payload, 32 bytes, little-endian): kind u8 (1 probe, 2 echo), flags u8
//! (echo bit 0: caught hot), 2 reserved, next_gap_us u32, probe id u64, turnaround ns u64,
//! 8 reserved.

pub const ECHO_LEN: usize = 32;
const KIND_PROBE: u8 = 1;
const KIND_ECHO: u8 = 2;
const CAUGHT_HOT: u8 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EchoMsg {
    Probe {
        id: u64,
        next_gap_us: u32,
    },
    Echo {
        id: u64,
        caught_hot: bool,
        turnaround_ns: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EchoError {
    #[error("echo-probe message of {0} bytes (32 expected)")]
    Length(usize),
    #[error("echo-probe message of kind {0}")]
    Kind(u8),
}

impl EchoMsg {
    pub fn encode(&self) -> [u8; ECHO_LEN] {
        let mut b = [0u8; ECHO_LEN];
        match *self {
            EchoMsg::Probe { id, next_gap_us } => {
                b[0] = KIND_PROBE;
                b[4..8].copy_from_slice(&next_gap_us.to_le_bytes());
                b[8..16].copy_from_slice(&id.to_le_bytes());
            }
            EchoMsg::Echo {
                id,
                caught_hot,
                turnaround_ns,
            } => {
                b[0] = KIND_ECHO;
                b[1] = if caught_hot { CAUGHT_HOT } else { 0 };
                b[8..16].copy_from_slice(&id.to_le_bytes());
                b[16..24].copy_from_slice(&turnaround_ns.to_le_bytes());
            }
        }
        b
    }

    pub fn decode(b: &[u8]) -> Result<EchoMsg, EchoError> {
        if b.len() != ECHO_LEN {
            return Err(EchoError::Length(b.len()));
        }
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        match b[0] {
            KIND_PROBE => Ok(EchoMsg::Probe {
                id: u64_at(8),
                next_gap_us: u32::from_le_bytes(b[4..8].try_into().unwrap()),
            }),
            KIND_ECHO => Ok(EchoMsg::Echo {
                id: u64_at(8),
                caught_hot: b[1] & CAUGHT_HOT != 0,
                turnaround_ns: u64_at(16),
            }),
            k => Err(EchoError::Kind(k)),
        }
    }
}

/// One finished probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Both sides caught their message hot: the RTT is exact.
    Rtt {
        id: u64,
        total_ns: u64,
        responder_ns: u64,
        network_ns: u64,
    },
    /// Answered, but one side found its message on a cold poll: reachable, RTT unknown.
    Late { id: u64 },
    /// No echo within the timeout.
    Lost { id: u64 },
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    id: u64,
    sent_ns: u64,
}

/// Prober side of one ring pair: one probe in flight at a time.
#[derive(Debug)]
pub struct EchoProber {
    interval_ns: u64,
    timeout_ns: u64,
    hot_wait_ns: u64,
    next_id: u64,
    next_due_ns: u64,
    pending: Option<Pending>,
}

impl EchoProber {
    /// `first_due_ns`: when the first probe goes (callers spread rings over the interval).
    pub fn new(
        interval_ns: u64,
        timeout_ns: u64,
        hot_wait_ns: u64,
        first_due_ns: u64,
    ) -> EchoProber {
        assert!(interval_ns > 0 && timeout_ns > 0 && timeout_ns <= interval_ns);
        EchoProber {
            interval_ns,
            timeout_ns,
            hot_wait_ns,
            next_id: 1,
            next_due_ns: first_due_ns,
            pending: None,
        }
    }

    /// The probe to write now, if one is due and none is in flight.
    pub fn due(&mut self, now_ns: u64) -> Option<EchoMsg> {
        if self.pending.is_some() || now_ns < self.next_due_ns {
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.pending = Some(Pending {
            id,
            sent_ns: now_ns,
        });
        // Keep the phase: the responder was told this gap.
        self.next_due_ns = (self.next_due_ns + self.interval_ns).max(now_ns + 1);
        let gap = self.next_due_ns - now_ns;
        Some(EchoMsg::Probe {
            id,
            next_gap_us: (gap / 1000).min(u32::MAX as u64) as u32,
        })
    }

    /// An echo read from our ring; `hot`: our poller was in its hot phase when it found it.
    /// Echoes of probes no longer pending (timed out) are dropped.
    pub fn on_echo(&mut self, msg: EchoMsg, hot: bool, now_ns: u64) -> Option<Outcome> {
        let EchoMsg::Echo {
            id,
            caught_hot,
            turnaround_ns,
        } = msg
        else {
            return None;
        };
        let p = self.pending.filter(|p| p.id == id)?;
        self.pending = None;
        let total = now_ns.saturating_sub(p.sent_ns);
        if !(hot && caught_hot) || turnaround_ns > total {
            return Some(Outcome::Late { id });
        }
        Some(Outcome::Rtt {
            id,
            total_ns: total,
            responder_ns: turnaround_ns,
            network_ns: total - turnaround_ns,
        })
    }

    /// The pending probe, if its timeout has passed.
    pub fn expire(&mut self, now_ns: u64) -> Option<Outcome> {
        let p = self.pending?;
        if now_ns < p.sent_ns + self.timeout_ns {
            return None;
        }
        self.pending = None;
        Some(Outcome::Lost { id: p.id })
    }

    /// Whether our ring should be polled hot now (a probe in flight, within `hot_wait`).
    pub fn wants_hot(&self, now_ns: u64) -> bool {
        self.pending
            .is_some_and(|p| now_ns < p.sent_ns + self.hot_wait_ns)
    }

    /// The next moment this prober needs attention (a due probe or a timeout).
    pub fn next_event_ns(&self) -> u64 {
        match self.pending {
            Some(p) => p.sent_ns + self.timeout_ns,
            None => self.next_due_ns,
        }
    }
}

/// Responder side of one ring: when to poll hot for the next probe.
#[derive(Debug)]
pub struct EchoResponder {
    lead_ns: u64,
    grace_ns: u64,
    expect_ns: Option<u64>,
    /// Saw the ring empty during the current hot window.
    saw_empty: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollPlan {
    /// Poll continuously until this moment.
    HotUntil(u64),
    /// Nothing expected before this moment; one cold check then.
    SleepUntil(u64),
}

impl EchoResponder {
    pub fn new(lead_ns: u64, grace_ns: u64) -> EchoResponder {
        EchoResponder {
            lead_ns,
            grace_ns,
            expect_ns: None,
            saw_empty: false,
        }
    }

    /// Hot inside [expected − lead, expected + grace]; otherwise sleep until the window
    /// opens or, with no schedule known (first probe, or a missed one), until `cold_ns`.
    pub fn plan(&mut self, now_ns: u64, cold_ns: u64) -> PollPlan {
        match self.expect_ns {
            Some(t) if now_ns + self.lead_ns >= t && now_ns <= t + self.grace_ns => {
                PollPlan::HotUntil(t + self.grace_ns)
            }
            Some(t) if now_ns + self.lead_ns < t => PollPlan::SleepUntil(t - self.lead_ns),
            _ => {
                // The window passed without a probe: the schedule is unknown again.
                self.expect_ns = None;
                self.saw_empty = false;
                PollPlan::SleepUntil(now_ns + cold_ns)
            }
        }
    }

    /// When the next hot window opens (None: no probe announced).
    pub fn window_opens_ns(&self) -> Option<u64> {
        self.expect_ns.map(|t| t.saturating_sub(self.lead_ns))
    }

    /// A poll found the ring empty; `hot`: inside the window.
    pub fn polled_empty(&mut self, hot: bool) {
        if hot {
            self.saw_empty = true;
        }
    }

    /// A probe found at `now_ns`: returns whether it was caught hot, and learns the next.
    pub fn on_probe(&mut self, next_gap_us: u32, hot: bool, now_ns: u64) -> bool {
        let caught = hot && self.saw_empty;
        self.saw_empty = false;
        self.expect_ns = Some(now_ns + next_gap_us as u64 * 1000);
        caught
    }
}

#[cfg(test)]
mod tests;
