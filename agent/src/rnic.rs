//! The per-RNIC driver: one task owning the transport endpoint, a prober, a responder, a
//! scheduler and the targets' flow-label sets. It only moves events between the transport
//! and the sans-IO core; all protocol decisions are the core's.
//!
//! This file holds the driver's parameters, counters and select loop; `state` is the
//! state machine the loop feeds, `send_table` its id-keyed tables.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::net::Ipv6Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rpingmesh_protocol::aggregate::PathAggregator;
use rpingmesh_protocol::flowlabel::{rotation_epoch, FlowLabelSet};
use rpingmesh_protocol::prober::{ProbeOutcome, ProbeResult, Prober, ProberConfig};
use rpingmesh_protocol::responder::{PendingId, Responder};
use rpingmesh_protocol::schedule::ProbeScheduler;
use rpingmesh_protocol::wire::{MsgType, ProbePacket, WireError, PACKET_LEN};
use rpingmesh_protocol::{PinglistKind, TargetId};
use rpingmesh_verbs::clock::{monotonic_ns, realtime_ns};
use rpingmesh_verbs::{Endpoint, SendId, SendParams, Transport, TransportEvent};
use tokio::sync::{mpsc, watch};

use crate::config::AgentConfig;
use crate::report::{to_proto, PathKey, ReportSink};
use crate::service::ServiceNameCap;
use crate::targets::{Pinglists, ProbeTarget};
use crate::telemetry::{DropReason, FailReason, Metrics, PathAttrs};
use crate::watchdog::SharedMultiplier;

mod deadline;
mod send_table;
mod state;
mod watches;

pub use deadline::DeadlineTimer;
use watches::DriverWatches;

use send_table::IdMap;
pub use send_table::SendTable;
#[cfg(test)]
use send_table::SEND_TABLE_SPAN;

/// Probes started per loop turn before received datagrams are looked at again.
const SEND_BURST: usize = 64;
/// Non-blocking completion re-polls after a batch of events that sent timed datagrams.
const DRAIN_ROUNDS: usize = 4;
/// Timer deadlines (probe timeouts, send times) are rounded up to this many ns, so the
/// timer is neither re-armed after every probe nor fired every few microseconds.
const TIMER_GRANULARITY_NS: u64 = 1 << 20;
/// How often timers that need no precision run (pending sweeps, report flushes). Each
/// is due at its period but runs on whatever wakes the driver next (a round's sends, an
/// ACK); only after half a period more does it wake the driver itself, so a driver that
/// probes spends no wake-up of its own on them.
const HOUSEKEEPING_NS: u64 = 200_000_000;
const REPORT_FLUSH_NS: u64 = 1_000_000_000;

#[derive(Debug, Clone)]
pub struct DriverParams {
    pub source_tor: String,
    /// Every target is due once per round.
    pub round_interval_ns: u64,
    /// Per-target probes/s of each kind (already resolved: > 0).
    pub tor_mesh_rate: f64,
    pub inter_tor_rate: f64,
    pub service_rate: f64,
    /// FOCUS: per-target probes/s, each due every 1/rate s (0: FOCUS lists not probed).
    pub focus_rate: f64,
    /// Hostping R2R: per-target probes/s of the host's own RNICs (0 when it is off), each
    /// due once per `host_round_ns`.
    pub host_rate: f64,
    pub host_round_ns: u64,
    pub probe_timeout_ns: u64,
    /// No new probe starts while this many are outstanding.
    pub max_in_flight: usize,
    pub flow_label_rotation_period_sec: u64,
    pub service_level: u8,
    pub traffic_class: u8,
    /// Per-path aggregation window; None = no aggregation (analysis_report_enabled false).
    pub analysis_window_ns: Option<u64>,
    /// Answer probes, send none.
    pub responder_only: bool,
    /// High 32 bits of every sequence number (random per agent start).
    pub seq_epoch: u32,
    /// Agent-wide bound on `service` metric attribute values (shared by clones).
    pub service_names: Arc<Mutex<ServiceNameCap>>,
    /// Self-protection: scales every per-type rate (None = always 1.0).
    pub rate_multiplier: Option<SharedMultiplier>,
}

impl DriverParams {
    pub fn from_config(cfg: &AgentConfig, seq_epoch: u32) -> Self {
        DriverParams {
            source_tor: cfg.tor_id.clone(),
            round_interval_ns: cfg.probe_interval_ms.saturating_mul(1_000_000),
            tor_mesh_rate: cfg.tor_mesh_rate(),
            inter_tor_rate: cfg.inter_tor_rate(),
            service_rate: cfg.service_rate(),
            focus_rate: cfg.focus_probe_rate_per_second,
            host_rate: 0.0,
            host_round_ns: 1_000_000_000,
            probe_timeout_ns: cfg.probe_timeout_ms.saturating_mul(1_000_000),
            max_in_flight: 4096,
            flow_label_rotation_period_sec: cfg.flow_label_rotation_period_sec,
            // validate() bounds both to their octet ranges.
            service_level: cfg.service_level.clamp(0, 7) as u8,
            traffic_class: cfg.traffic_class.clamp(0, 255) as u8,
            analysis_window_ns: cfg
                .analysis_report_enabled
                .then(|| cfg.analysis_window_sec.saturating_mul(1_000_000_000)),
            responder_only: cfg.responder_only,
            seq_epoch,
            service_names: Arc::new(Mutex::new(ServiceNameCap::new(cfg.max_service_names))),
            rate_multiplier: None,
        }
    }

    /// Per-target rates of (ToR-mesh, inter-ToR, SERVICE, FOCUS, Host) under `multiplier`.
    pub fn scaled_rates(&self, multiplier: f64) -> [f64; 5] {
        [
            self.tor_mesh_rate,
            self.inter_tor_rate,
            self.service_rate,
            self.focus_rate,
            self.host_rate,
        ]
        .map(|r| scaled_rate(r, multiplier))
    }
}

/// The round of FOCUS targets at `rate` probes/s each (0: idle, any round).
pub fn focus_round_ns(rate: f64) -> u64 {
    if rate > 0.0 && rate.is_finite() {
        ((1e9 / rate) as u64).max(1_000_000)
    } else {
        1_000_000_000
    }
}

/// `rate` x `multiplier`; a multiplier that is not in (0, 1] leaves the rate alone (the
/// throttle only ever slows probing, and never stops it).
pub fn scaled_rate(rate: f64, multiplier: f64) -> f64 {
    if multiplier > 0.0 && multiplier <= 1.0 {
        rate * multiplier
    } else {
        rate
    }
}

/// Counters a test, bench or log line can read while the driver runs.
#[derive(Debug, Default)]
pub struct DriverStats {
    pub probes_sent: AtomicU64,
    pub send_errors: AtomicU64,
    pub probe_success: AtomicU64,
    /// Lost: timeout or send error.
    pub probe_failed: AtomicU64,
    pub probe_invalid: AtomicU64,
    pub probes_answered: AtomicU64,
    pub dropped_malformed: AtomicU64,
    pub summaries_offered: AtomicU64,
    /// Transport faults that stopped this driver (rdma: QP error, device lost).
    pub transport_failures: AtomicU64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub probes_sent: u64,
    pub send_errors: u64,
    pub probe_success: u64,
    pub probe_failed: u64,
    pub probe_invalid: u64,
    pub probes_answered: u64,
    pub dropped_malformed: u64,
    pub summaries_offered: u64,
    pub transport_failures: u64,
}

impl DriverStats {
    pub fn snapshot(&self) -> StatsSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsSnapshot {
            probes_sent: l(&self.probes_sent),
            send_errors: l(&self.send_errors),
            probe_success: l(&self.probe_success),
            probe_failed: l(&self.probe_failed),
            probe_invalid: l(&self.probe_invalid),
            probes_answered: l(&self.probes_answered),
            dropped_malformed: l(&self.dropped_malformed),
            summaries_offered: l(&self.summaries_offered),
            transport_failures: l(&self.transport_failures),
        }
    }
}

fn bump(a: &AtomicU64) -> u64 {
    a.fetch_add(1, Ordering::Relaxed)
}

/// A finished probe with its target, for taps (tests, benches).
#[derive(Debug, Clone)]
pub struct TargetOutcome {
    pub target_gid: Arc<str>,
    pub target_qpn: u32,
    pub outcome: ProbeOutcome,
    pub fail_reason: Option<FailReason>,
}

/// What the driver listens to besides its endpoint.
pub struct DriverIo {
    pub pinglists: watch::Receiver<Arc<Pinglists>>,
    /// `true` (or a dropped sender) stops the driver after a last report flush.
    pub shutdown: watch::Receiver<bool>,
    pub reports: Option<ReportSink>,
    /// Every outcome (tests, benches, `hostping --once`).
    pub outcomes: Option<mpsc::UnboundedSender<TargetOutcome>>,
    /// Outcomes of Host (R2R) targets only: the running agent's Hostping monitor.
    pub host_outcomes: Option<mpsc::UnboundedSender<TargetOutcome>>,
}

/// Reads a received datagram: exactly one 40-byte packet, else the reason it is dropped.
pub fn classify_datagram(len: usize, data: &[u8]) -> Result<ProbePacket, DropReason> {
    if len != PACKET_LEN || data.len() < PACKET_LEN {
        return Err(DropReason::BadLength);
    }
    ProbePacket::decode(&data[..PACKET_LEN]).map_err(|e| match e {
        WireError::Short { .. } => DropReason::BadLength,
        WireError::BadVersion { .. } => DropReason::BadVersion,
        WireError::UnknownMsgType { .. } => DropReason::UnknownMsgType,
        WireError::UnknownAckType { .. } => DropReason::UnknownAckType,
        WireError::Inconsistent { .. } => DropReason::Inconsistent,
    })
}

/// Failure reason of a finished probe (None = success). A loss of a probe whose send
/// failed is a send error, not a timeout.
pub fn fail_reason(result: &ProbeResult, send_failed: bool) -> Option<FailReason> {
    match result {
        ProbeResult::Success(_) => None,
        ProbeResult::Invalid(r) => Some(FailReason::from_invalid(*r)),
        ProbeResult::Lost if send_failed => Some(FailReason::SendError),
        ProbeResult::Lost => Some(FailReason::Timeout),
    }
}

#[derive(Debug, Clone, Copy)]
enum SendPurpose {
    /// Its completion is T2 of this sequence.
    Probe(u64),
    /// Its completion is T4: the second ACK follows, on the same flow label.
    FirstAck(PendingId, u32),
}

struct TargetState {
    spec: ProbeTarget,
    endpoint: Endpoint,
    labels: FlowLabelSet,
    /// GRH traffic class and SL of this target's probes.
    traffic_class: u8,
    service_level: u8,
    attrs: PathAttrs,
    key: PathKey,
}

/// One turn's probe sends (buffers reused turn after turn: no allocation per probe).
#[derive(Default)]
struct SendBatch {
    datagrams: Vec<(Endpoint, SendParams, [u8; PACKET_LEN])>,
    /// Per datagram: its target, its probe's sequence and T1.
    probes: Vec<(TargetId, u64, u64)>,
    results: Vec<std::io::Result<SendId>>,
}

/// (GID, QPN, kind, and for SERVICE the path's label, TC, SL): one SERVICE target per
/// distinct service path to the same RNIC.
type TargetKey = (Ipv6Addr, u32, PinglistKind, u32, u8, u8);

struct State {
    p: DriverParams,
    own: Endpoint,
    own_gid: String,
    prober: Prober,
    responder: Responder<Endpoint>,
    scheduler: ProbeScheduler,
    has_targets: bool,
    /// The scheduled targets of each kind (`PinglistKind` order), kept to re-apply rates.
    kind_targets: [Vec<TargetId>; 5],
    /// Bits of the multiplier the scheduler's rates were last set with.
    applied_multiplier_bits: u64,
    targets: IdMap<TargetState>,
    ids: HashMap<TargetKey, TargetId>,
    next_id: TargetId,
    sends: SendTable<SendPurpose>,
    /// A timed send happened since the last completion poll.
    awaiting_completion: bool,
    /// When the batch of events being handled was taken (T6 of a second ACK in it: one
    /// clock read per batch, not per datagram).
    events_now_ns: u64,
    /// Flow-label rotation epoch, valid until the monotonic time beside it.
    label_epoch: u64,
    label_epoch_until_ns: u64,
    send_failed: HashSet<u64>,
    /// The turn's probe sends, handed to the transport as one batch.
    batch: SendBatch,
    /// Paths whose probes timed out this turn: the transport refreshes their handles.
    lost_paths: Vec<(Endpoint, SendParams)>,
    aggregator: Option<PathAggregator<PathKey>>,
    metrics: Metrics,
    stats: Arc<DriverStats>,
    reports: Option<ReportSink>,
    outcomes: Option<mpsc::UnboundedSender<TargetOutcome>>,
    host_outcomes: Option<mpsc::UnboundedSender<TargetOutcome>>,
    timeouts: Vec<ProbeOutcome>,
    next_housekeeping_ns: u64,
    next_flush_ns: u64,
}

pub struct RnicDriver {
    endpoint: Transport,
    state: State,
}

/// Why `run_until` returned.
#[derive(Debug)]
pub enum DriverExit {
    /// Shutdown was requested (the report windows were flushed).
    Shutdown,
    /// The transport failed for good (rdma: QP in error state, device gone): the endpoint
    /// must be re-opened. Closed windows were flushed; open ones are dropped.
    TransportFailed(std::io::Error),
}

/// Lost paths remembered between two turns of the driver loop (more are not needed: a
/// refresh per path and second is all the transport does with them).
const MAX_LOST_PATHS: usize = 1024;

/// Address handles the pinglists need: each target on each of its flow labels, twice
/// (the targets probe us back, and our ACKs to them echo their labels).
pub fn path_count(lists: &Pinglists) -> usize {
    PinglistKind::ALL
        .iter()
        .flat_map(|k| lists.list(*k))
        .map(|t| match t.kind {
            PinglistKind::Service => 1,
            PinglistKind::Focus => t.flow_labels.len().max(1),
            _ => t.flow_label_count.max(1) as usize,
        })
        .sum::<usize>()
        .saturating_mul(2)
}

/// A transport error that no retry on the same endpoint can fix.
pub fn is_fatal_transport_error(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::BrokenPipe
}

impl RnicDriver {
    /// `endpoint`: a `UdpEndpoint`, an `RdmaEndpoint` or a `Transport`.
    pub fn new(endpoint: impl Into<Transport>, params: DriverParams, metrics: Metrics) -> Self {
        let endpoint = endpoint.into();
        let own = endpoint.local();
        let now = monotonic_ns();
        let prober = Prober::new(ProberConfig {
            epoch: params.seq_epoch,
            timeout_ns: params.probe_timeout_ns,
            max_in_flight: params.max_in_flight.max(1),
        });
        let state = State {
            own,
            own_gid: rpingmesh_proto::gid::format_gid(&own.gid),
            prober,
            responder: Responder::new(8192, params.probe_timeout_ns.max(1)),
            scheduler: ProbeScheduler::new(params.round_interval_ns.max(1)),
            has_targets: false,
            kind_targets: Default::default(),
            applied_multiplier_bits: 1.0f64.to_bits(),
            targets: IdMap::default(),
            ids: HashMap::new(),
            next_id: 0,
            sends: SendTable::default(),
            awaiting_completion: false,
            events_now_ns: 0,
            label_epoch: 0,
            label_epoch_until_ns: 0,
            send_failed: HashSet::new(),
            batch: SendBatch::default(),
            lost_paths: Vec::new(),
            aggregator: params.analysis_window_ns.map(PathAggregator::new),
            metrics,
            stats: Arc::new(DriverStats::default()),
            reports: None,
            outcomes: None,
            host_outcomes: None,
            timeouts: Vec::new(),
            next_housekeeping_ns: now + HOUSEKEEPING_NS,
            next_flush_ns: now + REPORT_FLUSH_NS,
            p: params,
        };
        RnicDriver { endpoint, state }
    }

    pub fn local(&self) -> Endpoint {
        self.state.own
    }

    pub fn device_name(&self) -> &str {
        self.endpoint.device_name()
    }

    /// Counts into `stats` (e.g. the counters of the driver this one replaces after a
    /// re-open) instead of fresh ones.
    pub fn with_stats(mut self, stats: Arc<DriverStats>) -> Self {
        self.state.stats = stats;
        self
    }

    pub fn stats(&self) -> Arc<DriverStats> {
        self.state.stats.clone()
    }

    /// Runs until shutdown; then flushes the open aggregation windows to the report sink.
    /// A transport failure also ends it (see `run_until` for the re-opening variant).
    pub async fn run(self, io: DriverIo) {
        let mut io = io;
        if let DriverExit::TransportFailed(e) = self.run_until(&mut io).await {
            tracing::error!(error = %e, "transport failed; this RNIC stopped probing");
        }
    }

    /// Runs until shutdown or a transport failure; `io` stays usable for the driver of a
    /// re-opened endpoint.
    pub async fn run_until(self, io: &mut DriverIo) -> DriverExit {
        let RnicDriver {
            endpoint,
            mut state,
        } = self;
        if io.shutdown.has_changed().is_err() || *io.shutdown.borrow() {
            return DriverExit::Shutdown;
        }
        state.reports = io.reports.clone();
        state.outcomes = io.outcomes.clone();
        state.host_outcomes = io.host_outcomes.clone();
        let lists = io.pinglists.borrow_and_update().clone();
        state.apply_pinglists(&endpoint, &lists, monotonic_ns());
        let mut pinglists_open = true;
        // Noticed at no cost per turn (watches.rs): a waiter registered once per change,
        // and two atomic loads in each turn's wait.
        let mut watches = DriverWatches::default();
        let mut events: Vec<TransportEvent> = Vec::with_capacity(256);
        let mut timer = match DeadlineTimer::new() {
            Ok(t) => t,
            Err(e) => return DriverExit::TransportFailed(e),
        };
        let mut io_errors = 0u64;
        let mut rdma_stats = RdmaStatsExport::default();
        enum Wake {
            Watches,
            Io(std::io::Result<()>),
            Timer,
        }
        let exit = loop {
            match io.shutdown.has_changed() {
                Err(_) => break DriverExit::Shutdown,
                Ok(true) if *io.shutdown.borrow_and_update() => break DriverExit::Shutdown,
                Ok(true) => watches.taken(),
                Ok(false) => {}
            }
            if pinglists_open {
                match io.pinglists.has_changed() {
                    Err(_) => pinglists_open = false, // the monitor is gone: keep the last lists
                    Ok(true) => {
                        let lists = io.pinglists.borrow_and_update().clone();
                        state.apply_pinglists(&endpoint, &lists, monotonic_ns());
                        watches.taken();
                    }
                    Ok(false) => {}
                }
            }
            let now = monotonic_ns();
            state.follow_multiplier(now);
            state.send_due(&endpoint, now);
            if state.poll_timers(now) {
                rdma_stats.export(&endpoint, &state.metrics);
            }
            for (to, params) in state.lost_paths.drain(..) {
                endpoint.note_loss(&to, &params);
            }
            if let Err(e) = timer.arm(state.next_deadline(now)) {
                break DriverExit::TransportFailed(e);
            }
            watches
                .arm(&io.shutdown, &io.pinglists, pinglists_open)
                .await;
            let changed = std::future::poll_fn(|_| {
                match DriverWatches::changed(&io.shutdown, &io.pinglists, pinglists_open) {
                    true => std::task::Poll::Ready(()),
                    false => std::task::Poll::Pending,
                }
            });
            let wake = tokio::select! {
                biased;
                () = changed => Wake::Watches,
                r = endpoint.wait_events(&mut events) => Wake::Io(r),
                r = timer.expired() => match r {
                    Ok(()) => Wake::Timer,
                    Err(e) => Wake::Io(Err(e)),
                },
            };
            match wake {
                Wake::Io(Ok(())) => {
                    if let Err(e) = state.handle_events(&endpoint, &mut events) {
                        break DriverExit::TransportFailed(e);
                    }
                }
                Wake::Io(Err(e)) if is_fatal_transport_error(&e) => {
                    break DriverExit::TransportFailed(e)
                }
                Wake::Io(Err(e)) => {
                    io_errors += 1;
                    if io_errors.is_power_of_two() {
                        tracing::warn!(error = %e, errors = io_errors, "transport receive error");
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                // Taken at the top of the next turn.
                Wake::Watches | Wake::Timer => {}
            }
        };
        rdma_stats.export(&endpoint, &state.metrics);
        match exit {
            DriverExit::Shutdown => state.flush_reports(true),
            DriverExit::TransportFailed(_) => {
                bump(&state.stats.transport_failures);
                state.metrics.record_transport_failure();
                // Only closed windows: the driver of the re-opened endpoint continues the
                // open ones' periods, and two summaries of one path and window would
                // double-count it at the controller.
                state.flush_reports(false);
            }
        }
        exit
    }
}

/// Exports the rdma endpoint's event-ring drops and in-place QP resets as counter deltas
/// (the endpoint counts from 0 for its lifetime; a re-opened endpoint starts over with a
/// fresh exporter).
#[derive(Default)]
struct RdmaStatsExport {
    ring_dropped: u64,
    qp_resets: u64,
}

impl RdmaStatsExport {
    fn export(&mut self, ep: &Transport, metrics: &Metrics) {
        if let Some(st) = ep.rdma_stats() {
            metrics
                .record_event_ring_dropped(st.event_ring_dropped.saturating_sub(self.ring_dropped));
            self.ring_dropped = self.ring_dropped.max(st.event_ring_dropped);
            metrics.record_qp_resets(st.qp_recoveries.saturating_sub(self.qp_resets));
            self.qp_resets = self.qp_resets.max(st.qp_recoveries);
        }
    }
}

/// A driver with a fixed pinglist and no controller: for tests and benches.
pub struct StaticDriver {
    pub pinglists: watch::Sender<Arc<Pinglists>>,
    pub shutdown: watch::Sender<bool>,
    pub stats: Arc<DriverStats>,
    pub local: Endpoint,
}

impl StaticDriver {
    /// Spawns `driver` on the current runtime with `lists`; returns its handles and task.
    pub fn spawn(
        driver: RnicDriver,
        lists: Pinglists,
        reports: Option<ReportSink>,
        outcomes: Option<mpsc::UnboundedSender<TargetOutcome>>,
    ) -> (StaticDriver, tokio::task::JoinHandle<()>) {
        let (ptx, prx) = watch::channel(Arc::new(lists));
        let (stx, srx) = watch::channel(false);
        let stats = driver.stats();
        let local = driver.local();
        let task = tokio::spawn(driver.run(DriverIo {
            pinglists: prx,
            shutdown: srx,
            reports,
            outcomes,
            host_outcomes: None,
        }));
        (
            StaticDriver {
                pinglists: ptx,
                shutdown: stx,
                stats,
                local,
            },
            task,
        )
    }

    pub fn stop(&self) {
        let _ = self.shutdown.send(true);
    }
}

#[cfg(test)]
mod tests;
