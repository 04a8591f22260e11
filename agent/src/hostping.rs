//! `rpingmesh-agent hostping --once`: the intra-host check an operator runs after a
//! reboot or before a job. It reads the host tree from sysfs, names PCIe links trained
//! below what both ends can do, samples the RNIC counters (hardware monitor), probes
//! RNIC to RNIC (R2R) with the agent's own driver and no controller, prints the tree and
//! the verdict, and exits non-zero on a problem.
//!
//! The judging is `rpingmesh-hostping` (pure); this module only gathers: sysfs reads,
//! counter samples a second apart, and the probes' outcomes from one driver per RNIC.

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

use crate::agent::{self, OpenedRnic};
use crate::config::{AgentConfig, CliArgs, Transport};
use crate::rnic::{DriverParams, RnicDriver, StaticDriver, TargetOutcome};
use crate::targets::{Pinglists, ProbeTarget};
use crate::telemetry::Metrics;
use rpingmesh_protocol::PinglistKind;

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

/// Verb failures (a test that could not run) as (RNIC, line).
fn loopback_verb_problems(l: &LoopbackReport) -> Vec<(String, String)> {
    l.verbs
        .iter()
        .filter(|(_, verb, _)| verb.starts_with("FAILED"))
        .map(|(rnic, verb, _)| {
            (
                rnic.clone(),
                format!(
                    "loopback on {rnic}: {}",
                    verb.trim_start_matches("FAILED: ")
                ),
            )
        })
        .collect()
}

#[cfg(not(feature = "rdma"))]
pub fn loopback_tests(
    cfg: &AgentConfig,
    _: &HostTopology,
    _: HostMode,
    _: &mut rpingmesh_hostping::linkstate::LinkStateInference,
) -> LoopbackReport {
    if !cfg.hostping_loopback_enabled {
        return LoopbackReport {
            skipped: Some("hostping_loopback_enabled: false".into()),
            ..Default::default()
        };
    }
    let why = match cfg.transport {
        Transport::Udp => "transport udp (loopback tests write through RDMA)",
        Transport::Rdma => "this build has no rdma backend (build with the `rdma` feature)",
    };
    LoopbackReport {
        skipped: Some(why.into()),
        ..Default::default()
    }
}

/// Every RNIC the config allows x every NUMA node's memory (the affinitive subset when
/// the host is busy), judged against peers, then a round of Algorithm 1 over the verdicts
/// (`inference` keeps the links' history between rounds: gray streaks, flapping). Blocks
/// for the length of the writes: call from a blocking context.
#[cfg(feature = "rdma")]
pub fn loopback_tests(
    cfg: &AgentConfig,
    topo: &HostTopology,
    mode: HostMode,
    inference: &mut rpingmesh_hostping::linkstate::LinkStateInference,
) -> LoopbackReport {
    use rpingmesh_hostping::loopback::{judge, plan, Timing};
    use rpingmesh_hostping::paths::{full_mesh, Endpoint};
    use rpingmesh_verbs::rdma::loopback::{run_loopback, LoopbackOptions};
    if !cfg.hostping_loopback_enabled {
        return LoopbackReport {
            skipped: Some("hostping_loopback_enabled: false".into()),
            ..Default::default()
        };
    }
    if cfg.transport != Transport::Rdma {
        return LoopbackReport {
            skipped: Some("transport udp (loopback tests write through RDMA)".into()),
            ..Default::default()
        };
    }
    let allowed = |name: &str| {
        cfg.allowed_device_names.is_empty() || cfg.allowed_device_names.iter().any(|d| d == name)
    };
    let mut report = LoopbackReport::default();
    let mut mesh: Vec<_> = full_mesh(topo)
        .into_iter()
        .filter(|p| allowed(&p.rnic))
        .collect();
    // GPU endpoints need the NVIDIA driver's libcuda: without it they are left out, once,
    // with the reason.
    if mesh.iter().any(|p| matches!(p.endpoint, Endpoint::Gpu(_))) {
        if let Err(e) = rpingmesh_verbs::rdma::gpu::Cuda::load() {
            report.gpu_skipped = Some(e.to_string());
            mesh.retain(|p| matches!(p.endpoint, Endpoint::Memory(_)));
        }
    }
    let tested_plan = plan(&mesh, mode);
    if tested_plan.is_empty() {
        return LoopbackReport {
            skipped: Some("no RNIC of the config is in the host tree".into()),
            ..report
        };
    }
    let mut timed = Vec::new();
    // A single-node kernel has no NUMA policy to set: leave it to the default.
    let numa = |n: Option<u32>| n.filter(|_| topo.numa_nodes.len() > 1);
    for p in &tested_plan {
        let mut o = LoopbackOptions::new(&p.rnic);
        o.gid_index = u32::try_from(cfg.gid_index).unwrap_or(0);
        o.samples = cfg.hostping_loopback_samples.max(1);
        match &p.endpoint {
            Endpoint::Memory(node) => o.numa_node = numa(Some(*node)),
            Endpoint::Gpu(bus) => {
                // The read region in host memory near the GPU; the writes land on it.
                o.gpu = Some(bus.clone());
                o.numa_node = numa(
                    topo.pci
                        .iter()
                        .find(|d| &d.bdf == bus)
                        .and_then(|d| d.numa_node),
                );
            }
        }
        match run_loopback(&o) {
            Ok(r) => {
                for v in &r.verbs {
                    report
                        .verbs
                        .push((p.rnic.clone(), v.verb.to_string(), v.micros));
                }
                let sums = r.summaries();
                let small = sums.iter().find(|s| s.size == 1);
                let large = sums.iter().find(|s| s.size > 1);
                if let (Some(a), Some(b)) = (small, large) {
                    let t = Timing {
                        small_ns: a.median_ns,
                        large_ns: b.median_ns,
                    };
                    timed.push((p.clone(), t));
                }
            }
            // GPU memory the host cannot give (driver, dma-buf, peer memory): a setup
            // limit, noted, not a failed verb.
            Err(e @ rpingmesh_verbs::rdma::RdmaError::Gpu(_)) => {
                report.gpu_skipped.get_or_insert_with(|| e.to_string());
            }
            Err(e) => report
                .verbs
                .push((p.rnic.clone(), format!("FAILED: {e}"), 0.0)),
        }
    }
    let verdicts = judge(&timed, mode, cfg.hostping_abnormal_th);
    // No per-link utilization Linux exposes for these paths (UPI, memory channels): the
    // congestion input stays empty, and an overloaded link reads as failed.
    let round = inference.round(
        &verdicts.iter().map(|m| m.verdict()).collect::<Vec<_>>(),
        &std::collections::BTreeMap::new(),
        cfg.hostping_util_high,
    );
    report.links = round.findings;
    report.paths = verdicts
        .iter()
        .map(|m| LoopbackPath {
            rnic: m.path.rnic.clone(),
            endpoint: m.path.endpoint.to_string(),
            host_latency_us: m.timing.host_latency_us(),
            bandwidth_gbps: m.bandwidth_gbps,
            abnormal: m.abnormal,
        })
        .collect();
    report
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

fn describe_r2r(f: &R2rFinding) -> String {
    use rpingmesh_hostping::r2r::R2rKind;
    let pct = f.timeout_rate * 100.0;
    match f.kind {
        R2rKind::Down => format!(
            "R2R: {} timed out on {pct:.0}% of {} probes: down or misrouted",
            f.rnics.join(","),
            f.probes
        ),
        R2rKind::Sporadic => format!(
            "R2R: {} timed out on {pct:.1}% of {} probes: flapping or bad hardware",
            f.rnics.join(","),
            f.probes
        ),
        R2rKind::Tor => format!(
            "R2R: every RNIC timed out ({pct:.0}% of {} probes): the ToR",
            f.probes
        ),
        R2rKind::Miswired => {
            let groups: Vec<String> = f
                .groups
                .iter()
                .map(|g| format!("{{{}}}", g.join(",")))
                .collect();
            format!("R2R: {} reach each other only within their group: miswired (wrong switch ports or subnets)", groups.join(" "))
        }
    }
}

/// One driver per RNIC of the agent's config, each probing the others.
async fn r2r_probe(cfg: &AgentConfig, args: &HostpingArgs) -> R2rReport {
    let opened: Result<Vec<OpenedRnic>, String> = match cfg.transport {
        Transport::Udp => agent::bind_udp(cfg)
            .map(|eps| eps.into_iter().map(OpenedRnic::from).collect())
            .map_err(|e| e.to_string()),
        Transport::Rdma => agent::open_rdma(cfg).map_err(|e| e.to_string()),
    };
    let opened = match opened {
        Ok(o) => o,
        Err(e) => {
            return R2rReport {
                skipped: Some(format!("cannot open the RNICs: {e}")),
                ..Default::default()
            }
        }
    };
    let mut params = DriverParams::from_config(cfg, rand::random());
    params.analysis_window_ns = None;
    params.responder_only = false;
    let mut plan = R2rPlan::from_config(cfg);
    plan.duration = Duration::from_secs(args.r2r_sec);
    r2r_run(opened, params, &plan).await
}

/// How R2R probes.
#[derive(Debug, Clone)]
pub struct R2rPlan {
    /// Each RNIC sends one probe per interval (the paper: 100 ms).
    pub interval: Duration,
    /// The paper: 500 ms.
    pub timeout: Duration,
    /// How long `r2r_run` probes (the running agent: for as long as it runs).
    pub duration: Duration,
    /// Outcomes are judged per window (the paper: 20 s).
    pub window: Duration,
    pub timeout_th: f64,
}

impl R2rPlan {
    /// The `hostping_*` keys; `duration` one window.
    pub fn from_config(cfg: &AgentConfig) -> Self {
        let window = Duration::from_secs(cfg.hostping_r2r_window_sec.max(1));
        R2rPlan {
            interval: Duration::from_millis(cfg.hostping_r2r_interval_ms.max(1)),
            timeout: Duration::from_millis(cfg.hostping_r2r_timeout_ms.max(1)),
            duration: window,
            window,
            timeout_th: cfg.hostping_timeout_th,
        }
    }

    /// Sets the Host kind's pacing for `n` RNICs: each RNIC probes once per interval, its
    /// n - 1 peers in turn (the paper picks a peer at random; in turn covers each equally).
    pub fn pace(&self, params: &mut DriverParams, n: usize) {
        let peers = n.saturating_sub(1).max(1) as u64;
        let round_ns = (self.interval.as_nanos() as u64).saturating_mul(peers);
        params.host_round_ns = round_ns.max(1);
        params.host_rate = if n >= 2 { 1e9 / round_ns as f64 } else { 0.0 };
    }
}

/// One RNIC of the host as R2R sees it: device name and current address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRnic {
    pub device: String,
    pub endpoint: rpingmesh_verbs::Endpoint,
}

impl From<&rpingmesh_verbs::Transport> for HostRnic {
    fn from(t: &rpingmesh_verbs::Transport) -> Self {
        HostRnic {
            device: t.device_name().to_string(),
            endpoint: t.local(),
        }
    }
}

impl From<&RnicDriver> for HostRnic {
    fn from(d: &RnicDriver) -> Self {
        HostRnic {
            device: d.device_name().to_string(),
            endpoint: d.local(),
        }
    }
}

/// The Host targets of RNIC `me`: every other RNIC of the host.
pub fn r2r_targets(rnics: &[HostRnic], me: usize) -> Vec<ProbeTarget> {
    rnics
        .iter()
        .enumerate()
        .filter(|(j, _)| *j != me)
        .map(|(_, r)| {
            let mut t = ProbeTarget::new(
                r.endpoint.gid,
                r.endpoint.qpn,
                "hostping",
                PinglistKind::Host,
            );
            t.device_name = r.device.clone();
            t
        })
        .collect()
}

/// Counts R2R outcomes into the current window: `record` takes the outcomes of RNIC
/// `from`'s probes (a target that is no longer one of the host's RNICs, e.g. the old
/// address of a re-opened one, is not counted).
pub struct R2rCollector {
    names: Vec<String>,
    index: BTreeMap<(String, u32), usize>,
    window: R2rWindow,
}

impl R2rCollector {
    pub fn new(rnics: &[HostRnic]) -> Self {
        let names: Vec<String> = rnics.iter().map(|r| r.device.clone()).collect();
        let mut c = R2rCollector {
            window: R2rWindow::new(names.clone()),
            names,
            index: BTreeMap::new(),
        };
        c.set_rnics(rnics);
        c
    }

    /// Follows re-opened RNICs (their QPN changes; the names and order stay).
    pub fn set_rnics(&mut self, rnics: &[HostRnic]) {
        self.index = rnics
            .iter()
            .enumerate()
            .map(|(i, r)| ((format_gid(&r.endpoint.gid), r.endpoint.qpn), i))
            .collect();
    }

    pub fn record(&mut self, from: usize, o: &TargetOutcome) {
        let key = (o.target_gid.to_string(), o.target_qpn);
        if let Some(&to) = self.index.get(&key) {
            self.window
                .record(from, to, matches!(o.outcome.result, ProbeResult::Lost));
        }
    }

    /// Drains what each RNIC's channel holds (receiver `i` carries RNIC `i`'s outcomes).
    pub fn drain(&mut self, rxs: &mut [mpsc::UnboundedReceiver<TargetOutcome>]) {
        for (from, rx) in rxs.iter_mut().enumerate() {
            while let Ok(o) = rx.try_recv() {
                self.record(from, &o);
            }
        }
    }

    /// Closes the window: its counts and verdict; the next one starts empty.
    pub fn close(&mut self, timeout_th: f64) -> R2rWindowReport {
        let w = std::mem::replace(&mut self.window, R2rWindow::new(self.names.clone()));
        R2rWindowReport {
            probes: w.pairs.values().map(|p| p.0).sum(),
            timeouts: w.pairs.values().map(|p| p.1).sum(),
            findings: r2r::analyze(&w, timeout_th),
            timeout_rates: (0..self.names.len()).map(|i| w.timeout_rate(i)).collect(),
        }
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }
}

/// Runs R2R over opened RNICs: one agent driver per RNIC (the same scheduler, prober,
/// responder and transport as the running agent; no controller), each probing the
/// others with Host targets.
pub async fn r2r_run(
    opened: Vec<OpenedRnic>,
    mut params: DriverParams,
    plan: &R2rPlan,
) -> R2rReport {
    let n = opened.len();
    if n < 2 {
        return R2rReport {
            skipped: Some(format!("R2R needs two RNICs; {n} opened")),
            ..Default::default()
        };
    }
    plan.pace(&mut params, n);
    params.probe_timeout_ns = plan.timeout.as_nanos() as u64;
    let drivers: Vec<RnicDriver> = opened
        .into_iter()
        .map(|o| RnicDriver::new(o.endpoint, params.clone(), Metrics::disabled()))
        .collect();
    let rnics: Vec<HostRnic> = drivers.iter().map(HostRnic::from).collect();
    let mut collector = R2rCollector::new(&rnics);
    let mut handles = Vec::new();
    let mut rxs = Vec::new();
    for (i, d) in drivers.into_iter().enumerate() {
        let (tx, rx) = mpsc::unbounded_channel::<TargetOutcome>();
        handles.push(StaticDriver::spawn(
            d,
            Pinglists {
                host: r2r_targets(&rnics, i),
                ..Default::default()
            },
            None,
            Some(tx),
        ));
        rxs.push(rx);
    }
    tracing::info!(rnics = n, "{}", r2r::STARTED_LOG);
    // Window by window: each window's outcomes are drained when it ends (a probe sent
    // just before the end counts in the next, when its timeout fires).
    let mut windows = Vec::new();
    let started = tokio::time::Instant::now();
    let window = plan.window.max(Duration::from_millis(100));
    let mut end = started + window;
    loop {
        let last = end >= started + plan.duration;
        let until = if last { started + plan.duration } else { end };
        tokio::time::sleep_until(until).await;
        if last {
            // The probes still out get their timeout before the drivers stop.
            tokio::time::sleep(plan.timeout + Duration::from_millis(100)).await;
            for (h, _) in &handles {
                h.stop();
            }
        }
        collector.drain(&mut rxs);
        windows.push(collector.close(plan.timeout_th));
        if last {
            break;
        }
        end += window;
    }
    for (_, t) in handles {
        let _ = t.await;
    }
    R2rReport::of_windows(collector.names().to_vec(), windows)
}

impl R2rReport {
    /// The verdict is the last window's: what the host is like now.
    pub fn of_windows(rnics: Vec<String>, windows: Vec<R2rWindowReport>) -> Self {
        R2rReport {
            skipped: None,
            rnics,
            probes: windows.iter().map(|w| w.probes).sum(),
            timeouts: windows.iter().map(|w| w.timeouts).sum(),
            findings: windows
                .last()
                .map(|w| w.findings.clone())
                .unwrap_or_default(),
            windows,
        }
    }
}

/// One port's counters that [`hwmon::rates`] uses, opened once and re-read in place
/// (sysfs makes an attribute's text anew on each read at offset 0): a sample is one
/// pread per counter, not an open, a read and a close.
pub struct PortCounterFiles {
    device: String,
    port: u32,
    files: Vec<(String, std::fs::File)>,
}

impl PortCounterFiles {
    /// Opens what exists of the used counters (none: an empty sample, not an error).
    pub fn open(fs: &RealSysfs, device: &str, port: u32) -> Self {
        let mut files = Vec::new();
        for sub in ["counters", "hw_counters"] {
            let dir = format!("/sys/class/infiniband/{device}/ports/{port}/{sub}");
            for name in fs.list(&dir).unwrap_or_default() {
                if hwmon::is_used(&name) {
                    if let Ok(f) = std::fs::File::open(fs.map(&format!("{dir}/{name}"))) {
                        files.push((name, f));
                    }
                }
            }
        }
        Self {
            device: device.to_string(),
            port,
            files,
        }
    }

    pub fn sample(&self) -> PortCounters {
        use std::os::unix::fs::FileExt;
        let mut counters = std::collections::BTreeMap::new();
        let mut buf = [0u8; 32];
        for (name, f) in &self.files {
            if let Ok(n) = f.read_at(&mut buf, 0) {
                if let Some(v) = std::str::from_utf8(&buf[..n])
                    .ok()
                    .and_then(|t| t.trim().parse::<u64>().ok())
                {
                    counters.insert(name.clone(), v);
                }
            }
        }
        PortCounters {
            device: self.device.clone(),
            port: self.port,
            counters,
        }
    }
}

/// Samples every port's counters once per `period` until `stop` says so; returns the
/// last rates of each port.
pub async fn hw_monitor(
    fs: &RealSysfs,
    ports: &[(String, u32)],
    period: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<PortRates> {
    let files: Vec<PortCounterFiles> = ports
        .iter()
        .map(|(d, p)| PortCounterFiles::open(fs, d, *p))
        .collect();
    let mut prev: Vec<PortCounters> = files.iter().map(PortCounterFiles::sample).collect();
    let mut at = std::time::Instant::now();
    let mut last = vec![PortRates::default(); ports.len()];
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => break,
        }
        let cur: Vec<PortCounters> = files.iter().map(PortCounterFiles::sample).collect();
        let secs = at.elapsed().as_secs_f64();
        at = std::time::Instant::now();
        last = prev
            .iter()
            .zip(&cur)
            .map(|(a, b)| hwmon::rates(a, b, secs))
            .collect();
        prev = cur;
    }
    last
}

/// The text an operator reads.
pub fn render(r: &HostReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "host {}", r.hostname);
    let downgraded: BTreeMap<String, &LinkDowngrade> = r
        .downgrades
        .iter()
        .map(|d| (format!("pcie:{}", d.bdf), d))
        .collect();
    let state =
        |key: &str| -> Option<String> { downgraded.get(key).map(|_| "DOWNGRADED".to_string()) };
    out.push_str(&r.topology.render(&state));
    let _ = writeln!(
        out,
        "PCIe links: {}",
        if r.downgrades.is_empty() {
            "every link at its best".to_string()
        } else {
            format!("{} below their best", r.downgrades.len())
        }
    );
    for p in &r.ports {
        let g = |v: Option<f64>| v.map_or("?".into(), |x| format!("{x:.2}"));
        let _ = writeln!(
            out,
            "counters {} port {}: tx {} Gb/s, rx {} Gb/s, tx pause {}, drops {:.1}/s",
            p.device,
            p.port,
            g(p.rates.tx_gbps),
            g(p.rates.rx_gbps),
            p.rates
                .tx_pause_ratio
                .map_or("n/a".into(), |x| format!("{:.1}%", x * 100.0)),
            p.rates.drops_per_sec
        );
    }
    let _ = writeln!(out, "mode: {:?}", r.mode);
    match &r.r2r.skipped {
        Some(why) => {
            let _ = writeln!(out, "R2R: skipped ({why})");
        }
        None => {
            let _ = writeln!(
                out,
                "R2R: {} RNICs ({}), {} probes, {} timed out",
                r.r2r.rnics.len(),
                r.r2r.rnics.join(", "),
                r.r2r.probes,
                r.r2r.timeouts
            );
            for (k, w) in r.r2r.windows.iter().enumerate() {
                let found: Vec<String> = w.findings.iter().map(describe_r2r).collect();
                let _ = writeln!(
                    out,
                    "  window {}: {} probes, {} timed out{}",
                    k + 1,
                    w.probes,
                    w.timeouts,
                    if found.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", found.join("; "))
                    }
                );
            }
        }
    }
    match &r.loopback.skipped {
        Some(why) => {
            let _ = writeln!(out, "loopback: skipped ({why})");
        }
        None => {
            let _ = writeln!(out, "loopback: {} paths", r.loopback.paths.len());
            if let Some(why) = &r.loopback.gpu_skipped {
                let _ = writeln!(out, "  GPU endpoints not tested: {why}");
            }
            for p in &r.loopback.paths {
                let _ = writeln!(
                    out,
                    "  {} -> {}: {:.1} us, {} Gb/s{}",
                    p.rnic,
                    p.endpoint,
                    p.host_latency_us,
                    p.bandwidth_gbps.map_or("?".into(), |g| format!("{g:.2}")),
                    if p.abnormal { "  ABNORMAL" } else { "" }
                );
            }
        }
    }
    if r.problems.is_empty() {
        let _ = writeln!(out, "verdict: OK");
    } else {
        let _ = writeln!(out, "verdict: PROBLEM");
        for p in &r.problems {
            let _ = writeln!(out, "  - {p}");
        }
    }
    out
}

#[cfg(all(test, feature = "rdma"))]
mod tests {
    use super::*;
    use rpingmesh_hostping::linkstate::LinkStateInference;

    /// The paper's Figure 2 host (8 GPUs, 4 RNICs) on a machine with neither the NVIDIA
    /// driver nor those RNICs: the GPU endpoints are left out with the driver's one line,
    /// the memory endpoints are tried and each failure is the verb error it is.
    #[test]
    fn gpu_endpoints_without_the_driver_are_noted_not_failed() {
        let path = format!(
            "{}/../hostping/fixtures/figure2.sysfs",
            env!("CARGO_MANIFEST_DIR")
        );
        let rec = Recording::parse(&std::fs::read_to_string(path).unwrap()).unwrap();
        let topo = HostTopology::discover(&rec).unwrap();
        assert!(
            topo.pci.iter().any(|d| d.vendor == 0x10de),
            "GPUs in the tree"
        );
        let cfg = AgentConfig {
            transport: Transport::Rdma,
            ..AgentConfig::default()
        };
        let mut inf = LinkStateInference::new();
        let r = loopback_tests(&cfg, &topo, HostMode::Idle, &mut inf);
        if rpingmesh_verbs::rdma::gpu::Cuda::load().is_ok() {
            return; // a GPU host: this is about hosts without the driver
        }
        let why = r.gpu_skipped.clone().expect("GPU endpoints noted");
        assert!(why.contains("libcuda.so.1 cannot be loaded"), "{why}");
        // Every RNIC x NUMA node was tried (idle: the full mesh), none x GPU.
        let tried: std::collections::BTreeSet<&str> =
            r.verbs.iter().map(|(rnic, _, _)| rnic.as_str()).collect();
        assert_eq!(tried.len(), topo.rnics.len(), "{:?}", r.verbs);
        assert_eq!(r.verbs.len(), topo.rnics.len() * topo.numa_nodes.len());
        assert!(r.verbs.iter().all(|(_, v, _)| v.starts_with("FAILED: ")));
        assert!(render_loopback_line(&r).contains("GPU endpoints not tested"));
    }

    fn render_loopback_line(l: &LoopbackReport) -> String {
        let r = HostReport {
            hostname: "h".into(),
            topology: HostTopology::default(),
            downgrades: vec![],
            ports: vec![],
            mode: HostMode::Idle,
            r2r: R2rReport::default(),
            loopback: l.clone(),
            problems: vec![],
            findings: vec![],
        };
        render(&r)
    }
}
