//! Phase 1 analyzer (pure, no I/O): per-path window retention and SLA checks over
//! agent-reported `PathSummary` batches, plus the queries behind the operator API.
//!
//! Hot path: GIDs are interned to u32 ids (lookup by `&str`, no allocation for known
//! GIDs) and summaries are moved, not copied, into the path's window ring.

use std::collections::{BTreeMap, HashMap, VecDeque};

use rpingmesh_proto::controller_agent::{PathSummary, PinglistType};
use rpingmesh_proto::operator::TorPairStats;

pub use crate::findings::ViolationKind;
use crate::findings::{Finding, FindingBook, STALE_AFTER_WINDOWS};
use crate::localize::{Inventory, Localizer, LocalizerParams, WindowPath};
use crate::topology::Topology;
use rpingmesh_proto::operator::FindingEvent;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AnalyzerParams {
    pub sla_loss_ratio: f64,
    /// 0 disables the RTT check.
    pub sla_network_rtt_p99_ns: u64,
    pub window_retention: usize,
    pub violation_log_capacity: usize,
    /// How long after a window ends its reports are awaited before it is localized.
    pub localize_settle_ns: u64,
    pub localizer: LocalizerParams,
}

impl Default for AnalyzerParams {
    fn default() -> Self {
        Self {
            sla_loss_ratio: 0.02,
            sla_network_rtt_p99_ns: 500_000,
            window_retention: 20,
            violation_log_capacity: 1000,
            localize_settle_ns: 10_000_000_000,
            localizer: LocalizerParams::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    pub kind: ViolationKind,
    pub summary: PathSummary,
    pub detected_unix_ns: u64,
}

/// What one batch did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct IngestReport {
    pub ingested: u32,
    /// Newly detected violations (a re-sent window does not count twice).
    pub violations: Vec<Violation>,
}

#[derive(Debug)]
struct Window {
    summary: PathSummary,
    loss: bool,
    rtt: bool,
}

/// Where a window of a given start is in a path's retained windows.
enum Slot {
    /// A window of that start was already there.
    Existing(usize),
    /// A new window was inserted there.
    Inserted(usize),
    /// Older than everything retained, with no room: not kept.
    Dropped,
}

#[derive(Debug, Default)]
struct PathState {
    /// Sorted by window_start_unix_ns, oldest first.
    windows: VecDeque<Window>,
    /// Interned (source ToR, target ToR) of the newest window: the ToR-pair view
    /// aggregates over these without comparing strings.
    tors: (u32, u32),
}

impl PathState {
    /// Finds the window starting at `start`, or inserts `new()` in order (then trims to
    /// `retention`, oldest first).
    fn slot(&mut self, start: u64, retention: usize, new: impl FnOnce() -> Window) -> Slot {
        // Newest-first scan: windows nearly always arrive in order.
        let pos = self
            .windows
            .iter()
            .rposition(|w| w.summary.window_start_unix_ns <= start);
        match pos {
            Some(i) if self.windows[i].summary.window_start_unix_ns == start => Slot::Existing(i),
            other => {
                let mut at = other.map_or(0, |i| i + 1);
                if at == 0 && self.windows.len() >= retention {
                    return Slot::Dropped;
                }
                self.windows.insert(at, new());
                while self.windows.len() > retention {
                    self.windows.pop_front();
                    at -= 1;
                }
                Slot::Inserted(at)
            }
        }
    }
}

/// (source GID id, target GID id, kind): kind 0 is the ToR-mesh / inter-ToR path (one
/// (source, target) pair is only ever one of the two), 1 + service id a SERVICE path, so
/// service windows never overwrite the mesh windows of the same pair.
type PathKey = (u32, u32, u32);

const SERVICE_TYPE: i32 = PinglistType::Service as i32;
const FOCUS_TYPE: i32 = PinglistType::Focus as i32;
/// The path kind of FOCUS windows: apart from the pair's ToR-mesh / inter-ToR window,
/// localized with them.
const FOCUS_PATH_KIND: u32 = u32::MAX;

pub struct Analyzer {
    params: AnalyzerParams,
    gid_ids: HashMap<Box<str>, u32>,
    service_ids: HashMap<Box<str>, u32>,
    tor_ids: HashMap<Box<str>, u32>,
    tor_names: Vec<Box<str>>,
    paths: HashMap<PathKey, PathState>,
    violations: VecDeque<Violation>,
    findings: FindingBook,
    summaries_total: u64,
    /// Probes of FOCUS windows ingested (adaptive probing's extra probes).
    focus_probes_total: u64,
    localizer: Localizer,
    /// Window start -> window length, for windows seen but not localized yet.
    unlocalized: BTreeMap<u64, u64>,
    /// Windows starting at or before this were localized (late reports are kept as path
    /// windows but move no component finding).
    localized_through: Option<u64>,
    /// The length of the newest window ingested (0: none yet).
    window_ns: u64,
}

impl Default for FindingBook {
    fn default() -> Self {
        FindingBook::new(AnalyzerParams::default().violation_log_capacity)
    }
}

/// Filters for [`Analyzer::paths`]; empty strings match everything. GIDs must already
/// be normalized.
#[derive(Debug, Default, Clone)]
pub struct PathFilter<'a> {
    pub source_tor_id: &'a str,
    pub target_tor_id: &'a str,
    pub source_gid: &'a str,
    pub target_gid: &'a str,
}

impl PathFilter<'_> {
    fn matches(&self, s: &PathSummary) -> bool {
        (self.source_tor_id.is_empty() || s.source_tor_id == self.source_tor_id)
            && (self.target_tor_id.is_empty() || s.target_tor_id == self.target_tor_id)
            && (self.source_gid.is_empty() || s.source_gid == self.source_gid)
            && (self.target_gid.is_empty() || s.target_gid == self.target_gid)
    }
}

impl Default for Analyzer {
    fn default() -> Self {
        Self::new(AnalyzerParams::default())
    }
}

impl Analyzer {
    pub fn new(params: AnalyzerParams) -> Self {
        Self::with_topology(params, None)
    }

    /// With a fabric topology, link problems are localized to the ToR-spine link.
    pub fn with_topology(params: AnalyzerParams, topology: Option<Topology>) -> Self {
        Self {
            params,
            gid_ids: HashMap::new(),
            service_ids: HashMap::new(),
            tor_ids: HashMap::new(),
            tor_names: Vec::new(),
            paths: HashMap::new(),
            violations: VecDeque::new(),
            findings: FindingBook::new(params.violation_log_capacity),
            summaries_total: 0,
            focus_probes_total: 0,
            localizer: Localizer::new(params.localizer, topology),
            unlocalized: BTreeMap::new(),
            localized_through: None,
            window_ns: 0,
        }
    }

    /// The length (ns) of the newest window ingested (0: none yet): the agents'
    /// `analysis_window_sec`.
    pub fn window_ns(&self) -> u64 {
        self.window_ns
    }

    /// Windows starting at or before this were localized.
    pub fn localized_through(&self) -> Option<u64> {
        self.localized_through
    }

    /// Whether [`Self::tick`] at `now_unix_ns` localizes a window.
    pub fn window_due(&self, now_unix_ns: u64) -> bool {
        self.unlocalized
            .first_key_value()
            .is_some_and(|(&start, &window_ns)| {
                start
                    .saturating_add(window_ns)
                    .saturating_add(self.params.localize_settle_ns)
                    <= now_unix_ns
            })
    }

    /// The length (ns) of the window starting at `start` when it has summaries that are
    /// not localized yet.
    pub fn pending_window(&self, start: u64) -> Option<u64> {
        self.unlocalized.get(&start).copied()
    }

    pub fn localizer(&self) -> &Localizer {
        &self.localizer
    }

    pub fn localizer_mut(&mut self) -> &mut Localizer {
        &mut self.localizer
    }

    /// Localizes every window that ended `localize_settle_ns` before `now_unix_ns`, oldest
    /// first, over the ToR-mesh and inter-ToR paths that reported it. Returns the finding
    /// changes.
    pub fn tick(&mut self, now_unix_ns: u64, inv: &dyn Inventory) -> Vec<FindingEvent> {
        let mut events = Vec::new();
        while let Some((&start, &window_ns)) = self.unlocalized.first_key_value() {
            let settled = start
                .saturating_add(window_ns)
                .saturating_add(self.params.localize_settle_ns);
            if settled > now_unix_ns {
                break;
            }
            self.unlocalized.remove(&start);
            self.localized_through = Some(start);
            // The GID ids of the path keys place each end with an array lookup.
            let window: Vec<WindowPath<'_>> = self
                .paths
                .iter()
                .filter(|(k, _)| k.2 == 0 || k.2 == FOCUS_PATH_KIND)
                .filter_map(|(k, p)| {
                    p.windows
                        .iter()
                        .rev()
                        .find(|w| w.summary.window_start_unix_ns <= start)
                        .map(|w| &w.summary)
                        .filter(|s| s.window_start_unix_ns == start)
                        .map(|summary| WindowPath {
                            src: k.0,
                            dst: k.1,
                            summary,
                        })
                })
                .collect();
            events.extend(
                self.localizer
                    .localize_paths(start, &window, inv, now_unix_ns),
            );
        }
        events
    }

    pub fn params(&self) -> &AnalyzerParams {
        &self.params
    }

    fn intern(&mut self, gid: &str) -> u32 {
        if let Some(&id) = self.gid_ids.get(gid) {
            return id;
        }
        let id = self.gid_ids.len() as u32;
        self.gid_ids.insert(gid.into(), id);
        id
    }

    fn intern_tor(&mut self, tor: &str) -> u32 {
        if let Some(&id) = self.tor_ids.get(tor) {
            return id;
        }
        let id = self.tor_names.len() as u32;
        self.tor_ids.insert(tor.into(), id);
        self.tor_names.push(tor.into());
        id
    }

    fn path_kind(&mut self, s: &PathSummary) -> u32 {
        if s.pinglist_type == FOCUS_TYPE {
            return FOCUS_PATH_KIND;
        }
        if s.pinglist_type != SERVICE_TYPE {
            return 0;
        }
        if let Some(&id) = self.service_ids.get(s.service.as_str()) {
            return id + 1;
        }
        let id = self.service_ids.len() as u32;
        self.service_ids.insert(s.service.as_str().into(), id);
        id + 1
    }

    /// Loss and RTT verdicts of one window.
    pub fn check(&self, s: &PathSummary) -> (bool, bool) {
        let loss = s.probe_total > 0
            && (s.probe_failed as f64 / s.probe_total as f64) > self.params.sla_loss_ratio;
        let rtt = self.params.sla_network_rtt_p99_ns > 0
            && s.probe_success > 0
            && s.network_rtt_p99_ns > self.params.sla_network_rtt_p99_ns;
        (loss, rtt)
    }

    /// Ingests a batch (GIDs already validated/normalized by the caller). A window with
    /// the start of a retained one replaces it; at most `window_retention` windows are
    /// kept per path.
    pub fn ingest(&mut self, batch: Vec<PathSummary>, now_unix_ns: u64) -> IngestReport {
        let mut report = IngestReport::default();
        let retention = self.params.window_retention.max(1);
        for s in batch {
            report.ingested += 1;
            if s.pinglist_type == FOCUS_TYPE {
                self.focus_probes_total += s.probe_total as u64;
            }
            if s.probe_total == 0 && s.rc_ring.is_some() {
                self.join_rc_ring(s, retention);
                continue;
            }
            if s.pinglist_type != SERVICE_TYPE
                && self
                    .localized_through
                    .is_none_or(|t| s.window_start_unix_ns > t)
            {
                let window_ns = (s.window_duration_ms.max(1) as u64) * 1_000_000;
                self.window_ns = window_ns;
                self.unlocalized
                    .entry(s.window_start_unix_ns)
                    .or_insert(window_ns);
            }
            let (loss, rtt) = self.check(&s);
            let key = (
                self.intern(&s.source_gid),
                self.intern(&s.target_gid),
                self.path_kind(&s),
            );
            let tors = (
                self.intern_tor(&s.source_tor_id),
                self.intern_tor(&s.target_tor_id),
            );
            let path = self.paths.entry(key).or_default();
            let start = s.window_start_unix_ns;
            let new_window = || Window {
                summary: PathSummary::default(),
                loss,
                rtt,
            };
            let (was_loss, was_rtt, kept) = match path.slot(start, retention, new_window) {
                Slot::Existing(i) => {
                    let w = &mut path.windows[i];
                    let prev = (w.loss, w.rtt);
                    w.loss = loss;
                    w.rtt = rtt;
                    (prev.0, prev.1, Some(i))
                }
                Slot::Inserted(i) => (false, false, Some(i)),
                // Older than everything retained and no room: not kept.
                Slot::Dropped => (false, false, None),
            };
            let new_loss = loss && !was_loss;
            let new_rtt = rtt && !was_rtt;
            if new_loss || new_rtt {
                for (flag, kind) in [
                    (new_loss, ViolationKind::Loss),
                    (new_rtt, ViolationKind::Rtt),
                ] {
                    if flag {
                        let v = Violation {
                            kind,
                            summary: s.clone(),
                            detected_unix_ns: now_unix_ns,
                        };
                        report.violations.push(v.clone());
                        self.violations.push_back(v);
                    }
                }
                while self.violations.len() > self.params.violation_log_capacity {
                    self.violations.pop_front();
                }
            }
            if let Some(i) = kept {
                // Only the newest window moves a finding: a late old window must not
                // resolve (or reopen) what newer windows already decided.
                if i + 1 == path.windows.len() {
                    path.tors = tors;
                    self.findings.observe(
                        key,
                        &s,
                        [(ViolationKind::Loss, loss), (ViolationKind::Rtt, rtt)],
                        now_unix_ns,
                    );
                }
                let w = &mut path.windows[i].summary;
                let mut s = s;
                // An RC ring record that came first stays joined to the UD window.
                if s.rc_ring.is_none() {
                    s.rc_ring = w.rc_ring.take();
                }
                *w = s;
            }
        }
        self.findings.expire(now_unix_ns);
        self.summaries_total += report.ingested as u64;
        report
    }

    /// An agent's RC ring record (UD counts zero): joined to the path's UD window of the
    /// same start, or kept as a window of its own until that arrives. It carries no UD
    /// verdict, so it neither opens nor resolves anything.
    fn join_rc_ring(&mut self, s: PathSummary, retention: usize) {
        let key = (
            self.intern(&s.source_gid),
            self.intern(&s.target_gid),
            self.path_kind(&s),
        );
        let path = self.paths.entry(key).or_default();
        let (start, rc_ring) = (s.window_start_unix_ns, s.rc_ring);
        let new_window = || Window {
            summary: s,
            loss: false,
            rtt: false,
        };
        if let Slot::Existing(i) = path.slot(start, retention, new_window) {
            path.windows[i].summary.rc_ring = rc_ring;
        }
    }

    pub fn summaries_total(&self) -> u64 {
        self.summaries_total
    }

    /// Probes of the FOCUS windows ingested so far.
    pub fn focus_probes_total(&self) -> u64 {
        self.focus_probes_total
    }

    pub fn path_count(&self) -> usize {
        self.paths.len()
    }

    /// Latest window of every matching path (or every retained window when
    /// `all_windows`), ordered by (source GID, target GID, window start).
    pub fn paths(&self, f: &PathFilter<'_>, all_windows: bool) -> Vec<PathSummary> {
        let mut out = Vec::new();
        for p in self.paths.values() {
            if all_windows {
                out.extend(
                    p.windows
                        .iter()
                        .map(|w| &w.summary)
                        .filter(|s| f.matches(s))
                        .cloned(),
                );
            } else if let Some(w) = p.windows.back() {
                if f.matches(&w.summary) {
                    out.push(w.summary.clone());
                }
            }
        }
        out.sort_by(|a, b| {
            (
                &a.source_gid,
                &a.target_gid,
                a.pinglist_type,
                &a.service,
                a.window_start_unix_ns,
            )
                .cmp(&(
                    &b.source_gid,
                    &b.target_gid,
                    b.pinglist_type,
                    &b.service,
                    b.window_start_unix_ns,
                ))
        });
        out
    }

    /// Latest SERVICE window of (source GID, target GID, service), if any. No
    /// allocation: all three are looked up by `&str`.
    pub fn latest_service(
        &self,
        source_gid: &str,
        target_gid: &str,
        service: &str,
    ) -> Option<&PathSummary> {
        let src = *self.gid_ids.get(source_gid)?;
        let dst = *self.gid_ids.get(target_gid)?;
        let svc = *self.service_ids.get(service)?;
        self.paths
            .get(&(src, dst, svc + 1))?
            .windows
            .back()
            .map(|w| &w.summary)
    }

    /// The retained FOCUS windows of (source GID, target GID), oldest first (what an
    /// on-demand trace reads).
    pub fn focus_windows(&self, source_gid: &str, target_gid: &str) -> Vec<&PathSummary> {
        let (Some(&src), Some(&dst)) = (self.gid_ids.get(source_gid), self.gid_ids.get(target_gid))
        else {
            return Vec::new();
        };
        self.paths
            .get(&(src, dst, FOCUS_PATH_KIND))
            .map(|p| p.windows.iter().map(|w| &w.summary).collect())
            .unwrap_or_default()
    }

    /// Per (source ToR, target ToR) aggregation over the latest window of each ToR-mesh
    /// and inter-ToR path: counts summed, loss = failed/total, quantiles = max over
    /// paths. SERVICE windows re-measure those pairs and are left out so that `paths`
    /// counts network paths, not paths times services; they are in `ListServicePaths`.
    ///
    /// A path whose latest window ended more than [`STALE_AFTER_WINDOWS`] of its windows
    /// before `now_unix_ns` is no longer measured (an inter-ToR sample moved on, an agent
    /// went away) and is left out: its last verdict must not colour a pair forever.
    pub fn tor_pairs(&self, now_unix_ns: u64) -> Vec<TorPairStats> {
        let mut pairs: HashMap<(u32, u32), TorPairStats> = HashMap::new();
        for (key, p) in &self.paths {
            if key.2 != 0 {
                continue;
            }
            let Some(w) = p.windows.back() else { continue };
            let s = &w.summary;
            let window_ns = (s.window_duration_ms.max(1000) as u64) * 1_000_000;
            let ended = s.window_start_unix_ns.saturating_add(window_ns);
            if now_unix_ns > ended.saturating_add(STALE_AFTER_WINDOWS * window_ns) {
                continue;
            }
            let e = pairs.entry(p.tors).or_default();
            e.paths += 1;
            e.probe_total += s.probe_total as u64;
            e.probe_success += s.probe_success as u64;
            e.probe_failed += s.probe_failed as u64;
            e.invalid_rtt_count += s.invalid_rtt_count as u64;
            e.network_rtt_p50_ns = e.network_rtt_p50_ns.max(s.network_rtt_p50_ns);
            e.network_rtt_p99_ns = e.network_rtt_p99_ns.max(s.network_rtt_p99_ns);
            e.prober_delay_p50_ns = e.prober_delay_p50_ns.max(s.prober_delay_p50_ns);
            e.responder_delay_p50_ns = e.responder_delay_p50_ns.max(s.responder_delay_p50_ns);
        }
        let mut out: Vec<TorPairStats> = pairs
            .into_iter()
            .map(|((src, dst), mut e)| {
                e.source_tor_id = self.tor_names[src as usize].to_string();
                e.target_tor_id = self.tor_names[dst as usize].to_string();
                e.loss_ratio = if e.probe_total > 0 {
                    e.probe_failed as f64 / e.probe_total as f64
                } else {
                    0.0
                };
                e
            })
            .collect();
        out.sort_unstable_by(|a, b| {
            (&a.source_tor_id, &a.target_tor_id).cmp(&(&b.source_tor_id, &b.target_tor_id))
        });
        out
    }

    /// Open findings, then up to `resolved_limit` resolved ones (0 = all retained).
    pub fn findings(&self, resolved_limit: usize) -> Vec<Finding> {
        self.findings.list(resolved_limit)
    }

    pub fn finding_book(&self) -> &FindingBook {
        &self.findings
    }

    /// Every retained window of one SERVICE path, oldest first (the page's sparkline).
    pub fn service_windows(
        &self,
        source_gid: &str,
        target_gid: &str,
        service: &str,
    ) -> Vec<&PathSummary> {
        let (Some(&src), Some(&dst), Some(&svc)) = (
            self.gid_ids.get(source_gid),
            self.gid_ids.get(target_gid),
            self.service_ids.get(service),
        ) else {
            return Vec::new();
        };
        self.paths
            .get(&(src, dst, svc + 1))
            .map(|p| p.windows.iter().map(|w| &w.summary).collect())
            .unwrap_or_default()
    }

    /// Most recent violations first; `limit` 0 = everything retained.
    pub fn violations(&self, limit: usize) -> Vec<Violation> {
        let n = if limit == 0 {
            self.violations.len()
        } else {
            limit.min(self.violations.len())
        };
        self.violations.iter().rev().take(n).cloned().collect()
    }
}

#[cfg(test)]
mod tests;
