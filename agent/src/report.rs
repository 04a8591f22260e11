//! Per-path window summaries -> bounded channel -> `ReportProbeAnalysis` batches.
//! Probing never waits on reporting: a full channel drops the summary and counts it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rpingmesh_proto::controller_agent::PathSummary;
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

/// Takes `first` plus whatever is queued, up to `max` summaries.
pub fn fill_batch(
    first: PathSummary,
    rx: &mut mpsc::Receiver<PathSummary>,
    max: usize,
) -> Vec<PathSummary> {
    let mut batch = Vec::with_capacity(max.min(64));
    batch.push(first);
    while batch.len() < max {
        match rx.try_recv() {
            Ok(s) => batch.push(s),
            Err(_) => break,
        }
    }
    batch
}

/// Sends batches until every sender is dropped and the channel is drained.
pub async fn run_reporter(
    client: ControllerClient,
    agent_id: String,
    mut rx: mpsc::Receiver<PathSummary>,
    batch_max: usize,
) {
    let mut failing = false;
    while let Some(first) = rx.recv().await {
        let batch = fill_batch(first, &mut rx, batch_max.max(1));
        let n = batch.len();
        match tokio::time::timeout(Duration::from_secs(10), client.report(&agent_id, batch)).await {
            Ok(Ok(ack)) => {
                if failing {
                    tracing::info!("PathSummary reports accepted again");
                }
                failing = false;
                tracing::debug!(
                    summaries = n,
                    accepted = ack.accepted,
                    sla_violations = ack.sla_violations,
                    "reported"
                );
            }
            Ok(Err(e)) => {
                if !failing {
                    tracing::warn!(error = %e, summaries = n, "PathSummary report failed; batch dropped");
                }
                failing = true;
            }
            Err(_) => {
                if !failing {
                    tracing::warn!(summaries = n, "PathSummary report timed out; batch dropped");
                }
                failing = true;
            }
        }
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
        let first = rx.recv().await.unwrap();
        let batch = fill_batch(first, &mut rx, 256);
        assert_eq!(
            batch.iter().map(|s| s.probe_total).collect::<Vec<_>>(),
            vec![0, 1]
        );
    }

    #[tokio::test]
    async fn batches_are_capped() {
        let (sink, mut rx) = channel(100);
        for i in 0..10 {
            sink.offer(summary(i));
        }
        let first = rx.recv().await.unwrap();
        assert_eq!(fill_batch(first, &mut rx, 4).len(), 4);
        let first = rx.recv().await.unwrap();
        assert_eq!(fill_batch(first, &mut rx, 4).len(), 4);
        let first = rx.recv().await.unwrap();
        assert_eq!(fill_batch(first, &mut rx, 4).len(), 2);
    }
}
