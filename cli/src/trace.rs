//! `rpingmeshctl trace SRC DST`: an ECMP trace on demand (role operator). The agent that
//! owns SRC probes DST across a range of flow labels now; the command waits for the
//! results and prints one row per label, with the spine the topology sends it over, then
//! the labels that lost probes: the check for a single bad ECMP path.

use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;

use rpingmesh_proto::operator::{GetTraceRequest, StartTraceRequest, Trace};

use crate::connect::{Call, Failure};
use crate::format::{loss_pct, or_dash, us, Table};

#[derive(Debug, Clone, Args)]
pub struct TraceArgs {
    /// The source RNIC's GID (its agent probes).
    pub source: String,
    /// The target RNIC's GID.
    pub target: String,
    /// The first flow label (0x... or decimal).
    #[arg(long, default_value = "0", value_parser = parse_label)]
    pub first_label: u32,
    /// How many labels from it (the controller allows 256).
    #[arg(long, default_value_t = 64)]
    pub labels: u32,
    /// Wait this long for the results (the trace runs a few of the agents' windows).
    #[arg(long, default_value_t = 120)]
    pub wait_sec: u64,
}

fn parse_label(s: &str) -> Result<u32, String> {
    let r = match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("not a flow label: {s:?} ({e})"))
}

fn render(t: &Trace, json: bool) -> String {
    if json {
        return format!(
            "{}\n",
            json!({
                "id": t.id, "state": t.state, "source_gid": t.source_gid,
                "target_gid": t.target_gid, "by": t.by,
                "labels": t.labels.iter().map(|l| json!({
                    "flow_label": l.flow_label, "probe_total": l.probe_total,
                    "probe_failed": l.probe_failed, "network_rtt_p50_ns": l.network_rtt_p50_ns,
                    "network_rtt_max_ns": l.network_rtt_max_ns, "spine": l.spine, "links": l.links,
                })).collect::<Vec<_>>(),
            })
        );
    }
    let mut t2 = Table::new(&[
        ("LABEL", false),
        ("PROBES", true),
        ("LOSS%", true),
        ("RTT_P50_US", true),
        ("RTT_MAX_US", true),
        ("SPINE", false),
        ("LINKS", false),
    ]);
    for l in &t.labels {
        t2.row(vec![
            format!("{:#07x}", l.flow_label),
            l.probe_total.to_string(),
            loss_pct(l.probe_failed as u64, l.probe_total as u64),
            us(l.network_rtt_p50_ns),
            us(l.network_rtt_max_ns),
            or_dash(&l.spine),
            if l.links.is_empty() {
                "-".into()
            } else {
                l.links.join(", ")
            },
        ]);
    }
    let lossy: Vec<String> = t
        .labels
        .iter()
        .filter(|l| l.probe_failed > 0)
        .map(|l| {
            format!(
                "{:#07x} ({}% loss{})",
                l.flow_label,
                loss_pct(l.probe_failed as u64, l.probe_total as u64),
                if l.spine.is_empty() {
                    String::new()
                } else {
                    format!(" via {}", l.spine)
                }
            )
        })
        .collect();
    format!(
        "trace {} {} -> {}: {}\n{}labels with loss: {}\n",
        t.id,
        t.source_gid,
        t.target_gid,
        t.state,
        t2.render(),
        if lossy.is_empty() {
            "none".into()
        } else {
            lossy.join(", ")
        }
    )
}

pub async fn trace(c: &mut Call<'_>, a: &TraceArgs) -> Result<String, Failure> {
    let started = c.target.answer(
        "trace",
        c.op.start_trace(StartTraceRequest {
            source_gid: a.source.clone(),
            target_gid: a.target.clone(),
            first_label: a.first_label,
            labels: a.labels,
        })
        .await,
    )?;
    eprintln!(
        "rpingmeshctl: trace {} started: {} labels, waiting for the agent's windows",
        started.id,
        started.labels.len()
    );
    let deadline = Instant::now() + Duration::from_secs(a.wait_sec);
    loop {
        let t = c.target.answer(
            "trace",
            c.op.get_trace(GetTraceRequest { id: started.id }).await,
        )?;
        if t.state != "probing" || Instant::now() >= deadline {
            return Ok(render(&t, c.json));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rpingmesh_proto::operator::TraceLabel;

    #[test]
    fn the_lossy_labels_are_named() {
        let t = Trace {
            id: 3,
            source_gid: "a".into(),
            target_gid: "b".into(),
            state: "done".into(),
            labels: vec![
                TraceLabel {
                    flow_label: 0x100,
                    probe_total: 10,
                    ..Default::default()
                },
                TraceLabel {
                    flow_label: 0x101,
                    probe_total: 10,
                    probe_failed: 10,
                    spine: "s2".into(),
                    links: vec!["t1-s2 up".into(), "t2-s2 down".into()],
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let out = render(&t, false);
        assert!(out.starts_with("trace 3 a -> b: done\n"), "{out}");
        assert!(
            out.ends_with("labels with loss: 0x00101 (100.00% loss via s2)\n"),
            "{out}"
        );
        assert_eq!(parse_label("0x1f"), Ok(31));
        assert!(parse_label("zz").is_err());
    }
}
