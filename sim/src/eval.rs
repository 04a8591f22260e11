//! Accuracy evaluation: randomized, seeded scenarios with known ground truth, run on the
//! simulated fabric, and the scoring of the findings the analyzer opened.
//!
//! Scoring (per the issue): a finding is true when its kind and location match an
//! injected fault whose time overlaps the finding's ([opened, resolved], or to the end
//! of the run while open). A fault is detected when a true finding matches it; its
//! detection time is from the fault's start to the first such finding's opening, in
//! analysis windows. A false finding counts against the fault kind its symptom names
//! (an RNIC "flapping" against rnic_flap, a link "latency" against link_latency, ...).
//! The exact-location rate is, over the faults some finding of the right kind overlapped
//! in time, the share where one named the exact component.

use std::collections::BTreeMap;

use crate::fabric::FabricSpec;
use crate::output::FindingRecord;
use crate::rng::{below, spread_fault, uniform, Rng};
use crate::scenario::background::Background;
use crate::scenario::{ground_truth, Direction, Fault, FaultKind, Scenario};

/// The kinds of the black-failure suite (every kind but the gray-only rnic_loss), in the
/// order its scenarios cycle through.
pub const BLACK_KINDS: [&str; 7] = [
    "rnic_down",
    "rnic_flap",
    "host_stall",
    "tor_down",
    "link_loss",
    "link_down",
    "link_latency",
];

/// Fabrics of the suite: all of 512 RNICs, in four shapes (the last has ToRs of two
/// RNICs, the case where R-Pingmesh's ToR mesh cannot tell which end is broken).
pub const SUITE_FABRICS: [(u32, u32, u32, u32); 4] = [
    // (tors, spines, hosts_per_tor, rnics_per_host)
    (64, 4, 4, 2),
    (32, 8, 4, 4),
    (64, 8, 2, 4),
    (256, 4, 1, 2),
];

/// Length of a suite scenario.
pub const SUITE_DURATION_SEC: u64 = 600;
/// Every this-many-th suite scenario is fault-free.
pub const FAULT_FREE_EVERY: usize = 8;

/// Fabric shape `i` of the suite (cycling through [`SUITE_FABRICS`]).
pub fn suite_fabric(i: usize) -> FabricSpec {
    let (tors, spines, hosts_per_tor, rnics_per_host) = SUITE_FABRICS[i % SUITE_FABRICS.len()];
    FabricSpec {
        tors,
        spines,
        hosts_per_tor,
        rnics_per_host,
        rail_optimized: false,
        link_latency_us: 2.0,
        link_jitter_us: 0.3,
    }
}

/// A fault of kind `kind_index` (into [`BLACK_KINDS`]) on ToR `tor` (1-based) of `f`.
fn random_fault(
    rng: &mut Rng,
    kind_index: usize,
    tor: u32,
    f: &FabricSpec,
    start: f64,
    len: f64,
) -> Fault {
    let h = 1 + below(rng, f.hosts_per_tor);
    let r = below(rng, f.rnics_per_host);
    let s = 1 + below(rng, f.spines);
    let dir = match below(rng, 3) {
        0 => Direction::Up,
        1 => Direction::Down,
        _ => Direction::Both,
    };
    let (kind, location) = match BLACK_KINDS[kind_index % BLACK_KINDS.len()] {
        "rnic_down" => (FaultKind::RnicDown, format!("h{tor}-{h}/r{r}")),
        "rnic_flap" => (
            FaultKind::RnicFlap {
                period_sec: uniform(rng, 10.0, 40.0).round(),
                down_fraction: (uniform(rng, 0.2, 0.5) * 100.0).round() / 100.0,
            },
            format!("h{tor}-{h}/r{r}"),
        ),
        "host_stall" => (
            FaultKind::HostStall {
                delay_us: uniform(rng, 2_000.0, 20_000.0).round(),
            },
            format!("h{tor}-{h}"),
        ),
        "tor_down" => (FaultKind::TorDown, format!("tor{tor}")),
        "link_loss" => (
            FaultKind::LinkLoss {
                loss: (uniform(rng, 0.02, 0.2) * 1000.0).round() / 1000.0,
                direction: dir,
            },
            format!("tor{tor}-spine{s}"),
        ),
        "link_down" => (FaultKind::LinkDown, format!("tor{tor}-spine{s}")),
        _ => (
            FaultKind::LinkLatency {
                add_us: uniform(rng, 100.0, 500.0).round(),
                direction: dir,
            },
            format!("tor{tor}-spine{s}"),
        ),
    };
    Fault::lasting(kind, location, start, len)
}

/// Suite scenario `i` of a suite seeded `seed`: every [`FAULT_FREE_EVERY`]-th is
/// fault-free, the others carry one or (every other one) two simultaneous faults on
/// different ToRs, their kinds cycling through all seven so each gets its share.
pub fn suite_scenario(seed: u64, i: usize) -> Scenario {
    let mut rng = Rng::new(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let f = suite_fabric(i);
    let mut faults = Vec::new();
    if i % FAULT_FREE_EVERY != FAULT_FREE_EVERY - 1 {
        let n = if i.is_multiple_of(2) { 1 } else { 2 };
        let start = uniform(&mut rng, 90.0, 240.0).round();
        let first_tor = 1 + below(&mut rng, f.tors);
        for j in 0..n {
            let (tor, s) = spread_fault(&mut rng, f.tors, first_tor, j, 2, start, 60.0);
            let len = uniform(&mut rng, 150.0, 300.0).round();
            faults.push(random_fault(&mut rng, 2 * i + j, tor, &f, s, len));
        }
    }
    Scenario {
        seed: seed.wrapping_add(i as u64),
        duration_sec: SUITE_DURATION_SEC,
        fabric: f,
        faults,
        background: Background::default(),
    }
}

/// The fault kind a finding claims, by its kind and symptom.
pub fn claimed_fault_kind(f: &FindingRecord) -> &'static str {
    match (f.kind.as_str(), f.symptom.as_str()) {
        ("rnic", "flapping") => "rnic_flap",
        ("rnic", "loss") => "rnic_loss",
        ("rnic", _) => "rnic_down",
        ("host", _) => "host_stall",
        ("tor", _) => "tor_down",
        ("link", "down") => "link_down",
        ("link", "latency") => "link_latency",
        _ => "link_loss",
    }
}

/// Whether finding `f` is about fault `g`'s time: a finding opens `lag` after the
/// window that showed it began (a window and its settle time), so it is taken as
/// covering [opened - lag, resolved].
fn overlaps(f: &FindingRecord, end_of_run: f64, lag: f64, g: &Fault) -> bool {
    let f_end = f.resolved_sec.unwrap_or(end_of_run);
    f.opened_sec - lag < g.end_sec && g.start_sec < f_end
}

/// How one scenario's findings scored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScenarioScore {
    /// Per fault: (kind name, detected, detection windows, some finding of the right kind
    /// overlapped it, the matching finding's symptom).
    pub faults: Vec<FaultScore>,
    /// (claimed fault kind, true?) per finding.
    pub findings: Vec<(&'static str, bool)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct FaultScore {
    pub kind: &'static str,
    /// The fault's size as reports group it ("0.5%", "+10us", "2ms"; "" for black kinds).
    pub magnitude: String,
    /// How long it lasted, in windows.
    pub length_windows: f64,
    pub detected: bool,
    pub detection_windows: Option<f64>,
    pub kind_overlapped: bool,
}

/// Scores one run. `window_sec` converts detection times to windows; `lag` is how long
/// after a window starts a finding from it can open (the window plus the settle time).
pub fn score(s: &Scenario, findings: &[FindingRecord], window_sec: f64, lag: f64) -> ScenarioScore {
    let end = s.duration_sec as f64;
    let mut out = ScenarioScore::default();
    for f in findings {
        let truth = s.faults.iter().find(|g| {
            let t = ground_truth(g);
            t.kind == f.kind && t.location == f.location && overlaps(f, end, lag, g)
        });
        let claimed = match truth {
            Some(g) => g.kind.name(),
            None => claimed_fault_kind(f),
        };
        out.findings.push((claimed, truth.is_some()));
    }
    for g in &s.faults {
        let t = ground_truth(g);
        let first = findings
            .iter()
            .filter(|f| f.kind == t.kind && f.location == t.location && overlaps(f, end, lag, g))
            .map(|f| f.opened_sec)
            .min_by(|a, b| a.total_cmp(b));
        out.faults.push(FaultScore {
            kind: g.kind.name(),
            magnitude: crate::gray::magnitude_label(&g.kind),
            length_windows: (g.end_sec - g.start_sec) / window_sec,
            detected: first.is_some(),
            detection_windows: first.map(|o| (o - g.start_sec).max(0.0) / window_sec),
            kind_overlapped: findings
                .iter()
                .any(|f| f.kind == t.kind && overlaps(f, end, lag, g)),
        });
    }
    out
}

/// The suite's numbers for one fault kind.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KindReport {
    pub faults: u32,
    pub detected: u32,
    pub true_findings: u32,
    pub false_findings: u32,
    pub kind_overlapped: u32,
    pub detection_windows: Vec<f64>,
}

impl KindReport {
    fn add_fault(&mut self, f: &FaultScore) {
        self.faults += 1;
        self.detected += f.detected as u32;
        self.kind_overlapped += f.kind_overlapped as u32;
        if let Some(w) = f.detection_windows {
            self.detection_windows.push(w);
        }
    }

    fn add_finding(&mut self, truth: bool) {
        if truth {
            self.true_findings += 1;
        } else {
            self.false_findings += 1;
        }
    }

    pub fn recall(&self) -> f64 {
        ratio(self.detected, self.faults)
    }
    pub fn precision(&self) -> f64 {
        if self.true_findings + self.false_findings == 0 {
            return 1.0;
        }
        ratio(self.true_findings, self.true_findings + self.false_findings)
    }
    pub fn exact_location_rate(&self) -> f64 {
        ratio(self.detected, self.kind_overlapped)
    }
    /// (mean, p95, max) detection time in windows.
    pub fn detection(&self) -> (f64, f64, f64) {
        let mut v = self.detection_windows.clone();
        if v.is_empty() {
            return (0.0, 0.0, 0.0);
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let p95 = v[((v.len() as f64 * 0.95).ceil() as usize).clamp(1, v.len()) - 1];
        (mean, p95, v[v.len() - 1])
    }
}

fn ratio(a: u32, b: u32) -> f64 {
    if b == 0 {
        1.0
    } else {
        a as f64 / b as f64
    }
}

/// Sums scenario scores per (kind, magnitude) bucket: every fault of `kinds` at least
/// `min_windows` long counts in its kind's "all" bucket and in its magnitude's; each
/// finding in its claimed kind's "all" bucket (a false finding has no magnitude). Faults
/// shorter than `min_windows` count nowhere, and so do the findings that matched them.
pub fn report_by_magnitude(
    scores: &[ScenarioScore],
    kinds: &[&'static str],
    min_windows: f64,
) -> BTreeMap<(&'static str, String), KindReport> {
    let mut out: BTreeMap<(&'static str, String), KindReport> = kinds
        .iter()
        .map(|k| ((*k, "all".to_string()), KindReport::default()))
        .collect();
    for s in scores {
        let short: Vec<&'static str> = s
            .faults
            .iter()
            .filter(|f| f.length_windows < min_windows)
            .map(|f| f.kind)
            .collect();
        for f in s.faults.iter().filter(|f| f.length_windows >= min_windows) {
            for bucket in ["all".to_string(), f.magnitude.clone()] {
                out.entry((f.kind, bucket)).or_default().add_fault(f);
            }
        }
        for &(kind, truth) in &s.findings {
            // A true finding of a fault too short to score is left out with it.
            if truth && short.contains(&kind) {
                continue;
            }
            out.entry((kind, "all".to_string()))
                .or_default()
                .add_finding(truth);
        }
    }
    out
}

/// Sums scenario scores per fault kind (every kind of `kinds` present).
pub fn report(
    scores: &[ScenarioScore],
    kinds: &[&'static str],
) -> BTreeMap<&'static str, KindReport> {
    let mut out: BTreeMap<&'static str, KindReport> =
        kinds.iter().map(|k| (*k, KindReport::default())).collect();
    for s in scores {
        for f in &s.faults {
            out.entry(f.kind).or_default().add_fault(f);
        }
        for &(kind, truth) in &s.findings {
            out.entry(kind).or_default().add_finding(truth);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rpingmesh_proto::operator::FindingEvidence;

    fn finding(
        kind: &str,
        location: &str,
        symptom: &str,
        opened: f64,
        resolved: Option<f64>,
    ) -> FindingRecord {
        FindingRecord {
            id: 1,
            kind: kind.into(),
            location: location.into(),
            symptom: symptom.into(),
            severity: String::new(),
            opened_sec: opened,
            resolved_sec: resolved,
            confidence: 0.9,
            evidence: FindingEvidence::default(),
        }
    }

    fn scenario(faults: Vec<Fault>) -> Scenario {
        Scenario {
            seed: 1,
            duration_sec: 900,
            fabric: suite_fabric(0),
            faults,
            background: Background::default(),
        }
    }

    fn fault(kind: FaultKind, location: &str, start: f64, end: f64) -> Fault {
        Fault {
            kind,
            location: location.into(),
            start_sec: start,
            end_sec: end,
        }
    }

    #[test]
    fn a_matching_overlapping_finding_is_true_and_detects() {
        let s = scenario(vec![fault(FaultKind::RnicDown, "h3-2/r1", 300.0, 600.0)]);
        let sc = score(
            &s,
            &[finding("rnic", "h3-2/r1", "down", 335.0, Some(665.0))],
            30.0,
            35.0,
        );
        assert_eq!(sc.findings, vec![("rnic_down", true)]);
        let f = &sc.faults[0];
        assert!(f.detected && f.kind_overlapped);
        assert!((f.detection_windows.unwrap() - 35.0 / 30.0).abs() < 1e-9);
    }

    #[test]
    fn wrong_place_wrong_time_and_wrong_kind_are_false() {
        let s = scenario(vec![fault(
            FaultKind::LinkLoss {
                loss: 0.05,
                direction: Direction::Up,
            },
            "tor2-spine3",
            300.0,
            600.0,
        )]);
        let found = [
            finding("link", "tor2-spine1", "loss", 330.0, Some(700.0)), // wrong link
            finding("link", "tor2-spine3", "loss", 700.0, Some(800.0)), // after the fault
            finding("rnic", "h2-1/r0", "flapping", 330.0, None),        // wrong kind
        ];
        let sc = score(&s, &found, 30.0, 35.0);
        assert_eq!(
            sc.findings,
            vec![
                ("link_loss", false),
                ("link_loss", false),
                ("rnic_flap", false)
            ]
        );
        let f = &sc.faults[0];
        assert!(
            !f.detected && f.kind_overlapped,
            "a link finding overlapped, at the wrong link"
        );
        let r = report(&[sc], &BLACK_KINDS);
        assert_eq!(r["link_loss"].precision(), 0.0);
        assert_eq!(r["link_loss"].recall(), 0.0);
        assert_eq!(r["link_loss"].exact_location_rate(), 0.0);
        assert_eq!(r["rnic_flap"].false_findings, 1);
        assert_eq!(r["tor_down"].precision(), 1.0, "no findings, no faults");
    }

    #[test]
    fn an_open_finding_overlaps_until_the_end() {
        let s = scenario(vec![fault(FaultKind::TorDown, "tor9", 300.0, 900.0)]);
        let sc = score(
            &s,
            &[finding("tor", "tor9", "down", 320.0, None)],
            30.0,
            35.0,
        );
        assert_eq!(sc.findings, vec![("tor_down", true)]);
    }

    #[test]
    fn detection_statistics() {
        let r = KindReport {
            detection_windows: vec![1.0, 0.5, 2.0, 1.5],
            ..Default::default()
        };
        let (mean, p95, max) = r.detection();
        assert!((mean - 1.25).abs() < 1e-9);
        assert_eq!((p95, max), (2.0, 2.0));
    }

    #[test]
    fn the_suite_is_seeded_balanced_and_valid() {
        let a: Vec<Scenario> = (0..56).map(|i| suite_scenario(11, i)).collect();
        let b: Vec<Scenario> = (0..56).map(|i| suite_scenario(11, i)).collect();
        assert_eq!(a, b);
        assert_ne!(
            a,
            (0..56).map(|i| suite_scenario(12, i)).collect::<Vec<_>>()
        );
        let mut per_kind: BTreeMap<&str, u32> = BTreeMap::new();
        for (i, s) in a.iter().enumerate() {
            s.validate().unwrap_or_else(|e| panic!("scenario {i}: {e}"));
            let rnics = s.fabric.tors * s.fabric.hosts_per_tor * s.fabric.rnics_per_host;
            assert!(rnics >= 512);
            assert_eq!(
                s.faults.is_empty(),
                i % FAULT_FREE_EVERY == FAULT_FREE_EVERY - 1
            );
            for f in &s.faults {
                *per_kind.entry(f.kind.name()).or_default() += 1;
            }
        }
        assert_eq!(per_kind.len(), 7, "{per_kind:?}");
        let (lo, hi) = (
            per_kind.values().min().unwrap(),
            per_kind.values().max().unwrap(),
        );
        assert!(hi - lo <= 3, "{per_kind:?}");
    }
}
