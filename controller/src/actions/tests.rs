//! Drains and silences over a small registry.

use rpingmesh_proto::operator::Finding;

use super::*;
use crate::registry::{AgentRecord, RnicRecord};

const S: u64 = 1_000_000_000;

fn gid(i: u32) -> String {
    rpingmesh_proto::gid::normalize_gid(&format!("fd00::{i:x}")).unwrap()
}

/// Hosts h0, h1 with RNICs mlx5_0/1 each (GIDs 0..4).
fn index() -> RegistryIndex {
    let mut idx = RegistryIndex::default();
    for h in 0..2u32 {
        let rnics: Vec<RnicRecord> = (0..2)
            .map(|d| RnicRecord {
                gid: gid(h * 2 + d),
                host_name: format!("h{h}"),
                tor_id: "t0".into(),
                device_name: format!("mlx5_{d}"),
                agent_id: format!("a{h}"),
                ..Default::default()
            })
            .collect();
        idx.register_agent(
            &AgentRecord {
                agent_id: format!("a{h}"),
                hostname: format!("h{h}"),
                tor_id: "t0".into(),
                ..Default::default()
            },
            &rnics,
            1,
        );
    }
    idx
}

fn finding(id: u64, kind: &str, location: &str) -> Finding {
    Finding {
        id,
        kind: kind.into(),
        location: location.into(),
        open: true,
        ..Default::default()
    }
}

fn add(a: &mut Actions, kind: &str, tk: &str, target: &str, now: u64, dur: u32) -> u64 {
    let x = a
        .propose(
            kind,
            tk,
            target.into(),
            "why".into(),
            "alice".into(),
            now,
            dur,
            0,
        )
        .unwrap();
    let id = x.id;
    a.put(x);
    id
}

#[test]
fn a_drain_takes_an_rnic_or_a_host_out_and_marks_its_findings() {
    let idx = index();
    let mut a = Actions::default();
    assert!(!a.any_drain(0));
    let d1 = add(&mut a, DRAIN, "rnic", &gid(1), 10 * S, 60);
    assert!(a.any_drain(10 * S));
    assert_eq!(a.drained_gids(&idx, 10 * S), HashSet::from([gid(1)]));
    assert_eq!(
        a.suppression(&finding(1, "rnic", "h0/mlx5_1"), &idx, 10 * S),
        Some(("maintenance", d1))
    );
    assert_eq!(
        a.suppression(&finding(2, "rnic", "h0/mlx5_0"), &idx, 10 * S),
        None
    );
    // A host: both its RNICs, and its host and RNIC findings.
    let d2 = add(&mut a, DRAIN, "host", "h1", 10 * S, 0);
    assert_eq!(a.drained_gids(&idx, 10 * S).len(), 3);
    assert_eq!(
        a.suppression(&finding(3, "host", "h1"), &idx, 10 * S),
        Some(("maintenance", d2))
    );
    assert_eq!(
        a.suppression(&finding(4, "rnic", "h1/mlx5_0"), &idx, 10 * S),
        Some(("maintenance", d2))
    );
    // Expiry: the RNIC drain ran out, the host's has none.
    assert_eq!(a.drained_gids(&idx, 71 * S).len(), 2);
    assert_eq!(a.expired(71 * S), [d1]);
    // Ending it.
    assert_eq!(a.end(d2).map(|x| x.target), Some("h1".to_string()));
    assert!(!a.any_drain(71 * S));
}

#[test]
fn a_silence_covers_a_finding_or_a_component_and_always_ends() {
    let idx = index();
    let mut a = Actions::default();
    let s1 = add(&mut a, SILENCE, "finding", "7", 0, 600);
    let s2 = add(&mut a, SILENCE, "link", "t0-s1", 0, 600);
    let mut list = vec![
        finding(7, "tor", "t0"),
        finding(8, "link", "t0-s1"),
        finding(9, "link", "t0-s2"),
    ];
    a.annotate(&mut list, &idx, S);
    let marks: Vec<(&str, u64)> = list
        .iter()
        .map(|f| (f.suppressed.as_str(), f.suppressed_by))
        .collect();
    assert_eq!(marks, [("silenced", s1), ("silenced", s2), ("", 0)]);
    a.annotate(&mut list, &idx, 601 * S);
    assert!(list.iter().all(|f| f.suppressed.is_empty()));
    // A silence needs an end, within a week.
    for d in [0, MAX_SILENCE_SEC + 1] {
        assert!(a
            .propose(
                SILENCE,
                "finding",
                "1".into(),
                String::new(),
                String::new(),
                0,
                d,
                0
            )
            .is_err());
    }
}

#[test]
fn ids_are_unique_above_the_floor_and_the_store_reloads() {
    let mut a = Actions::default();
    let x = a
        .propose(
            DRAIN,
            "host",
            "h0".into(),
            String::new(),
            String::new(),
            0,
            0,
            1000,
        )
        .unwrap();
    assert_eq!(x.id, 1000);
    a.put(x.clone());
    let y = a
        .propose(
            DRAIN,
            "host",
            "h1".into(),
            String::new(),
            String::new(),
            0,
            0,
            5,
        )
        .unwrap();
    assert_eq!(y.id, 1001);
    let mut b = Actions::default();
    b.load(vec![x, y]);
    assert_eq!(b.in_force(0).len(), 2);
    let z = b
        .propose(
            SILENCE,
            "finding",
            "1".into(),
            String::new(),
            String::new(),
            0,
            5,
            0,
        )
        .unwrap();
    assert_eq!(z.id, 1002);
}
