//! Hostping inside the running agent (`hostping_enabled`): what `hostping --once` checks,
//! kept up for as long as the agent runs.
//!
//! - R2R: every driver also probes the host's other RNICs (Host targets beside the
//!   controller's lists, paced by `hostping_r2r_interval_ms`); their outcomes come here
//!   and are judged per `hostping_r2r_window_sec` window.
//! - The hardware monitor samples the RNIC counters every `hostping_monitor_interval_ms`
//!   and sets the host's mode (idle / busy / abnormal).
//! - The host check (tree, PCIe links, port states, loopback tests) runs every
//!   `hostping_check_interval_sec`, and at once when the host turns idle (time for the
//!   full mesh) or abnormal (look at the affinitive paths now).
//! - The host's findings go to the controller after each check and whenever the set of
//!   findings changes; gauges go to the agent's metrics.
//!
//! Judging is `rpingmesh-hostping` and `HostReport::judge` (pure); this task only
//! schedules and gathers. It never stops the agent: a tree it cannot read, a controller
//! that does not answer or a loopback test that fails is logged and reported.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use opentelemetry::metrics::{Gauge, Meter};
use opentelemetry::KeyValue;
use rpingmesh_hostping::hwmon::{self, PortCounters, PortRates};
use rpingmesh_hostping::linkstate::LinkStateInference;
use rpingmesh_hostping::loopback::HostMode;
use rpingmesh_hostping::sysfs::RealSysfs;
use rpingmesh_hostping::topology::HostTopology;
use tokio::sync::{mpsc, watch};

use crate::config::AgentConfig;
use crate::controller_client::ControllerClient;
use crate::hostping::{
    loopback_tests, mode_thresholds, send_report_with, HostReport, HostRnic, LoopbackReport,
    PortCounterFiles, PortReport, R2rCollector, R2rPlan, R2rReport,
};
use crate::rnic::TargetOutcome;
use crate::targets::Pinglists;

/// Shortest gap between two checks that a mode change triggers.
const MIN_TRIGGER_GAP: Duration = Duration::from_secs(30);

/// What the monitor listens to.
pub struct HostMonitorIo {
    /// The host's RNICs with their current addresses (a re-opened RNIC changes its QPN).
    pub rnics: watch::Receiver<Vec<HostRnic>>,
    /// RNIC `i`'s Host-target outcomes.
    pub outcomes: Vec<mpsc::UnboundedReceiver<TargetOutcome>>,
    /// None: nothing is reported (analysis off, or no controller).
    pub client: Option<ControllerClient>,
    pub meter: Meter,
    pub shutdown: watch::Receiver<bool>,
    /// Where sysfs is (`RealSysfs::host()`; benches and tests give a tree of their own).
    pub sysfs: RealSysfs,
}

/// Gauges with host-level attributes (`hostname`, and `device`/`port`/`kind`).
struct HostGauges {
    hostname: String,
    r2r_timeout_ratio: Gauge<f64>,
    throughput: Gauge<f64>,
    tx_pause: Gauge<f64>,
    mode: Gauge<u64>,
    findings: Gauge<u64>,
    /// Kinds reported before: set back to 0 when they clear.
    kinds_seen: BTreeSet<String>,
}

impl HostGauges {
    fn new(meter: &Meter, hostname: &str) -> Self {
        HostGauges {
            hostname: hostname.to_string(),
            r2r_timeout_ratio: meter
                .f64_gauge("rpingmesh.hostping.r2r_timeout_ratio")
                .with_description("Share of the last R2R window's probes from or to this RNIC that timed out")
                .build(),
            throughput: meter
                .f64_gauge("rpingmesh.hostping.rnic_throughput_gbps")
                .with_description("RNIC port throughput over the last counter sample")
                .build(),
            tx_pause: meter
                .f64_gauge("rpingmesh.hostping.rnic_tx_pause_ratio")
                .with_description("Share of the last counter sample the port spent paused (PFC), where the driver exposes it")
                .build(),
            mode: meter
                .u64_gauge("rpingmesh.hostping.host_mode")
                .with_description("0 idle, 1 busy, 2 abnormal (Tx pause over hostping_pfc_high)")
                .build(),
            findings: meter
                .u64_gauge("rpingmesh.hostping.findings")
                .with_description("The host's open Hostping findings by kind")
                .build(),
            kinds_seen: BTreeSet::new(),
        }
    }

    fn host(&self) -> KeyValue {
        KeyValue::new("hostname", self.hostname.clone())
    }

    fn ports(&mut self, ports: &[PortReport]) {
        for p in ports {
            let at = |extra: Option<(&'static str, &'static str)>| {
                let mut a = vec![
                    self.host(),
                    KeyValue::new("device", p.device.clone()),
                    KeyValue::new("port", i64::from(p.port)),
                ];
                if let Some((k, v)) = extra {
                    a.push(KeyValue::new(k, v));
                }
                a
            };
            if let Some(g) = p.rates.tx_gbps {
                self.throughput.record(g, &at(Some(("direction", "tx"))));
            }
            if let Some(g) = p.rates.rx_gbps {
                self.throughput.record(g, &at(Some(("direction", "rx"))));
            }
            if let Some(r) = p.rates.tx_pause_ratio {
                self.tx_pause.record(r, &at(None));
            }
        }
    }

    fn mode(&self, mode: HostMode) {
        let v = match mode {
            HostMode::Idle => 0,
            HostMode::Busy => 1,
            HostMode::Abnormal => 2,
        };
        self.mode.record(v, &[self.host()]);
    }

    fn r2r(&self, names: &[String], rates: &[Option<f64>]) {
        for (name, rate) in names.iter().zip(rates) {
            if let Some(r) = rate {
                self.r2r_timeout_ratio
                    .record(*r, &[self.host(), KeyValue::new("device", name.clone())]);
            }
        }
    }

    fn findings(&mut self, report: &HostReport) {
        let mut count: BTreeMap<String, u64> = BTreeMap::new();
        for f in &report.findings {
            *count.entry(f.kind.clone()).or_default() += 1;
        }
        self.kinds_seen.extend(count.keys().cloned());
        for kind in &self.kinds_seen {
            let n = count.get(kind).copied().unwrap_or(0);
            self.findings
                .record(n, &[self.host(), KeyValue::new("kind", kind.clone())]);
        }
    }
}

/// The RNIC ports of the tree, their counter files and line rates.
fn open_ports(fs: &RealSysfs, topo: &HostTopology) -> Vec<(PortCounterFiles, Option<f64>)> {
    topo.rnics
        .iter()
        .flat_map(|r| {
            r.ports
                .iter()
                .map(move |p| (PortCounterFiles::open(fs, &r.name, p.port), p.rate_gbps))
        })
        .collect()
}

fn discover(fs: &RealSysfs) -> HostTopology {
    match HostTopology::discover(fs) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, "hostping: cannot read the host tree; R2R and the counters go on");
            HostTopology::default()
        }
    }
}

/// The set a report is re-sent on: what is wrong and where.
fn signature(r: &HostReport) -> BTreeSet<(String, String)> {
    r.findings
        .iter()
        .map(|f| (f.kind.clone(), f.location.clone()))
        .collect()
}

/// Runs until shutdown.
pub async fn run(cfg: Arc<AgentConfig>, mut io: HostMonitorIo) {
    let fs = io.sysfs.clone();
    let plan = R2rPlan::from_config(&cfg);
    let mut gauges = HostGauges::new(&io.meter, &cfg.hostname);
    let mut topology = discover(&fs);
    let mut ports = open_ports(&fs, &topology);
    let mut prev: Vec<PortCounters> = ports.iter().map(|(f, _)| f.sample()).collect();
    let mut prev_at = Instant::now();
    let mut mode = HostMode::Busy;
    let mut collector = R2rCollector::new(&io.rnics.borrow_and_update());
    let mut r2r = R2rReport {
        skipped: (io.outcomes.len() < 2)
            .then(|| format!("R2R needs two RNICs; the agent has {}", io.outcomes.len())),
        rnics: collector.names().to_vec(),
        ..Default::default()
    };
    let mut loopback = LoopbackReport {
        skipped: Some("the first host check has not run yet".into()),
        ..Default::default()
    };
    let mut inference = Some(LinkStateInference::new());
    let mut loopback_job: Option<tokio::task::JoinHandle<(LoopbackReport, LinkStateInference)>> =
        None;
    let started = tokio::time::Instant::now();
    let mut window_end = started + plan.window;
    // The first check waits for the first R2R verdict, so that its report has one.
    let mut next_check = window_end + plan.timeout;
    let mut last_check: Option<tokio::time::Instant> = None;
    let mut sent: Option<BTreeSet<(String, String)>> = None;
    let mut report_due = false;
    let mut check_done = false;
    let mut tick = tokio::time::interval(Duration::from_millis(cfg.hostping_monitor_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tracing::info!(
        rnics = collector.names().len(),
        ports = ports.len(),
        window_sec = plan.window.as_secs(),
        check_sec = cfg.hostping_check_interval_sec,
        "hostping monitor started"
    );
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = io.shutdown.wait_for(|s| *s) => break,
            done = async { loopback_job.as_mut().expect("guarded").await }, if loopback_job.is_some() => {
                loopback_job = None;
                match done {
                    Ok((l, inf)) => {
                        loopback = l;
                        inference = Some(inf);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "hostping: the loopback tests ended abnormally");
                        inference = Some(LinkStateInference::new());
                    }
                }
                report_due = true;
                check_done = true;
            }
        }
        let now = tokio::time::Instant::now();
        // R2R outcomes, following re-opened RNICs.
        if io.rnics.has_changed().unwrap_or(false) {
            collector.set_rnics(&io.rnics.borrow_and_update());
        }
        collector.drain(&mut io.outcomes);
        if now >= window_end && r2r.skipped.is_none() {
            let w = collector.close(plan.timeout_th);
            gauges.r2r(collector.names(), &w.timeout_rates);
            r2r = R2rReport::of_windows(collector.names().to_vec(), vec![w]);
            window_end += plan.window;
            if window_end <= now {
                window_end = now + plan.window;
            }
            report_due = true;
        }
        // Counters: rates since the last sample, and the mode they put the host in.
        let cur: Vec<PortCounters> = ports.iter().map(|(f, _)| f.sample()).collect();
        let secs = prev_at.elapsed().as_secs_f64().max(1e-3);
        prev_at = Instant::now();
        let rates: Vec<(PortRates, Option<f64>)> = prev
            .iter()
            .zip(&cur)
            .zip(&ports)
            .map(|((a, b), (_, line))| (hwmon::rates(a, b, secs), *line))
            .collect();
        let port_reports: Vec<PortReport> = cur
            .iter()
            .zip(&rates)
            .map(|(c, (r, _))| PortReport {
                device: c.device.clone(),
                port: c.port,
                rates: *r,
            })
            .collect();
        prev = cur;
        gauges.ports(&port_reports);
        let was = mode;
        if !rates.is_empty() {
            mode = hwmon::host_mode(&rates, mode_thresholds(&cfg));
        }
        gauges.mode(mode);
        let turned = mode != was && matches!(mode, HostMode::Idle | HostMode::Abnormal);
        // Only after the first, scheduled check: that one waits for the first R2R verdict,
        // and the mode turns from its initial Busy at the first counter sample anyway
        // (a trigger then reported loopback results with an empty R2R part).
        let gap_ok = last_check.is_some_and(|t| now.duration_since(t) >= MIN_TRIGGER_GAP);
        if loopback_job.is_none() && (now >= next_check || (turned && gap_ok)) {
            if turned && now < next_check {
                tracing::info!(mode = ?mode, "hostping: the host's mode changed; checking it now");
            }
            last_check = Some(now);
            next_check = now + Duration::from_secs(cfg.hostping_check_interval_sec);
            let fresh = discover(&fs);
            if fresh.rnics != topology.rnics {
                ports = open_ports(&fs, &fresh);
                prev = ports.iter().map(|(f, _)| f.sample()).collect();
                prev_at = Instant::now();
            }
            topology = fresh;
            let (c, t, inf) = (cfg.clone(), topology.clone(), inference.take());
            let mut inf = inf.unwrap_or_default();
            loopback_job = Some(tokio::task::spawn_blocking(move || {
                let l = loopback_tests(&c, &t, mode, &mut inf);
                (l, inf)
            }));
        }
        if report_due {
            report_due = false;
            let report = HostReport::judge(
                &cfg,
                topology.clone(),
                port_reports.clone(),
                mode,
                r2r.clone(),
                loopback.clone(),
            );
            gauges.findings(&report);
            let sig = signature(&report);
            // Sent when the findings change, and after each check (the controller's view
            // then carries the latest tree and loopback results even when all is well).
            let changed = sent.as_ref() != Some(&sig);
            if changed {
                log_changes(sent.as_ref(), &sig);
            }
            if changed || std::mem::take(&mut check_done) {
                if let Some(client) = &io.client {
                    match send_report_with(client, &cfg, &report).await {
                        Ok(()) => sent = Some(sig),
                        Err(e) if e.is_unsupported() => {
                            tracing::info!("the controller takes no host reports (a Go controller?); Hostping goes on locally (logs and metrics)");
                            io.client = None;
                            sent = Some(sig);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "hostping: report to the controller failed; retried at the next change or check");
                            sent = None;
                        }
                    }
                } else {
                    sent = Some(sig);
                }
            }
        }
    }
    if let Some(job) = loopback_job {
        job.abort();
    }
}

fn log_changes(before: Option<&BTreeSet<(String, String)>>, now: &BTreeSet<(String, String)>) {
    let empty = BTreeSet::new();
    let before = before.unwrap_or(&empty);
    for (kind, at) in now.difference(before) {
        tracing::warn!(kind = %kind, location = %at, "hostping: finding opened");
    }
    for (kind, at) in before.difference(now) {
        tracing::info!(kind = %kind, location = %at, "hostping: finding resolved");
    }
}

/// The Host targets of each RNIC, published beside the controller's lists: forwards the
/// cluster monitor's lists for RNIC `me` to its driver with the host's other RNICs added,
/// again whenever either changes.
pub async fn merge_host_targets(
    me: usize,
    mut cluster: watch::Receiver<Arc<Pinglists>>,
    mut rnics: watch::Receiver<Vec<HostRnic>>,
    to_driver: watch::Sender<Arc<Pinglists>>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let mut lists = (**cluster.borrow_and_update()).clone();
        lists.host = crate::hostping::r2r_targets(&rnics.borrow_and_update(), me);
        to_driver.send_if_modified(|cur| {
            if **cur == lists {
                false
            } else {
                *cur = Arc::new(lists);
                true
            }
        });
        tokio::select! {
            r = cluster.changed() => if r.is_err() { return },
            r = rnics.changed() => if r.is_err() { return },
            _ = shutdown.wait_for(|s| *s) => return,
        }
    }
}
