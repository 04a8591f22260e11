//! rpingmeshctl: reads the controller's operator API (`rpingmesh.operator.v1`).
//!
//! Aligned tables by default (RTT in microseconds, loss in percent), `--json` for one
//! JSON object per row (raw ns and ratios). Any failure is one line on stderr, exit 1.

mod format;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use serde_json::json;
use tonic::transport::{Channel, Endpoint};

use rpingmesh_proto::controller_agent::PathSummary;
use rpingmesh_proto::operator::operator_service_client::OperatorServiceClient;
use rpingmesh_proto::operator::{
    ListPathsRequest, ListRnicsRequest, ListServicePathsRequest, ListTorPairsRequest,
    ListViolationsRequest,
};

use format::{loss_pct, or_dash, summary_json, us, utc, Table};

#[derive(Debug, Parser)]
#[command(
    name = "rpingmeshctl",
    version,
    about = "Query an rpingmesh controller"
)]
struct Cli {
    /// Controller gRPC address (host:port or http://host:port).
    #[arg(
        long,
        global = true,
        env = "RPINGMESH_CONTROLLER_ADDR",
        default_value = "localhost:50051"
    )]
    controller: String,
    /// One JSON object per row instead of a table.
    #[arg(long, global = true)]
    json: bool,
    /// Seconds to wait for the connection and for each call.
    #[arg(long, global = true, default_value_t = 5)]
    timeout_sec: u64,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Registered RNICs and their liveness.
    Rnics {
        /// Only RNICs on this ToR.
        #[arg(long)]
        tor: Option<String>,
    },
    /// Latest analyzer window of every path (ToR mesh, inter-ToR and service probes).
    Paths {
        #[arg(long)]
        source_tor: Option<String>,
        #[arg(long)]
        target_tor: Option<String>,
        /// Paths with this GID at either end.
        #[arg(long)]
        gid: Option<String>,
        /// Every retained window, not only the latest.
        #[arg(long)]
        all_windows: bool,
    },
    /// Per (source ToR, target ToR) aggregate of the latest windows.
    TorPairs,
    /// Recent SLA violations, newest first.
    Violations {
        /// At most this many (0 = all retained).
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Live service paths learned from QP tracing, with their latest RTT and loss.
    ServicePaths {
        #[arg(long)]
        service: Option<String>,
        /// Paths with this GID at either end.
        #[arg(long)]
        gid: Option<String>,
        /// SRC,DST ToR ids; either side may be empty ("tor-1," = from tor-1).
        #[arg(long, value_parser = parse_tor_pair)]
        tor_pair: Option<(String, String)>,
    },
}

fn parse_tor_pair(s: &str) -> Result<(String, String), String> {
    let bad = || format!("expected SRC,DST (e.g. tor-1,tor-2), got {s:?}");
    let (a, b) = s.split_once(',').ok_or_else(bad)?;
    let (a, b) = (a.trim(), b.trim());
    if b.contains(',') || (a.is_empty() && b.is_empty()) {
        return Err(bad());
    }
    Ok((a.to_string(), b.to_string()))
}

fn endpoint_url(addr: &str) -> String {
    if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    }
}

/// An error with its causes on one line ("transport error: ...: Connection refused").
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s.replace('\n', " ")
}

async fn connect(cli: &Cli) -> Result<OperatorServiceClient<Channel>, String> {
    let url = endpoint_url(&cli.controller);
    let t = Duration::from_secs(cli.timeout_sec.max(1));
    let ep = Endpoint::from_shared(url)
        .map_err(|e| {
            format!(
                "bad --controller address {:?}: {}",
                cli.controller,
                chain(&e)
            )
        })?
        .connect_timeout(t)
        .timeout(t);
    let ch = ep.connect().await.map_err(|e| {
        format!(
            "cannot reach controller at {}: {}",
            cli.controller,
            chain(&e)
        )
    })?;
    Ok(OperatorServiceClient::new(ch))
}

fn rpc_err(what: &str, addr: &str, s: tonic::Status) -> String {
    let msg = s.message().replace('\n', " ");
    match s.code() {
        tonic::Code::Unavailable => format!("cannot reach controller at {addr}: {msg}"),
        tonic::Code::Unimplemented => {
            format!("{what}: the controller at {addr} does not support this call ({msg})")
        }
        c => format!("{what}: {c:?}: {msg}"),
    }
}

fn print_json_rows(rows: impl IntoIterator<Item = serde_json::Value>) {
    for r in rows {
        println!("{r}");
    }
}

fn gid_arg(g: &Option<String>) -> String {
    g.clone().unwrap_or_default()
}

async fn run(cli: Cli) -> Result<(), String> {
    let mut op = connect(&cli).await?;
    let addr = cli.controller.as_str();
    match &cli.cmd {
        Cmd::Rnics { tor } => {
            let rnics = op
                .list_rnics(ListRnicsRequest {
                    tor_id: tor.clone().unwrap_or_default(),
                })
                .await
                .map_err(|s| rpc_err("rnics", addr, s))?
                .into_inner()
                .rnics;
            if cli.json {
                print_json_rows(rnics.iter().map(|r| {
                    let i = r.rnic.clone().unwrap_or_default();
                    json!({
                        "gid": i.gid, "qpn": i.qpn, "ip_address": i.ip_address,
                        "host_name": i.host_name, "tor_id": i.tor_id,
                        "device_name": i.device_name, "agent_id": r.agent_id,
                        "last_updated_unix_sec": r.last_updated_unix_sec, "active": r.active,
                    })
                }));
            } else {
                let mut t = Table::new(&[
                    ("TOR", false),
                    ("GID", false),
                    ("QPN", true),
                    ("IP", false),
                    ("HOST", false),
                    ("DEVICE", false),
                    ("AGENT", false),
                    ("ACTIVE", false),
                    ("LAST_UPDATED", false),
                ]);
                for r in &rnics {
                    let i = r.rnic.clone().unwrap_or_default();
                    t.row(vec![
                        i.tor_id,
                        i.gid,
                        i.qpn.to_string(),
                        or_dash(&i.ip_address),
                        or_dash(&i.host_name),
                        or_dash(&i.device_name),
                        r.agent_id.clone(),
                        yes_no(r.active),
                        utc(r.last_updated_unix_sec),
                    ]);
                }
                print!("{}", t.render());
            }
        }
        Cmd::Paths {
            source_tor,
            target_tor,
            gid,
            all_windows,
        } => {
            let base = ListPathsRequest {
                source_tor_id: source_tor.clone().unwrap_or_default(),
                target_tor_id: target_tor.clone().unwrap_or_default(),
                all_windows: *all_windows,
                ..Default::default()
            };
            // The API filters one end at a time; "either end" is the union of both.
            let reqs = match gid {
                None => vec![base],
                Some(g) => vec![
                    ListPathsRequest {
                        source_gid: g.clone(),
                        ..base.clone()
                    },
                    ListPathsRequest {
                        target_gid: g.clone(),
                        ..base
                    },
                ],
            };
            let mut paths: Vec<PathSummary> = Vec::new();
            for r in reqs {
                paths.extend(
                    op.list_paths(r)
                        .await
                        .map_err(|s| rpc_err("paths", addr, s))?
                        .into_inner()
                        .paths,
                );
            }
            if cli.json {
                print_json_rows(paths.iter().map(summary_json));
            } else {
                let mut t = Table::new(&[
                    ("SRC_TOR", false),
                    ("SRC_GID", false),
                    ("DST_TOR", false),
                    ("DST_GID", false),
                    ("TYPE", false),
                    ("SERVICE", false),
                    ("WINDOW_START", false),
                    ("PROBES", true),
                    ("LOSS%", true),
                    ("RTT_P50_US", true),
                    ("RTT_P99_US", true),
                    ("PROBER_P50_US", true),
                    ("RESP_P50_US", true),
                ]);
                for s in &paths {
                    t.row(vec![
                        s.source_tor_id.clone(),
                        s.source_gid.clone(),
                        s.target_tor_id.clone(),
                        s.target_gid.clone(),
                        format::pinglist_type_name(s.pinglist_type).into(),
                        or_dash(&s.service),
                        utc(s.window_start_unix_ns / 1_000_000_000),
                        s.probe_total.to_string(),
                        loss_pct(s.probe_failed as u64, s.probe_total as u64),
                        us(s.network_rtt_p50_ns),
                        us(s.network_rtt_p99_ns),
                        us(s.prober_delay_p50_ns),
                        us(s.responder_delay_p50_ns),
                    ]);
                }
                print!("{}", t.render());
            }
        }
        Cmd::TorPairs => {
            let pairs = op
                .list_tor_pairs(ListTorPairsRequest {})
                .await
                .map_err(|s| rpc_err("tor-pairs", addr, s))?
                .into_inner()
                .pairs;
            if cli.json {
                print_json_rows(pairs.iter().map(|p| {
                    json!({
                        "source_tor_id": p.source_tor_id, "target_tor_id": p.target_tor_id,
                        "paths": p.paths, "probe_total": p.probe_total,
                        "probe_success": p.probe_success, "probe_failed": p.probe_failed,
                        "loss_ratio": p.loss_ratio,
                        "network_rtt_p50_ns": p.network_rtt_p50_ns,
                        "network_rtt_p99_ns": p.network_rtt_p99_ns,
                        "prober_delay_p50_ns": p.prober_delay_p50_ns,
                        "responder_delay_p50_ns": p.responder_delay_p50_ns,
                        "invalid_rtt_count": p.invalid_rtt_count,
                    })
                }));
            } else {
                let mut t = Table::new(&[
                    ("SRC_TOR", false),
                    ("DST_TOR", false),
                    ("PATHS", true),
                    ("PROBES", true),
                    ("LOSS%", true),
                    ("RTT_P50_US", true),
                    ("RTT_P99_US", true),
                    ("PROBER_P50_US", true),
                    ("RESP_P50_US", true),
                    ("INVALID", true),
                ]);
                for p in &pairs {
                    t.row(vec![
                        p.source_tor_id.clone(),
                        p.target_tor_id.clone(),
                        p.paths.to_string(),
                        p.probe_total.to_string(),
                        loss_pct(p.probe_failed, p.probe_total),
                        us(p.network_rtt_p50_ns),
                        us(p.network_rtt_p99_ns),
                        us(p.prober_delay_p50_ns),
                        us(p.responder_delay_p50_ns),
                        p.invalid_rtt_count.to_string(),
                    ]);
                }
                print!("{}", t.render());
            }
        }
        Cmd::Violations { limit } => {
            let vs = op
                .list_violations(ListViolationsRequest { limit: *limit })
                .await
                .map_err(|s| rpc_err("violations", addr, s))?
                .into_inner()
                .violations;
            if cli.json {
                print_json_rows(vs.iter().map(|v| {
                    json!({
                        "kind": v.kind,
                        "detected_unix_ns": v.detected_unix_ns,
                        "summary": v.summary.as_ref().map(summary_json),
                    })
                }));
            } else {
                let mut t = Table::new(&[
                    ("DETECTED", false),
                    ("KIND", false),
                    ("SRC_TOR", false),
                    ("SRC_GID", false),
                    ("DST_TOR", false),
                    ("DST_GID", false),
                    ("TYPE", false),
                    ("SERVICE", false),
                    ("PROBES", true),
                    ("LOSS%", true),
                    ("RTT_P99_US", true),
                ]);
                for v in &vs {
                    let s = v.summary.clone().unwrap_or_default();
                    t.row(vec![
                        utc(v.detected_unix_ns / 1_000_000_000),
                        v.kind.clone(),
                        s.source_tor_id,
                        s.source_gid,
                        s.target_tor_id,
                        s.target_gid,
                        format::pinglist_type_name(s.pinglist_type).into(),
                        or_dash(&s.service),
                        s.probe_total.to_string(),
                        loss_pct(s.probe_failed as u64, s.probe_total as u64),
                        us(s.network_rtt_p99_ns),
                    ]);
                }
                print!("{}", t.render());
            }
        }
        Cmd::ServicePaths {
            service,
            gid,
            tor_pair,
        } => {
            let (src, dst) = tor_pair.clone().unwrap_or_default();
            let paths = op
                .list_service_paths(ListServicePathsRequest {
                    service: service.clone().unwrap_or_default(),
                    gid: gid_arg(gid),
                    source_tor_id: src,
                    target_tor_id: dst,
                })
                .await
                .map_err(|s| rpc_err("service-paths", addr, s))?
                .into_inner()
                .paths;
            if cli.json {
                print_json_rows(paths.iter().map(|p| {
                    json!({
                        "service": p.service,
                        "source_gid": p.source_gid, "source_tor_id": p.source_tor_id,
                        "source_agent_id": p.source_agent_id,
                        "target_gid": p.target_gid, "target_tor_id": p.target_tor_id,
                        "monitored": p.monitored, "flow_label": p.flow_label,
                        "service_level": p.service_level, "traffic_class": p.traffic_class,
                        "flows": p.flows,
                        "qps": p.qps.iter().map(|q| json!({
                            "local_qpn": q.local_qpn, "remote_qpn": q.remote_qpn,
                            "pid": q.pid, "comm": q.comm,
                            "first_seen_unix_ns": q.first_seen_unix_ns,
                        })).collect::<Vec<_>>(),
                        "latest": p.latest.as_ref().map(summary_json),
                    })
                }));
            } else {
                let mut t = Table::new(&[
                    ("SERVICE", false),
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
                    ("QPS (local->remote pid/comm)", false),
                ]);
                for p in &paths {
                    let qps: Vec<String> = p
                        .qps
                        .iter()
                        .map(|q| format!("{}->{} {}/{}", q.local_qpn, q.remote_qpn, q.pid, q.comm))
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
                    t.row(vec![
                        p.service.clone(),
                        or_dash(&p.source_tor_id),
                        p.source_gid.clone(),
                        or_dash(&p.target_tor_id),
                        p.target_gid.clone(),
                        yes_no(p.monitored),
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
                print!("{}", t.render());
            }
        }
    }
    Ok(())
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.into()
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rpingmeshctl: tokio runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rpingmeshctl: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tor_pair_parsing() {
        assert_eq!(parse_tor_pair("a,b").unwrap(), ("a".into(), "b".into()));
        assert_eq!(parse_tor_pair("a,").unwrap(), ("a".into(), "".into()));
        assert_eq!(parse_tor_pair(",b").unwrap(), ("".into(), "b".into()));
        assert!(parse_tor_pair("a").is_err());
        assert!(parse_tor_pair("a,b,c").is_err());
        assert!(parse_tor_pair(",").is_err());
    }

    #[test]
    fn addresses_get_a_scheme() {
        assert_eq!(endpoint_url("localhost:50051"), "http://localhost:50051");
        assert_eq!(endpoint_url("http://h:1"), "http://h:1");
    }

    #[test]
    fn flags_and_env_default() {
        let c = Cli::try_parse_from([
            "rpingmeshctl",
            "service-paths",
            "--json",
            "--tor-pair",
            "t1,t2",
        ])
        .unwrap();
        assert!(c.json);
        match c.cmd {
            Cmd::ServicePaths { tor_pair, .. } => {
                assert_eq!(tor_pair, Some(("t1".into(), "t2".into())))
            }
            other => panic!("{other:?}"),
        }
        assert!(Cli::try_parse_from(["rpingmeshctl", "bogus"]).is_err());
    }
}
