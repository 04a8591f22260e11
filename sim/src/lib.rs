//! rpingmesh-sim: a seeded, deterministic simulated two-tier Clos fabric in virtual
//! time, on which the real protocol core (`rpingmesh-protocol`: scheduler, prober,
//! responder, flow-label sets, per-path aggregation), the agent's summary conversion
//! (`rpingmesh_agent::report::to_proto`) and the real controller analyzer
//! (`rpingmesh_controller::analyzer::Analyzer` with the fabric's `Topology`) run.
//! Nothing is wall-clocked; the same seed gives the same run.
//!
//! # Fabric
//!
//! `tors` ToRs (`tor1..`), `spines` spines (`spine1..`), every ToR linked to every spine
//! (links `tor<t>-spine<s>`). Hosts are `h<g>-<i>` (i from 1 to `hosts_per_tor`), each
//! with `rnics_per_host` RNICs `h<g>-<i>/r<j>` (j from 0); that `<host>/<device>` string
//! is what the controller's localizer names an RNIC. Each RNIC has a GID
//! (`fd00::<g>:<i>:<j>:1` in the full text form) and a QPN.
//!
//! * `rail_optimized: false`: host `h<t>-<i>` has all its RNICs on `tor<t>`.
//! * `rail_optimized: true`: the ToRs are split into groups of `rnics_per_host`
//!   consecutive ToRs ("rails"; `tors` must be a multiple of `rnics_per_host`); host
//!   `h<g>-<i>` (g = group 1..tors/rnics_per_host) puts RNIC `j` on ToR
//!   `tor<(g-1)*rnics_per_host + j + 1>`. Every ToR then carries one rail (one device
//!   number) of each of its group's hosts.
//!
//! Every link traversal (host-ToR, ToR-spine, spine-ToR, ToR-host) takes
//! `link_latency_us` + uniform [0, `link_jitter_us`): an inter-ToR probe and its ACK
//! cross 8 links, a ToR-local pair 4. The spine of a packet is the controller
//! topology's `spine_of(src ToR, dst ToR, src GID, dst GID, flow label)` (the `fnv1a`
//! model, seeded from the scenario seed); the ACKs carry the probe's label, so they go
//! back over `spine_of(dst, src, ...)`, generally another spine. The controller learns
//! the topology from the simulator: the same [`Topology`](rpingmesh_controller::topology::Topology)
//! is handed to the analyzer.
//!
//! Background noise: the scenario's [`Background`] (by default a 1e-6 loss per link
//! traversal; the gray suites add dirtier links and queueing), and (see [`sim::noise`])
//! endpoint processing delays of a few microseconds with jitter and rare hiccups, so a
//! fault-free fabric is not perfectly clean.
//!
//! # Faults (on schedule `[start_sec, end_sec)`)
//!
//! * `rnic_down`: every packet to or from the RNIC is dropped (its agent still probes
//!   and reports: all lost).
//! * `rnic_loss`: every packet to or from the RNIC is dropped with probability `loss`.
//! * `rnic_flap`: down during the first `down_fraction` of each `period_sec`, the cycle
//!   starting at `start_sec` shifted by a seeded phase; up otherwise.
//! * `host_stall`: the host's packet processing stalls. Each probe or ACK the host
//!   handles (as prober: T1 to T2, and the ACKs' arrival to their handling, i.e. to T6;
//!   as responder: T3 to T4) takes an extra delay drawn from an exponential with mean
//!   `delay_us`, except that 2% of them are late beyond the probe timeout (the probe then
//!   times out). The network RTT (T5-T2)-(T4-T3) stays clean; the prober delay rises by
//!   two such draws (median about 1.7 x `delay_us`), the responder delay by one (median
//!   about 0.7 x `delay_us`).
//! * `tor_down`: every packet through the ToR is dropped, ToR-local ones included.
//! * `link_loss`: packets crossing the link in `direction` (`up` = ToR to spine, `down`,
//!   `both`, the default) are dropped with probability `loss`.
//! * `link_down`: every packet crossing the link, both ways, is dropped.
//! * `link_latency`: packets crossing the link in `direction` take `add_us` longer.
//!
//! [`scenario::ground_truth`] maps each fault to the finding it should produce.
//!
//! # Driving
//!
//! See [`sim`] for the event order. [`run`] runs a scenario to its end; [`Sim`] steps it
//! one window at a time (for a demo that paces it in real time).

pub mod eval;
pub mod fabric;
pub mod faults;
pub mod gray;
pub mod live;
pub mod output;
pub mod rng;
pub mod scenario;
pub mod sim;
pub mod workloads;

pub use fabric::{Fabric, FabricSpec};
pub use output::FindingRecord;
pub use scenario::background::Background;
pub use scenario::{
    ground_truth, Direction, Fault, FaultKind, GroundTruth, Scenario, ScenarioError,
};
pub use sim::{
    run, try_run, PairLoss, ProbeCounts, Sim, SimOptions, SimOutcome, TimedEvent, WindowReport,
    WindowStats,
};
