//! rpingmeshctl: reads the controller's operator API (`rpingmesh.operator.v1`).
//!
//! Aligned tables by default (RTT in microseconds, loss in percent), `--json` for one
//! JSON object per row (raw ns and ratios). Any failure is one line on stderr.
//!
//! The controller is reached in plaintext, TLS or mTLS with the agent's keys: `--tls-mode`,
//! `--tls-cert-file`, `--tls-key-file`, `--tls-ca-file`, `--tls-server-name`, each also as
//! `RPINGMESH_TLS_*`, or `tls_*` / `controller_addr` from an agent YAML (`--config`).
//! `paths` and `service-paths` take `--watch [--interval SECS] [--count N]`; `findings
//! --watch [--count N]` follows the controller's WatchFindings stream instead.
//!
//! Exit status (also in `--help`):
//! - 0: every call answered;
//! - 1: the controller answered with an error status (bad filter, unsupported call);
//! - 2: usage or configuration error (flags, variables, `--config`, TLS files);
//! - 3: the controller could not be reached (connection refused, TLS handshake failure,
//!   deadline: every call is bounded by `--timeout-sec`).

mod actions;
mod audit;
mod connect;
mod findings;
mod format;
mod hosts;
mod job;
mod service_paths;
mod trace;
mod watch;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use serde_json::json;

use rpingmesh_proto::controller_agent::PathSummary;
use rpingmesh_proto::operator::{
    DeleteAgentRequest, ListPathsRequest, ListRnicsRequest, ListServicePathsRequest,
    ListTorPairsRequest, ListViolationsRequest,
};

use connect::{Call, Failure, Given};
use findings::FindingsArgs;
use format::{
    loss_pct, or_dash, path_cells, probe_cells, summary_json, us, utc, Table, PATH_COLUMNS,
    PROBE_COLUMNS,
};
use watch::WatchArgs;

const AFTER_HELP: &str = "\
TLS uses the agent's keys: tls_mode disabled|tls|mtls; tls needs --tls-ca-file, mtls also
--tls-cert-file and --tls-key-file. Flags beat RPINGMESH_* variables, which beat the agent
YAML of --config (only controller_addr and tls_* are read from it).

Exit status:
  0  ok
  1  the controller answered with an error status
  2  usage or configuration error (flags, RPINGMESH_* variables, --config, TLS files)
  3  the controller could not be reached (connection refused, TLS handshake failure,
     no answer within --timeout-sec)
  4  the controller refused the caller: no or unknown token or certificate, or a role
     that may not do this (--token-file; operator_tokens_file, tls_operator_roles)";

#[derive(Debug, Parser)]
#[command(
    name = "rpingmeshctl",
    version,
    about = "Query an rpingmesh controller",
    after_help = AFTER_HELP
)]
struct Cli {
    /// One JSON object per row instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(flatten)]
    connection: Given,
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
        #[command(flatten)]
        watch: WatchArgs,
    },
    /// Per (source ToR, target ToR) aggregate of the latest windows.
    TorPairs,
    /// Recent SLA violations, newest first.
    Violations {
        /// At most this many (0 = all retained).
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Localized findings (a broken RNIC, host, ToR or ToR-spine link): open ones, then
    /// the most recently resolved.
    Findings(FindingsArgs),
    /// One host's newest Hostping report: its tree (sockets, PCIe, RNICs, GPUs) with each
    /// link's state, and the verdict.
    Host {
        /// The hostname the agent reported under.
        name: String,
    },
    /// Every host that sent a Hostping report, one row each.
    Hosts {
        /// Only hosts whose newest report has findings.
        #[arg(long)]
        problems: bool,
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
        #[command(flatten)]
        watch: WatchArgs,
    },
    /// Action (role operator): forget an agent and its RNICs now (a host taken out, an
    /// RNIC moved to another host). A live agent registers again at its next heartbeat.
    DeleteAgent {
        agent_id: String,
        /// Why, for the controller's audit log.
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// One workload (a Slurm job, a Kubernetes pod, a container or a unit, by its key such
    /// as slurm/4242 or k8s/NS/POD, or by its name or id): its live service paths with
    /// their health, and the findings that hurt it (open, and recently resolved).
    Job { name: String },
    /// Action (role operator): drain an RNIC or a host for maintenance: it leaves every
    /// pinglist (as target and prober) and its findings are marked "in maintenance".
    Drain(actions::DrainArgs),
    /// Action (role operator): silence a finding, or a component's findings, for a while:
    /// they still record their windows but do not alert.
    Silence(actions::SilenceArgs),
    /// Action (role operator): end a drain or a silence now (undrain, unsilence).
    EndAction { id: u64 },
    /// The drains and silences in force.
    Actions,
    /// Action (role operator): an ECMP trace on demand: SRC's agent probes DST across a
    /// range of flow labels now; prints each label's loss and RTT and the spine the
    /// topology sends it over (waits for the results).
    Trace(trace::TraceArgs),
    /// The audit trail, newest first: registrations that changed the registry, operator
    /// actions, refused calls (with etcd, every replica's).
    Audit {
        /// At most this many entries (the controller caps it at 10,000).
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
}

impl Cmd {
    /// `--watch` settings, when given.
    fn watch(&self) -> Option<&WatchArgs> {
        match self {
            Cmd::Paths { watch, .. } | Cmd::ServicePaths { watch, .. } if watch.watch => {
                Some(watch)
            }
            _ => None,
        }
    }
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

fn json_rows(rows: impl IntoIterator<Item = serde_json::Value>) -> String {
    rows.into_iter().map(|r| format!("{r}\n")).collect()
}

fn gid_arg(g: &Option<String>) -> String {
    g.clone().unwrap_or_default()
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let target = connect::resolve(&cli.connection)?;
    let op = target.connect().await?;
    let (cmd, json) = (&cli.cmd, cli.json);
    let call = |op: &connect::Operator| Call {
        op: op.clone(),
        target: &target,
        json,
    };
    if let Cmd::Findings(a) = cmd {
        if a.watch {
            return findings::watch(&mut call(&op), a).await;
        }
    }
    match cmd.watch() {
        Some(w) => {
            let title = std::env::args().skip(1).collect::<Vec<_>>().join(" ");
            watch::run(w, &title, || {
                let mut c = call(&op);
                async move { query(&mut c, cmd).await }
            })
            .await
        }
        None => {
            let out = query(&mut call(&op), cmd).await?;
            print!("{out}");
            Ok(())
        }
    }
}

/// One query of `cmd`, rendered (table or JSON rows).
async fn query(c: &mut Call<'_>, cmd: &Cmd) -> Result<String, Failure> {
    let out = match cmd {
        Cmd::Rnics { tor } => {
            let rnics = c
                .target
                .answer(
                    "rnics",
                    c.op.list_rnics(ListRnicsRequest {
                        tor_id: tor.clone().unwrap_or_default(),
                    })
                    .await,
                )?
                .rnics;
            if c.json {
                json_rows(rnics.iter().map(|r| {
                    let i = r.rnic.clone().unwrap_or_default();
                    json!({
                        "gid": i.gid, "qpn": i.qpn, "ip_address": i.ip_address,
                        "host_name": i.host_name, "tor_id": i.tor_id,
                        "device_name": i.device_name, "agent_id": r.agent_id,
                        "last_updated_unix_sec": r.last_updated_unix_sec, "active": r.active,
                    })
                }))
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
                t.render()
            }
        }
        Cmd::Paths {
            source_tor,
            target_tor,
            gid,
            all_windows,
            ..
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
                paths.extend(c.target.answer("paths", c.op.list_paths(r).await)?.paths);
            }
            if c.json {
                json_rows(paths.iter().map(summary_json))
            } else {
                let mut t = Table::new(
                    &[
                        &PATH_COLUMNS[..],
                        &[("WINDOW_START", false)],
                        &PROBE_COLUMNS,
                    ]
                    .concat(),
                );
                for s in &paths {
                    let mut cells = path_cells(s).to_vec();
                    cells.push(utc(s.window_start_unix_ns / 1_000_000_000));
                    cells.extend(probe_cells!(s));
                    t.row(cells);
                }
                t.render()
            }
        }
        Cmd::TorPairs => {
            let pairs = c
                .target
                .answer(
                    "tor-pairs",
                    c.op.list_tor_pairs(ListTorPairsRequest {}).await,
                )?
                .pairs;
            if c.json {
                json_rows(pairs.iter().map(|p| {
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
                }))
            } else {
                let mut t = Table::new(
                    &[
                        &[("SRC_TOR", false), ("DST_TOR", false), ("PATHS", true)][..],
                        &PROBE_COLUMNS,
                        &[("INVALID", true)],
                    ]
                    .concat(),
                );
                for p in &pairs {
                    let mut cells = vec![
                        p.source_tor_id.clone(),
                        p.target_tor_id.clone(),
                        p.paths.to_string(),
                    ];
                    cells.extend(probe_cells!(p));
                    cells.push(p.invalid_rtt_count.to_string());
                    t.row(cells);
                }
                t.render()
            }
        }
        Cmd::Violations { limit } => {
            let vs = c
                .target
                .answer(
                    "violations",
                    c.op.list_violations(ListViolationsRequest { limit: *limit })
                        .await,
                )?
                .violations;
            if c.json {
                json_rows(vs.iter().map(|v| {
                    json!({
                        "kind": v.kind,
                        "detected_unix_ns": v.detected_unix_ns,
                        "summary": v.summary.as_ref().map(summary_json),
                    })
                }))
            } else {
                let mut t = Table::new(
                    &[
                        &[("DETECTED", false), ("KIND", false)][..],
                        &PATH_COLUMNS,
                        &[("PROBES", true), ("LOSS%", true), ("RTT_P99_US", true)],
                    ]
                    .concat(),
                );
                for v in &vs {
                    let s = v.summary.clone().unwrap_or_default();
                    let mut cells = vec![utc(v.detected_unix_ns / 1_000_000_000), v.kind.clone()];
                    cells.extend(path_cells(&s));
                    cells.extend([
                        s.probe_total.to_string(),
                        loss_pct(s.probe_failed as u64, s.probe_total as u64),
                        us(s.network_rtt_p99_ns),
                    ]);
                    t.row(cells);
                }
                t.render()
            }
        }
        Cmd::Findings(a) => findings::list(c, a).await?,
        Cmd::Host { name } => hosts::host(c, name).await?,
        Cmd::DeleteAgent { agent_id, reason } => {
            let r = c.target.answer(
                "DeleteAgent",
                c.op.delete_agent(DeleteAgentRequest {
                    agent_id: agent_id.clone(),
                    reason: reason.clone(),
                })
                .await,
            )?;
            if c.json {
                format!(
                    "{}\n",
                    json!({"agent_id": agent_id, "removed_rnics": r.removed_rnics})
                )
            } else {
                format!("deleted agent {agent_id} ({} RNICs)\n", r.removed_rnics)
            }
        }
        Cmd::Hosts { problems } => hosts::hosts(c, *problems).await?,
        Cmd::Audit { limit } => audit::audit(c, *limit).await?,
        Cmd::Job { name } => job::job(c, name).await?,
        Cmd::Drain(a) => actions::drain(c, a).await?,
        Cmd::Silence(a) => actions::silence(c, a).await?,
        Cmd::EndAction { id } => actions::end(c, *id).await?,
        Cmd::Actions => actions::list(c).await?,
        Cmd::Trace(a) => trace::trace(c, a).await?,
        Cmd::ServicePaths {
            service,
            gid,
            tor_pair,
            ..
        } => {
            let (src, dst) = tor_pair.clone().unwrap_or_default();
            let req = ListServicePathsRequest {
                service: service.clone().unwrap_or_default(),
                gid: gid_arg(gid),
                source_tor_id: src,
                target_tor_id: dst,
            };
            service_paths::list(c, req).await?
        }
    };
    Ok(out)
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
            return ExitCode::from(connect::EXIT_USAGE);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::from(connect::EXIT_OK),
        Err(e) => {
            eprintln!("rpingmeshctl: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use connect::TlsMode;
    use std::time::Duration;

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
    fn watch_and_tls_flags() {
        let c = Cli::try_parse_from([
            "rpingmeshctl",
            "paths",
            "--watch",
            "--interval",
            "0.5",
            "--count",
            "3",
            "--tls-mode",
            "mtls",
        ])
        .unwrap();
        assert_eq!(c.connection.tls_mode, Some(TlsMode::Mtls));
        let w = c.cmd.watch().unwrap();
        assert_eq!((w.interval, w.count), (Duration::from_millis(500), Some(3)));
        let c = Cli::try_parse_from(["rpingmeshctl", "service-paths"]).unwrap();
        assert!(c.cmd.watch().is_none());
        // --count and --interval need --watch; rnics has no --watch; modes are the agent's.
        for bad in [
            &["rpingmeshctl", "paths", "--count", "2"][..],
            &["rpingmeshctl", "paths", "--interval", "1"],
            &["rpingmeshctl", "rnics", "--watch"],
            &["rpingmeshctl", "rnics", "--tls-mode", "ssl"],
            &["rpingmeshctl", "paths", "--watch", "--count", "0"],
        ] {
            let e = Cli::try_parse_from(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
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

    #[test]
    fn findings_flags() {
        let c = Cli::try_parse_from([
            "rpingmeshctl",
            "findings",
            "--kind",
            "rnic",
            "--resolved-limit",
            "5",
            "--watch",
            "--count",
            "2",
        ])
        .unwrap();
        match c.cmd {
            Cmd::Findings(a) => {
                assert_eq!(a.kind.as_deref(), Some("rnic"));
                assert_eq!((a.resolved_limit, a.watch, a.count), (5, true, Some(2)));
            }
            other => panic!("{other:?}"),
        }
        let c = Cli::try_parse_from(["rpingmeshctl", "findings"]).unwrap();
        assert!(
            c.cmd.watch().is_none(),
            "findings --watch streams, no polling"
        );
        for bad in [
            &["rpingmeshctl", "findings", "--count", "2"][..],
            &["rpingmeshctl", "findings", "--watch", "--interval", "1"],
            &["rpingmeshctl", "findings", "--resolved-limit", "-1"],
        ] {
            let e = Cli::try_parse_from(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
    }
}
