//! Tests of `liveness.rs`.

use super::*;

const S: u64 = 1_000_000_000;

#[test]
fn heartbeat_is_a_third_of_the_active_threshold_within_bounds() {
    assert_eq!(heartbeat_interval_sec(300), 60);
    assert_eq!(heartbeat_interval_sec(900), 60);
    assert_eq!(heartbeat_interval_sec(9), 3);
    assert_eq!(heartbeat_interval_sec(1), 1);
}

#[test]
fn regular_ticks_excuse_nothing_and_a_gap_excuses_its_unwatched_part() {
    let mut w = StallWatch::default();
    assert_eq!(w.observe(10 * S), None, "first observation");
    for k in 1..=5 {
        assert_eq!(w.observe(10 * S + k * S + S / 3), None);
    }
    // Handlers observe between ticks: no gap.
    assert_eq!(w.observe(15 * S + S / 2), None);
    // Stopped for 5 s: the next observation comes 6 s after the last.
    assert_eq!(w.observe(21 * S + S / 2), Some(5));
    assert_eq!(w.observe(22 * S), None, "excused once");
    // Exactly two ticks is still normal (a late tick).
    assert_eq!(w.observe(24 * S), None);
    assert_eq!(w.observe(26 * S + 1), Some(2));
    // The clock never goes back; an earlier reading changes nothing.
    assert_eq!(w.observe(20 * S), None);
    assert_eq!(w.observe(27 * S), None);
}
