//! Tests of `service.rs`.

use super::*;
use rpingmesh_service_tracer::EventSource;

fn flow(qpn: u32, comm: &str) -> ServiceFlow {
    ServiceFlow {
        key: FlowKey {
            local_gid: std::net::Ipv4Addr::new(127, 0, 5, 1)
                .to_ipv6_mapped()
                .octets(),
            local_qpn: qpn,
        },
        device: "udp0".into(),
        port: 1,
        sgid_index: 0,
        remote_gid: "fe80::2".parse::<Ipv6Addr>().unwrap().octets(),
        remote_qpn: 0x777,
        flow_label: 0x5a5a5,
        sl: 4,
        traffic_class: 96,
        hop_limit: 64,
        qp_type: 2,
        pid: 4242,
        comm: comm.into(),
        cgroup_id: 99,
        first_seen_ns: 1_000,
        last_seen_ns: 2_000,
        source: EventSource::Uprobe,
    }
}

#[test]
fn flow_mapping() {
    let mut m = BTreeMap::new();
    m.insert("python3".to_string(), "training".to_string());
    let names = ServiceNames::new(m);
    let proc_of = |f: &ServiceFlow| Workload::process(&f.comm);
    let f = flow(0x345, "python3");
    let p = to_proto_flow(&f, &names, 1_700_000_000_000_000_000, &proc_of(&f));
    assert_eq!(p.local_gid, "0000:0000:0000:0000:0000:ffff:7f00:0501");
    assert_eq!(p.remote_gid, "fe80:0000:0000:0000:0000:0000:0000:0002");
    assert_eq!(
        (p.local_qpn, p.remote_qpn, p.flow_label),
        (0x345, 0x777, 0x5a5a5)
    );
    assert_eq!((p.traffic_class, p.service_level), (96, 4));
    assert_eq!((p.pid, p.cgroup_id, p.comm.as_str()), (4242, 99, "python3"));
    assert_eq!(p.first_seen_unix_ns, 1_700_000_000_000_001_000);
    assert_eq!(p.last_seen_unix_ns, 1_700_000_000_000_002_000);
    assert_eq!(
        p.service, "training",
        "configured name wins over the process"
    );
    assert_eq!(p.workload.unwrap().kind, "process");
    let f = flow(1, "nccl");
    let p = to_proto_flow(&f, &names, 0, &proc_of(&f));
    assert_eq!(p.service, "nccl", "else the comm");
    // A negative offset never underflows.
    let f = flow(1, "x");
    assert_eq!(
        to_proto_flow(&f, &names, -5_000, &proc_of(&f)).first_seen_unix_ns,
        0
    );
    let k = to_proto_key(&flow(7, "x").key);
    assert_eq!(
        (k.local_gid.as_str(), k.local_qpn),
        ("0000:0000:0000:0000:0000:ffff:7f00:0501", 7)
    );
}

#[test]
fn boot_offset_is_plausible() {
    let off = boot_to_unix_offset_ns();
    // Booted after 2020 and before now.
    assert!(off > 1_577_836_800_000_000_000, "{off}");
    assert!((off as u64) < rpingmesh_verbs::clock::realtime_ns());
}

#[test]
fn service_name_cap() {
    let mut c = ServiceNameCap::new(2);
    assert_eq!(c.attribute("a"), "a");
    assert_eq!(c.attribute("b"), "b");
    assert_eq!(c.attribute("c"), OTHER_SERVICE);
    assert_eq!(c.attribute("a"), "a", "names already admitted stay");
    assert_eq!(c.attribute("d"), OTHER_SERVICE);
    assert_eq!(c.len(), 2);
    let mut c = ServiceNameCap::new(1);
    assert_eq!(c.attribute(" "), UNKNOWN_SERVICE);
    assert_eq!(c.attribute("x"), OTHER_SERVICE);
}

fn map(f: &ServiceFlow) -> ProtoFlow {
    to_proto_flow(f, &ServiceNames::default(), 0, &Workload::process(&f.comm))
}

#[test]
fn a_job_names_the_service_and_a_configured_name_only_what_is_in_none() {
    let mut m = BTreeMap::new();
    m.insert("python3".to_string(), "training".to_string());
    let names = ServiceNames::new(m);
    let job = crate::workload::cgroup::parse_path(
        "/system.slice/slurmstepd.scope/job_12/step_0/user/task_0",
    )
    .unwrap();
    assert_eq!(service_name(&job, &names, "python3"), "slurm/12");
    let path = crate::workload::cgroup::parse_path("/batch/run7").unwrap();
    assert_eq!(service_name(&path, &names, "python3"), "training");
    assert_eq!(service_name(&path, &names, "bash"), "/batch/run7");
    let p = to_proto_flow(&flow(1, "python3"), &names, 0, &job);
    let w = p.workload.unwrap();
    assert_eq!(
        (
            p.service.as_str(),
            w.kind.as_str(),
            w.id.as_str(),
            w.part.as_str()
        ),
        ("slurm/12", "slurm_job", "12", "0")
    );
}

fn incr(changes: Vec<FlowChange>) -> ChangeBatch {
    ChangeBatch {
        full: false,
        changes,
    }
}

#[test]
fn reporter_initial_full_then_incremental_and_heartbeat() {
    let mut st = FlowReportState::new();
    assert!(st.needs_full());
    // First report: full sync from the snapshot, whatever the batch says.
    let r = st.build(
        "a1",
        incr(vec![FlowChange::Upsert(flow(1, "x"))]),
        || vec![flow(1, "x"), flow(2, "y")],
        map,
    );
    assert!(r.full_sync);
    assert_eq!(r.agent_id, "a1");
    assert_eq!(
        r.upserts.iter().map(|u| u.local_qpn).collect::<Vec<_>>(),
        [1, 2]
    );
    assert!(r.removals.is_empty());
    assert_eq!(
        st.on_outcome(SendOutcome::Acked {
            resync_required: false
        }),
        AfterSend::Wait
    );
    assert!(!st.needs_full());
    // Then incremental: upserts and removals, no snapshot taken.
    let r = st.build(
        "a1",
        incr(vec![
            FlowChange::Upsert(flow(3, "z")),
            FlowChange::Remove(flow(1, "x").key),
        ]),
        || panic!("no snapshot for an incremental report"),
        map,
    );
    assert!(!r.full_sync);
    assert_eq!(r.upserts.len(), 1);
    assert_eq!(r.upserts[0].local_qpn, 3);
    assert_eq!(r.removals.len(), 1);
    assert_eq!(r.removals[0].local_qpn, 1);
    assert_eq!(
        st.on_outcome(SendOutcome::Acked {
            resync_required: false
        }),
        AfterSend::Wait
    );
    // Nothing changed: an empty heartbeat.
    let r = st.build("a1", ChangeBatch::default(), || panic!("no snapshot"), map);
    assert!(!r.full_sync && r.upserts.is_empty() && r.removals.is_empty());
    assert_eq!(
        st.on_outcome(SendOutcome::Acked {
            resync_required: false
        }),
        AfterSend::Wait
    );
    assert_eq!((st.reports(), st.full_syncs()), (3, 1));
}

#[test]
fn empty_reports_go_out_only_as_heartbeats() {
    let hb = HEARTBEAT_NS;
    let mut st = FlowReportState::new();
    // Before the first full sync is acknowledged, always send.
    assert!(st.wants_send(&ChangeBatch::default(), 0, hb));
    st.build("a", ChangeBatch::default(), Vec::new, map);
    st.on_outcome(SendOutcome::Acked {
        resync_required: false,
    });
    st.acked_at(1_000);
    // Nothing to say and the heartbeat not due: skip.
    assert!(!st.wants_send(&ChangeBatch::default(), 1_000 + hb - 1, hb));
    // A change goes out at once; so does a full batch.
    assert!(st.wants_send(&incr(vec![FlowChange::Upsert(flow(1, "x"))]), 2_000, hb));
    assert!(st.wants_send(
        &ChangeBatch {
            full: true,
            changes: Vec::new()
        },
        2_000,
        hb
    ));
    // The heartbeat comes due.
    assert!(st.wants_send(&ChangeBatch::default(), 1_000 + hb, hb));
    // Changes taken but not sent (registration failed): a full sync is owed.
    st.require_full();
    assert!(st.wants_send(&ChangeBatch::default(), 1_001, hb));
    assert!(st.needs_full());
}

#[test]
fn reporter_resyncs_on_request_not_found_failure_and_overflow() {
    let mut st = FlowReportState::new();
    st.build("a", ChangeBatch::default(), Vec::new, map);
    st.on_outcome(SendOutcome::Acked {
        resync_required: false,
    });

    // The controller restarted and lost our flows: resync at once.
    st.build("a", ChangeBatch::default(), || panic!(), map);
    assert_eq!(
        st.on_outcome(SendOutcome::Acked {
            resync_required: true
        }),
        AfterSend::ResendFull
    );
    let r = st.build("a", ChangeBatch::default(), || vec![flow(5, "x")], map);
    assert!(r.full_sync);
    assert_eq!(r.upserts.len(), 1);
    st.on_outcome(SendOutcome::Acked {
        resync_required: false,
    });

    // NotFound: re-register, then full.
    st.build(
        "a",
        incr(vec![FlowChange::Upsert(flow(6, "x"))]),
        || panic!(),
        map,
    );
    assert_eq!(st.on_outcome(SendOutcome::NotFound), AfterSend::Reregister);
    assert!(
        st.build(
            "a",
            ChangeBatch::default(),
            || vec![flow(5, "x"), flow(6, "x")],
            map
        )
        .full_sync
    );
    st.on_outcome(SendOutcome::Acked {
        resync_required: false,
    });

    // A lost report: its changes are gone, so the next one is full (and stays full
    // until one is acknowledged).
    st.build(
        "a",
        incr(vec![FlowChange::Remove(flow(5, "x").key)]),
        || panic!(),
        map,
    );
    assert_eq!(st.on_outcome(SendOutcome::Failed), AfterSend::Wait);
    assert!(
        st.build("a", ChangeBatch::default(), || vec![flow(6, "x")], map)
            .full_sync
    );
    assert_eq!(st.on_outcome(SendOutcome::Failed), AfterSend::Wait);
    let r = st.build("a", ChangeBatch::default(), || vec![flow(6, "x")], map);
    assert!(r.full_sync && r.upserts.len() == 1);
    st.on_outcome(SendOutcome::Acked {
        resync_required: false,
    });

    // The tracer's change log overflowed: full.
    let r = st.build(
        "a",
        ChangeBatch {
            full: true,
            changes: vec![],
        },
        || vec![flow(6, "x"), flow(7, "y")],
        map,
    );
    assert!(r.full_sync && r.upserts.len() == 2);
    st.on_outcome(SendOutcome::Acked {
        resync_required: false,
    });
    assert!(
        !st.build("a", ChangeBatch::default(), || panic!(), map)
            .full_sync
    );
}

#[test]
fn resolver_knows_only_own_devices() {
    let dir = tempfile::tempdir().unwrap();
    // A fake sysfs tree: mlx5_0 port 1 with GID index 3.
    let gids = dir.path().join("mlx5_0/ports/1/gids");
    std::fs::create_dir_all(&gids).unwrap();
    for i in 0..4 {
        let g = if i == 3 {
            "0000:0000:0000:0000:0000:ffff:0a00:0001"
        } else {
            "0000:0000:0000:0000:0000:0000:0000:0000"
        };
        std::fs::write(gids.join(i.to_string()), format!("{g}\n")).unwrap();
    }
    std::fs::write(dir.path().join("mlx5_0/ports/1/state"), "4: ACTIVE\n").unwrap();
    let mut devs = HashMap::new();
    let udp_gid = std::net::Ipv4Addr::new(127, 0, 5, 1).to_ipv6_mapped();
    devs.insert("udp0".to_string(), LocalDevice::Udp { gid: udp_gid });
    devs.insert("mlx5_0".to_string(), LocalDevice::Rdma);
    let r = AgentGidResolver::with_sysfs(devs, dir.path().to_path_buf());
    assert_eq!(r.local_gid("udp0", 1, 0), Some(udp_gid.octets()));
    assert_eq!(r.local_gid("udp0", 2, 5), Some(udp_gid.octets()));
    assert_eq!(r.local_gid("udp1", 1, 0), None, "not one of ours");
    assert_eq!(r.local_gid("fake_dev0", 1, 1), None);
    let want: Ipv6Addr = "::ffff:10.0.0.1".parse().unwrap();
    assert_eq!(r.local_gid("mlx5_0", 1, 3), Some(want.octets()));
    assert_eq!(r.local_gid("mlx5_0", 1, 9), None, "no such GID index");
    assert_eq!(r.local_gid("mlx5_0", 2, 3), None, "no such port");
}

#[test]
fn tracer_config_follows_agent_config() {
    let cfg = AgentConfig {
        tor_id: "t".into(),
        service_tracing_mode: ServiceTracingMode::Uprobe,
        service_tracing_uprobe_targets: vec!["/x/libibverbs.so.1".into()],
        ..AgentConfig::default()
    };
    let t = tracer_config(&cfg);
    assert_eq!(t.mode, TracingMode::Uprobe);
    assert_eq!(t.uprobe_targets, vec![PathBuf::from("/x/libibverbs.so.1")]);
}

#[tokio::test]
async fn mode_off_starts_nothing() {
    let cfg = AgentConfig {
        tor_id: "t".into(),
        service_tracing_mode: ServiceTracingMode::Off,
        ..AgentConfig::default()
    };
    assert!(start_tracer(&cfg, HashMap::new()).is_none());
}
