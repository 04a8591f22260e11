//! Tests of `reopen.rs`.

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn reopener() -> Reopener {
    Reopener::new(Backoff::new(ms(100), ms(800)), ms(10_000))
}

#[test]
fn shutdown_stops_without_counting_a_failure() {
    let mut r = reopener();
    assert_eq!(r.on_driver_exit(false, ms(5)), ReopenStep::Stop);
    assert_eq!(r.failures(), 0);
    assert_eq!(r.attempts(), 0);
}

#[test]
fn open_failures_back_off_up_to_the_cap() {
    let mut r = reopener();
    assert_eq!(
        r.on_driver_exit(true, ms(50_000)),
        ReopenStep::Wait(ms(100))
    );
    let waits: Vec<_> = (0..5).map(|_| r.on_open_failed()).collect();
    assert_eq!(
        waits,
        [200, 400, 800, 800, 800].map(|n| ReopenStep::Wait(ms(n)))
    );
    assert_eq!(r.failures(), 1);
    assert_eq!(r.attempts(), 6);
}

#[test]
fn flapping_device_keeps_doubling_healthy_run_resets() {
    let mut r = reopener();
    let ep = Endpoint {
        gid: "fe80::1".parse().unwrap(),
        qpn: 7,
    };
    // Fails, re-opens, fails again quickly: the back-off is not reset.
    assert_eq!(r.on_driver_exit(true, ms(1)), ReopenStep::Wait(ms(100)));
    assert!(!r.on_opened(ep, ep));
    assert_eq!(r.on_driver_exit(true, ms(1)), ReopenStep::Wait(ms(200)));
    assert_eq!(r.on_driver_exit(true, ms(9_999)), ReopenStep::Wait(ms(400)));
    // A long healthy run: the next failure starts from the beginning.
    assert_eq!(
        r.on_driver_exit(true, ms(10_000)),
        ReopenStep::Wait(ms(100))
    );
    assert_eq!(r.failures(), 4);
}

#[test]
fn reregisters_only_when_the_address_changed() {
    let mut r = reopener();
    let old = Endpoint {
        gid: "fe80::1".parse().unwrap(),
        qpn: 7,
    };
    assert!(!r.on_opened(old, old));
    assert!(r.on_opened(old, Endpoint { qpn: 8, ..old }));
    assert!(r.on_opened(
        old,
        Endpoint {
            gid: "fe80::2".parse().unwrap(),
            ..old
        }
    ));
}
