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
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use rpingmesh_agent::report::to_proto;
use rpingmesh_controller::analyzer::{Analyzer, AnalyzerParams};
use rpingmesh_controller::ecmp;
use rpingmesh_controller::focus::{FocusParams, FocusPlanner};
use rpingmesh_controller::pinglist::PinglistParams;
use rpingmesh_controller::registry::RegistryIndex;
use rpingmesh_proto::controller_agent::PathSummary;
use rpingmesh_proto::operator::{FindingEvent, TorPairStats};
use rpingmesh_protocol::aggregate::PathAggregator;
use rpingmesh_protocol::prober::{Prober, ProberConfig};
use rpingmesh_protocol::responder::Responder;
use rpingmesh_protocol::schedule::ProbeScheduler;
use rpingmesh_protocol::PinglistKind;

use crate::fabric::Fabric;
use crate::faults::FaultPlan;
use crate::output::FindingRecord;
use crate::rng::{derive, threshold, Rng};
use crate::scenario::{Scenario, ScenarioError};

mod node;
mod world;

use node::{poll_timeouts, reapply, run_node, Node, NONE};
use world::{link_backgrounds, Consts, World};

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
    /// Agents hold one report open until the window they reported is localized (as the
    /// agent's reporter does), so a new FOCUS generation reaches them then; false: only
    /// the ack of their next window's report carries it.
    pub focus_prompt: bool,
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
            focus_prompt: true,
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
    /// Which component and test that was, and when (empty: none).
    pub max_suspect: String,
    /// The gray detector's naming bar (nats) at the end of the run.
    pub gray_bar: f64,
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
    max_suspect: String,
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
        let fabric = scenario.build_fabric();
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
            max_suspect: String::new(),
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
            max_suspect: self.max_suspect.clone(),
            gray_bar: self.analyzer.localizer().gray_bar(),
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
        let mut acked = Vec::new();
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
                acked.push(hi);
            }
        }
        // The acks name the FOCUS generation: a new one is fetched at once.
        for hi in acked {
            self.fetch_focus(hi, v);
        }
        let w = &self.w;
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
                if s.score > self.max_suspect_score {
                    self.max_suspect_score = s.score;
                    self.max_suspect = format!("{:?} {:?} at {} s", s.component, s.test, v / NS);
                }
            }
            let moved = self.focus.update(
                l.suspects(),
                &self.w.index,
                l.topology(),
                self.w.registered_sec,
            );
            if moved && self.opts.focus_prompt {
                self.sync(v);
                self.deliver_focus(v);
            }
        }
        for e in events {
            self.note(e, v);
        }
        if v + NS <= self.final_horizon {
            self.heap.push(Reverse((v + NS, EV_TICK, 0)));
        }
    }

    /// Host `hi` learned the FOCUS generation: its RNICs fetch their FOCUS lists when
    /// it moved.
    fn fetch_focus(&mut self, hi: usize, v: u64) {
        let g = self.focus.generation();
        if self.focus_seen[hi] == g {
            return;
        }
        self.focus_seen[hi] = g;
        let w = &self.w;
        for &r in &w.fabric.hosts[hi].rnics {
            let node = &mut self.nodes[r as usize];
            node.focus = self.focus.targets_for(&node.gid).to_vec();
            reapply(w, node, v);
        }
    }

    /// A new FOCUS generation right after a window was localized: every agent is
    /// holding a report open for it and learns it now.
    fn deliver_focus(&mut self, v: u64) {
        for hi in 0..self.w.fabric.hosts.len() {
            self.fetch_focus(hi, v);
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

#[cfg(test)]
mod tests;
