//! The text an operator reads: the host tree, the checks and the verdict.

use super::*;

/// The text an operator reads.
pub fn render(r: &HostReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "host {}", r.hostname);
    let downgraded: BTreeMap<String, &LinkDowngrade> = r
        .downgrades
        .iter()
        .map(|d| (format!("pcie:{}", d.bdf), d))
        .collect();
    let state =
        |key: &str| -> Option<String> { downgraded.get(key).map(|_| "DOWNGRADED".to_string()) };
    out.push_str(&r.topology.render(&state));
    let _ = writeln!(
        out,
        "PCIe links: {}",
        if r.downgrades.is_empty() {
            "every link at its best".to_string()
        } else {
            format!("{} below their best", r.downgrades.len())
        }
    );
    for p in &r.ports {
        let g = |v: Option<f64>| v.map_or("?".into(), |x| format!("{x:.2}"));
        let _ = writeln!(
            out,
            "counters {} port {}: tx {} Gb/s, rx {} Gb/s, tx pause {}, drops {:.1}/s",
            p.device,
            p.port,
            g(p.rates.tx_gbps),
            g(p.rates.rx_gbps),
            p.rates
                .tx_pause_ratio
                .map_or("n/a".into(), |x| format!("{:.1}%", x * 100.0)),
            p.rates.drops_per_sec
        );
    }
    let _ = writeln!(out, "mode: {:?}", r.mode);
    match &r.r2r.skipped {
        Some(why) => {
            let _ = writeln!(out, "R2R: skipped ({why})");
        }
        None => {
            let _ = writeln!(
                out,
                "R2R: {} RNICs ({}), {} probes, {} timed out",
                r.r2r.rnics.len(),
                r.r2r.rnics.join(", "),
                r.r2r.probes,
                r.r2r.timeouts
            );
            for (k, w) in r.r2r.windows.iter().enumerate() {
                let found: Vec<String> = w.findings.iter().map(describe_r2r).collect();
                let _ = writeln!(
                    out,
                    "  window {}: {} probes, {} timed out{}",
                    k + 1,
                    w.probes,
                    w.timeouts,
                    if found.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", found.join("; "))
                    }
                );
            }
        }
    }
    match &r.loopback.skipped {
        Some(why) => {
            let _ = writeln!(out, "loopback: skipped ({why})");
        }
        None => {
            let _ = writeln!(out, "loopback: {} paths", r.loopback.paths.len());
            if let Some(why) = &r.loopback.gpu_skipped {
                let _ = writeln!(out, "  GPU endpoints not tested: {why}");
            }
            for p in &r.loopback.paths {
                let _ = writeln!(
                    out,
                    "  {} -> {}: {:.1} us, {} Gb/s{}",
                    p.rnic,
                    p.endpoint,
                    p.host_latency_us,
                    p.bandwidth_gbps.map_or("?".into(), |g| format!("{g:.2}")),
                    if p.abnormal { "  ABNORMAL" } else { "" }
                );
            }
        }
    }
    if r.problems.is_empty() {
        let _ = writeln!(out, "verdict: OK");
    } else {
        let _ = writeln!(out, "verdict: PROBLEM");
        for p in &r.problems {
            let _ = writeln!(out, "  - {p}");
        }
    }
    out
}
