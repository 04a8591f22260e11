//! Analyzer phase 2 (pure, no I/O): names the broken component (RNIC, host, ToR, ToR-spine
//! link) from one settled window of every path's summary, and keeps component findings
//! with hysteresis.
//!
//! One window is explained in a fixed order, each step removing what it explains from
//! the evidence the next steps see:
//! 1. host: endpoint delays (prober or responder) inflated on the host's paths while the
//!    network RTT stays normal. Its paths' losses are its, not the network's: this is
//!    R-Pingmesh's main source of false positives.
//! 2. ToR: (nearly) every RNIC under it unreachable from other ToRs and from each other.
//! 3. RNIC: its peers fail to reach it and it fails to reach them, on the ToR-local paths
//!    too (so an uplink problem, which spares ToR-local paths, is never an RNIC), and
//!    evenly over the spines when the topology knows them. The most clearly broken is
//!    judged first and its paths set aside before the next, so the neighbour of a dead
//!    RNIC is not named with it (nor the two read as a dead ToR of two by step 2, which
//!    counts broken RNICs the same way, unless nothing off the ToR probed them: from
//!    inside, a dead ToR and a dead RNIC look alike).
//! 4. link: per-label tomography. Every failing or slow (pair, label) votes for the links
//!    its probe and its ACKs crossed; the link with the most votes explains them
//!    first (greedy), so links that only share a few bad labels with it are cleared.
//!    Without an ECMP model, the ToR side (uplink/downlink) is named instead.
//!
//! A component blamed in `open_after_windows` consecutive windows opens a finding; an open
//! finding resolves after `resolve_after_windows` windows that do not blame it.

use std::collections::{BTreeMap, HashMap, VecDeque};

use rpingmesh_proto::controller_agent::PathSummary;
use rpingmesh_proto::operator::{Finding, FindingEvent, FindingEvidence};

use crate::registry::RegistryIndex;
use crate::topology::{LinkDir, Topology};

/// Where an RNIC sits, by its GID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place<'a> {
    pub host: &'a str,
    pub device: &'a str,
    pub tor: &'a str,
}

/// GID to place: the registry index in the controller, the fabric in the simulator.
pub trait Inventory {
    fn place(&self, gid: &str) -> Option<Place<'_>>;
}

impl Inventory for RegistryIndex {
    fn place(&self, gid: &str) -> Option<Place<'_>> {
        self.rnic(gid).map(|r| Place {
            host: &r.host_name,
            device: &r.device_name,
            tor: &r.tor_id,
        })
    }
}

impl Inventory for HashMap<String, (String, String, String)> {
    fn place(&self, gid: &str) -> Option<Place<'_>> {
        self.get(gid)
            .map(|(host, device, tor)| Place { host, device, tor })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ComponentKind {
    Rnic,
    Host,
    Tor,
    Link,
}

impl ComponentKind {
    pub const ALL: [ComponentKind; 4] = [
        ComponentKind::Rnic,
        ComponentKind::Host,
        ComponentKind::Tor,
        ComponentKind::Link,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            ComponentKind::Rnic => "rnic",
            ComponentKind::Host => "host",
            ComponentKind::Tor => "tor",
            ComponentKind::Link => "link",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Symptom {
    Down,
    Flapping,
    Loss,
    Latency,
    Stall,
}

impl Symptom {
    /// "down" when the component does not work (down, flapping), "degraded" when it
    /// works but loses, delays or stalls what crosses it.
    pub fn severity(self) -> &'static str {
        match self {
            Symptom::Down | Symptom::Flapping => "down",
            _ => "degraded",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Symptom::Down => "down",
            Symptom::Flapping => "flapping",
            Symptom::Loss => "loss",
            Symptom::Latency => "latency",
            Symptom::Stall => "stall",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LocalizerParams {
    /// K: consecutive blaming windows before a finding opens.
    pub open_after_windows: u32,
    /// M: windows without blame before an open finding resolves.
    pub resolve_after_windows: u32,
    /// A path or label window is lossy above this loss ratio.
    pub loss_ratio: f64,
    /// Endpoint delay (prober or responder p50) above which a host is stalled.
    pub host_delay_ns: u64,
    /// A label is slow when its RTT median exceeds its pair's typical one by this much.
    pub latency_excess_ns: u64,
    /// Probes a link must carry in a window before it can be blamed.
    pub min_link_probes: u64,
    /// Resolved findings kept in memory.
    pub resolved_capacity: usize,
    /// The gray-failure detector (statistical, below any SLA).
    pub gray: GrayParams,
}

impl Default for LocalizerParams {
    fn default() -> Self {
        LocalizerParams {
            open_after_windows: 1,
            resolve_after_windows: 2,
            loss_ratio: 0.01,
            host_delay_ns: 1_000_000,
            latency_excess_ns: 50_000,
            min_link_probes: 20,
            resolved_capacity: 1000,
            gray: GrayParams::default(),
        }
    }
}

/// One component blamed in one window.
#[derive(Debug, Clone, PartialEq)]
pub struct Blame {
    pub kind: ComponentKind,
    pub location: String,
    pub symptom: Symptom,
    pub confidence: f64,
    pub evidence: FindingEvidence,
}

#[derive(Debug, Default)]
struct Candidate {
    /// Consecutive windows that blamed it (before it opened).
    streak: u32,
    /// Consecutive windows that did not blame it (while open).
    clean: u32,
    /// Id of its open finding.
    open: Option<u64>,
    last_window: u64,
}

pub struct Localizer {
    params: LocalizerParams,
    topology: Option<Topology>,
    gray: GrayDetector,
    candidates: HashMap<(ComponentKind, String), Candidate>,
    open: BTreeMap<u64, Finding>,
    resolved: VecDeque<Finding>,
    next_id: u64,
}

impl Localizer {
    pub fn new(params: LocalizerParams, topology: Option<Topology>) -> Self {
        let mut gp = params.gray;
        gp.resolve_after_windows = params.resolve_after_windows;
        Localizer {
            params,
            topology,
            gray: GrayDetector::new(gp),
            candidates: HashMap::new(),
            open: BTreeMap::new(),
            resolved: VecDeque::new(),
            next_id: 1,
        }
    }

    pub fn params(&self) -> &LocalizerParams {
        &self.params
    }

    pub fn topology(&self) -> Option<&Topology> {
        self.topology.as_ref()
    }

    /// Findings from the store after a restart: open ones continue (a blaming window
    /// keeps them, M clean windows resolve them), ids continue after the largest.
    /// Starts over from `findings`: a replica taking over analysis continues the previous
    /// leader's stored findings (same ids, no second finding for a component).
    pub fn reset_to(&mut self, findings: Vec<Finding>) {
        let baseline = std::mem::take(&mut self.gray.baseline);
        let fresh = Localizer::new(self.params, self.topology.take());
        *self = fresh;
        self.gray.baseline = baseline;
        self.restore(findings);
    }

    /// The learned baseline, for the store.
    pub fn baseline_json(&self) -> Vec<u8> {
        self.gray.baseline.to_json()
    }

    /// Windows the baseline has learned from.
    pub fn baseline_windows(&self) -> u64 {
        self.gray.baseline.windows
    }

    /// Takes a stored baseline over (a restarted controller does not start cold).
    pub fn restore_baseline(&mut self, json: &[u8]) -> Result<(), String> {
        self.gray.baseline = Baseline::from_json(json)?;
        Ok(())
    }

    /// The evidence (nats) that named a component in the last window.
    pub fn gray_bar(&self) -> f64 {
        self.gray.bar()
    }

    /// What the gray detector suspects but has not proven (last window).
    pub fn suspects(&self) -> &[Suspect] {
        self.gray.suspects()
    }

    pub fn restore(&mut self, findings: Vec<Finding>) {
        let mut resolved = Vec::new();
        for f in findings {
            self.next_id = self.next_id.max(f.id + 1);
            if f.open {
                if let Some(kind) = ComponentKind::parse(&f.kind) {
                    let c = self
                        .candidates
                        .entry((kind, f.location.clone()))
                        .or_default();
                    c.open = Some(f.id);
                    c.streak = self.params.open_after_windows;
                }
                self.open.insert(f.id, f);
            } else {
                resolved.push(f);
            }
        }
        resolved.sort_by_key(|f| (f.resolved_unix_ns, f.id));
        for f in resolved {
            self.push_resolved(f);
        }
    }

    /// Explains one settled window (`paths`: every path's summary of the window starting
    /// at `window_start_unix_ns`) and moves the findings. Returns what changed.
    pub fn localize<'a>(
        &mut self,
        window_start_unix_ns: u64,
        paths: impl IntoIterator<Item = &'a PathSummary>,
        inv: &dyn Inventory,
        now_unix_ns: u64,
    ) -> Vec<FindingEvent> {
        let paths = WindowPath::intern(paths);
        self.localize_paths(window_start_unix_ns, &paths, inv, now_unix_ns)
    }

    /// [`Localizer::localize`] over paths whose GIDs the caller already interned (the
    /// analyzer's ids): no GID is hashed per path.
    pub fn localize_paths(
        &mut self,
        window_start_unix_ns: u64,
        paths: &[WindowPath<'_>],
        inv: &dyn Inventory,
        now_unix_ns: u64,
    ) -> Vec<FindingEvent> {
        let blames = self.explain_window(paths, inv);
        self.apply(window_start_unix_ns, blames, now_unix_ns)
    }

    /// One window's blames: stalled hosts first (their paths' timeouts are their own),
    /// then the rules (what breaks outright), then the gray detector on what the rules
    /// did not blame; one blame per component.
    fn explain_window(&mut self, paths: &[WindowPath<'_>], inv: &dyn Inventory) -> Vec<Blame> {
        let topo = self.topology.as_ref();
        let placed = Placed::new(paths, inv, topo);
        self.gray.set_bar(placed.window_ms);
        let hw = hoststat::gather(&placed, &self.gray.baseline);
        let (host_blames, skip_host) = self.gray.hosts(&placed, &hw);
        // What the gray detector has named is explained for the rules too: a stalled
        // host's paths, a lossy RNIC's or ToR's, the tuples of a named link.
        let (mut named_rnics, mut named_tors, mut known_links) =
            (Vec::new(), Vec::new(), Vec::new());
        for c in self.gray.active() {
            match c {
                Component::Rnic(g) => named_rnics.push(g.as_str()),
                Component::Tor(t) => named_tors.push(t.as_str()),
                Component::Link(t, s, d) => known_links.push((*t, *s, *d)),
                Component::Cable(t, s) => {
                    known_links.extend([(*t, *s, LinkDir::Up), (*t, *s, LinkDir::Down)])
                }
                _ => {}
            }
        }
        let rnic_named: Vec<bool> = placed
            .rnics
            .iter()
            .map(|rn| named_rnics.contains(&rn.gid))
            .collect();
        let tor_named: Vec<bool> = placed
            .tors
            .names
            .iter()
            .map(|t| named_tors.contains(&t.as_str()))
            .collect();
        let mut skip = vec![false; paths.len()];
        for r in &placed.paths {
            let named = rnic_named[r.src as usize]
                || rnic_named[r.dst as usize]
                || r.tors.iter().any(|&t| tor_named[t as usize]);
            if named || r.hosts.iter().any(|&h| skip_host[h as usize]) {
                skip[r.index as usize] = true;
            }
        }
        let rules = explain_window(&self.params, topo, &placed, &skip, &known_links);
        let gray = self.gray.network(
            &placed,
            topo,
            &Skip {
                paths: &rules.blamed_paths,
                links: &rules.blamed_links,
            },
            &skip_host,
        );
        hw.learn(&placed, &mut self.gray.baseline, &skip_host);
        self.gray.end_window();
        let open_score = self.gray.bar();
        let mut gray = naming::blames(
            host_blames.into_iter().chain(gray).collect(),
            &placed,
            paths,
            topo,
            open_score,
        );
        let mut out = rules.blames;
        gray.retain(|g| {
            !out.iter()
                .any(|b| b.kind == g.kind && b.location == g.location)
        });
        out.extend(gray);
        out
    }

    /// Moves the findings with one window's blames (hysteresis).
    pub fn apply(
        &mut self,
        window_start_unix_ns: u64,
        blames: Vec<Blame>,
        now_unix_ns: u64,
    ) -> Vec<FindingEvent> {
        let mut events = Vec::new();
        let k = self.params.open_after_windows.max(1);
        let mut blamed = std::collections::HashSet::new();
        for b in blames {
            let key = (b.kind, b.location.clone());
            blamed.insert(key.clone());
            let c = self.candidates.entry(key).or_default();
            c.last_window = window_start_unix_ns;
            c.clean = 0;
            match c.open.and_then(|id| self.open.get_mut(&id)) {
                Some(f) => {
                    f.last_seen_unix_ns = now_unix_ns;
                    f.confidence = f.confidence.max(b.confidence);
                    // A window that only grazed the fault (its start or end) says less:
                    // "down" is not taken back by it.
                    if f.symptom != Symptom::Down.as_str() {
                        f.symptom = b.symptom.as_str().to_string();
                        f.severity = b.symptom.severity().to_string();
                    }
                    let windows = f.evidence.as_ref().map_or(0, |e| e.windows) + 1;
                    let mut ev = b.evidence;
                    ev.windows = windows;
                    f.evidence = Some(ev);
                    events.push(event("updated", f));
                }
                None => {
                    c.streak += 1;
                    if c.streak >= k {
                        let id = self.next_id;
                        self.next_id += 1;
                        c.open = Some(id);
                        let mut ev = b.evidence;
                        ev.windows = c.streak;
                        let f = Finding {
                            id,
                            kind: b.kind.as_str().to_string(),
                            location: b.location,
                            severity: b.symptom.severity().to_string(),
                            symptom: b.symptom.as_str().to_string(),
                            confidence: b.confidence,
                            opened_unix_ns: now_unix_ns,
                            last_seen_unix_ns: now_unix_ns,
                            resolved_unix_ns: 0,
                            open: true,
                            evidence: Some(ev),
                            impact: Vec::new(),
                            suppressed: String::new(),
                            suppressed_by: 0,
                        };
                        events.push(event("opened", &f));
                        self.open.insert(id, f);
                    }
                }
            }
        }
        let m = self.params.resolve_after_windows.max(1);
        let mut resolved = Vec::new();
        self.candidates.retain(|key, c| {
            if blamed.contains(key) {
                return true;
            }
            c.streak = 0;
            let Some(id) = c.open else {
                return false;
            };
            c.clean += 1;
            if c.clean >= m {
                resolved.push(id);
                return false;
            }
            true
        });
        resolved.sort_unstable();
        for id in resolved {
            if let Some(mut f) = self.open.remove(&id) {
                f.open = false;
                f.resolved_unix_ns = now_unix_ns;
                events.push(event("resolved", &f));
                self.push_resolved(f);
            }
        }
        events
    }

    /// Sets what open finding `id` hurts (`crate::impact`); it stays with the finding
    /// once resolved.
    pub fn set_impact(&mut self, id: u64, impact: Vec<rpingmesh_proto::operator::FindingImpact>) {
        if let Some(f) = self.open.get_mut(&id) {
            f.impact = impact;
        }
    }

    fn push_resolved(&mut self, f: Finding) {
        self.resolved.push_back(f);
        while self.resolved.len() > self.params.resolved_capacity.max(1) {
            self.resolved.pop_front();
        }
    }

    /// Open findings (oldest first), then resolved ones (most recently resolved first), at
    /// most `resolved_limit` of those (0 = all retained); `kind` filters ("" = all).
    pub fn list(&self, resolved_limit: usize, kind: &str) -> Vec<Finding> {
        let keep = |f: &&Finding| kind.is_empty() || f.kind == kind;
        let mut out: Vec<Finding> = self.open.values().filter(keep).cloned().collect();
        let limit = if resolved_limit == 0 {
            usize::MAX
        } else {
            resolved_limit
        };
        out.extend(self.resolved.iter().rev().filter(keep).take(limit).cloned());
        out
    }

    /// Per finding kind (every kind present, 0 when none), the workloads that open
    /// findings of that kind hurt (paths that surely cross the component), each once.
    pub fn affected_services_by_kind(&self) -> BTreeMap<&'static str, usize> {
        let mut sets: BTreeMap<&'static str, std::collections::BTreeSet<&str>> = ComponentKind::ALL
            .iter()
            .map(|k| (k.as_str(), Default::default()))
            .collect();
        for f in self.open.values() {
            if let Some(k) = ComponentKind::parse(&f.kind) {
                let set = sets.entry(k.as_str()).or_default();
                for i in f.impact.iter().filter(|i| i.paths_affected > 0) {
                    set.insert(&i.service);
                }
            }
        }
        sets.into_iter().map(|(k, s)| (k, s.len())).collect()
    }

    /// Open findings per kind (every kind present, 0 when none).
    pub fn open_by_kind(&self) -> BTreeMap<&'static str, usize> {
        let mut out: BTreeMap<&'static str, usize> =
            ComponentKind::ALL.iter().map(|k| (k.as_str(), 0)).collect();
        for f in self.open.values() {
            if let Some(k) = ComponentKind::parse(&f.kind) {
                *out.entry(k.as_str()).or_default() += 1;
            }
        }
        out
    }
}

fn event(change: &str, f: &Finding) -> FindingEvent {
    FindingEvent {
        change: change.to_string(),
        finding: Some(f.clone()),
    }
}

mod baseline;
mod evidence;
mod gray;
mod hoststat;
mod naming;
mod placed;
mod rules;
mod stats;
mod tally;

pub use baseline::Baseline;
pub use evidence::Component;
pub use gray::{GrayParams, Suspect};
pub use rules::{explain, explain_window, RulesOutcome};
pub use tally::Test;

use evidence::Skip;
use gray::GrayDetector;
use placed::Placed;
pub use placed::WindowPath;

#[cfg(test)]
mod evidence_tests;
#[cfg(test)]
mod gray_tests;
#[cfg(test)]
mod tests;
