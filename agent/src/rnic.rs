//! The per-RNIC driver: one task owning the transport endpoint, a prober, a responder, a
//! scheduler and the targets' flow-label sets. It only moves events between the transport
//! and the sans-IO core; all protocol decisions are the core's.

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

/// Probes started per loop turn before received datagrams are looked at again.
const SEND_BURST: usize = 64;
/// Non-blocking completion re-polls after a batch of events that sent timed datagrams.
const DRAIN_ROUNDS: usize = 4;
/// Timer deadlines that need no precision (probe timeouts) are rounded up to this many
/// ns, so the timer is not re-armed after every probe.
const TIMER_GRANULARITY_NS: u64 = 1 << 20;
/// Longest a busy driver goes without awaiting its shutdown and pinglist watches.
const WATCH_POLL_NS: u64 = 10_000_000;
/// How often timers that need no precision run (pending sweeps, report flushes).
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

/// (GID, QPN, kind, and for SERVICE the path's label, TC, SL): one SERVICE target per
/// distinct service path to the same RNIC.
type TargetKey = (Ipv6Addr, u32, PinglistKind, u32, u8, u8);

/// TargetIds are small counters handed out by the driver itself: hashing them with
/// SipHash on every send and outcome buys nothing.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        // Spread the counter over the high bits hashbrown uses for its control bytes.
        self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | b as u64;
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = n as u64;
    }
}

type IdMap<V> = HashMap<TargetId, V, BuildHasherDefault<IdHasher>>;

/// Sends awaiting their completion, indexed by send id. Both transports hand out ids
/// counting up by one and complete (nearly) in order, so a deque offset by the oldest id
/// replaces a hash map: insert is a push, remove a slot write plus popping the done front.
#[derive(Debug)]
pub struct SendTable<T> {
    base: SendId,
    slots: VecDeque<Option<(T, u64)>>,
    live: usize,
}

/// Ids further than this ahead of the oldest tracked send are not tracked (only reachable
/// if a transport's ids jumped; the probe then just times out).
const SEND_TABLE_SPAN: u32 = 1 << 20;

impl<T> Default for SendTable<T> {
    fn default() -> Self {
        SendTable {
            base: 0,
            slots: VecDeque::new(),
            live: 0,
        }
    }
}

impl<T: Copy> SendTable<T> {
    /// Tracks send `id`, sent at `at_ns`. Returns false if the id cannot be tracked.
    pub fn insert(&mut self, id: SendId, value: T, at_ns: u64) -> bool {
        if self.slots.is_empty() {
            self.base = id;
        }
        let off = id.wrapping_sub(self.base);
        if off >= SEND_TABLE_SPAN {
            return false; // behind the window (reused id) or absurdly far ahead
        }
        let off = off as usize;
        if off >= self.slots.len() {
            self.slots.resize(off + 1, None);
        }
        if self.slots[off].replace((value, at_ns)).is_none() {
            self.live += 1;
        }
        true
    }

    pub fn remove(&mut self, id: SendId) -> Option<T> {
        let off = id.wrapping_sub(self.base) as usize;
        let v = self.slots.get_mut(off)?.take()?;
        self.live -= 1;
        self.pop_done();
        Some(v.0)
    }

    /// Forgets sends older than `horizon_ns` before `now` (their completion never came).
    pub fn expire(&mut self, now: u64, horizon_ns: u64) {
        for slot in self.slots.iter_mut() {
            if matches!(slot, Some((_, at)) if now.saturating_sub(*at) > horizon_ns) {
                *slot = None;
                self.live -= 1;
            }
        }
        self.pop_done();
    }

    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    fn pop_done(&mut self) {
        while let Some(None) = self.slots.front() {
            self.slots.pop_front();
            self.base = self.base.wrapping_add(1);
        }
    }
}

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
        // While events keep coming, the shutdown and pinglist watches are checked with an
        // atomic load per turn instead of being awaited: awaiting registers and drops a
        // waiter on each of them every turn, i.e. several times per probe. An idle driver
        // (last wake not I/O) awaits them, so it reacts at once; a busy one reacts at its
        // next event, or within WATCH_POLL_NS when the events stop.
        let mut last_wake_io = false;
        let mut watch_tick_at = 0u64;
        let mut events: Vec<TransportEvent> = Vec::with_capacity(256);
        let sleep = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(sleep);
        let mut io_errors = 0u64;
        let mut armed_deadline = u64::MAX;
        let mut ring_dropped = RingDropExport::default();
        enum Wake {
            Shutdown,
            Io(std::io::Result<()>),
            Pinglists(bool),
            Timer,
        }
        let exit = loop {
            match io.shutdown.has_changed() {
                Err(_) => break DriverExit::Shutdown,
                Ok(true) if *io.shutdown.borrow_and_update() => break DriverExit::Shutdown,
                Ok(_) => {}
            }
            if pinglists_open {
                match io.pinglists.has_changed() {
                    Err(_) => pinglists_open = false, // the monitor is gone: keep the last lists
                    Ok(true) => {
                        let lists = io.pinglists.borrow_and_update().clone();
                        state.apply_pinglists(&endpoint, &lists, monotonic_ns());
                    }
                    Ok(false) => {}
                }
            }
            let now = monotonic_ns();
            state.follow_multiplier(now);
            state.send_due(&endpoint, now);
            if state.poll_timers(now) {
                ring_dropped.export(&endpoint, &state.metrics);
            }
            for (to, params) in state.lost_paths.drain(..) {
                endpoint.note_loss(&to, &params);
            }
            let mut deadline = state.next_deadline(now);
            let watch = !last_wake_io;
            if !watch {
                // Moves once per WATCH_POLL_NS, so it rarely re-arms the timer.
                if now >= watch_tick_at {
                    watch_tick_at = now + WATCH_POLL_NS;
                }
                deadline = deadline.min(watch_tick_at);
            }
            // Re-arming the timer costs: only when the deadline moved.
            if deadline != armed_deadline {
                armed_deadline = deadline;
                let wait = Duration::from_nanos(deadline.saturating_sub(monotonic_ns()));
                sleep.as_mut().reset(tokio::time::Instant::now() + wait);
            }
            let wake = tokio::select! {
                biased;
                r = io.shutdown.changed(), if watch => {
                    if r.is_err() || *io.shutdown.borrow() { Wake::Shutdown } else { Wake::Timer }
                }
                r = endpoint.wait_events(&mut events) => Wake::Io(r),
                r = io.pinglists.changed(), if watch && pinglists_open => Wake::Pinglists(r.is_ok()),
                _ = &mut sleep => Wake::Timer,
            };
            last_wake_io = matches!(wake, Wake::Io(_));
            match wake {
                Wake::Shutdown => break DriverExit::Shutdown,
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
                Wake::Pinglists(true) => {
                    let lists = io.pinglists.borrow_and_update().clone();
                    state.apply_pinglists(&endpoint, &lists, monotonic_ns());
                }
                // The monitor is gone: keep probing the last lists.
                Wake::Pinglists(false) => pinglists_open = false,
                Wake::Timer => {}
            }
        };
        ring_dropped.export(&endpoint, &state.metrics);
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

/// Exports the rdma endpoint's event-ring drops as a counter delta (the endpoint counts
/// from 0 for its lifetime; a re-opened endpoint starts over with a fresh exporter).
#[derive(Default)]
struct RingDropExport {
    exported: u64,
}

impl RingDropExport {
    fn export(&mut self, ep: &Transport, metrics: &Metrics) {
        if let Some(st) = ep.rdma_stats() {
            metrics.record_event_ring_dropped(st.event_ring_dropped.saturating_sub(self.exported));
            self.exported = self.exported.max(st.event_ring_dropped);
        }
    }
}

impl State {
    /// Handles a batch of events. When handling sent timed datagrams (first ACKs), their
    /// completions are usually queued already: take them now rather than after another
    /// trip through epoll. Err only for a fatal transport error.
    fn handle_events(
        &mut self,
        ep: &Transport,
        events: &mut Vec<TransportEvent>,
    ) -> std::io::Result<()> {
        for _ in 0..DRAIN_ROUNDS {
            self.awaiting_completion = false;
            self.events_now_ns = monotonic_ns();
            for ev in events.drain(..) {
                self.on_event(ep, ev);
            }
            if !self.awaiting_completion {
                return Ok(());
            }
            match ep.poll_completions(events) {
                Err(e) if is_fatal_transport_error(&e) => return Err(e),
                Err(_) => break, // wait_events reports it
                Ok(()) if events.is_empty() => return Ok(()),
                Ok(()) => {}
            }
        }
        self.events_now_ns = monotonic_ns();
        for ev in events.drain(..) {
            self.on_event(ep, ev);
        }
        Ok(())
    }

    fn send_due(&mut self, ep: &Transport, now: u64) {
        if !self.has_targets {
            return;
        }
        for _ in 0..SEND_BURST {
            if self.prober.in_flight() >= self.p.max_in_flight {
                return;
            }
            let Some((_kind, id)) = self.scheduler.poll(now) else {
                return;
            };
            // Re-read the wall clock at most once a second: rotation periods are whole
            // seconds, so a boundary is seen within a second.
            if now >= self.label_epoch_until_ns {
                self.label_epoch = rotation_epoch(
                    realtime_ns() / 1_000_000_000,
                    self.p.flow_label_rotation_period_sec,
                );
                self.label_epoch_until_ns = now + 1_000_000_000;
            }
            let epoch = self.label_epoch;
            let Some(t) = self.targets.get_mut(&id) else {
                continue;
            };
            let flow_label = t.labels.next_label(epoch);
            let to = t.endpoint;
            let params = SendParams {
                flow_label,
                traffic_class: t.traffic_class,
                service_level: t.service_level,
            };
            let t1 = monotonic_ns();
            let pkt = self.prober.start_probe(id, flow_label, t1);
            bump(&self.stats.probes_sent);
            match ep.send(&to, &params, &pkt.encode()) {
                Ok(sid) => {
                    self.sends.insert(sid, SendPurpose::Probe(pkt.sequence), t1);
                }
                Err(e) => {
                    // The prober times it out; the reason is then send_error.
                    self.send_failed.insert(pkt.sequence);
                    let n = bump(&self.stats.send_errors) + 1;
                    if n.is_power_of_two() {
                        tracing::warn!(error = %e, target = %t.spec.gid_text, send_errors = n, "probe send failed");
                    }
                }
            }
        }
    }

    /// Returns true when the housekeeping tick ran.
    fn poll_timers(&mut self, now: u64) -> bool {
        let mut timeouts = std::mem::take(&mut self.timeouts);
        self.prober.poll_timeouts(now, &mut timeouts);
        for o in timeouts.drain(..) {
            self.finish(o);
        }
        self.timeouts = timeouts;
        let housekeeping = now >= self.next_housekeeping_ns;
        if housekeeping {
            self.next_housekeeping_ns = now + HOUSEKEEPING_NS;
            self.responder.expire(now);
            // Sends whose completion never came (e.g. a TX timestamp the kernel skipped).
            let horizon = self.p.probe_timeout_ns.saturating_mul(2);
            self.sends.expire(now, horizon);
            if self.send_failed.len() > 2 * self.p.max_in_flight.max(1024) {
                self.send_failed.clear();
            }
        }
        if now >= self.next_flush_ns {
            self.next_flush_ns = now + REPORT_FLUSH_NS;
            self.flush_reports(false);
        }
        housekeeping
    }

    fn next_deadline(&self, now: u64) -> u64 {
        let mut d = self.next_housekeeping_ns.min(self.next_flush_ns);
        if let Some(t) = self.prober.next_timeout() {
            // Rounded up: a timeout a millisecond late is fine; re-arming per probe is not.
            d = d.min(t.saturating_add(TIMER_GRANULARITY_NS - 1) & !(TIMER_GRANULARITY_NS - 1));
        }
        if self.has_targets && self.prober.in_flight() < self.p.max_in_flight {
            if let Some(t) = self.scheduler.next_wakeup_ns(now) {
                d = d.min(t);
            }
        }
        d
    }

    fn on_event(&mut self, ep: &Transport, ev: TransportEvent) {
        match ev {
            TransportEvent::Received {
                from,
                len,
                data,
                rx_ts_ns,
                flow_label,
            } => {
                let pkt = match classify_datagram(len, &data) {
                    Ok(p) => p,
                    Err(reason) => {
                        self.metrics.record_dropped(reason);
                        let n = bump(&self.stats.dropped_malformed) + 1;
                        if n.is_power_of_two() {
                            tracing::debug!(reason = reason.as_str(), len, from = %from.gid, dropped = n, "malformed datagram dropped");
                        }
                        return;
                    }
                };
                let now = self.events_now_ns;
                match pkt.msg_type {
                    MsgType::Probe => {
                        let (pending, ack) = self.responder.on_probe(from, &pkt, rx_ts_ns, now);
                        bump(&self.stats.probes_answered);
                        // The ACKs take the probe's path: its flow label where the
                        // transport sees it (IPv6 GRH), as the Go responder does.
                        let label = flow_label.unwrap_or(0);
                        match ep.send(&from, &self.ack_params(label), &ack.encode()) {
                            Ok(sid) => {
                                self.sends
                                    .insert(sid, SendPurpose::FirstAck(pending, label), now);
                                self.awaiting_completion = true;
                            }
                            Err(e) => self.ack_send_failed(&e),
                        }
                    }
                    MsgType::Ack => {
                        // `now` is T6 when this is the second ACK.
                        if let Some(o) = self.prober.on_ack(&pkt, rx_ts_ns, now) {
                            self.finish(o);
                        }
                    }
                }
            }
            TransportEvent::Sent { id, tx_ts_ns } => match self.sends.remove(id) {
                Some(SendPurpose::Probe(seq)) => {
                    if let Some(o) = self.prober.on_probe_sent(seq, tx_ts_ns, self.events_now_ns) {
                        self.finish(o);
                    }
                }
                Some(SendPurpose::FirstAck(pending, label)) => {
                    if let Some((to, ack2)) = self.responder.on_first_ack_sent(pending, tx_ts_ns) {
                        // Nobody needs the second ACK's send time: no TX timestamp for it.
                        if let Err(e) =
                            ep.send_untimed(&to, &self.ack_params(label), &ack2.encode())
                        {
                            self.ack_send_failed(&e);
                        }
                    }
                }
                // Second ACKs are not tracked: their completion means nothing to us.
                None => {}
            },
            // Accepted, never sent (rdma: no address handle for the peer).
            TransportEvent::SendFailed { id } => match self.sends.remove(id) {
                Some(SendPurpose::Probe(seq)) => {
                    self.send_failed.insert(seq);
                    bump(&self.stats.send_errors);
                }
                Some(SendPurpose::FirstAck(..)) => {
                    self.ack_send_failed(&std::io::Error::other("first ACK was never sent"))
                }
                None => {}
            },
        }
    }

    fn ack_params(&self, flow_label: u32) -> SendParams {
        SendParams {
            flow_label,
            traffic_class: self.p.traffic_class,
            service_level: self.p.service_level,
        }
    }

    fn ack_send_failed(&self, e: &std::io::Error) {
        let n = bump(&self.stats.send_errors) + 1;
        if n.is_power_of_two() {
            tracing::warn!(error = %e, send_errors = n, "ACK send failed");
        }
    }

    fn finish(&mut self, o: ProbeOutcome) {
        let send_failed = !self.send_failed.is_empty() && self.send_failed.remove(&o.sequence);
        let reason = fail_reason(&o.result, send_failed);
        // A target dropped from the pinglist since: its late result is not reported.
        let Some(t) = self.targets.get(&o.target) else {
            return;
        };
        if t.key.kind == PinglistKind::Host {
            // R2R is judged inside the host: no ToR-pair metrics, no summaries.
            let tap = |to: &Option<mpsc::UnboundedSender<TargetOutcome>>| {
                if let Some(tx) = to {
                    let _ = tx.send(TargetOutcome {
                        target_gid: t.key.gid.clone(),
                        target_qpn: t.key.qpn,
                        outcome: o,
                        fail_reason: reason,
                    });
                }
            };
            tap(&self.host_outcomes);
            tap(&self.outcomes);
            return;
        }
        match (&o.result, reason) {
            (ProbeResult::Success(s), _) => {
                bump(&self.stats.probe_success);
                self.metrics.record_success(&t.attrs, s);
            }
            (ProbeResult::Invalid(_), Some(r)) => {
                bump(&self.stats.probe_invalid);
                self.metrics.record_failure(&t.attrs, r);
            }
            (_, r) => {
                bump(&self.stats.probe_failed);
                self.metrics
                    .record_failure(&t.attrs, r.unwrap_or(FailReason::Timeout));
                if r == Some(FailReason::Timeout) && self.lost_paths.len() < MAX_LOST_PATHS {
                    self.lost_paths.push((
                        t.endpoint,
                        SendParams {
                            flow_label: o.flow_label,
                            traffic_class: t.traffic_class,
                            service_level: t.service_level,
                        },
                    ));
                }
            }
        }
        if let Some(agg) = &mut self.aggregator {
            // Inter-ToR windows are also counted per flow label: the controller votes
            // on ToR-spine links with them. An outcome counts in the window its probe was
            // sent in (T1, on the monotonic clock, moved to unix time): a timeout must
            // not spill a fault's loss into the next window, where it would be blamed on
            // whatever that window holds.
            let label = t.key.kind.labelled().then_some(o.flow_label);
            let now = realtime_ns();
            let age = o
                .timestamps
                .t1
                .map_or(0, |t1| monotonic_ns().saturating_sub(t1));
            agg.record_labelled(&t.key, &o.result, label, now.saturating_sub(age));
        }
        if let Some(tap) = &self.outcomes {
            let _ = tap.send(TargetOutcome {
                target_gid: t.key.gid.clone(),
                target_qpn: t.key.qpn,
                outcome: o,
                fail_reason: reason,
            });
        }
        // The Go agent's per-probe line: both GIDs, all six timestamps, the three
        // results (0 when invalid or lost). A cheap level check first: this is per probe.
        if tracing::enabled!(tracing::Level::DEBUG) && !matches!(o.result, ProbeResult::Lost) {
            let ts = &o.timestamps;
            let (valid, rtt, resp, prober) = match &o.result {
                ProbeResult::Success(s) => (
                    true,
                    s.network_rtt_ns,
                    s.responder_delay_ns,
                    s.prober_delay_ns,
                ),
                _ => (false, 0, 0, 0),
            };
            tracing::debug!(
                source_gid = %self.own_gid, target_gid = %t.spec.gid_text, seq = o.sequence,
                flow_label = o.flow_label,
                t1 = ts.t1.unwrap_or(0), t2 = ts.t2.unwrap_or(0), t3 = ts.t3.unwrap_or(0),
                t4 = ts.t4.unwrap_or(0), t5 = ts.t5.unwrap_or(0), t6 = ts.t6.unwrap_or(0),
                rtt_valid = valid, network_rtt_ns = rtt, responder_delay_ns = resp,
                prober_delay_ns = prober, reason = reason.map(|r| r.as_str()).unwrap_or(""),
                "Probe completed with all 6 timestamps"
            );
        }
    }

    /// Sends closed windows (all windows when `all`, at shutdown) to the report sink.
    fn flush_reports(&mut self, all: bool) {
        let (Some(agg), Some(sink)) = (&mut self.aggregator, &self.reports) else {
            return;
        };
        let now = realtime_ns();
        let upto = if all {
            now.saturating_add(self.p.analysis_window_ns.unwrap_or(0))
        } else {
            // Outcomes count at their send time: a window is complete a probe timeout
            // after its end.
            now.saturating_sub(self.p.probe_timeout_ns)
        };
        for (key, w) in agg.take_closed(upto) {
            bump(&self.stats.summaries_offered);
            sink.offer(to_proto(&self.own_gid, &self.p.source_tor, &key, &w));
        }
    }

    /// Rebuilds the target table; targets that stay keep their id and flow-label position.
    /// The transport makes room for every path of the new lists.
    fn apply_pinglists(&mut self, ep: &Transport, lists: &Pinglists, now: u64) {
        if self.p.responder_only {
            return;
        }
        ep.reserve_paths(path_count(lists));
        let mut keep: HashSet<TargetId> = HashSet::new();
        let mut by_kind: [Vec<TargetId>; 5] = Default::default();
        for kind in PinglistKind::ALL {
            for spec in lists.list(kind) {
                // Never probe ourselves, whatever the list says.
                if spec.gid == self.own.gid && spec.qpn == self.own.qpn {
                    continue;
                }
                let key = if kind == PinglistKind::Service {
                    (
                        spec.gid,
                        spec.qpn,
                        kind,
                        spec.flow_label,
                        spec.traffic_class,
                        spec.service_level,
                    )
                } else {
                    (spec.gid, spec.qpn, kind, 0, 0, 0)
                };
                let next_id = &mut self.next_id;
                let id = *self.ids.entry(key).or_insert_with(|| {
                    let id = *next_id;
                    *next_id = next_id.wrapping_add(1);
                    id
                });
                if !keep.insert(id) {
                    continue; // listed twice
                }
                let fresh = match self.targets.get(&id) {
                    Some(t) => t.spec != *spec,
                    None => true,
                };
                if fresh {
                    self.targets.insert(id, self.target_state(spec));
                }
                by_kind[kind as usize].push(id);
            }
        }
        self.targets.retain(|id, _| keep.contains(id));
        self.ids.retain(|_, id| keep.contains(id));
        self.has_targets = !keep.is_empty();
        let [tor_mesh, inter_tor, service, focus, host] = by_kind;
        tracing::info!(
            gid = %self.own_gid, tor_mesh = tor_mesh.len(), inter_tor = inter_tor.len(),
            service = service.len(), focus = focus.len(), host = host.len(), "probe targets set"
        );
        self.kind_targets = [tor_mesh, inter_tor, service, focus, host];
        self.applied_multiplier_bits = self.current_multiplier_bits();
        self.apply_rates(now);
    }

    fn current_multiplier_bits(&self) -> u64 {
        self.p
            .rate_multiplier
            .as_ref()
            .map_or(1.0f64.to_bits(), |m| m.bits())
    }

    /// Re-applies the targets' rates when the self-protection multiplier moved: one
    /// relaxed load per turn, work only on a change (at most once per watchdog interval).
    fn follow_multiplier(&mut self, now: u64) {
        if self.p.rate_multiplier.is_none() || self.p.responder_only {
            return;
        }
        let bits = self.current_multiplier_bits();
        if bits != self.applied_multiplier_bits {
            self.applied_multiplier_bits = bits;
            self.apply_rates(now);
        }
    }

    /// Hands the scheduler every kind's targets at its rate x the applied multiplier.
    fn apply_rates(&mut self, now: u64) {
        let m = f64::from_bits(self.applied_multiplier_bits);
        let [tor_mesh_rate, inter_tor_rate, service_rate, focus_rate, host_rate] =
            self.p.scaled_rates(m);
        let [tor_mesh, inter_tor, service, focus, host] = &self.kind_targets;
        // FOCUS targets are due every 1/rate s, not once per round: the point is more
        // probes through one component, for a while.
        self.scheduler.set_targets_every(
            PinglistKind::Focus,
            focus.clone(),
            focus_rate,
            focus_round_ns(focus_rate),
            now,
        );
        self.scheduler.set_targets_every(
            PinglistKind::Host,
            host.clone(),
            host_rate,
            self.p.host_round_ns,
            now,
        );
        self.scheduler
            .set_targets(PinglistKind::Service, service.clone(), service_rate, now);
        self.scheduler
            .set_targets(PinglistKind::TorMesh, tor_mesh.clone(), tor_mesh_rate, now);
        self.scheduler.set_targets(
            PinglistKind::InterTor,
            inter_tor.clone(),
            inter_tor_rate,
            now,
        );
    }

    fn target_state(&self, spec: &ProbeTarget) -> TargetState {
        let service = spec.kind == PinglistKind::Service;
        // SERVICE: exactly the service's label (no set, no rotation) and its TC/SL when
        // the controller gave them; otherwise the configured ones.
        let labels = if service {
            FlowLabelSet::new(0, 1, spec.flow_label)
        } else if spec.kind == PinglistKind::Focus {
            FlowLabelSet::explicit(&spec.flow_labels)
        } else {
            FlowLabelSet::new(spec.flow_label_seed, spec.flow_label_count, spec.flow_label)
        };
        let pick = |from_target: u8, configured: u8| {
            if service && from_target != 0 {
                from_target
            } else {
                configured
            }
        };
        let attrs = if service {
            let name = self
                .p
                .service_names
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .attribute(&spec.service);
            PathAttrs::with_service(&self.p.source_tor, &spec.tor_id, &name)
        } else {
            PathAttrs::new(&self.p.source_tor, &spec.tor_id)
        };
        if spec.kind != PinglistKind::Host {
            self.metrics.init_path(&attrs);
        }
        TargetState {
            endpoint: Endpoint {
                gid: spec.gid,
                qpn: spec.qpn,
            },
            labels,
            traffic_class: pick(spec.traffic_class, self.p.traffic_class),
            service_level: pick(spec.service_level, self.p.service_level),
            attrs,
            key: PathKey {
                gid: spec.gid_text.as_str().into(),
                tor: spec.tor_id.as_str().into(),
                qpn: spec.qpn,
                kind: spec.kind,
                service: spec.service.as_str().into(),
            },
            spec: spec.clone(),
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
mod tests {
    use super::*;
    use rpingmesh_protocol::rtt::{InvalidReason, RttSample};

    #[test]
    fn datagrams_are_classified() {
        let probe = ProbePacket::probe(7, 9).encode();
        assert_eq!(classify_datagram(40, &probe).unwrap().sequence, 7);
        let mut buf = [0u8; 64];
        buf[..40].copy_from_slice(&probe);
        assert_eq!(classify_datagram(40, &buf).unwrap().t1, 9);
        // Length must be exactly 40, even when the bytes would decode.
        assert_eq!(classify_datagram(41, &buf), Err(DropReason::BadLength));
        assert_eq!(classify_datagram(39, &buf), Err(DropReason::BadLength));
        assert_eq!(
            classify_datagram(40, &buf[..10]),
            Err(DropReason::BadLength)
        );
        let mut bad = probe;
        bad[0] = 2;
        assert_eq!(classify_datagram(40, &bad), Err(DropReason::BadVersion));
        let mut bad = probe;
        bad[1] = 9;
        assert_eq!(classify_datagram(40, &bad), Err(DropReason::UnknownMsgType));
        let mut bad = probe;
        bad[2] = 7;
        assert_eq!(classify_datagram(40, &bad), Err(DropReason::UnknownAckType));
        let mut bad = probe;
        bad[2] = 1;
        assert_eq!(classify_datagram(40, &bad), Err(DropReason::Inconsistent));
    }

    #[test]
    fn failure_reasons() {
        let s = RttSample {
            network_rtt_ns: 1,
            prober_delay_ns: 2,
            responder_delay_ns: 3,
        };
        assert_eq!(fail_reason(&ProbeResult::Success(s), false), None);
        assert_eq!(
            fail_reason(&ProbeResult::Lost, false),
            Some(FailReason::Timeout)
        );
        assert_eq!(
            fail_reason(&ProbeResult::Lost, true),
            Some(FailReason::SendError)
        );
        assert_eq!(
            fail_reason(&ProbeResult::Invalid(InvalidReason::Negative), false),
            Some(FailReason::NegativeRtt)
        );
        assert_eq!(
            fail_reason(&ProbeResult::Invalid(InvalidReason::MissingTimestamp), true),
            Some(FailReason::MissingTimestamp)
        );
        assert_eq!(
            fail_reason(&ProbeResult::Invalid(InvalidReason::Absurd), false),
            Some(FailReason::AbsurdRtt)
        );
    }

    #[test]
    fn send_table_tracks_ids_in_any_completion_order() {
        let mut t: SendTable<u8> = SendTable::default();
        assert!(t.insert(10, 1, 0));
        assert!(t.insert(11, 2, 0));
        assert!(t.insert(13, 4, 0)); // id 12 failed to send: a gap
        assert_eq!(t.len(), 3);
        assert_eq!(t.remove(11), Some(2));
        assert_eq!(t.remove(11), None, "removed once");
        assert_eq!(t.remove(12), None, "never inserted");
        assert_eq!(t.remove(10), Some(1));
        assert_eq!(t.remove(9), None, "before the window");
        assert_eq!(t.remove(13), Some(4));
        assert!(t.is_empty());
        assert_eq!(t.slots.len(), 0, "done slots are popped");
        // Empty again: the next id starts a new window anywhere.
        assert!(t.insert(500, 5, 0));
        assert_eq!(t.remove(500), Some(5));
    }

    #[test]
    fn send_table_wraps_and_bounds() {
        let mut t: SendTable<u8> = SendTable::default();
        assert!(t.insert(u32::MAX - 1, 1, 0));
        assert!(t.insert(u32::MAX, 2, 0));
        assert!(t.insert(0, 3, 0));
        assert_eq!(t.remove(0), Some(3));
        assert_eq!(t.remove(u32::MAX - 1), Some(1));
        assert_eq!(t.remove(u32::MAX), Some(2));
        assert!(t.insert(7, 1, 0));
        assert!(!t.insert(7 + SEND_TABLE_SPAN, 2, 0), "absurdly far ahead");
        assert!(!t.insert(6, 2, 0), "behind the oldest tracked send");
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn send_table_expires_lost_completions() {
        let mut t: SendTable<u8> = SendTable::default();
        t.insert(1, 1, 100);
        t.insert(2, 2, 900);
        t.insert(3, 3, 150);
        t.expire(1_000, 500);
        assert_eq!(t.len(), 1);
        assert_eq!(t.remove(1), None);
        assert_eq!(t.remove(3), None);
        assert_eq!(t.remove(2), Some(2));
        assert!(t.is_empty());
        assert_eq!(t.slots.len(), 0);
    }

    #[test]
    fn params_from_config_resolve_inherited_rates() {
        let cfg = AgentConfig {
            tor_id: "t".into(),
            inter_tor_probe_rate_per_second: 1.0,
            analysis_report_enabled: false,
            service_level: 3,
            traffic_class: 184,
            ..AgentConfig::default()
        };
        let p = DriverParams::from_config(&cfg, 5);
        assert_eq!(p.service_rate, 10.0, "inherited");
        assert_eq!(p.tor_mesh_rate, 10.0);
        assert_eq!(p.inter_tor_rate, 1.0);
        assert_eq!(p.round_interval_ns, 500_000_000);
        assert_eq!(p.probe_timeout_ns, 1_000_000_000);
        assert_eq!(p.analysis_window_ns, None);
        assert_eq!((p.service_level, p.traffic_class, p.seq_epoch), (3, 184, 5));
        assert!(p.rate_multiplier.is_none());
    }

    #[test]
    fn scaled_rates_follow_the_multiplier() {
        let p = DriverParams::from_config(
            &AgentConfig {
                inter_tor_probe_rate_per_second: 1.0,
                ..AgentConfig::default()
            },
            0,
        );
        assert_eq!(p.scaled_rates(1.0), [10.0, 1.0, 10.0, 20.0, 0.0]);
        assert_eq!(p.scaled_rates(0.5), [5.0, 0.5, 5.0, 10.0, 0.0]);
        assert_eq!(p.scaled_rates(0.1), [1.0, 0.1, 1.0, 2.0, 0.0]);
        // Never stop, never speed up.
        assert_eq!(p.scaled_rates(0.0), [10.0, 1.0, 10.0, 20.0, 0.0]);
        assert_eq!(p.scaled_rates(2.0), [10.0, 1.0, 10.0, 20.0, 0.0]);
    }

    /// Probes the scheduler hands out over [from, to) polled every ms.
    fn polls(s: &mut ProbeScheduler, from: u64, to: u64) -> usize {
        let mut n = 0;
        for t in (from..to).step_by(1_000_000) {
            while s.poll(t).is_some() {
                n += 1;
            }
        }
        n
    }

    #[test]
    fn driver_halves_its_probe_rate_when_the_multiplier_drops_to_half() {
        const S: u64 = 1_000_000_000;
        let shared = SharedMultiplier::default();
        let mut params = DriverParams::from_config(
            &AgentConfig {
                tor_id: "tor-a".into(),
                probe_interval_ms: 10,
                tor_mesh_probe_rate_per_second: 20.0,
                inter_tor_probe_rate_per_second: 10.0,
                ..AgentConfig::default()
            },
            0,
        );
        params.rate_multiplier = Some(shared.clone());
        // The endpoint registers with tokio; the driver loop itself is not run.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _rt = rt.enter();
        let ep = rpingmesh_verbs::udp::UdpEndpoint::bind(
            std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0)),
            "udp0",
        )
        .unwrap();
        let RnicDriver {
            endpoint,
            state: mut st,
        } = RnicDriver::new(ep, params, Metrics::disabled());
        let target = |last: u8, kind| {
            let mut gid = [0u8; 16];
            gid[15] = last;
            ProbeTarget::new(Ipv6Addr::from(gid), 100 + u32::from(last), "tor-b", kind)
        };
        let lists = Pinglists {
            focus: Vec::new(),
            tor_mesh: vec![target(1, PinglistKind::TorMesh)],
            inter_tor: vec![target(2, PinglistKind::InterTor)],
            service: vec![],
            host: vec![],
        };
        st.apply_pinglists(&endpoint, &lists, 0);
        // Unthrottled: 20/s + 10/s over 10 s.
        let full = polls(&mut st.scheduler, 0, 10 * S);
        assert!((295..=305).contains(&full), "{full}");
        // An unchanged multiplier changes nothing.
        st.follow_multiplier(10 * S);
        assert_eq!(st.applied_multiplier_bits, 1.0f64.to_bits());
        shared.set(0.5);
        st.follow_multiplier(10 * S);
        let half = polls(&mut st.scheduler, 10 * S, 20 * S);
        assert!((145..=155).contains(&half), "{half}");
        // New pinglists keep the multiplier in force.
        st.apply_pinglists(&endpoint, &lists, 20 * S);
        let still = polls(&mut st.scheduler, 20 * S, 30 * S);
        assert!((145..=155).contains(&still), "{still}");
        // Release restores the configured rates.
        shared.set(1.0);
        st.follow_multiplier(30 * S);
        let back = polls(&mut st.scheduler, 30 * S, 40 * S);
        assert!((295..=305).contains(&back), "{back}");
    }
}
