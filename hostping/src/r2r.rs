//! RNIC-to-RNIC (R2R) probing verdicts: each RNIC of the host probes a random other one
//! every 100 ms (500 ms timeout); the outcomes are judged per 20 s window.
//!
//! A probe from A to B that times out may be A's fault, B's, or the ToR's; one RNIC is
//! named only when it explains its share of the failing pairs:
//! - every pair failing: the ToR (all RNICs at once);
//! - the RNICs split into groups that reach each other and never across (each group at
//!   least two RNICs): miswiring, the paper's case #14 (RNIC 2/3 on the wrong switch ports);
//! - otherwise, greedily, the RNIC in the most failing pairs (a pair fails when over
//!   `timeout_th` of its probes, both ways, time out) when they are at least half of its
//!   pairs (all, on a host of two RNICs): `down` when its timeout rate is 100% (down or
//!   misrouted), `sporadic` otherwise (flapping or bad hardware).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

/// What the agent logs (info) once every RNIC's driver runs: R2R probing has begun.
pub const STARTED_LOG: &str = "hostping R2R probing started";

/// Probes to count before a pair is judged.
pub const MIN_PAIR_PROBES: u64 = 3;

/// Outcomes of one window.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct R2rWindow {
    pub rnics: Vec<String>,
    /// (from, to) by index into `rnics`: (sent, timed out).
    pub pairs: BTreeMap<(usize, usize), (u64, u64)>,
}

impl R2rWindow {
    pub fn new(rnics: Vec<String>) -> Self {
        Self {
            rnics,
            pairs: BTreeMap::new(),
        }
    }

    /// One probe's outcome.
    pub fn record(&mut self, from: usize, to: usize, timed_out: bool) {
        let e = self.pairs.entry((from, to)).or_default();
        e.0 += 1;
        e.1 += timed_out as u64;
    }

    /// (sent, timed out) between `a` and `b`, both ways.
    pub fn pair(&self, a: usize, b: usize) -> (u64, u64) {
        let x = self.pairs.get(&(a, b)).copied().unwrap_or_default();
        let y = self.pairs.get(&(b, a)).copied().unwrap_or_default();
        (x.0 + y.0, x.1 + y.1)
    }

    /// An RNIC's timeout rate over every probe it sent or was sent.
    pub fn timeout_rate(&self, i: usize) -> Option<f64> {
        let (mut sent, mut lost) = (0, 0);
        for (&(a, b), &(s, t)) in &self.pairs {
            if a == i || b == i {
                sent += s;
                lost += t;
            }
        }
        (sent > 0).then(|| lost as f64 / sent as f64)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum R2rKind {
    /// Every probe to and from it timed out: down, or misrouted.
    Down,
    /// Some timed out: flapping, or bad hardware (bit errors, a bad cable).
    Sporadic,
    /// Every RNIC timed out at once: the ToR.
    Tor,
    /// Groups that reach each other and never across.
    Miswired,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct R2rFinding {
    pub kind: R2rKind,
    /// The RNIC(s) named (for Miswired, all of them, group by group).
    pub rnics: Vec<String>,
    /// For Miswired: the groups.
    pub groups: Vec<Vec<String>>,
    pub timeout_rate: f64,
    pub probes: u64,
}

/// The window's verdicts. `timeout_th` is the paper's Timeout_th (0.1).
pub fn analyze(w: &R2rWindow, timeout_th: f64) -> Vec<R2rFinding> {
    let n = w.rnics.len();
    if n < 2 {
        return Vec::new();
    }
    // Judged pairs: failure rate of each unordered pair with enough probes.
    let mut rate: BTreeMap<(usize, usize), (f64, u64)> = BTreeMap::new();
    for a in 0..n {
        for b in a + 1..n {
            let (s, t) = w.pair(a, b);
            if s >= MIN_PAIR_PROBES {
                rate.insert((a, b), (t as f64 / s as f64, s));
            }
        }
    }
    if rate.is_empty() {
        return Vec::new();
    }
    let bad: BTreeSet<(usize, usize)> = rate
        .iter()
        .filter(|(_, (r, _))| *r > timeout_th)
        .map(|(k, _)| *k)
        .collect();
    if bad.is_empty() {
        return Vec::new();
    }
    let total: u64 = rate.values().map(|(_, s)| s).sum();
    let lost_rate = |set: &dyn Fn(&(usize, usize)) -> bool| -> (f64, u64) {
        let (mut s, mut t) = (0u64, 0u64);
        for (k, (r, n)) in &rate {
            if set(k) {
                s += n;
                t += (r * *n as f64).round() as u64;
            }
        }
        (if s > 0 { t as f64 / s as f64 } else { 0.0 }, s)
    };
    let measured: BTreeSet<usize> = rate.keys().flat_map(|(a, b)| [*a, *b]).collect();
    // Every judged pair failing: the ToR (on two RNICs, it cannot be told from either).
    if bad.len() == rate.len() && measured.len() == n {
        let (r, _) = lost_rate(&|_| true);
        return vec![R2rFinding {
            kind: R2rKind::Tor,
            rnics: w.rnics.clone(),
            groups: Vec::new(),
            timeout_rate: r,
            probes: total,
        }];
    }
    // Partition: components of the pairs that work.
    if let Some(groups) = partition(n, &rate, timeout_th) {
        let (r, _) = lost_rate(&|_| true);
        let named: Vec<Vec<String>> = groups
            .iter()
            .map(|g| g.iter().map(|&i| w.rnics[i].clone()).collect())
            .collect();
        return vec![R2rFinding {
            kind: R2rKind::Miswired,
            rnics: named.concat(),
            groups: named,
            timeout_rate: r,
            probes: total,
        }];
    }
    // Greedy: the RNIC in the most failing pairs, while it explains enough of its own.
    let mut findings = Vec::new();
    let mut open = bad.clone();
    let mut blamed: BTreeSet<usize> = BTreeSet::new();
    loop {
        let best = (0..n)
            .filter(|i| !blamed.contains(i))
            .map(|i| (open.iter().filter(|(a, b)| *a == i || *b == i).count(), i))
            .max_by(|x, y| x.0.cmp(&y.0).then(y.1.cmp(&x.1)));
        let Some((count, i)) = best else { break };
        let judged_pairs = rate
            .keys()
            .filter(|(a, b)| (*a == i || *b == i) && !blamed.contains(a) && !blamed.contains(b))
            .count();
        let need = if n == 2 {
            1
        } else {
            judged_pairs.div_ceil(2).max(2).min(judged_pairs)
        };
        if count == 0 || count < need {
            break;
        }
        let (r, probes) =
            lost_rate(&|(a, b)| (*a == i || *b == i) && !blamed.contains(a) && !blamed.contains(b));
        findings.push(R2rFinding {
            kind: if r >= 0.99 {
                R2rKind::Down
            } else {
                R2rKind::Sporadic
            },
            rnics: vec![w.rnics[i].clone()],
            groups: Vec::new(),
            timeout_rate: r,
            probes,
        });
        blamed.insert(i);
        open.retain(|(a, b)| *a != i && *b != i);
    }
    findings
}

/// The groups, when the RNICs split into at least two groups of two or more that reach
/// each other (every pair inside under `timeout_th`) and never across (every judged
/// pair across at 100%).
fn partition(
    n: usize,
    rate: &BTreeMap<(usize, usize), (f64, u64)>,
    timeout_th: f64,
) -> Option<Vec<Vec<usize>>> {
    let mut group: Vec<usize> = (0..n).collect();
    fn find(g: &mut [usize], i: usize) -> usize {
        let mut r = i;
        while g[r] != r {
            r = g[r];
        }
        g[i] = r;
        r
    }
    for (&(a, b), &(r, _)) in rate {
        if r <= timeout_th {
            let (ra, rb) = (find(&mut group, a), find(&mut group, b));
            group[ra] = rb;
        }
    }
    let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for i in 0..n {
        let r = find(&mut group, i);
        groups.entry(r).or_default().push(i);
    }
    let groups: Vec<Vec<usize>> = groups.into_values().collect();
    if groups.len() < 2 || groups.iter().any(|g| g.len() < 2) {
        return None;
    }
    let mut across = 0;
    for (&(a, b), &(r, _)) in rate {
        if find(&mut group, a) != find(&mut group, b) {
            across += 1;
            if r < 0.99 {
                return None;
            }
        }
    }
    (across > 0).then_some(groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four RNICs, each probing a rotating other one, 200 probes each; `fails(a, b, k)`
    /// says whether probe k from a to b times out.
    fn window(n: usize, fails: impl Fn(usize, usize, usize) -> bool) -> R2rWindow {
        let mut w = R2rWindow::new((0..n).map(|i| format!("r{i}")).collect());
        for k in 0..200 {
            for a in 0..n {
                let b = (a + 1 + k % (n - 1)) % n;
                w.record(a, b, fails(a, b, k));
            }
        }
        w
    }

    #[test]
    fn a_healthy_host_has_nothing_to_say() {
        assert!(analyze(&window(4, |_, _, _| false), 0.1).is_empty());
    }

    #[test]
    fn a_dead_rnic_is_down_and_its_peers_are_not_blamed() {
        let f = analyze(&window(4, |a, b, _| a == 2 || b == 2), 0.1);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(
            (f[0].kind.clone(), f[0].rnics.clone()),
            (R2rKind::Down, vec!["r2".to_string()])
        );
        assert_eq!(f[0].timeout_rate, 1.0);
    }

    #[test]
    fn a_flapping_rnic_is_sporadic() {
        // Down 3 probes in 10.
        let f = analyze(&window(4, |a, b, k| (a == 1 || b == 1) && k % 10 < 3), 0.1);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].kind, R2rKind::Sporadic);
        assert!(
            (f[0].timeout_rate - 0.3).abs() < 0.02,
            "{}",
            f[0].timeout_rate
        );
    }

    #[test]
    fn everything_failing_is_the_tor() {
        let f = analyze(&window(4, |_, _, _| true), 0.1);
        assert_eq!(f[0].kind, R2rKind::Tor);
        assert_eq!(
            analyze(&window(2, |_, _, _| true), 0.1)[0].kind,
            R2rKind::Tor
        );
    }

    #[test]
    fn two_islands_are_a_miswiring() {
        let side = |i: usize| i / 2;
        let f = analyze(&window(4, |a, b, _| side(a) != side(b)), 0.1);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].kind, R2rKind::Miswired);
        assert_eq!(
            f[0].groups,
            vec![
                vec!["r0".to_string(), "r1".into()],
                vec!["r2".to_string(), "r3".into()]
            ]
        );
    }

    #[test]
    fn loss_under_the_threshold_is_not_a_finding_and_one_bad_pair_names_no_one() {
        assert!(analyze(&window(4, |_, _, k| k % 20 == 0), 0.1).is_empty());
        let f = analyze(
            &window(4, |a, b, _| (a, b) == (0, 1) || (a, b) == (1, 0)),
            0.1,
        );
        assert!(f.is_empty(), "{f:?}");
    }

    #[test]
    fn two_dead_rnics_are_two_findings() {
        let f = analyze(
            &window(6, |a, b, _| [a, b].iter().any(|x| *x == 1 || *x == 4)),
            0.1,
        );
        let named: Vec<_> = f
            .iter()
            .map(|x| (x.kind.clone(), x.rnics[0].clone()))
            .collect();
        assert_eq!(
            named,
            vec![
                (R2rKind::Down, "r1".to_string()),
                (R2rKind::Down, "r4".to_string())
            ]
        );
    }
}
