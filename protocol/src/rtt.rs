//! RTT math of the 6-timestamp protocol.
//!
//! NetworkRTT = (T5 - T2) - (T4 - T3); ProberDelay = (T6 - T1) - (T5 - T2);
//! ResponderDelay = T4 - T3. Each difference is taken within one clock domain.

/// The six timestamps of one probe, in ns. `None` = never observed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timestamps {
    pub t1: Option<u64>,
    pub t2: Option<u64>,
    pub t3: Option<u64>,
    pub t4: Option<u64>,
    pub t5: Option<u64>,
    pub t6: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RttSample {
    pub network_rtt_ns: u64,
    pub prober_delay_ns: u64,
    pub responder_delay_ns: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InvalidReason {
    MissingTimestamp,
    /// A difference came out negative (clock domain or ordering problem).
    Negative,
    /// A value above `MAX_PLAUSIBLE_NS`.
    Absurd,
}

impl InvalidReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            InvalidReason::MissingTimestamp => "missing_timestamp",
            InvalidReason::Negative => "negative_rtt",
            InvalidReason::Absurd => "absurd_rtt",
        }
    }
}

/// Anything above 10 s is not a datacenter RTT: flagged invalid, never reported.
pub const MAX_PLAUSIBLE_NS: u64 = 10_000_000_000;

impl Timestamps {
    /// All six known.
    pub fn is_complete(&self) -> bool {
        self.t1.is_some()
            && self.t2.is_some()
            && self.t3.is_some()
            && self.t4.is_some()
            && self.t5.is_some()
            && self.t6.is_some()
    }
}

/// `a - b`, or `Negative` when `a < b`.
fn diff(a: u64, b: u64) -> Result<u64, InvalidReason> {
    a.checked_sub(b).ok_or(InvalidReason::Negative)
}

/// Computes the three delays. Order of checks: missing, then negative, then absurd.
pub fn compute(ts: &Timestamps) -> Result<RttSample, InvalidReason> {
    let (Some(t1), Some(t2), Some(t3), Some(t4), Some(t5), Some(t6)) =
        (ts.t1, ts.t2, ts.t3, ts.t4, ts.t5, ts.t6)
    else {
        return Err(InvalidReason::MissingTimestamp);
    };
    // Each raw difference stays inside one clock domain: T5-T2 prober NIC/kernel clock,
    // T4-T3 responder clock, T6-T1 prober monotonic clock.
    let prober_wire = diff(t5, t2)?;
    let responder_delay = diff(t4, t3)?;
    let prober_total = diff(t6, t1)?;
    let network_rtt = diff(prober_wire, responder_delay)?;
    let prober_delay = diff(prober_total, prober_wire)?;
    if network_rtt > MAX_PLAUSIBLE_NS
        || prober_delay > MAX_PLAUSIBLE_NS
        || responder_delay > MAX_PLAUSIBLE_NS
    {
        return Err(InvalidReason::Absurd);
    }
    Ok(RttSample {
        network_rtt_ns: network_rtt,
        prober_delay_ns: prober_delay,
        responder_delay_ns: responder_delay,
    })
}

#[cfg(test)]
mod tests;
