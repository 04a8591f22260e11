//! The driver: every RNIC runs the agent's per-RNIC loop (real `ProbeScheduler`,
//! `Prober`, `Responder`, `FlowLabelSet`s and `PathAggregator<PathKey>`) over the
//! simulated fabric in virtual time; closed windows go through the agent's `to_proto` to
//! one real controller `Analyzer`, whose `tick` names the findings.
//!
//! # Time
//!
//! Virtual time `v` is ns since the scenario start. The NIC clock (T2..T5, and the
//! realtime the aggregator windows by) is `base + v`, `base` a fixed unix time aligned
//! to the window length, so windows start at `v = k * window`. Each host has a monotonic
//! clock `v + offset` (a seeded uptime) for T1/T6 and the scheduler.
//!
//! # Event order
//!
//! Each RNIC has two pending events: its next pinglist refresh and its scheduler's next
//! wake-up (a refresh first at one instant). At a wake-up the RNIC first hands the
//! prober its timeouts due by then, then sends every probe the scheduler has due (the
//! k-th of a burst at `v + k * SEND_SPACING_NS`), as one turn of the agent's loop.
//! Between two report deliveries each RNIC runs alone up to the delivery time, one RNIC
//! after the other (its state stays in cache): nothing one RNIC does depends on
//! another's progress, since faults are a fixed schedule and a responder answers each
//! probe at once (its pending entry is completed in the same call), so the order in
//! which probes of different probers reach it changes nothing. Every core still sees its
//! own calls in time order. A heap orders the global events: report deliveries, then
//! analyzer ticks at one instant. (The result is the same as with one global time order:
//! the simulator was first written that way and gave identical runs.)
//!
//! A probe's six core events are handled at its send time, in this order: `start_probe`,
//! `on_probe_sent`, the responder's `on_probe` and `on_first_ack_sent`, `on_ack(first)`,
//! `on_ack(second)`, each with the timestamp of the moment it happens. This is exact
//! because nothing that happens in between can change the result: each packet meets the
//! fault state of the moment it crosses each element, a responder answers every probe
//! at once, and the prober matches ACKs by sequence. What the prober would not see
//! before the probe's deadline (T1 + timeout) is not delivered: such a probe stays
//! outstanding and `poll_timeouts` finishes it (Lost, or Invalid when only some of it
//! arrived). Outcomes are recorded into the aggregator under their send time (T1), as the
//! agent counts them, so a probe sent inside a fault is counted inside it; a window is
//! taken a probe timeout after its end, when every probe sent in it has ended.
//!
//! Reports: `report_delay` after each window ends, every RNIC hands in its timeouts due
//! by then and its closed windows (the agent's 1 s flush, plus delivery), one batch per
//! host (one agent per host), to `Analyzer::ingest`. `Analyzer::tick` runs every virtual
//! second; it localizes a window `localize_settle_ns` after its end.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use rand::rngs::SmallRng;
use rand::SeedableRng;
use rpingmesh_agent::report::{to_proto, PathKey};
use rpingmesh_controller::analyzer::{Analyzer, AnalyzerParams};
use rpingmesh_controller::ecmp;
use rpingmesh_controller::focus::{FocusParams, FocusPlanner};
use rpingmesh_controller::pinglist::{self, PinglistParams};
use rpingmesh_controller::registry::RegistryIndex;
use rpingmesh_proto::controller_agent::{PathSummary, PingTarget};
use rpingmesh_proto::operator::{FindingEvent, TorPairStats};
use rpingmesh_protocol::aggregate::PathAggregator;
use rpingmesh_protocol::flowlabel::{rotation_epoch, FlowLabelSet};
use rpingmesh_protocol::prober::{ProbeOutcome, ProbeResult, Prober, ProberConfig};
use rpingmesh_protocol::responder::Responder;
use rpingmesh_protocol::schedule::ProbeScheduler;
use rpingmesh_protocol::{PinglistKind, TargetId};

use crate::background::Background;
use crate::fabric::Fabric;
use crate::faults::FaultPlan;
use crate::output::FindingRecord;
use crate::rng::{derive, threshold, Rng};
use crate::scenario::{Scenario, ScenarioError};

/// Background noise, so that a fault-free fabric is not perfectly clean. Endpoint
/// delays are `base + uniform[0, span)` ns, plus, with `HICCUP_PROBABILITY`, an
/// exponential scheduling hiccup of mean `HICCUP_MEAN_NS`.
pub mod noise {
    /// Prober: T1 (clock read) to T2 (the probe leaves the NIC).
    pub const PROBER_TX_NS: (u64, u64) = (2_000, 1_000);
    /// Responder: T3 (probe arrives) to T4 (first ACK leaves).
    pub const RESPONDER_NS: (u64, u64) = (3_000, 1_500);
    /// The second ACK leaves this long after the first ACK's completion.
    pub const SECOND_ACK_GAP_NS: (u64, u64) = (1_000, 500);
    /// Prober: an ACK arrives to it being handled (T6 for the second ACK).
    pub const PROBER_RX_NS: (u64, u64) = (2_000, 1_000);
    pub const HICCUP_PROBABILITY: f64 = 1e-3;
    pub const HICCUP_MEAN_NS: f64 = 20_000.0;
    /// Between the probes of one scheduler burst (one send call each).
    pub const SEND_SPACING_NS: u64 = 1_000;
    /// host_stall: share of the packets a stalled host handles whose stall outlasts the
    /// probe timeout (their probe times out).
    pub const STALL_BEYOND_TIMEOUT: f64 = 0.02;
}

/// The fixed unix time of the scenario start (before aligning to the window):
/// 2026-01-01T00:00:00Z.
pub const BASE_UNIX_SEC: u64 = 1_767_225_600;

const NS: u64 = 1_000_000_000;
/// Outstanding probes per prober (the agent's `max_in_flight`).
const MAX_IN_FLIGHT: usize = 4096;
/// Responder pending table (the agent's).
const RESPONDER_PENDING: usize = 8192;
/// The controller's `active_threshold_sec` default (every agent heartbeats here).
const ACTIVE_THRESHOLD_SEC: u64 = 300;

/// Knobs of a run that are not part of the scenario file. Defaults are the agent's and
/// controller's defaults, except `localize_settle_ns` (5 s).
#[derive(Debug, Clone, PartialEq)]
pub struct SimOptions {
    /// Agent `analysis_window_sec`.
    pub window_sec: u64,
    /// Agent `probe_interval_ms`: every target is due once per round.
    pub probe_interval_ms: u64,
    /// Agent `pinglist_update_interval_sec`.
    pub pinglist_refresh_sec: u64,
    /// Agent `probe_timeout_ms`.
    pub probe_timeout_ms: u64,
    /// Agent `target_probe_rate_per_second` (the per-kind token buckets' per-target rate).
    pub per_target_rate: f64,
    /// Agent `flow_label_rotation_period_sec`.
    pub flow_label_rotation_sec: u64,
    /// Controller `inter_tor_sample_size`.
    pub inter_tor_sample_size: usize,
    /// Labels per target: Eq.(1) with the controller defaults (16 paths, 0.9, cap 64).
    pub flow_label_count: u32,
    /// From a window's end to its summaries' ingest (the agent's flush + the report).
    pub report_delay_ms: u64,
    pub analyzer: AnalyzerParams,
    /// Adaptive probing: the controller's FOCUS planner (`max_components` 0: off) and
    /// the agents' `focus_probe_rate_per_second`.
    pub focus: FocusParams,
    pub focus_rate: f64,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            window_sec: 30,
            probe_interval_ms: 500,
            pinglist_refresh_sec: 300,
            probe_timeout_ms: 1000,
            per_target_rate: 10.0,
            flow_label_rotation_sec: 3600,
            inter_tor_sample_size: 5,
            flow_label_count: ecmp::flow_label_count(16, 0.9, 64),
            report_delay_ms: 2000,
            analyzer: AnalyzerParams {
                localize_settle_ns: 5 * NS,
                ..AnalyzerParams::default()
            },
            focus: FocusParams {
                active_threshold_sec: ACTIVE_THRESHOLD_SEC,
                ..FocusParams::default()
            },
            focus_rate: 20.0,
        }
    }
}

/// Probe outcomes over a run (or so far).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProbeCounts {
    pub sent: u64,
    /// Of `sent`, the extra probes of adaptive probing (FOCUS targets).
    pub focus: u64,
    pub success: u64,
    pub lost: u64,
    pub invalid: u64,
}

/// The ToR pair with the worst loss in one window.
#[derive(Debug, Clone, PartialEq)]
pub struct PairLoss {
    pub source_tor: String,
    pub target_tor: String,
    pub probe_total: u64,
    pub probe_failed: u64,
    pub loss_ratio: f64,
}

/// What the analyzer received for one window.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowStats {
    pub index: u32,
    pub start_sec: f64,
    pub end_sec: f64,
    /// Path summaries of this window.
    pub paths: u32,
    pub probe_total: u64,
    pub probe_success: u64,
    pub probe_failed: u64,
    pub invalid: u64,
    pub worst_pair: Option<PairLoss>,
}

/// A finding change with the virtual second it happened at.
#[derive(Debug, Clone, PartialEq)]
pub struct TimedEvent {
    pub sec: f64,
    pub event: FindingEvent,
}

/// One window's step (see [`Sim::step_window`]).
#[derive(Debug, Clone)]
pub struct WindowReport {
    pub window: WindowStats,
    /// Virtual seconds since the scenario start when the step ended (the window was
    /// ingested and localized).
    pub now_sec: f64,
    /// `Analyzer::tor_pairs` at `now_sec`.
    pub tor_pairs: Vec<TorPairStats>,
    /// Finding changes since the previous step.
    pub events: Vec<TimedEvent>,
    /// Probes so far.
    pub probes: ProbeCounts,
}

/// The result of a whole run.
#[derive(Debug, Clone)]
pub struct SimOutcome {
    /// Every finding the analyzer opened, in open order, as last seen.
    pub findings: Vec<FindingRecord>,
    pub events: Vec<TimedEvent>,
    pub windows: Vec<WindowStats>,
    pub probes: ProbeCounts,
    /// Path summaries ingested.
    pub summaries: u64,
    pub virtual_sec: f64,
    pub wall_sec: f64,
    /// The strongest evidence (nats) the gray detector saw short of naming a component:
    /// on a fault-free run, the margin to its naming bar.
    pub max_suspect_score: f64,
}

impl SimOutcome {
    /// The findings as JSON lines (each ends with a newline).
    pub fn findings_jsonl(&self) -> String {
        let mut out = String::new();
        for f in &self.findings {
            out.push_str(&f.to_json().to_string());
            out.push('\n');
        }
        out
    }
}

/// Runs a whole scenario. Panics with the scenario error on an invalid scenario (see
/// [`try_run`]).
pub fn run(s: &Scenario, o: &SimOptions) -> SimOutcome {
    try_run(s, o).unwrap_or_else(|e| panic!("invalid scenario: {e}"))
}

pub fn try_run(s: &Scenario, o: &SimOptions) -> Result<SimOutcome, ScenarioError> {
    Ok(Sim::new(s, o)?.finish())
}

const NONE: u32 = u32::MAX;
const NO_SPINE: u16 = u16::MAX;

/// The spines a label's probe and its ACKs cross (cached per label index).
#[derive(Debug, Clone, Copy)]
struct Route {
    label: u32,
    fwd: u16,
    rev: u16,
    valid: bool,
}

impl Route {
    const EMPTY: Route = Route {
        label: 0,
        fwd: NO_SPINE,
        rev: NO_SPINE,
        valid: false,
    };
}

fn spine(s: u16) -> Option<u32> {
    (s != NO_SPINE).then_some(s as u32)
}

struct Target {
    id: TargetId,
    dst: u32,
    kind: PinglistKind,
    /// (seed, count, legacy label): a refresh with the same keeps the label position.
    spec: (u32, u32, u32),
    labels: FlowLabelSet,
    /// Mirrors the set's round-robin position (its next index).
    pos: u32,
    local: bool,
    /// The target's host and ToR (kept here: the hot path does not touch `Rnic`).
    dst_host: u32,
    dst_tor: u32,
    routes: Vec<Route>,
    key: PathKey,
}

/// One RNIC and its agent-side state.
struct Node {
    rnic: u32,
    host: u32,
    tor: u32,
    gid: Arc<str>,
    off: u64,
    prober: Prober,
    scheduler: ProbeScheduler,
    targets: Vec<Target>,
    /// TargetId -> index into `targets` (NONE: no longer listed).
    slot_of: Vec<u32>,
    ids: HashMap<(u32, u8), TargetId>,
    next_id: TargetId,
    agg: PathAggregator<PathKey>,
    rng: Rng,
    /// Virtual time of the next scheduler wake-up (u64::MAX: none).
    next_wake: u64,
    /// Virtual time of the next pinglist refresh (u64::MAX: none).
    next_refresh: u64,
    refreshes: u64,
    /// The ToR-mesh and inter-ToR lists as last fetched, and the FOCUS list.
    lists: Vec<(PinglistKind, Vec<PingTarget>)>,
    focus: Vec<PingTarget>,
    scratch: Vec<ProbeOutcome>,
}

/// Fixed numbers of a run, in ns.
struct Consts {
    base: u64,
    timeout: u64,
    link: u64,
    jitter: u64,
    bg_local: u64,
    bg_inter: u64,
    /// With a loss spread: the two host-link traversals of an inter-ToR packet (its
    /// ToR-spine traversals are drawn per link from `World::link_bg`).
    bg_hosts: u64,
    /// A queueing delay on a ToR-local / inter-ToR packet (2 / 4 traversals).
    queue_local: u64,
    queue_inter: u64,
    queue_mean_ns: f64,
    hiccup: u64,
    beyond: u64,
    rotation_sec: u64,
    refresh: u64,
    duration: u64,
    rate: f64,
    seed: u64,
}

/// What does not change while RNICs run: the fabric, the faults, the registry.
struct World {
    fabric: Fabric,
    plan: FaultPlan,
    /// Per directed ToR-spine link (`2 * (tor * spines + spine) + down`), its background
    /// loss threshold; empty when every link has the same (the old single draw).
    link_bg: Vec<u64>,
    host_off: Vec<u64>,
    k: Consts,
    index: RegistryIndex,
    gid_index: HashMap<String, u32>,
    pinglist: PinglistParams,
    focus_rate: f64,
    /// Unix seconds every agent registered (and keeps heartbeating) at.
    registered_sec: u64,
    empty: Arc<str>,
}

// Global events; at one instant a report goes before a tick.
const EV_REPORT: u8 = 0;
const EV_TICK: u8 = 1;

/// A simulation that can be stepped window by window.
pub struct Sim {
    scenario: Scenario,
    opts: SimOptions,
    w: World,
    nodes: Vec<Node>,
    responders: Vec<Responder<u32>>,
    analyzer: Analyzer,
    /// Reports and ticks: (time, class, window index).
    heap: BinaryHeap<Reverse<(u64, u8, u32)>>,
    window_ns: u64,
    windows_total: u32,
    next_window: u32,
    final_horizon: u64,
    now: u64,
    /// Every RNIC ran up to here.
    synced: u64,
    counts: ProbeCounts,
    summaries: u64,
    windows: Vec<WindowStats>,
    events: Vec<TimedEvent>,
    events_reported: usize,
    findings: Vec<FindingRecord>,
    finding_pos: HashMap<u64, usize>,
    /// The strongest evidence (nats) the gray detector had short of naming something.
    max_suspect_score: f64,
    /// The controller's FOCUS lists; windows localized when they were last planned; per
    /// host, the generation its agent last fetched.
    focus: FocusPlanner,
    focus_windows: u64,
    focus_seen: Vec<u64>,
    wall: f64,
}

impl Sim {
    pub fn new(scenario: &Scenario, opts: &SimOptions) -> Result<Sim, ScenarioError> {
        scenario.validate()?;
        let started = Instant::now();
        let seed = scenario.seed;
        let fabric = Fabric::new(&scenario.fabric, (seed ^ (seed >> 32)) as u32);
        let plan = FaultPlan::new(scenario, &fabric, &mut Rng::new(derive(seed, 1)));
        let window_ns = opts.window_sec.max(1) * NS;
        let unaligned = BASE_UNIX_SEC * NS;
        let base = unaligned - unaligned % window_ns;
        let registered_sec = base / NS;
        let index = fabric.registry_index(registered_sec);
        let gid_index = fabric
            .rnics
            .iter()
            .enumerate()
            .map(|(i, r)| (r.gid.to_string(), i as u32))
            .collect();
        let mut setup = Rng::new(derive(seed, 2));
        // Host uptimes between 1000 s and ~11.6 days.
        let host_off: Vec<u64> = fabric
            .hosts
            .iter()
            .map(|_| 1_000 * NS + setup.below(1_000_000 * NS))
            .collect();
        let timeout = opts.probe_timeout_ms.max(1) * 1_000_000;
        let round = opts.probe_interval_ms.max(1) * 1_000_000;
        let spec = &scenario.fabric;
        let bg = scenario.background;
        let link_bg = link_backgrounds(&fabric, &bg, &mut Rng::new(derive(seed, 3)));
        let duration = scenario.duration_sec * NS;
        let k = Consts {
            base,
            timeout,
            link: (spec.link_latency_us * 1e3).round() as u64,
            jitter: (spec.link_jitter_us * 1e3).round() as u64,
            bg_local: threshold(2.0 * bg.loss_per_link),
            bg_inter: threshold(4.0 * bg.loss_per_link),
            bg_hosts: threshold(2.0 * bg.loss_per_link),
            queue_local: threshold(2.0 * bg.queue_probability),
            queue_inter: threshold(4.0 * bg.queue_probability),
            queue_mean_ns: bg.queue_mean_us * 1e3,
            hiccup: threshold(noise::HICCUP_PROBABILITY),
            beyond: threshold(noise::STALL_BEYOND_TIMEOUT),
            rotation_sec: opts.flow_label_rotation_sec,
            refresh: opts.pinglist_refresh_sec.max(1) * NS,
            duration,
            rate: opts.per_target_rate,
            seed,
        };
        let mut nodes = Vec::with_capacity(fabric.rnics.len());
        for (i, r) in fabric.rnics.iter().enumerate() {
            // Agents start within the first second, each at its own phase; they fetch
            // their pinglists first.
            let start = setup.below(NS);
            let epoch = setup.next_u64() as u32;
            nodes.push(Node {
                rnic: i as u32,
                host: r.host,
                tor: r.tor,
                gid: r.gid.clone(),
                off: host_off[r.host as usize],
                prober: Prober::new(ProberConfig {
                    epoch,
                    timeout_ns: timeout,
                    max_in_flight: MAX_IN_FLIGHT,
                }),
                scheduler: ProbeScheduler::new(round),
                targets: Vec::new(),
                slot_of: Vec::new(),
                ids: HashMap::new(),
                next_id: 0,
                agg: PathAggregator::new(window_ns),
                rng: Rng::new(derive(seed, 1_000 + i as u64)),
                next_wake: u64::MAX,
                next_refresh: if start < duration { start } else { u64::MAX },
                refreshes: 0,
                lists: Vec::new(),
                focus: Vec::new(),
                scratch: Vec::new(),
            });
        }
        let responders = (0..fabric.rnics.len())
            .map(|_| Responder::new(RESPONDER_PENDING, timeout))
            .collect();
        let windows_total = (duration / window_ns).min(u32::MAX as u64) as u32;
        let host_count = fabric.hosts.len();
        let analyzer = Analyzer::with_topology(opts.analyzer, Some(fabric.topology.clone()));
        let mut sim = Sim {
            scenario: scenario.clone(),
            opts: opts.clone(),
            w: World {
                fabric,
                plan,
                link_bg,
                host_off,
                k,
                index,
                gid_index,
                pinglist: PinglistParams {
                    active_threshold_sec: ACTIVE_THRESHOLD_SEC,
                    inter_tor_sample_size: opts.inter_tor_sample_size,
                    flow_label_count: opts.flow_label_count.max(1),
                },
                focus_rate: opts.focus_rate,
                registered_sec,
                empty: Arc::from(""),
            },
            nodes,
            responders,
            analyzer,
            heap: BinaryHeap::new(),
            window_ns,
            windows_total,
            next_window: 0,
            final_horizon: 0,
            now: 0,
            synced: 0,
            counts: ProbeCounts::default(),
            summaries: 0,
            windows: Vec::new(),
            events: Vec::new(),
            events_reported: 0,
            findings: Vec::new(),
            finding_pos: HashMap::new(),
            max_suspect_score: 0.0,
            focus: FocusPlanner::new(opts.focus),
            focus_windows: 0,
            focus_seen: vec![0; host_count],
            wall: 0.0,
        };
        sim.final_horizon = if windows_total == 0 {
            duration
        } else {
            sim.horizon_of(windows_total - 1)
        };
        if windows_total > 0 {
            let at = window_ns + sim.report_delay();
            sim.heap.push(Reverse((at, EV_REPORT, 0)));
        }
        if NS <= sim.final_horizon {
            sim.heap.push(Reverse((NS, EV_TICK, 0)));
        }
        sim.wall += started.elapsed().as_secs_f64();
        Ok(sim)
    }

    fn report_delay(&self) -> u64 {
        self.opts.report_delay_ms * 1_000_000
    }

    /// When window `k` has been ingested and localized: its end plus the later of the
    /// report delay and the settle time, on the next whole second (the tick grid).
    fn horizon_of(&self, k: u32) -> u64 {
        let end = (k as u64 + 1) * self.window_ns;
        let after = self
            .report_delay()
            .max(self.opts.analyzer.localize_settle_ns);
        (end + after).div_ceil(NS) * NS
    }

    pub fn scenario(&self) -> &Scenario {
        &self.scenario
    }

    pub fn options(&self) -> &SimOptions {
        &self.opts
    }

    pub fn fabric(&self) -> &Fabric {
        &self.w.fabric
    }

    pub fn fault_plan(&self) -> &FaultPlan {
        &self.w.plan
    }

    /// The controller's analyzer (paths, ToR pairs, findings).
    pub fn analyzer(&self) -> &Analyzer {
        &self.analyzer
    }

    /// The registry index the pinglists come from (also the analyzer's inventory).
    pub fn registry(&self) -> &RegistryIndex {
        &self.w.index
    }

    /// Unix ns of the scenario start (virtual second 0).
    pub fn base_unix_ns(&self) -> u64 {
        self.w.k.base
    }

    /// Virtual seconds since the scenario start.
    pub fn now_sec(&self) -> f64 {
        self.now as f64 / 1e9
    }

    pub fn probes(&self) -> ProbeCounts {
        self.counts
    }

    /// Complete windows the run will report.
    pub fn windows_total(&self) -> u32 {
        self.windows_total
    }

    pub fn windows(&self) -> &[WindowStats] {
        &self.windows
    }

    pub fn findings(&self) -> &[FindingRecord] {
        &self.findings
    }

    pub fn events(&self) -> &[TimedEvent] {
        &self.events
    }

    /// The current probe targets of RNIC `rnic`: (target RNIC, pinglist kind).
    pub fn probe_targets(&self, rnic: u32) -> Vec<(u32, PinglistKind)> {
        self.nodes[rnic as usize]
            .targets
            .iter()
            .map(|t| (t.dst, t.kind))
            .collect()
    }

    pub fn is_done(&self) -> bool {
        self.next_window >= self.windows_total && self.now >= self.final_horizon
    }

    /// Runs until the next complete window has been ingested and localized; None when
    /// every window was.
    pub fn step_window(&mut self) -> Option<WindowReport> {
        if self.next_window >= self.windows_total {
            return None;
        }
        let k = self.next_window;
        self.next_window += 1;
        let until = self.horizon_of(k);
        self.advance(until);
        let window = self
            .windows
            .iter()
            .rev()
            .find(|w| w.index == k)
            .cloned()
            .unwrap_or_else(|| self.empty_window(k));
        let events = self.events[self.events_reported..].to_vec();
        self.events_reported = self.events.len();
        Some(WindowReport {
            window,
            now_sec: self.now_sec(),
            tor_pairs: self.analyzer.tor_pairs(self.w.k.base + self.now),
            events,
            probes: self.counts,
        })
    }

    fn empty_window(&self, k: u32) -> WindowStats {
        let w = self.window_ns as f64 / 1e9;
        WindowStats {
            index: k,
            start_sec: k as f64 * w,
            end_sec: (k + 1) as f64 * w,
            paths: 0,
            probe_total: 0,
            probe_success: 0,
            probe_failed: 0,
            invalid: 0,
            worst_pair: None,
        }
    }

    /// Runs to the end and returns the outcome.
    pub fn finish(mut self) -> SimOutcome {
        self.advance(self.final_horizon);
        self.next_window = self.windows_total;
        SimOutcome {
            findings: self.findings,
            events: self.events,
            windows: self.windows,
            probes: self.counts,
            summaries: self.summaries,
            virtual_sec: self.now as f64 / 1e9,
            wall_sec: self.wall,
            max_suspect_score: self.max_suspect_score,
        }
    }

    /// Handles everything at or before `until` (virtual ns).
    ///
    /// RNICs only meet at the controller (a report needs every RNIC up to its time);
    /// between two reports each RNIC runs alone, one after the other, which keeps its
    /// state in cache. Nothing one RNIC does between reports depends on another's
    /// progress: faults are a schedule, and a responder answers each probe at once (its
    /// pending entry is completed in the same call), so the order in which probes from
    /// different probers reach it changes nothing. Ticks only read the analyzer, which
    /// only reports change.
    pub fn advance(&mut self, until: u64) {
        let started = Instant::now();
        while let Some(&Reverse((t, class, i))) = self.heap.peek() {
            if t > until {
                break;
            }
            self.heap.pop();
            if class == EV_REPORT {
                self.sync(t);
                self.now = self.now.max(t);
                self.report(i, t);
            } else {
                self.now = self.now.max(t);
                self.tick(t);
            }
        }
        self.sync(until);
        self.now = self.now.max(until);
        self.wall += started.elapsed().as_secs_f64();
    }

    /// Runs every RNIC up to `until` (inclusive).
    fn sync(&mut self, until: u64) {
        if until < self.synced {
            return;
        }
        for node in &mut self.nodes {
            run_node(&self.w, node, &mut self.responders, &mut self.counts, until);
        }
        self.synced = until + 1;
    }

    /// Window `k`'s reports reach the controller at `v`.
    fn report(&mut self, k: u32, v: u64) {
        let w = &self.w;
        let now_unix = w.k.base + v;
        let mut stats = self.empty_window(k);
        let mut pairs: HashMap<(u32, u32), (u64, u64)> = HashMap::new();
        let window_start = w.k.base + k as u64 * self.window_ns;
        for (hi, h) in w.fabric.hosts.iter().enumerate() {
            let mut batch: Vec<PathSummary> = Vec::new();
            for &r in &h.rnics {
                let node = &mut self.nodes[r as usize];
                poll_timeouts(node, v, &w.k, &mut self.counts);
                // A window closes a probe timeout after its end, when all its probes ended.
                let mut closed = node.agg.take_closed(now_unix.saturating_sub(w.k.timeout));
                // The aggregator's map order is per process: sort for determinism.
                closed.sort_unstable_by(|a, b| {
                    (a.1.window_start_unix_ns, &a.0.gid, a.0.kind as u8).cmp(&(
                        b.1.window_start_unix_ns,
                        &b.0.gid,
                        b.0.kind as u8,
                    ))
                });
                let src_tor = &w.fabric.tors[node.tor as usize];
                for (key, s) in closed {
                    if s.window_start_unix_ns == window_start {
                        stats.paths += 1;
                        stats.probe_total += s.probe_total as u64;
                        stats.probe_success += s.probe_success as u64;
                        stats.probe_failed += s.probe_failed as u64;
                        stats.invalid += s.invalid_rtt_count as u64;
                        let dst_tor = w
                            .gid_index
                            .get(&*key.gid)
                            .map_or(NONE, |&d| w.fabric.rnics[d as usize].tor);
                        let e = pairs.entry((node.tor, dst_tor)).or_default();
                        e.0 += s.probe_total as u64;
                        e.1 += s.probe_failed as u64;
                    }
                    batch.push(to_proto(&node.gid, src_tor, &key, &s));
                }
            }
            if !batch.is_empty() {
                self.summaries += batch.len() as u64;
                self.analyzer.ingest(batch, now_unix);
                // The ack names the FOCUS generation: a new one is fetched at once.
                let g = self.focus.generation();
                if self.focus_seen[hi] != g {
                    self.focus_seen[hi] = g;
                    for &r in &h.rnics {
                        let node = &mut self.nodes[r as usize];
                        node.focus = self.focus.targets_for(&node.gid).to_vec();
                        reapply(w, node, v);
                    }
                }
            }
        }
        let mut pairs: Vec<_> = pairs.into_iter().collect();
        pairs.sort_unstable_by_key(|(key, _)| *key);
        let mut worst: Option<PairLoss> = None;
        for ((s, d), (total, failed)) in pairs {
            if total == 0 {
                continue;
            }
            let loss = failed as f64 / total as f64;
            if worst.as_ref().is_none_or(|w| loss > w.loss_ratio) {
                worst = Some(PairLoss {
                    source_tor: w.fabric.tors[s as usize].to_string(),
                    target_tor: w
                        .fabric
                        .tors
                        .get(d as usize)
                        .map_or_else(|| "?".to_string(), |t| t.to_string()),
                    probe_total: total,
                    probe_failed: failed,
                    loss_ratio: loss,
                });
            }
        }
        stats.worst_pair = worst;
        self.windows.push(stats);
        if k + 1 < self.windows_total {
            let at = (k as u64 + 2) * self.window_ns + self.report_delay();
            self.heap.push(Reverse((at, EV_REPORT, k + 1)));
        }
    }

    fn tick(&mut self, v: u64) {
        let events = self.analyzer.tick(self.w.k.base + v, &self.w.index);
        let l = self.analyzer.localizer();
        if l.baseline_windows() != self.focus_windows {
            // A window was localized: suspects move the FOCUS lists (as the controller's
            // findings tick does).
            self.focus_windows = l.baseline_windows();
            if let Some(s) = l.suspects().first() {
                self.max_suspect_score = self.max_suspect_score.max(s.score);
            }
            self.focus.update(
                l.suspects(),
                &self.w.index,
                l.topology(),
                self.w.registered_sec,
            );
        }
        for e in events {
            self.note(e, v);
        }
        if v + NS <= self.final_horizon {
            self.heap.push(Reverse((v + NS, EV_TICK, 0)));
        }
    }

    fn note(&mut self, e: FindingEvent, v: u64) {
        let sec = v as f64 / 1e9;
        if let Some(f) = &e.finding {
            let base = self.w.k.base;
            match self.finding_pos.get(&f.id) {
                Some(&i) => self.findings[i].update(f, base),
                None if e.change == "opened" => {
                    self.finding_pos.insert(f.id, self.findings.len());
                    self.findings.push(FindingRecord::from_finding(f, base));
                }
                None => {}
            }
        }
        self.events.push(TimedEvent { sec, event: e });
    }
}

/// Runs one RNIC's refreshes and wake-ups up to `until` (inclusive), in time order (a
/// refresh first at one instant).
fn run_node(
    w: &World,
    node: &mut Node,
    responders: &mut [Responder<u32>],
    counts: &mut ProbeCounts,
    until: u64,
) {
    loop {
        let t = node.next_refresh.min(node.next_wake);
        if t > until {
            return;
        }
        if node.next_refresh <= node.next_wake {
            refresh(w, node, counts, t);
        } else {
            wake(w, node, responders, counts, t);
        }
    }
}

/// One turn of the agent's loop at `v`: the timeouts due, then every probe due.
fn wake(
    w: &World,
    node: &mut Node,
    responders: &mut [Responder<u32>],
    counts: &mut ProbeCounts,
    v: u64,
) {
    poll_timeouts(node, v, &w.k, counts);
    let mono = v + node.off;
    // Like the agent, the rotation epoch is read once per loop turn, not per probe.
    let epoch = rotation_epoch((w.k.base + v) / NS, w.k.rotation_sec);
    let mut burst = 0u64;
    while node.prober.in_flight() < MAX_IN_FLIGHT {
        let Some((_kind, id)) = node.scheduler.poll(mono) else {
            break;
        };
        let slot = node.slot_of.get(id as usize).copied().unwrap_or(NONE);
        if slot == NONE {
            continue;
        }
        let v1 = v + burst * noise::SEND_SPACING_NS;
        burst += 1;
        probe(w, node, responders, slot as usize, v1, epoch, counts);
    }
    schedule_wake(node, v, w.k.duration);
}

/// The next wake-up after `v`, from the scheduler (none at or after `end`).
fn schedule_wake(node: &mut Node, v: u64, end: u64) {
    let mono = v + node.off;
    node.next_wake = match node.scheduler.next_wakeup_ns(mono) {
        Some(m) => {
            let next = m.saturating_sub(node.off).max(v + 1);
            if next < end {
                next
            } else {
                u64::MAX
            }
        }
        None => u64::MAX,
    };
}

/// Fetches the RNIC's pinglists from the controller's pure functions and applies them
/// as the agent does; the next refresh is one interval later.
fn refresh(w: &World, node: &mut Node, counts: &mut ProbeCounts, v: u64) {
    poll_timeouts(node, v, &w.k, counts);
    let tor = &w.fabric.tors[node.tor as usize];
    let gid: &str = &node.gid;
    let now = w.registered_sec;
    let tor_mesh = pinglist::tor_mesh(&w.index, tor, &[gid], gid, now, &w.pinglist);
    let mut rng = SmallRng::seed_from_u64(derive(
        w.k.seed,
        (1 << 40) + ((node.rnic as u64) << 20) + node.refreshes,
    ));
    let inter_tor = pinglist::inter_tor(&w.index, tor, gid, now, &w.pinglist, &mut rng);
    node.refreshes += 1;
    node.lists = vec![
        (PinglistKind::TorMesh, tor_mesh),
        (PinglistKind::InterTor, inter_tor),
    ];
    reapply(w, node, v);
    let next = v + w.k.refresh;
    node.next_refresh = if next < w.k.duration { next } else { u64::MAX };
}

/// Applies the node's lists (fetched and FOCUS); a new kind's first round is due now.
fn reapply(w: &World, node: &mut Node, v: u64) {
    let mut lists = std::mem::take(&mut node.lists);
    lists.push((PinglistKind::Focus, std::mem::take(&mut node.focus)));
    apply_pinglists(w, node, &lists, v);
    node.focus = lists.pop().map(|l| l.1).unwrap_or_default();
    node.lists = lists;
    schedule_wake(node, v.saturating_sub(1), w.k.duration);
}

/// Replaces the node's targets as the agent's `apply_pinglists` does: targets that stay
/// keep their id and label position; new kinds start their round now.
fn apply_pinglists(w: &World, node: &mut Node, lists: &[(PinglistKind, Vec<PingTarget>)], v: u64) {
    let fabric = &w.fabric;
    let mut old: HashMap<TargetId, Target> = node.targets.drain(..).map(|t| (t.id, t)).collect();
    let mut keep: HashSet<TargetId> = HashSet::new();
    let mut by_kind: [Vec<TargetId>; 4] = Default::default();
    let mut targets = Vec::new();
    for (kind, list) in lists {
        for pt in list {
            let Some(&dst) = w.gid_index.get(&pt.target_gid) else {
                continue;
            };
            if dst == node.rnic {
                continue; // never probe ourselves
            }
            let next_id = &mut node.next_id;
            let id = *node.ids.entry((dst, *kind as u8)).or_insert_with(|| {
                let id = *next_id;
                *next_id = next_id.wrapping_add(1);
                id
            });
            if !keep.insert(id) {
                continue; // listed twice
            }
            let spec = if *kind == PinglistKind::Focus {
                (labels_key(&pt.flow_labels), pt.flow_labels.len() as u32, 0)
            } else {
                (pt.flow_label_seed, pt.flow_label_count, pt.flow_label)
            };
            let t = match old.remove(&id) {
                Some(t) if t.spec == spec => t,
                _ => {
                    let r = &fabric.rnics[dst as usize];
                    let labels = if *kind == PinglistKind::Focus {
                        FlowLabelSet::explicit(&pt.flow_labels)
                    } else {
                        FlowLabelSet::new(pt.flow_label_seed, pt.flow_label_count, pt.flow_label)
                    };
                    let local = r.tor == node.tor;
                    Target {
                        id,
                        dst,
                        kind: *kind,
                        spec,
                        pos: 0,
                        local,
                        dst_host: r.host,
                        dst_tor: r.tor,
                        routes: if local {
                            Vec::new()
                        } else {
                            vec![Route::EMPTY; labels.len() as usize]
                        },
                        labels,
                        key: PathKey {
                            gid: r.gid.clone(),
                            tor: fabric.tors[r.tor as usize].clone(),
                            qpn: r.qpn,
                            kind: *kind,
                            service: w.empty.clone(),
                        },
                    }
                }
            };
            by_kind[*kind as usize].push(id);
            targets.push(t);
        }
    }
    node.ids.retain(|_, id| keep.contains(id));
    node.slot_of.clear();
    node.slot_of.resize(node.next_id as usize, NONE);
    for (i, t) in targets.iter().enumerate() {
        node.slot_of[t.id as usize] = i as u32;
    }
    node.targets = targets;
    let mono = v + node.off;
    let rate = w.k.rate;
    let [tor_mesh, inter_tor, service, focus] = by_kind;
    node.scheduler.set_targets_every(
        PinglistKind::Focus,
        focus,
        w.focus_rate,
        rpingmesh_agent::rnic::focus_round_ns(w.focus_rate),
        mono,
    );
    node.scheduler
        .set_targets(PinglistKind::Service, service, rate, mono);
    node.scheduler
        .set_targets(PinglistKind::TorMesh, tor_mesh, rate, mono);
    node.scheduler
        .set_targets(PinglistKind::InterTor, inter_tor, rate, mono);
}

/// A FOCUS target's labels as one number (a new list is a new target).
fn labels_key(labels: &[u32]) -> u32 {
    labels
        .iter()
        .fold(0x811c_9dc5u32, |h, &l| (h ^ l).wrapping_mul(0x0100_0193))
}

/// Per directed ToR-spine link, its background loss threshold (empty without a spread:
/// every link then has the same, drawn once per packet as before).
fn link_backgrounds(fabric: &Fabric, bg: &Background, rng: &mut Rng) -> Vec<u64> {
    if bg.loss_spread <= 1.0 {
        return Vec::new();
    }
    let links = 2 * (fabric.spec.tors * fabric.spec.spines) as usize;
    let ln = bg.loss_spread.ln();
    (0..links)
        .map(|_| threshold(bg.loss_per_link * (ln * (2.0 * rng.unit() - 1.0)).exp()))
        .collect()
}

impl World {
    /// An endpoint processing delay: base + uniform jitter, sometimes a hiccup.
    #[inline]
    fn endpoint(&self, (base, span): (u64, u64), rng: &mut Rng) -> u64 {
        let mut d = base + rng.below(span.max(1));
        if rng.hit(self.k.hiccup) {
            d += rng.exp(noise::HICCUP_MEAN_NS) as u64;
        }
        d
    }

    /// Extra processing delay of host `h` handling a packet at `t`.
    #[inline]
    fn stall(&self, h: u32, t: u64, rng: &mut Rng) -> u64 {
        match self.plan.stall(h, t) {
            None => 0,
            Some(mean) => {
                if rng.hit(self.k.beyond) {
                    // Late beyond the probe timeout: the probe times out.
                    self.k.timeout + rng.below(self.k.timeout)
                } else {
                    rng.exp(mean) as u64
                }
            }
        }
    }

    /// Carries a packet from RNIC `src` to RNIC `dst` (each with its ToR) over spine
    /// `spine` (None: both under one ToR), leaving at `t`: its arrival, or None when it
    /// is dropped.
    #[inline]
    fn traverse(
        &self,
        (src, st): (u32, u32),
        (dst, dt): (u32, u32),
        spine: Option<u32>,
        t: u64,
        rng: &mut Rng,
    ) -> Option<u64> {
        let p = &self.plan;
        let k = &self.k;
        if p.rnic_drops(src, t, rng) {
            return None;
        }
        match spine {
            Some(s) if !self.link_bg.is_empty() => {
                let i = 2 * (st * self.fabric.spec.spines + s) as usize;
                let j = 2 * (dt * self.fabric.spec.spines + s) as usize + 1;
                if rng.hit(k.bg_hosts) || rng.hit(self.link_bg[i]) || rng.hit(self.link_bg[j]) {
                    return None;
                }
            }
            _ => {
                let bg = if spine.is_some() {
                    k.bg_inter
                } else {
                    k.bg_local
                };
                if rng.hit(bg) {
                    return None;
                }
            }
        }
        let j = rng.next_u64();
        let lat = |i: u32| k.link + ((((j >> (16 * i)) & 0xFFFF) * k.jitter) >> 16);
        let mut t = t + lat(0);
        let queue = if spine.is_some() {
            k.queue_inter
        } else {
            k.queue_local
        };
        if queue > 0 && rng.hit(queue) {
            t += rng.exp(k.queue_mean_ns) as u64;
        }
        if p.tor_down(st, t) {
            return None;
        }
        if let Some(s) = spine {
            t += p.cross_link(st, s, true, t, rng)?;
            t += lat(1);
            t += p.cross_link(dt, s, false, t, rng)?;
            t += lat(2);
            if p.tor_down(dt, t) {
                return None;
            }
            t += lat(3);
        } else {
            t += lat(1);
        }
        if p.rnic_drops(dst, t, rng) {
            return None;
        }
        Some(t)
    }
}

/// One probe from `node` to its target at `slot`, T1 at virtual `v1`.
fn probe(
    w: &World,
    node: &mut Node,
    responders: &mut [Responder<u32>],
    slot: usize,
    v1: u64,
    epoch: u64,
    counts: &mut ProbeCounts,
) {
    let k = &w.k;
    let a = node.rnic;
    let t = &mut node.targets[slot];
    let label = t.labels.next_label(epoch);
    let i = t.pos as usize;
    t.pos += 1;
    if t.pos == t.labels.len() {
        t.pos = 0;
    }
    let (b, host_b, tor_b) = (t.dst, t.dst_host, t.dst_tor);
    let (fwd, rev) = if t.local {
        (None, None)
    } else {
        let r = &mut t.routes[i];
        if !r.valid || r.label != label {
            let s = |x: Option<u32>| x.map_or(NO_SPINE, |s| s as u16);
            *r = Route {
                label,
                fwd: s(w.fabric.spine_of(a, b, label)),
                rev: s(w.fabric.spine_of(b, a, label)),
                valid: true,
            };
        }
        (spine(r.fwd), spine(r.rev))
    };
    let id = t.id;
    let t_kind = t.kind;
    let off_a = node.off;
    let (host_a, tor_a) = (node.host, node.tor);
    let pkt = node.prober.start_probe(id, label, v1 + off_a);
    counts.sent += 1;
    counts.focus += (t_kind == PinglistKind::Focus) as u64;
    let deadline = v1 + k.timeout;
    let rng = &mut node.rng;
    let v2 = v1 + w.endpoint(noise::PROBER_TX_NS, rng) + w.stall(host_a, v1, rng);
    let mut done: Option<ProbeOutcome> = None;
    if v2 < deadline {
        done = node
            .prober
            .on_probe_sent(pkt.sequence, k.base + v2, v2 + off_a);
    }
    let mut last = v2;
    if let Some(v3) = w.traverse((a, tor_a), (b, tor_b), fwd, v2, rng) {
        let v4 = v3 + w.endpoint(noise::RESPONDER_NS, rng) + w.stall(host_b, v3, rng);
        let off_b = w.host_off[host_b as usize];
        let resp = &mut responders[b as usize];
        let (pending, ack1) = resp.on_probe(a, &pkt, Some(k.base + v3), v4 + off_b);
        let ack2 = resp.on_first_ack_sent(pending, k.base + v4).map(|(_, p)| p);
        // The ACKs take the probe's flow label, hence the reverse route of that label.
        let arr1 = w.traverse((b, tor_b), (a, tor_a), rev, v4, rng);
        let v4b = v4 + w.endpoint(noise::SECOND_ACK_GAP_NS, rng);
        // The two ACKs share their path's queues: the second never overtakes the first.
        let arr2 = match ack2 {
            Some(_) => w
                .traverse((b, tor_b), (a, tor_a), rev, v4b, rng)
                .map(|t2| arr1.map_or(t2, |t1| t2.max(t1 + 1))),
            None => None,
        };
        let first = match (arr1, arr2) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        if let Some(first) = first {
            // One receive-side delay (and stall) covers both ACKs of the probe.
            let rx = w.endpoint(noise::PROBER_RX_NS, rng) + w.stall(host_a, first, rng);
            for (ack, arrival) in [(Some(ack1), arr1), (ack2, arr2)] {
                let (Some(ack), Some(at)) = (ack, arrival) else {
                    continue;
                };
                let handled = at + rx;
                if handled >= deadline {
                    continue; // after the timeout: the prober no longer knows the probe
                }
                last = last.max(handled);
                if let Some(o) = node.prober.on_ack(&ack, Some(k.base + at), handled + off_a) {
                    done = Some(o);
                }
            }
        }
    }
    if let Some(o) = done {
        record(node, &o, last, k.base, counts);
    }
}

/// Counts an outcome and records it, at virtual `v`, into the target's path window (a
/// target dropped from the pinglist since is not reported, as in the agent).
fn record(node: &mut Node, o: &ProbeOutcome, v: u64, base: u64, counts: &mut ProbeCounts) {
    match o.result {
        ProbeResult::Success(_) => counts.success += 1,
        ProbeResult::Lost => counts.lost += 1,
        ProbeResult::Invalid(_) => counts.invalid += 1,
    }
    let slot = node.slot_of.get(o.target as usize).copied().unwrap_or(NONE);
    if slot == NONE {
        return;
    }
    let t = &node.targets[slot as usize];
    // Inter-ToR windows are also counted per flow label, and every outcome in the window
    // it was sent in (as agent/src/rnic.rs does): T1 is on the host clock `v + off`.
    let label = t.kind.labelled().then_some(o.flow_label);
    let sent = o.timestamps.t1.map_or(v, |t1| t1.saturating_sub(node.off));
    node.agg
        .record_labelled(&t.key, &o.result, label, base + sent);
}

/// Hands the prober the timeouts due by `v`; each is recorded at its deadline.
fn poll_timeouts(node: &mut Node, v: u64, k: &Consts, counts: &mut ProbeCounts) {
    let mono = v + node.off;
    if node.prober.next_timeout().is_none_or(|d| d > mono) {
        return;
    }
    let mut out = std::mem::take(&mut node.scratch);
    node.prober.poll_timeouts(mono, &mut out);
    for o in out.drain(..) {
        let t1 = o.timestamps.t1.unwrap_or(mono);
        let at = (t1 + k.timeout).saturating_sub(node.off).min(v);
        record(node, &o, at, k.base, counts);
    }
    node.scratch = out;
}

#[cfg(test)]
mod tests {
    use super::*;
    use rpingmesh_controller::analyzer::PathFilter;

    fn scenario(seed: u64, faults: &str) -> Scenario {
        let text = format!(
            "seed: {seed}\nduration_sec: 200\nfabric: {{tors: 4, spines: 4, hosts_per_tor: 2, rnics_per_host: 2, link_latency_us: 2, link_jitter_us: 0.3}}\nfaults:\n{faults}"
        );
        Scenario::from_yaml(&text).unwrap()
    }

    const FAULTS: &str = "  - {kind: link_down, location: tor1-spine2, start_sec: 60, end_sec: 120}\n  - {kind: host_stall, location: h3-1, start_sec: 30, end_sec: 150, delay_us: 3000}\n";

    fn paths(sim: &Sim) -> Vec<PathSummary> {
        sim.analyzer().paths(&PathFilter::default(), true)
    }

    fn full(s: &Scenario) -> (SimOutcome, Vec<PathSummary>) {
        let mut sim = Sim::new(s, &SimOptions::default()).unwrap();
        while sim.step_window().is_some() {}
        let p = paths(&sim);
        (sim.finish(), p)
    }

    #[test]
    fn same_seed_same_run_other_seed_other_jitter() {
        let (a, pa) = full(&scenario(5, FAULTS));
        let (b, pb) = full(&scenario(5, FAULTS));
        assert_eq!(a.findings_jsonl(), b.findings_jsonl());
        assert_eq!(a.probes, b.probes);
        assert_eq!(a.windows, b.windows);
        assert_eq!(a.events, b.events);
        assert_eq!(pa, pb, "every path window identical");
        assert!(a.probes.lost > 0 && a.probes.sent > 10_000);
        // `run` is the same as stepping.
        let c = run(&scenario(5, FAULTS), &SimOptions::default());
        assert_eq!(
            (c.probes, c.findings_jsonl()),
            (a.probes, a.findings_jsonl())
        );
        // Another seed: other jitter, other ECMP hash, other pinglist samples.
        let (_, pd) = full(&scenario(6, FAULTS));
        let rtts = |p: &[PathSummary]| -> Vec<(String, String, u64)> {
            p.iter()
                .map(|s| {
                    (
                        s.source_gid.clone(),
                        s.target_gid.clone(),
                        s.network_rtt_p50_ns,
                    )
                })
                .collect()
        };
        assert_ne!(rtts(&pa), rtts(&pd));
    }

    #[test]
    fn timeouts_count_in_the_window_they_were_sent_in() {
        // h1-1/r0 down in [59, 60.5): its probes sent in [59, 60) time out in the next
        // window, but count in [30, 60), where they were sent (as the agent counts them);
        // those sent in [60, 60.5) in [60, 90). Nothing spills past the fault.
        let s = scenario(
            8,
            "  - {kind: rnic_down, location: h1-1/r0, start_sec: 59, end_sec: 60.5}\n",
        );
        let mut sim = Sim::new(&s, &SimOptions::default()).unwrap();
        while sim.step_window().is_some() {}
        let gid = sim.fabric().rnics[0].gid.to_string();
        assert_eq!(sim.windows.len(), 6);
        let base = sim.base_unix_ns();
        let mut seen = [0u32; 6];
        for p in paths(&sim).iter().filter(|p| p.source_gid == gid) {
            let k = ((p.window_start_unix_ns - base) / (30 * NS)) as usize;
            seen[k] += 1;
            match k {
                // 1 s of a 2/s target: 2 probes; 0.5 s: 1 (give or take the phase).
                1 => assert!((1..=3).contains(&p.probe_failed), "{p:?}"),
                2 => assert!((1..=2).contains(&p.probe_failed), "{p:?}"),
                _ => assert_eq!(p.probe_failed, 0, "{p:?}"),
            }
        }
        assert!(seen[1] == 6 && seen[2] == 6, "{seen:?}");
    }

    #[test]
    fn a_stall_beyond_the_timeout_loses_the_probe() {
        // Every packet h2-1 handles is stalled: ~2% of each step beyond the timeout.
        let s = scenario(
            9,
            "  - {kind: host_stall, location: h2-1, start_sec: 0, end_sec: 200, delay_us: 100}\n",
        );
        let out = run(&s, &SimOptions::default());
        let lost = out.probes.lost as f64 / out.probes.sent as f64;
        // h2-1 has 2 of 16 RNICs; as prober 2 steps, as responder 1: about
        // (2 x 4% x 6 targets + 2% x ~6 probers) / (16 x 6) of all probes.
        assert!(lost > 0.002 && lost < 0.01, "{lost}");
        // Only background loss of a single ACK makes a probe invalid.
        assert!(out.probes.invalid <= 2, "{}", out.probes.invalid);
    }

    #[test]
    fn options_change_the_window_and_the_pace() {
        let opts = SimOptions {
            window_sec: 20,
            probe_interval_ms: 1000,
            pinglist_refresh_sec: 60,
            ..SimOptions::default()
        };
        let mut sim = Sim::new(&scenario(3, "  []\n"), &opts).unwrap();
        assert_eq!(sim.windows_total(), 10);
        let r = sim.step_window().unwrap();
        assert_eq!((r.window.start_sec, r.window.end_sec), (0.0, 20.0));
        // One probe per target and second: 16 RNICs x 6 targets x ~20 s.
        assert!(
            (1700..=1950).contains(&r.window.probe_total),
            "{}",
            r.window.probe_total
        );
        // Refreshes every minute re-draw the inter-ToR samples but keep 3 per RNIC.
        while sim.step_window().is_some() {}
        for r in 0..16 {
            let t = sim.probe_targets(r);
            assert_eq!(t.len(), 6);
            let inter = t.iter().filter(|t| t.1 == PinglistKind::InterTor).count();
            assert_eq!(inter, 3);
        }
    }

    #[test]
    fn degenerate_and_rail_fabrics_run() {
        let fabric = |f: &str, d: u64| {
            Scenario::from_yaml(&format!(
                "seed: 1\nduration_sec: {d}\nfabric: {{{f}, link_latency_us: 1, link_jitter_us: 0}}\n"
            ))
            .unwrap()
        };
        // One RNIC: nothing to probe, nothing reported.
        let one = run(
            &fabric(
                "tors: 1, spines: 1, hosts_per_tor: 1, rnics_per_host: 1",
                65,
            ),
            &SimOptions::default(),
        );
        assert_eq!(
            (one.probes.sent, one.summaries, one.windows.len()),
            (0, 0, 2)
        );
        // Shorter than a window: probes, but no complete window.
        let short = run(
            &fabric(
                "tors: 2, spines: 1, hosts_per_tor: 1, rnics_per_host: 1",
                10,
            ),
            &SimOptions::default(),
        );
        assert!(short.probes.sent > 0);
        assert!(short.windows.is_empty() && short.findings.is_empty());
        // Rails: 4 ToRs in one rail group of 4, 2 hosts; each RNIC probes its rail's
        // other RNIC (ToR mesh) and the 3 other ToRs.
        let s = fabric(
            "tors: 4, spines: 2, hosts_per_tor: 2, rnics_per_host: 4, rail_optimized: true",
            65,
        );
        let mut sim = Sim::new(&s, &SimOptions::default()).unwrap();
        while sim.step_window().is_some() {}
        for r in 0..8 {
            let t = sim.probe_targets(r);
            let mesh = t.iter().filter(|t| t.1 == PinglistKind::TorMesh).count();
            assert_eq!((mesh, t.len()), (1, 4), "rnic {r}");
        }
        let w = &sim.windows()[1];
        assert_eq!(w.paths, 8 * 4);
        assert_eq!(w.probe_failed, 0);
    }

    #[test]
    fn invalid_scenarios_are_refused() {
        let mut s = scenario(1, "  []\n");
        s.fabric.spines = 0;
        assert_eq!(
            Sim::new(&s, &SimOptions::default())
                .err()
                .unwrap()
                .to_string(),
            "fabric.spines must be > 0"
        );
        assert!(try_run(&s, &SimOptions::default()).is_err());
    }
}
