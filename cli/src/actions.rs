//! `rpingmeshctl drain | silence | end-action | actions`: operators' drains and silences
//! (role operator to take or end one, viewer to list them).

use clap::Args;
use serde_json::json;

use rpingmesh_proto::operator::{
    Action, DrainRequest, EndActionRequest, ListActionsRequest, SilenceRequest,
};

use crate::connect::{Call, Failure};
use crate::format::{or_dash, utc, Table};

#[derive(Debug, Clone, Args)]
pub struct DrainArgs {
    /// The RNIC to drain, by GID.
    #[arg(long, conflicts_with = "host", required_unless_present = "host")]
    pub rnic: Option<String>,
    /// The host to drain (every RNIC registered on it).
    #[arg(long)]
    pub host: Option<String>,
    /// How long (0: until `rpingmeshctl end-action ID`).
    #[arg(long, default_value_t = 0)]
    pub duration_sec: u32,
    /// Why, for the audit log and the page.
    #[arg(long, default_value = "")]
    pub reason: String,
}

#[derive(Debug, Clone, Args)]
pub struct SilenceArgs {
    /// The finding to silence, by id.
    #[arg(long, conflicts_with_all = ["kind", "location"], required_unless_present = "kind")]
    pub finding: Option<u64>,
    /// Or a component's findings: its kind (rnic, host, tor, link)...
    #[arg(long, requires = "location")]
    pub kind: Option<String>,
    /// ...and its location as findings name it (`<host>/<device>`, `<tor>-<spine>`...).
    #[arg(long)]
    pub location: Option<String>,
    /// How long (required: silences end; a week at most).
    #[arg(long)]
    pub duration_sec: u32,
    #[arg(long, default_value = "")]
    pub reason: String,
}

fn action_json(a: &Action) -> serde_json::Value {
    json!({
        "id": a.id, "kind": a.kind, "target_kind": a.target_kind, "target": a.target,
        "reason": a.reason, "by": a.by, "created_unix_ns": a.created_unix_ns,
        "expires_unix_ns": a.expires_unix_ns,
    })
}

fn until(a: &Action) -> String {
    if a.expires_unix_ns == 0 {
        "until ended".into()
    } else {
        format!("until {}", utc(a.expires_unix_ns / 1_000_000_000))
    }
}

fn one(a: &Action, json: bool) -> String {
    if json {
        format!("{}\n", action_json(a))
    } else {
        format!(
            "{} {} {} {} ({}, id {}){}\n",
            a.kind,
            a.target_kind,
            a.target,
            until(a),
            a.by,
            a.id,
            if a.reason.is_empty() {
                String::new()
            } else {
                format!(": {}", a.reason)
            }
        )
    }
}

pub async fn drain(c: &mut Call<'_>, a: &DrainArgs) -> Result<String, Failure> {
    let r = c.target.answer(
        "drain",
        c.op.drain(DrainRequest {
            rnic_gid: a.rnic.clone().unwrap_or_default(),
            host: a.host.clone().unwrap_or_default(),
            duration_sec: a.duration_sec,
            reason: a.reason.clone(),
        })
        .await,
    )?;
    Ok(one(&r, c.json))
}

pub async fn silence(c: &mut Call<'_>, a: &SilenceArgs) -> Result<String, Failure> {
    let r = c.target.answer(
        "silence",
        c.op.silence(SilenceRequest {
            finding_id: a.finding.unwrap_or(0),
            component_kind: a.kind.clone().unwrap_or_default(),
            location: a.location.clone().unwrap_or_default(),
            duration_sec: a.duration_sec,
            reason: a.reason.clone(),
        })
        .await,
    )?;
    Ok(one(&r, c.json))
}

pub async fn end(c: &mut Call<'_>, id: u64) -> Result<String, Failure> {
    let r = c
        .target
        .answer("end-action", c.op.end_action(EndActionRequest { id }).await)?;
    Ok(if c.json {
        one(&r, true)
    } else {
        format!("ended {}", one(&r, false))
    })
}

pub async fn list(c: &mut Call<'_>) -> Result<String, Failure> {
    let actions = c
        .target
        .answer("actions", c.op.list_actions(ListActionsRequest {}).await)?
        .actions;
    if c.json {
        return Ok(actions
            .iter()
            .map(|a| format!("{}\n", action_json(a)))
            .collect());
    }
    let mut t = Table::new(&[
        ("ID", true),
        ("KIND", false),
        ("TARGET", false),
        ("BY", false),
        ("SINCE", false),
        ("UNTIL", false),
        ("REASON", false),
    ]);
    for a in &actions {
        t.row(vec![
            a.id.to_string(),
            a.kind.clone(),
            format!("{} {}", a.target_kind, a.target),
            or_dash(&a.by),
            utc(a.created_unix_ns / 1_000_000_000),
            if a.expires_unix_ns == 0 {
                "-".into()
            } else {
                utc(a.expires_unix_ns / 1_000_000_000)
            },
            or_dash(&a.reason),
        ]);
    }
    Ok(t.render())
}
