//! Controller replicas on a real etcd (Debian's etcd-server, started here on loopback):
//! registrations taken by one replica are served by another, agents given both replicas
//! fail over when theirs dies, a dead agent's entries expire by their lease, an etcd
//! restarted under a stream of registrations loses none of them, and under mTLS replicas
//! forward over mTLS and only a replica's certificate may forward.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use rpingmesh_e2e::*;
use rpingmesh_proto::controller_agent::{
    AgentRegistrationRequest, PinglistRequest, PinglistType, RnicInfo,
};
use rpingmesh_proto::operator::RnicStatus;

const ACTIVE_SEC: u64 = 3;
const STALE_SEC: u64 = 6;

fn replica(dir: &std::path::Path, name: &str, etcd: &Etcd) -> Controller {
    spawn_controller(
        dir,
        name,
        None,
        "127.0.0.1:0",
        &[
            "--database-uri",
            &etcd.uri(),
            "--metrics-enabled",
            "false",
            "--active-threshold-sec",
            &ACTIVE_SEC.to_string(),
            "--stale-threshold-sec",
            &STALE_SEC.to_string(),
        ],
    )
    .unwrap()
}

fn status<'a>(rnics: &'a [RnicStatus], gid: &str) -> Option<&'a RnicStatus> {
    rnics
        .iter()
        .find(|r| r.rnic.as_ref().is_some_and(|i| i.gid == gid))
}

async fn rnics_at(c: &Controller) -> Vec<RnicStatus> {
    let mut op = operator(&c.endpoint()).await.unwrap();
    list_rnics(&mut op).await.unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_registrations_agents_fail_over_and_leases_expire_the_dead() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(dir.path(), "etcd").unwrap();
    let mut a = replica(dir.path(), "ctl-a", &etcd);
    let b = replica(dir.path(), "ctl-b", &etcd);
    let ips = [Ipv4Addr::new(127, 0, 7, 1), Ipv4Addr::new(127, 0, 7, 2)];
    let gids: Vec<String> = ips.iter().map(|ip| gid_of(*ip)).collect();
    // Both agents name A first: they register through A.
    let both = format!("{},{}", a.addr, b.addr);
    let mut agents: Vec<Proc> = ips
        .iter()
        .enumerate()
        .map(|(i, ip)| {
            spawn_agent(
                dir.path(),
                None,
                &AgentArgs::new(&format!("rep-{i}"), "tor-r", &both, *ip)
                    .flag("--metrics-enabled", "false")
                    .flag("--service-tracing-mode", "off")
                    .flag("--hostping-enabled", "false")
                    .flag("--pinglist-update-interval-sec", 4 * ACTIVE_SEC),
            )
            .unwrap()
        })
        .collect();

    // 1. Registered through A, served by B: B's index follows etcd.
    let seen_at_b = wait_for(Duration::from_secs(20), Duration::from_millis(100), || {
        let b = &b;
        let gids = &gids;
        async move {
            let r = rnics_at(b).await;
            gids.iter()
                .all(|g| status(&r, g).is_some_and(|s| s.active))
                .then_some(())
        }
    })
    .await;
    assert!(
        seen_at_b.is_some(),
        "B never listed the agents: {:?}",
        rnics_at(&b).await
    );
    assert!(
        a.proc.stderr().contains("agent registered"),
        "A took no registration"
    );
    let mut cb = controller_client(&b.endpoint()).await.unwrap();
    let list = cb
        .get_pinglist(PinglistRequest {
            agent_id: "rep-0".into(),
            tor_id: "tor-r".into(),
            requester_gid: gids[0].clone(),
            r#type: PinglistType::TorMesh as i32,
        })
        .await
        .unwrap()
        .into_inner();
    let targets: Vec<&str> = list.targets.iter().map(|t| t.target_gid.as_str()).collect();
    assert_eq!(
        targets,
        vec![gids[1].as_str()],
        "B's ToR-mesh list for rep-0"
    );

    // 2. A dies: the agents go on with B and never turn inactive there.
    a.proc.signal(libc::SIGKILL);
    let killed = Instant::now();
    while killed.elapsed() < Duration::from_secs(4 * ACTIVE_SEC) {
        let r = rnics_at(&b).await;
        for g in &gids {
            assert!(
                status(&r, g).is_some_and(|s| s.active),
                "{g} not active at B {:.1} s after A died: {r:?}",
                killed.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for p in &agents {
        assert!(
            p.stderr().contains("failed over to another replica"),
            "{}: no failover line",
            p.name
        );
    }

    // 3. An agent killed with -9 expires by its lease (the stale threshold) at B.
    agents[1].signal(libc::SIGKILL);
    let killed = Instant::now();
    let gone = wait_for(Duration::from_secs(30), Duration::from_millis(200), || {
        let b = &b;
        let g = gids[1].clone();
        async move { status(&rnics_at(b).await, &g).is_none().then_some(()) }
    })
    .await;
    let after = killed.elapsed().as_secs_f64();
    assert!(gone.is_some(), "the dead agent's RNIC never expired");
    assert!(
        after >= (STALE_SEC - 1) as f64 && after <= (STALE_SEC + 6) as f64,
        "expired {after:.1} s after the kill (lease TTL {STALE_SEC} s)"
    );
    assert!(status(&rnics_at(&b).await, &gids[0]).is_some_and(|s| s.active));
}

/// Registers `n` fake agents through `c`, each retried until it is taken (etcd may be
/// down meanwhile); returns the ids.
async fn register_all(endpoint: String, prefix: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let id = format!("{prefix}-{i}");
        let ip = Ipv4Addr::new(10, 9, (i / 250) as u8, (i % 250) as u8 + 1);
        let req = AgentRegistrationRequest {
            agent_id: id.clone(),
            agent_ip: ip.to_string(),
            hostname: id.clone(),
            tor_id: format!("tor-{}", i % 4),
            rnics: vec![RnicInfo {
                gid: gid_of(ip),
                qpn: 100 + i as u32,
                ip_address: ip.to_string(),
                host_name: id.clone(),
                tor_id: String::new(),
                device_name: "mlx5_0".into(),
            }],
            agent_version: "test".into(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ok = match controller_client(&endpoint).await {
                Ok(mut c) => c.register_agent(req.clone()).await.is_ok(),
                Err(_) => false,
            };
            if ok {
                break;
            }
            assert!(Instant::now() < deadline, "{id}: never registered");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        ids.push(id);
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_restarted_under_registrations_loses_none() {
    let dir = tempfile::tempdir().unwrap();
    let mut etcd = Etcd::start(dir.path(), "etcd").unwrap();
    // Long thresholds: the fake agents do not heartbeat.
    let args = |uri: String| -> Vec<String> {
        [
            "--database-uri",
            &uri,
            "--metrics-enabled",
            "false",
            "--active-threshold-sec",
            "300",
            "--stale-threshold-sec",
            "600",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let av = args(etcd.uri());
    let ar: Vec<&str> = av.iter().map(String::as_str).collect();
    let a = spawn_controller(dir.path(), "ctl-a", None, "127.0.0.1:0", &ar).unwrap();
    let b = spawn_controller(dir.path(), "ctl-b", None, "127.0.0.1:0", &ar).unwrap();
    const N: usize = 150;
    let load = tokio::spawn(register_all(a.endpoint(), "load", N));
    // etcd goes down in the middle of the stream and comes back.
    let first = wait_for(Duration::from_secs(30), Duration::from_millis(50), || {
        let a = &a;
        async move { (rnics_at(a).await.len() >= N / 3).then_some(()) }
    })
    .await;
    assert!(first.is_some(), "the registrations did not start");
    let down = tokio::task::spawn_blocking(move || {
        etcd.proc.signal(libc::SIGKILL);
        etcd.proc.wait_exit(Duration::from_secs(10));
        std::thread::sleep(Duration::from_secs(2));
        etcd.restart().unwrap();
        etcd
    });
    let ids = load.await.unwrap();
    let _etcd = down.await.unwrap();
    // Every registration is at both replicas: A's and B's watches came back.
    for c in [&a, &b] {
        let all = wait_for(
            Duration::from_secs(30),
            Duration::from_millis(200),
            || async {
                let r = rnics_at(c).await;
                (r.len() == ids.len()).then_some(())
            },
        )
        .await;
        let r = rnics_at(c).await;
        assert!(
            all.is_some(),
            "{} lists {} of {} registrations after the etcd restart",
            c.proc.name,
            r.len(),
            ids.len()
        );
    }
    assert!(
        a.proc.stderr().contains("watching the agents again")
            || b.proc.stderr().contains("watching the agents again"),
        "no replica noticed the restart"
    );
}

const LEADER_TTL_SEC: u64 = 3;
/// The fake hosts of the leader test: one RNIC each on one ToR; the last one breaks.
const HOSTS: usize = 4;

fn host_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 8, 0, i as u8 + 1)
}

/// One second's window of every path from host `src`: the paths to or from the broken
/// host lose every probe while `broken`.
fn window_of(
    src: usize,
    start_ns: u64,
    broken: bool,
) -> Vec<rpingmesh_proto::controller_agent::PathSummary> {
    (0..HOSTS)
        .filter(|&d| d != src)
        .map(|d| {
            let lost = broken && (src == HOSTS - 1 || d == HOSTS - 1);
            rpingmesh_proto::controller_agent::PathSummary {
                source_gid: gid_of(host_ip(src)),
                source_tor_id: "tor-x".into(),
                target_gid: gid_of(host_ip(d)),
                target_tor_id: "tor-x".into(),
                target_qpn: 1,
                window_start_unix_ns: start_ns,
                window_duration_ms: 1000,
                probe_total: 20,
                probe_success: if lost { 0 } else { 20 },
                probe_failed: if lost { 20 } else { 0 },
                network_rtt_p50_ns: if lost { 0 } else { 10_000 },
                network_rtt_p99_ns: if lost { 0 } else { 20_000 },
                pinglist_type: PinglistType::TorMesh as i32,
                ..Default::default()
            }
        })
        .collect()
}

async fn rnic_findings(c: &Controller) -> Vec<rpingmesh_proto::operator::Finding> {
    let Ok(mut op) = operator(&c.endpoint()).await else {
        return Vec::new();
    };
    op.list_findings(rpingmesh_proto::operator::ListFindingsRequest {
        resolved_limit: 0,
        kind: "rnic".into(),
    })
    .await
    .map(|r| r.into_inner().findings)
    .unwrap_or_default()
}

/// Two replicas analyze as one: the first one elected leads, path reports sent to the
/// other are forwarded to it, and when the leader dies the other takes over within one
/// lease TTL with the stored findings: the open finding goes on under its id, is not
/// opened a second time, and resolves there when the fault ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_dies_and_the_other_replica_continues_its_findings() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(dir.path(), "etcd").unwrap();
    let args: Vec<String> = [
        "--database-uri".to_string(),
        etcd.uri(),
        "--metrics-enabled".into(),
        "false".into(),
        "--active-threshold-sec".into(),
        "300".into(),
        "--stale-threshold-sec".into(),
        "600".into(),
        "--analyzer-localize-settle-sec".into(),
        "1".into(),
        "--leader-lease-ttl-sec".into(),
        LEADER_TTL_SEC.to_string(),
    ]
    .to_vec();
    let ar: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut a = spawn_controller(dir.path(), "ctl-a", None, "127.0.0.1:0", &ar).unwrap();
    let led = wait_for(Duration::from_secs(20), Duration::from_millis(100), || {
        let a = &a;
        async move {
            a.proc
                .stderr()
                .contains("now the analysis leader")
                .then_some(())
        }
    })
    .await;
    assert!(led.is_some(), "A never led:\n{}", a.proc.stderr());
    let b = spawn_controller(dir.path(), "ctl-b", None, "127.0.0.1:0", &ar).unwrap();

    // The hosts register through B and report to B only.
    let mut cb = controller_client(&b.endpoint()).await.unwrap();
    for i in 0..HOSTS {
        let ip = host_ip(i);
        cb.register_agent(AgentRegistrationRequest {
            agent_id: format!("lh{i}"),
            agent_ip: ip.to_string(),
            hostname: format!("lh{i}"),
            tor_id: "tor-x".into(),
            rnics: vec![RnicInfo {
                gid: gid_of(ip),
                qpn: 1,
                ip_address: ip.to_string(),
                host_name: format!("lh{i}"),
                tor_id: String::new(),
                device_name: "mlx5_0".into(),
            }],
            agent_version: "test".into(),
        })
        .await
        .unwrap();
    }
    let broken = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let reporter = {
        let (broken, endpoint) = (broken.clone(), b.endpoint());
        tokio::spawn(async move {
            let mut c = controller_client(&endpoint).await.unwrap();
            loop {
                let now = unix_ns_now();
                let start = (now / 1_000_000_000 - 1) * 1_000_000_000;
                let bad = broken.load(std::sync::atomic::Ordering::SeqCst);
                for src in 0..HOSTS {
                    let _ = c
                        .report_probe_analysis(
                            rpingmesh_proto::controller_agent::ProbeAnalysisReport {
                                agent_id: format!("lh{src}"),
                                summaries: window_of(src, start, bad),
                                ..Default::default()
                            },
                        )
                        .await;
                }
                let next = (now / 1_000_000_000 + 1) * 1_000_000_000 + 50_000_000;
                tokio::time::sleep(Duration::from_nanos(next - unix_ns_now().min(next))).await;
            }
        })
    };
    let location = format!("lh{}/mlx5_0", HOSTS - 1);

    // 1. A (the leader) opens the finding from reports B forwarded.
    let opened = wait_for(Duration::from_secs(30), Duration::from_millis(200), || {
        let (a, location) = (&a, &location);
        async move {
            rnic_findings(a)
                .await
                .into_iter()
                .find(|f| f.open && f.location == *location)
        }
    })
    .await
    .unwrap_or_else(|| panic!("A opened no finding:\n{}", a.proc.stderr()));
    assert!(!b.proc.stderr().contains("now the analysis leader"));
    // B answers finding queries from the store.
    let at_b = rnic_findings(&b).await;
    assert!(at_b.iter().any(|f| f.id == opened.id && f.open), "{at_b:?}");
    // and sends watchers to the leader, whose findings are the ones that move.
    let mut opb = operator(&b.endpoint()).await.unwrap();
    let e = opb
        .watch_findings(rpingmesh_proto::operator::WatchFindingsRequest::default())
        .await
        .expect_err("a follower refuses WatchFindings");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
    assert!(e.message().contains(&a.addr.to_string()), "{e}");

    // An operator silences the finding and drains lh0 at A: B, a follower, applies the
    // drain to the pinglists it serves within its refresh.
    let mut opa = operator(&a.endpoint()).await.unwrap();
    opa.silence(rpingmesh_proto::operator::SilenceRequest {
        finding_id: opened.id,
        duration_sec: 600,
        reason: "known".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    opa.drain(rpingmesh_proto::operator::DrainRequest {
        host: "lh0".into(),
        reason: "maintenance".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let lh0 = gid_of(host_ip(0));
    let drained_at_b = wait_for(Duration::from_secs(10), Duration::from_millis(200), || {
        let (mut cb, lh0) = (cb.clone(), lh0.clone());
        async move {
            let t = cb
                .get_pinglist(rpingmesh_proto::controller_agent::PinglistRequest {
                    agent_id: "lh1".into(),
                    tor_id: "tor-x".into(),
                    requester_gid: gid_of(host_ip(1)),
                    r#type: rpingmesh_proto::controller_agent::PinglistType::TorMesh as i32,
                })
                .await
                .ok()?
                .into_inner()
                .targets;
            (!t.is_empty() && t.iter().all(|t| t.target_gid != lh0)).then_some(())
        }
    })
    .await;
    assert!(drained_at_b.is_some(), "B still lists the drained lh0");

    // 2. A dies: B leads within one lease TTL and takes the finding over.
    a.proc.signal(libc::SIGKILL);
    let killed = Instant::now();
    let took_over = wait_for(Duration::from_secs(20), Duration::from_millis(100), || {
        let b = &b;
        async move {
            b.proc
                .stderr()
                .contains("now the analysis leader")
                .then_some(())
        }
    })
    .await;
    let after = killed.elapsed().as_secs_f64();
    assert!(took_over.is_some(), "B never led:\n{}", b.proc.stderr());
    assert!(
        after <= LEADER_TTL_SEC as f64 + 1.5,
        "B led {after:.1} s after A died (lease TTL {LEADER_TTL_SEC} s)"
    );
    eprintln!("etcd: B led {after:.1} s after the leader died");
    // Three more broken windows analyzed at B: still that one finding, open.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mine: Vec<_> = rnic_findings(&b)
        .await
        .into_iter()
        .filter(|f| f.location == location)
        .collect();
    assert_eq!(mine.len(), 1, "{mine:?}");
    assert!(mine[0].id == opened.id && mine[0].open, "{mine:?}");
    assert!(
        mine[0].last_seen_unix_ns > opened.last_seen_unix_ns,
        "not updated at B: {mine:?}"
    );
    // The operator's actions hold at the new leader.
    assert_eq!(mine[0].suppressed, "silenced", "{mine:?}");
    let acts = opb
        .list_actions(rpingmesh_proto::operator::ListActionsRequest {})
        .await
        .unwrap()
        .into_inner()
        .actions;
    assert_eq!(acts.len(), 2, "{acts:?}");

    // 3. The fault ends: B resolves the same finding.
    broken.store(false, std::sync::atomic::Ordering::SeqCst);
    let resolved = wait_for(Duration::from_secs(20), Duration::from_millis(200), || {
        let (b, location) = (&b, &location);
        async move {
            let mine: Vec<_> = rnic_findings(b)
                .await
                .into_iter()
                .filter(|f| f.location == *location)
                .collect();
            (mine.len() == 1 && !mine[0].open).then_some(mine[0].clone())
        }
    })
    .await;
    let last = rnic_findings(&b).await;
    let resolved = resolved.unwrap_or_else(|| panic!("B did not resolve it: {last:?}"));
    assert_eq!(resolved.id, opened.id);
    reporter.abort();
}

/// Service flows reported to one replica reach the other through etcd: its service-path
/// view lists them and its SERVICE pinglist for the agent holds the remote end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_flows_reported_to_one_replica_are_served_by_the_other() {
    use rpingmesh_proto::controller_agent::{ServiceFlow, ServiceFlowReport};
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(dir.path(), "etcd").unwrap();
    let a = replica(dir.path(), "ctl-a", &etcd);
    let b = replica(dir.path(), "ctl-b", &etcd);
    let mut ca = controller_client(&a.endpoint()).await.unwrap();
    let (src, dst) = (Ipv4Addr::new(10, 7, 0, 1), Ipv4Addr::new(10, 7, 1, 1));
    for (id, ip, tor) in [("svc-src", src, "tor-s"), ("svc-dst", dst, "tor-d")] {
        ca.register_agent(AgentRegistrationRequest {
            agent_id: id.into(),
            agent_ip: ip.to_string(),
            hostname: id.into(),
            tor_id: tor.into(),
            rnics: vec![RnicInfo {
                gid: gid_of(ip),
                qpn: 7,
                ip_address: ip.to_string(),
                host_name: id.into(),
                tor_id: String::new(),
                device_name: "mlx5_0".into(),
            }],
            agent_version: "test".into(),
        })
        .await
        .unwrap();
    }
    let now = unix_ns_now();
    ca.report_service_flows(ServiceFlowReport {
        agent_id: "svc-src".into(),
        full_sync: true,
        upserts: vec![ServiceFlow {
            local_gid: gid_of(src),
            local_qpn: 100,
            remote_gid: gid_of(dst),
            remote_qpn: 200,
            comm: "trainer".into(),
            service: "allreduce".into(),
            first_seen_unix_ns: now,
            last_seen_unix_ns: now,
            ..Default::default()
        }],
        removals: vec![],
    })
    .await
    .unwrap();
    let at_b = wait_for(Duration::from_secs(10), Duration::from_millis(100), || {
        let b = &b;
        async move {
            let mut op = operator(&b.endpoint()).await.ok()?;
            let paths = op
                .list_service_paths(rpingmesh_proto::operator::ListServicePathsRequest::default())
                .await
                .ok()?
                .into_inner()
                .paths;
            paths
                .iter()
                .any(|p| p.source_agent_id == "svc-src" && p.monitored && p.service == "allreduce")
                .then_some(())
        }
    })
    .await;
    assert!(
        at_b.is_some(),
        "B never listed the service path:\n{}",
        b.proc.stderr()
    );
    let mut cb = controller_client(&b.endpoint()).await.unwrap();
    let list = cb
        .get_pinglist(PinglistRequest {
            agent_id: "svc-src".into(),
            tor_id: "tor-s".into(),
            requester_gid: gid_of(src),
            r#type: PinglistType::Service as i32,
        })
        .await
        .unwrap()
        .into_inner();
    let targets: Vec<&str> = list.targets.iter().map(|t| t.target_gid.as_str()).collect();
    assert_eq!(targets, vec![gid_of(dst).as_str()]);
}

/// Under mTLS, a follower forwards an agent's path report to the leader over mTLS with its
/// replica certificate; a certificate that is not a replica's cannot pass another agent's
/// report off as forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_forward_over_mtls_and_only_replicas_forward() {
    use rpingmesh_e2e::pki::{make_pki, mtls_channel, CertSpec};
    use rpingmesh_proto::controller_agent::controller_service_client::ControllerServiceClient;
    use rpingmesh_proto::operator::operator_service_client::OperatorServiceClient;
    use rpingmesh_proto::operator::ListPathsRequest;

    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let replica_ext = "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth";
    let agent = |name| CertSpec {
        name,
        subject: "/CN=x",
        extensions: match name {
            "lh0" => "subjectAltName=DNS:lh0",
            _ => "subjectAltName=DNS:ctl-x",
        },
    };
    make_pki(
        d,
        &[
            CertSpec {
                name: "ctl-a",
                subject: "/CN=ctl-a",
                extensions: replica_ext,
            },
            CertSpec {
                name: "ctl-b",
                subject: "/CN=ctl-b",
                extensions: replica_ext,
            },
            agent("lh0"),
            agent("ctl-x"),
        ],
    )
    .unwrap();
    let etcd = Etcd::start(d, "etcd").unwrap();
    let f = |n: &str| d.join(n).display().to_string();
    let args = |me: &str| -> Vec<String> {
        [
            "--database-uri",
            &etcd.uri(),
            "--metrics-enabled",
            "false",
            "--leader-lease-ttl-sec",
            &LEADER_TTL_SEC.to_string(),
            "--tls-mode",
            "mtls",
            "--tls-cert-file",
            &f(&format!("{me}.pem")),
            "--tls-key-file",
            &f(&format!("{me}.key")),
            "--tls-ca-file",
            &f("ca.pem"),
            "--tls-replica-identities",
            "ctl-a,ctl-b",
        ]
        .map(String::from)
        .to_vec()
    };
    let spawn = |me: &str| {
        let a = args(me);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        spawn_controller(d, me, None, "127.0.0.1:0", &a).unwrap()
    };
    let a = spawn("ctl-a");
    let led = wait_for(Duration::from_secs(20), Duration::from_millis(100), || {
        let a = &a;
        async move {
            a.proc
                .stderr()
                .contains("now the analysis leader")
                .then_some(())
        }
    })
    .await;
    assert!(led.is_some(), "A never led:\n{}", a.proc.stderr());
    let b = spawn("ctl-b");

    let ip = host_ip(0);
    let mut lh0 =
        ControllerServiceClient::new(mtls_channel(b.addr, d, "lh0", "127.0.0.1").await.unwrap());
    lh0.register_agent(AgentRegistrationRequest {
        agent_id: "lh0".into(),
        hostname: "lh0".into(),
        tor_id: "tor-x".into(),
        rnics: vec![RnicInfo {
            gid: gid_of(ip),
            device_name: "mlx5_0".into(),
            ..Default::default()
        }],
        ..Default::default()
    })
    .await
    .unwrap();
    let start = (unix_ns_now() / 1_000_000_000 - 2) * 1_000_000_000;
    let report = |agent: &str, start: u64| rpingmesh_proto::controller_agent::ProbeAnalysisReport {
        agent_id: agent.into(),
        summaries: window_of(0, start, false),
        ..Default::default()
    };
    let ack = lh0
        .report_probe_analysis(report("lh0", start))
        .await
        .unwrap()
        .into_inner();
    assert!(ack.accepted);

    // The leader has the path B forwarded.
    let mut op_a =
        OperatorServiceClient::new(mtls_channel(a.addr, d, "ctl-x", "127.0.0.1").await.unwrap());
    let paths = |op: &mut OperatorServiceClient<_>| {
        let mut op = op.clone();
        async move {
            op.list_paths(ListPathsRequest {
                source_gid: gid_of(ip),
                all_windows: true,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .paths
            .iter()
            .map(|p| p.window_start_unix_ns)
            .collect::<Vec<_>>()
        }
    };
    let at_a = paths(&mut op_a).await;
    assert!(
        at_a.contains(&start),
        "the leader has no forwarded path: {at_a:?}\nB:\n{}",
        b.proc.stderr()
    );
    assert!(!b
        .proc
        .stderr()
        .contains("forwarding a path report to the analysis leader failed"));

    // Not a replica: another agent's report sent straight to the leader is refused.
    let mut x =
        ControllerServiceClient::new(mtls_channel(a.addr, d, "ctl-x", "127.0.0.1").await.unwrap());
    let e = x
        .report_probe_analysis(report("lh0", start + 1_000_000_000))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
    assert!(
        e.message().contains("certificate names agent \"ctl-x\""),
        "{e}"
    );
    // A replica's certificate may.
    let mut rb =
        ControllerServiceClient::new(mtls_channel(a.addr, d, "ctl-b", "127.0.0.1").await.unwrap());
    let next = start + 1_000_000_000;
    assert!(
        rb.report_probe_analysis(report("lh0", next))
            .await
            .unwrap()
            .into_inner()
            .accepted
    );
    let at_a = paths(&mut op_a).await;
    assert!(at_a.contains(&next), "{at_a:?}");

    // The audit trail is one for the replicas: B took lh0's registration, A refused
    // ctl-x; each replica lists both (written to etcd within a second).
    for (name, addr) in [("A", a.addr), ("B", b.addr)] {
        let mut op =
            OperatorServiceClient::new(mtls_channel(addr, d, "ctl-x", "127.0.0.1").await.unwrap());
        let both = wait_for(Duration::from_secs(10), Duration::from_millis(200), || {
            let mut op = op.clone();
            async move {
                let e = op
                    .list_audit(rpingmesh_proto::operator::ListAuditRequest { limit: 50 })
                    .await
                    .unwrap()
                    .into_inner()
                    .entries;
                let registered = e.iter().any(|e| {
                    (
                        e.who.as_str(),
                        e.role.as_str(),
                        e.rpc.as_str(),
                        e.result.as_str(),
                    ) == ("lh0", "agent", "RegisterAgent", "ok")
                });
                let refused = e.iter().any(|e| {
                    e.who == "ctl-x"
                        && e.rpc == "ReportProbeAnalysis"
                        && e.result.starts_with("denied: ")
                });
                (registered && refused).then_some(e)
            }
        })
        .await;
        let entries = both.unwrap_or_else(|| panic!("replica {name}'s audit trail misses lines"));
        assert!(
            entries
                .windows(2)
                .all(|w| w[0].time_unix_ns >= w[1].time_unix_ns),
            "newest first: {entries:?}"
        );
        op.list_audit(rpingmesh_proto::operator::ListAuditRequest { limit: 1 })
            .await
            .map(|r| assert_eq!(r.into_inner().entries.len(), 1))
            .unwrap();
    }
}
