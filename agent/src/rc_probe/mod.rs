//! RC ring probing (seed 001 rings, issue 14): the targets of chosen pinglists (default
//! SERVICE) are also probed over a polled RC write ring pair each, the way services see
//! the network. A probe is a depth-one echo (`rpingmesh_rc_ring::echo`); results go to
//! their own metrics and to `PathSummary.rc_ring`, in windows aligned like the UD ones so
//! the controller joins them to the same path window.
//!
//! `poller` (rdma builds) owns the rings on one thread and polls only in short windows
//! around expected messages; a CM thread connects and accepts, so a dead peer's connect
//! timeouts never stall probing. Here: parameters and the pure window aggregation.

use std::collections::BTreeMap;
use std::time::Duration;

use rpingmesh_proto::controller_agent::{PathSummary, RcRingStats};
use rpingmesh_protocol::aggregate::nearest_rank;
use rpingmesh_protocol::PinglistKind;
use rpingmesh_rc_ring::echo::Outcome;

use crate::config::AgentConfig;
use crate::report::PathKey;

#[cfg(feature = "rdma")]
pub mod poller;

/// Samples kept per path and window (beyond it, counts still grow).
const SAMPLE_CAP: usize = 4096;

#[derive(Debug, Clone)]
pub struct RcProbeParams {
    pub port: u16,
    pub budget: usize,
    pub max_rings: usize,
    pub interval: Duration,
    pub timeout: Duration,
    /// The prober polls hot this long after its write, then cold.
    pub hot_wait: Duration,
    /// The responder starts polling hot this long before an announced probe...
    pub lead: Duration,
    /// ...and stops this long after it.
    pub grace: Duration,
    /// Between hot windows every ring is checked once per this (unannounced messages).
    pub cold_interval: Duration,
    pub window: Duration,
    pub kinds: Vec<PinglistKind>,
    /// The rings' RC ACK timeout exponent (None: the RDMA-CM's default).
    pub ack_timeout_exp: Option<u8>,
}

impl RcProbeParams {
    /// None when RC ring probing is off (`rc_ring_pinglists` empty).
    pub fn from_config(cfg: &AgentConfig) -> Option<RcProbeParams> {
        let kinds = cfg.rc_ring_kinds();
        if kinds.is_empty() {
            return None;
        }
        Some(RcProbeParams {
            port: cfg.rc_ring_port,
            budget: cfg.rc_ring_budget_bytes,
            max_rings: cfg.rc_ring_max_rings,
            interval: Duration::from_millis(cfg.rc_ring_probe_interval_ms),
            timeout: Duration::from_millis(cfg.rc_ring_probe_timeout_ms),
            hot_wait: Duration::from_micros(cfg.rc_ring_hot_wait_us),
            lead: Duration::from_micros(cfg.rc_ring_poll_lead_us),
            grace: Duration::from_micros(cfg.rc_ring_poll_lead_us.max(1000)),
            cold_interval: Duration::from_millis(100),
            window: Duration::from_secs(cfg.analysis_window_sec),
            kinds,
            ack_timeout_exp: (cfg.rc_ring_ack_timeout_exp > 0)
                .then_some(cfg.rc_ring_ack_timeout_exp),
        })
    }
}

/// Which local RNIC probed, and the path (as the UD windows key it).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RcPath {
    pub source_gid: String,
    pub source_tor: String,
    pub target_gid: String,
    pub target_tor: String,
    pub target_qpn: u32,
    pub kind: i32,
    pub service: String,
}

impl RcPath {
    pub fn new(source_gid: &str, source_tor: &str, key: &PathKey) -> RcPath {
        RcPath {
            source_gid: source_gid.to_string(),
            source_tor: source_tor.to_string(),
            target_gid: key.gid.to_string(),
            target_tor: key.tor.to_string(),
            target_qpn: key.qpn,
            kind: key.kind as i32,
            service: key.service.to_string(),
        }
    }
}

#[derive(Debug, Default)]
struct Acc {
    total: u32,
    lost: u32,
    late: u32,
    rtts: Vec<u64>,
    responder: Vec<u64>,
}

/// Outcomes per path in windows aligned to multiples of the window (pure).
#[derive(Debug)]
pub struct RcWindows {
    window_ns: u64,
    open: BTreeMap<(u64, RcPath), Acc>,
}

impl RcWindows {
    pub fn new(window: Duration) -> RcWindows {
        RcWindows {
            window_ns: (window.as_nanos() as u64).max(1),
            open: BTreeMap::new(),
        }
    }

    pub fn record(&mut self, path: &RcPath, o: &Outcome, now_unix_ns: u64) {
        let start = now_unix_ns - now_unix_ns % self.window_ns;
        let acc = self.open.entry((start, path.clone())).or_default();
        acc.total = acc.total.saturating_add(1);
        match *o {
            Outcome::Rtt {
                network_ns,
                responder_ns,
                ..
            } => {
                if acc.rtts.len() < SAMPLE_CAP {
                    acc.rtts.push(network_ns);
                    acc.responder.push(responder_ns);
                }
            }
            Outcome::Late { .. } => acc.late = acc.late.saturating_add(1),
            Outcome::Lost { .. } => acc.lost = acc.lost.saturating_add(1),
        }
    }

    /// RC-only summaries (UD counts zero) of every window ended by `now_unix_ns`.
    pub fn take_closed(&mut self, now_unix_ns: u64) -> Vec<PathSummary> {
        let mut out = Vec::new();
        while let Some(e) = self.open.first_entry() {
            let (start, _) = e.key();
            if start + self.window_ns > now_unix_ns {
                break;
            }
            let ((start, p), mut a) = e.remove_entry();
            a.rtts.sort_unstable();
            a.responder.sort_unstable();
            let q = |v: &[u64], pct| {
                if v.is_empty() {
                    0
                } else {
                    nearest_rank(v, pct)
                }
            };
            out.push(PathSummary {
                source_gid: p.source_gid,
                source_tor_id: p.source_tor,
                target_gid: p.target_gid,
                target_tor_id: p.target_tor,
                target_qpn: p.target_qpn,
                window_start_unix_ns: start,
                window_duration_ms: (self.window_ns / 1_000_000) as u32,
                pinglist_type: p.kind,
                service: p.service,
                rc_ring: Some(RcRingStats {
                    probe_total: a.total,
                    probe_lost: a.lost,
                    probe_late: a.late,
                    network_rtt_min_ns: a.rtts.first().copied().unwrap_or(0),
                    network_rtt_p50_ns: q(&a.rtts, 50),
                    network_rtt_p99_ns: q(&a.rtts, 99),
                    network_rtt_max_ns: a.rtts.last().copied().unwrap_or(0),
                    responder_delay_p50_ns: q(&a.responder, 50),
                }),
                ..Default::default()
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(t: &str) -> RcPath {
        RcPath {
            source_gid: "a".into(),
            source_tor: "tor-a".into(),
            target_gid: t.into(),
            target_tor: "tor-b".into(),
            target_qpn: 1,
            kind: PinglistKind::Service as i32,
            service: "train".into(),
        }
    }

    #[test]
    fn windows_align_like_the_ud_ones_and_carry_only_rc_stats() {
        let mut w = RcWindows::new(Duration::from_secs(30));
        let s = 1_000_000_000u64;
        let rtt = |ns| Outcome::Rtt {
            id: 0,
            total_ns: ns + 100,
            responder_ns: 100,
            network_ns: ns,
        };
        for (i, ns) in [5_000u64, 7_000, 6_000].into_iter().enumerate() {
            w.record(&path("b"), &rtt(ns), 60 * s + i as u64 * s);
        }
        w.record(&path("b"), &Outcome::Lost { id: 9 }, 70 * s);
        w.record(&path("b"), &Outcome::Late { id: 10 }, 71 * s);
        w.record(&path("c"), &Outcome::Lost { id: 1 }, 95 * s);
        assert!(
            w.take_closed(89 * s).is_empty(),
            "window [60, 90) still open"
        );
        let out = w.take_closed(90 * s);
        assert_eq!(out.len(), 1);
        let o = &out[0];
        assert_eq!(
            (o.window_start_unix_ns, o.window_duration_ms),
            (60 * s, 30_000)
        );
        assert_eq!(
            (o.probe_total, o.probe_failed),
            (0, 0),
            "UD counts stay zero"
        );
        let r = o.rc_ring.unwrap();
        assert_eq!((r.probe_total, r.probe_lost, r.probe_late), (5, 1, 1));
        assert_eq!(
            (
                r.network_rtt_min_ns,
                r.network_rtt_p50_ns,
                r.network_rtt_max_ns
            ),
            (5_000, 6_000, 7_000)
        );
        assert_eq!(r.responder_delay_p50_ns, 100);
        assert_eq!(w.take_closed(120 * s)[0].target_gid, "c");
    }
}
