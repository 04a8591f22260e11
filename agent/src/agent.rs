//! Agent lifecycle: bind the pseudo-RNICs, register, start one driver and one cluster
//! monitor per RNIC plus the reporter; stop them in order on shutdown.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use rpingmesh_verbs::udp::UdpEndpoint;
use rpingmesh_verbs::VerbsError;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::cluster_monitor::{run_cluster_monitor, MonitorParams, Registrar};
use crate::config::AgentConfig;
use crate::controller_client::{registration_request, ControllerClient, LocalRnic};
use crate::report;
use crate::rnic::{DriverIo, DriverParams, DriverStats, RnicDriver};
use crate::targets::Pinglists;
use crate::telemetry::Metrics;

/// Summaries buffered between the drivers and the reporter before new ones are dropped.
const REPORT_QUEUE: usize = 8192;

/// Binds one UDP endpoint per `udp_addresses` entry (device names udp0, udp1, ...).
pub fn bind_udp(cfg: &AgentConfig) -> Result<Vec<UdpEndpoint>, VerbsError> {
    cfg.udp_addresses
        .iter()
        .enumerate()
        .map(|(i, a)| {
            // validate() already checked these parse.
            let ip: IpAddr = a.parse().unwrap_or(IpAddr::from([127, 0, 0, 1]));
            UdpEndpoint::bind(SocketAddr::new(ip, cfg.udp_port), &format!("udp{i}"))
        })
        .collect()
}

pub struct RunningAgent {
    shutdown: watch::Sender<bool>,
    drivers: Vec<JoinHandle<()>>,
    monitors: Vec<JoinHandle<()>>,
    reporter: Option<JoinHandle<()>>,
    pub stats: Vec<Arc<DriverStats>>,
    pub registrar: Arc<Registrar>,
}

/// Starts everything on the current runtime. Returns at once: the controller is contacted
/// in the background, and the responders answer from the first moment.
pub fn start(
    cfg: &AgentConfig,
    endpoints: Vec<UdpEndpoint>,
    metrics: Metrics,
) -> anyhow::Result<RunningAgent> {
    let client = ControllerClient::connect_lazy(cfg)?;
    let rnics: Vec<LocalRnic> = endpoints
        .iter()
        .map(|ep| LocalRnic {
            gid: ep.local().gid,
            qpn: ep.local().qpn,
            ip_address: ep.ip_string(),
            device_name: ep.device_name().to_string(),
        })
        .collect();
    let registrar = Arc::new(Registrar::new(
        client.clone(),
        registration_request(cfg, &rnics),
    ));
    let seq_epoch: u32 = rand::random();
    let (shutdown_tx, _) = watch::channel(false);

    let (sink, reporter) = if cfg.analysis_report_enabled {
        let (sink, rx) = report::channel(REPORT_QUEUE);
        let task = tokio::spawn(report::run_reporter(
            client.clone(),
            cfg.agent_id.clone(),
            rx,
            cfg.report_batch_max,
        ));
        (Some(sink), Some(task))
    } else {
        (None, None)
    };

    let mut drivers = Vec::new();
    let mut monitors = Vec::new();
    let mut pending_monitors = Vec::new();
    let mut stats = Vec::new();
    for (ep, rnic) in endpoints.into_iter().zip(&rnics) {
        let gid = rpingmesh_proto::gid::format_gid(&rnic.gid);
        let (ptx, prx) = watch::channel(Arc::new(Pinglists::default()));
        pending_monitors.push((gid.clone(), ptx));
        let driver = RnicDriver::new(
            ep,
            DriverParams::from_config(cfg, seq_epoch),
            metrics.clone(),
        );
        stats.push(driver.stats());
        drivers.push(tokio::spawn(driver.run(DriverIo {
            pinglists: prx,
            shutdown: shutdown_tx.subscribe(),
            reports: sink.clone(),
            outcomes: None,
        })));
        tracing::info!(device = %rnic.device_name, gid = %gid, qpn = rnic.qpn, ip = %rnic.ip_address, "rnic ready");
    }
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
    for (gid, ptx) in pending_monitors {
        monitors.push(tokio::spawn(run_cluster_monitor(
            registrar.clone(),
            client.clone(),
            MonitorParams {
                agent_id: cfg.agent_id.clone(),
                tor_id: cfg.tor_id.clone(),
                requester_gid: gid,
                update_interval: Duration::from_secs(cfg.pinglist_update_interval_sec),
            },
            ptx,
            shutdown_tx.subscribe(),
        )));
    }
    Ok(RunningAgent {
        shutdown: shutdown_tx,
        drivers,
        monitors,
        reporter,
        stats,
        registrar,
    })
}

impl RunningAgent {
    /// Stops the drivers (each flushes its open windows), then gives the reporter a few
    /// seconds to send the last batch. Best-effort: nothing here can fail the exit.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for m in &self.monitors {
            m.abort();
        }
        for d in self.drivers {
            let _ = d.await;
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
