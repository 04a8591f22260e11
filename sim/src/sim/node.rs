//! The agent side of one simulated RNIC: its pinglists applied as the agent applies them,
//! its loop turns (timeouts, then due probes), and each probe's six events across the
//! fabric model of `world`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::SeedableRng;
use rpingmesh_agent::report::PathKey;
use rpingmesh_controller::pinglist;
use rpingmesh_proto::controller_agent::PingTarget;
use rpingmesh_protocol::aggregate::PathAggregator;
use rpingmesh_protocol::flowlabel::{rotation_epoch, FlowLabelSet};
use rpingmesh_protocol::prober::{ProbeOutcome, ProbeResult, Prober};
use rpingmesh_protocol::responder::Responder;
use rpingmesh_protocol::schedule::ProbeScheduler;
use rpingmesh_protocol::{PinglistKind, TargetId};

use super::world::{Consts, World};
use super::{noise, ProbeCounts, MAX_IN_FLIGHT, NS};
use crate::rng::{derive, Rng};

pub(super) const NONE: u32 = u32::MAX;
pub(super) const NO_SPINE: u16 = u16::MAX;

/// The spines a label's probe and its ACKs cross (cached per label index).
#[derive(Debug, Clone, Copy)]
pub(super) struct Route {
    pub(super) label: u32,
    pub(super) fwd: u16,
    pub(super) rev: u16,
    pub(super) valid: bool,
}

impl Route {
    const EMPTY: Route = Route {
        label: 0,
        fwd: NO_SPINE,
        rev: NO_SPINE,
        valid: false,
    };
}

pub(super) fn spine(s: u16) -> Option<u32> {
    (s != NO_SPINE).then_some(s as u32)
}

pub(super) struct Target {
    pub(super) id: TargetId,
    pub(super) dst: u32,
    pub(super) kind: PinglistKind,
    /// (seed, count, legacy label): a refresh with the same keeps the label position.
    pub(super) spec: (u32, u32, u32),
    pub(super) labels: FlowLabelSet,
    /// Mirrors the set's round-robin position (its next index).
    pub(super) pos: u32,
    pub(super) local: bool,
    /// The target's host and ToR (kept here: the hot path does not touch `Rnic`).
    pub(super) dst_host: u32,
    pub(super) dst_tor: u32,
    pub(super) routes: Vec<Route>,
    pub(super) key: PathKey,
}

/// One RNIC and its agent-side state.
pub(super) struct Node {
    pub(super) rnic: u32,
    pub(super) host: u32,
    pub(super) tor: u32,
    pub(super) gid: Arc<str>,
    pub(super) off: u64,
    pub(super) prober: Prober,
    pub(super) scheduler: ProbeScheduler,
    pub(super) targets: Vec<Target>,
    /// TargetId -> index into `targets` (NONE: no longer listed).
    pub(super) slot_of: Vec<u32>,
    pub(super) ids: HashMap<(u32, u8), TargetId>,
    pub(super) next_id: TargetId,
    pub(super) agg: PathAggregator<PathKey>,
    pub(super) rng: Rng,
    /// Virtual time of the next scheduler wake-up (u64::MAX: none).
    pub(super) next_wake: u64,
    /// Virtual time of the next pinglist refresh (u64::MAX: none).
    pub(super) next_refresh: u64,
    pub(super) refreshes: u64,
    /// The ToR-mesh and inter-ToR lists as last fetched, and the FOCUS list.
    pub(super) lists: Vec<(PinglistKind, Vec<PingTarget>)>,
    pub(super) focus: Vec<PingTarget>,
    pub(super) scratch: Vec<ProbeOutcome>,
}

/// Runs one RNIC's refreshes and wake-ups up to `until` (inclusive), in time order (a
/// refresh first at one instant).
pub(super) fn run_node(
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
pub(super) fn wake(
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
pub(super) fn schedule_wake(node: &mut Node, v: u64, end: u64) {
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
pub(super) fn refresh(w: &World, node: &mut Node, counts: &mut ProbeCounts, v: u64) {
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
pub(super) fn reapply(w: &World, node: &mut Node, v: u64) {
    let mut lists = std::mem::take(&mut node.lists);
    lists.push((PinglistKind::Focus, std::mem::take(&mut node.focus)));
    apply_pinglists(w, node, &lists, v);
    node.focus = lists.pop().map(|l| l.1).unwrap_or_default();
    node.lists = lists;
    schedule_wake(node, v.saturating_sub(1), w.k.duration);
}

/// Replaces the node's targets as the agent's `apply_pinglists` does: targets that stay
/// keep their id and label position; new kinds start their round now.
pub(super) fn apply_pinglists(
    w: &World,
    node: &mut Node,
    lists: &[(PinglistKind, Vec<PingTarget>)],
    v: u64,
) {
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
pub(super) fn labels_key(labels: &[u32]) -> u32 {
    labels
        .iter()
        .fold(0x811c_9dc5u32, |h, &l| (h ^ l).wrapping_mul(0x0100_0193))
}

/// One probe from `node` to its target at `slot`, T1 at virtual `v1`.
pub(super) fn probe(
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
pub(super) fn record(
    node: &mut Node,
    o: &ProbeOutcome,
    v: u64,
    base: u64,
    counts: &mut ProbeCounts,
) {
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
pub(super) fn poll_timeouts(node: &mut Node, v: u64, k: &Consts, counts: &mut ProbeCounts) {
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
