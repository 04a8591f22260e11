use rpingmesh_sim::gray::gray_scenario;
use rpingmesh_sim::{Sim, SimOptions};
fn main() {
    let i: usize = std::env::args().nth(1).unwrap().parse().unwrap();
    let mut s = gray_scenario(2026, i);
    if let Ok(q) = std::env::var("QUEUE") {
        s.background.queue_probability = q.parse().unwrap();
    }
    if let Ok(q) = std::env::var("LOSS") {
        s.background.loss_per_link = q.parse().unwrap();
    }
    if std::env::var("MAXW").is_ok() {
        s.duration_sec = 120;
        s.faults.clear();
    }
    println!("{:?}", s.faults);
    let mut sim = Sim::new(&s, &SimOptions::default()).unwrap();
    while let Some(w) = sim.step_window() {
        let sus = sim.analyzer().localizer().suspects();
        let top: Vec<String> = sus
            .iter()
            .take(5)
            .map(|s| format!("{:?}/{:?} {:.1}", s.component, s.test, s.score))
            .collect();
        println!(
            "[{:.0}-{:.0}) probes {} lost {} invalid {} events {} suspects {:?}",
            w.window.start_sec,
            w.window.end_sec,
            w.window.probe_total,
            w.window.probe_failed,
            w.window.invalid,
            w.events.len(),
            top
        );
        for e in &w.events {
            let f = e.event.finding.as_ref().unwrap();
            println!(
                "   {} {} {} {}",
                e.event.change,
                f.kind,
                f.location,
                f.evidence
                    .as_ref()
                    .map(|e| e.detail.clone())
                    .unwrap_or_default()
            );
        }
    }
}
