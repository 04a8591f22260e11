//! Controller replicas on a real etcd (Debian's etcd-server, started here on loopback):
//! registrations taken by one replica are served by another, agents given both replicas
//! fail over when theirs dies, a dead agent's entries expire by their lease, and an etcd
//! restarted under a stream of registrations loses none of them.

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
