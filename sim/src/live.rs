//! The simulator's live view (the `--live` demo): per window, the worst ToR pairs of
//! the analyzer's table next to the findings as they open and resolve. Pure: a window
//! report and the open findings in, text out.

use std::fmt::Write as _;

use rpingmesh_proto::operator::Finding;

use crate::sim::WindowReport;

/// ToR pairs shown per window (the worst by loss, then by RTT p99).
pub const SHOWN_PAIRS: usize = 6;

fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1000.0)
}

/// One window of the live view.
pub fn render(r: &WindowReport, open: &[Finding], base_unix_ns: u64) -> String {
    let mut s = String::new();
    let w = &r.window;
    let _ = writeln!(
        s,
        "\n[{:>5.0} s] window {:>3} ({:.0}-{:.0} s): {} paths, {} probes, {} lost",
        r.now_sec, w.index, w.start_sec, w.end_sec, w.paths, w.probe_total, w.probe_failed
    );
    let mut pairs: Vec<_> = r.tor_pairs.iter().collect();
    pairs.sort_by(|a, b| {
        b.loss_ratio
            .total_cmp(&a.loss_ratio)
            .then(b.network_rtt_p99_ns.cmp(&a.network_rtt_p99_ns))
            .then((&a.source_tor_id, &a.target_tor_id).cmp(&(&b.source_tor_id, &b.target_tor_id)))
    });
    let _ = writeln!(
        s,
        "  {:<8} {:<8} {:>6} {:>8} {:>7} {:>10} {:>10}    worst {} of {} ToR pairs",
        "SRC TOR",
        "DST TOR",
        "PATHS",
        "PROBES",
        "LOSS %",
        "RTT p50 us",
        "RTT p99 us",
        SHOWN_PAIRS.min(pairs.len()),
        pairs.len()
    );
    for p in pairs.iter().take(SHOWN_PAIRS) {
        let _ = writeln!(
            s,
            "  {:<8} {:<8} {:>6} {:>8} {:>7.2} {:>10} {:>10}",
            p.source_tor_id,
            p.target_tor_id,
            p.paths,
            p.probe_total,
            100.0 * p.loss_ratio,
            us(p.network_rtt_p50_ns),
            us(p.network_rtt_p99_ns)
        );
    }
    let sec = |ns: u64| ns.saturating_sub(base_unix_ns) as f64 / 1e9;
    for e in &r.events {
        let Some(f) = &e.event.finding else { continue };
        if e.event.change == "updated" {
            continue;
        }
        let detail = f.evidence.as_ref().map(|e| e.detail.as_str()).unwrap_or("");
        let _ = writeln!(
            s,
            "  >> {:<8} {} {} {} (confidence {:.2}) at {:.0} s: {}",
            e.event.change.to_uppercase(),
            f.kind,
            f.location,
            f.symptom,
            f.confidence,
            e.sec,
            detail
        );
    }
    if open.is_empty() {
        s += "  open findings: none\n";
    } else {
        s += "  open findings:\n";
        for f in open {
            let _ = writeln!(
                s,
                "    #{} {} {} {} since {:.0} s",
                f.id,
                f.kind,
                f.location,
                f.symptom,
                sec(f.opened_unix_ns)
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{ProbeCounts, TimedEvent, WindowStats};
    use rpingmesh_proto::operator::{FindingEvent, FindingEvidence, TorPairStats};

    #[test]
    fn the_view_shows_the_worst_pairs_and_the_findings() {
        let pair = |src: &str, loss: f64| TorPairStats {
            source_tor_id: src.into(),
            target_tor_id: "tor9".into(),
            paths: 4,
            probe_total: 1000,
            loss_ratio: loss,
            network_rtt_p50_ns: 8_000,
            network_rtt_p99_ns: 9_500,
            ..Default::default()
        };
        let f = Finding {
            id: 3,
            kind: "link".into(),
            location: "tor2-spine3".into(),
            symptom: "loss".into(),
            confidence: 0.8,
            opened_unix_ns: 1_000 + 335_000_000_000,
            open: true,
            evidence: Some(FindingEvidence {
                detail: "loss 5.0% across it".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let r = WindowReport {
            window: WindowStats {
                index: 11,
                start_sec: 300.0,
                end_sec: 330.0,
                paths: 100,
                probe_total: 6000,
                probe_success: 5990,
                probe_failed: 10,
                invalid: 0,
                worst_pair: None,
            },
            now_sec: 335.0,
            tor_pairs: (0..10)
                .map(|i| pair(&format!("tor{i}"), i as f64 / 100.0))
                .collect(),
            events: vec![TimedEvent {
                sec: 335.0,
                event: FindingEvent {
                    change: "opened".into(),
                    finding: Some(f.clone()),
                },
            }],
            probes: ProbeCounts::default(),
        };
        let text = render(&r, &[f], 1_000);
        let rows: Vec<&str> = text
            .lines()
            .filter(|l| l.trim_start().starts_with("tor"))
            .collect();
        assert_eq!(rows.len(), SHOWN_PAIRS);
        assert!(
            rows[0].trim_start().starts_with("tor9"),
            "worst first: {text}"
        );
        assert!(
            text.contains(
                ">> OPENED   link tor2-spine3 loss (confidence 0.80) at 335 s: loss 5.0% across it"
            ),
            "{text}"
        );
        assert!(
            text.contains("#3 link tor2-spine3 loss since 335 s"),
            "{text}"
        );
        assert!(render(&r, &[], 1_000).contains("open findings: none"));
    }
}
