//! Per-path window summaries -> bounded channel -> outbox -> `ReportProbeAnalysis`
//! batches. Probing never waits on reporting: a full channel drops the summary and
//! counts it. Reporting never loses a window to a failed send: batches are retried.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rpingmesh_proto::controller_agent::{FlowLabelStats, PathSummary, ProbeAnalysisAck};
use rpingmesh_protocol::aggregate::WindowSummary;
use rpingmesh_protocol::PinglistKind;
use tokio::sync::mpsc;

use crate::controller_client::ControllerClient;

/// Aggregation key of one path: target GID (full form), ToR, QPN, the pinglist kind and
/// (SERVICE) the service name, so SERVICE windows are reported apart from the ToR ones.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PathKey {
    pub gid: Arc<str>,
    pub tor: Arc<str>,
    pub qpn: u32,
    pub kind: PinglistKind,
    /// Empty for ToR-mesh and inter-ToR.
    pub service: Arc<str>,
}

pub fn to_proto(
    source_gid: &str,
    source_tor: &str,
    key: &PathKey,
    w: &WindowSummary,
) -> PathSummary {
    PathSummary {
        source_gid: source_gid.to_string(),
        source_tor_id: source_tor.to_string(),
        target_gid: key.gid.to_string(),
        target_tor_id: key.tor.to_string(),
        target_qpn: key.qpn,
        window_start_unix_ns: w.window_start_unix_ns,
        window_duration_ms: w.window_duration_ms,
        probe_total: w.probe_total,
        probe_success: w.probe_success,
        probe_failed: w.probe_failed,
        network_rtt_min_ns: w.network_rtt_min_ns,
        network_rtt_max_ns: w.network_rtt_max_ns,
        network_rtt_p50_ns: w.network_rtt_p50_ns,
        network_rtt_p99_ns: w.network_rtt_p99_ns,
        invalid_rtt_count: w.invalid_rtt_count,
        prober_delay_p50_ns: w.prober_delay_p50_ns,
        prober_delay_p99_ns: w.prober_delay_p99_ns,
        responder_delay_p50_ns: w.responder_delay_p50_ns,
        responder_delay_p99_ns: w.responder_delay_p99_ns,
        pinglist_type: key.kind as i32,
        service: key.service.to_string(),
        flow_labels: w
            .labels
            .iter()
            // FOCUS targets are few and asked for by the controller (a suspect's labels,
            // an operator's trace): their labels always come back.
            .take(
                if w.label_detail_needed() || key.kind == PinglistKind::Focus {
                    usize::MAX
                } else {
                    0
                },
            )
            .map(|l| FlowLabelStats {
                flow_label: l.flow_label,
                probe_total: l.probe_total,
                probe_failed: l.probe_failed,
                network_rtt_p50_ns: l.network_rtt_p50_ns,
                network_rtt_max_ns: l.network_rtt_max_ns,
                probe_invalid: l.probe_invalid,
            })
            .collect(),
        rc_ring: None,
    }
}

/// The probing side's end of the report channel.
#[derive(Clone)]
pub struct ReportSink {
    tx: mpsc::Sender<PathSummary>,
    dropped: Arc<AtomicU64>,
}

impl ReportSink {
    /// Never blocks; a full (or closed) channel drops the summary and counts it.
    pub fn offer(&self, s: PathSummary) {
        if self.tx.try_send(s).is_err() {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed);
            if n.is_power_of_two() {
                tracing::warn!(
                    dropped_total = n + 1,
                    "report channel full: PathSummary dropped"
                );
            }
        }
    }
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// A report channel of `capacity` summaries.
pub fn channel(capacity: usize) -> (ReportSink, mpsc::Receiver<PathSummary>) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    (
        ReportSink {
            tx,
            dropped: Arc::new(AtomicU64::new(0)),
        },
        rx,
    )
}

/// Summaries waiting to be reported (pure: no I/O, no clock). A failed batch stays at the
/// front and is sent again, so a controller that is down, restarting or slow loses
/// nothing; only past `cap` are the oldest dropped (and counted).
#[derive(Debug)]
pub struct Outbox {
    pending: VecDeque<PathSummary>,
    cap: usize,
    dropped: u64,
    /// Consecutive failed sends (for the back-off).
    failures: u32,
}

impl Outbox {
    pub fn new(cap: usize) -> Self {
        Outbox {
            pending: VecDeque::new(),
            cap: cap.max(1),
            dropped: 0,
            failures: 0,
        }
    }

    pub fn push(&mut self, s: PathSummary) {
        if self.pending.len() >= self.cap {
            self.pending.pop_front();
            self.dropped += 1;
        }
        self.pending.push_back(s);
    }

    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Summaries dropped because the outbox was full.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The next batch (up to `max`, oldest first); it stays queued until `sent`.
    pub fn batch(&self, max: usize) -> Vec<PathSummary> {
        self.pending.iter().take(max.max(1)).cloned().collect()
    }

    /// The controller took the first `n`.
    pub fn sent(&mut self, n: usize) {
        let n = n.min(self.pending.len());
        self.pending.drain(..n);
        self.failures = 0;
    }

    /// A send failed: the batch stays; returns how long to wait before the next try
    /// (0.5 s doubling, at most 8 s).
    pub fn failed(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let ms = 500u64 << self.failures.saturating_sub(1).min(4);
        Duration::from_millis(ms)
    }

    pub fn failing(&self) -> bool {
        self.failures > 0
    }
}

/// Summaries kept while the controller cannot take them (about 2 MB at most).
pub const OUTBOX_CAP: usize = 8192;

/// One ReportProbeAnalysis call in flight (with its 10 s timeout).
type InFlight = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = Result<
                    Result<ProbeAnalysisAck, crate::controller_client::ControllerError>,
                    tokio::time::error::Elapsed,
                >,
            > + Send,
    >,
>;

/// Sends batches until every sender is dropped; then tries once more to deliver what is
/// left and returns. While a batch is in flight (or waiting to be retried), new
/// summaries keep moving from the channel to the outbox, so the probing side never
/// finds the channel full because the controller is slow.
/// `focus` gets each ack's `focus_generation` (the cluster monitors fetch their FOCUS
/// lists again when it moves). With `await_focus`, once a window's summaries are all
/// delivered the reporter also holds one empty report open until the controller has
/// localized that window ([`FocusAwait`]), so FOCUS lists planned from it arrive within
/// the next window rather than with its report.
pub async fn run_reporter(
    client: ControllerClient,
    agent_id: String,
    mut rx: mpsc::Receiver<PathSummary>,
    batch_max: usize,
    focus: tokio::sync::watch::Sender<u64>,
    await_focus: bool,
) {
    let batch_max = batch_max.max(1);
    let mut outbox = Outbox::new(OUTBOX_CAP);
    let mut in_flight: Option<(usize, u64, InFlight)> = None;
    let mut awaits = FocusAwait::new(await_focus);
    let mut awaiting: Option<(u64, InFlight)> = None;
    let note_focus = |ack: &ProbeAnalysisAck| {
        focus.send_if_modified(|g| {
            let moved = *g != ack.focus_generation;
            *g = ack.focus_generation;
            moved
        });
    };
    let mut retry_at = tokio::time::Instant::now();
    let mut open = true;
    let mut dropped_logged = 0u64;
    loop {
        if in_flight.is_none() && !outbox.is_empty() && tokio::time::Instant::now() >= retry_at {
            let batch = outbox.batch(batch_max);
            let n = batch.len();
            let newest = batch
                .iter()
                .map(|s| s.window_start_unix_ns)
                .max()
                .unwrap_or(0);
            let (c, id) = (client.clone(), agent_id.clone());
            in_flight = Some((
                n,
                newest,
                Box::pin(async move {
                    tokio::time::timeout(Duration::from_secs(10), c.report(&id, batch)).await
                }),
            ));
        }
        if !open && in_flight.is_none() {
            // Shutting down: nothing in flight, so the last try is over.
            if !outbox.is_empty() {
                tracing::warn!(
                    summaries = outbox.len(),
                    "PathSummary reports not delivered at shutdown"
                );
            }
            return;
        }
        tokio::select! {
            r = rx.recv(), if open => match r {
                Some(s) => {
                    outbox.push(s);
                    if outbox.dropped() > dropped_logged && outbox.dropped().is_power_of_two() {
                        dropped_logged = outbox.dropped();
                        tracing::warn!(dropped_total = outbox.dropped(), "report outbox full: oldest PathSummary dropped");
                    }
                }
                None => {
                    open = false;
                    retry_at = tokio::time::Instant::now();
                }
            },
            r = async { in_flight.as_mut().expect("guarded").2.as_mut().await }, if in_flight.is_some() => {
                let (n, newest, _) = in_flight.take().expect("guarded");
                match r {
                    Ok(Ok(ack)) => {
                        if outbox.failing() {
                            tracing::info!(queued = outbox.len(), "PathSummary reports accepted again");
                        }
                        outbox.sent(n);
                        tracing::debug!(summaries = n, accepted = ack.accepted, sla_violations = ack.sla_violations, "reported");
                        note_focus(&ack);
                        awaits.reported(newest);
                        if outbox.is_empty() && awaiting.is_none() {
                            if let Some(w) = awaits.next_window() {
                                awaiting = Some((w, await_window(&client, &agent_id, w)));
                            }
                        }
                    }
                    Ok(Err(e)) => {
                        if !outbox.failing() {
                            tracing::warn!(error = %e, queued = outbox.len(), "PathSummary report failed; kept for a retry");
                        }
                        retry_at = tokio::time::Instant::now() + outbox.failed();
                    }
                    Err(_) => {
                        if !outbox.failing() {
                            tracing::warn!(queued = outbox.len(), "PathSummary report timed out; kept for a retry");
                        }
                        retry_at = tokio::time::Instant::now() + outbox.failed();
                    }
                }
                if !open && outbox.failing() {
                    return; // shutting down: no retries
                }
            },
            r = async { awaiting.as_mut().expect("guarded").1.as_mut().await }, if awaiting.is_some() => {
                let (w, _) = awaiting.take().expect("guarded");
                let through = match r {
                    Ok(Ok(ack)) => {
                        note_focus(&ack);
                        ack.localized_through_unix_ns
                    }
                    // An await that fails costs only promptness: the next window's ack
                    // carries the generation too.
                    _ => 0,
                };
                if let Some(w) = awaits.answered(w, through) {
                    awaiting = Some((w, await_window(&client, &agent_id, w)));
                }
            },
            _ = tokio::time::sleep_until(retry_at), if in_flight.is_none() && !outbox.is_empty() && open => {}
        }
    }
}

/// An empty report that the controller answers once it has localized window `w`.
fn await_window(client: &ControllerClient, agent_id: &str, w: u64) -> InFlight {
    let (c, id) = (client.clone(), agent_id.to_string());
    Box::pin(
        async move { tokio::time::timeout(Duration::from_secs(10), c.await_window(&id, w)).await },
    )
}

/// Which window the reporter awaits the localization of (pure). One await per window,
/// for the newest window delivered; a controller that answered before it localized the
/// window (its wait is bounded below the RPC timeout) is asked again, at most
/// [`FocusAwait::MAX_TRIES`] times in all; a controller that localizes nothing (0) is
/// not asked again for that window.
#[derive(Debug, Default)]
pub struct FocusAwait {
    enabled: bool,
    /// The newest window whose summaries were delivered.
    delivered: u64,
    /// The newest window awaited, and the tries for it.
    awaited: u64,
    tries: u32,
}

impl FocusAwait {
    pub const MAX_TRIES: u32 = 3;

    pub fn new(enabled: bool) -> Self {
        FocusAwait {
            enabled,
            ..Default::default()
        }
    }

    /// A batch whose newest window started at `newest` was delivered.
    pub fn reported(&mut self, newest: u64) {
        self.delivered = self.delivered.max(newest);
    }

    /// The window to await now, if any (called when everything queued is delivered).
    pub fn next_window(&mut self) -> Option<u64> {
        if !self.enabled || self.delivered == 0 || self.delivered <= self.awaited {
            return None;
        }
        self.awaited = self.delivered;
        self.tries = 1;
        Some(self.awaited)
    }

    /// The await of `w` was answered with `through` localized: the window to await
    /// next (the same one again, or a newer one delivered meanwhile).
    pub fn answered(&mut self, w: u64, through: u64) -> Option<u64> {
        if w == self.awaited && through > 0 && through < w && self.tries < Self::MAX_TRIES {
            self.tries += 1;
            return Some(w);
        }
        self.next_window()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(i: u32) -> PathSummary {
        PathSummary {
            probe_total: i,
            ..Default::default()
        }
    }

    #[test]
    fn proto_carries_every_field() {
        let key = PathKey {
            gid: "g".into(),
            tor: "t2".into(),
            qpn: 9,
            kind: PinglistKind::Service,
            service: "training".into(),
        };
        let w = WindowSummary {
            window_start_unix_ns: 1,
            window_duration_ms: 2,
            probe_total: 3,
            probe_success: 4,
            probe_failed: 5,
            invalid_rtt_count: 6,
            network_rtt_min_ns: 7,
            network_rtt_max_ns: 8,
            network_rtt_p50_ns: 9,
            network_rtt_p99_ns: 10,
            prober_delay_p50_ns: 11,
            prober_delay_p99_ns: 12,
            responder_delay_p50_ns: 13,
            responder_delay_p99_ns: 14,
            // A lost probe on the label: the detail is sent.
            labels: vec![rpingmesh_protocol::aggregate::LabelSummary {
                flow_label: 15,
                probe_total: 16,
                probe_failed: 17,
                probe_invalid: 20,
                network_rtt_p50_ns: 18,
                network_rtt_max_ns: 19,
            }],
        };
        let p = to_proto("sg", "t1", &key, &w);
        assert_eq!(
            (p.source_gid.as_str(), p.source_tor_id.as_str()),
            ("sg", "t1")
        );
        assert_eq!(
            (
                p.target_gid.as_str(),
                p.target_tor_id.as_str(),
                p.target_qpn
            ),
            ("g", "t2", 9)
        );
        assert_eq!(
            [
                p.window_start_unix_ns,
                p.window_duration_ms as u64,
                p.probe_total as u64,
                p.probe_success as u64,
                p.probe_failed as u64,
                p.invalid_rtt_count as u64,
                p.network_rtt_min_ns,
                p.network_rtt_max_ns,
                p.network_rtt_p50_ns,
                p.network_rtt_p99_ns,
                p.prober_delay_p50_ns,
                p.prober_delay_p99_ns,
                p.responder_delay_p50_ns,
                p.responder_delay_p99_ns
            ],
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
        );
        let l = &p.flow_labels[..];
        assert_eq!(
            l.iter()
                .map(|l| [
                    l.flow_label as u64,
                    l.probe_total as u64,
                    l.probe_failed as u64,
                    l.network_rtt_p50_ns,
                    l.network_rtt_max_ns,
                    l.probe_invalid as u64
                ])
                .collect::<Vec<_>>(),
            vec![[15, 16, 17, 18, 19, 20]]
        );
        assert_eq!(p.pinglist_type, 2, "SERVICE");
        assert_eq!(p.service, "training");
        let tor = PathKey {
            kind: PinglistKind::InterTor,
            service: "".into(),
            ..key
        };
        let p = to_proto("sg", "t1", &tor, &w);
        assert_eq!((p.pinglist_type, p.service.as_str()), (1, ""));
    }

    #[tokio::test]
    async fn full_channel_drops_and_counts() {
        let (sink, mut rx) = channel(2);
        for i in 0..5 {
            sink.offer(summary(i));
        }
        assert_eq!(sink.dropped(), 3);
        assert_eq!(rx.recv().await.unwrap().probe_total, 0);
        assert_eq!(rx.recv().await.unwrap().probe_total, 1);
    }

    #[test]
    fn outbox_keeps_failed_batches_in_order_and_drops_oldest_past_its_cap() {
        let mut o = Outbox::new(5);
        for i in 0..4 {
            o.push(summary(i));
        }
        let b = o.batch(3);
        assert_eq!(
            b.iter().map(|s| s.probe_total).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        // Failed: nothing leaves, back-off grows and is capped.
        let waits: Vec<u64> = (0..7).map(|_| o.failed().as_millis() as u64).collect();
        assert_eq!(waits, vec![500, 1000, 2000, 4000, 8000, 8000, 8000]);
        assert!(o.failing());
        assert_eq!(o.batch(3), b, "the same batch again");
        o.sent(3);
        assert!(!o.failing());
        assert_eq!(
            o.batch(9).iter().map(|s| s.probe_total).collect::<Vec<_>>(),
            vec![3]
        );
        for i in 10..16 {
            o.push(summary(i));
        }
        assert_eq!(o.len(), 5);
        assert_eq!(o.dropped(), 2);
        assert_eq!(o.batch(1)[0].probe_total, 11, "oldest dropped first");
    }

    #[test]
    fn focus_awaits_once_per_delivered_window_and_again_while_not_localized() {
        let mut a = FocusAwait::new(true);
        assert_eq!(a.next_window(), None, "nothing delivered yet");
        a.reported(100);
        assert_eq!(a.next_window(), Some(100));
        assert_eq!(a.next_window(), None, "one await per window");
        // Answered before the controller localized it: again, up to three tries.
        assert_eq!(a.answered(100, 70), Some(100));
        assert_eq!(a.answered(100, 70), Some(100));
        assert_eq!(a.answered(100, 70), None);
        // Localized: done; a newer window delivered meanwhile is next.
        a.reported(130);
        assert_eq!(a.next_window(), Some(130));
        a.reported(160);
        assert_eq!(a.answered(130, 130), Some(160));
        // A controller that localizes nothing (a Go controller) is not asked again.
        assert_eq!(a.answered(160, 0), None);
        // An older window delivered late (a retried batch) is not awaited.
        a.reported(100);
        assert_eq!(a.next_window(), None);
        let mut off = FocusAwait::new(false);
        off.reported(100);
        assert_eq!(off.next_window(), None);
    }
}
