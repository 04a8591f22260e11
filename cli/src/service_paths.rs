//! `rpingmeshctl service-paths`: the live service paths, one row each, under the workload
//! (job, pod, container, unit) their QPs belong to.

use serde_json::json;

use rpingmesh_proto::operator::{ListServicePathsRequest, ServicePath};

use crate::connect::{Call, Failure};
use crate::format::{loss_pct, or_dash, summary_json, us, Table};

fn workload_json(p: &ServicePath) -> serde_json::Value {
    match &p.workload {
        Some(w) => json!({
            "kind": w.kind, "key": w.key, "name": w.name, "namespace": w.namespace,
            "id": w.id, "part": w.part, "cgroup_path": w.cgroup_path,
        }),
        None => serde_json::Value::Null,
    }
}

/// The workload's kind and human name, for a table ("-" when the agent sent none).
pub fn workload_cells(p: &ServicePath) -> (String, String) {
    match &p.workload {
        Some(w) => (or_dash(&w.kind), or_dash(&w.name)),
        None => ("-".into(), "-".into()),
    }
}

pub fn render(paths: &[ServicePath], json: bool) -> String {
    if json {
        return paths
            .iter()
            .map(|p| {
                let row = json!({
                    "service": p.service,
                    "workload": workload_json(p),
                    "source_gid": p.source_gid, "source_tor_id": p.source_tor_id,
                    "source_agent_id": p.source_agent_id,
                    "target_gid": p.target_gid, "target_tor_id": p.target_tor_id,
                    "monitored": p.monitored, "flow_label": p.flow_label,
                    "service_level": p.service_level, "traffic_class": p.traffic_class,
                    "flows": p.flows,
                    "qps": p.qps.iter().map(|q| json!({
                        "local_qpn": q.local_qpn, "remote_qpn": q.remote_qpn,
                        "pid": q.pid, "comm": q.comm, "workload_part": q.workload_part,
                        "first_seen_unix_ns": q.first_seen_unix_ns,
                    })).collect::<Vec<_>>(),
                    "latest": p.latest.as_ref().map(summary_json),
                });
                format!("{row}\n")
            })
            .collect();
    }
    let mut t = Table::new(&[
        ("SERVICE", false),
        ("KIND", false),
        ("NAME", false),
        ("SRC_TOR", false),
        ("SRC_GID", false),
        ("DST_TOR", false),
        ("DST_GID", false),
        ("MONITORED", false),
        ("FLOW_LABEL", true),
        ("SL", true),
        ("TC", true),
        ("FLOWS", true),
        ("PROBES", true),
        ("LOSS%", true),
        ("RTT_P50_US", true),
        ("RTT_P99_US", true),
        ("QPS (local->remote pid/comm [part])", false),
    ]);
    for p in paths {
        let qps: Vec<String> = p
            .qps
            .iter()
            .map(|q| {
                let part = if q.workload_part.is_empty() {
                    String::new()
                } else {
                    let short: String = q.workload_part.chars().take(12).collect();
                    format!(" [{short}]")
                };
                format!(
                    "{}->{} {}/{}{part}",
                    q.local_qpn, q.remote_qpn, q.pid, q.comm
                )
            })
            .collect();
        let (probes, loss, p50, p99) = match &p.latest {
            Some(s) => (
                s.probe_total.to_string(),
                loss_pct(s.probe_failed as u64, s.probe_total as u64),
                us(s.network_rtt_p50_ns),
                us(s.network_rtt_p99_ns),
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        let (kind, name) = workload_cells(p);
        t.row(vec![
            p.service.clone(),
            kind,
            name,
            or_dash(&p.source_tor_id),
            p.source_gid.clone(),
            or_dash(&p.target_tor_id),
            p.target_gid.clone(),
            if p.monitored { "yes" } else { "no" }.into(),
            format!("{:#07x}", p.flow_label),
            p.service_level.to_string(),
            p.traffic_class.to_string(),
            p.flows.to_string(),
            probes,
            loss,
            p50,
            p99,
            qps.join(", "),
        ]);
    }
    t.render()
}

pub async fn list(c: &mut Call<'_>, req: ListServicePathsRequest) -> Result<String, Failure> {
    let paths = c
        .target
        .answer("service-paths", c.op.list_service_paths(req).await)?
        .paths;
    Ok(render(&paths, c.json))
}
