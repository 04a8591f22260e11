//! Impact over hand-built fleets with known answers.

use rpingmesh_proto::controller_agent::{PathSummary, Workload};
use rpingmesh_proto::operator::{Finding, FindingEvidence, ServicePath};

use super::*;
use crate::registry::{AgentRecord, RnicRecord};
use crate::topology::EcmpModel;

const S: u64 = 1_000_000_000;

fn gid(i: u32) -> String {
    rpingmesh_proto::gid::normalize_gid(&format!("fd00::{i:x}")).unwrap()
}

/// RNIC i on host h{i/2} (two RNICs each, mlx5_0/1) on ToR t{i/4}.
fn index(n: u32) -> RegistryIndex {
    let mut idx = RegistryIndex::default();
    for h in 0..n / 2 {
        let tor = format!("t{}", h / 2);
        let rnics: Vec<RnicRecord> = (0..2)
            .map(|d| RnicRecord {
                gid: gid(h * 2 + d),
                host_name: format!("h{h}"),
                tor_id: tor.clone(),
                device_name: format!("mlx5_{d}"),
                agent_id: format!("a{h}"),
                ..Default::default()
            })
            .collect();
        idx.register_agent(
            &AgentRecord {
                agent_id: format!("a{h}"),
                hostname: format!("h{h}"),
                tor_id: tor,
                ..Default::default()
            },
            &rnics,
            1,
        );
    }
    idx
}

fn tor_of(i: u32) -> String {
    format!("t{}", i / 4)
}

/// A service path of `service` from RNIC `src` to `dst` (None: an unregistered remote).
fn path(service: &str, src: u32, dst: Option<u32>, label: u32) -> ServicePath {
    ServicePath {
        source_gid: gid(src),
        source_tor_id: tor_of(src),
        target_gid: dst.map_or_else(|| gid(9999), gid),
        target_tor_id: dst.map(tor_of).unwrap_or_default(),
        monitored: dst.is_some(),
        service: service.into(),
        flow_label: label,
        workload: Some(Workload {
            kind: "slurm_job".into(),
            key: service.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn finding(kind: &str, location: &str, direction: &str) -> Finding {
    Finding {
        kind: kind.into(),
        location: location.into(),
        opened_unix_ns: 100 * S,
        last_seen_unix_ns: 130 * S,
        open: true,
        evidence: Some(FindingEvidence {
            windows: 2,
            direction: direction.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn counts(v: &[FindingImpact]) -> Vec<(&str, u32, u32, u32)> {
    v.iter()
        .map(|i| {
            (
                i.service.as_str(),
                i.paths_affected,
                i.paths_uncertain,
                i.paths_total,
            )
        })
        .collect()
}

#[test]
fn an_rnic_a_host_and_a_tor_hurt_the_jobs_with_an_end_on_them() {
    let idx = index(16);
    let paths = vec![
        path("slurm/1", 0, Some(5), 7),
        path("slurm/1", 1, Some(5), 7),
        path("slurm/1", 2, Some(9), 7),
        path("slurm/2", 8, Some(0), 7),
        path("slurm/2", 9, Some(10), 7),
        path("k8s/a/b", 12, None, 7),
    ];
    // RNIC h0/mlx5_0 = GID 0.
    let i = impact(&finding("rnic", "h0/mlx5_0", ""), &paths, &idx, None);
    assert_eq!(counts(&i), [("slurm/1", 1, 0, 3), ("slurm/2", 1, 0, 2)]);
    assert_eq!(i[0].workload.as_ref().unwrap().kind, "slurm_job");
    // Host h0 = GIDs 0 and 1.
    let i = impact(&finding("host", "h0", ""), &paths, &idx, None);
    assert_eq!(counts(&i), [("slurm/1", 2, 0, 3), ("slurm/2", 1, 0, 2)]);
    // ToR t1 = GIDs 4..7; the unregistered remote of k8s/a/b may be on it.
    let i = impact(&finding("tor", "t1", ""), &paths, &idx, None);
    assert_eq!(counts(&i), [("slurm/1", 2, 0, 3), ("k8s/a/b", 0, 1, 1)]);
    // A location this controller cannot place: nothing, not a guess.
    assert!(impact(&finding("rnic", "nowhere", ""), &paths, &idx, None).is_empty());
    assert!(impact(&finding("link", "t0-s1", "up"), &paths, &idx, None).is_empty());
}

#[test]
fn a_link_hurts_exactly_the_paths_whose_labels_hash_onto_it() {
    let idx = index(16);
    let tors: Vec<String> = (0..4).map(|t| format!("t{t}")).collect();
    let spines: Vec<String> = (0..4).map(|s| format!("s{s}")).collect();
    let topo = Topology::full_mesh(&tors, &spines, Some(EcmpModel::Fnv1a { seed: 7 }));
    // One job, one path per label, from t0 to t2; another from t2 to t0.
    let mut paths: Vec<ServicePath> = (0..64).map(|l| path("slurm/1", 1, Some(9), l)).collect();
    paths.extend((0..64).map(|l| path("slurm/2", 9, Some(1), l)));
    paths.push(path("slurm/3", 0, Some(1), 5)); // ToR-local: never on a link
    let (t0, t2, s1) = (0, 2, 1);
    // Ground truth, label by label, from the routing.
    let on = |src: &str, dst: &str, l: u32, link: (u32, u32, LinkDir)| {
        let (s, d) = if src < dst { (t0, t2) } else { (t2, t0) };
        topo.route(s, d, src, dst, l).unwrap().contains(&link)
    };
    let (g1, g9) = (gid(1), gid(9));
    let up = (0..64)
        .filter(|&l| on(&g1, &g9, l, (t0, s1, LinkDir::Up)))
        .count() as u32;
    let down = (0..64)
        .filter(|&l| on(&g9, &g1, l, (t0, s1, LinkDir::Down)))
        .count() as u32;
    assert!(up > 4 && down > 4, "{up} {down}");
    let i = impact(&finding("link", "t0-s1", "up"), &paths, &idx, Some(&topo));
    assert_eq!(counts(&i), [("slurm/1", up, 0, 64)]);
    let i = impact(&finding("link", "t0-s1", "down"), &paths, &idx, Some(&topo));
    assert_eq!(counts(&i), [("slurm/2", down, 0, 64)]);
    let i = impact(&finding("link", "t0-s1", "both"), &paths, &idx, Some(&topo));
    let mut c = counts(&i);
    c.sort();
    assert_eq!(c, [("slurm/1", up, 0, 64), ("slurm/2", down, 0, 64)]);
    // Without a hash model the same link is a maybe for every path leaving t0.
    let plain = Topology::full_mesh(&tors, &spines, None);
    let i = impact(&finding("link", "t0-s1", "up"), &paths, &idx, Some(&plain));
    assert_eq!(counts(&i), [("slurm/1", 0, 64, 64)]);
    // A ToR side named without a topology: maybes, leaving or entering.
    let i = impact(&finding("link", "t0/uplink", "up"), &paths, &idx, None);
    assert_eq!(counts(&i), [("slurm/1", 0, 64, 64)]);
    let i = impact(&finding("link", "t0/downlink", "down"), &paths, &idx, None);
    assert_eq!(counts(&i), [("slurm/2", 0, 64, 64)]);
}

#[test]
fn measurements_come_from_the_affected_paths_windows_during_the_finding() {
    let idx = index(8);
    let window = |start: u64, failed: u32, p99: u64| PathSummary {
        window_start_unix_ns: start * S,
        window_duration_ms: 30_000,
        probe_total: 100,
        probe_failed: failed,
        network_rtt_p99_ns: p99,
        ..Default::default()
    };
    let mut a = path("slurm/1", 0, Some(5), 1);
    a.latest = Some(window(150, 7, 40_000));
    let mut b = path("slurm/1", 0, Some(6), 1);
    b.latest = Some(window(220, 3, 90_000));
    // Long before the finding: not counted.
    let mut c = path("slurm/1", 0, Some(7), 1);
    c.latest = Some(window(0, 50, 999_000));
    let mut f = finding("rnic", "h0/mlx5_0", "");
    (f.opened_unix_ns, f.last_seen_unix_ns) = (200 * S, 230 * S);
    let i = impact(&f, &[a, b, c], &idx, None);
    assert_eq!(
        (
            i[0].paths_affected,
            i[0].probe_total,
            i[0].probe_failed,
            i[0].network_rtt_p99_ns
        ),
        (3, 200, 10, 90_000)
    );
}

#[test]
fn the_worst_come_first_and_the_list_is_bounded() {
    let idx = index(8);
    let mut paths = Vec::new();
    for j in 0..(MAX_IMPACT as u32 + 10) {
        for k in 0..=(j % 3) {
            paths.push(path(&format!("job/{j:03}"), 0, Some(4 + k % 4), k));
        }
    }
    let i = impact(&finding("rnic", "h0/mlx5_0", ""), &paths, &idx, None);
    assert_eq!(i.len(), MAX_IMPACT);
    assert!(i
        .windows(2)
        .all(|w| w[0].paths_affected >= w[1].paths_affected));
    assert_eq!(i[0].paths_affected, 3);
}
