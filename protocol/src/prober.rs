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
        match ack.ack_type {
            AckType::First => {
                if o.first_ack {
                    self.counters.duplicate_ack += 1;
                    return None;
                }
                o.first_ack = true;
                o.ts.t3 = o.ts.t3.or(nonzero(ack.t3));
                o.ts.t5 = rx_ts_ns;
            }
            AckType::Second => {
                if o.second_ack {
                    self.counters.duplicate_ack += 1;
                    return None;
                }
                o.second_ack = true;
                o.ts.t3 = o.ts.t3.or(nonzero(ack.t3));
                o.ts.t4 = nonzero(ack.t4);
                o.ts.t6 = Some(now_mono_ns);
            }
            AckType::None => return None,
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
mod tests {
    use super::*;

    const EPOCH: u32 = 0xABCD_0001;

    fn prober(max_in_flight: usize) -> Prober {
        Prober::new(ProberConfig {
            epoch: EPOCH,
            timeout_ns: 1_000_000,
            max_in_flight,
        })
    }

    fn first(p: &ProbePacket, t3: u64) -> ProbePacket {
        ProbePacket::first_ack(p, t3)
    }
    fn second(p: &ProbePacket, t3: u64, t4: u64) -> ProbePacket {
        ProbePacket::second_ack(p, t3, t4)
    }

    #[test]
    fn sequence_has_epoch_and_counter() {
        let mut pr = prober(16);
        let a = pr.start_probe(1, 0, 10);
        let b = pr.start_probe(2, 0, 11);
        assert_eq!(a.sequence, (EPOCH as u64) << 32);
        assert_eq!(b.sequence, ((EPOCH as u64) << 32) | 1);
        assert_eq!(a.t1, 10);
        assert_eq!(pr.in_flight(), 2);
    }

    #[test]
    fn counter_wraps_within_epoch() {
        let mut pr = prober(4);
        pr.counter = u32::MAX;
        let a = pr.start_probe(1, 0, 10);
        let b = pr.start_probe(1, 0, 11);
        assert_eq!(a.sequence, ((EPOCH as u64) << 32) | 0xFFFF_FFFF);
        assert_eq!(b.sequence, (EPOCH as u64) << 32);
    }

    /// Drives one probe with the events in `order` (0 sent, 1 first ACK, 2 second ACK)
    /// and returns the outcome produced by the last event.
    fn run(order: [usize; 3]) -> (Vec<Option<ProbeOutcome>>, ProbePacket) {
        let mut pr = prober(16);
        let p = pr.start_probe(7, 0x12345, 1_000);
        let mut outs = Vec::new();
        for ev in order {
            outs.push(match ev {
                0 => pr.on_probe_sent(p.sequence, 5_000_100, 1_010),
                1 => pr.on_ack(&first(&p, 9_000_000), Some(5_001_400), 2_500),
                _ => pr.on_ack(&second(&p, 9_000_000, 9_000_300), Some(5_001_500), 3_000),
            });
        }
        assert_eq!(pr.in_flight(), 0);
        assert_eq!(pr.next_timeout(), None);
        (outs, p)
    }

    #[test]
    fn completes_in_any_order() {
        let orders = [
            [0, 1, 2],
            [0, 2, 1],
            [1, 0, 2],
            [1, 2, 0],
            [2, 0, 1],
            [2, 1, 0],
        ];
        for order in orders {
            let (outs, p) = run(order);
            assert!(outs[0].is_none() && outs[1].is_none(), "{order:?}");
            let o = outs[2].expect("last event completes");
            assert_eq!(o.target, 7);
            assert_eq!(o.flow_label, 0x12345);
            assert_eq!(o.sequence, p.sequence);
            assert_eq!(
                o.timestamps,
                Timestamps {
                    t1: Some(1_000),
                    t2: Some(5_000_100),
                    t3: Some(9_000_000),
                    t4: Some(9_000_300),
                    t5: Some(5_001_400),
                    t6: Some(3_000),
                }
            );
            assert_eq!(
                o.result,
                ProbeResult::Success(RttSample {
                    network_rtt_ns: 1_000,
                    prober_delay_ns: 700,
                    responder_delay_ns: 300
                })
            );
            assert_eq!(o.result.sample().unwrap().network_rtt_ns, 1_000);
        }
    }

    #[test]
    fn zero_t4_completes_as_invalid() {
        let mut pr = prober(16);
        let p = pr.start_probe(1, 0, 1_000);
        pr.on_probe_sent(p.sequence, 2_000, 1_001);
        pr.on_ack(&first(&p, 0), Some(2_500), 1_500);
        let o = pr.on_ack(&second(&p, 0, 0), Some(2_600), 1_600).unwrap();
        assert_eq!(
            o.result,
            ProbeResult::Invalid(InvalidReason::MissingTimestamp)
        );
        assert_eq!(o.timestamps.t3, None);
    }

    #[test]
    fn negative_result_is_invalid() {
        let mut pr = prober(16);
        let p = pr.start_probe(1, 0, 1_000);
        pr.on_probe_sent(p.sequence, 2_000, 1_001);
        pr.on_ack(&first(&p, 500), Some(1_900), 1_500); // T5 < T2
        let o = pr.on_ack(&second(&p, 500, 600), None, 1_600).unwrap();
        assert_eq!(o.result, ProbeResult::Invalid(InvalidReason::Negative));
    }

    #[test]
    fn timeout_lost_and_partial() {
        let mut pr = prober(16);
        let lost = pr.start_probe(1, 0, 1_000);
        let partial = pr.start_probe(2, 0, 2_000);
        let done = pr.start_probe(3, 0, 3_000);
        pr.on_probe_sent(lost.sequence, 1, 1);
        pr.on_ack(&first(&partial, 10), Some(20), 2_100);
        pr.on_probe_sent(done.sequence, 100, 3_001);
        pr.on_ack(&first(&done, 110), Some(130), 3_100);
        assert!(pr
            .on_ack(&second(&done, 110, 120), Some(131), 3_200)
            .is_some());
        assert_eq!(pr.next_timeout(), Some(1_001_000));

        let mut out = Vec::new();
        pr.poll_timeouts(1_000_999, &mut out);
        assert!(out.is_empty());
        pr.poll_timeouts(1_001_000, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].target, out[0].result), (1, ProbeResult::Lost));
        assert_eq!(pr.next_timeout(), Some(1_002_000));
        out.clear();
        pr.poll_timeouts(10_000_000, &mut out);
        assert_eq!(out.len(), 1, "the completed probe must not time out");
        assert_eq!(out[0].target, 2);
        assert_eq!(
            out[0].result,
            ProbeResult::Invalid(InvalidReason::MissingTimestamp)
        );
        assert_eq!(pr.in_flight(), 0);
        assert_eq!(pr.next_timeout(), None);
        // A late ACK for a finished probe is unknown.
        assert!(pr
            .on_ack(&second(&partial, 1, 2), None, 10_000_001)
            .is_none());
        assert_eq!(pr.counters().unknown_sequence, 1);
    }

    #[test]
    fn duplicates_and_unknown_are_counted() {
        let mut pr = prober(16);
        let p = pr.start_probe(1, 0, 1_000);
        assert!(pr.on_ack(&first(&p, 5), Some(6), 1_100).is_none());
        assert!(pr.on_ack(&first(&p, 5), Some(7), 1_101).is_none());
        assert!(pr.on_ack(&second(&p, 5, 6), Some(8), 1_200).is_none());
        assert!(pr.on_ack(&second(&p, 5, 6), Some(9), 1_201).is_none());
        let mut stranger = p;
        stranger.sequence ^= 1 << 40;
        assert!(pr.on_ack(&first(&stranger, 5), None, 1_300).is_none());
        assert_eq!(
            pr.counters(),
            ProberCounters {
                unknown_sequence: 1,
                duplicate_ack: 2
            }
        );
        // The duplicates did not overwrite T5/T6.
        let o = pr.on_probe_sent(p.sequence, 2, 1_001).unwrap();
        assert_eq!(o.timestamps.t5, Some(6));
        assert_eq!(o.timestamps.t6, Some(1_200));
        // A probe packet handed to on_ack is ignored, not counted.
        assert!(pr
            .on_ack(&ProbePacket::probe(p.sequence, 1), None, 1)
            .is_none());
        assert_eq!(pr.counters().unknown_sequence, 1);
    }

    #[test]
    fn max_in_flight_evicts_oldest() {
        let mut pr = prober(2);
        let a = pr.start_probe(1, 0, 100);
        let b = pr.start_probe(2, 0, 200);
        pr.on_ack(&first(&b, 1), Some(2), 250);
        let _c = pr.start_probe(3, 0, 300); // evicts a
        assert_eq!(pr.in_flight(), 2);
        assert_eq!(pr.next_timeout(), Some(0));
        let _d = pr.start_probe(4, 0, 400); // evicts b (partially answered)
        assert_eq!(pr.evicted_total(), 2);
        let mut out = Vec::new();
        pr.poll_timeouts(500, &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(
            (out[0].sequence, out[0].result),
            (a.sequence, ProbeResult::Lost)
        );
        assert_eq!(out[1].sequence, b.sequence);
        assert_eq!(
            out[1].result,
            ProbeResult::Invalid(InvalidReason::MissingTimestamp)
        );
        assert_eq!(pr.next_timeout(), Some(300 + 1_000_000));
        assert!(pr.on_ack(&first(&a, 1), None, 600).is_none());
        assert_eq!(pr.counters().unknown_sequence, 1);
    }

    #[test]
    fn many_probes_stay_consistent() {
        // Complete every other probe; the rest must time out exactly once each.
        let mut pr = prober(10_000);
        let mut out = Vec::new();
        let mut completed = 0;
        for i in 0..5_000u64 {
            let p = pr.start_probe(i as u32, 0, i * 10);
            if i % 2 == 0 {
                pr.on_probe_sent(p.sequence, 1_000 + i, i * 10);
                pr.on_ack(&first(&p, 50), Some(1_100 + i), i * 10 + 5);
                if pr
                    .on_ack(&second(&p, 50, 60), Some(1_101 + i), i * 10 + 6)
                    .is_some()
                {
                    completed += 1;
                }
            }
            pr.poll_timeouts(i * 10, &mut out);
        }
        pr.poll_timeouts(u64::MAX, &mut out);
        assert_eq!(completed, 2_500);
        assert_eq!(out.len(), 2_500);
        assert!(out
            .iter()
            .all(|o| o.result == ProbeResult::Lost && o.target % 2 == 1));
        assert_eq!(pr.in_flight(), 0);
        assert!(pr.deadlines.is_empty());
    }
}
