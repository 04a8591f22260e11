//! What the gray detector's greedy naming counts (pure): per (component, test), the
//! events of the units nobody owns yet, per history window. Built once per window and
//! kept current as units are claimed, so naming k components costs one pass over the
//! units plus the claimed units, not k passes over everything: a window of 100,000 RNICs
//! has hundreds of thousands of units.
//!
//! Every count is a whole number of probes (events, slow answered probes), so a count
//! taken down by a claim is exactly the sum a fresh pass would give.

use super::evidence::{Unit, WindowEvidence};

/// Which test named a component.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Test {
    Loss,
    Latency,
    Stall,
}

/// Tests the tally keeps (a stall is judged per host, elsewhere).
const TESTS: usize = 2;

fn test_index(t: Test) -> usize {
    match t {
        Test::Loss => 0,
        Test::Latency => 1,
        Test::Stall => unreachable!("stalls are not tallied"),
    }
}

/// The key of (component, test) in the tally's tables; keys sort as (component, test).
pub fn key(c: u32, t: Test) -> usize {
    c as usize * TESTS + test_index(t)
}

pub fn key_parts(k: usize) -> (u32, Test) {
    let t = if k.is_multiple_of(TESTS) {
        Test::Loss
    } else {
        Test::Latency
    };
    ((k / TESTS) as u32, t)
}

/// Calls `f(key, count)` for what one unit says.
fn each_count(u: &Unit, mut f: impl FnMut(usize, f64)) {
    for &(c, e) in &u.loss {
        f(key(c, Test::Loss), e);
    }
    if u.slow > 0.0 {
        for &c in &u.latency {
            f(key(c, Test::Latency), u.slow);
        }
    }
}

pub struct Tally {
    windows: usize,
    /// `counts[key * windows + w]`: unowned events of `key` in history window `w`.
    counts: Vec<f64>,
    /// Keys that any unit counted for, ascending.
    pub touched: Vec<usize>,
    /// Keys whose counts moved since `take_dirty`.
    dirty: Vec<bool>,
}

impl Tally {
    /// The unowned units of `history` (oldest first), over `components` components.
    pub fn new<'a>(
        history: impl ExactSizeIterator<Item = &'a WindowEvidence>,
        components: usize,
    ) -> Self {
        let windows = history.len().max(1);
        let keys = components * TESTS;
        let mut t = Tally {
            windows,
            counts: vec![0.0; keys * windows],
            touched: Vec::new(),
            dirty: vec![false; keys],
        };
        let mut seen = vec![false; keys];
        for (w, ev) in history.enumerate() {
            for u in ev.units.iter().filter(|u| u.owner.is_none()) {
                each_count(u, |k, e| {
                    t.counts[k * windows + w] += e;
                    if !seen[k] {
                        seen[k] = true;
                        t.touched.push(k);
                    }
                });
            }
        }
        t.touched.sort_unstable();
        t
    }

    /// Per history window (oldest first), `key`'s unowned events.
    pub fn counts(&self, key: usize) -> &[f64] {
        &self.counts[key * self.windows..(key + 1) * self.windows]
    }

    /// A unit of window `w` was claimed: its counts leave the tally.
    pub fn remove(&mut self, w: usize, u: &Unit) {
        let windows = self.windows;
        let (counts, dirty) = (&mut self.counts, &mut self.dirty);
        each_count(u, |k, e| {
            counts[k * windows + w] -= e;
            dirty[k] = true;
        });
    }

    /// Whether `key` moved since the last call for it (and clears the mark).
    pub fn take_dirty(&mut self, key: usize) -> bool {
        std::mem::take(&mut self.dirty[key])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(loss: &[(u32, f64)], latency: &[u32], slow: f64) -> Unit {
        Unit {
            loss: loss.to_vec(),
            latency: latency.to_vec(),
            slow,
            excess_ns: 0,
            path: 0,
            label: 0,
            inter: true,
            probes: 10.0,
            failed: 0.0,
            invalid: 0.0,
            answered: 10.0,
            in_label_totals: true,
            owner: None,
        }
    }

    fn window(units: Vec<Unit>) -> WindowEvidence {
        WindowEvidence {
            exposures: Vec::new(),
            units,
            totals: [(0.0, 0.0, 0.0); 2],
            label_answered: 0.0,
            label_slow: 0.0,
        }
    }

    #[test]
    fn a_claimed_unit_leaves_exactly_what_it_counted() {
        let mut history = [
            window(vec![unit(&[(1, 2.0), (2, 2.0)], &[], 0.0)]),
            window(vec![
                unit(&[(1, 1.0), (3, 1.0)], &[3, 4], 5.0),
                unit(&[], &[4], 2.0),
            ]),
        ];
        let mut t = Tally::new(history.iter(), 5);
        assert_eq!(
            t.touched,
            vec![
                key(1, Test::Loss),
                key(2, Test::Loss),
                key(3, Test::Loss),
                key(3, Test::Latency),
                key(4, Test::Latency)
            ]
        );
        assert_eq!(t.counts(key(1, Test::Loss)), &[2.0, 1.0]);
        assert_eq!(t.counts(key(4, Test::Latency)), &[0.0, 7.0]);
        // Window 1's first unit is claimed: its counts leave, the others stay.
        history[1].units[0].owner = Some(3);
        t.remove(1, &history[1].units[0]);
        let fresh = Tally::new(history.iter(), 5);
        for k in 0..10 {
            assert_eq!(t.counts(k), fresh.counts(k), "key {k}");
        }
        assert!(t.take_dirty(key(1, Test::Loss)) && t.take_dirty(key(4, Test::Latency)));
        assert!(!t.take_dirty(key(2, Test::Loss)), "untouched by the claim");
        assert!(!t.take_dirty(key(1, Test::Loss)), "cleared");
    }

    #[test]
    fn keys_round_trip_and_sort_by_component_then_test() {
        for c in [0u32, 1, 7, 1 << 20] {
            for t in [Test::Loss, Test::Latency] {
                assert_eq!(key_parts(key(c, t)), (c, t));
            }
        }
        assert!(key(3, Test::Latency) < key(4, Test::Loss));
        assert!(key(3, Test::Loss) < key(3, Test::Latency));
    }
}
