//! analyzer_localize: consecutive 30 s windows of a 100,000-RNIC fabric ingested and
//! localized on one thread (see the crate's opening comment).

use std::collections::HashMap;
use std::time::Instant;

use rpingmesh_controller::analyzer::{Analyzer, AnalyzerParams};
use rpingmesh_controller::topology::Topology;
use rpingmesh_proto::controller_agent::PathSummary;
use serde_json::json;

use super::common::{emit, gid_of};
use super::{batches, median};

/// One window of `rnics` RNICs (8 per ToR on 4 hosts): every RNIC's ToR mesh and 5
/// inter-ToR targets, 60 probes per path; RNIC 3 is dead and link tor-1 <-> spine-0 is
/// down, so the paths they touch carry per-label detail (64 labels) as agents send it.
/// GID -> (host, device, ToR): the localizer's inventory in the bench.
type Places = HashMap<String, (String, String, String)>;

/// `window` seeds the background (which labels are slow, which ACKs lost): it changes from
/// window to window, where the pinglists and the faults stay.
fn localize_window(rnics: u64, start: u64, window: u64) -> (Vec<PathSummary>, Places, Topology) {
    use rpingmesh_controller::topology::EcmpModel;
    use rpingmesh_proto::controller_agent::FlowLabelStats;
    let per_tor = 8u64;
    let tors = rnics / per_tor;
    let tor_name = |t: u64| format!("tor-{t}");
    let tor_names: Vec<String> = (0..tors).map(tor_name).collect();
    let spines: Vec<String> = (0..16).map(|s| format!("spine-{s}")).collect();
    let topo = Topology::full_mesh(&tor_names, &spines, Some(EcmpModel::Fnv1a { seed: 0 }));
    let gids: Vec<String> = (0..rnics).map(gid_of).collect();
    let inv: HashMap<String, (String, String, String)> = (0..rnics)
        .map(|r| {
            let t = r / per_tor;
            let host = format!("host-{t}-{}", (r % per_tor) / 2);
            (
                gids[r as usize].clone(),
                (host, format!("mlx5_{}", r % 2), tor_name(t)),
            )
        })
        .collect();
    let dead_rnic = 3u64;
    let bad = (1u32, 0u32);
    let mut rng = Lcg(7);
    let mut background = Lcg(1_000 + window);
    let mut out = Vec::with_capacity((rnics * 12) as usize);
    for src in 0..rnics {
        let st = src / per_tor;
        let mut targets: Vec<u64> = (st * per_tor..(st + 1) * per_tor)
            .filter(|&d| d != src)
            .collect();
        for _ in 0..5 {
            let dt = (st + 1 + rng.below(tors - 1)) % tors;
            targets.push(dt * per_tor + rng.below(per_tor));
        }
        for dst in targets {
            let dt = dst / per_tor;
            let (sg, dg) = (&gids[src as usize], &gids[dst as usize]);
            let mut s = PathSummary {
                source_gid: sg.clone(),
                source_tor_id: tor_name(st),
                target_gid: dg.clone(),
                target_tor_id: tor_name(dt),
                target_qpn: 1000,
                window_start_unix_ns: start,
                window_duration_ms: 30_000,
                probe_total: 60,
                network_rtt_min_ns: 8_000,
                network_rtt_max_ns: 30_000,
                network_rtt_p50_ns: 10_000,
                network_rtt_p99_ns: 20_000,
                prober_delay_p50_ns: 3_000,
                prober_delay_p99_ns: 9_000,
                responder_delay_p50_ns: 2_000,
                responder_delay_p99_ns: 6_000,
                pinglist_type: if st == dt { 0 } else { 1 },
                ..Default::default()
            };
            if src == dead_rnic || dst == dead_rnic {
                s.probe_failed = 60;
            } else if st != dt && [st, dt].contains(&(bad.0 as u64)) {
                let (ts, td) = (st as u32, dt as u32);
                // 60 probes a window over a 64-label set: one probe on each of 60 labels.
                for label in 0..60u32 {
                    let l = label * 16_411 + 3;
                    let fwd = topo.route(ts, td, sg, dg, l).expect("route");
                    let rev = topo.route(td, ts, dg, sg, l).expect("route");
                    let lost = fwd.iter().chain(rev.iter()).any(|x| (x.0, x.1) == bad);
                    let total = 1;
                    s.flow_labels.push(FlowLabelStats {
                        flow_label: l,
                        probe_total: total,
                        probe_failed: if lost { total } else { 0 },
                        network_rtt_p50_ns: if lost { 0 } else { 10_000 },
                        network_rtt_max_ns: if lost { 0 } else { 10_000 },
                        probe_invalid: 0,
                    });
                    s.probe_failed += if lost { total } else { 0 };
                }
                s.probe_total = s.flow_labels.iter().map(|l| l.probe_total).sum();
                if s.probe_failed == 0 {
                    s.flow_labels.clear();
                }
            } else if st != dt && background.below(5) == 0 {
                // The background agents send detail for: a fifth of the inter-ToR windows
                // have a label queued past the slow margin, or an ACK lost.
                let slow = background.below(60) as u32;
                let invalid = background.below(8) == 0;
                for label in 0..60u32 {
                    let p50 = if label == slow { 20_000 } else { 10_000 };
                    s.flow_labels.push(FlowLabelStats {
                        flow_label: label * 16_411 + 3,
                        probe_total: 1,
                        probe_failed: 0,
                        network_rtt_p50_ns: p50,
                        network_rtt_max_ns: p50,
                        probe_invalid: (invalid && label == slow) as u32,
                    });
                }
                s.invalid_rtt_count = invalid as u32;
            }
            s.probe_success = s.probe_total - s.probe_failed - s.invalid_rtt_count;
            out.push(s);
        }
    }
    (out, inv, topo)
}

/// Minimal deterministic generator for the bench fabrics.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }
}

/// Windows the analyzer localizes in a row: the first cold, then with the gray detector's
/// history full (four windows) and its baseline learning, as a running controller is.
pub(crate) const LOCALIZE_WINDOWS: u64 = 6;

pub(crate) fn bench_localize(rnics: u64, windows: u64) {
    let window_ns = 30_000_000_000u64;
    let start = 1_700_000_010_000_000_000u64 - 1_700_000_010_000_000_000u64 % window_ns;
    let (first, inv, topo) = localize_window(rnics, start, 0);
    let summaries = first.len();
    let mut first = Some(first);
    // Two windows kept per path: by the third the analyzer recycles what it drops, as a
    // controller does once its retention is reached (its default keeps 20, which six
    // windows never reach: every window would be fresh memory, page faults and all).
    let params = AnalyzerParams {
        window_retention: 2,
        ..AnalyzerParams::default()
    };
    let settle = params.localize_settle_ns;
    let mut a = Analyzer::with_topology(params, Some(topo));
    let (mut ingests, mut localizes) = (Vec::new(), Vec::new());
    let mut found = Vec::new();
    for k in 0..windows {
        // The same fabric's next window: the faults persist, the background moves.
        let at = start + k * window_ns;
        let input = batches(match first.take() {
            Some(w) => w,
            None => localize_window(rnics, at, k).0,
        });
        let t = Instant::now();
        for b in input {
            a.ingest(b, at + window_ns);
        }
        ingests.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let events = a.tick(at + window_ns + settle, &inv);
        localizes.push(t.elapsed().as_secs_f64());
        if k == 0 {
            found = events
                .iter()
                .filter_map(|e| e.finding.as_ref())
                .map(|f| format!("{} {}", f.kind, f.location))
                .collect();
        }
    }
    // Cold: the first window. Steady: the median of those after the history filled.
    let steady_from = 4.min(windows as usize - 1);
    let steady_ingest = median(ingests[steady_from..].to_vec());
    let steady_localize = median(localizes[steady_from..].to_vec());
    let cold = ingests[0] + localizes[0];
    let steady = steady_ingest + steady_localize;
    emit(json!({
        "bench": "analyzer_localize",
        "rnics": rnics,
        "summaries_per_window": summaries,
        "windows": windows,
        "cold_ingest_sec": ingests[0],
        "cold_localize_sec": localizes[0],
        "ingest_sec": steady_ingest,
        "localize_sec": steady_localize,
        "total_sec": steady.max(cold),
        "window_sec": 30,
        "ratio_to_window": steady.max(cold) / 30.0,
        "cold_ratio_to_window": cold / 30.0,
        "steady_ratio_to_window": steady / 30.0,
        "findings": found,
        "threads": 1,
    }));
}
