use rpingmesh_controller::analyzer::PathFilter;
use rpingmesh_sim::eval::suite_scenario;
use rpingmesh_sim::{Sim, SimOptions};
fn main() {
    let i: usize = std::env::args().nth(1).unwrap().parse().unwrap();
    let host = std::env::args().nth(2).unwrap();
    let s = suite_scenario(2026, i);
    let mut sim = Sim::new(&s, &SimOptions::default()).unwrap();
    while let Some(w) = sim.step_window() {
        if w.window.start_sec >= 300.0 {
            break;
        }
    }
    let gids: Vec<String> = sim
        .fabric()
        .rnics
        .iter()
        .filter(|r| r.name.starts_with(&format!("{host}/")))
        .map(|r| r.gid.to_string())
        .collect();
    let base = sim.base_unix_ns();
    for p in sim.analyzer().paths(&PathFilter::default(), true) {
        let k = (p.window_start_unix_ns - base) / 30_000_000_000;
        if k != 10 {
            continue;
        }
        let src = gids.contains(&p.source_gid);
        let dst = gids.contains(&p.target_gid);
        if !(src || dst) {
            continue;
        }
        println!(
            "{} {} type {} n {} ok {} p50 {} p99 {} r50 {} r99 {}",
            if src { "PROBER" } else { "resp  " },
            &p.target_gid[30..],
            p.pinglist_type,
            p.probe_total,
            p.probe_success,
            p.prober_delay_p50_ns,
            p.prober_delay_p99_ns,
            p.responder_delay_p50_ns,
            p.responder_delay_p99_ns
        );
    }
}
