//! Responder side: a probe received at T3 is answered at once with the first ACK (T1, T3);
//! when the first ACK's send completion (T4) is known, the second ACK (T1, T3, T4) goes out.

use std::collections::VecDeque;

use foldhash::{HashMap, HashMapExt};

use crate::wire::ProbePacket;

/// Handle for a first ACK waiting for its send completion.
pub type PendingId = u64;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResponderCounters {
    pub probes_answered: u64,
    /// First ACKs whose send completion never came (second ACK not sent).
    pub pending_expired: u64,
    /// Pending table full: the oldest entry was evicted.
    pub pending_evicted: u64,
}

struct Pending<P> {
    to: P,
    probe: ProbePacket,
    t3: u64,
}

/// Responder state machine. Pending first ACKs are kept in a map with a creation-order
/// queue for expiry and eviction; entries already answered are skipped lazily.
pub struct Responder<P> {
    max_pending: usize,
    timeout_ns: u64,
    next_id: PendingId,
    pending: HashMap<PendingId, Pending<P>>,
    order: VecDeque<(u64, PendingId)>,
    counters: ResponderCounters,
}

impl<P: Clone> Responder<P> {
    /// `max_pending` 0 is treated as 1.
    pub fn new(max_pending: usize, pending_timeout_ns: u64) -> Self {
        Responder {
            max_pending: max_pending.max(1),
            timeout_ns: pending_timeout_ns,
            next_id: 0,
            pending: HashMap::new(),
            order: VecDeque::new(),
            counters: ResponderCounters::default(),
        }
    }

    /// A probe from `from` received with receive timestamp `t3_ns` (None: not available,
    /// sent as 0 so the prober flags the result invalid). Returns the first ACK to send and
    /// the id under which to report its send completion.
    pub fn on_probe(
        &mut self,
        from: P,
        probe: &ProbePacket,
        t3_ns: Option<u64>,
        now_mono_ns: u64,
    ) -> (PendingId, ProbePacket) {
        let t3 = t3_ns.unwrap_or(0);
        let ack = ProbePacket::first_ack(probe, t3);
        self.counters.probes_answered += 1;
        while self.pending.len() >= self.max_pending {
            let Some((_, old)) = self.order.pop_front() else {
                break;
            };
            if self.pending.remove(&old).is_some() {
                self.counters.pending_evicted += 1;
            }
        }
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        self.pending.insert(
            id,
            Pending {
                to: from,
                probe: *probe,
                t3,
            },
        );
        self.order.push_back((now_mono_ns, id));
        (id, ack)
    }

    /// Send completion (T4) of the first ACK `id`: returns the second ACK and its destination.
    /// Unknown, expired or already answered ids give `None`.
    pub fn on_first_ack_sent(&mut self, id: PendingId, t4_ns: u64) -> Option<(P, ProbePacket)> {
        let p = self.pending.remove(&id)?;
        self.skip_stale();
        Some((p.to, ProbePacket::second_ack(&p.probe, p.t3, t4_ns)))
    }

    /// Drops pending first ACKs older than the timeout.
    pub fn expire(&mut self, now_mono_ns: u64) {
        while let Some(&(created, id)) = self.order.front() {
            if now_mono_ns.saturating_sub(created) <= self.timeout_ns {
                break;
            }
            self.order.pop_front();
            if self.pending.remove(&id).is_some() {
                self.counters.pending_expired += 1;
            }
        }
        self.skip_stale();
    }

    pub fn counters(&self) -> ResponderCounters {
        self.counters
    }

    /// First ACKs waiting for their send completion.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// When the oldest pending entry expires (for the caller's timer).
    pub fn next_expiry(&self) -> Option<u64> {
        self.order
            .front()
            .map(|&(c, _)| c.saturating_add(self.timeout_ns).saturating_add(1))
    }

    fn skip_stale(&mut self) {
        while let Some(&(_, id)) = self.order.front() {
            if self.pending.contains_key(&id) {
                break;
            }
            self.order.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{AckType, MsgType};

    #[test]
    fn first_then_second_ack() {
        let mut r: Responder<&'static str> = Responder::new(8, 1_000);
        let probe = ProbePacket::probe(0x1234_0000_0005, 777);
        let (id, a1) = r.on_probe("peer", &probe, Some(9_000), 10);
        assert_eq!(a1.msg_type, MsgType::Ack);
        assert_eq!(a1.ack_type, AckType::First);
        assert_eq!(
            (a1.sequence, a1.t1, a1.t3, a1.t4),
            (probe.sequence, 777, 9_000, 0)
        );
        assert_eq!(r.pending(), 1);
        let (to, a2) = r.on_first_ack_sent(id, 9_300).unwrap();
        assert_eq!(to, "peer");
        assert_eq!(a2.ack_type, AckType::Second);
        assert_eq!(
            (a2.sequence, a2.t1, a2.t3, a2.t4),
            (probe.sequence, 777, 9_000, 9_300)
        );
        assert!(
            r.on_first_ack_sent(id, 9_400).is_none(),
            "answered only once"
        );
        assert_eq!(r.pending(), 0);
        assert_eq!(r.next_expiry(), None);
        assert_eq!(r.counters().probes_answered, 1);
    }

    #[test]
    fn missing_t3_is_sent_as_zero() {
        let mut r: Responder<u8> = Responder::new(8, 1_000);
        let (id, a1) = r.on_probe(1, &ProbePacket::probe(1, 2), None, 0);
        assert_eq!(a1.t3, 0);
        assert_eq!(r.on_first_ack_sent(id, 50).unwrap().1.t3, 0);
    }

    #[test]
    fn expiry() {
        let mut r: Responder<u8> = Responder::new(8, 1_000);
        let (a, _) = r.on_probe(1, &ProbePacket::probe(1, 0), Some(1), 0);
        let (b, _) = r.on_probe(2, &ProbePacket::probe(2, 0), Some(1), 500);
        assert_eq!(r.next_expiry(), Some(1_001));
        r.expire(1_000);
        assert_eq!(r.pending(), 2);
        r.expire(1_001);
        assert_eq!(r.pending(), 1);
        assert!(r.on_first_ack_sent(a, 5).is_none());
        assert!(r.on_first_ack_sent(b, 5).is_some());
        r.expire(10_000);
        assert_eq!(r.counters().pending_expired, 1);
        assert_eq!(r.counters().pending_evicted, 0);
    }

    #[test]
    fn bounded_table_evicts_oldest() {
        let mut r: Responder<u32> = Responder::new(3, 1_000_000);
        let ids: Vec<_> = (0..5u32)
            .map(|i| {
                r.on_probe(i, &ProbePacket::probe(i as u64, 0), Some(1), i as u64)
                    .0
            })
            .collect();
        assert_eq!(r.pending(), 3);
        assert_eq!(r.counters().pending_evicted, 2);
        assert!(r.on_first_ack_sent(ids[0], 1).is_none());
        assert!(r.on_first_ack_sent(ids[1], 1).is_none());
        for &id in &ids[2..] {
            assert!(r.on_first_ack_sent(id, 1).is_some());
        }
        assert_eq!(r.counters().probes_answered, 5);
    }
}
