use super::*;
use rpingmesh_controller::analyzer::PathFilter;

fn scenario(seed: u64, faults: &str) -> Scenario {
    let text = format!(
        "seed: {seed}\nduration_sec: 200\nfabric: {{tors: 4, spines: 4, hosts_per_tor: 2, rnics_per_host: 2, link_latency_us: 2, link_jitter_us: 0.3}}\nfaults:\n{faults}"
    );
    Scenario::from_yaml(&text).unwrap()
}

const FAULTS: &str = "  - {kind: link_down, location: tor1-spine2, start_sec: 60, end_sec: 120}\n  - {kind: host_stall, location: h3-1, start_sec: 30, end_sec: 150, delay_us: 3000}\n";

fn paths(sim: &Sim) -> Vec<PathSummary> {
    sim.analyzer().paths(&PathFilter::default(), true)
}

fn full(s: &Scenario) -> (SimOutcome, Vec<PathSummary>) {
    let mut sim = Sim::new(s, &SimOptions::default()).unwrap();
    while sim.step_window().is_some() {}
    let p = paths(&sim);
    (sim.finish(), p)
}

#[test]
fn same_seed_same_run_other_seed_other_jitter() {
    let (a, pa) = full(&scenario(5, FAULTS));
    let (b, pb) = full(&scenario(5, FAULTS));
    assert_eq!(a.findings_jsonl(), b.findings_jsonl());
    assert_eq!(a.probes, b.probes);
    assert_eq!(a.windows, b.windows);
    assert_eq!(a.events, b.events);
    assert_eq!(pa, pb, "every path window identical");
    assert!(a.probes.lost > 0 && a.probes.sent > 10_000);
    // `run` is the same as stepping.
    let c = run(&scenario(5, FAULTS), &SimOptions::default());
    assert_eq!(
        (c.probes, c.findings_jsonl()),
        (a.probes, a.findings_jsonl())
    );
    // Another seed: other jitter, other ECMP hash, other pinglist samples.
    let (_, pd) = full(&scenario(6, FAULTS));
    let rtts = |p: &[PathSummary]| -> Vec<(String, String, u64)> {
        p.iter()
            .map(|s| {
                (
                    s.source_gid.clone(),
                    s.target_gid.clone(),
                    s.network_rtt_p50_ns,
                )
            })
            .collect()
    };
    assert_ne!(rtts(&pa), rtts(&pd));
}

#[test]
fn timeouts_count_in_the_window_they_were_sent_in() {
    // h1-1/r0 down in [59, 60.5): its probes sent in [59, 60) time out in the next
    // window, but count in [30, 60), where they were sent (as the agent counts them);
    // those sent in [60, 60.5) in [60, 90). Nothing spills past the fault.
    let s = scenario(
        8,
        "  - {kind: rnic_down, location: h1-1/r0, start_sec: 59, end_sec: 60.5}\n",
    );
    let mut sim = Sim::new(&s, &SimOptions::default()).unwrap();
    while sim.step_window().is_some() {}
    let gid = sim.fabric().rnics[0].gid.to_string();
    assert_eq!(sim.windows.len(), 6);
    let base = sim.base_unix_ns();
    let mut seen = [0u32; 6];
    for p in paths(&sim).iter().filter(|p| p.source_gid == gid) {
        let k = ((p.window_start_unix_ns - base) / (30 * NS)) as usize;
        seen[k] += 1;
        match k {
            // 1 s of a 2/s target: 2 probes; 0.5 s: 1 (give or take the phase).
            1 => assert!((1..=3).contains(&p.probe_failed), "{p:?}"),
            2 => assert!((1..=2).contains(&p.probe_failed), "{p:?}"),
            _ => assert_eq!(p.probe_failed, 0, "{p:?}"),
        }
    }
    assert!(seen[1] == 6 && seen[2] == 6, "{seen:?}");
}

#[test]
fn a_stall_beyond_the_timeout_loses_the_probe() {
    // Every packet h2-1 handles is stalled: ~2% of each step beyond the timeout.
    let s = scenario(
        9,
        "  - {kind: host_stall, location: h2-1, start_sec: 0, end_sec: 200, delay_us: 100}\n",
    );
    let out = run(&s, &SimOptions::default());
    let lost = out.probes.lost as f64 / out.probes.sent as f64;
    // h2-1 has 2 of 16 RNICs; as prober 2 steps, as responder 1: about
    // (2 x 4% x 6 targets + 2% x ~6 probers) / (16 x 6) of all probes.
    assert!(lost > 0.002 && lost < 0.01, "{lost}");
    // Only background loss of a single ACK makes a probe invalid.
    assert!(out.probes.invalid <= 2, "{}", out.probes.invalid);
}

#[test]
fn options_change_the_window_and_the_pace() {
    let opts = SimOptions {
        window_sec: 20,
        probe_interval_ms: 1000,
        pinglist_refresh_sec: 60,
        ..SimOptions::default()
    };
    let mut sim = Sim::new(&scenario(3, "  []\n"), &opts).unwrap();
    assert_eq!(sim.windows_total(), 10);
    let r = sim.step_window().unwrap();
    assert_eq!((r.window.start_sec, r.window.end_sec), (0.0, 20.0));
    // One probe per target and second: 16 RNICs x 6 targets x ~20 s.
    assert!(
        (1700..=1950).contains(&r.window.probe_total),
        "{}",
        r.window.probe_total
    );
    // Refreshes every minute re-draw the inter-ToR samples but keep 3 per RNIC.
    while sim.step_window().is_some() {}
    for r in 0..16 {
        let t = sim.probe_targets(r);
        assert_eq!(t.len(), 6);
        let inter = t.iter().filter(|t| t.1 == PinglistKind::InterTor).count();
        assert_eq!(inter, 3);
    }
}

#[test]
fn degenerate_and_rail_fabrics_run() {
    let fabric = |f: &str, d: u64| {
        Scenario::from_yaml(&format!(
            "seed: 1\nduration_sec: {d}\nfabric: {{{f}, link_latency_us: 1, link_jitter_us: 0}}\n"
        ))
        .unwrap()
    };
    // One RNIC: nothing to probe, nothing reported.
    let one = run(
        &fabric(
            "tors: 1, spines: 1, hosts_per_tor: 1, rnics_per_host: 1",
            65,
        ),
        &SimOptions::default(),
    );
    assert_eq!(
        (one.probes.sent, one.summaries, one.windows.len()),
        (0, 0, 2)
    );
    // Shorter than a window: probes, but no complete window.
    let short = run(
        &fabric(
            "tors: 2, spines: 1, hosts_per_tor: 1, rnics_per_host: 1",
            10,
        ),
        &SimOptions::default(),
    );
    assert!(short.probes.sent > 0);
    assert!(short.windows.is_empty() && short.findings.is_empty());
    // Rails: 4 ToRs in one rail group of 4, 2 hosts; each RNIC probes its rail's
    // other RNIC (ToR mesh) and the 3 other ToRs.
    let s = fabric(
        "tors: 4, spines: 2, hosts_per_tor: 2, rnics_per_host: 4, rail_optimized: true",
        65,
    );
    let mut sim = Sim::new(&s, &SimOptions::default()).unwrap();
    while sim.step_window().is_some() {}
    for r in 0..8 {
        let t = sim.probe_targets(r);
        let mesh = t.iter().filter(|t| t.1 == PinglistKind::TorMesh).count();
        assert_eq!((mesh, t.len()), (1, 4), "rnic {r}");
    }
    let w = &sim.windows()[1];
    assert_eq!(w.paths, 8 * 4);
    assert_eq!(w.probe_failed, 0);
}

#[test]
fn invalid_scenarios_are_refused() {
    let mut s = scenario(1, "  []\n");
    s.fabric.spines = 0;
    assert_eq!(
        Sim::new(&s, &SimOptions::default())
            .err()
            .unwrap()
            .to_string(),
        "fabric.spines must be > 0"
    );
    assert!(try_run(&s, &SimOptions::default()).is_err());
}
