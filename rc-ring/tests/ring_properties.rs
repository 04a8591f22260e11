//! Property tests of the ring logic: a sender and a receiver over one heap region, driven
//! by random interleavings of sends, polls and (delayed) completions. The harness performs
//! each WRITE the way a NIC would and checks, before it lands, that it never hits a slot
//! whose message is unread.

use proptest::prelude::*;
use rpingmesh_rc_ring::descriptor::{Descriptor, DescriptorError, DESCRIPTOR_LEN};
use rpingmesh_rc_ring::frag::{fragments, Reassembler};
use rpingmesh_rc_ring::geometry::{split_commit, Geometry, CONSUMED_OFFSET, SEQ_MAX};
use rpingmesh_rc_ring::{
    HeapRegion, ProtocolError, Receiver, SendError, Sender, Step, MAX_PAYLOAD, TORN_READS_TOLERATED,
};

#[derive(Debug, Clone)]
enum Action {
    Send(u8),
    Recv,
    /// Deliver the oldest pending completion (writes and credit reads complete in order).
    Complete,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        3 => (1u8..=192).prop_map(Action::Send),
        2 => Just(Action::Recv),
        2 => Just(Action::Complete),
    ]
}

/// One sender/receiver pair and the model of what must arrive.
struct Pair {
    geom: Geometry,
    region: HeapRegion,
    tx: Sender,
    rx: Receiver,
    /// Completions the "NIC" has not delivered yet: (wr_id, credit value if a read).
    completions: std::collections::VecDeque<(u64, Option<u64>)>,
    sent: std::collections::VecDeque<(u64, Vec<u8>)>,
    received: u64,
    credit_reads: u64,
}

impl Pair {
    fn new(slots_budget: usize, sq: u32, first: u64) -> Pair {
        let geom = Geometry::for_budget(slots_budget, 4096).unwrap();
        let region = HeapRegion::zeroed(geom.mapped_len());
        let rx = Receiver::starting_at(geom, first, region.region());
        Pair {
            geom,
            tx: Sender::starting_at(geom, sq, first),
            rx,
            region,
            completions: Default::default(),
            sent: Default::default(),
            received: 0,
            credit_reads: 0,
        }
    }

    fn send(&mut self, len: u8, tag: u64) -> Result<bool, TestCaseError> {
        let payload: Vec<u8> = (0..len)
            .map(|i| (tag as u8).wrapping_mul(31).wrapping_add(i))
            .collect();
        let r = self.region.region();
        match self
            .tx
            .send(&payload)
            .map_err(|e| TestCaseError::fail(e.to_string()))?
        {
            Step::Write(op) => {
                // The slot must be free: its commit is from an earlier lap and consumed.
                let (old_seq, _) = split_commit(r.load_acquire(op.commit_offset()));
                let consumed = r.load_acquire(CONSUMED_OFFSET);
                prop_assert!(
                    old_seq <= consumed,
                    "write of seq {} over unread seq {} (consumed {})",
                    op.seq,
                    old_seq,
                    consumed
                );
                prop_assert_eq!(op.commit_offset(), self.geom.commit_offset(op.seq));
                prop_assert_eq!(op.commit_offset() + 8 - op.remote_offset, payload.len() + 8);
                r.copy_in(op.remote_offset, op.payload());
                r.store_release(op.commit_offset(), op.commit());
                if op.signaled {
                    self.completions.push_back((op.wr_id, None));
                }
                self.sent.push_back((op.seq, payload));
                Ok(true)
            }
            Step::ReadCredit(read) => {
                // The value is sampled when the read executes (now), delivered later.
                self.completions
                    .push_back((read.wr_id, Some(r.load_acquire(read.remote_offset))));
                self.credit_reads += 1;
                Ok(false)
            }
            Step::Backpressured | Step::QueueFull => Ok(false),
        }
    }

    fn complete(&mut self) -> Result<(), TestCaseError> {
        if let Some((id, credit)) = self.completions.pop_front() {
            match credit {
                Some(v) => self.tx.credit_read_completed(id, v),
                None => self.tx.write_completed(id),
            }
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        Ok(())
    }

    fn recv(&mut self) -> Result<bool, TestCaseError> {
        let mut out = [0u8; MAX_PAYLOAD];
        match self.rx.recv(self.region.region(), &mut out) {
            Ok(Some(n)) => {
                let (seq, want) = self.sent.pop_front().expect("received more than sent");
                prop_assert_eq!(&out[..n], &want[..], "seq {}", seq);
                self.received += 1;
                Ok(true)
            }
            Ok(None) => {
                prop_assert!(self.sent.is_empty(), "a published message was not seen");
                Ok(false)
            }
            Err(e) => Err(TestCaseError::fail(e.to_string())),
        }
    }

    /// Drain everything: all sent messages arrive, in order.
    fn drain(&mut self) -> Result<(), TestCaseError> {
        while !self.completions.is_empty() {
            self.complete()?;
        }
        while self.recv()? {}
        prop_assert!(self.sent.is_empty());
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Random interleavings over small rings (many laps) and small send queues: every
    /// message arrives once, in order, intact; no unread slot is overwritten.
    #[test]
    fn interleavings_deliver_every_message_in_order(
        slots in 2usize..=8,
        sq in 1u32..=40,
        actions in prop::collection::vec(action(), 1..600),
    ) {
        let mut p = Pair::new(slots * 256, sq, 1);
        for (i, a) in actions.into_iter().enumerate() {
            match a {
                Action::Send(len) => { p.send(len, i as u64)?; }
                Action::Recv => { p.recv()?; }
                Action::Complete => p.complete()?,
            }
            prop_assert!(p.tx.in_flight() <= slots as u64);
            prop_assert!(p.tx.outstanding_wrs() <= sq as u64);
        }
        p.drain()?;
    }

    /// Sequences near 2^56: the ring runs up to the last sequence, then refuses to send
    /// (and to receive past it) instead of wrapping into sequences that read as old.
    #[test]
    fn sequences_near_the_56_bit_limit(slots in 2usize..=6, left in 1u64..40, sq in 1u32..8) {
        let mut p = Pair::new(slots * 256, sq, SEQ_MAX - left + 1);
        let mut sent = 0;
        for i in 0..10_000u64 {
            if p.tx.next_seq() > SEQ_MAX {
                break;
            }
            if p.send(8, i)? {
                sent += 1;
            } else {
                p.complete()?;
                p.recv()?;
            }
        }
        prop_assert_eq!(sent, left);
        prop_assert!(matches!(
            p.tx.send(&[1]),
            Err(SendError::Protocol(ProtocolError::SequenceExhausted))
        ));
        while p.received < left {
            p.complete()?;
            prop_assert!(p.recv()?);
        }
        prop_assert_eq!(p.rx.poll(p.region.region()), Err(ProtocolError::SequenceExhausted));
    }
}

/// A stale commit from an earlier lap reads as empty; a future one is an error; a bad
/// length with the right sequence is an error.
#[test]
fn stale_future_and_malformed_commits() {
    let geom = Geometry::for_budget(4 * 256, 4096).unwrap();
    let h = HeapRegion::zeroed(geom.mapped_len());
    let r = h.region();
    let mut rx = Receiver::new(geom);
    // Lap 1 fills all 4 slots and is consumed.
    for seq in 1..=4u64 {
        r.store_release(geom.commit_offset(seq), (seq << 8) | 1);
        let m = rx.poll(r).unwrap().unwrap();
        rx.consume(r, &m);
    }
    // Slot 0 still holds seq 1, expected is 5: empty, not an error.
    assert_eq!(rx.poll(r), Ok(None));
    // seq 9 in slot 0 (two laps ahead): a protocol failure.
    r.store_release(geom.commit_offset(5), (9 << 8) | 1);
    assert_eq!(
        rx.poll(r),
        Err(ProtocolError::FutureSequence {
            expected: 5,
            found: 9
        })
    );
    r.store_release(geom.commit_offset(5), 5 << 8);
    assert_eq!(rx.poll(r), Err(ProtocolError::BadLength { seq: 5, len: 0 }));
    r.store_release(geom.commit_offset(5), (5 << 8) | 193);
    assert_eq!(
        rx.poll(r),
        Err(ProtocolError::BadLength { seq: 5, len: 193 })
    );
}

/// A full ring: the sender issues exactly one credit read, is backpressured while it is
/// in flight, and stays backpressured when the read shows no progress.
#[test]
fn a_full_ring_reads_credits_only_when_the_cached_view_is_full() {
    let mut p = Pair::new(4 * 256, 64, 1);
    for i in 0..4 {
        assert!(p.send(8, i).unwrap(), "free slots need no credit read");
    }
    assert_eq!(p.credit_reads, 0);
    assert!(!p.send(8, 9).unwrap());
    assert_eq!(p.credit_reads, 1);
    assert!(matches!(p.tx.send(&[1]), Ok(Step::Backpressured)));
    // The read completes with nothing consumed: still full, a new read next time.
    while !p.completions.is_empty() {
        p.complete().unwrap();
    }
    assert!(!p.send(8, 9).unwrap());
    assert_eq!(p.credit_reads, 2);
    p.complete().unwrap();
    assert!(p.recv().unwrap());
    assert!(
        !p.send(8, 10).unwrap(),
        "consumed, but the cache still says full: read"
    );
    p.complete().unwrap();
    assert!(p.send(8, 11).unwrap());
    p.drain().unwrap();
}

/// A credit value the protocol cannot produce is dropped as a torn read and read again;
/// one that stays impossible is refused.
#[test]
fn impossible_credits_and_completions_are_errors() {
    let geom = Geometry::for_budget(2 * 256, 4096).unwrap();
    let mut tx = Sender::new(geom, 8);
    tx.send(&[1]).unwrap();
    tx.send(&[1]).unwrap();
    for torn in 0..TORN_READS_TOLERATED {
        let Ok(Step::ReadCredit(read)) = tx.send(&[1]) else {
            panic!("full")
        };
        tx.credit_read_completed(read.wr_id, 3).unwrap();
        assert_eq!(tx.discarded_credit_reads(), u64::from(torn) + 1);
    }
    // A possible count in between starts the tolerance over.
    let Ok(Step::ReadCredit(read)) = tx.send(&[1]) else {
        panic!("still full: the torn counts freed nothing")
    };
    tx.credit_read_completed(read.wr_id, 0).unwrap();
    for _ in 0..TORN_READS_TOLERATED {
        let Ok(Step::ReadCredit(read)) = tx.send(&[1]) else {
            panic!("full")
        };
        tx.credit_read_completed(read.wr_id, 3).unwrap();
    }
    let Ok(Step::ReadCredit(read)) = tx.send(&[1]) else {
        panic!("full")
    };
    assert!(matches!(
        tx.credit_read_completed(read.wr_id, 3),
        Err(ProtocolError::BadCredit { consumed: 3, .. })
    ));
    assert!(matches!(
        tx.write_completed(99),
        Err(ProtocolError::UnexpectedCompletion { wr_id: 99 })
    ));
    assert!(matches!(tx.send(&[]), Err(SendError::BadPayload(0))));
    assert!(matches!(
        tx.send(&[0; 193]),
        Err(SendError::BadPayload(193))
    ));
}

proptest! {
    /// Descriptors round-trip, accept a provider's tail, and reject every malformed form.
    #[test]
    fn descriptors(addr in 1u64.., rkey: u32, slots in 2u32..=(1 << 24), nonce: u64,
                   extra in 0u64..4096, tail in prop::collection::vec(any::<u8>(), 0..16)) {
        let d = Descriptor { addr, rkey, slots, mapped_len: 128 + slots as u64 * 256 + extra, nonce };
        let mut b = d.encode().to_vec();
        b.extend_from_slice(&tail);
        prop_assert_eq!(Descriptor::decode(&b), Ok(d));
        for cut in 0..DESCRIPTOR_LEN {
            prop_assert_eq!(Descriptor::decode(&b[..cut]), Err(DescriptorError::Short(cut)));
        }
    }

    #[test]
    fn corrupted_descriptors_are_refused_not_trusted(byte in 0usize..40, xor in 1u8..=255) {
        let d = Descriptor { addr: 0x7f00_0000_1000, rkey: 7, slots: 16, mapped_len: 8192, nonce: 1 };
        let mut b = d.encode();
        b[byte] ^= xor;
        if let Ok(got) = Descriptor::decode(&b) {
            // Only the free-valued fields (address, rkey, slots, length, nonce) may
            // change and still decode, and never into an impossible geometry.
            prop_assert!(byte >= 8, "a corrupted version or geometry decoded");
            prop_assert!(got.slots >= 2 && got.mapped_len >= 128 + got.slots as u64 * 256 && got.addr != 0);
        }
    }

    /// Fragmented messages of any size up to the limit come back whole.
    #[test]
    fn fragments_reassemble(msg in prop::collection::vec(any::<u8>(), 0..3000)) {
        let mut r = Reassembler::new(4096);
        let mut out = None;
        let frags: Vec<_> = fragments(&msg).collect();
        for (i, (f, n)) in frags.iter().enumerate() {
            let got = r.push(&f[..*n]).unwrap();
            prop_assert_eq!(got.is_some(), i + 1 == frags.len());
            out = got.or(out);
        }
        prop_assert_eq!(out.unwrap(), msg);
    }
}
