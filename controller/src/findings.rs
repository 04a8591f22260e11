//! Findings (pure): what the analyzer concluded, with a life cycle. A finding opens on
//! the first window of a path that breaks an SLA, stays open (counting its violating
//! windows, keeping the first and the worst as evidence) while windows keep breaking
//! it, and resolves at the first clean window of that path. Phase 1 findings are per
//! path and per kind (loss, rtt); localization and Hostping add scopes later.

use std::collections::{BTreeMap, HashMap, VecDeque};

use rpingmesh_proto::controller_agent::PathSummary;

/// The SLA a path window breaks: too lossy, or too slow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ViolationKind {
    Loss,
    Rtt,
}

impl ViolationKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ViolationKind::Loss => "loss",
            ViolationKind::Rtt => "rtt",
        }
    }
}

/// The path a finding is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathScope {
    pub source_gid: String,
    pub target_gid: String,
    pub source_tor_id: String,
    pub target_tor_id: String,
    pub pinglist_type: i32,
    pub service: String,
}

/// One window's numbers, kept as evidence.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct WindowEvidence {
    pub window_start_unix_ns: u64,
    pub window_duration_ms: u32,
    pub probe_total: u32,
    pub probe_failed: u32,
    pub network_rtt_p50_ns: u64,
    pub network_rtt_p99_ns: u64,
}

impl WindowEvidence {
    pub fn of(s: &PathSummary) -> Self {
        WindowEvidence {
            window_start_unix_ns: s.window_start_unix_ns,
            window_duration_ms: s.window_duration_ms,
            probe_total: s.probe_total,
            probe_failed: s.probe_failed,
            network_rtt_p50_ns: s.network_rtt_p50_ns,
            network_rtt_p99_ns: s.network_rtt_p99_ns,
        }
    }
    pub fn loss_ratio(&self) -> f64 {
        if self.probe_total == 0 {
            0.0
        } else {
            self.probe_failed as f64 / self.probe_total as f64
        }
    }
    /// How bad the window is for `kind` (to keep the worst one).
    fn badness(&self, kind: ViolationKind) -> f64 {
        match kind {
            ViolationKind::Loss => self.loss_ratio(),
            ViolationKind::Rtt => self.network_rtt_p99_ns as f64,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub id: u64,
    pub kind: ViolationKind,
    pub scope: PathScope,
    pub opened_unix_ns: u64,
    pub last_violation_unix_ns: u64,
    /// `None` while open.
    pub resolved_unix_ns: Option<u64>,
    pub violating_windows: u32,
    pub first: WindowEvidence,
    pub worst: WindowEvidence,
    /// The clean window that resolved it; `None` on a resolved finding: the path stopped
    /// being measured (its pinglist moved on, or an end went away).
    pub resolved_by: Option<WindowEvidence>,
}

/// Windows without news after which an open finding is closed as no longer measured.
pub const STALE_AFTER_WINDOWS: u64 = 3;

impl Finding {
    pub fn is_open(&self) -> bool {
        self.resolved_unix_ns.is_none()
    }
}

/// Identity of an open finding: the analyzer's path key and the kind.
pub type FindingKey = ((u32, u32, u32), ViolationKind);

#[derive(Debug)]
pub struct FindingBook {
    open: HashMap<FindingKey, Finding>,
    resolved: VecDeque<Finding>,
    resolved_capacity: usize,
    next_id: u64,
}

impl FindingBook {
    pub fn new(resolved_capacity: usize) -> Self {
        FindingBook {
            open: HashMap::new(),
            resolved: VecDeque::new(),
            resolved_capacity: resolved_capacity.max(1),
            next_id: 1,
        }
    }

    /// The newest window of a path, with the analyzer's verdicts. Windows without a
    /// probe say nothing either way.
    pub fn observe(
        &mut self,
        path: (u32, u32, u32),
        s: &PathSummary,
        verdicts: [(ViolationKind, bool); 2],
        now_unix_ns: u64,
    ) {
        if s.probe_total == 0 {
            return;
        }
        let ev = WindowEvidence::of(s);
        for (kind, violated) in verdicts {
            let key = (path, kind);
            if violated {
                if let Some(f) = self.open.get_mut(&key) {
                    if ev.window_start_unix_ns != f.worst.window_start_unix_ns
                        || ev.badness(kind) > f.worst.badness(kind)
                    {
                        f.violating_windows += 1;
                    }
                    f.last_violation_unix_ns = now_unix_ns;
                    if ev.badness(kind) > f.worst.badness(kind) {
                        f.worst = ev;
                    }
                    continue;
                }
                let id = self.next_id;
                self.next_id += 1;
                self.open.insert(
                    key,
                    Finding {
                        id,
                        kind,
                        scope: PathScope {
                            source_gid: s.source_gid.clone(),
                            target_gid: s.target_gid.clone(),
                            source_tor_id: s.source_tor_id.clone(),
                            target_tor_id: s.target_tor_id.clone(),
                            pinglist_type: s.pinglist_type,
                            service: s.service.clone(),
                        },
                        opened_unix_ns: now_unix_ns,
                        last_violation_unix_ns: now_unix_ns,
                        resolved_unix_ns: None,
                        violating_windows: 1,
                        first: ev,
                        worst: ev,
                        resolved_by: None,
                    },
                );
            } else if let Some(mut f) = self.open.remove(&key) {
                f.resolved_unix_ns = Some(now_unix_ns);
                f.resolved_by = Some(ev);
                self.push_resolved(f);
            }
        }
    }

    /// Closes findings of paths that sent no window for [`STALE_AFTER_WINDOWS`] of their
    /// windows: an inter-ToR sample that moved on must not leave a finding open forever.
    pub fn expire(&mut self, now_unix_ns: u64) -> usize {
        let stale: Vec<FindingKey> = self
            .open
            .iter()
            .filter(|(_, f)| {
                let window_ns = (f.worst.window_duration_ms.max(1000) as u64) * 1_000_000;
                now_unix_ns > f.last_violation_unix_ns + STALE_AFTER_WINDOWS * window_ns
            })
            .map(|(k, _)| *k)
            .collect();
        for k in &stale {
            if let Some(mut f) = self.open.remove(k) {
                f.resolved_unix_ns = Some(now_unix_ns);
                self.push_resolved(f);
            }
        }
        stale.len()
    }

    fn push_resolved(&mut self, f: Finding) {
        self.resolved.push_back(f);
        while self.resolved.len() > self.resolved_capacity {
            self.resolved.pop_front();
        }
    }

    /// Open findings (oldest first), then resolved ones (most recently resolved first),
    /// at most `limit` resolved ones (0 = all retained).
    pub fn list(&self, resolved_limit: usize) -> Vec<Finding> {
        let mut open: Vec<Finding> = self.open.values().cloned().collect();
        open.sort_by_key(|f| f.id);
        let n = if resolved_limit == 0 {
            self.resolved.len()
        } else {
            resolved_limit.min(self.resolved.len())
        };
        open.extend(self.resolved.iter().rev().take(n).cloned());
        open
    }

    pub fn open_count(&self) -> usize {
        self.open.len()
    }

    /// Open findings per (source ToR, target ToR, kind): the findings gauge.
    pub fn open_by_tor_pair(&self) -> BTreeMap<(String, String, ViolationKind), u64> {
        let mut m = BTreeMap::new();
        for f in self.open.values() {
            *m.entry((
                f.scope.source_tor_id.clone(),
                f.scope.target_tor_id.clone(),
                f.kind,
            ))
            .or_insert(0) += 1;
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(start: u64, total: u32, failed: u32, p99: u64) -> PathSummary {
        PathSummary {
            source_gid: "a".into(),
            target_gid: "b".into(),
            source_tor_id: "t1".into(),
            target_tor_id: "t2".into(),
            window_start_unix_ns: start,
            window_duration_ms: 10,
            probe_total: total,
            probe_failed: failed,
            network_rtt_p99_ns: p99,
            ..Default::default()
        }
    }

    const P: (u32, u32, u32) = (0, 1, 0);

    fn v(loss: bool, rtt: bool) -> [(ViolationKind, bool); 2] {
        [(ViolationKind::Loss, loss), (ViolationKind::Rtt, rtt)]
    }

    #[test]
    fn opens_accumulates_and_resolves_on_a_clean_window() {
        let mut b = FindingBook::new(10);
        b.observe(P, &w(0, 100, 10, 1), v(true, false), 5);
        b.observe(P, &w(10, 100, 30, 1), v(true, false), 15);
        b.observe(P, &w(10, 100, 30, 1), v(true, false), 16); // re-sent window
        assert_eq!(b.open_count(), 1);
        let f = &b.list(0)[0];
        assert_eq!(
            (
                f.violating_windows,
                f.opened_unix_ns,
                f.last_violation_unix_ns
            ),
            (2, 5, 16)
        );
        assert_eq!((f.first.probe_failed, f.worst.probe_failed), (10, 30));
        assert_eq!(
            b.open_by_tor_pair()
                .get(&("t1".into(), "t2".into(), ViolationKind::Loss)),
            Some(&1)
        );
        // A window without probes says nothing; a clean one resolves.
        b.observe(P, &w(20, 0, 0, 0), v(false, false), 25);
        assert_eq!(b.open_count(), 1);
        b.observe(P, &w(30, 100, 0, 1), v(false, false), 35);
        assert_eq!(b.open_count(), 0);
        let all = b.list(0);
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].resolved_unix_ns, Some(35));
        assert_eq!(all[0].resolved_by.unwrap().window_start_unix_ns, 30);
        // A new breach is a new finding.
        b.observe(P, &w(40, 100, 50, 1), v(true, true), 45);
        let all = b.list(0);
        assert_eq!(all.len(), 3);
        assert!(all[0].is_open() && all[1].is_open() && !all[2].is_open());
        assert!(all[0].id > all[2].id);
    }

    #[test]
    fn a_path_no_longer_measured_closes_its_finding() {
        let mut b = FindingBook::new(10);
        let sec = 1_000_000_000;
        // 10 ms windows count as 1 s (the floor), so stale after 3 s without news.
        b.observe(P, &w(0, 100, 10, 1), v(true, false), 10 * sec);
        assert_eq!(b.expire(12 * sec), 0);
        b.observe(P, &w(10, 100, 10, 1), v(true, false), 12 * sec);
        assert_eq!(b.expire(14 * sec), 0);
        assert_eq!(b.expire(15 * sec + 1), 1);
        let f = &b.list(0)[0];
        assert!(!f.is_open() && f.resolved_by.is_none());
    }

    #[test]
    fn resolved_history_is_bounded() {
        let mut b = FindingBook::new(2);
        for i in 0..5u64 {
            b.observe(P, &w(i * 20, 10, 5, 1), v(true, false), i * 20);
            b.observe(P, &w(i * 20 + 10, 10, 0, 1), v(false, false), i * 20 + 10);
        }
        let l = b.list(0);
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].opened_unix_ns, 80);
        assert_eq!(b.list(1).len(), 1);
    }
}
