//! Tests of `rtt.rs`.

use super::*;

fn ts(v: [u64; 6]) -> Timestamps {
    Timestamps {
        t1: Some(v[0]),
        t2: Some(v[1]),
        t3: Some(v[2]),
        t4: Some(v[3]),
        t5: Some(v[4]),
        t6: Some(v[5]),
    }
}

#[test]
fn values() {
    // Prober monotonic around 1_000, realtime around 5_000_000; responder realtime
    // around 9_000_000 (unsynchronised clocks are fine: differences only).
    let t = ts([1_000, 5_000_100, 9_000_000, 9_000_300, 5_001_400, 3_000]);
    let s = compute(&t).unwrap();
    // T5-T2 = 1300, T4-T3 = 300 -> network 1000; T6-T1 = 2000 -> prober delay 700.
    assert_eq!(
        s,
        RttSample {
            network_rtt_ns: 1_000,
            prober_delay_ns: 700,
            responder_delay_ns: 300
        }
    );
}

#[test]
fn zero_delays_are_valid() {
    let s = compute(&ts([10, 20, 30, 30, 20, 10])).unwrap();
    assert_eq!(
        s,
        RttSample {
            network_rtt_ns: 0,
            prober_delay_ns: 0,
            responder_delay_ns: 0
        }
    );
}

#[test]
fn missing_each_timestamp() {
    let full = ts([1, 2, 3, 4, 5, 6]);
    for i in 0..6 {
        let mut t = full;
        match i {
            0 => t.t1 = None,
            1 => t.t2 = None,
            2 => t.t3 = None,
            3 => t.t4 = None,
            4 => t.t5 = None,
            _ => t.t6 = None,
        }
        assert!(!t.is_complete());
        assert_eq!(
            compute(&t),
            Err(InvalidReason::MissingTimestamp),
            "missing t{}",
            i + 1
        );
    }
    assert!(full.is_complete());
    assert_eq!(
        compute(&Timestamps::default()),
        Err(InvalidReason::MissingTimestamp)
    );
}

#[test]
fn negative_cases() {
    // T5 < T2
    assert_eq!(
        compute(&ts([0, 100, 0, 0, 99, 1000])),
        Err(InvalidReason::Negative)
    );
    // T4 < T3
    assert_eq!(
        compute(&ts([0, 100, 50, 49, 200, 1000])),
        Err(InvalidReason::Negative)
    );
    // T6 < T1
    assert_eq!(
        compute(&ts([1000, 100, 0, 0, 200, 999])),
        Err(InvalidReason::Negative)
    );
    // responder delay longer than the prober saw on the wire
    assert_eq!(
        compute(&ts([0, 100, 0, 101, 200, 1000])),
        Err(InvalidReason::Negative)
    );
    // prober total shorter than its wire time
    assert_eq!(
        compute(&ts([0, 100, 0, 10, 200, 99])),
        Err(InvalidReason::Negative)
    );
}

#[test]
fn absurd_cases() {
    let big = MAX_PLAUSIBLE_NS + 1;
    // network RTT absurd
    assert_eq!(
        compute(&ts([0, 0, 0, 0, big, big])),
        Err(InvalidReason::Absurd)
    );
    // prober delay absurd
    assert_eq!(
        compute(&ts([0, 0, 0, 0, 10, big + 10])),
        Err(InvalidReason::Absurd)
    );
    // responder delay absurd (network rtt stays 0)
    assert_eq!(
        compute(&ts([0, 0, 0, big, big, big])),
        Err(InvalidReason::Absurd)
    );
    // exactly the limit is still plausible
    let lim = MAX_PLAUSIBLE_NS;
    assert!(compute(&ts([0, 0, 0, 0, lim, lim])).is_ok());
}

#[test]
fn reason_strings() {
    assert_eq!(
        InvalidReason::MissingTimestamp.as_str(),
        "missing_timestamp"
    );
    assert_eq!(InvalidReason::Negative.as_str(), "negative_rtt");
    assert_eq!(InvalidReason::Absurd.as_str(), "absurd_rtt");
}
