//! `rpingmesh-agent hostping --once`: the intra-host check an operator runs after a
//! reboot or before a job. It reads the host tree from sysfs, names PCIe links trained
//! below what both ends can do, samples the RNIC counters (hardware monitor), probes
//! RNIC to RNIC (R2R) with the agent's own driver and no controller, prints the tree and
//! the verdict, and exits non-zero on a problem.
//!
//! The judging is `rpingmesh-hostping` (pure); this module only gathers: sysfs reads,
//! counter samples a second apart, and the probes' outcomes from one driver per RNIC.
//! This file runs the check and builds the report; `loopback`, `r2r_probing` and `hw`
//! gather, `render` prints.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use rpingmesh_hostping::hwmon::{self, ModeThresholds, PortCounters, PortRates};
use rpingmesh_hostping::loopback::HostMode;
use rpingmesh_hostping::r2r::{self, R2rFinding, R2rWindow};
use rpingmesh_hostping::sysfs::{RealSysfs, Recorder, Recording, Sysfs};
use rpingmesh_hostping::topology::{HostTopology, LinkDowngrade};
use rpingmesh_proto::controller_agent::{HostFinding, HostHealthReport};
use rpingmesh_proto::gid::format_gid;
use rpingmesh_protocol::prober::ProbeResult;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::config::{AgentConfig, CliArgs, Transport};
use crate::open::{self, OpenedRnic};
use crate::rnic::{DriverParams, RnicDriver, StaticDriver, TargetOutcome};
use crate::targets::{Pinglists, ProbeTarget};
use crate::telemetry::Metrics;
use rpingmesh_protocol::PinglistKind;

mod hw;
mod loopback;
mod r2r_probing;
mod render;

pub use hw::{hw_monitor, PortCounterFiles};
pub use loopback::loopback_tests;
use loopback::loopback_verb_problems;
use r2r_probing::{describe_r2r, r2r_probe};
pub use r2r_probing::{r2r_run, r2r_targets, HostRnic, R2rCollector, R2rPlan};
pub use render::render;
const CANNOT_OPEN: &str = "cannot open the RNICs";

/// Flags of `rpingmesh-agent hostping`; the agent's own flags and config file choose the
/// transport and the RNICs.
#[derive(Debug, clap::Parser)]
#[command(
    name = "rpingmesh-agent hostping",
    about = "Intra-host diagnosis (Hostping): topology, PCIe links, RNIC counters, RNIC-to-RNIC probing"
)]
pub struct HostpingArgs {
    /// Run the checks once, print the tree and the verdict, exit 1 on a problem.
    #[arg(long)]
    pub once: bool,
    /// Write what was read of sysfs to FILE (a recording the tests can replay).
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// Read the host tree from a recording instead of /sys.
    #[arg(long, value_name = "FILE")]
    pub sysfs_recording: Option<PathBuf>,
    /// Seconds of R2R probing, in windows of `hostping_r2r_window_sec`; 0 skips it. The
    /// thresholds and the other timings are the agent's `hostping_*` config keys (flags
    /// `--hostping-...`).
    #[arg(long, default_value_t = 20)]
    pub r2r_sec: u64,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Send the report to the controller (`controller_addr`), where `rpingmeshctl host`
    /// shows it. A report that cannot be sent makes the exit code 2.
    #[arg(long)]
    pub report: bool,
    #[command(flatten)]
    pub agent: CliArgs,
}

/// Everything one run found.
#[derive(Debug, Serialize, Clone)]
pub struct HostReport {
    pub hostname: String,
    pub topology: HostTopology,
    pub downgrades: Vec<LinkDowngrade>,
    pub ports: Vec<PortReport>,
    pub mode: HostMode,
    pub r2r: R2rReport,
    pub loopback: LoopbackReport,
    /// One line each, for people.
    pub problems: Vec<String>,
    /// The same, for the controller.
    pub findings: Vec<HostFindingLine>,
}

/// Loopback tests: each RNIC writes to each NUMA node's memory through an RC QP
/// connected to itself (GPU memory needs dma-buf or peer memory: not tested here).
#[derive(Debug, Serialize, Default, Clone)]
pub struct LoopbackReport {
    pub skipped: Option<String>,
    /// Why GPU memory endpoints were not tested (no NVIDIA driver, no dma-buf or peer
    /// memory): a limit of the host's setup, not a finding.
    pub gpu_skipped: Option<String>,
    pub paths: Vec<LoopbackPath>,
    /// Algorithm 1's findings over the paths (link, cause).
    pub links: Vec<rpingmesh_hostping::linkstate::LinkFinding>,
    /// Per RNIC, the verbs the tests called and their times (the verb-health check).
    pub verbs: Vec<(String, String, f64)>,
}

#[derive(Debug, Serialize, Clone)]
pub struct LoopbackPath {
    pub rnic: String,
    pub endpoint: String,
    /// Eq. 2: T_proc + Lat_host, the 1-byte write's median.
    pub host_latency_us: f64,
    /// Eq. 3, Gb/s.
    pub bandwidth_gbps: Option<f64>,
    pub abnormal: bool,
}

/// A problem as the controller stores it.
#[derive(Debug, Serialize, Clone)]
pub struct HostFindingLine {
    pub kind: String,
    pub location: String,
    pub detail: String,
}

#[derive(Debug, Serialize, Clone)]
pub struct PortReport {
    pub device: String,
    pub port: u32,
    pub rates: PortRates,
}

#[derive(Debug, Serialize, Default, Clone)]
pub struct R2rReport {
    /// Why it did not run, if it did not.
    pub skipped: Option<String>,
    pub rnics: Vec<String>,
    pub probes: u64,
    pub timeouts: u64,
    /// The last window's findings: the verdict.
    pub findings: Vec<R2rFinding>,
    pub windows: Vec<R2rWindowReport>,
}

#[derive(Debug, Serialize, Default, Clone)]
pub struct R2rWindowReport {
    pub probes: u64,
    pub timeouts: u64,
    pub findings: Vec<R2rFinding>,
    /// Each RNIC's timeout rate over the probes it sent or was sent (None: no probes).
    pub timeout_rates: Vec<Option<f64>>,
}

/// Runs `hostping`; the process's exit code.
pub fn main(args: Vec<String>) -> std::process::ExitCode {
    use clap::Parser;
    use std::process::ExitCode;
    let args = match HostpingArgs::try_parse_from(args) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    if !args.once {
        eprintln!("rpingmesh-agent hostping: only --once is available here; the running agent checks its host all the time (hostping_enabled)");
        return ExitCode::from(2);
    }
    let mut agent_args = args.agent.clone();
    // A one-shot command: the agent's info lines are noise here.
    if agent_args.log_level.is_none() {
        agent_args.log_level = Some("warn".into());
    }
    // No controller is involved: a missing ToR id is no reason to refuse.
    if agent_args.tor_id.is_none() {
        agent_args.tor_id = Some("hostping".into());
    }
    let cfg = match AgentConfig::load(&agent_args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rpingmesh-agent hostping: config error: {e}");
            return ExitCode::from(2);
        }
    };
    crate::telemetry::init_logging(&cfg.log_level);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rpingmesh-agent hostping: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let report = match rt.block_on(run_once(&args, &cfg)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rpingmesh-agent hostping: {e}");
            return ExitCode::from(2);
        }
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        print!("{}", render(&report));
    }
    if args.report {
        if let Err(e) = rt.block_on(send_report(&cfg, &report)) {
            eprintln!(
                "rpingmesh-agent hostping: report to the controller at {}: {e}",
                cfg.controller_addr
            );
            return ExitCode::from(2);
        }
    }
    if report.problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// The report as the controller takes it (`ReportHostHealth`).
pub fn to_proto(cfg: &AgentConfig, r: &HostReport, checked_unix_ns: u64) -> HostHealthReport {
    let mode = match r.mode {
        HostMode::Idle => "idle",
        HostMode::Busy => "busy",
        HostMode::Abnormal => "abnormal",
    };
    HostHealthReport {
        agent_id: cfg.agent_id.clone(),
        hostname: cfg.hostname.clone(),
        checked_unix_ns,
        tree: render(r),
        mode: mode.into(),
        findings: r
            .findings
            .iter()
            .map(|f| HostFinding {
                kind: f.kind.clone(),
                location: f.location.clone(),
                detail: f.detail.clone(),
            })
            .collect(),
        report_json: serde_json::to_string(r).unwrap_or_default(),
    }
}

async fn send_report(cfg: &AgentConfig, r: &HostReport) -> anyhow::Result<()> {
    let client = crate::controller_client::ControllerClient::connect_lazy(cfg)?;
    Ok(send_report_with(&client, cfg, r).await?)
}

/// Why a host report did not arrive.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{0}")]
    Controller(#[from] crate::controller_client::ControllerError),
    #[error("no answer within 10 s")]
    Timeout,
}

impl ReportError {
    /// The controller has no `ReportHostHealth` (a Go controller).
    pub fn is_unsupported(&self) -> bool {
        matches!(self, ReportError::Controller(e) if e.is_unsupported())
    }
}

/// One `ReportHostHealth` call, bounded to 10 s.
pub async fn send_report_with(
    client: &crate::controller_client::ControllerClient,
    cfg: &AgentConfig,
    r: &HostReport,
) -> Result<(), ReportError> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let call = client.report_host_health(to_proto(cfg, r, now));
    match tokio::time::timeout(Duration::from_secs(10), call).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(ReportError::Controller(e)),
        Err(_) => Err(ReportError::Timeout),
    }
}

/// Gathers and judges.
pub async fn run_once(args: &HostpingArgs, cfg: &AgentConfig) -> Result<HostReport, String> {
    // 1. The tree, read through a recorder, so `--record` writes exactly what was read
    // (the tree and the counters) without reading anything twice.
    let replayed = match &args.sysfs_recording {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            Some(Recording::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?)
        }
        None => None,
    };
    let recorder = Recorder::new(RealSysfs::host());
    let source: &dyn Sysfs = match &replayed {
        Some(rec) => rec,
        None => &recorder,
    };
    let topology = HostTopology::discover(source).map_err(|e| e.to_string())?;
    // 2. Counters a second apart (from the recording when the tree is replayed).
    let ports_of: Vec<(String, u32, Option<f64>)> = topology
        .rnics
        .iter()
        .flat_map(|r| {
            r.ports
                .iter()
                .map(move |p| (r.name.clone(), p.port, p.rate_gbps))
        })
        .collect();
    let sample = |fs: &dyn Sysfs| -> Vec<PortCounters> {
        ports_of
            .iter()
            .map(|(d, p, _)| hwmon::read_port(fs, d, *p))
            .collect()
    };
    let counters_source = source;
    let first = sample(counters_source);
    let started = std::time::Instant::now();
    if !ports_of.is_empty() && args.sysfs_recording.is_none() {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let second = sample(counters_source);
    let secs = started.elapsed().as_secs_f64().max(1e-3);
    let mut ports = Vec::new();
    let mut mode_input = Vec::new();
    for ((a, b), (_, _, line)) in first.iter().zip(&second).zip(&ports_of) {
        let rates = hwmon::rates(a, b, secs);
        mode_input.push((rates, *line));
        ports.push(PortReport {
            device: a.device.clone(),
            port: a.port,
            rates,
        });
    }
    let mode = hwmon::host_mode(&mode_input, mode_thresholds(cfg));
    if let Some(path) = &args.record {
        let taken = replayed.clone().unwrap_or_else(|| recorder.recording());
        std::fs::write(path, taken.to_text()).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    // 3. Loopback tests (rdma only), then R2R.
    let loopback = loopback_tests(
        cfg,
        &topology,
        mode,
        &mut rpingmesh_hostping::linkstate::LinkStateInference::new(),
    );
    let r2r = if args.r2r_sec == 0 {
        R2rReport {
            skipped: Some("--r2r-sec 0".into()),
            ..Default::default()
        }
    } else {
        r2r_probe(cfg, args).await
    };
    Ok(HostReport::judge(cfg, topology, ports, mode, r2r, loopback))
}

/// The host is idle, busy or abnormal by these (config keys).
pub fn mode_thresholds(cfg: &AgentConfig) -> ModeThresholds {
    ModeThresholds {
        thp_low: cfg.hostping_thp_low,
        pfc_high: cfg.hostping_pfc_high,
    }
}

impl HostReport {
    /// Names the problems in what was gathered: one finding per downgraded link, port
    /// down, R2R verdict, abnormal link of Algorithm 1 and failed verb.
    pub fn judge(
        cfg: &AgentConfig,
        topology: HostTopology,
        ports: Vec<PortReport>,
        mode: HostMode,
        r2r: R2rReport,
        loopback: LoopbackReport,
    ) -> HostReport {
        let mut findings: Vec<HostFindingLine> = Vec::new();
        let mut found = |kind: &str, location: String, detail: String| {
            findings.push(HostFindingLine {
                kind: kind.into(),
                location,
                detail,
            });
        };
        for d in topology.downgrades() {
            found("pcie_downgrade", d.bdf.clone(), d.describe());
        }
        for p in &ports {
            if p.rates.link_downed {
                found(
                    "rnic_port",
                    format!("{}/{}", p.device, p.port),
                    format!(
                        "{} port {}: the link went down during the sample",
                        p.device, p.port
                    ),
                );
            }
        }
        for r in &topology.rnics {
            for p in &r.ports {
                if p.state != "ACTIVE" {
                    found(
                        "rnic_port",
                        format!("{}/{}", r.name, p.port),
                        format!("{} port {}: state {}", r.name, p.port, p.state),
                    );
                }
            }
        }
        for f in &r2r.findings {
            use rpingmesh_hostping::r2r::R2rKind;
            let kind = match f.kind {
                R2rKind::Down => "r2r_down",
                R2rKind::Sporadic => "r2r_sporadic",
                R2rKind::Tor => "r2r_tor",
                R2rKind::Miswired => "r2r_miswired",
            };
            let location = if f.groups.is_empty() {
                f.rnics.join(",")
            } else {
                f.groups
                    .iter()
                    .map(|g| g.join(","))
                    .collect::<Vec<_>>()
                    .join(" | ")
            };
            found(kind, location, describe_r2r(f));
        }
        // An RNIC that cannot be opened is what a service would hit too (the TNET version's
        // verb-call errors): a problem, unlike a host with one RNIC, which has no R2R.
        if let Some(why) = r2r
            .skipped
            .as_deref()
            .filter(|w| w.starts_with(CANNOT_OPEN))
        {
            found("verb_error", String::new(), format!("R2R: {why}"));
        }
        for l in &loopback.links {
            use rpingmesh_hostping::linkstate::Cause;
            let kind = match l.cause {
                Cause::Failure => "link_failure",
                Cause::Congestion => "link_congestion",
                Cause::Flapping => "link_flapping",
            };
            let also = if l.alternatives.is_empty() {
                String::new()
            } else {
                format!(
                    " (or {})",
                    l.alternatives
                        .iter()
                        .map(|a| a.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            found(
                kind,
                l.link.to_string(),
                format!(
                    "loopback: {}{also} slows {} path(s): {}",
                    l.link,
                    l.abnormal_cnt,
                    l.paths.join("; ")
                ),
            );
        }
        for (rnic, what) in loopback_verb_problems(&loopback) {
            found("verb_error", rnic, what);
        }
        let problems = findings.iter().map(|f| f.detail.clone()).collect();
        HostReport {
            hostname: cfg.hostname.clone(),
            downgrades: topology.downgrades(),
            topology,
            ports,
            mode,
            r2r,
            loopback,
            problems,
            findings,
        }
    }
}

#[cfg(all(test, feature = "rdma"))]
mod tests;
