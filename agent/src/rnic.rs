//! The per-RNIC driver: one task owning the transport endpoint, a prober, a responder, a
//! scheduler and the targets' flow-label sets. It only moves events between the transport
//! and the sans-IO core; all protocol decisions are the core's.

use std::collections::{HashMap, HashSet};
use std::net::Ipv6Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rpingmesh_protocol::aggregate::PathAggregator;
use rpingmesh_protocol::flowlabel::{rotation_epoch, FlowLabelSet};
use rpingmesh_protocol::prober::{ProbeOutcome, ProbeResult, Prober, ProberConfig};
use rpingmesh_protocol::responder::{PendingId, Responder};
use rpingmesh_protocol::schedule::ProbeScheduler;
use rpingmesh_protocol::wire::{MsgType, ProbePacket, WireError, PACKET_LEN};
use rpingmesh_protocol::{PinglistKind, TargetId};
use rpingmesh_verbs::clock::{monotonic_ns, realtime_ns};
use rpingmesh_verbs::udp::UdpEndpoint;
use rpingmesh_verbs::{Endpoint, SendId, SendParams, TransportEvent};
use tokio::sync::{mpsc, watch};

use crate::config::AgentConfig;
use crate::report::{to_proto, PathKey, ReportSink};
use crate::targets::{Pinglists, ProbeTarget};
use crate::telemetry::{DropReason, FailReason, Metrics, PathAttrs};

/// Probes started per loop turn before received datagrams are looked at again.
const SEND_BURST: usize = 64;
/// Non-blocking re-polls of the endpoint after a batch of events.
const DRAIN_ROUNDS: usize = 4;
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
}

impl DriverParams {
    pub fn from_config(cfg: &AgentConfig, seq_epoch: u32) -> Self {
        DriverParams {
            source_tor: cfg.tor_id.clone(),
            round_interval_ns: cfg.probe_interval_ms.saturating_mul(1_000_000),
            tor_mesh_rate: cfg.tor_mesh_rate(),
            inter_tor_rate: cfg.inter_tor_rate(),
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
        }
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
    pub outcomes: Option<mpsc::UnboundedSender<TargetOutcome>>,
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
    /// Its completion is T4: the second ACK follows.
    FirstAck(PendingId),
}

struct TargetState {
    spec: ProbeTarget,
    endpoint: Endpoint,
    labels: FlowLabelSet,
    attrs: PathAttrs,
    key: PathKey,
}

type TargetKey = (Ipv6Addr, u32, PinglistKind);

struct State {
    p: DriverParams,
    own: Endpoint,
    own_gid: String,
    prober: Prober,
    responder: Responder<Endpoint>,
    scheduler: ProbeScheduler,
    has_targets: bool,
    targets: HashMap<TargetId, TargetState>,
    ids: HashMap<TargetKey, TargetId>,
    next_id: TargetId,
    sends: HashMap<SendId, (SendPurpose, u64)>,
    send_failed: HashSet<u64>,
    aggregator: Option<PathAggregator<PathKey>>,
    metrics: Metrics,
    stats: Arc<DriverStats>,
    reports: Option<ReportSink>,
    outcomes: Option<mpsc::UnboundedSender<TargetOutcome>>,
    timeouts: Vec<ProbeOutcome>,
    next_housekeeping_ns: u64,
    next_flush_ns: u64,
}

pub struct RnicDriver {
    endpoint: UdpEndpoint,
    state: State,
}

impl RnicDriver {
    pub fn new(endpoint: UdpEndpoint, params: DriverParams, metrics: Metrics) -> Self {
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
            targets: HashMap::new(),
            ids: HashMap::new(),
            next_id: 0,
            sends: HashMap::new(),
            send_failed: HashSet::new(),
            aggregator: params.analysis_window_ns.map(PathAggregator::new),
            metrics,
            stats: Arc::new(DriverStats::default()),
            reports: None,
            outcomes: None,
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

    pub fn stats(&self) -> Arc<DriverStats> {
        self.state.stats.clone()
    }

    /// Runs until shutdown; then flushes the open aggregation windows to the report sink.
    pub async fn run(self, io: DriverIo) {
        let RnicDriver {
            endpoint,
            mut state,
        } = self;
        let DriverIo {
            mut pinglists,
            mut shutdown,
            reports,
            outcomes,
        } = io;
        state.reports = reports;
        state.outcomes = outcomes;
        let lists = pinglists.borrow_and_update().clone();
        state.apply_pinglists(&lists, monotonic_ns());
        let mut pinglists_open = true;
        let mut events: Vec<TransportEvent> = Vec::with_capacity(256);
        let sleep = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(sleep);
        let mut io_errors = 0u64;
        let mut armed_deadline = u64::MAX;
        enum Wake {
            Shutdown,
            Io(std::io::Result<()>),
            Pinglists(bool),
            Timer,
        }
        loop {
            let now = monotonic_ns();
            state.send_due(&endpoint, now);
            state.poll_timers(now);
            let deadline = state.next_deadline(now);
            // Re-arming the timer costs: only when the deadline moved.
            if deadline != armed_deadline {
                armed_deadline = deadline;
                let wait = Duration::from_nanos(deadline.saturating_sub(monotonic_ns()));
                sleep.as_mut().reset(tokio::time::Instant::now() + wait);
            }
            let wake = tokio::select! {
                biased;
                r = shutdown.changed() => {
                    if r.is_err() || *shutdown.borrow() { Wake::Shutdown } else { Wake::Timer }
                }
                r = endpoint.wait_events(&mut events) => Wake::Io(r),
                r = pinglists.changed(), if pinglists_open => Wake::Pinglists(r.is_ok()),
                _ = &mut sleep => Wake::Timer,
            };
            match wake {
                Wake::Shutdown => break,
                Wake::Io(Ok(())) => {
                    // Handling may have sent (first ACKs, probes) whose completions are
                    // already queued: take them now instead of via another select turn.
                    for _ in 0..DRAIN_ROUNDS {
                        for ev in events.drain(..) {
                            state.on_event(&endpoint, ev);
                        }
                        if endpoint.poll_events(&mut events).is_err() || events.is_empty() {
                            break;
                        }
                    }
                    for ev in events.drain(..) {
                        state.on_event(&endpoint, ev);
                    }
                }
                Wake::Io(Err(e)) => {
                    io_errors += 1;
                    if io_errors.is_power_of_two() {
                        tracing::warn!(error = %e, errors = io_errors, "transport receive error");
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Wake::Pinglists(true) => {
                    let lists = pinglists.borrow_and_update().clone();
                    state.apply_pinglists(&lists, monotonic_ns());
                }
                // The monitor is gone: keep probing the last lists.
                Wake::Pinglists(false) => pinglists_open = false,
                Wake::Timer => {}
            }
        }
        state.flush_reports(true);
    }
}

impl State {
    fn send_due(&mut self, ep: &UdpEndpoint, now: u64) {
        if !self.has_targets {
            return;
        }
        let mut label_epoch = None;
        for _ in 0..SEND_BURST {
            if self.prober.in_flight() >= self.p.max_in_flight {
                return;
            }
            let Some((_kind, id)) = self.scheduler.poll(now) else {
                return;
            };
            let epoch = *label_epoch.get_or_insert_with(|| {
                rotation_epoch(
                    realtime_ns() / 1_000_000_000,
                    self.p.flow_label_rotation_period_sec,
                )
            });
            let Some(t) = self.targets.get_mut(&id) else {
                continue;
            };
            let flow_label = t.labels.next_label(epoch);
            let to = t.endpoint;
            let params = SendParams {
                flow_label,
                traffic_class: self.p.traffic_class,
                service_level: self.p.service_level,
            };
            let t1 = monotonic_ns();
            let pkt = self.prober.start_probe(id, flow_label, t1);
            bump(&self.stats.probes_sent);
            match ep.send(&to, &params, &pkt.encode()) {
                Ok(sid) => {
                    self.sends
                        .insert(sid, (SendPurpose::Probe(pkt.sequence), t1));
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

    fn poll_timers(&mut self, now: u64) {
        let mut timeouts = std::mem::take(&mut self.timeouts);
        self.prober.poll_timeouts(now, &mut timeouts);
        for o in timeouts.drain(..) {
            self.finish(o);
        }
        self.timeouts = timeouts;
        if now >= self.next_housekeeping_ns {
            self.next_housekeeping_ns = now + HOUSEKEEPING_NS;
            self.responder.expire(now);
            // Sends whose completion never came (e.g. a TX timestamp the kernel skipped).
            let horizon = self.p.probe_timeout_ns.saturating_mul(2);
            self.sends
                .retain(|_, (_, at)| now.saturating_sub(*at) <= horizon);
            if self.send_failed.len() > 2 * self.p.max_in_flight.max(1024) {
                self.send_failed.clear();
            }
        }
        if now >= self.next_flush_ns {
            self.next_flush_ns = now + REPORT_FLUSH_NS;
            self.flush_reports(false);
        }
    }

    fn next_deadline(&self, now: u64) -> u64 {
        let mut d = self.next_housekeeping_ns.min(self.next_flush_ns);
        if let Some(t) = self.prober.next_timeout() {
            d = d.min(t);
        }
        if self.has_targets && self.prober.in_flight() < self.p.max_in_flight {
            if let Some(t) = self.scheduler.next_wakeup_ns(now) {
                d = d.min(t);
            }
        }
        d
    }

    fn on_event(&mut self, ep: &UdpEndpoint, ev: TransportEvent) {
        match ev {
            TransportEvent::Received {
                from,
                len,
                data,
                rx_ts_ns,
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
                let now = monotonic_ns();
                match pkt.msg_type {
                    MsgType::Probe => {
                        let (pending, ack) = self.responder.on_probe(from, &pkt, rx_ts_ns, now);
                        bump(&self.stats.probes_answered);
                        match ep.send(&from, &self.ack_params(), &ack.encode()) {
                            Ok(sid) => {
                                self.sends
                                    .insert(sid, (SendPurpose::FirstAck(pending), now));
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
            TransportEvent::Sent { id, tx_ts_ns } => match self.sends.remove(&id) {
                Some((SendPurpose::Probe(seq), _)) => {
                    if let Some(o) = self.prober.on_probe_sent(seq, tx_ts_ns, monotonic_ns()) {
                        self.finish(o);
                    }
                }
                Some((SendPurpose::FirstAck(pending), _)) => {
                    if let Some((to, ack2)) = self.responder.on_first_ack_sent(pending, tx_ts_ns) {
                        if let Err(e) = ep.send(&to, &self.ack_params(), &ack2.encode()) {
                            self.ack_send_failed(&e);
                        }
                    }
                }
                // Second ACKs are not tracked: their completion means nothing to us.
                None => {}
            },
        }
    }

    fn ack_params(&self) -> SendParams {
        SendParams {
            flow_label: 0,
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
        let send_failed = self.send_failed.remove(&o.sequence);
        let reason = fail_reason(&o.result, send_failed);
        // A target dropped from the pinglist since: its late result is not reported.
        let Some(t) = self.targets.get(&o.target) else {
            return;
        };
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
            }
        }
        if let Some(agg) = &mut self.aggregator {
            agg.record(&t.key, &o.result, realtime_ns());
        }
        if let Some(tap) = &self.outcomes {
            let _ = tap.send(TargetOutcome {
                target_gid: t.key.gid.clone(),
                target_qpn: t.key.qpn,
                outcome: o,
                fail_reason: reason,
            });
        }
        if matches!(o.result, ProbeResult::Success(_)) {
            tracing::trace!(
                target = %t.spec.gid_text, seq = o.sequence, flow_label = o.flow_label,
                t1 = ?o.timestamps.t1, t2 = ?o.timestamps.t2, t3 = ?o.timestamps.t3,
                t4 = ?o.timestamps.t4, t5 = ?o.timestamps.t5, t6 = ?o.timestamps.t6,
                "probe"
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
            now
        };
        for (key, w) in agg.take_closed(upto) {
            bump(&self.stats.summaries_offered);
            sink.offer(to_proto(&self.own_gid, &self.p.source_tor, &key, &w));
        }
    }

    /// Rebuilds the target table; targets that stay keep their id and flow-label position.
    fn apply_pinglists(&mut self, lists: &Pinglists, now: u64) {
        if self.p.responder_only {
            return;
        }
        let mut keep: HashSet<TargetId> = HashSet::new();
        let mut by_kind: [Vec<TargetId>; 2] = [Vec::new(), Vec::new()];
        for kind in [PinglistKind::TorMesh, PinglistKind::InterTor] {
            for spec in lists.list(kind) {
                // Never probe ourselves, whatever the list says.
                if spec.gid == self.own.gid && spec.qpn == self.own.qpn {
                    continue;
                }
                let key = (spec.gid, spec.qpn, kind);
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
        let [tor_mesh, inter_tor] = by_kind;
        tracing::info!(
            gid = %self.own_gid, tor_mesh = tor_mesh.len(), inter_tor = inter_tor.len(),
            "probe targets set"
        );
        self.scheduler
            .set_targets(PinglistKind::TorMesh, tor_mesh, self.p.tor_mesh_rate, now);
        self.scheduler.set_targets(
            PinglistKind::InterTor,
            inter_tor,
            self.p.inter_tor_rate,
            now,
        );
    }

    fn target_state(&self, spec: &ProbeTarget) -> TargetState {
        TargetState {
            endpoint: Endpoint {
                gid: spec.gid,
                qpn: spec.qpn,
            },
            labels: FlowLabelSet::new(spec.flow_label_seed, spec.flow_label_count, spec.flow_label),
            attrs: PathAttrs::new(&self.p.source_tor, &spec.tor_id),
            key: PathKey {
                gid: spec.gid_text.as_str().into(),
                tor: spec.tor_id.as_str().into(),
                qpn: spec.qpn,
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
        assert_eq!(p.tor_mesh_rate, 10.0);
        assert_eq!(p.inter_tor_rate, 1.0);
        assert_eq!(p.round_interval_ns, 500_000_000);
        assert_eq!(p.probe_timeout_ns, 1_000_000_000);
        assert_eq!(p.analysis_window_ns, None);
        assert_eq!((p.service_level, p.traffic_class, p.seq_epoch), (3, 184, 5));
    }
}
