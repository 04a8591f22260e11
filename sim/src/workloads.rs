//! Synthetic jobs on a simulated fabric, to score which jobs a finding says it hurts
//! against which a fault really hurts. A job is a ring over RNICs spread across the
//! fabric, as a collective's ring is, with several QPs per hop (NCCL opens a few
//! channels), each QP on its own flow label. Its service paths go to the controller's
//! impact computation (`rpingmesh_controller::impact`); the ground truth comes from the
//! fault's component and the fabric's own routing of each path.

use std::collections::BTreeSet;

use rpingmesh_proto::controller_agent::Workload;
use rpingmesh_proto::operator::ServicePath;

use crate::fabric::Fabric;
use crate::rng::Rng;
use crate::scenario::{Direction, Fault, FaultKind};

/// One job: its key and its paths (source RNIC, destination RNIC, flow label).
#[derive(Debug, Clone)]
pub struct Job {
    pub key: String,
    pub paths: Vec<(u32, u32, u32)>,
}

/// `count` jobs of `size` RNICs (a ring) with `qps` QPs per hop, seeded.
pub fn jobs(fabric: &Fabric, seed: u64, count: usize, size: usize, qps: usize) -> Vec<Job> {
    let mut rng = Rng::new(seed ^ 0x10B5_10B5_10B5_10B5);
    let n = fabric.rnics.len() as u64;
    (0..count)
        .map(|j| {
            let mut members: Vec<u32> = Vec::with_capacity(size);
            while members.len() < size.min(n as usize) {
                let r = (rng.next_u64() % n) as u32;
                if !members.contains(&r) {
                    members.push(r);
                }
            }
            let mut paths = Vec::with_capacity(size * qps);
            for (i, &src) in members.iter().enumerate() {
                let dst = members[(i + 1) % members.len()];
                for _ in 0..qps {
                    paths.push((src, dst, (rng.next_u64() & 0xf_ffff) as u32));
                }
            }
            Job {
                key: format!("slurm/{}", 1000 + j),
                paths,
            }
        })
        .collect()
}

/// The jobs' live service paths as the controller would list them.
pub fn service_paths(fabric: &Fabric, jobs: &[Job]) -> Vec<ServicePath> {
    let mut out = Vec::new();
    for j in jobs {
        for &(s, d, label) in &j.paths {
            let (a, b) = (&fabric.rnics[s as usize], &fabric.rnics[d as usize]);
            out.push(ServicePath {
                source_gid: a.gid.to_string(),
                source_tor_id: fabric.tors[a.tor as usize].to_string(),
                target_gid: b.gid.to_string(),
                target_tor_id: fabric.tors[b.tor as usize].to_string(),
                monitored: true,
                service: j.key.clone(),
                flow_label: label,
                flows: 1,
                workload: Some(Workload {
                    kind: "slurm_job".into(),
                    key: j.key.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
    }
    out
}

/// Whether the path from RNIC `s` to `d` with `label` crosses `fault`'s component, as
/// the fabric routes it.
fn crosses(fabric: &Fabric, fault: &Fault, s: u32, d: u32, label: u32) -> bool {
    let (a, b) = (&fabric.rnics[s as usize], &fabric.rnics[d as usize]);
    let on_link = |t: u32, sp: u32, dir: Direction| {
        let spine = fabric.spine_of(s, d, label);
        let up = a.tor == t && spine == Some(sp);
        let down = b.tor == t && spine == Some(sp);
        match dir {
            Direction::Up => up,
            Direction::Down => down,
            Direction::Both => up || down,
        }
    };
    match &fault.kind {
        FaultKind::RnicDown | FaultKind::RnicFlap { .. } | FaultKind::RnicLoss { .. } => fabric
            .rnic_index(&fault.location)
            .is_some_and(|r| r == s || r == d),
        FaultKind::HostStall { .. } => fabric
            .host_index(&fault.location)
            .is_some_and(|h| h == a.host || h == b.host),
        FaultKind::TorDown => fabric
            .tor_index(&fault.location)
            .is_some_and(|t| t == a.tor || t == b.tor),
        FaultKind::LinkLoss { direction, .. } | FaultKind::LinkLatency { direction, .. } => fabric
            .link_index(&fault.location)
            .is_some_and(|(t, sp)| on_link(t, sp, *direction)),
        FaultKind::LinkDown => fabric
            .link_index(&fault.location)
            .is_some_and(|(t, sp)| on_link(t, sp, Direction::Both)),
    }
}

/// The jobs `fault` hurts: those with a path across its component.
pub fn hurt_by(fabric: &Fabric, fault: &Fault, jobs: &[Job]) -> BTreeSet<String> {
    jobs.iter()
        .filter(|j| {
            j.paths
                .iter()
                .any(|&(s, d, l)| crosses(fabric, fault, s, d, l))
        })
        .map(|j| j.key.clone())
        .collect()
}

/// Jobs per scored scenario, RNICs per job, QPs per hop (a fifth of a 1,024-RNIC fabric's
/// RNICs in 48 rings of 32, 4 channels each: 6,144 service paths).
pub const SCORED_JOBS: (usize, usize, usize) = (48, 32, 4);

/// How well the finding of one fault named the jobs it hurt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImpactScore {
    pub fault_kind: &'static str,
    pub magnitude: String,
    /// Jobs the fault hurts (ground truth).
    pub truth: usize,
    /// Jobs the finding lists as surely hurt.
    pub named: usize,
    /// Of those, truly hurt.
    pub correct: usize,
    /// Jobs the finding lists as possibly hurt.
    pub uncertain: usize,
}

/// Per fault of `s`: the jobs the finding that names its component lists (an undetected
/// fault lists none) against the jobs the fault hurts.
pub fn score_impact(
    s: &crate::scenario::Scenario,
    findings: &[crate::output::FindingRecord],
) -> Vec<ImpactScore> {
    let fabric = s.build_fabric();
    let (count, size, qps) = SCORED_JOBS;
    let js = jobs(&fabric, s.seed, count, size, qps);
    let paths = service_paths(&fabric, &js);
    let idx = fabric.registry_index(0);
    s.faults
        .iter()
        .map(|g| {
            let truth = hurt_by(&fabric, g, &js);
            let t = crate::scenario::ground_truth(g);
            let f = findings
                .iter()
                .find(|f| f.kind == t.kind && f.location == t.location);
            let impact = f
                .map(|f| {
                    let finding = rpingmesh_proto::operator::Finding {
                        kind: f.kind.clone(),
                        location: f.location.clone(),
                        evidence: Some(f.evidence.clone()),
                        ..Default::default()
                    };
                    rpingmesh_controller::impact::impact(
                        &finding,
                        &paths,
                        &idx,
                        Some(&fabric.topology),
                    )
                })
                .unwrap_or_default();
            let named: BTreeSet<&str> = impact
                .iter()
                .filter(|i| i.paths_affected > 0)
                .map(|i| i.service.as_str())
                .collect();
            ImpactScore {
                fault_kind: g.kind.name(),
                magnitude: crate::gray::magnitude_label(&g.kind),
                truth: truth.len(),
                named: named.len(),
                correct: named.iter().filter(|n| truth.contains(**n)).count(),
                uncertain: impact.iter().filter(|i| i.paths_uncertain > 0).count(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::FabricSpec;

    fn fabric() -> Fabric {
        Fabric::new(
            &FabricSpec {
                tors: 8,
                spines: 4,
                hosts_per_tor: 2,
                rnics_per_host: 2,
                rail_optimized: false,
                link_latency_us: 2.0,
                link_jitter_us: 0.3,
            },
            7,
        )
    }

    fn fault(kind: FaultKind, location: &str) -> Fault {
        Fault {
            kind,
            location: location.into(),
            start_sec: 0.0,
            end_sec: 1.0,
        }
    }

    #[test]
    fn jobs_are_seeded_rings_with_their_qps() {
        let f = fabric();
        let a = jobs(&f, 3, 5, 6, 4);
        let b = jobs(&f, 3, 5, 6, 4);
        assert_eq!(a.len(), 5);
        assert_eq!(a[0].paths, b[0].paths);
        assert_eq!(a[0].paths.len(), 24);
        // A ring: every member sends to the next.
        let srcs: BTreeSet<u32> = a[0].paths.iter().map(|p| p.0).collect();
        let dsts: BTreeSet<u32> = a[0].paths.iter().map(|p| p.1).collect();
        assert_eq!(srcs, dsts);
        assert_eq!(service_paths(&f, &a).len(), 5 * 24);
    }

    #[test]
    fn the_truth_follows_the_component_and_the_routing() {
        let f = fabric();
        let js = jobs(&f, 1, 40, 8, 4);
        let rnic = f.rnics[5].name.clone();
        let by_rnic = hurt_by(&f, &fault(FaultKind::RnicLoss { loss: 0.01 }, &rnic), &js);
        for j in &js {
            let has = j.paths.iter().any(|p| p.0 == 5 || p.1 == 5);
            assert_eq!(by_rnic.contains(&j.key), has);
        }
        let up = hurt_by(
            &f,
            &fault(
                FaultKind::LinkLoss {
                    loss: 0.01,
                    direction: Direction::Up,
                },
                "tor2-spine3",
            ),
            &js,
        );
        let both = hurt_by(&f, &fault(FaultKind::LinkDown, "tor2-spine3"), &js);
        assert!(up.is_subset(&both) && !both.is_empty(), "{up:?} {both:?}");
        for j in &js {
            let has = j
                .paths
                .iter()
                .any(|&(s, d, l)| f.rnics[s as usize].tor == 1 && f.spine_of(s, d, l) == Some(2));
            assert_eq!(up.contains(&j.key), has);
        }
    }
}
