//! sim-eval: the localization accuracy evaluation, one JSON object per line on stdout
//! (`cargo xtask bench` puts them in BENCHMARKS.md).
//!
//! - localization: per fault kind, over a suite of randomized seeded scenarios on 512-RNIC
//!   fabrics (see `rpingmesh_sim::eval`): precision, recall, exact-location rate and
//!   detection time in analysis windows.
//! - localization_fault_free: findings over fault-free simulated hours (target: none).
//! - localization_suite: the suite's size and cost.
//!
//! `--scenarios N` (default 304), `--fault-free-hours H` (default 24), `--seed S`,
//! `--jobs J` (default: available cores), `--quick` (a smoke: 16 scenarios, 1 hour),
//! `--only N` (suite scenario N alone, its findings printed).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use rpingmesh_sim::eval::{
    report, score, suite_fabric, suite_scenario, ScenarioScore, SUITE_FABRICS,
};
use rpingmesh_sim::{try_run, Scenario, SimOptions};
use serde_json::json;

struct Args {
    scenarios: usize,
    fault_free_hours: u64,
    seed: u64,
    jobs: usize,
    /// Run only suite scenario N and print its findings (for whoever tunes the rules).
    only: Option<usize>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        scenarios: 304,
        fault_free_hours: 24,
        seed: 2026,
        jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
        only: None,
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
            "--fault-free-hours" => a.fault_free_hours = value("--fault-free-hours")?,
            "--seed" => a.seed = value("--seed")?,
            "--jobs" => a.jobs = (value("--jobs")? as usize).max(1),
            "--only" => a.only = Some(value("--only")? as usize),
            "--quick" => {
                a.scenarios = 16;
                a.fault_free_hours = 1;
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
        "{}x{}x{}x{}: {}",
        s.fabric.tors,
        s.fabric.spines,
        s.fabric.hosts_per_tor,
        s.fabric.rnics_per_host,
        f.join("; ")
    )
}

fn main() {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("sim-eval: {e}");
            std::process::exit(2);
        }
    };
    let opts = SimOptions::default();
    let window = opts.window_sec as f64;
    if let Some(i) = a.only {
        let s = suite_scenario(a.seed, i);
        println!("{}", describe(&s));
        let out = try_run(&s, &opts).unwrap_or_else(|e| panic!("suite scenario {i}: {e}"));
        print!("{}", out.findings_jsonl());
        return;
    }
    let t0 = Instant::now();
    let runs: Vec<(ScenarioScore, u64, u64, bool)> = parallel(a.scenarios, a.jobs, |i| {
        let s = suite_scenario(a.seed, i);
        let out = try_run(&s, &opts).unwrap_or_else(|e| panic!("suite scenario {i}: {e}"));
        let sc = score(&s, &out.findings, window);
        // Every miss and every false finding, on stderr, for whoever tunes the rules.
        for (f, (_, truth)) in out.findings.iter().zip(&sc.findings) {
            if !truth {
                eprintln!(
                    "sim-eval: scenario {i}: false finding {} {} {} [{:.0}, {:?}] ({}); faults: {}",
                    f.kind,
                    f.location,
                    f.symptom,
                    f.opened_sec,
                    f.resolved_sec,
                    f.evidence.detail,
                    describe(&s)
                );
            }
        }
        for g in sc.faults.iter().filter(|g| !g.detected) {
            eprintln!(
                "sim-eval: scenario {i}: missed {}; faults: {}",
                g.kind,
                describe(&s)
            );
        }
        (sc, out.probes.sent, s.duration_sec, s.faults.is_empty())
    });
    let suite_wall = t0.elapsed().as_secs_f64();
    let scores: Vec<ScenarioScore> = runs.iter().map(|r| r.0.clone()).collect();
    for (kind, r) in report(&scores) {
        let (mean, p95, max) = r.detection();
        println!(
            "{}",
            json!({
                "bench": "localization",
                "fault_kind": kind,
                "faults": r.faults,
                "detected": r.detected,
                "true_findings": r.true_findings,
                "false_findings": r.false_findings,
                "precision": r.precision(),
                "recall": r.recall(),
                "exact_location_rate": r.exact_location_rate(),
                "detection_windows_mean": mean,
                "detection_windows_p95": p95,
                "detection_windows_max": max,
            })
        );
    }
    let probes: u64 = runs.iter().map(|r| r.1).sum();
    let suite_fault_free: Vec<&(ScenarioScore, u64, u64, bool)> =
        runs.iter().filter(|r| r.3).collect();
    println!(
        "{}",
        json!({
            "bench": "localization_suite",
            "scenarios": a.scenarios,
            "fault_free_scenarios": suite_fault_free.len(),
            "faults": scores.iter().map(|s| s.faults.len()).sum::<usize>(),
            "rnics_per_fabric": 512,
            "fabrics": SUITE_FABRICS.iter().map(|f| format!("{}x{} ToRs x spines, {} hosts/ToR x {} RNICs", f.0, f.1, f.2, f.3)).collect::<Vec<_>>(),
            "simulated_sec": runs.iter().map(|r| r.2).sum::<u64>(),
            "probes": probes,
            "wall_sec": suite_wall,
            "jobs": a.jobs,
            "seed": a.seed,
        })
    );

    // Fault-free hours: hour-long runs of the first fabric, one per hour.
    let t1 = Instant::now();
    let hours = a.fault_free_hours as usize;
    let quiet: Vec<(usize, u64)> = parallel(hours, a.jobs, |h| {
        let s = Scenario {
            seed: a.seed ^ 0xFA17_F8EE ^ h as u64,
            duration_sec: 3600,
            fabric: suite_fabric(h),
            faults: Vec::new(),
        };
        let out = try_run(&s, &opts).unwrap_or_else(|e| panic!("fault-free hour {h}: {e}"));
        for f in &out.findings {
            eprintln!(
                "sim-eval: fault-free hour {h}: finding {} {} {} at {:.0} s",
                f.kind, f.location, f.symptom, f.opened_sec
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
                + suite_fault_free.iter().map(|r| r.0.findings.len()).sum::<usize>(),
            "suite_fault_free_hours": suite_fault_free.iter().map(|r| r.2).sum::<u64>() as f64 / 3600.0,
            "probes": quiet.iter().map(|q| q.1).sum::<u64>(),
            "wall_sec": t1.elapsed().as_secs_f64(),
        })
    );
}
