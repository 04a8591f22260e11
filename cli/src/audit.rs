//! `rpingmeshctl audit`: the controller's audit trail, newest first (registrations that
//! changed the registry, operator actions, refused calls; with etcd, every replica's).

use serde_json::json;

use rpingmesh_proto::operator::ListAuditRequest;

use crate::connect::{Call, Failure};
use crate::format::{or_dash, Table};

/// UTC to the millisecond (one second holds many audit lines).
fn utc_ms(ns: u64) -> String {
    if ns == 0 {
        return "-".into();
    }
    let secs = crate::format::utc(ns / 1_000_000_000);
    format!(
        "{}.{:03}Z",
        secs.trim_end_matches('Z'),
        (ns / 1_000_000) % 1000
    )
}

pub async fn audit(c: &mut Call<'_>, limit: u32) -> Result<String, Failure> {
    let entries = c
        .target
        .answer("audit", c.op.list_audit(ListAuditRequest { limit }).await)?
        .entries;
    if c.json {
        return Ok(entries
            .iter()
            .map(|e| {
                format!(
                    "{}\n",
                    json!({
                        "time_unix_ns": e.time_unix_ns, "who": e.who, "role": e.role,
                        "rpc": e.rpc, "target": e.target, "result": e.result,
                    })
                )
            })
            .collect());
    }
    let mut t = Table::new(&[
        ("TIME", false),
        ("WHO", false),
        ("ROLE", false),
        ("RPC", false),
        ("TARGET", false),
        ("RESULT", false),
    ]);
    for e in &entries {
        t.row(vec![
            utc_ms(e.time_unix_ns),
            e.who.clone(),
            or_dash(&e.role),
            or_dash(&e.rpc),
            or_dash(&e.target),
            e.result.clone(),
        ]);
    }
    Ok(t.render())
}
