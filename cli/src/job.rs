//! `rpingmeshctl job NAME`: one workload (a Slurm job, a Kubernetes pod, a container, a
//! unit; by its key, e.g. `slurm/4242`, or its name, id or pod name): its live service
//! paths with their health, then the findings whose impact lists it.

use serde_json::json;

use rpingmesh_proto::operator::{ListFindingsRequest, ListServicePathsRequest, ServicePath};

use crate::connect::{Call, Failure};
use crate::findings::{finding_json, impact_cell};
use crate::format::{utc, Table};

/// Whether service path `p` belongs to the workload called `name`.
pub fn is_of(p: &ServicePath, name: &str) -> bool {
    p.service == name
        || p.workload.as_ref().is_some_and(|w| {
            w.key == name || (!w.name.is_empty() && w.name == name) || w.id == name
        })
}

pub async fn job(c: &mut Call<'_>, name: &str) -> Result<String, Failure> {
    let paths: Vec<ServicePath> = c
        .target
        .answer(
            "job",
            c.op.list_service_paths(ListServicePathsRequest::default())
                .await,
        )?
        .paths
        .into_iter()
        .filter(|p| is_of(p, name))
        .collect();
    let services: std::collections::BTreeSet<String> =
        paths.iter().map(|p| p.service.clone()).collect();
    // Findings keep their impact once resolved: a job that is gone still shows them.
    let findings: Vec<_> = c
        .target
        .answer(
            "job",
            c.op.list_findings(ListFindingsRequest {
                resolved_limit: 50,
                kind: String::new(),
            })
            .await,
        )?
        .findings
        .into_iter()
        .filter(|f| {
            f.impact.iter().any(|i| {
                services.contains(&i.service)
                    || i.service == name
                    || i.workload
                        .as_ref()
                        .is_some_and(|w| w.name == name || w.id == name)
            })
        })
        .collect();
    if paths.is_empty() && findings.is_empty() {
        return Err(Failure::Rpc(format!(
            "job {name:?}: no live service path and no finding names it"
        )));
    }
    if c.json {
        return Ok(format!(
            "{}\n",
            json!({
                "job": name,
                "services": services,
                "paths": crate::service_paths::render(&paths, true)
                    .lines()
                    .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                    .collect::<Vec<_>>(),
                "findings": findings.iter().map(finding_json).collect::<Vec<_>>(),
            })
        ));
    }
    let mut out = String::new();
    if let Some(w) = paths.iter().find_map(|p| p.workload.as_ref()) {
        out.push_str(&format!(
            "{} ({}{}{})\n",
            w.key,
            w.kind,
            if w.name.is_empty() {
                String::new()
            } else {
                format!(", {}", w.name)
            },
            if w.namespace.is_empty() {
                String::new()
            } else {
                format!(", namespace {}", w.namespace)
            },
        ));
    }
    out.push_str(&format!("\n{} live service paths\n", paths.len()));
    if !paths.is_empty() {
        out.push_str(&crate::service_paths::render(&paths, false));
    }
    out.push_str(&format!("\n{} findings touch it\n", findings.len()));
    if !findings.is_empty() {
        let mut t = Table::new(&[
            ("ID", true),
            ("KIND", false),
            ("LOCATION", false),
            ("SEVERITY", false),
            ("OPEN", false),
            ("OPENED", false),
            ("IMPACT", false),
        ]);
        for f in &findings {
            t.row(vec![
                f.id.to_string(),
                f.kind.clone(),
                f.location.clone(),
                f.severity.clone(),
                if f.open { "yes" } else { "no" }.into(),
                utc(f.opened_unix_ns / 1_000_000_000),
                impact_cell(f),
            ]);
        }
        out.push_str(&t.render());
    }
    Ok(out)
}
