//! Operator messages as JSON objects with the proto's field names, for the tools that
//! print them (`rpingmeshctl --json`, the simulator's findings).

use serde_json::{json, Value};

use crate::operator::FindingEvidence;

/// A finding's evidence, its worst paths included.
pub fn finding_evidence(e: &FindingEvidence) -> Value {
    let paths: Vec<Value> = e
        .paths
        .iter()
        .map(|p| {
            json!({
                "source_gid": p.source_gid,
                "target_gid": p.target_gid,
                "probe_total": p.probe_total,
                "probe_failed": p.probe_failed,
                "network_rtt_p50_ns": p.network_rtt_p50_ns,
            })
        })
        .collect();
    json!({
        "windows": e.windows,
        "paths": paths,
        "paths_total": e.paths_total,
        "probe_total": e.probe_total,
        "probe_failed": e.probe_failed,
        "flow_labels": e.flow_labels,
        "direction": e.direction,
        "excess_ns": e.excess_ns,
        "loss_ratio": e.loss_ratio,
        "loss_ratio_stderr": e.loss_ratio_stderr,
        "score": e.score,
        "detail": e.detail,
    })
}
