//! `rpingmesh-sim --scenario FILE [--findings-out FILE] [--quiet] [--live MS]`: runs a
//! scenario on the simulated fabric, writes the analyzer's findings as JSON lines and
//! prints a short summary. A bad scenario exits 2 with one line saying what is wrong.
//! `--live MS` is the demo: one analysis window every MS milliseconds of real time, each
//! printed as the worst ToR pairs next to the findings opening and resolving.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use rpingmesh_sim::{ground_truth, Scenario, SimOptions};

#[derive(Parser)]
#[command(
    name = "rpingmesh-sim",
    about = "Run a fault scenario on a simulated Clos fabric with the real probing core and controller analyzer"
)]
struct Args {
    /// Scenario file (YAML; see sim/README.md).
    #[arg(long)]
    scenario: PathBuf,
    /// Where to write the findings, one JSON object per line.
    #[arg(long)]
    findings_out: Option<PathBuf>,
    /// Print nothing but errors.
    #[arg(long)]
    quiet: bool,
    /// Live view: pace the run at one analysis window per this many milliseconds.
    #[arg(long, value_name = "MS")]
    live: Option<u64>,
}

/// Steps the run a window at a time, printing each, at most one per `ms` of real time.
fn live(scenario: &Scenario, ms: u64) -> rpingmesh_sim::SimOutcome {
    let mut sim = rpingmesh_sim::Sim::new(scenario, &SimOptions::default())
        .unwrap_or_else(|e| panic!("validated scenario: {e}"));
    for f in &scenario.faults {
        println!(
            "scheduled: {} at {} from {:.0} s to {:.0} s",
            f.kind.name(),
            f.location,
            f.start_sec,
            f.end_sec
        );
    }
    let pace = std::time::Duration::from_millis(ms);
    loop {
        let started = std::time::Instant::now();
        let Some(report) = sim.step_window() else {
            break;
        };
        let open = sim.analyzer().localizer().list(1, "");
        let open: Vec<_> = open.into_iter().filter(|f| f.open).collect();
        print!(
            "{}",
            rpingmesh_sim::live::render(&report, &open, sim.base_unix_ns())
        );
        std::thread::sleep(pace.saturating_sub(started.elapsed()));
    }
    sim.finish()
}

fn main() -> ExitCode {
    let args = Args::parse();
    let text = match std::fs::read_to_string(&args.scenario) {
        Ok(t) => t,
        Err(e) => {
            eprintln!(
                "rpingmesh-sim: cannot read scenario {}: {e}",
                args.scenario.display()
            );
            return ExitCode::from(2);
        }
    };
    let scenario = match Scenario::from_yaml(&text) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rpingmesh-sim: {}: {e}", args.scenario.display());
            return ExitCode::from(2);
        }
    };
    let out = match args.live {
        Some(ms) => live(&scenario, ms),
        None => rpingmesh_sim::run(&scenario, &SimOptions::default()),
    };
    if let Some(path) = &args.findings_out {
        if let Err(e) = std::fs::write(path, out.findings_jsonl()) {
            eprintln!("rpingmesh-sim: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if !args.quiet {
        let f = &scenario.fabric;
        println!(
            "fabric: {} ToRs x {} spines, {} hosts/ToR x {} RNICs{}: {} RNICs",
            f.tors,
            f.spines,
            f.hosts_per_tor,
            f.rnics_per_host,
            if f.rail_optimized {
                " (rail-optimized)"
            } else {
                ""
            },
            f.tors
                * f.hosts_per_tor
                * if f.rail_optimized {
                    1
                } else {
                    f.rnics_per_host
                },
        );
        println!("faults: {}", scenario.faults.len());
        for fault in &scenario.faults {
            let g = ground_truth(fault);
            println!(
                "  {:<12} {:<14} {:>7.0}..{:<7.0} s  expect {} {}",
                fault.kind.name(),
                fault.location,
                fault.start_sec,
                fault.end_sec,
                g.kind,
                g.location
            );
        }
        println!("findings: {}", out.findings.len());
        for r in &out.findings {
            let resolved = r
                .resolved_sec
                .map_or_else(|| "open".to_string(), |s| format!("{s:.0}"));
            println!(
                "  {:<5} {:<14} {:<9} opened {:>7.0} s  resolved {:>7} s  confidence {:.2}",
                r.kind, r.location, r.symptom, r.opened_sec, resolved, r.confidence
            );
        }
        let p = out.probes;
        println!(
            "probes: {} sent, {} ok, {} lost, {} invalid; {} windows, {} summaries",
            p.sent,
            p.success,
            p.lost,
            p.invalid,
            out.windows.len(),
            out.summaries
        );
        println!(
            "virtual {:.0} s in {:.2} s wall ({:.2} M probes/s)",
            out.virtual_sec,
            out.wall_sec,
            p.sent as f64 / out.wall_sec.max(1e-9) / 1e6
        );
    }
    ExitCode::SUCCESS
}
