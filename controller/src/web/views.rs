//! The JSON the operator page reads (pure: proto records and findings in, JSON out).
//! Field names are the page's contract; times are Unix ns unless named otherwise.

use serde_json::{json, Value};

use rpingmesh_proto::controller_agent::{PathSummary, PinglistType};
use rpingmesh_proto::operator::{RnicStatus, ServicePath, TorPairStats};

use crate::findings::{Finding, WindowEvidence};

/// The SLA the cells are coloured against (the analyzer's thresholds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sla {
    pub loss_ratio: f64,
    /// 0 = no RTT check.
    pub network_rtt_p99_ns: u64,
}

/// A cell's colour: no probes, within the SLA, or which SLA it breaks (loss first).
pub fn status(sla: &Sla, probe_total: u64, loss_ratio: f64, rtt_p99_ns: u64) -> &'static str {
    if probe_total == 0 {
        "idle"
    } else if loss_ratio > sla.loss_ratio {
        "loss"
    } else if sla.network_rtt_p99_ns > 0 && rtt_p99_ns > sla.network_rtt_p99_ns {
        "rtt"
    } else {
        "ok"
    }
}

fn loss(total: u64, failed: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        failed as f64 / total as f64
    }
}

/// The ToR x ToR matrix: every ToR that has RNICs or windows, and one cell per pair with
/// windows. Beyond `max_tors` ToRs (a matrix nobody can read, and megabytes per poll) it
/// keeps the ToRs of the worst cells, so a red cell is never the one left out.
pub fn tor_matrix(
    sla: &Sla,
    registered_tors: &[String],
    pairs: &[TorPairStats],
    max_tors: usize,
) -> Value {
    let mut tors: Vec<&str> = registered_tors.iter().map(String::as_str).collect();
    for p in pairs {
        tors.push(&p.source_tor_id);
        tors.push(&p.target_tor_id);
    }
    tors.sort_unstable();
    tors.dedup();
    let tors_total = tors.len();
    let mut shown: Vec<&TorPairStats> = pairs.iter().collect();
    if tors.len() > max_tors {
        let rank = |p: &TorPairStats| {
            let st = status(sla, p.probe_total, p.loss_ratio, p.network_rtt_p99_ns);
            let level = match st {
                "loss" => 3,
                "rtt" => 2,
                "ok" => 1,
                _ => 0,
            };
            (level, p.loss_ratio, p.network_rtt_p99_ns)
        };
        let mut worst = shown.clone();
        worst.sort_by(|a, b| {
            rank(b)
                .partial_cmp(&rank(a))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        let mut keep: Vec<&str> = Vec::with_capacity(max_tors);
        for p in worst {
            for t in [p.source_tor_id.as_str(), p.target_tor_id.as_str()] {
                if keep.len() < max_tors && !keep.contains(&t) {
                    keep.push(t);
                }
            }
            if keep.len() >= max_tors {
                break;
            }
        }
        keep.sort_unstable();
        tors = keep;
        shown.retain(|p| {
            tors.binary_search(&p.source_tor_id.as_str()).is_ok()
                && tors.binary_search(&p.target_tor_id.as_str()).is_ok()
        });
    }
    let cells: Vec<Value> = shown
        .iter()
        .map(|p| {
            json!({
                "source_tor": p.source_tor_id,
                "target_tor": p.target_tor_id,
                "paths": p.paths,
                "probe_total": p.probe_total,
                "probe_failed": p.probe_failed,
                "loss_ratio": p.loss_ratio,
                "network_rtt_p50_ns": p.network_rtt_p50_ns,
                "network_rtt_p99_ns": p.network_rtt_p99_ns,
                "prober_delay_p50_ns": p.prober_delay_p50_ns,
                "responder_delay_p50_ns": p.responder_delay_p50_ns,
                "status": status(sla, p.probe_total, p.loss_ratio, p.network_rtt_p99_ns),
            })
        })
        .collect();
    json!({ "tors": tors, "tors_total": tors_total, "cells": cells })
}

fn kind_name(t: i32) -> &'static str {
    match PinglistType::try_from(t) {
        Ok(PinglistType::TorMesh) => "tor_mesh",
        Ok(PinglistType::InterTor) => "inter_tor",
        Ok(PinglistType::Service) => "service",
        _ => "unknown",
    }
}

/// One window of one path.
pub fn window(sla: &Sla, s: &PathSummary) -> Value {
    let l = loss(s.probe_total as u64, s.probe_failed as u64);
    json!({
        "source_gid": s.source_gid,
        "target_gid": s.target_gid,
        "source_tor": s.source_tor_id,
        "target_tor": s.target_tor_id,
        "type": kind_name(s.pinglist_type),
        "service": s.service,
        "window_start_unix_ns": s.window_start_unix_ns,
        "window_duration_ms": s.window_duration_ms,
        "probe_total": s.probe_total,
        "probe_failed": s.probe_failed,
        "loss_ratio": l,
        "network_rtt_p50_ns": s.network_rtt_p50_ns,
        "network_rtt_p99_ns": s.network_rtt_p99_ns,
        "prober_delay_p50_ns": s.prober_delay_p50_ns,
        "responder_delay_p50_ns": s.responder_delay_p50_ns,
        "status": status(sla, s.probe_total as u64, l, s.network_rtt_p99_ns),
    })
}

/// The drill-down of one ToR pair: the latest window of each path, worst first.
pub fn pair_paths(sla: &Sla, mut paths: Vec<PathSummary>, limit: usize) -> Value {
    let total = paths.len();
    let badness = |s: &PathSummary| {
        (
            loss(s.probe_total as u64, s.probe_failed as u64),
            s.network_rtt_p99_ns,
        )
    };
    paths.sort_by(|a, b| {
        badness(b)
            .partial_cmp(&badness(a))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    let shown: Vec<Value> = paths.iter().take(limit).map(|s| window(sla, s)).collect();
    json!({ "total": total, "paths": shown })
}

/// Service paths grouped by service (the workload's key: a job, pod, container or unit)
/// with the workload, each path with its QPs, latest window and the retained windows as a
/// sparkline (oldest first).
pub fn service_paths(sla: &Sla, paths: &[(ServicePath, Vec<PathSummary>)]) -> Value {
    type Group<'a> = (
        Option<&'a rpingmesh_proto::controller_agent::Workload>,
        Vec<Value>,
    );
    let mut by_service: std::collections::BTreeMap<&str, Group<'_>> = Default::default();
    for (p, history) in paths {
        let qps: Vec<Value> = p
            .qps
            .iter()
            .map(|q| {
                json!({
                    "local_qpn": q.local_qpn,
                    "remote_qpn": q.remote_qpn,
                    "pid": q.pid,
                    "comm": q.comm,
                    "part": q.workload_part,
                    "first_seen_unix_ns": q.first_seen_unix_ns,
                })
            })
            .collect();
        let spark: Vec<Value> = history
            .iter()
            .map(|s| {
                json!({
                    "t": s.window_start_unix_ns,
                    "network_rtt_p99_ns": s.network_rtt_p99_ns,
                    "loss_ratio": loss(s.probe_total as u64, s.probe_failed as u64),
                })
            })
            .collect();
        let g = by_service.entry(p.service.as_str()).or_default();
        g.0 = g.0.or(p.workload.as_ref());
        g.1.push(json!({
            "source_gid": p.source_gid,
            "source_tor": p.source_tor_id,
            "source_agent": p.source_agent_id,
            "target_gid": p.target_gid,
            "target_tor": p.target_tor_id,
            "flow_label": p.flow_label,
            "traffic_class": p.traffic_class,
            "monitored": p.monitored,
            "flows": p.flows,
            "qps": qps,
            "latest": p.latest.as_ref().map(|s| window(sla, s)),
            "history": spark,
        }));
    }
    let services: Vec<Value> = by_service
        .into_iter()
        .map(|(name, (w, paths))| {
            let workload = w.map(|w| {
                json!({
                    "kind": w.kind, "name": w.name, "namespace": w.namespace, "id": w.id,
                    "cgroup_path": w.cgroup_path,
                })
            });
            json!({ "service": name, "workload": workload, "paths": paths })
        })
        .collect();
    json!({ "services": services })
}

fn evidence(e: &WindowEvidence) -> Value {
    json!({
        "window_start_unix_ns": e.window_start_unix_ns,
        "window_duration_ms": e.window_duration_ms,
        "probe_total": e.probe_total,
        "probe_failed": e.probe_failed,
        "loss_ratio": e.loss_ratio(),
        "network_rtt_p50_ns": e.network_rtt_p50_ns,
        "network_rtt_p99_ns": e.network_rtt_p99_ns,
    })
}

/// One line an operator reads first.
pub fn finding_headline(f: &Finding, sla: &Sla) -> String {
    let what = match f.kind {
        crate::analyzer::ViolationKind::Loss => format!(
            "loss {:.1}% (SLA {:.1}%)",
            100.0 * f.worst.loss_ratio(),
            100.0 * sla.loss_ratio
        ),
        crate::analyzer::ViolationKind::Rtt => format!(
            "network RTT p99 {:.1} us (SLA {:.1} us)",
            f.worst.network_rtt_p99_ns as f64 / 1e3,
            sla.network_rtt_p99_ns as f64 / 1e3
        ),
    };
    let svc = if f.scope.service.is_empty() {
        String::new()
    } else {
        format!(" [{}]", f.scope.service)
    };
    format!(
        "{what} on {} -> {}{svc}, {} window(s)",
        f.scope.source_tor_id, f.scope.target_tor_id, f.violating_windows
    )
}

/// Findings, open ones first; at most `limit` of them in the list (`open` counts all).
pub fn findings(sla: &Sla, list: &[Finding], limit: usize) -> Value {
    let open = list.iter().filter(|f| f.is_open()).count();
    let items: Vec<Value> = list
        .iter()
        .take(limit)
        .map(|f| {
            json!({
                "id": f.id,
                "kind": f.kind.as_str(),
                "status": if f.is_open() { "open" } else { "resolved" },
                "scope": {
                    "level": "path",
                    "source_gid": f.scope.source_gid,
                    "target_gid": f.scope.target_gid,
                    "source_tor": f.scope.source_tor_id,
                    "target_tor": f.scope.target_tor_id,
                    "type": kind_name(f.scope.pinglist_type),
                    "service": f.scope.service,
                },
                "headline": finding_headline(f, sla),
                "opened_unix_ns": f.opened_unix_ns,
                "last_violation_unix_ns": f.last_violation_unix_ns,
                "resolved_unix_ns": f.resolved_unix_ns,
                "resolution": match (f.is_open(), &f.resolved_by) {
                    (true, _) => Value::Null,
                    (false, Some(_)) => "clean window".into(),
                    (false, None) => "no longer measured".into(),
                },
                "violating_windows": f.violating_windows,
                "evidence": {
                    "first": evidence(&f.first),
                    "worst": evidence(&f.worst),
                    "resolved_by": f.resolved_by.as_ref().map(evidence),
                },
            })
        })
        .collect();
    json!({ "open": open, "total": list.len(), "findings": items })
}

/// Localized findings (the broken components), open first; at most `limit` listed.
pub fn localized(list: &[rpingmesh_proto::operator::Finding], limit: usize) -> Value {
    let open = list.iter().filter(|f| f.open).count();
    let items: Vec<Value> = list
        .iter()
        .take(limit)
        .map(|f| {
            let ev = f.evidence.clone().unwrap_or_default();
            json!({
                "id": f.id,
                "kind": f.kind,
                "location": f.location,
                "symptom": f.symptom,
                "confidence": f.confidence,
                "status": if f.open { "open" } else { "resolved" },
                "opened_unix_ns": f.opened_unix_ns,
                "last_seen_unix_ns": f.last_seen_unix_ns,
                "resolved_unix_ns": (!f.open).then_some(f.resolved_unix_ns),
                "windows": ev.windows,
                "detail": ev.detail,
                "direction": ev.direction,
                "flow_labels": ev.flow_labels,
                "paths_total": ev.paths_total,
                "severity": f.severity,
                "suppressed": f.suppressed,
                "impact": f.impact.iter().map(impact).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({ "open": open, "total": list.len(), "findings": items })
}

/// One workload a finding hurts.
fn impact(i: &rpingmesh_proto::operator::FindingImpact) -> Value {
    let w = i.workload.clone().unwrap_or_default();
    json!({
        "service": i.service,
        "kind": w.kind,
        "name": w.name,
        "paths_affected": i.paths_affected,
        "paths_uncertain": i.paths_uncertain,
        "paths_total": i.paths_total,
        "loss_ratio": loss(i.probe_total, i.probe_failed),
        "probe_total": i.probe_total,
        "network_rtt_p99_ns": i.network_rtt_p99_ns,
    })
}

/// One workload's page: its service paths (as in [`service_paths`]) and the localized
/// findings whose impact names it.
pub fn job(
    sla: &Sla,
    service: &str,
    paths: &[(ServicePath, Vec<PathSummary>)],
    findings: &[rpingmesh_proto::operator::Finding],
) -> Value {
    let touching: Vec<rpingmesh_proto::operator::Finding> = findings
        .iter()
        .filter(|f| f.impact.iter().any(|i| i.service == service))
        .cloned()
        .collect();
    let groups = service_paths(sla, paths);
    let group = groups["services"]
        .as_array()
        .and_then(|v| v.iter().find(|g| g["service"] == service).cloned())
        .unwrap_or(Value::Null);
    json!({
        "service": service,
        "workload": group.get("workload").cloned().unwrap_or(Value::Null),
        "paths": group.get("paths").cloned().unwrap_or_else(|| json!([])),
        "findings": localized(&touching, touching.len().max(1))["findings"].clone(),
    })
}

/// An agent as the page lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentRow {
    pub agent_id: String,
    pub hostname: String,
    pub tor_id: String,
    pub version: Option<String>,
    pub last_seen_unix_sec: u64,
    pub rnics: usize,
    pub active: bool,
}

/// RNICs and agents, one page of each (`total` / `agents_total` count them all).
pub fn rnics(
    page: &[RnicStatus],
    total: usize,
    offset: usize,
    agents: &[AgentRow],
    agents_total: usize,
) -> Value {
    let rows: Vec<Value> = page
        .iter()
        .map(|r| {
            let i = r.rnic.clone().unwrap_or_default();
            json!({
                "gid": i.gid,
                "tor_id": i.tor_id,
                "host_name": i.host_name,
                "device_name": i.device_name,
                "ip_address": i.ip_address,
                "qpn": i.qpn,
                "agent_id": r.agent_id,
                "last_seen_unix_sec": r.last_updated_unix_sec,
                "active": r.active,
            })
        })
        .collect();
    let agents: Vec<Value> = agents
        .iter()
        .map(|a| {
            json!({
                "agent_id": a.agent_id,
                "hostname": a.hostname,
                "tor_id": a.tor_id,
                // "" is a Go agent (it does not send a version); None: not since we started.
                "version": match a.version.as_deref() {
                    None => "unknown",
                    Some("") => "go (no version)",
                    Some(v) => v,
                },
                "last_seen_unix_sec": a.last_seen_unix_sec,
                "rnics": a.rnics,
                "active": a.active,
            })
        })
        .collect();
    json!({ "total": total, "offset": offset, "rnics": rows, "agents": agents, "agents_total": agents_total })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyzer::ViolationKind;
    use crate::findings::PathScope;

    const SLA: Sla = Sla {
        loss_ratio: 0.02,
        network_rtt_p99_ns: 500_000,
    };

    #[test]
    fn cells_are_coloured_against_the_sla() {
        assert_eq!(status(&SLA, 0, 0.0, 0), "idle");
        assert_eq!(status(&SLA, 100, 0.02, 10), "ok");
        assert_eq!(status(&SLA, 100, 0.03, 10), "loss");
        assert_eq!(status(&SLA, 100, 0.03, 900_000), "loss");
        assert_eq!(status(&SLA, 100, 0.0, 900_000), "rtt");
        let no_rtt = Sla {
            network_rtt_p99_ns: 0,
            ..SLA
        };
        assert_eq!(status(&no_rtt, 100, 0.0, 900_000), "ok");
    }

    #[test]
    fn matrix_lists_every_tor_once() {
        let p = TorPairStats {
            source_tor_id: "tor-2".into(),
            target_tor_id: "tor-3".into(),
            probe_total: 10,
            probe_failed: 5,
            loss_ratio: 0.5,
            ..Default::default()
        };
        let m = tor_matrix(
            &SLA,
            &["tor-1".into(), "tor-2".into()],
            std::slice::from_ref(&p),
            64,
        );
        assert_eq!(m["tors"], json!(["tor-1", "tor-2", "tor-3"]));
        assert_eq!(m["cells"][0]["status"], "loss");
        // Capped: the ToRs of the worst cell stay.
        let ok = TorPairStats {
            source_tor_id: "tor-1".into(),
            target_tor_id: "tor-1".into(),
            probe_total: 10,
            ..Default::default()
        };
        let m = tor_matrix(&SLA, &[], &[ok, p], 2);
        assert_eq!(m["tors"], json!(["tor-2", "tor-3"]));
        assert_eq!(m["tors_total"], 3);
        assert_eq!(m["cells"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn pair_paths_worst_first_and_limited() {
        let w = |g: &str, failed| PathSummary {
            source_gid: g.into(),
            probe_total: 10,
            probe_failed: failed,
            ..Default::default()
        };
        let v = pair_paths(&SLA, vec![w("a", 0), w("b", 5), w("c", 1)], 2);
        assert_eq!(v["total"], 3);
        assert_eq!(v["paths"].as_array().unwrap().len(), 2);
        assert_eq!(v["paths"][0]["source_gid"], "b");
        assert_eq!(v["paths"][1]["source_gid"], "c");
    }

    #[test]
    fn localized_findings_name_the_component() {
        use rpingmesh_proto::operator::{Finding, FindingEvidence};
        let f = Finding {
            id: 4,
            kind: "link".into(),
            location: "tor2-spine3".into(),
            symptom: "loss".into(),
            confidence: 0.8,
            opened_unix_ns: 10,
            last_seen_unix_ns: 20,
            open: true,
            evidence: Some(FindingEvidence {
                windows: 2,
                flow_labels: vec![7, 9],
                direction: "up".into(),
                detail: "loss 5%".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let resolved = Finding {
            open: false,
            resolved_unix_ns: 30,
            ..f.clone()
        };
        let v = localized(&[f, resolved], 5);
        assert_eq!(
            (v["open"].as_u64(), v["total"].as_u64()),
            (Some(1), Some(2))
        );
        let x = &v["findings"][0];
        assert_eq!(
            (
                x["kind"].as_str(),
                x["location"].as_str(),
                x["status"].as_str()
            ),
            (Some("link"), Some("tor2-spine3"), Some("open"))
        );
        assert_eq!(x["flow_labels"], json!([7, 9]));
        assert!(x["resolved_unix_ns"].is_null());
        assert_eq!(v["findings"][1]["resolved_unix_ns"], 30);
    }

    #[test]
    fn a_jobs_page_has_its_paths_and_only_the_findings_that_hurt_it() {
        use rpingmesh_proto::controller_agent::Workload;
        use rpingmesh_proto::operator::{Finding, FindingImpact};
        let path = |service: &str| ServicePath {
            source_gid: "a".into(),
            target_gid: "b".into(),
            service: service.into(),
            workload: Some(Workload {
                kind: "slurm_job".into(),
                key: service.into(),
                name: "pretrain".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let finding = |id, service: &str| Finding {
            id,
            kind: "rnic".into(),
            location: "h/mlx5_0".into(),
            open: true,
            impact: vec![FindingImpact {
                service: service.into(),
                paths_affected: 1,
                paths_total: 1,
                probe_total: 100,
                probe_failed: 5,
                ..Default::default()
            }],
            ..Default::default()
        };
        let paths = vec![(path("slurm/1"), Vec::new()), (path("slurm/2"), Vec::new())];
        let v = job(
            &SLA,
            "slurm/1",
            &paths,
            &[finding(1, "slurm/1"), finding(2, "slurm/2")],
        );
        assert_eq!(v["workload"]["name"], "pretrain");
        assert_eq!(v["paths"].as_array().unwrap().len(), 1);
        let f = v["findings"].as_array().unwrap();
        assert_eq!(f.len(), 1);
        assert_eq!(f[0]["id"], 1);
        assert_eq!(f[0]["impact"][0]["service"], "slurm/1");
        assert_eq!(f[0]["impact"][0]["loss_ratio"], 0.05);
        let none = job(&SLA, "slurm/9", &paths, &[]);
        assert_eq!(none["paths"], json!([]));
        assert_eq!(none["findings"], json!([]));
    }

    #[test]
    fn findings_carry_status_headline_and_evidence() {
        let ev = WindowEvidence {
            probe_total: 100,
            probe_failed: 25,
            ..Default::default()
        };
        let f = Finding {
            id: 7,
            kind: ViolationKind::Loss,
            scope: PathScope {
                source_gid: "a".into(),
                target_gid: "b".into(),
                source_tor_id: "tor-1".into(),
                target_tor_id: "tor-2".into(),
                pinglist_type: PinglistType::TorMesh as i32,
                service: String::new(),
            },
            opened_unix_ns: 1,
            last_violation_unix_ns: 2,
            resolved_unix_ns: None,
            violating_windows: 2,
            first: ev,
            worst: ev,
            resolved_by: None,
        };
        let v = findings(&SLA, &[f.clone(), f], 1);
        assert_eq!(v["findings"].as_array().unwrap().len(), 1);
        assert_eq!(v["open"], 2);
        assert_eq!(v["findings"][0]["status"], "open");
        assert_eq!(
            v["findings"][0]["headline"],
            "loss 25.0% (SLA 2.0%) on tor-1 -> tor-2, 2 window(s)"
        );
        assert_eq!(v["findings"][0]["evidence"]["worst"]["loss_ratio"], 0.25);
    }

    #[test]
    fn go_agents_show_without_a_version() {
        let a = AgentRow {
            agent_id: "g".into(),
            hostname: "h".into(),
            tor_id: "t".into(),
            version: Some(String::new()),
            last_seen_unix_sec: 1,
            rnics: 1,
            active: true,
        };
        let v = rnics(&[], 0, 0, &[a], 1);
        assert_eq!(v["agents"][0]["version"], "go (no version)");
    }
}
