//! Tests of `service_paths.rs`.

use super::*;
use crate::registry::{AgentRecord, RnicRecord};

const SEC: u64 = NS_PER_SEC;
const T0: u64 = 1_000_000 * SEC;

fn g(s: &str) -> String {
    normalize_gid(s).unwrap()
}

fn index(rnics: &[(&str, &str, &str)]) -> RegistryIndex {
    // (agent, gid, tor); registered at T0.
    let mut idx = RegistryIndex::default();
    let mut by_agent: BTreeMap<&str, Vec<RnicRecord>> = BTreeMap::new();
    for (agent, gid, tor) in rnics {
        by_agent.entry(agent).or_default().push(RnicRecord {
            gid: g(gid),
            qpn: 4000,
            ip_address: "10.0.0.1".into(),
            host_name: format!("host-{agent}"),
            tor_id: tor.to_string(),
            device_name: "mlx5_0".into(),
            agent_id: agent.to_string(),
            last_updated: 0,
        });
    }
    for (agent, rs) in by_agent {
        let a = AgentRecord {
            agent_id: agent.into(),
            tor_id: rs[0].tor_id.clone(),
            ..Default::default()
        };
        idx.register_agent(&a, &rs, T0 / SEC);
    }
    idx
}

fn flow(local: &str, qpn: u32, remote: &str, label: u32, svc: &str) -> ServiceFlow {
    ServiceFlow {
        local_gid: local.into(),
        local_qpn: qpn,
        remote_gid: remote.into(),
        remote_qpn: qpn + 1,
        flow_label: label,
        traffic_class: 96,
        service_level: 3,
        pid: 42,
        comm: "trainer".into(),
        service: svc.into(),
        ..Default::default()
    }
}

fn inc(upserts: Vec<ServiceFlow>, removals: Vec<ServiceFlowKey>) -> ServiceFlowReport {
    ServiceFlowReport {
        agent_id: "a".into(),
        full_sync: false,
        upserts,
        removals,
    }
}

fn full(upserts: Vec<ServiceFlow>) -> ServiceFlowReport {
    ServiceFlowReport {
        full_sync: true,
        ..inc(upserts, vec![])
    }
}

fn gids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| g(s)).collect()
}

#[test]
fn upsert_remove_and_full_sync_are_idempotent() {
    let mut t = ServicePathTable::new(ServicePathParams::default());
    let mine = gids(&["fd00::1"]);
    let r = t.apply(
        "a",
        &mine,
        full(vec![flow("fd00::1", 10, "fd00::2", 5, "")]),
        T0,
    );
    assert!(!r.resync_required, "full sync never asks for a resync");
    assert_eq!((r.flows_known, r.upserted), (1, 1));
    // Same upsert again: same state.
    let before = t.agent_flows("a", T0);
    let r = t.apply(
        "a",
        &mine,
        inc(vec![flow("fd00::1", 10, "fd00::2", 5, "")], vec![]),
        T0,
    );
    assert!(!r.resync_required);
    assert_eq!(r.flows_known, 1);
    assert_eq!(t.agent_flows("a", T0), before);
    // An upsert replaces by key (label changed), a second key adds.
    t.apply(
        "a",
        &mine,
        inc(
            vec![
                flow("FD00::1", 10, "fd00::2", 6, ""),
                flow("fd00::1", 11, "fd00::3", 7, ""),
            ],
            vec![],
        ),
        T0,
    );
    let f = t.agent_flows("a", T0);
    assert_eq!(f.len(), 2);
    assert_eq!((f[0].local_qpn, f[0].flow_label), (10, 6));
    assert_eq!(f[0].service, "trainer", "comm when no service is set");
    // Removal, twice (second is a no-op), plus an unknown and an unparsable key.
    for _ in 0..2 {
        t.apply(
            "a",
            &mine,
            inc(
                vec![],
                vec![
                    flow_key("fd00::1", 10),
                    flow_key("fd00::1", 99),
                    flow_key("zz", 1),
                ],
            ),
            T0,
        );
        assert_eq!(t.flows_known("a", T0), 1);
    }
    // Removal + upsert of the same key in one report: the new flow wins.
    let r = t.apply(
        "a",
        &mine,
        inc(
            vec![flow("fd00::1", 11, "fd00::4", 8, "")],
            vec![flow_key("fd00::1", 11)],
        ),
        T0,
    );
    assert_eq!((r.removed, r.upserted, r.flows_known), (1, 1, 1));
    assert_eq!(t.agent_flows("a", T0)[0].remote_gid, g("fd00::4"));
    // Full sync replaces everything, and is idempotent.
    let set = vec![
        flow("fd00::1", 20, "fd00::5", 1, ""),
        flow("fd00::1", 21, "fd00::5", 2, ""),
    ];
    t.apply("a", &mine, full(set.clone()), T0);
    let once = t.agent_flows("a", T0);
    t.apply("a", &mine, full(set), T0);
    assert_eq!(t.agent_flows("a", T0), once);
    assert_eq!(
        once.iter().map(|f| f.local_qpn).collect::<Vec<_>>(),
        vec![20, 21]
    );
    // An empty full sync clears the set but keeps the agent known.
    let r = t.apply("a", &mine, full(vec![]), T0);
    assert_eq!(r.flows_known, 0);
    let r = t.apply("a", &mine, inc(vec![], vec![]), T0);
    assert!(!r.resync_required);
    assert_eq!(t.service_count(), 0, "names released with their flows");
}

#[test]
fn resync_after_restart_and_after_expiry() {
    let mine = gids(&["fd00::1"]);
    // A fresh table is a restarted controller.
    let mut t = ServicePathTable::new(ServicePathParams::default());
    let r = t.apply("a", &mine, inc(vec![], vec![]), T0);
    assert!(
        r.resync_required,
        "incremental report to an empty controller"
    );
    let r = t.apply(
        "a",
        &mine,
        full(vec![flow("fd00::1", 1, "fd00::2", 1, "")]),
        T0,
    );
    assert!(!r.resync_required);
    let r = t.apply("a", &mine, inc(vec![], vec![]), T0 + SEC);
    assert!(!r.resync_required);
    assert_eq!(r.flows_known, 1);
    // Other agents do not count as state for this one.
    assert!(
        t.apply("b", &gids(&["fd00::9"]), inc(vec![], vec![]), T0)
            .resync_required
    );
    // Silent past the TTL: flows gone, next incremental report asks for a resync.
    let late = T0 + SEC + 121 * SEC;
    assert_eq!(t.flows_known("a", late), 0);
    let r = t.apply("a", &mine, inc(vec![], vec![]), late);
    assert!(r.resync_required);
    assert_eq!(r.flows_known, 0);
}

#[test]
fn expiry_by_ttl_with_heartbeats() {
    let mine = gids(&["fd00::1"]);
    let mut t = ServicePathTable::new(ServicePathParams {
        flow_ttl_sec: 10,
        ..Default::default()
    });
    t.apply(
        "a",
        &mine,
        full(vec![flow("fd00::1", 1, "fd00::2", 1, "svc")]),
        T0,
    );
    t.apply(
        "b",
        &gids(&["fd00::2"]),
        full(vec![flow("fd00::2", 1, "fd00::1", 1, "svc")]),
        T0,
    );
    // Empty reports from a keep its flows alive; b goes quiet.
    for s in [5, 10, 15] {
        t.apply("a", &mine, inc(vec![], vec![]), T0 + s * SEC);
    }
    let now = T0 + 15 * SEC;
    assert_eq!(t.flows_known("a", now), 1);
    assert_eq!(
        t.flows_known("b", T0 + 10 * SEC),
        1,
        "exactly at the TTL stays"
    );
    assert_eq!(
        t.flows_known("b", now),
        0,
        "expired for queries before any sweep"
    );
    let idx = index(&[("a", "fd00::1", "t1"), ("b", "fd00::2", "t1")]);
    let listed = t.list(&idx, &ServicePathFilter::default(), now);
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].source_agent_id, "a");
    assert_eq!(t.expire(now), 1);
    assert_eq!(t.stats().flows_expired, 1);
    assert_eq!(t.service_count(), 1, "a still uses the name");
    assert_eq!(t.expire(now + 11 * SEC), 1);
    assert_eq!(t.service_count(), 0);
}

#[test]
fn per_agent_bound_rejects_and_counts() {
    let mine = gids(&["fd00::1"]);
    let mut t = ServicePathTable::new(ServicePathParams {
        max_flows_per_agent: 3,
        ..Default::default()
    });
    let many: Vec<_> = (0..5)
        .map(|q| flow("fd00::1", q, "fd00::2", q, ""))
        .collect();
    let r = t.apply("a", &mine, full(many), T0);
    assert_eq!(
        (r.upserted, r.rejected_over_limit, r.flows_known),
        (3, 2, 3)
    );
    // Updating an existing key at the bound is fine; a new key is not.
    let r = t.apply(
        "a",
        &mine,
        inc(
            vec![
                flow("fd00::1", 0, "fd00::3", 9, ""),
                flow("fd00::1", 50, "fd00::3", 9, ""),
            ],
            vec![],
        ),
        T0,
    );
    assert_eq!((r.upserted, r.rejected_over_limit), (1, 1));
    // Other agents have their own budget.
    let r = t.apply(
        "b",
        &gids(&["fd00::7"]),
        full(vec![flow("fd00::7", 0, "fd00::1", 0, "")]),
        T0,
    );
    assert_eq!(r.upserted, 1);
    assert_eq!(t.stats().rejected_over_limit, 3);
    // A flood stays bounded.
    let flood: Vec<_> = (0..100_000)
        .map(|q| flow("fd00::1", q, "fd00::2", q, ""))
        .collect();
    t.apply("a", &mine, full(flood), T0);
    assert_eq!(t.flows_known("a", T0), 3);
}

#[test]
fn bad_and_foreign_gids_are_dropped_and_counted() {
    let mine = gids(&["fd00::1"]);
    let mut t = ServicePathTable::new(ServicePathParams::default());
    let r = t.apply(
        "a",
        &mine,
        full(vec![
            flow("garbage", 1, "fd00::2", 1, ""),
            flow("fd00::1", 2, "", 1, ""),
            flow("fd00::99", 3, "fd00::2", 1, ""),
            flow("fd00::98", 4, "fd00::2", 1, ""),
            flow("fd00::1", 5, "fd00::2", 1, ""),
        ]),
        T0,
    );
    assert_eq!(
        (r.dropped_bad_gid, r.dropped_foreign_source, r.upserted),
        (2, 2, 1)
    );
    assert!(r.example_bad_gid.unwrap().contains("garbage"));
    assert_eq!(r.first_foreign_source, Some(g("fd00::99")));
    // Logged once per agent: the next foreign flow is counted but not reported again.
    let r = t.apply(
        "a",
        &mine,
        inc(vec![flow("fd00::97", 6, "fd00::2", 1, "")], vec![]),
        T0,
    );
    assert_eq!(r.dropped_foreign_source, 1);
    assert_eq!(r.first_foreign_source, None);
    let s = t.stats();
    assert_eq!((s.dropped_bad_gid, s.dropped_foreign_source), (2, 3));
}

#[test]
fn unknown_remote_gids_are_listed_unmonitored_and_not_probed() {
    let idx = index(&[("a", "fd00::1", "t1"), ("b", "fd00::2", "t2")]);
    let mine = gids(&["fd00::1"]);
    let mut t = ServicePathTable::new(ServicePathParams::default());
    t.apply(
        "a",
        &mine,
        full(vec![
            flow("fd00::1", 1, "fd00::2", 0x12345, "allreduce"),
            flow("fd00::1", 2, "fd00::2", 0x12345, "allreduce"),
            flow("fd00::1", 3, "fd00::77", 9, "allreduce"),
        ]),
        T0,
    );
    let rows = t.list(&idx, &ServicePathFilter::default(), T0);
    assert_eq!(rows.len(), 2);
    let known = rows.iter().find(|r| r.target_gid == g("fd00::2")).unwrap();
    assert!(known.monitored);
    assert_eq!(
        (
            known.flows,
            known.source_tor_id.as_str(),
            known.target_tor_id.as_str()
        ),
        (2, "t1", "t2")
    );
    assert_eq!(
        (known.flow_label, known.service_level, known.traffic_class),
        (0x12345, 3, 96)
    );
    let unknown = rows.iter().find(|r| r.target_gid == g("fd00::77")).unwrap();
    assert!(!unknown.monitored);
    assert_eq!(unknown.target_tor_id, "");

    let pl = t.pinglist(&idx, "a", &g("fd00::1"), T0, 300);
    assert_eq!(
        pl.len(),
        1,
        "two flows on one path probed once; unknown GID absent"
    );
    let p = &pl[0];
    assert_eq!(p.target_gid, g("fd00::2"));
    assert_eq!(p.target_qpn, 4000, "the responder QPN, not the service QP");
    assert_eq!(
        (p.flow_label, p.flow_label_count, p.flow_label_seed),
        (0x12345, 1, 0x12345)
    );
    assert_eq!((p.service_level, p.traffic_class), (3, 96));
    assert_eq!(p.pinglist_type, PinglistType::Service as i32);
    assert_eq!(
        (p.service.as_str(), p.target_tor_id.as_str(), p.priority),
        ("allreduce", "t2", 0)
    );
    // Inactive remote RNIC: still listed, not probed.
    assert!(t
        .pinglist(&idx, "a", &g("fd00::1"), T0 + 301 * SEC, 300)
        .is_empty());
    // Another RNIC of nobody: nothing.
    assert!(t.pinglist(&idx, "a", &g("fd00::2"), T0, 300).is_empty());
}

#[test]
fn label_zero_services_are_probed_on_the_label_the_nic_derives() {
    let idx = index(&[("a", "fd00::1", "t1"), ("b", "fd00::2", "t2")]);
    let mut t = ServicePathTable::new(ServicePathParams::default());
    // flow() pairs local QPN q with remote q + 1. Two QP pairs left at label 0 take
    // two ECMP paths (the kernel derives each from its QPNs): two SERVICE targets.
    t.apply(
        "a",
        &gids(&["fd00::1"]),
        full(vec![
            flow("fd00::1", 0x11, "fd00::2", 0, "nccl"),
            flow("fd00::1", 0x21, "fd00::2", 0, "nccl"),
        ]),
        T0,
    );
    let mut labels: Vec<u32> = t
        .pinglist(&idx, "a", &g("fd00::1"), T0, 300)
        .iter()
        .map(|p| p.flow_label)
        .collect();
    labels.sort_unstable();
    let want = |l: u32, r: u32| rpingmesh_protocol::flowlabel::rc_flow_label(l, r);
    let mut expect = vec![want(0x11, 0x12), want(0x21, 0x22)];
    expect.sort_unstable();
    assert_eq!(labels, expect);
    assert_eq!(expect, vec![0x132, 0x462]);
}

#[test]
fn pinglist_dedupes_identical_paths_across_services() {
    let idx = index(&[("a", "fd00::1", "t1"), ("b", "fd00::2", "t1")]);
    let mine = gids(&["fd00::1"]);
    let mut t = ServicePathTable::new(ServicePathParams::default());
    let mut other_sl = flow("fd00::1", 4, "fd00::2", 7, "zeta");
    other_sl.service_level = 5;
    t.apply(
        "a",
        &mine,
        full(vec![
            flow("fd00::1", 1, "fd00::2", 7, "zeta"),
            flow("fd00::1", 2, "fd00::2", 7, "alpha"),
            flow("fd00::1", 3, "fd00::2", 8, "zeta"),
            other_sl,
        ]),
        T0,
    );
    let pl = t.pinglist(&idx, "a", &g("fd00::1"), T0, 300);
    let got: Vec<_> = pl
        .iter()
        .map(|p| (p.flow_label, p.service_level, p.service.as_str()))
        .collect();
    assert_eq!(got, vec![(7, 3, "alpha"), (7, 5, "zeta"), (8, 3, "zeta")]);
    // Listing keeps the services apart.
    assert_eq!(t.list(&idx, &ServicePathFilter::default(), T0).len(), 4);
}

#[test]
fn service_names_are_capped_and_released() {
    let mine = gids(&["fd00::1"]);
    let mut t = ServicePathTable::new(ServicePathParams {
        max_services: 2,
        ..Default::default()
    });
    let mut nameless = flow("fd00::1", 9, "fd00::2", 1, "");
    nameless.comm = String::new();
    t.apply(
        "a",
        &mine,
        full(vec![
            flow("fd00::1", 1, "fd00::2", 1, "svc-a"),
            flow("fd00::1", 2, "fd00::2", 1, "svc-b"),
            flow("fd00::1", 3, "fd00::2", 1, "svc-c"),
            flow("fd00::1", 4, "fd00::2", 1, "svc-a"),
            flow("fd00::1", 5, "fd00::2", 1, &"x".repeat(500)),
        ]),
        T0,
    );
    let names: Vec<_> = t
        .agent_flows("a", T0)
        .into_iter()
        .map(|f| f.service)
        .collect();
    assert_eq!(names, vec!["svc-a", "svc-b", "other", "svc-a", "other"]);
    assert_eq!(t.service_count(), 2);
    assert_eq!(t.stats().services_capped, 2);
    assert!(t.is_known_service("other") && t.is_known_service("svc-b"));
    assert!(!t.is_known_service("svc-c"));
    // svc-b's only flow goes away: its slot frees up for a new name.
    t.apply(
        "a",
        &mine,
        inc(vec![nameless], vec![flow_key("fd00::1", 2)]),
        T0,
    );
    let f = t.agent_flows("a", T0);
    assert_eq!(f.last().unwrap().service, "unknown");
    assert!(!t.is_known_service("svc-b"));
    assert_eq!(t.service_count(), 2);
    assert_eq!(
        raw_service_name("", &"y".repeat(100)).len(),
        MAX_SERVICE_NAME_LEN
    );
    assert_eq!(raw_service_name(" a\nb ", "c"), "a_b");
}

#[test]
fn list_filters() {
    let idx = index(&[
        ("a", "fd00::1", "t1"),
        ("b", "fd00::2", "t2"),
        ("c", "fd00::3", "t3"),
    ]);
    let mut t = ServicePathTable::new(ServicePathParams::default());
    t.apply(
        "a",
        &gids(&["fd00::1"]),
        full(vec![flow("fd00::1", 1, "fd00::2", 1, "s1")]),
        T0,
    );
    t.apply(
        "c",
        &gids(&["fd00::3"]),
        full(vec![flow("fd00::3", 1, "fd00::1", 1, "s2")]),
        T0,
    );
    let n = |f: ServicePathFilter<'_>| t.list(&idx, &f, T0).len();
    assert_eq!(n(ServicePathFilter::default()), 2);
    assert_eq!(
        n(ServicePathFilter {
            service: "s1",
            ..Default::default()
        }),
        1
    );
    let one = g("fd00::1");
    assert_eq!(
        n(ServicePathFilter {
            gid: &one,
            ..Default::default()
        }),
        2,
        "either end"
    );
    let two = g("fd00::2");
    assert_eq!(
        n(ServicePathFilter {
            gid: &two,
            ..Default::default()
        }),
        1
    );
    assert_eq!(
        n(ServicePathFilter {
            source_tor_id: "t3",
            ..Default::default()
        }),
        1
    );
    assert_eq!(
        n(ServicePathFilter {
            source_tor_id: "t1",
            target_tor_id: "t2",
            ..Default::default()
        }),
        1
    );
    assert_eq!(
        n(ServicePathFilter {
            target_tor_id: "t9",
            ..Default::default()
        }),
        0
    );
}
