//! Tests of `prober.rs`.

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
