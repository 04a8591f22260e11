//! RNIC-to-RNIC probing inside one host: the plan (who probes whom), the targets, the
//! collector of outcomes per window, the one-shot run with one driver per RNIC and its
//! report.

use super::*;

pub(super) fn describe_r2r(f: &R2rFinding) -> String {
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
pub(super) async fn r2r_probe(cfg: &AgentConfig, args: &HostpingArgs) -> R2rReport {
    let opened: Result<Vec<OpenedRnic>, String> = match cfg.transport {
        Transport::Udp => open::bind_udp(cfg)
            .map(|eps| eps.into_iter().map(OpenedRnic::from).collect())
            .map_err(|e| e.to_string()),
        Transport::Rdma => open::open_rdma(cfg).map_err(|e| e.to_string()),
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
    pub(super) names: Vec<String>,
    pub(super) index: BTreeMap<(String, u32), usize>,
    pub(super) window: R2rWindow,
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
