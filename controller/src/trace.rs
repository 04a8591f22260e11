//! On-demand ECMP traces (pure): an operator asks one source RNIC to probe one target
//! across a range of flow labels now; the probes ride a FOCUS target (`crate::focus`), and
//! the trace reads each label's results from the FOCUS windows the source's agent reports
//! after the trace began, and names the spine and links the topology's ECMP model sends
//! each label over.

use std::collections::BTreeMap;

use rpingmesh_proto::controller_agent::PathSummary;
use rpingmesh_proto::operator::{Trace, TraceLabel};

use crate::topology::{LinkDir, Topology};

/// Labels of one trace, at most (and when none are asked for).
pub const MAX_LABELS: u32 = 256;
pub const DEFAULT_LABELS: u32 = 64;
/// Traces running at once, at most.
pub const MAX_TRACES: usize = 16;
/// Finished traces kept for GetTrace.
pub const KEPT_TRACES: usize = 64;

/// A request that cannot be taken: one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceError(pub String);

#[derive(Debug, Default)]
pub struct Traces {
    by_id: BTreeMap<u64, Trace>,
    next_id: u64,
}

/// The labels `first`, `first + 1`, ... (`count`, 0 = the default), within 20 bits.
pub fn labels(first: u32, count: u32) -> Result<Vec<u32>, TraceError> {
    let n = if count == 0 { DEFAULT_LABELS } else { count };
    if n > MAX_LABELS {
        return Err(TraceError(format!(
            "at most {MAX_LABELS} labels per trace, not {n}"
        )));
    }
    if first > 0xF_FFFF || first + n - 1 > 0xF_FFFF {
        return Err(TraceError(format!(
            "flow labels are 20 bits: {first:#x} + {n} passes 0xfffff"
        )));
    }
    Ok((first..first + n).collect())
}

impl Traces {
    /// Traces probing now.
    pub fn running(&self) -> usize {
        self.by_id.values().filter(|t| t.state == "probing").count()
    }

    /// A new trace of `labels` from `src` to `dst`, probing until `deadline_ns`.
    pub fn start(
        &mut self,
        src: String,
        dst: String,
        labels: &[u32],
        by: String,
        now_ns: u64,
        deadline_ns: u64,
    ) -> Result<Trace, TraceError> {
        if self.running() >= MAX_TRACES {
            return Err(TraceError(format!(
                "{MAX_TRACES} traces are running; wait for one to end"
            )));
        }
        if let Some(t) = self
            .by_id
            .values()
            .find(|t| t.state == "probing" && t.source_gid == src && t.target_gid == dst)
        {
            return Err(TraceError(format!(
                "trace {} of the same pair is running",
                t.id
            )));
        }
        self.next_id += 1;
        let t = Trace {
            id: self.next_id,
            source_gid: src,
            target_gid: dst,
            state: "probing".into(),
            started_unix_ns: now_ns,
            deadline_unix_ns: deadline_ns,
            labels: labels
                .iter()
                .map(|&l| TraceLabel {
                    flow_label: l,
                    ..Default::default()
                })
                .collect(),
            by,
        };
        self.by_id.insert(t.id, t.clone());
        // Finished ones beyond the kept number go, oldest first.
        while self.by_id.len() > KEPT_TRACES + MAX_TRACES {
            let Some(old) = self
                .by_id
                .values()
                .find(|t| t.state != "probing")
                .map(|t| t.id)
            else {
                break;
            };
            self.by_id.remove(&old);
        }
        Ok(t)
    }

    pub fn get(&self, id: u64) -> Option<&Trace> {
        self.by_id.get(&id)
    }

    /// Brings every running trace up to `now_ns` with the FOCUS windows of its pair
    /// (`windows(src, dst)`, oldest first) and the topology's routing (`route` gives a
    /// label's spine and links). Returns the ids of traces that just finished (done or
    /// expired): their FOCUS targets end.
    pub fn advance<'a>(
        &mut self,
        now_ns: u64,
        windows: impl Fn(&str, &str) -> Vec<&'a PathSummary>,
        route: impl Fn(&str, &str, u32) -> (String, Vec<String>),
    ) -> Vec<u64> {
        let mut ended = Vec::new();
        for t in self.by_id.values_mut().filter(|t| t.state == "probing") {
            let ws = windows(&t.source_gid, &t.target_gid);
            let mut sums: BTreeMap<u32, TraceLabel> = BTreeMap::new();
            let mut whole = 0;
            // Windows that began after the trace did: the agent had its target then.
            for w in ws
                .iter()
                .filter(|w| w.window_start_unix_ns >= t.started_unix_ns)
            {
                whole += 1;
                for l in &w.flow_labels {
                    let e = sums.entry(l.flow_label).or_default();
                    e.probe_total += l.probe_total;
                    e.probe_failed += l.probe_failed;
                    e.network_rtt_max_ns = e.network_rtt_max_ns.max(l.network_rtt_max_ns);
                    // The newest window's median (windows come oldest first).
                    if l.network_rtt_p50_ns > 0 {
                        e.network_rtt_p50_ns = l.network_rtt_p50_ns;
                    }
                }
            }
            for l in &mut t.labels {
                if let Some(s) = sums.get(&l.flow_label) {
                    (l.probe_total, l.probe_failed) = (s.probe_total, s.probe_failed);
                    (l.network_rtt_p50_ns, l.network_rtt_max_ns) =
                        (s.network_rtt_p50_ns, s.network_rtt_max_ns);
                }
                if l.spine.is_empty() {
                    (l.spine, l.links) = route(&t.source_gid, &t.target_gid, l.flow_label);
                }
            }
            let all_probed = t.labels.iter().all(|l| l.probe_total > 0);
            if whole > 0 && all_probed {
                t.state = "done".into();
                ended.push(t.id);
            } else if now_ns >= t.deadline_unix_ns {
                t.state = "expired".into();
                ended.push(t.id);
            }
        }
        ended
    }
}

/// A label's spine and directed links by `topo`'s ECMP model, for a pair on ToRs
/// (`src_tor`, `dst_tor`): empty without a model or for a ToR-local pair.
pub fn route_of(
    topo: Option<&Topology>,
    src_tor: &str,
    dst_tor: &str,
    src: &str,
    dst: &str,
    label: u32,
) -> (String, Vec<String>) {
    let Some(topo) = topo else {
        return Default::default();
    };
    let (Some(s), Some(d)) = (topo.tor_index(src_tor), topo.tor_index(dst_tor)) else {
        return Default::default();
    };
    match topo.route(s, d, src, dst, label) {
        Some(links) => (
            topo.spine_name(links[0].1).to_string(),
            links
                .iter()
                .map(|&(t, sp, dir)| {
                    format!(
                        "{} {}",
                        topo.link_name(t, sp),
                        if dir == LinkDir::Up { "up" } else { "down" }
                    )
                })
                .collect(),
        ),
        None => Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::EcmpModel;
    use rpingmesh_proto::controller_agent::FlowLabelStats;

    const S: u64 = 1_000_000_000;

    fn window(start: u64, labels: &[(u32, u32, u32)]) -> PathSummary {
        PathSummary {
            window_start_unix_ns: start * S,
            flow_labels: labels
                .iter()
                .map(|&(l, total, failed)| FlowLabelStats {
                    flow_label: l,
                    probe_total: total,
                    probe_failed: failed,
                    network_rtt_p50_ns: 5_000,
                    network_rtt_max_ns: 9_000,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn label_ranges_are_checked() {
        assert_eq!(labels(0x100, 3).unwrap(), [0x100, 0x101, 0x102]);
        assert_eq!(labels(0, 0).unwrap().len(), DEFAULT_LABELS as usize);
        assert!(labels(0, MAX_LABELS + 1).is_err());
        assert!(labels(0xF_FFFF, 2).is_err());
        assert!(labels(0x10_0000, 1).is_err());
    }

    #[test]
    fn a_trace_is_done_when_every_label_was_probed_after_it_began() {
        let mut t = Traces::default();
        let tr = t
            .start(
                "a".into(),
                "b".into(),
                &[7, 8],
                "alice".into(),
                100 * S,
                200 * S,
            )
            .unwrap();
        assert!(t
            .start("a".into(), "b".into(), &[7], "bob".into(), 100 * S, 200 * S)
            .is_err());
        // An old window (before the trace) and a partial one: still probing.
        let old = window(90, &[(7, 10, 10), (8, 10, 0)]);
        let part = window(100, &[(7, 5, 5)]);
        let routed = |_: &str, _: &str, l: u32| (format!("s{}", l % 2), vec![format!("l{l}")]);
        assert!(t
            .advance(110 * S, |_, _| vec![&old, &part], routed)
            .is_empty());
        assert_eq!(t.get(tr.id).unwrap().state, "probing");
        let full = window(110, &[(7, 5, 5), (8, 6, 0)]);
        assert_eq!(
            t.advance(120 * S, |_, _| vec![&old, &part, &full], routed),
            [tr.id]
        );
        let done = t.get(tr.id).unwrap();
        assert_eq!(done.state, "done");
        let l7 = &done.labels[0];
        assert_eq!(
            (l7.probe_total, l7.probe_failed, l7.spine.as_str()),
            (10, 10, "s1")
        );
        assert_eq!(
            (done.labels[1].probe_total, done.labels[1].probe_failed),
            (6, 0)
        );
        // A trace whose labels never all come back expires.
        let tr2 = t
            .start(
                "a".into(),
                "c".into(),
                &[1, 2],
                "alice".into(),
                100 * S,
                130 * S,
            )
            .unwrap();
        let w = window(110, &[(1, 3, 0)]);
        assert!(t.advance(120 * S, |_, _| vec![&w], routed).is_empty());
        assert_eq!(t.advance(130 * S, |_, _| vec![&w], routed), [tr2.id]);
        assert_eq!(t.get(tr2.id).unwrap().state, "expired");
    }

    #[test]
    fn labels_are_routed_by_the_topology() {
        let tors = vec!["t1".to_string(), "t2".to_string()];
        let spines: Vec<String> = (1..=4).map(|s| format!("s{s}")).collect();
        let topo = Topology::full_mesh(&tors, &spines, Some(EcmpModel::Fnv1a { seed: 1 }));
        let (spine, links) = route_of(Some(&topo), "t1", "t2", "a", "b", 42);
        assert!(spine.starts_with('s'));
        assert_eq!(
            links,
            [format!("t1-{spine} up"), format!("t2-{spine} down")]
        );
        assert_eq!(
            route_of(Some(&topo), "t1", "t1", "a", "b", 42),
            Default::default()
        );
        assert_eq!(route_of(None, "t1", "t2", "a", "b", 42), Default::default());
    }
}
