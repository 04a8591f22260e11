//! `rpingmeshctl findings`: the controller's localized findings (a broken RNIC, host, ToR
//! or ToR-spine link), as a table or JSON rows, and `--watch`, which follows the
//! WatchFindings stream: one line per finding at the start ("snapshot"), then one per
//! change ("opened", "updated", "resolved").

use std::io::Write;

use clap::Args;
use serde_json::{json, Value};

use rpingmesh_proto::operator::{
    Finding, FindingEvent, FindingImpact, ListFindingsRequest, WatchFindingsRequest,
};

use crate::connect::{Call, Failure};
use crate::format::{or_dash, utc, Table};

#[derive(Debug, Clone, Args)]
pub struct FindingsArgs {
    /// Only this kind: rnic, host, tor or link (the controller checks it).
    #[arg(long, value_name = "KIND")]
    pub kind: Option<String>,
    /// Resolved findings to list after the open ones, most recently resolved first
    /// (0 = every one the controller keeps).
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub resolved_limit: u32,
    /// Follow the changes as they happen (WatchFindings): one line per current finding
    /// ("snapshot"), then one per change ("opened", "updated", "resolved"), until Ctrl-C
    /// or --count lines. A watcher the controller cut off for falling behind watches
    /// again (a fresh snapshot) after one line on stderr.
    #[arg(long, help_heading = "Watch")]
    pub watch: bool,
    /// Stop after this many lines (with --watch).
    #[arg(long, help_heading = "Watch", value_name = "N", value_parser = clap::value_parser!(u64).range(1..), requires = "watch")]
    pub count: Option<u64>,
}

fn ns_utc(ns: u64) -> String {
    utc(ns / 1_000_000_000)
}

fn detail(f: &Finding) -> &str {
    f.evidence.as_ref().map_or("", |e| e.detail.as_str())
}

/// Every field of a finding, raw units (ns, counts, a 0..1 confidence).
pub fn finding_json(f: &Finding) -> Value {
    let e = f.evidence.clone().unwrap_or_default();
    json!({
        "id": f.id,
        "kind": f.kind,
        "location": f.location,
        "symptom": f.symptom,
        "severity": f.severity,
        "confidence": f.confidence,
        "open": f.open,
        "opened_unix_ns": f.opened_unix_ns,
        "last_seen_unix_ns": f.last_seen_unix_ns,
        "resolved_unix_ns": f.resolved_unix_ns,
        "evidence": rpingmesh_proto::json::finding_evidence(&e),
        "impact": f.impact.iter().map(impact_json).collect::<Vec<_>>(),
        "suppressed": f.suppressed,
        "suppressed_by": f.suppressed_by,
    })
}

pub fn impact_json(i: &FindingImpact) -> Value {
    let w = i.workload.clone().unwrap_or_default();
    json!({
        "service": i.service,
        "workload": {"kind": w.kind, "name": w.name, "namespace": w.namespace, "id": w.id},
        "paths_affected": i.paths_affected,
        "paths_uncertain": i.paths_uncertain,
        "paths_total": i.paths_total,
        "probe_total": i.probe_total,
        "probe_failed": i.probe_failed,
        "network_rtt_p99_ns": i.network_rtt_p99_ns,
    })
}

/// The workloads a finding hurts, for a table cell: `JOB (affected/total paths[, N?])`,
/// the first three, then how many more ("-": none).
pub fn impact_cell(f: &Finding) -> String {
    if f.impact.is_empty() {
        return "-".into();
    }
    let mut parts: Vec<String> = f
        .impact
        .iter()
        .take(3)
        .map(|i| {
            let maybe = if i.paths_uncertain > 0 {
                format!(", {}?", i.paths_uncertain)
            } else {
                String::new()
            };
            format!(
                "{} ({}/{}{maybe})",
                i.service, i.paths_affected, i.paths_total
            )
        })
        .collect();
    if f.impact.len() > 3 {
        parts.push(format!("+{} more", f.impact.len() - 3));
    }
    parts.join(", ")
}

/// The table: open findings first, as the controller orders them.
pub fn table(findings: &[Finding]) -> String {
    let mut t = Table::new(&[
        ("ID", true),
        ("KIND", false),
        ("LOCATION", false),
        ("SYMPTOM", false),
        ("SEVERITY", false),
        ("CONF", true),
        ("OPENED", false),
        ("LAST_SEEN", false),
        ("RESOLVED", false),
        ("IMPACT", false),
        ("DETAIL", false),
    ]);
    for f in findings {
        t.row(vec![
            f.id.to_string(),
            f.kind.clone(),
            or_dash(&f.location),
            or_dash(&f.symptom),
            or_dash(&f.severity),
            format!("{:.2}", f.confidence),
            ns_utc(f.opened_unix_ns),
            ns_utc(f.last_seen_unix_ns),
            if f.open {
                "-".into()
            } else {
                ns_utc(f.resolved_unix_ns)
            },
            impact_cell(f),
            match f.suppressed.as_str() {
                "" => or_dash(detail(f)),
                why => format!("[{why}, action {}] {}", f.suppressed_by, detail(f)),
            },
        ]);
    }
    t.render()
}

/// One `--watch` line: the change, then `key=value` fields (the detail JSON-quoted), so a
/// script can split it on spaces outside quotes.
pub fn event_line(e: &FindingEvent) -> String {
    let f = e.finding.clone().unwrap_or_default();
    format!(
        "{} id={} kind={} location={} symptom={} severity={} confidence={:.2} opened={} last_seen={} resolved={} detail={}",
        e.change,
        f.id,
        or_dash(&f.kind),
        or_dash(&f.location),
        or_dash(&f.symptom),
        or_dash(&f.severity),
        f.confidence,
        ns_utc(f.opened_unix_ns),
        ns_utc(f.last_seen_unix_ns),
        if f.open { "-".into() } else { ns_utc(f.resolved_unix_ns) },
        Value::from(detail(&f)),
    )
}

pub fn event_json(e: &FindingEvent) -> Value {
    json!({
        "change": e.change,
        "finding": e.finding.as_ref().map(finding_json),
    })
}

/// One ListFindings, rendered.
pub async fn list(c: &mut Call<'_>, a: &FindingsArgs) -> Result<String, Failure> {
    let findings = c
        .target
        .answer(
            "findings",
            c.op.list_findings(ListFindingsRequest {
                resolved_limit: a.resolved_limit,
                kind: a.kind.clone().unwrap_or_default(),
            })
            .await,
        )?
        .findings;
    Ok(if c.json {
        findings
            .iter()
            .map(|f| format!("{}\n", finding_json(f)))
            .collect()
    } else {
        table(&findings)
    })
}

/// Follows WatchFindings until Ctrl-C, `--count` lines, or a failure: a status from the
/// controller is exit 1, the controller going away (or shutting down) exit 3. DATA_LOSS
/// (this watcher fell behind) is one line on stderr and a new watch.
pub async fn watch(c: &mut Call<'_>, a: &FindingsArgs) -> Result<(), Failure> {
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let req = WatchFindingsRequest {
        kind: a.kind.clone().unwrap_or_default(),
    };
    let mut printed: u64 = 0;
    loop {
        let call = tokio::select! {
            r = c.op.watch_findings(req.clone()) => r,
            _ = &mut ctrl_c => return Ok(()),
        };
        let mut stream = call
            .map_err(|s| c.target.rpc_failure("findings --watch", s))?
            .into_inner();
        loop {
            let next = tokio::select! {
                m = stream.message() => m,
                _ = &mut ctrl_c => return Ok(()),
            };
            match next {
                Ok(Some(e)) => {
                    let line = if c.json {
                        event_json(&e).to_string()
                    } else {
                        event_line(&e)
                    };
                    let mut out = std::io::stdout().lock();
                    let _ = writeln!(out, "{line}");
                    let _ = out.flush();
                    printed += 1;
                    if a.count.is_some_and(|c| printed >= c) {
                        return Ok(());
                    }
                }
                Ok(None) => {
                    return Err(Failure::Unreachable(format!(
                        "cannot reach controller at {}: it ended the findings watch",
                        c.target.controller
                    )))
                }
                Err(s) if s.code() == tonic::Code::DataLoss => {
                    eprintln!(
                        "rpingmeshctl: {}; watching again",
                        s.message().replace('\n', " ")
                    );
                    break;
                }
                Err(s) => return Err(c.target.rpc_failure("findings --watch", s)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rpingmesh_proto::operator::FindingEvidence;

    fn finding(open: bool) -> Finding {
        Finding {
            id: 7,
            kind: "rnic".into(),
            location: "host-1/mlx5_0".into(),
            symptom: "down".into(),
            severity: "down".into(),
            confidence: 0.875,
            opened_unix_ns: 1_700_000_000_000_000_000,
            last_seen_unix_ns: 1_700_000_060_000_000_000,
            resolved_unix_ns: if open { 0 } else { 1_700_000_120_000_000_000 },
            open,
            evidence: Some(FindingEvidence {
                windows: 2,
                detail: "all 12 paths to and from it fail".into(),
                ..Default::default()
            }),
            impact: Vec::new(),
            suppressed: String::new(),
            suppressed_by: 0,
        }
    }

    #[test]
    fn table_columns_and_open_resolved() {
        let t = table(&[finding(true), finding(false)]);
        let rows: Vec<Vec<&str>> = t.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(
            rows[0],
            [
                "ID",
                "KIND",
                "LOCATION",
                "SYMPTOM",
                "SEVERITY",
                "CONF",
                "OPENED",
                "LAST_SEEN",
                "RESOLVED",
                "IMPACT",
                "DETAIL"
            ]
        );
        assert_eq!(
            rows[1][..9],
            [
                "7",
                "rnic",
                "host-1/mlx5_0",
                "down",
                "down",
                "0.88",
                "2023-11-14T22:13:20Z",
                "2023-11-14T22:14:20Z",
                "-"
            ]
        );
        assert_eq!(rows[1][9], "-", "no impact");
        assert_eq!(rows[1][10..].join(" "), "all 12 paths to and from it fail");
        assert_eq!(rows[2][8], "2023-11-14T22:15:20Z");
    }

    #[test]
    fn the_impact_cell_names_the_worst_jobs() {
        let mut f = finding(true);
        let job = |s: &str, a, u, t| FindingImpact {
            service: s.into(),
            paths_affected: a,
            paths_uncertain: u,
            paths_total: t,
            ..Default::default()
        };
        f.impact = vec![
            job("slurm/4242", 2, 0, 3),
            job("k8s/ml/trainer-0", 1, 1, 4),
            job("systemd/x.service", 1, 0, 1),
            job("docker/abc", 0, 2, 2),
        ];
        assert_eq!(
            impact_cell(&f),
            "slurm/4242 (2/3), k8s/ml/trainer-0 (1/4, 1?), systemd/x.service (1/1), +1 more"
        );
        let v = finding_json(&f);
        assert_eq!(v["impact"][1]["paths_uncertain"], 1);
        assert_eq!(v["impact"].as_array().unwrap().len(), 4);
    }

    #[test]
    fn watch_lines_and_json() {
        let e = FindingEvent {
            change: "opened".into(),
            finding: Some(finding(true)),
        };
        assert_eq!(
            event_line(&e),
            "opened id=7 kind=rnic location=host-1/mlx5_0 symptom=down severity=down confidence=0.88 \
             opened=2023-11-14T22:13:20Z last_seen=2023-11-14T22:14:20Z resolved=- \
             detail=\"all 12 paths to and from it fail\""
        );
        let v = event_json(&e);
        assert_eq!(v["change"], "opened");
        assert_eq!(v["finding"]["id"], 7);
        assert_eq!(v["finding"]["evidence"]["windows"], 2);
        assert_eq!(v["finding"]["open"], true);
    }
}
