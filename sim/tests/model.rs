//! Checks of the simulated fabric itself, through what the analyzer received (its path
//! windows), not through the localizer's findings.

use std::collections::HashMap;

use rpingmesh_controller::analyzer::PathFilter;
use rpingmesh_proto::controller_agent::{PathSummary, PinglistType};
use rpingmesh_sim::{Scenario, Sim, SimOptions};

const LINK_US: f64 = 2.0;

/// 4 ToRs x `spines`, 2 hosts per ToR x 2 RNICs, `duration` s, the given faults.
fn scenario(seed: u64, spines: u32, duration: u64, faults: &str) -> Scenario {
    let text = format!(
        "seed: {seed}\nduration_sec: {duration}\nfabric: {{tors: 4, spines: {spines}, hosts_per_tor: 2, rnics_per_host: 2, link_latency_us: {LINK_US}, link_jitter_us: 0.3}}\nfaults:\n{faults}"
    );
    Scenario::from_yaml(&text).unwrap()
}

/// Runs every window; returns the simulator (for its analyzer and fabric).
fn run(s: &Scenario) -> Sim {
    let mut sim = Sim::new(s, &SimOptions::default()).unwrap();
    while sim.step_window().is_some() {}
    assert!(sim.is_done());
    sim
}

/// Every retained window of every path the analyzer holds.
fn windows(sim: &Sim) -> Vec<PathSummary> {
    sim.analyzer().paths(&PathFilter::default(), true)
}

fn gid_index(sim: &Sim) -> HashMap<String, u32> {
    sim.fabric()
        .rnics
        .iter()
        .enumerate()
        .map(|(i, r)| (r.gid.to_string(), i as u32))
        .collect()
}

#[test]
fn fault_free_paths_are_clean_and_rtt_is_the_links() {
    let s = scenario(21, 2, 95, "  []\n");
    let sim = run(&s);
    let all = windows(&sim);
    // 16 RNICs x (3 ToR-mesh + 3 inter-ToR targets) x 3 windows.
    assert_eq!(all.len(), 16 * 6 * 3);
    let (mut total, mut failed) = (0u64, 0u64);
    for w in &all {
        total += w.probe_total as u64;
        failed += w.probe_failed as u64;
        assert!(w.probe_failed <= 1, "background loss only: {w:?}");
        // 2 probes/s for ~30 s.
        assert!((50..=62).contains(&w.probe_total), "{}", w.probe_total);
        let links = if w.source_tor_id == w.target_tor_id {
            4.0
        } else {
            8.0
        };
        let base = links * LINK_US * 1e3;
        let p50 = w.network_rtt_p50_ns as f64;
        assert!(
            p50 >= base && p50 <= base + links * 300.0,
            "RTT p50 {p50} ns over {links} links"
        );
        assert!((w.network_rtt_p99_ns as f64) <= base + links * 300.0);
        // Endpoint noise: a few microseconds.
        assert!(
            (3_000..20_000).contains(&w.prober_delay_p50_ns),
            "{}",
            w.prober_delay_p50_ns
        );
        assert!(
            (3_000..5_000).contains(&w.responder_delay_p50_ns),
            "{}",
            w.responder_delay_p50_ns
        );
    }
    assert!(failed as f64 / (total as f64) < 1e-4, "{failed}/{total}");
    let p = sim.probes();
    assert_eq!(p.sent, p.success + p.lost + p.invalid + outstanding(&sim));
}

/// Probes still waiting for their timeout at the end (sent in the last second).
fn outstanding(sim: &Sim) -> u64 {
    let p = sim.probes();
    p.sent - p.success - p.lost - p.invalid
}

#[test]
fn link_down_loses_exactly_the_labels_routed_over_it() {
    // tor1-spine1 down for the whole run (4 spines).
    let s = scenario(
        22,
        4,
        95,
        "  - {kind: link_down, location: tor1-spine1, start_sec: 0, end_sec: 95}\n",
    );
    let sim = run(&s);
    let fab = sim.fabric();
    let idx = gid_index(&sim);
    let (mut crossing_probes, mut clean_probes, mut stray_losses) = (0u64, 0u64, 0u64);
    let mut crossing_paths = 0;
    for w in windows(&sim) {
        if w.pinglist_type != PinglistType::InterTor as i32 {
            assert_eq!(w.probe_failed, 0, "ToR-local paths never cross a spine");
            continue;
        }
        let (a, b) = (idx[&w.source_gid], idx[&w.target_gid]);
        let (ta, tb) = (fab.rnics[a as usize].tor, fab.rnics[b as usize].tor);
        let crosses = |label: u32| {
            let fwd = fab.spine_of(a, b, label).unwrap();
            let rev = fab.spine_of(b, a, label).unwrap();
            (ta == 0 || tb == 0) && (fwd == 0 || rev == 0)
        };
        if w.flow_labels.is_empty() {
            // No per-label detail: a clean window.
            assert!(w.probe_failed <= 1, "{w:?}");
            stray_losses += w.probe_failed as u64;
            continue;
        }
        let mut any = false;
        for l in &w.flow_labels {
            if crosses(l.flow_label) {
                any = true;
                assert_eq!(
                    l.probe_failed, l.probe_total,
                    "label {} crosses",
                    l.flow_label
                );
                crossing_probes += l.probe_total as u64;
            } else {
                stray_losses += l.probe_failed as u64;
                clean_probes += l.probe_total as u64;
            }
        }
        crossing_paths += any as u32;
    }
    assert!(
        stray_losses <= 1,
        "{stray_losses} losses on labels off the link"
    );
    assert!(crossing_paths > 10, "{crossing_paths}");
    assert!(crossing_probes > 500 && clean_probes > 1000);
}

#[test]
fn host_stall_slows_the_endpoints_not_the_network() {
    let delay_us = 5000.0;
    let s = scenario(
        23,
        2,
        95,
        "  - {kind: host_stall, location: h2-1, start_sec: 0, end_sec: 95, delay_us: 5000}\n",
    );
    let sim = run(&s);
    let fab = sim.fabric();
    let idx = gid_index(&sim);
    let host = fab.host_index("h2-1").unwrap();
    let on_host = |gid: &str| fab.rnics[idx[gid] as usize].host == host;
    let (mut from, mut to) = (0, 0);
    let d = delay_us * 1e3;
    for w in windows(&sim) {
        let links = if w.source_tor_id == w.target_tor_id {
            4.0
        } else {
            8.0
        };
        // The network RTT stays that of the links.
        assert!(
            (w.network_rtt_p50_ns as f64) <= links * (LINK_US * 1e3 + 300.0),
            "{w:?}"
        );
        assert!((w.network_rtt_p99_ns as f64) <= links * (LINK_US * 1e3 + 300.0) + 1_000.0);
        let prober = w.prober_delay_p50_ns as f64;
        let responder = w.responder_delay_p50_ns as f64;
        if on_host(&w.source_gid) {
            // Two stalled steps (send, receive): median of their sum ~1.7 x delay.
            from += 1;
            assert!(prober > 0.8 * d && prober < 2.5 * d, "prober p50 {prober}");
            // Some probes are late beyond the timeout.
            assert!(w.probe_failed < w.probe_total / 5);
        } else {
            assert!(prober < 20_000.0, "prober p50 {prober}");
        }
        if on_host(&w.target_gid) {
            // One stalled step: median ~0.7 x delay.
            to += 1;
            assert!(
                responder > 0.4 * d && responder < 2.0 * d,
                "responder p50 {responder}"
            );
        } else {
            assert!(responder < 10_000.0, "responder p50 {responder}");
        }
    }
    assert!(from > 0 && to > 0);
    let p = sim.probes();
    assert!(p.lost > 0, "2% of the stalled packets outlast the timeout");
}

#[test]
fn rnic_down_loses_every_probe_to_and_from_it() {
    let s = scenario(
        24,
        2,
        95,
        "  - {kind: rnic_down, location: h3-1/r1, start_sec: 0, end_sec: 95}\n",
    );
    let sim = run(&s);
    let gid = sim.fabric().rnics[sim.fabric().rnic_index("h3-1/r1").unwrap() as usize]
        .gid
        .to_string();
    let (mut from, mut to) = (0, 0);
    for w in windows(&sim) {
        if w.source_gid == gid || w.target_gid == gid {
            from += (w.source_gid == gid) as u32;
            to += (w.target_gid == gid) as u32;
            assert!(w.probe_total > 40);
            assert_eq!(w.probe_failed, w.probe_total, "{w:?}");
        } else {
            assert!(w.probe_failed <= 1, "{w:?}");
        }
    }
    // Its own 6 targets in each of 3 windows; and everyone who probes it.
    assert_eq!(from, 18);
    assert!(to >= 9, "{to}");
}

#[test]
fn link_latency_slows_only_the_labels_over_it() {
    let s = scenario(
        25,
        4,
        95,
        "  - {kind: link_latency, location: tor2-spine3, start_sec: 0, end_sec: 95, add_us: 200, direction: up}\n",
    );
    let sim = run(&s);
    let fab = sim.fabric();
    let idx = gid_index(&sim);
    let (mut slow, mut fast) = (0, 0);
    for w in windows(&sim) {
        if w.pinglist_type != PinglistType::InterTor as i32 || w.flow_labels.is_empty() {
            continue;
        }
        let (a, b) = (idx[&w.source_gid], idx[&w.target_gid]);
        let (ta, tb) = (fab.rnics[a as usize].tor, fab.rnics[b as usize].tor);
        for l in &w.flow_labels {
            if l.probe_total == l.probe_failed {
                continue;
            }
            // Up on tor2-spine3: the probe leaving tor2 over spine3, or the ACKs.
            let fwd = fab.spine_of(a, b, l.flow_label).unwrap();
            let rev = fab.spine_of(b, a, l.flow_label).unwrap();
            let over = (ta == 1 && fwd == 2) as u64 + (tb == 1 && rev == 2) as u64;
            let rtt = l.network_rtt_p50_ns as f64;
            if over > 0 {
                slow += 1;
                assert!(
                    (rtt - 16_000.0 - over as f64 * 200_000.0).abs() < 3_000.0,
                    "{rtt}"
                );
            } else {
                fast += 1;
                assert!(rtt < 19_000.0, "{rtt}");
            }
        }
    }
    assert!(slow > 20 && fast > 20, "{slow} {fast}");
}

#[test]
fn the_window_report_carries_the_tor_pairs() {
    let s = scenario(
        26,
        2,
        70,
        "  - {kind: tor_down, location: tor4, start_sec: 0, end_sec: 70}\n",
    );
    let mut sim = Sim::new(&s, &SimOptions::default()).unwrap();
    assert_eq!(sim.windows_total(), 2);
    let first = sim.step_window().unwrap();
    assert_eq!(first.window.index, 0);
    assert_eq!((first.window.start_sec, first.window.end_sec), (0.0, 30.0));
    // Ingested at 32 s, localized at 35 s (the settle time).
    assert_eq!(first.now_sec, 35.0);
    let worst = first.window.worst_pair.clone().unwrap();
    assert_eq!(worst.loss_ratio, 1.0);
    assert!(worst.source_tor == "tor4" || worst.target_tor == "tor4");
    let pair = |src: &str, dst: &str| {
        first
            .tor_pairs
            .iter()
            .find(|p| p.source_tor_id == src && p.target_tor_id == dst)
            .cloned()
    };
    assert_eq!(pair("tor4", "tor4").unwrap().loss_ratio, 1.0);
    assert_eq!(pair("tor1", "tor1").unwrap().loss_ratio, 0.0);
    if let Some(p) = pair("tor1", "tor4") {
        assert_eq!(p.loss_ratio, 1.0);
    }
    assert!(first.probes.sent > 0);
    let second = sim.step_window().unwrap();
    assert_eq!(second.window.index, 1);
    assert_eq!(second.now_sec, 65.0);
    assert!(sim.step_window().is_none());
    assert_eq!(sim.windows().len(), 2);
}
