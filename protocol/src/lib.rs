//! Sans-IO core of the 6-timestamp probing protocol (quinn-proto style): state machines
//! take events with timestamps the caller measured and return packets to send and results.
//! No socket, no verbs, no clock inside: every transport drives the same code.

pub mod aggregate;
pub mod flowlabel;
pub mod prober;
pub mod responder;
pub mod rtt;
pub mod schedule;

pub use rpingmesh_agent_common::wire;

/// Index of a probe target in the agent's current target table.
pub type TargetId = u32;

/// Pinglist kinds, in `controller_agent.PinglistType` numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PinglistKind {
    TorMesh = 0,
    InterTor = 1,
    /// Live service paths learned from QP tracing (probed on the service's flow label).
    Service = 2,
    /// Extra probes the controller asks for through a component it suspects (adaptive
    /// probing): explicit flow labels chosen to cross it, paced by their own bucket.
    Focus = 3,
    /// Hostping's RNIC-to-RNIC probes between the RNICs of one host: made by the agent
    /// itself, judged inside the host, never fetched from or reported to the controller
    /// (no `PinglistType` has this number).
    Host = 4,
}

impl PinglistKind {
    /// Every kind a driver probes.
    pub const ALL: [PinglistKind; 5] = [
        PinglistKind::TorMesh,
        PinglistKind::InterTor,
        PinglistKind::Service,
        PinglistKind::Focus,
        PinglistKind::Host,
    ];
    /// The kinds the controller hands out and receives summaries of.
    pub const FROM_CONTROLLER: [PinglistKind; 4] = [
        PinglistKind::TorMesh,
        PinglistKind::InterTor,
        PinglistKind::Service,
        PinglistKind::Focus,
    ];

    /// Whether its probes are counted per flow label (the paths through the spines).
    pub fn labelled(self) -> bool {
        matches!(self, PinglistKind::InterTor | PinglistKind::Focus)
    }
}
