//! `rpingmeshctl host NAME` and `rpingmeshctl hosts`: the Hostping reports agents sent
//! (intra-host diagnosis). `host` prints the host's tree with each link's state, as the
//! agent rendered it, then its findings; `hosts` one row per host.

use serde_json::{json, Value};

use rpingmesh_proto::operator::{GetHostRequest, HostHealth, ListHostsRequest};

use crate::connect::{Call, Failure};
use crate::format::{or_dash, utc, Table};

fn host_json(h: &HostHealth, with_report: bool) -> Value {
    let mut v = json!({
        "hostname": h.hostname,
        "agent_id": h.agent_id,
        "checked_unix_ns": h.checked_unix_ns,
        "received_unix_ns": h.received_unix_ns,
        "mode": h.mode,
        "findings": h.findings.iter().map(|f| json!({"kind": f.kind, "location": f.location, "detail": f.detail})).collect::<Vec<_>>(),
    });
    if with_report {
        v["tree"] = json!(h.tree);
        // The agent's whole report, as JSON (an unreadable one is passed on as text).
        v["report"] =
            serde_json::from_str(&h.report_json).unwrap_or(Value::String(h.report_json.clone()));
    }
    v
}

/// One host: its tree and verdict as the agent printed them, and when.
pub async fn host(c: &mut Call<'_>, name: &str) -> Result<String, Failure> {
    let h = c.target.answer(
        "host",
        c.op.get_host(GetHostRequest {
            hostname: name.to_string(),
        })
        .await,
    )?;
    if c.json {
        return Ok(format!("{}\n", host_json(&h, true)));
    }
    Ok(format!(
        "checked {} by agent {} (received {}), mode {}\n{}",
        utc(h.checked_unix_ns / 1_000_000_000),
        or_dash(&h.agent_id),
        utc(h.received_unix_ns / 1_000_000_000),
        or_dash(&h.mode),
        h.tree
    ))
}

/// Every host that reported, one row each.
pub async fn hosts(c: &mut Call<'_>, problems_only: bool) -> Result<String, Failure> {
    let hosts = c
        .target
        .answer(
            "hosts",
            c.op.list_hosts(ListHostsRequest { problems_only }).await,
        )?
        .hosts;
    if c.json {
        return Ok(hosts
            .iter()
            .map(|h| format!("{}\n", host_json(h, false)))
            .collect());
    }
    let mut t = Table::new(&[
        ("HOST", false),
        ("CHECKED", false),
        ("MODE", false),
        ("FINDINGS", true),
        ("FIRST", false),
    ]);
    for h in &hosts {
        t.row(vec![
            h.hostname.clone(),
            utc(h.checked_unix_ns / 1_000_000_000),
            or_dash(&h.mode),
            h.findings.len().to_string(),
            or_dash(h.findings.first().map_or("", |f| f.detail.as_str())),
        ]);
    }
    Ok(t.render())
}
