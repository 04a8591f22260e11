//! Tests of `bench.rs`.

use super::*;

#[test]
fn targets_are_checked_from_known_fields() {
    let lines: Vec<Line> = [
        r#"{"bench":"get_pinglist","rnics":100000,"p99_ns":1500000,"pinglist_type":"tor_mesh"}"#,
        r#"{"bench":"get_pinglist","rnics":10000,"p99_ns":9000000}"#,
        r#"{"bench":"analyzer_ingest","per_sec":100000.0}"#,
        r#"{"bench":"agent_vs_baseline","ratio":0.8,"target":0.7}"#,
    ]
    .iter()
    .map(|t| serde_json::from_str(t).unwrap())
    .collect();
    let c = target_checks(&lines);
    assert_eq!(c.len(), 3, "{c:?}");
    assert!(c[0].4 && (c[0].3 - 0.75).abs() < 1e-9);
    assert!(!c[1].4 && (c[1].3 - 0.5).abs() < 1e-9);
    assert!(c[2].4);
    // Gray rows: the per-kind row is checked (p95 against 3 windows), not the
    // per-magnitude ones; a fault-free day with a finding misses.
    let gray: Vec<Line> = [
        r#"{"bench":"gray_localization","fault_kind":"link_loss","precision":1.0,"recall":0.99,"detection_windows_p95":3.3}"#,
        r#"{"bench":"gray_localization","fault_kind":"link_loss","magnitude":"0.5%","recall":0.5}"#,
        r#"{"bench":"fault_free_day","hours":24,"rnics":2048,"findings":1}"#,
    ]
    .iter()
    .map(|t| serde_json::from_str(t).unwrap())
    .collect();
    let g = target_checks(&gray);
    assert_eq!(g.len(), 4, "{g:?}");
    assert!(g[0].4 && g[1].4 && !g[2].4 && (g[2].3 - 1.1).abs() < 1e-9);
    assert!(!g[3].4 && g[3].0.contains("2048 RNICs"), "{g:?}");
    let t = grouped_tables(&lines);
    assert!(
        t.contains("### get_pinglist") && t.contains("### analyzer_ingest"),
        "{t}"
    );
}

#[test]
fn own_cpu_and_rss_are_read() {
    let me = std::process::id();
    assert!(rss_kib(me).unwrap() > 1024);
    cpu_ticks(me).unwrap();
    assert!(cpu_ticks(1 << 30).is_err());
}

#[test]
fn medians_match_lines_by_their_string_fields() {
    let run = |a: i64, b: f64| -> Vec<Line> {
        vec![
            serde_json::from_str(&format!(r#"{{"bench":"x","n":{a}}}"#)).unwrap(),
            serde_json::from_str(&format!(r#"{{"bench":"y","v":{b:?}}}"#)).unwrap(),
        ]
    };
    let m = median_lines(&[run(5, 1.0), run(1, 3.0), run(3, 2.0)]);
    assert_eq!(m[0]["n"], Value::from(3));
    assert_eq!(m[1]["v"], Value::from(2.0));
    let t = json_table(&m);
    assert!(t.starts_with("| bench | n | v |"), "{t}");
    assert!(t.contains("| x | 3 |  |"), "{t}");
}

#[test]
fn the_floor_counts_are_its_last_line() {
    let log = "floor sent=64 acks=100\nsome warning\nfloor sent=640 acks=1280\n";
    assert_eq!(floor_counts(log), Some((640, 1280)));
    assert_eq!(floor_counts("nothing yet\n"), None);
    assert_eq!(floor_counts("floor sent=x acks=1\n"), None);
}

#[test]
fn the_footprint_rows_carry_the_floor() {
    let run = |cpu, floor| Footprint {
        cpu_pct: cpu,
        rss_mib: 11.0,
        probes_per_sec: 640.0,
        targets_probed: 64,
        sleep_rss_mib: 1.7,
        floor_cpu_pct: floor,
    };
    let runs = vec![run(0.4, 0.2), run(0.6, 0.4), run(0.45, 0.3)];
    let rows = footprint_checks(&runs);
    assert_eq!(rows[0].1, "0.450% of a core (probe-floor 0.300%)");
    assert!(rows[0].4 && rows[1].4);
    let s = footprint_section(&Ok(runs));
    assert!(s.starts_with(FOOTPRINT_HEADING), "{s}");
    assert!(
        s.contains("| agent CPU / probe-floor CPU (median of the runs' ratios) | 1.50 |"),
        "{s}"
    );
    assert!(footprint_checks(&[]).is_empty());
}
