//! Tests of `vm.rs`.

use super::*;

#[test]
fn load_lines_compare_transports_and_phases() {
    let w = |start_s: u64, gid: &str, probes: u64| {
        json!({"window_start_unix_ns": start_s * 1_000_000_000, "window_duration_ms": 2000,
                   "target_gid": gid, "probe_total": probes})
    };
    let dead = "0000:0000:0000:0000:0000:ffff:c612:0363";
    let ph = |name: &str, from: u64, to: u64, pc: f64| {
        json!({"phase": name, "from_unix_ns": from * 1_000_000_000,
                   "to_unix_ns": to * 1_000_000_000, "prober_cpu_pct": pc, "responder_cpu_pct": pc / 2.0})
    };
    let load = json!({
        "probes_per_sec": 640,
        "rdma": {"phases": [ph("alone", 10, 20, 8.0), ph("dead_peer", 30, 40, 10.0)],
                 "windows": [w(10, "b", 1200), w(12, "b", 1280), w(19, "b", 9999),
                             w(30, "b", 1000), w(32, dead, 5000)]},
        "udp": {"phases": [ph("alone", 10, 20, 4.0)], "windows": [w(10, "b", 1280)]},
    });
    let l = load_lines(&load);
    assert_eq!(l.len(), 4);
    // (1200 + 1280) probes over 4 s; the window reaching past the phase is left out.
    assert_eq!(l[0]["probes_per_sec_achieved"], 620.0);
    assert_eq!(l[1]["probes_per_sec_achieved"], 640.0);
    assert_eq!(l[2]["prober_cpu_pct"], 2.0);
    assert_eq!(l[3]["live_probes_per_sec_with_dead_peer"], 500.0);
    assert!(load_lines(&json!(null)).is_empty());
}

#[test]
fn rdma_lines_take_medians_and_ratios() {
    let v = json!({
        "rounds": [
            {"agent": {"value": 1000.0, "pipelined_16": 4000.0, "failed_or_invalid": 0},
             "ud_pingpong": {"busy": {"usec_per_iter": 250.0}, "events": {"usec_per_iter": 500.0}}},
            {"agent": {"value": 1200.0, "pipelined_16": 5000.0, "failed_or_invalid": 1},
             "ud_pingpong": {"busy": {"usec_per_iter": 200.0}, "events": {"usec_per_iter": 400.0}}},
            {"agent": {"value": 800.0, "pipelined_16": 3000.0, "failed_or_invalid": 0},
             "ud_pingpong": {"busy": {"usec_per_iter": 400.0}, "events": {"usec_per_iter": 1000.0}}},
        ],
        "service_path_latency_ms": [900.0, 300.0, 600.0],
        "qps": 3,
        "report_interval_ms": 1000,
    });
    let l = rdma_lines(&v).unwrap();
    assert_eq!(l[0]["agent_in_flight_1"], 1000.0);
    assert_eq!(l[0]["ibv_ud_pingpong_busy"], 4000.0);
    assert_eq!(l[0]["ibv_ud_pingpong_events"], 2000.0);
    assert_eq!(l[0]["ratio_vs_events"], 0.5);
    assert_eq!(l[0]["agent_failed_or_invalid"], 1.0);
    assert_eq!(l[1]["median"], 600.0);
    assert_eq!(
        (l[1]["min"].as_f64(), l[1]["max"].as_f64()),
        (Some(300.0), Some(900.0))
    );
    assert!(rdma_lines(&json!({"rounds": [{"agent": {}}]})).is_err());
}

#[test]
fn rc_ring_lines_double_ib_write_lat_and_skip_failed_rounds() {
    let rounds = json!([
        {"ring_rtt_p50_ns": 300000, "ring_rtt_p99_ns": 900000, "ib_write_lat_typical_us": 150.0,
         "ring_msgs_per_sec": 4000, "ib_write_bw_mpps": 0.008},
        {"error": "ring client did not finish"},
        {"ring_rtt_p50_ns": 200000, "ring_rtt_p99_ns": 800000, "ib_write_lat_typical_us": 100.0,
         "ring_msgs_per_sec": 6000, "ib_write_bw_mpps": 0.010},
        {"ring_rtt_p50_ns": 250000, "ring_rtt_p99_ns": 700000, "ib_write_lat_typical_us": 125.0,
         "ring_msgs_per_sec": 5000, "ib_write_bw_mpps": 0.012},
    ]);
    let l = rc_ring_lines(&rounds);
    assert_eq!(l[0]["rounds"], 3);
    assert_eq!(l[0]["ring_p50_ns"], 250000.0);
    assert_eq!(l[0]["baseline_ns"], 250000.0);
    assert_eq!(l[0]["ratio_to_baseline"], 1.0);
    assert_eq!(l[1]["baseline_msgs_per_sec"], 10000.0);
    assert_eq!(l[1]["ratio_to_baseline"], 0.5);
    assert!(rc_ring_lines(&json!([{"error": "x"}])).is_empty());
}

#[test]
fn rc_ring_cpu_lines_compare_with_and_without_rings() {
    let runs = json!([
        {"rc_ring_pinglists": "service", "agent_cpu_pct": [2.0, 4.0], "ring_probes": 0},
        {"rc_ring_pinglists": "tor_mesh", "agent_cpu_pct": [4.0, 5.0], "ring_probes": 38},
    ]);
    let l = rc_ring_cpu_lines(&runs);
    assert_eq!(l[0]["agent_cpu_pct_no_rings"], 3.0);
    assert_eq!(l[0]["agent_cpu_pct_with_rings"], 4.5);
    assert_eq!(l[0]["ring_cost_pct"], 1.5);
    assert_eq!(l[0]["ratio_with_to_without"], 1.5);
    assert!(rc_ring_cpu_lines(&json!(null)).is_empty());
}
