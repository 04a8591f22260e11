//! Tests of `echo.rs`.

use super::*;

const MS: u64 = 1_000_000;

#[test]
fn messages_round_trip_and_bad_ones_are_named() {
    for m in [
        EchoMsg::Probe {
            id: 7,
            next_gap_us: 1_000_000,
        },
        EchoMsg::Echo {
            id: u64::MAX,
            caught_hot: true,
            turnaround_ns: 1234,
        },
    ] {
        assert_eq!(EchoMsg::decode(&m.encode()), Ok(m));
    }
    assert_eq!(EchoMsg::decode(&[1; 31]), Err(EchoError::Length(31)));
    assert_eq!(EchoMsg::decode(&[9; 32]), Err(EchoError::Kind(9)));
}

#[test]
fn one_probe_in_flight_rtt_late_and_lost() {
    let mut p = EchoProber::new(1000 * MS, 500 * MS, MS, 0);
    let Some(EchoMsg::Probe { id, next_gap_us }) = p.due(0) else {
        panic!()
    };
    assert_eq!((id, next_gap_us), (1, 1_000_000));
    assert_eq!(p.due(10), None, "depth one");
    assert!(p.wants_hot(10) && !p.wants_hot(MS));
    let echo = EchoMsg::Echo {
        id: 1,
        caught_hot: true,
        turnaround_ns: 300,
    };
    assert_eq!(
        p.on_echo(echo, true, 10_000),
        Some(Outcome::Rtt {
            id: 1,
            total_ns: 10_000,
            responder_ns: 300,
            network_ns: 9_700
        })
    );
    assert_eq!(p.on_echo(echo, true, 10_000), None, "no double count");
    assert!(p.due(999 * MS).is_none());
    let Some(EchoMsg::Probe { id: 2, .. }) = p.due(1000 * MS) else {
        panic!()
    };
    let cold = EchoMsg::Echo {
        id: 2,
        caught_hot: false,
        turnaround_ns: 5,
    };
    assert_eq!(
        p.on_echo(cold, true, 1001 * MS),
        Some(Outcome::Late { id: 2 })
    );
    p.due(2000 * MS).unwrap();
    assert_eq!(p.expire(2400 * MS), None);
    assert_eq!(p.expire(2500 * MS), Some(Outcome::Lost { id: 3 }));
    let stale = EchoMsg::Echo {
        id: 3,
        caught_hot: true,
        turnaround_ns: 1,
    };
    assert_eq!(
        p.on_echo(stale, true, 2600 * MS),
        None,
        "a late echo after the timeout"
    );
}

#[test]
fn responder_polls_hot_only_around_the_announced_probe() {
    let mut r = EchoResponder::new(200_000, MS);
    assert_eq!(
        r.plan(0, 10 * MS),
        PollPlan::SleepUntil(10 * MS),
        "no schedule yet"
    );
    assert!(
        !r.on_probe(1_000_000, false, 10 * MS),
        "first probe is caught cold"
    );
    assert_eq!(
        r.plan(11 * MS, 10 * MS),
        PollPlan::SleepUntil(1010 * MS - 200_000)
    );
    let open = 1010 * MS - 200_000;
    assert_eq!(r.plan(open, 10 * MS), PollPlan::HotUntil(1011 * MS));
    r.polled_empty(true);
    assert!(
        r.on_probe(1_000_000, true, 1010 * MS + 5_000),
        "bracketed by an empty poll"
    );
    // The next probe never comes: after the grace the schedule is forgotten.
    assert_eq!(r.plan(2012 * MS, 10 * MS), PollPlan::SleepUntil(2022 * MS));
}
