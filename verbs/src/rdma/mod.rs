//! The `rdma` transport: UD queue pairs on RoCE NICs (or soft-RoCE) with NIC completion
//! timestamps, driven the same way as `udp::UdpEndpoint` (`local`, `send`, `wait_events`).
//!
//! Everything that needs no hardware is always compiled and unit-tested: sysfs GID tables
//! and port state ([`sysfs`]), the address-handle LRU ([`ah_cache`]), NIC tick conversion
//! ([`nic_clock`]), completion-to-event translation ([`completion`]), the poller-to-agent
//! queue ([`ring`]), every error message ([`error`]) and the pure half of the hostping
//! loopback test ([`loopback`]: options, NUMA node masks, summaries, Eq. 3). The libibverbs layer (rdma-sys,
//! RAII wrappers, the poller thread) needs cargo feature `rdma`; without it
//! [`open_rdma`] returns `VerbsError::RdmaNotBuilt`.

pub mod ah_cache;
pub mod ah_table;
pub mod completion;
pub mod error;
pub mod gpu;
pub mod loopback;
pub mod nic_clock;
pub mod numa;
pub mod qp_recovery;
#[cfg(feature = "rdma")]
pub mod rc_ring;
pub mod ring;
pub mod sysfs;

#[cfg(feature = "rdma")]
mod endpoint;
#[cfg(feature = "rdma")]
mod ffi;

use std::path::PathBuf;
use std::time::Duration;

pub use error::RdmaError;

#[cfg(feature = "rdma")]
pub use endpoint::{device_info, list_devices, DeviceInfo, RdmaEndpoint};

use crate::VerbsError;

/// Q_Key shared by every agent's UD QPs (a send is accepted only if the Q_Keys match).
pub const QKEY: u32 = 0x1111_1111;
/// Bytes per receive slot: the GRH plus the largest payload delivered.
pub const RECV_SLOT_LEN: usize = completion::GRH_LEN + completion::PAYLOAD_LEN;
/// Largest payload `send` accepts.
pub const MAX_PAYLOAD: usize = completion::PAYLOAD_LEN;

/// The device, port and GID index every QP of ours is opened on: the problem, if any.
pub(crate) fn check_port_address(device: &str, port: u8, gid_index: u32) -> Result<(), String> {
    if device.is_empty() {
        return Err("device name is empty".into());
    }
    if port == 0 {
        return Err("port=0 is invalid (ports are numbered from 1)".into());
    }
    if gid_index > 255 {
        return Err(format!("gid_index={gid_index} is out of range 0-255"));
    }
    Ok(())
}

/// Everything needed to open one RNIC endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaOptions {
    pub device_name: String,
    /// Physical port (1-based).
    pub port: u8,
    /// GID table index (config `gid_index`).
    pub gid_index: u32,
    /// Defaults for sends whose `SendParams` the agent fills from config (`service_level`,
    /// `traffic_class`); kept here for `hw-check` and logging.
    pub service_level: u8,
    pub traffic_class: u8,
    /// Pre-posted receive buffers.
    pub recv_buffers: u32,
    /// Send queue depth (sends in flight before `send` returns WouldBlock); rounded down
    /// to a power of two.
    pub send_queue_depth: u32,
    /// Address handles kept (grown to the pinglist's paths by `reserve_paths`).
    pub ah_cache_capacity: usize,
    /// Age after which an address handle is made again in the background.
    pub ah_max_age: Duration,
    /// Events buffered between the poller thread and the agent.
    pub event_ring_capacity: usize,
    /// `/sys/class/infiniband` (a fixture tree in tests).
    pub sysfs_dir: PathBuf,
    /// Use CLOCK_MONOTONIC software timestamps even when the NIC has a clock.
    pub force_software_timestamps: bool,
}

impl RdmaOptions {
    pub fn new(device_name: &str) -> RdmaOptions {
        RdmaOptions {
            device_name: device_name.to_string(),
            port: 1,
            gid_index: 0,
            service_level: 0,
            traffic_class: 0,
            recv_buffers: 512,
            send_queue_depth: 256,
            ah_cache_capacity: 4096,
            ah_max_age: Duration::from_nanos(ah_table::DEFAULT_MAX_AGE_NS),
            event_ring_capacity: 8192,
            sysfs_dir: PathBuf::from(sysfs::SYSFS_CLASS_DIR),
            force_software_timestamps: false,
        }
    }

    /// Rejects values the hardware layer cannot use, naming the key.
    pub fn validate(&self) -> Result<(), RdmaError> {
        let bad = |m: String| Err(RdmaError::Config(m));
        check_port_address(&self.device_name, self.port, self.gid_index).or_else(bad)?;
        if self.service_level > 15 {
            return bad(format!(
                "service_level={} is out of range 0-15",
                self.service_level
            ));
        }
        if self.recv_buffers == 0 || self.recv_buffers > 65_536 {
            return bad(format!(
                "recv_buffers={} must be 1-65536",
                self.recv_buffers
            ));
        }
        if self.send_queue_depth == 0 || self.send_queue_depth > 65_536 {
            return bad(format!(
                "send_queue_depth={} must be 1-65536",
                self.send_queue_depth
            ));
        }
        if self.event_ring_capacity == 0 {
            return bad("event_ring_capacity=0 must be at least 1".into());
        }
        Ok(())
    }
}

/// Applies `allowed_device_names` (empty = all) to the devices found. Errors are the
/// one-line "no RDMA devices: ..." messages.
pub fn select_devices(found: &[String], allowed: &[String]) -> Result<Vec<String>, RdmaError> {
    if found.is_empty() {
        return Err(RdmaError::NoDevices {
            reason: "ibv_get_device_list returned an empty list".into(),
        });
    }
    if allowed.is_empty() {
        return Ok(found.to_vec());
    }
    let picked: Vec<String> = found
        .iter()
        .filter(|d| allowed.contains(d))
        .cloned()
        .collect();
    if picked.is_empty() {
        return Err(RdmaError::NoAllowedDevice {
            allowed: allowed.to_vec(),
            found: found.to_vec(),
        });
    }
    Ok(picked)
}

/// Re-open back-off after a device or QP failure: doubles from `initial` to `max`,
/// reset after a success.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
    attempts: u32,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        let initial = initial.max(Duration::from_millis(1));
        Backoff {
            initial,
            max: max.max(initial),
            next: initial,
            attempts: 0,
        }
    }

    /// The delay before the next attempt; advances the schedule.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        self.attempts += 1;
        d
    }

    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    pub fn reset(&mut self) {
        self.next = self.initial;
        self.attempts = 0;
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(Duration::from_secs(1), Duration::from_secs(60))
    }
}

/// Where an endpoint's T2..T5 come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimestampSource {
    /// NIC completion timestamps (extended CQ), converted at `khz`.
    Nic { khz: u64, mask: u64 },
    /// CLOCK_MONOTONIC: for a receive, read by the poller as it wakes for the completion;
    /// for a send, read just before it is posted.
    Software,
}

/// Counters of one endpoint (exported as metrics by the agent).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RdmaStats {
    /// `rpingmesh.event_ring_dropped_total`.
    pub event_ring_dropped: u64,
    pub events_delivered: u64,
    /// Good completions whose content was unusable (no GRH, bad length, unknown header).
    pub malformed_completions: u64,
    /// Completions with an error status (the endpoint fails only if the QP is in error).
    pub error_completions: u64,
    /// Times the QP fell into the error state and was reset in place (same QPN).
    pub qp_recoveries: u64,
    pub sends_posted: u64,
    pub sends_completed: u64,
    /// Sends accepted but reported `SendFailed` (no AH, error completion).
    pub sends_failed: u64,
    pub ah_hits: u64,
    pub ah_misses: u64,
    pub ah_evictions: u64,
    pub ah_resolutions: u64,
    pub ah_resolution_failures: u64,
    pub ah_refreshes: u64,
    /// Sends refused at once because their GID failed to resolve recently.
    pub ah_unreachable_sends: u64,
    pub port_active: bool,
}

/// Opens `device_name` with default options (port 1, gid_index 0).
pub fn open_rdma(device_name: &str) -> Result<RdmaEndpoint, VerbsError> {
    open_rdma_with(&RdmaOptions::new(device_name))
}

/// Opens one RNIC endpoint. Must be called inside a tokio runtime only for
/// `wait_events`; opening itself is synchronous.
pub fn open_rdma_with(opts: &RdmaOptions) -> Result<RdmaEndpoint, VerbsError> {
    #[cfg(feature = "rdma")]
    {
        RdmaEndpoint::open(opts).map_err(VerbsError::Rdma)
    }
    #[cfg(not(feature = "rdma"))]
    {
        let _ = opts;
        Err(VerbsError::RdmaNotBuilt)
    }
}

/// The devices to open: every RDMA device, filtered by `allowed_device_names`.
#[cfg(not(feature = "rdma"))]
pub fn list_devices(allowed: &[String]) -> Result<Vec<String>, VerbsError> {
    let _ = allowed;
    Err(VerbsError::RdmaNotBuilt)
}

/// Without the `rdma` feature no endpoint can exist; the type keeps the agent's code the
/// same in both builds.
#[cfg(not(feature = "rdma"))]
#[derive(Debug)]
pub struct RdmaEndpoint {
    never: std::convert::Infallible,
}

#[cfg(not(feature = "rdma"))]
impl RdmaEndpoint {
    pub fn local(&self) -> crate::Endpoint {
        match self.never {}
    }
    pub fn device_name(&self) -> &str {
        match self.never {}
    }
    pub fn ip_string(&self) -> String {
        match self.never {}
    }
    pub fn timestamp_source(&self) -> TimestampSource {
        match self.never {}
    }
    pub fn gid_warning(&self) -> Option<&str> {
        match self.never {}
    }
    pub fn stats(&self) -> RdmaStats {
        match self.never {}
    }
    pub fn failure(&self) -> Option<String> {
        match self.never {}
    }
    pub fn reserve_paths(&self, _paths: usize) {
        match self.never {}
    }
    pub fn note_loss(&self, _to: &crate::Endpoint, _params: &crate::SendParams) {
        match self.never {}
    }
    pub fn send(
        &self,
        _to: &crate::Endpoint,
        _params: &crate::SendParams,
        _payload: &[u8],
    ) -> std::io::Result<crate::SendId> {
        match self.never {}
    }
    pub fn poll_events(&self, _out: &mut Vec<crate::TransportEvent>) -> std::io::Result<()> {
        match self.never {}
    }
    pub async fn wait_events(&self, _out: &mut Vec<crate::TransportEvent>) -> std::io::Result<()> {
        match self.never {}
    }
}

#[cfg(test)]
mod tests;
