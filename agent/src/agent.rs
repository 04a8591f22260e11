//! Agent lifecycle: open the RNICs (udp pseudo-RNICs or rdma devices), register, start
//! one driver and one cluster monitor per RNIC plus the reporter; stop them in order on
//! shutdown. An rdma RNIC whose transport fails is re-opened with back-off and
//! registered again (its QPN changes); the others keep running.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rpingmesh_verbs::rdma::{self};
use rpingmesh_verbs::Transport;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::cluster_monitor::{
    monitored_kinds, run_cluster_monitor, run_heartbeat, MonitorParams, Registrar,
};
use crate::config::{AgentConfig, ServiceTracingMode};
use crate::controller_client::{registration_request, ControllerClient, LocalRnic};
use crate::host_monitor;
use crate::hostping::{HostRnic, R2rPlan};
use crate::open::OpenedRnic;
use crate::reopen::{ReopenStep, Reopener};
use crate::report;
use crate::rnic::{DriverExit, DriverIo, DriverParams, DriverStats, RnicDriver};
use crate::service::{self, FlowReporterParams, LocalDevice, ServiceNames};
use crate::targets::Pinglists;
use crate::telemetry::Metrics;
use crate::watchdog::SharedMultiplier;
use crate::workload::host::RealHost;
use crate::workload::WorkloadResolver;

/// Summaries buffered between the drivers and the reporter before new ones are dropped.
const REPORT_QUEUE: usize = 8192;

pub struct RunningAgent {
    shutdown: watch::Sender<bool>,
    drivers: Vec<JoinHandle<()>>,
    monitors: Vec<JoinHandle<()>>,
    reporter: Option<JoinHandle<()>>,
    flow_reporter: Option<JoinHandle<()>>,
    pub stats: Vec<Arc<DriverStats>>,
    pub registrar: Arc<Registrar>,
    /// The probe-rate multiplier every driver follows (Some when self_protection_enabled):
    /// the watchdog writes it.
    pub rate_multiplier: Option<SharedMultiplier>,
    #[cfg(feature = "rdma")]
    rc_prober: Option<crate::rc_probe::poller::RcProber>,
}

/// Starts everything on the current runtime. Returns at once: the controller is contacted
/// in the background, and the responders answer from the first moment.
pub fn start<R: Into<OpenedRnic>>(
    cfg: &AgentConfig,
    endpoints: Vec<R>,
    metrics: Metrics,
) -> anyhow::Result<RunningAgent> {
    let endpoints: Vec<OpenedRnic> = endpoints.into_iter().map(Into::into).collect();
    let client = ControllerClient::connect_lazy(cfg)?;
    let rnics: Vec<LocalRnic> = endpoints.iter().map(|r| local_rnic(&r.endpoint)).collect();
    let registrar = Arc::new(Registrar::new(
        client.clone(),
        registration_request(cfg, &rnics),
    ));
    let seq_epoch: u32 = rand::random();
    let (shutdown_tx, _) = watch::channel(false);

    // The controller's FOCUS generation, as the reporter last heard it in an ack.
    let (focus_tx, focus_rx) = watch::channel(0u64);
    let (sink, reporter) = if cfg.analysis_report_enabled {
        let (sink, rx) = report::channel(REPORT_QUEUE);
        let task = tokio::spawn(report::run_reporter(
            client.clone(),
            cfg.agent_id.clone(),
            rx,
            cfg.report_batch_max,
            focus_tx,
            cfg.focus_probe_rate_per_second > 0.0,
        ));
        (Some(sink), Some(task))
    } else {
        (None, None)
    };

    // Service tracing: the tracer resolves local GIDs over this agent's own RNICs only.
    let devices: std::collections::HashMap<String, LocalDevice> = endpoints
        .iter()
        .zip(&rnics)
        .map(|(ep, r)| {
            let d = match &ep.endpoint {
                Transport::Udp(_) => LocalDevice::Udp { gid: r.gid },
                Transport::Rdma(_) => LocalDevice::Rdma,
            };
            (r.device_name.clone(), d)
        })
        .collect();
    let (kick_tx, kick_rx) = watch::channel(0u64);
    // Loading the eBPF programs parses the kernel's BTF and takes from a fraction of a
    // second to many (a slow or loaded host): probing and registration never wait for it.
    let flow_reporter = if cfg.service_tracing_mode == ServiceTracingMode::Off {
        tracing::info!("service tracing off (service_tracing_mode: off)");
        None
    } else {
        let tracer_cfg = cfg.clone();
        let (client, registrar, metrics) = (client.clone(), registrar.clone(), metrics.clone());
        let params = FlowReporterParams {
            agent_id: cfg.agent_id.clone(),
            interval: Duration::from_millis(cfg.service_flow_report_interval_ms),
            names: ServiceNames::new(cfg.service_names.clone()),
            workloads: WorkloadResolver::new(RealHost::new(
                &cfg.workload_kubelet_dir,
                &cfg.workload_scontrol,
            )),
        };
        let shutdown = shutdown_tx.subscribe();
        Some(tokio::spawn(async move {
            let started =
                tokio::task::spawn_blocking(move || service::start_tracer(&tracer_cfg, devices))
                    .await;
            // The kernel BTF parse is start-up's largest transient.
            crate::resident::trim();
            if let Ok(Some(tracer)) = started {
                service::run_flow_reporter(
                    tracer, client, registrar, params, metrics, kick_tx, shutdown,
                )
                .await;
            }
        }))
    };

    let mut base_params = DriverParams::from_config(cfg, seq_epoch);
    let rate_multiplier = cfg.self_protection_enabled.then(SharedMultiplier::default);
    base_params.rate_multiplier = rate_multiplier.clone();
    let mut drivers = Vec::new();
    let mut monitors = Vec::new();
    let mut pending_monitors = Vec::new();
    let mut stats = Vec::new();
    // Hostping: the host's RNICs probe each other (Host targets merged into each driver's
    // lists) and a monitor task judges the outcomes, the counters and the host check.
    let hostping = cfg.hostping_enabled && !cfg.responder_only;
    let host_rnics: Vec<HostRnic> = endpoints
        .iter()
        .map(|e| HostRnic::from(&e.endpoint))
        .collect();
    let (host_rnics_tx, host_rnics_rx) = watch::channel(host_rnics);
    let host_rnics_tx = Arc::new(host_rnics_tx);
    let mut host_outcome_rxs = Vec::new();
    if hostping {
        R2rPlan::from_config(cfg).pace(&mut base_params, endpoints.len());
    }
    let on_rdma = endpoints
        .iter()
        .any(|e| matches!(e.endpoint, Transport::Rdma(_)));
    let mut ring_lists = Vec::new();
    for (i, (ep, rnic)) in endpoints.into_iter().zip(&rnics).enumerate() {
        let gid = rpingmesh_proto::gid::format_gid(&rnic.gid);
        let tor = cfg.tor_of(&rnic.device_name).to_string();
        let (ptx, prx) = watch::channel(Arc::new(Pinglists::default()));
        ring_lists.push(prx.clone());
        let mut host_outcomes = None;
        if hostping {
            // The cluster monitor publishes into `ctx`; the merge adds the Host targets.
            let (ctx, crx) = watch::channel(Arc::new(Pinglists::default()));
            monitors.push(tokio::spawn(host_monitor::merge_host_targets(
                i,
                crx,
                host_rnics_rx.clone(),
                ptx,
                shutdown_tx.subscribe(),
            )));
            pending_monitors.push((gid.clone(), tor.clone(), ctx));
            let (htx, hrx) = tokio::sync::mpsc::unbounded_channel();
            host_outcomes = Some(htx);
            host_outcome_rxs.push(hrx);
        } else {
            pending_monitors.push((gid.clone(), tor.clone(), ptx));
        }
        let driver_stats = Arc::new(DriverStats::default());
        stats.push(driver_stats.clone());
        drivers.push(tokio::spawn(supervise_rnic(
            ep,
            DriverParams {
                source_tor: tor,
                ..base_params.clone()
            },
            metrics.clone(),
            driver_stats,
            DriverIo {
                pinglists: prx,
                shutdown: shutdown_tx.subscribe(),
                reports: sink.clone(),
                outcomes: None,
                host_outcomes,
            },
            registrar.clone(),
            hostping.then(|| (i, host_rnics_tx.clone())),
        )));
        tracing::info!(device = %rnic.device_name, gid = %gid, qpn = rnic.qpn, ip = %rnic.ip_address, "rnic ready");
    }
    #[cfg(feature = "rdma")]
    let rc_prober = start_rc_prober(cfg, on_rdma, &rnics, ring_lists, sink.clone(), &metrics);
    #[cfg(not(feature = "rdma"))]
    let _ = (on_rdma, ring_lists);
    drop(sink);
    tracing::info!(
        agent_id = %cfg.agent_id,
        tor_id = %cfg.tor_id,
        controller = %cfg.controller_addr,
        rnics = ?rnics.iter().map(|r| format!("{}/{}#{}", r.device_name, rpingmesh_proto::gid::format_gid(&r.gid), r.qpn)).collect::<Vec<_>>(),
        responder_only = cfg.responder_only,
        "agent started"
    );
    // Monitors start after the "agent started" line so that a controller error follows it.
    for (gid, tor, ptx) in pending_monitors {
        monitors.push(tokio::spawn(run_cluster_monitor(
            registrar.clone(),
            client.clone(),
            MonitorParams {
                agent_id: cfg.agent_id.clone(),
                tor_id: tor,
                requester_gid: gid,
                update_interval: Duration::from_secs(cfg.pinglist_update_interval_sec),
                // SERVICE lists exist for this agent only while it reports flows; with
                // tracing configured off there is nothing to fetch.
                kinds: monitored_kinds(cfg.service_tracing_mode != ServiceTracingMode::Off),
                service_kick: Some(kick_rx.clone()),
                focus_kick: Some(focus_rx.clone()),
            },
            ptx,
            shutdown_tx.subscribe(),
        )));
    }
    monitors.push(tokio::spawn(run_heartbeat(
        registrar.clone(),
        shutdown_tx.subscribe(),
    )));
    monitors.push(tokio::spawn(crate::resident::trim_periodically()));
    if hostping {
        monitors.push(tokio::spawn(host_monitor::run(
            Arc::new(cfg.clone()),
            host_monitor::HostMonitorIo {
                rnics: host_rnics_rx,
                outcomes: host_outcome_rxs,
                client: Some(client.clone()),
                meter: metrics.meter().clone(),
                shutdown: shutdown_tx.subscribe(),
                sysfs: rpingmesh_hostping::sysfs::RealSysfs::host(),
            },
        )));
    }
    Ok(RunningAgent {
        shutdown: shutdown_tx,
        drivers,
        monitors,
        reporter,
        flow_reporter,
        stats,
        registrar,
        rate_multiplier,
        #[cfg(feature = "rdma")]
        rc_prober,
    })
}

/// RC ring probing on the rdma transport (`rc_ring_pinglists` non-empty). A failure to
/// listen (the port taken) turns it off with one warning: UD probing goes on.
#[cfg(feature = "rdma")]
fn start_rc_prober(
    cfg: &AgentConfig,
    on_rdma: bool,
    rnics: &[LocalRnic],
    lists: Vec<watch::Receiver<Arc<Pinglists>>>,
    sink: Option<report::ReportSink>,
    metrics: &Metrics,
) -> Option<crate::rc_probe::poller::RcProber> {
    use crate::rc_probe::{poller, RcProbeParams};
    let params = RcProbeParams::from_config(cfg)?;
    if !on_rdma {
        tracing::info!("rc ring probing off: it needs transport: rdma");
        return None;
    }
    let locals = rnics
        .iter()
        .filter_map(|r| {
            Some(poller::LocalRnic {
                ip: r.ip_address.parse().ok()?,
                gid: rpingmesh_proto::gid::format_gid(&r.gid),
                tor: cfg.tor_of(&r.device_name).to_string(),
            })
        })
        .collect::<Vec<_>>();
    if locals.len() != rnics.len() {
        tracing::warn!("rc ring probing off: an RNIC has no IP address to listen on");
        return None;
    }
    // A responder-only agent still answers its peers' rings; it opens none itself.
    let lists = if cfg.responder_only {
        Vec::new()
    } else {
        lists
    };
    match poller::RcProber::start(params.clone(), locals, lists, sink, metrics.clone()) {
        Ok(p) => {
            tracing::info!(
                port = params.port,
                pinglists = ?cfg.rc_ring_pinglists,
                max_rings = params.max_rings,
                "rc ring probing on"
            );
            Some(p)
        }
        Err(e) => {
            tracing::warn!("rc ring probing off: {e:#}");
            None
        }
    }
}

fn local_rnic(ep: &Transport) -> LocalRnic {
    LocalRnic {
        gid: ep.local().gid,
        qpn: ep.local().qpn,
        ip_address: ep.ip_string(),
        device_name: ep.device_name().to_string(),
    }
}

/// Runs one RNIC's driver; after a transport failure re-opens the device with back-off
/// (`Reopener` decides), re-registers when its address changed, and runs a new driver
/// on the same pinglists, shutdown signal and counters.
async fn supervise_rnic(
    rnic: OpenedRnic,
    params: DriverParams,
    metrics: Metrics,
    stats: Arc<DriverStats>,
    mut io: DriverIo,
    registrar: Arc<Registrar>,
    host_slot: Option<(usize, Arc<watch::Sender<Vec<HostRnic>>>)>,
) {
    let OpenedRnic {
        mut endpoint,
        reopen,
    } = rnic;
    let mut reopener = Reopener::default();
    loop {
        let old = endpoint.local();
        let device = endpoint.device_name().to_string();
        let started = Instant::now();
        let exit = RnicDriver::new(endpoint, params.clone(), metrics.clone())
            .with_stats(stats.clone())
            .run_until(&mut io)
            .await;
        let failed = match &exit {
            DriverExit::Shutdown => false,
            DriverExit::TransportFailed(e) => {
                tracing::error!(device = %device, error = %e, "transport failed");
                true
            }
        };
        let Some(opts) = &reopen else {
            if failed {
                tracing::error!(device = %device, "this transport cannot be re-opened; the RNIC stopped probing");
            }
            return;
        };
        let mut step = reopener.on_driver_exit(failed, started.elapsed());
        endpoint = loop {
            let ReopenStep::Wait(delay) = step else {
                return;
            };
            tracing::info!(device = %device, delay_ms = delay.as_millis() as u64, attempt = reopener.attempts(), "re-opening the RNIC after back-off");
            if sleep_or_shutdown(&mut io.shutdown, delay).await {
                return;
            }
            match rdma::open_rdma_with(opts) {
                Ok(ep) => break Transport::Rdma(ep),
                Err(e) => {
                    tracing::warn!(device = %device, error = %e, "re-open failed");
                    step = reopener.on_open_failed();
                }
            }
        };
        let new = endpoint.local();
        tracing::info!(device = %device, qpn = new.qpn, failures = reopener.failures(), "RNIC re-opened");
        if let Some((i, rnics)) = &host_slot {
            // The host's other RNICs probe the new address from now on.
            rnics.send_modify(|v| {
                if let Some(r) = v.get_mut(*i) {
                    r.endpoint = new;
                }
            });
        }
        if reopener.on_opened(old, new) {
            let gid = rpingmesh_proto::gid::format_gid(&new.gid);
            if registrar.replace_rnic(&device, &gid, new.qpn).await {
                // Best effort: the cluster monitor retries on its own schedule.
                let _ = registrar.ensure_registered().await;
            }
        }
    }
}

/// Sleeps `d`; true if shutdown was asked for (or its sender is gone) meanwhile.
async fn sleep_or_shutdown(shutdown: &mut watch::Receiver<bool>, d: Duration) -> bool {
    let stopped = tokio::select! {
        _ = tokio::time::sleep(d) => None,
        _ = shutdown.wait_for(|s| *s) => Some(true), // asked, or the sender is gone
    };
    stopped.unwrap_or_else(|| *shutdown.borrow())
}

impl RunningAgent {
    /// Stops the drivers (each flushes its open windows), then gives the reporter a few
    /// seconds to send the last batch. Best-effort: nothing here can fail the exit.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for m in &self.monitors {
            m.abort();
        }
        if let Some(f) = self.flow_reporter {
            f.abort();
        }
        for d in self.drivers {
            let _ = d.await;
        }
        // Its report sink must go before the reporter can finish.
        #[cfg(feature = "rdma")]
        if let Some(p) = self.rc_prober {
            let _ = tokio::task::spawn_blocking(move || p.stop()).await;
        }
        if let Some(r) = self.reporter {
            if tokio::time::timeout(Duration::from_secs(5), r)
                .await
                .is_err()
            {
                tracing::warn!("last PathSummary report did not finish in 5 s");
            }
        }
    }
}
