//! Opening the RNICs the agent probes from: one UDP endpoint per configured address
//! (udp0, udp1, ...), or every allowed RDMA device (a device that fails to open is skipped
//! while another opens). Below both the agent's lifecycle and Hostping, which open them
//! the same way.

use std::net::{IpAddr, SocketAddr};

use rpingmesh_verbs::rdma::{self, RdmaOptions};
use rpingmesh_verbs::udp::UdpEndpoint;
use rpingmesh_verbs::{Transport, VerbsError};

use crate::config::AgentConfig;

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

/// One opened RNIC: its endpoint and, for rdma, how to open it again after a failure.
pub struct OpenedRnic {
    pub endpoint: Transport,
    pub reopen: Option<RdmaOptions>,
}

impl From<UdpEndpoint> for OpenedRnic {
    fn from(ep: UdpEndpoint) -> Self {
        OpenedRnic {
            endpoint: Transport::Udp(ep),
            reopen: None,
        }
    }
}

/// The rdma endpoint options of `device` from the agent config.
pub fn rdma_options(cfg: &AgentConfig, device: &str) -> RdmaOptions {
    let mut o = RdmaOptions::new(device);
    // validate() bounds these; out-of-range values are then refused by RdmaOptions.
    o.gid_index = u32::try_from(cfg.gid_index).unwrap_or(u32::MAX);
    o.service_level = u8::try_from(cfg.service_level).unwrap_or(u8::MAX);
    o.traffic_class = u8::try_from(cfg.traffic_class).unwrap_or(u8::MAX);
    o
}

/// Opens every RDMA device `allowed_device_names` selects (empty = all). Touches no
/// network: the error (e.g. "no RDMA devices: ...; use transport: udp", or the
/// not-built line) is meant to stop the agent before it contacts the controller.
pub fn open_rdma(cfg: &AgentConfig) -> Result<Vec<OpenedRnic>, VerbsError> {
    let devices = rdma::list_devices(&cfg.allowed_device_names)?;
    let mut out = Vec::with_capacity(devices.len());
    let mut first_error = None;
    for dev in devices {
        let opts = rdma_options(cfg, &dev);
        // A device that cannot be opened (port down, no GID at gid_index) is skipped:
        // the others still probe. Only when none opens does the agent stop.
        let ep = match rdma::open_rdma_with(&opts) {
            Ok(ep) => ep,
            Err(e) => {
                tracing::warn!("rdma device {dev} skipped: {e}");
                first_error.get_or_insert(e);
                continue;
            }
        };
        if let Some(w) = ep.gid_warning() {
            tracing::warn!(device = %dev, gid_index = opts.gid_index, "{w}");
        }
        tracing::info!(device = %dev, timestamps = ?ep.timestamp_source(), "rdma device opened");
        out.push(OpenedRnic {
            endpoint: Transport::Rdma(ep),
            reopen: Some(opts),
        });
    }
    match first_error {
        Some(e) if out.is_empty() => Err(e),
        _ => Ok(out),
    }
}
