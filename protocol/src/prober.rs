//! Prober side: sequence numbers, outstanding probes, ACK matching (any order), timeouts.

use std::collections::VecDeque;

use foldhash::{HashMap, HashMapExt};

use crate::rtt::{self, InvalidReason, RttSample, Timestamps};
use crate::wire::{AckType, MsgType, ProbePacket};
use crate::TargetId;

#[derive(Debug, Clone, Copy)]
pub struct ProberConfig {
    /// Random per-agent epoch: the high 32 bits of every sequence number.
    pub epoch: u32,
    /// A probe without both ACKs after this long is finished (lost or invalid).
    pub timeout_ns: u64,
    /// Bound on outstanding probes; the oldest is expired as lost beyond it.
    pub max_in_flight: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeResult {
    Success(RttSample),
    Invalid(InvalidReason),
    /// No ACK at all within the timeout.
    Lost,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeOutcome {
    pub target: TargetId,
    pub sequence: u64,
    pub flow_label: u32,
    pub timestamps: Timestamps,
    pub result: ProbeResult,
}

/// Counters for input the prober dropped (bad or late ACKs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProberCounters {
    pub unknown_sequence: u64,
    pub duplicate_ack: u64,
}

/// One probe waiting for its send completion and ACKs.
#[derive(Debug, Clone, Copy)]
struct Outstanding {
    target: TargetId,
    flow_label: u32,
    ts: Timestamps,
    deadline: u64,
    sent: bool,
    first_ack: bool,
    second_ack: bool,
}

impl Outstanding {
    fn outcome(&self, sequence: u64, result: ProbeResult) -> ProbeOutcome {
        ProbeOutcome {
            target: self.target,
            sequence,
            flow_label: self.flow_label,
            timestamps: self.ts,
            result,
        }
    }
    /// Everything that can arrive has arrived (a zero T3/T4 in an ACK stays `None`, so a
    /// complete probe may still be invalid).
    fn done(&self) -> bool {
        self.sent && self.first_ack && self.second_ack
    }
    /// Result of a probe finished early (timeout or eviction).
    fn expired_result(&self) -> ProbeResult {
        if self.first_ack || self.second_ack {
            ProbeResult::Invalid(InvalidReason::MissingTimestamp)
        } else {
            ProbeResult::Lost
        }
    }
}

/// Prober state machine. Outstanding probes live in a map keyed by sequence; their
/// deadlines sit in a queue in send order (the timeout is constant, so it is sorted).
/// Entries of finished probes are left in the queue and skipped lazily; the front is
/// always kept live so `next_timeout` is O(1).
pub struct Prober {
    cfg: ProberConfig,
    counter: u32,
    outstanding: HashMap<u64, Outstanding>,
    deadlines: VecDeque<(u64, u64)>,
    /// Outcomes of probes evicted by `max_in_flight`, handed out by `poll_timeouts`.
    evicted: Vec<ProbeOutcome>,
    evicted_total: u64,
    counters: ProberCounters,
}

impl Prober {
    pub fn new(cfg: ProberConfig) -> Self {
        Prober {
            cfg,
            counter: 0,
            outstanding: HashMap::new(),
            deadlines: VecDeque::new(),
            evicted: Vec::new(),
            evicted_total: 0,
            counters: ProberCounters::default(),
        }
    }

    /// Starts a probe; `t1_mono_ns` is CLOCK_MONOTONIC just before the send. Returns the
    /// packet to send (sequence = epoch << 32 | counter).
    ///
    /// When `max_in_flight` probes are already outstanding, the oldest is finished early
    /// (lost, or invalid if partially answered); its outcome comes out of the next
    /// `poll_timeouts` (and `next_timeout` returns 0 until then).
    pub fn start_probe(
        &mut self,
        target: TargetId,
        flow_label: u32,
        t1_mono_ns: u64,
    ) -> ProbePacket {
        let sequence = ((self.cfg.epoch as u64) << 32) | self.counter as u64;
        self.counter = self.counter.wrapping_add(1);
        let limit = self.cfg.max_in_flight.max(1);
        while self.outstanding.len() >= limit {
            let Some((_, seq)) = self.deadlines.pop_front() else {
                break;
            };
            if let Some(o) = self.outstanding.remove(&seq) {
                self.evicted.push(o.outcome(seq, o.expired_result()));
                self.evicted_total += 1;
            }
            self.skip_stale();
        }
        // A wrapped counter could meet a still-outstanding twin only after 2^32 probes
        // within one timeout; the newer probe replaces it.
        let deadline = t1_mono_ns.saturating_add(self.cfg.timeout_ns);
        self.outstanding.insert(
            sequence,
            Outstanding {
                target,
                flow_label,
                ts: Timestamps {
                    t1: Some(t1_mono_ns),
                    ..Timestamps::default()
                },
                deadline,
                sent: false,
                first_ack: false,
                second_ack: false,
            },
        );
        self.deadlines.push_back((deadline, sequence));
        ProbePacket::probe(sequence, t1_mono_ns)
    }

    /// The send completion (T2) of probe `sequence`; may arrive before or after the ACKs.
    /// Returns the outcome if this completes the probe. A completion for an unknown or
    /// finished probe is ignored.
    pub fn on_probe_sent(
        &mut self,
        sequence: u64,
        t2_ns: u64,
        _now_mono_ns: u64,
    ) -> Option<ProbeOutcome> {
        let o = self.outstanding.get_mut(&sequence)?;
        if o.sent {
            return None;
        }
        o.sent = true;
        o.ts.t2 = Some(t2_ns);
        self.finish_if_done(sequence)
    }

    /// An ACK arrived. `rx_ts_ns` is its receive completion timestamp (T5 for the first
    /// ACK); `now_mono_ns` is when it is processed (T6 for the second ACK).
    /// Returns the outcome when this completes the probe. A zero T3/T4 in the ACK means
    /// the responder had no timestamp: it stays missing and the result is invalid.
    pub fn on_ack(
        &mut self,
        ack: &ProbePacket,
        rx_ts_ns: Option<u64>,
        now_mono_ns: u64,
    ) -> Option<ProbeOutcome> {
        if ack.msg_type != MsgType::Ack {
            return None;
        }
        let Some(o) = self.outstanding.get_mut(&ack.sequence) else {
            self.counters.unknown_sequence += 1;
            return None;
        };
        let nonzero = |v: u64| (v != 0).then_some(v);
        let seen = match ack.ack_type {
            AckType::First => &mut o.first_ack,
            AckType::Second => &mut o.second_ack,
            AckType::None => return None,
        };
        if *seen {
            self.counters.duplicate_ack += 1;
            return None;
        }
        *seen = true;
        // Both ACKs carry T3: whichever arrives first sets it.
        o.ts.t3 = o.ts.t3.or(nonzero(ack.t3));
        if ack.ack_type == AckType::First {
            o.ts.t5 = rx_ts_ns;
        } else {
            o.ts.t4 = nonzero(ack.t4);
            o.ts.t6 = Some(now_mono_ns);
        }
        self.finish_if_done(ack.sequence)
    }

    /// Finishes probes whose timeout passed (lost, or invalid when partially answered),
    /// and hands out probes evicted by the in-flight bound.
    pub fn poll_timeouts(&mut self, now_mono_ns: u64, out: &mut Vec<ProbeOutcome>) {
        out.append(&mut self.evicted);
        while let Some(&(deadline, seq)) = self.deadlines.front() {
            if deadline > now_mono_ns {
                break;
            }
            self.deadlines.pop_front();
            if let Some(o) = self.outstanding.get(&seq) {
                if o.deadline == deadline {
                    let o = self.outstanding.remove(&seq).expect("present");
                    out.push(o.outcome(seq, o.expired_result()));
                }
            }
        }
        self.skip_stale();
    }

    /// Earliest deadline among outstanding probes (0 while evicted outcomes wait to be
    /// collected by `poll_timeouts`).
    pub fn next_timeout(&self) -> Option<u64> {
        if !self.evicted.is_empty() {
            return Some(0);
        }
        self.deadlines.front().map(|&(d, _)| d)
    }

    pub fn in_flight(&self) -> usize {
        self.outstanding.len()
    }

    pub fn counters(&self) -> ProberCounters {
        self.counters
    }

    /// Probes finished early because `max_in_flight` was reached.
    pub fn evicted_total(&self) -> u64 {
        self.evicted_total
    }

    fn finish_if_done(&mut self, sequence: u64) -> Option<ProbeOutcome> {
        let o = self.outstanding.get(&sequence)?;
        if !o.done() {
            return None;
        }
        let o = self.outstanding.remove(&sequence)?;
        let result = match rtt::compute(&o.ts) {
            Ok(s) => ProbeResult::Success(s),
            Err(r) => ProbeResult::Invalid(r),
        };
        self.skip_stale();
        Some(o.outcome(sequence, result))
    }

    /// Drops queue entries of finished probes from the front.
    fn skip_stale(&mut self) {
        while let Some(&(deadline, seq)) = self.deadlines.front() {
            match self.outstanding.get(&seq) {
                Some(o) if o.deadline == deadline => break,
                _ => {
                    self.deadlines.pop_front();
                }
            }
        }
    }
}

/// Convenience for callers that only need the numbers.
impl ProbeResult {
    pub fn sample(&self) -> Option<RttSample> {
        match self {
            ProbeResult::Success(s) => Some(*s),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
