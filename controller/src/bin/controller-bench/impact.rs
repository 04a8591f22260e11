//! impact: what naming the jobs a finding hurts costs per window at 100,000 RNICs and
//! 10,000 live service paths: the service-path listing the findings tick reads, and the
//! impact of eight findings (two each of RNIC, host, ToR, link) over it, on one thread,
//! as a share of a 30 s window (target < 0.05), next to the listing alone (the run
//! without impact).

use std::time::Instant;

use rpingmesh_controller::impact::impact;
use rpingmesh_controller::registry::{AgentRecord, RegistryIndex, RnicRecord};
use rpingmesh_controller::service_paths::{ServicePathFilter, ServicePathParams, ServicePathTable};
use rpingmesh_controller::topology::{EcmpModel, Topology};
use rpingmesh_proto::controller_agent::{ServiceFlow, ServiceFlowReport, Workload};
use rpingmesh_proto::operator::{Finding, FindingEvidence};
use serde_json::json;

use super::common::{emit, gid_of, XorShift};
use super::median;

const WINDOW_SEC: f64 = 30.0;
const PER_TOR: u64 = 8;

pub fn bench_impact(rnics: u64, paths: u64, reps: usize) {
    let now_sec = 1_700_000_000u64;
    let now = now_sec * 1_000_000_000;
    let tors = rnics / PER_TOR;
    let tor = |r: u64| format!("tor-{}", r / PER_TOR);
    let host = |r: u64| format!("host-{}", r / 2);
    let mut idx = RegistryIndex::default();
    for h in 0..rnics / 2 {
        let recs: Vec<RnicRecord> = (h * 2..h * 2 + 2)
            .map(|r| RnicRecord {
                gid: gid_of(r),
                qpn: 1000,
                host_name: host(r),
                tor_id: tor(r),
                device_name: format!("mlx5_{}", r % 2),
                agent_id: host(r),
                ..Default::default()
            })
            .collect();
        let agent = AgentRecord {
            agent_id: host(h * 2),
            hostname: host(h * 2),
            tor_id: tor(h * 2),
            ..Default::default()
        };
        idx.register_agent(&agent, &recs, now_sec);
    }
    let tor_names: Vec<String> = (0..tors).map(|t| format!("tor-{t}")).collect();
    let spines: Vec<String> = (0..16).map(|s| format!("spine-{s}")).collect();
    let topo = Topology::full_mesh(&tor_names, &spines, Some(EcmpModel::Fnv1a { seed: 0 }));
    // 1,000 jobs of 10 paths each, from random RNICs to random RNICs.
    let mut rng = XorShift(42);
    let mut by_agent: std::collections::BTreeMap<String, Vec<ServiceFlow>> = Default::default();
    for p in 0..paths {
        let (s, d) = (rng.next() % rnics, rng.next() % rnics);
        let job = format!("slurm/{}", p / 10);
        by_agent.entry(host(s)).or_default().push(ServiceFlow {
            local_gid: gid_of(s),
            local_qpn: 0x1000 + p as u32,
            remote_gid: gid_of(d),
            remote_qpn: 0x9000,
            flow_label: (rng.next() & 0xF_FFFF) as u32,
            service: job.clone(),
            workload: Some(Workload {
                kind: "slurm_job".into(),
                key: job,
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    let mut table = ServicePathTable::new(ServicePathParams {
        max_services: 2_000,
        ..ServicePathParams::default()
    });
    for (agent, flows) in by_agent {
        table.apply(
            &agent,
            idx.agent_gids(&agent),
            ServiceFlowReport {
                agent_id: agent.clone(),
                full_sync: true,
                upserts: flows,
                removals: Vec::new(),
            },
            now,
        );
    }
    let finding = |kind: &str, location: String, direction: &str| Finding {
        kind: kind.into(),
        location,
        open: true,
        evidence: Some(FindingEvidence {
            direction: direction.into(),
            windows: 1,
            ..Default::default()
        }),
        ..Default::default()
    };
    let findings = [
        finding("rnic", format!("{}/mlx5_1", host(3)), ""),
        finding("rnic", format!("{}/mlx5_0", host(5000)), ""),
        finding("host", host(700), ""),
        finding("host", host(90_000), ""),
        finding("tor", tor(8 * 100), ""),
        finding("tor", tor(8 * 9_000), ""),
        finding("link", "tor-1-spine-0".into(), "up"),
        finding("link", "tor-4000-spine-7".into(), "both"),
    ];
    let (mut list_s, mut with_s) = (Vec::new(), Vec::new());
    let mut named = 0usize;
    for _ in 0..reps {
        let t = Instant::now();
        std::hint::black_box(table.list(&idx, &ServicePathFilter::default(), now));
        list_s.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let listed = table.list(&idx, &ServicePathFilter::default(), now);
        named = findings
            .iter()
            .map(|f| impact(f, &listed, &idx, Some(&topo)).len())
            .sum();
        with_s.push(t.elapsed().as_secs_f64());
        assert_eq!(listed.len() as u64, paths);
    }
    let (list, with) = (median(list_s), median(with_s));
    emit(json!({
        "bench": "finding_impact",
        "rnics": rnics,
        "service_paths": paths,
        "findings": findings.len(),
        "jobs_named": named,
        "listing_sec": list,
        "with_impact_sec": with,
        "ratio_to_listing": if list > 0.0 { with / list } else { 0.0 },
        "ratio_to_window": with / WINDOW_SEC,
        "window_sec": WINDOW_SEC,
        "reps": reps,
        "threads": 1,
    }));
}
