//! sim-eval: the localization accuracy evaluation, one JSON object per line on stdout
//! (`cargo xtask bench` puts them in BENCHMARKS.md).
//!
//! The black suite (`rpingmesh_sim::eval`): per fault kind, randomized seeded scenarios on
//! 512-RNIC fabrics with faults well above any SLA.
//! - localization: precision, recall, exact-location rate, detection time in windows.
//! - localization_fault_free: findings over fault-free simulated hours (target: none).
//! - localization_suite: the suite's size and cost.
//!
//! The gray suite (`rpingmesh_sim::gray`): faults below the SLAs on 1,024-RNIC fabrics
//! over a realistic background.
//! - gray_localization: per kind and magnitude, for faults of 3 windows and more.
//! - gray_short_faults: recall on faults shorter than 3 windows.
//! - gray_suite: the suite's size and cost, and the extra probes adaptive probing sent.
//! - gray_focus_ablation / gray_before_after: the first scenarios again without adaptive
//!   probing / with the rules alone (phase 1's thresholds, as before the gray detector).
//! - fault_free_day: findings over 24 fault-free hours of a 2,048-RNIC fabric.
//!
//! `--suite black|gray|all` (default all), `--scenarios N` (black, default 304),
//! `--gray-scenarios N` (default 192), `--fault-free-hours H` (black, default 24),
//! `--day-hours H` (default 24; `--day-first H` starts the day at that hour), `--seed S`, `--jobs J` (default: available cores),
//! `--focus-ablation N` / `--rules-ablation N` (default 48 each, 0 = none), `--rules-only`,
//! `--no-focus`, `--probe-interval-ms MS` (the agents' probe interval, default 500: a
//! sparser base probing shows what adaptive probing adds), `--quick` (a smoke: 16 + 16
//! scenarios, 1 + 1 hours, no ablations),
//! `--only N` / `--only-gray N`
//! (that scenario alone, its findings printed).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use rpingmesh_sim::eval::{
    report, report_by_magnitude, score, suite_scenario, KindReport, ScenarioScore, BLACK_KINDS,
    SUITE_FABRICS,
};
use rpingmesh_sim::gray::{fault_free_hour, gray_scenario, GRAY_FABRICS, GRAY_KINDS};
use rpingmesh_sim::workloads::{score_impact, ImpactScore, SCORED_JOBS};
use rpingmesh_sim::{try_run, Scenario, SimOptions, SimOutcome};
use serde_json::{json, Value};

/// Gray faults this many windows long and more are held to the targets.
const SCORED_WINDOWS: f64 = 3.0;

struct Args {
    black: bool,
    gray: bool,
    scenarios: usize,
    gray_scenarios: usize,
    fault_free_hours: u64,
    day_hours: u64,
    /// The day's first hour (to run part of a day again).
    day_first: u64,
    seed: u64,
    jobs: usize,
    /// Run only that scenario and print its findings (for whoever tunes the analyzer).
    only: Option<usize>,
    only_gray: Option<usize>,
    /// The localizer without its gray detector (the rules alone, as before it).
    rules_only: bool,
    /// No adaptive probing.
    no_focus: bool,
    /// Agents learn a new FOCUS generation only from their next report's ack, not when
    /// the window they reported is localized.
    focus_late: bool,
    /// Also run the first N gray scenarios without adaptive probing (its ablation).
    focus_ablation: usize,
    /// Also run the first N gray scenarios with the rules alone (the before/after table).
    rules_ablation: usize,
    /// The agents' `probe_interval_ms` (a sparser base probing shows what adaptive
    /// probing adds).
    probe_interval_ms: Option<u64>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        black: true,
        gray: true,
        scenarios: 304,
        gray_scenarios: 192,
        fault_free_hours: 24,
        day_hours: 24,
        day_first: 0,
        seed: 2026,
        jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
        only: None,
        only_gray: None,
        rules_only: false,
        no_focus: false,
        focus_late: false,
        focus_ablation: 48,
        rules_ablation: 48,
        probe_interval_ms: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .ok_or(format!("{name} needs a value"))?
                .parse::<u64>()
                .map_err(|e| format!("{name}: {e}"))
        };
        match flag.as_str() {
            "--scenarios" => a.scenarios = value("--scenarios")? as usize,
            "--gray-scenarios" => a.gray_scenarios = value("--gray-scenarios")? as usize,
            "--fault-free-hours" => a.fault_free_hours = value("--fault-free-hours")?,
            "--day-hours" => a.day_hours = value("--day-hours")?,
            "--day-first" => a.day_first = value("--day-first")?,
            "--seed" => a.seed = value("--seed")?,
            "--jobs" => a.jobs = (value("--jobs")? as usize).max(1),
            "--only" => a.only = Some(value("--only")? as usize),
            "--only-gray" => a.only_gray = Some(value("--only-gray")? as usize),
            "--rules-only" => a.rules_only = true,
            "--no-focus" => a.no_focus = true,
            "--focus-late" => a.focus_late = true,
            "--focus-ablation" => a.focus_ablation = value("--focus-ablation")? as usize,
            "--rules-ablation" => a.rules_ablation = value("--rules-ablation")? as usize,
            "--probe-interval-ms" => {
                a.probe_interval_ms = Some(value("--probe-interval-ms")?.max(1))
            }
            "--quick" => {
                a.scenarios = 16;
                a.gray_scenarios = 16;
                a.fault_free_hours = 1;
                a.day_hours = 1;
                a.focus_ablation = 0;
                a.rules_ablation = 0;
            }
            "--suite" => {
                let v = it.next().ok_or("--suite needs a value")?;
                (a.black, a.gray) = match v.as_str() {
                    "black" => (true, false),
                    "gray" => (false, true),
                    "all" => (true, true),
                    other => return Err(format!("--suite: black, gray or all, not {other:?}")),
                };
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(a)
}

/// Runs `count` jobs over `jobs` threads; results in job order.
fn parallel<T: Send>(count: usize, jobs: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<T>>> = Mutex::new((0..count).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..jobs.min(count.max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    break;
                }
                let r = f(i);
                out.lock().expect("results")[i] = Some(r);
            });
        }
    });
    out.into_inner()
        .expect("results")
        .into_iter()
        .map(|r| r.expect("every job ran"))
        .collect()
}

fn describe(s: &Scenario) -> String {
    let f: Vec<String> = s
        .faults
        .iter()
        .map(|f| {
            format!(
                "{} {} [{:.0}, {:.0}) {:?}",
                f.kind.name(),
                f.location,
                f.start_sec,
                f.end_sec,
                f.kind
            )
        })
        .collect();
    format!(
        "{}x{}x{}x{}{}: {}",
        s.fabric.tors,
        s.fabric.spines,
        s.fabric.hosts_per_tor,
        s.fabric.rnics_per_host,
        if s.fabric.rail_optimized { " rail" } else { "" },
        f.join("; ")
    )
}

/// One scenario's run, scored.
struct Run {
    score: ScenarioScore,
    /// Per fault: the jobs its finding says it hurts against the jobs it hurts.
    impact: Vec<ImpactScore>,
    probes: u64,
    focus_probes: u64,
    sec: u64,
    fault_free: bool,
}

/// Runs and scores one scenario; every miss and false finding goes to stderr, for
/// whoever tunes the analyzer.
fn run_scored(name: &str, i: usize, s: &Scenario, opts: &SimOptions) -> Run {
    let window = opts.window_sec as f64;
    let lag = window + opts.analyzer.localize_settle_ns as f64 / 1e9;
    let out: SimOutcome = try_run(s, opts).unwrap_or_else(|e| panic!("{name} scenario {i}: {e}"));
    let sc = score(s, &out.findings, window, lag);
    for (f, (_, truth)) in out.findings.iter().zip(&sc.findings) {
        if !truth {
            eprintln!(
                "sim-eval: {name} {i}: false finding {} {} {} [{:.0}, {:?}] ({}); faults: {}",
                f.kind,
                f.location,
                f.symptom,
                f.opened_sec,
                f.resolved_sec,
                f.evidence.detail,
                describe(s)
            );
        }
    }
    for g in sc.faults.iter().filter(|g| !g.detected) {
        eprintln!(
            "sim-eval: {name} {i}: missed {} {}; faults: {}",
            g.kind,
            g.magnitude,
            describe(s)
        );
    }
    Run {
        score: sc,
        impact: score_impact(s, &out.findings),
        probes: out.probes.sent,
        focus_probes: out.probes.focus,
        sec: s.duration_sec,
        fault_free: s.faults.is_empty(),
    }
}

fn kind_row(bench: &str, kind: &str, magnitude: Option<&str>, r: &KindReport) -> Value {
    let (mean, p95, max) = r.detection();
    let mut v = json!({
        "bench": bench,
        "fault_kind": kind,
        "faults": r.faults,
        "detected": r.detected,
        "recall": r.recall(),
        "exact_location_rate": r.exact_location_rate(),
        "detection_windows_mean": mean,
        "detection_windows_p95": p95,
        "detection_windows_max": max,
    });
    match magnitude {
        Some(m) => v["magnitude"] = json!(m),
        None => {
            v["true_findings"] = json!(r.true_findings);
            v["false_findings"] = json!(r.false_findings);
            v["precision"] = json!(r.precision());
        }
    }
    v
}

/// Runs scenarios `0..n` of a suite (`make(seed, i)`) on `a.jobs` threads: the runs,
/// their scores and the wall time taken.
fn run_suite(
    a: &Args,
    opts: &SimOptions,
    suite: &str,
    n: usize,
    make: fn(u64, usize) -> Scenario,
) -> (Vec<Run>, Vec<ScenarioScore>, f64) {
    let t0 = Instant::now();
    let runs: Vec<Run> = parallel(n, a.jobs, |i| run_scored(suite, i, &make(a.seed, i), opts));
    let wall = t0.elapsed().as_secs_f64();
    let scores = runs.iter().map(|r| r.score.clone()).collect();
    (runs, scores, wall)
}

fn black_suite(a: &Args, opts: &SimOptions) {
    let (runs, scores, suite_wall) = run_suite(a, opts, "black", a.scenarios, suite_scenario);
    for (kind, r) in report(&scores, &BLACK_KINDS) {
        println!("{}", kind_row("localization", kind, None, &r));
    }
    impact_rows("localization_impact", &runs);
    let fault_free: Vec<&Run> = runs.iter().filter(|r| r.fault_free).collect();
    println!(
        "{}",
        json!({
            "bench": "localization_suite",
            "scenarios": a.scenarios,
            "fault_free_scenarios": fault_free.len(),
            "faults": scores.iter().map(|s| s.faults.len()).sum::<usize>(),
            "rnics_per_fabric": 512,
            "fabrics": SUITE_FABRICS.iter().map(|f| format!("{}x{} ToRs x spines, {} hosts/ToR x {} RNICs", f.0, f.1, f.2, f.3)).collect::<Vec<_>>(),
            "simulated_sec": runs.iter().map(|r| r.sec).sum::<u64>(),
            "probes": runs.iter().map(|r| r.probes).sum::<u64>(),
            "wall_sec": suite_wall,
            "jobs": a.jobs,
            "seed": a.seed,
        })
    );
    // Fault-free hours: hour-long runs of the four fabrics, one per hour.
    let t1 = Instant::now();
    let hours = a.fault_free_hours as usize;
    let quiet: Vec<(usize, u64)> = parallel(hours, a.jobs, |h| {
        let s = Scenario {
            seed: a.seed ^ 0xFA17_F8EE ^ h as u64,
            duration_sec: 3600,
            fabric: rpingmesh_sim::eval::suite_fabric(h),
            faults: Vec::new(),
            background: Default::default(),
        };
        let out = try_run(&s, opts).unwrap_or_else(|e| panic!("fault-free hour {h}: {e}"));
        for f in &out.findings {
            eprintln!(
                "sim-eval: fault-free hour {h}: finding {} {} {} at {:.0} s ({})",
                f.kind, f.location, f.symptom, f.opened_sec, f.evidence.detail
            );
        }
        (out.findings.len(), out.probes.sent)
    });
    println!(
        "{}",
        json!({
            "bench": "localization_fault_free",
            "hours": hours,
            "rnics": 512,
            "findings": quiet.iter().map(|q| q.0).sum::<usize>()
                + fault_free.iter().map(|r| r.score.findings.len()).sum::<usize>(),
            "suite_fault_free_hours": fault_free.iter().map(|r| r.sec).sum::<u64>() as f64 / 3600.0,
            "probes": quiet.iter().map(|q| q.1).sum::<u64>(),
            "wall_sec": t1.elapsed().as_secs_f64(),
        })
    );
}

/// Per fault kind (and in all): of the jobs the faults hurt, those their findings named
/// (recall), and of the jobs named, those truly hurt (precision); jobs per fabric as
/// [`SCORED_JOBS`].
fn impact_rows(bench: &str, runs: &[Run]) {
    let mut by: std::collections::BTreeMap<&str, (usize, usize, usize, usize, usize)> =
        Default::default();
    for i in runs.iter().flat_map(|r| &r.impact) {
        for k in [i.fault_kind, "all"] {
            let e = by.entry(k).or_default();
            e.0 += 1;
            e.1 += i.truth;
            e.2 += i.named;
            e.3 += i.correct;
            e.4 += i.uncertain;
        }
    }
    let (jobs, size, qps) = SCORED_JOBS;
    for (kind, (faults, truth, named, correct, uncertain)) in by {
        let ratio = |a: usize, b: usize| if b == 0 { 1.0 } else { a as f64 / b as f64 };
        println!(
            "{}",
            json!({
                "bench": bench,
                "fault_kind": kind,
                "faults": faults,
                "jobs_hurt": truth,
                "jobs_named": named,
                "jobs_named_correctly": correct,
                "jobs_uncertain": uncertain,
                "impact_precision": ratio(correct, named),
                "impact_recall": ratio(correct, truth),
                "jobs_per_fabric": jobs,
                "rnics_per_job": size,
                "qps_per_hop": qps,
            })
        );
    }
}

fn gray_suite(a: &Args, opts: &SimOptions) {
    let (runs, scores, suite_wall) = run_suite(a, opts, "gray", a.gray_scenarios, gray_scenario);
    for ((kind, magnitude), r) in report_by_magnitude(&scores, &GRAY_KINDS, SCORED_WINDOWS) {
        let m = (magnitude != "all").then_some(magnitude.as_str());
        println!("{}", kind_row("gray_localization", kind, m, &r));
    }
    // Short faults (2 to 3 windows): recall only, the targets are for 3 windows and more.
    let short: Vec<ScenarioScore> = scores
        .iter()
        .map(|s| ScenarioScore {
            faults: s
                .faults
                .iter()
                .filter(|f| f.length_windows < SCORED_WINDOWS)
                .cloned()
                .collect(),
            findings: Vec::new(),
        })
        .collect();
    for ((kind, magnitude), r) in report_by_magnitude(&short, &GRAY_KINDS, 0.0) {
        if magnitude == "all" {
            let mut row = kind_row("gray_short_faults", kind, Some("all"), &r);
            row.as_object_mut().map(|o| o.remove("magnitude"));
            println!("{row}");
        }
    }
    impact_rows("gray_impact", &runs);
    let probes: u64 = runs.iter().map(|r| r.probes).sum();
    let focus: u64 = runs.iter().map(|r| r.focus_probes).sum();
    println!(
        "{}",
        json!({
            "bench": "gray_suite",
            "scenarios": a.gray_scenarios,
            "fault_free_scenarios": runs.iter().filter(|r| r.fault_free).count(),
            "faults": scores.iter().map(|s| s.faults.len()).sum::<usize>(),
            "rnics_per_fabric": 1024,
            "fabrics": GRAY_FABRICS.iter().map(|f| format!("{}x{} ToRs x spines, {} hosts/ToR x {} RNICs{}", f.0, f.1, f.2, f.3, if f.4 { " rail-optimized" } else { "" })).collect::<Vec<_>>(),
            "simulated_sec": runs.iter().map(|r| r.sec).sum::<u64>(),
            "probes": probes,
            "focus_probes": focus,
            "focus_share": if probes > 0 { focus as f64 / probes as f64 } else { 0.0 },
            "probe_interval_ms": opts.probe_interval_ms,
            "wall_sec": suite_wall,
            "jobs": a.jobs,
            "seed": a.seed,
        })
    );
    if a.focus_ablation > 0 {
        focus_ablation(a, opts, &scores);
    }
    if a.rules_ablation > 0 {
        rules_ablation(a, opts, &scores);
    }
    let t1 = Instant::now();
    let hours = a.day_hours as usize;
    let day: Vec<(usize, u64, u64, f64, f64)> = parallel(hours, a.jobs, |i| {
        let h = a.day_first as usize + i;
        let s = fault_free_hour(a.seed, h);
        let out = try_run(&s, opts).unwrap_or_else(|e| panic!("fault-free day hour {h}: {e}"));
        for f in &out.findings {
            eprintln!(
                "sim-eval: fault-free day hour {h}: finding {} {} {} at {:.0} s ({})",
                f.kind, f.location, f.symptom, f.opened_sec, f.evidence.detail
            );
        }
        eprintln!(
            "sim-eval: fault-free day hour {h}: strongest suspect {:.1} nats: {}",
            out.max_suspect_score, out.max_suspect
        );
        (
            out.findings.len(),
            out.probes.sent,
            out.probes.focus,
            out.max_suspect_score,
            out.gray_bar,
        )
    });
    println!(
        "{}",
        json!({
            "bench": "fault_free_day",
            "hours": hours,
            "rnics": 2048,
            "fabric": "64x8 ToRs x spines, 4 hosts/ToR x 8 RNICs",
            "findings": day.iter().map(|d| d.0).sum::<usize>(),
            "probes": day.iter().map(|d| d.1).sum::<u64>(),
            "focus_probes": day.iter().map(|d| d.2).sum::<u64>(),
            "max_score_nats": day.iter().map(|d| d.3).fold(0.0, f64::max),
            "bar_nats": day.iter().map(|d| d.4).fold(0.0, f64::max),
            "wall_sec": t1.elapsed().as_secs_f64(),
        })
    );
}

type MagnitudeReports = std::collections::BTreeMap<(&'static str, String), KindReport>;

/// The first `with.len()` gray scenarios again with `other`: the reports per kind and
/// magnitude of the suite's run (`with`) and of this one.
fn ablation(
    a: &Args,
    name: &str,
    other: &SimOptions,
    with: &[ScenarioScore],
) -> (MagnitudeReports, MagnitudeReports) {
    let runs: Vec<Run> = parallel(with.len(), a.jobs, |i| {
        run_scored(name, i, &gray_scenario(a.seed, i), other)
    });
    let without: Vec<ScenarioScore> = runs.iter().map(|r| r.score.clone()).collect();
    (
        report_by_magnitude(with, &GRAY_KINDS, SCORED_WINDOWS),
        report_by_magnitude(&without, &GRAY_KINDS, SCORED_WINDOWS),
    )
}

/// The analyzer as it was before the gray detector: phase 1's thresholds alone.
fn rules_only(opts: &SimOptions) -> SimOptions {
    let mut o = opts.clone();
    o.analyzer.localizer.gray.open_score = f64::INFINITY;
    o.focus.max_components = 0;
    o
}

/// The first `rules_ablation` gray scenarios again with the rules alone (the "before"):
/// per kind and magnitude, recall (and per kind precision) with and without the detector.
fn rules_ablation(a: &Args, opts: &SimOptions, with: &[ScenarioScore]) {
    let n = a.rules_ablation.min(with.len());
    let (on, off) = ablation(a, "gray-rules-only", &rules_only(opts), &with[..n]);
    for ((kind, m), r) in &on {
        let Some(q) = off.get(&(kind, m.clone())) else {
            continue;
        };
        let mut row = json!({
            "bench": "gray_before_after",
            "fault_kind": kind,
            "magnitude": m,
            "faults": r.faults,
            "recall_rules_only": q.recall(),
            "recall_with_detector": r.recall(),
            "detection_windows_p95_rules_only": q.detection().1,
            "detection_windows_p95_with_detector": r.detection().1,
            "scenarios": n,
        });
        if m == "all" {
            row["precision_rules_only"] = json!(q.precision());
            row["precision_with_detector"] = json!(r.precision());
        }
        println!("{row}");
    }
}

/// The first `focus_ablation` gray scenarios again without adaptive probing: detection
/// per kind at the smallest magnitude, with it (from the suite's run) and without.
fn focus_ablation(a: &Args, opts: &SimOptions, with: &[ScenarioScore]) {
    let n = a.focus_ablation.min(with.len());
    let mut off = opts.clone();
    off.focus.max_components = 0;
    let (on, no) = ablation(a, "gray-no-focus", &off, &with[..n]);
    for ((kind, m), r) in &on {
        if m == "all" {
            continue;
        }
        let Some(q) = no.get(&(kind, m.clone())) else {
            continue;
        };
        let (mean_on, p95_on, _) = r.detection();
        let (mean_off, p95_off, _) = q.detection();
        println!(
            "{}",
            json!({
                "bench": "gray_focus_ablation",
                "fault_kind": kind,
                "magnitude": m,
                "faults": r.faults,
                "recall_with": r.recall(),
                "recall_without": q.recall(),
                "detection_windows_mean_with": mean_on,
                "detection_windows_mean_without": mean_off,
                "detection_windows_p95_with": p95_on,
                "detection_windows_p95_without": p95_off,
                "scenarios": n,
                "probe_interval_ms": opts.probe_interval_ms,
            })
        );
    }
}

fn main() {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("sim-eval: {e}");
            std::process::exit(2);
        }
    };
    let mut opts = SimOptions::default();
    if a.rules_only {
        opts = rules_only(&opts);
    }
    if a.no_focus {
        opts.focus.max_components = 0;
    }
    if a.focus_late {
        opts.focus_prompt = false;
    }
    if let Some(ms) = a.probe_interval_ms {
        opts.probe_interval_ms = ms;
    }
    let only = match (a.only, a.only_gray) {
        (Some(i), _) => Some(suite_scenario(a.seed, i)),
        (_, Some(i)) => Some(gray_scenario(a.seed, i)),
        _ => None,
    };
    if let Some(s) = only {
        println!("{}", describe(&s));
        let out = try_run(&s, &opts).unwrap_or_else(|e| panic!("{e}"));
        print!("{}", out.findings_jsonl());
        return;
    }
    if a.black {
        black_suite(&a, &opts);
    }
    if a.gray {
        gray_suite(&a, &opts);
    }
}
