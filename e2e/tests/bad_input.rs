//! Bad input from every side: garbage on the probe port, invalid RPCs, an unreachable
//! controller at agent start, a bad config key, an unavailable transport. Each gets a clear
//! error or is dropped; nothing crashes.
//!
//! Tests run in parallel threads, so each one uses its own loopback addresses.

use std::net::{Ipv4Addr, UdpSocket};
use std::time::{Duration, Instant};

use rpingmesh_e2e::*;
use rpingmesh_proto::controller_agent::{AgentRegistrationRequest, PinglistRequest, PinglistType};

fn ip(c: u8, d: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, c, d)
}

/// Sums successes of windows on path `src -> dst` that started at or after `since_ns`.
async fn successes_since(endpoint: &str, src: &str, dst: &str, since_ns: u64) -> u64 {
    let Ok(mut op) = operator(endpoint).await else {
        return 0;
    };
    dedupe(all_windows(&mut op).await.unwrap_or_default())
        .iter()
        .filter(|w| {
            w.source_gid == src && w.target_gid == dst && w.window_start_unix_ns >= since_ns
        })
        .map(|w| w.probe_success as u64)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_datagrams_are_dropped_and_probing_continues() {
    let dir = tempfile::tempdir().unwrap();
    let controller = spawn_controller(
        dir.path(),
        "controller",
        None,
        "127.0.0.1:0",
        &["--metrics-enabled", "false"],
    )
    .expect("controller");
    let caddr = controller.addr.to_string();
    let (ip1, ip2) = (ip(5, 1), ip(5, 2));
    let mut agents = Vec::new();
    for (id, a) in [("g1", ip1), ("g2", ip2)] {
        let args = AgentArgs::new(id, "tor-g", &caddr, a)
            .flag("--probe-interval-ms", 50)
            .flag("--target-probe-rate-per-second", 20)
            .flag("--pinglist-update-interval-sec", 2)
            .flag("--analysis-window-sec", 2)
            .flag("--metrics-enabled", "false");
        agents.push(spawn_agent(dir.path(), None, &args).expect("agent"));
    }
    let (g1, g2) = (gid_of(ip1), gid_of(ip2));
    let ep = controller.endpoint();
    let first = wait_for(Duration::from_secs(30), Duration::from_millis(500), || {
        let (ep, g1, g2) = (ep.clone(), g1.clone(), g2.clone());
        async move { (successes_since(&ep, &g1, &g2, 0).await > 0).then_some(()) }
    })
    .await;
    assert!(
        first.is_some(),
        "g1 -> g2 never succeeded before the garbage"
    );

    // Garbage at g2's probe port (and g1's), for a few seconds.
    let sock = UdpSocket::bind((ip(5, 9), 0)).unwrap();
    let mut bad_version = [0u8; 40];
    bad_version[0] = 9;
    let mut bad_type = [0u8; 40];
    bad_type[0] = 1;
    bad_type[1] = 7;
    let mut ack_unknown_seq = [0u8; 40];
    ack_unknown_seq[0] = 1;
    ack_unknown_seq[1] = 1;
    ack_unknown_seq[2] = 1;
    ack_unknown_seq[4..12].copy_from_slice(&0xdead_beef_0000_0001u64.to_be_bytes());
    let big = [0xabu8; 1500];
    let payloads: [&[u8]; 7] = [
        &[],
        &[1],
        &[1, 0, 0],
        &bad_version,
        &bad_type,
        &ack_unknown_seq,
        &big,
    ];
    let garbage_start = Instant::now();
    let mut sent = 0;
    while garbage_start.elapsed() < Duration::from_secs(3) {
        for p in payloads {
            for dst in [ip2, ip1] {
                if sock.send_to(p, (dst, PROBE_PORT)).is_ok() {
                    sent += 1;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(sent > 1000, "could not send garbage ({sent} datagrams)");
    let after = unix_ns_now();

    for a in agents.iter_mut() {
        assert!(
            a.alive(),
            "agent {} died from garbage datagrams:\n{}",
            a.name,
            tail_lines(&a.stderr(), 20)
        );
    }
    // Probing goes on both ways in windows that started after the garbage.
    let later = wait_for(Duration::from_secs(20), Duration::from_millis(500), || {
        let (ep, g1, g2) = (ep.clone(), g1.clone(), g2.clone());
        async move {
            let a = successes_since(&ep, &g1, &g2, after).await;
            let b = successes_since(&ep, &g2, &g1, after).await;
            (a > 0 && b > 0).then_some(())
        }
    })
    .await;
    assert!(
        later.is_some(),
        "probing did not continue after the garbage datagrams"
    );
    for a in agents.iter_mut() {
        assert!(a.alive(), "agent {} exited", a.name);
    }
}

#[tokio::test]
async fn register_without_rnics_is_invalid_argument() {
    let dir = tempfile::tempdir().unwrap();
    let controller = spawn_controller(
        dir.path(),
        "controller",
        None,
        "127.0.0.1:0",
        &["--metrics-enabled", "false"],
    )
    .expect("controller");
    let mut cc = controller_client(&controller.endpoint()).await.unwrap();
    let err = cc
        .register_agent(AgentRegistrationRequest {
            agent_version: String::new(),
            agent_id: "empty".into(),
            agent_ip: "127.0.6.1".into(),
            hostname: "empty".into(),
            tor_id: "tor-e".into(),
            rnics: vec![],
        })
        .await
        .expect_err("a registration without RNICs must be rejected");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(!err.message().is_empty(), "the rejection must say why");

    let err = cc
        .get_pinglist(PinglistRequest {
            agent_id: "nobody".into(),
            tor_id: "tor-e".into(),
            requester_gid: gid_of(ip(6, 2)),
            r#type: PinglistType::TorMesh as i32,
        })
        .await
        .expect_err("a pinglist for an unknown agent must be rejected");
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
    let mut op = operator(&controller.endpoint()).await.unwrap();
    assert!(
        list_rnics(&mut op).await.unwrap().is_empty(),
        "rejected registrations must not leave RNICs behind"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_waits_for_an_unreachable_controller() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_tcp_port(Ipv4Addr::LOCALHOST);
    let caddr = format!("127.0.0.1:{port}");
    let me = ip(7, 1);
    let args = AgentArgs::new("late", "tor-l", &caddr, me)
        .flag("--pinglist-update-interval-sec", 2)
        .flag("--metrics-enabled", "false");
    let mut agent = spawn_agent(dir.path(), None, &args).expect("agent");

    // It stays up and says what is wrong.
    let logged = {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            assert!(
                agent.alive(),
                "agent exited while the controller was unreachable:\n{}",
                tail_lines(&agent.stderr(), 20)
            );
            let log = agent.stderr();
            let hit = log.lines().find(|l| {
                let lower = l.to_ascii_lowercase();
                (lower.contains("error") || lower.contains("warn")) && l.contains(&caddr)
            });
            if let Some(l) = hit {
                break Some(l.to_string());
            }
            if Instant::now() >= deadline {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    assert!(
        logged.is_some(),
        "no warning/error naming the controller address {caddr} within 15 s:\n{}",
        tail_lines(&agent.stderr(), 20)
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(agent.alive(), "agent exited");

    // The controller appears; the agent registers without a restart.
    let controller = spawn_controller(
        dir.path(),
        "controller",
        None,
        &caddr,
        &["--metrics-enabled", "false"],
    )
    .expect("controller on the agent's address");
    let mut op = operator(&controller.endpoint()).await.unwrap();
    let gid = gid_of(me);
    let registered = wait_for(Duration::from_secs(40), Duration::from_millis(500), || {
        let (mut op, gid) = (op.clone(), gid.clone());
        async move {
            let rs = list_rnics(&mut op).await.ok()?;
            rs.iter()
                .any(|r| r.rnic.as_ref().is_some_and(|r| r.gid == gid))
                .then_some(())
        }
    })
    .await;
    assert!(
        registered.is_some(),
        "agent did not register within 40 s of the controller appearing:\n{}",
        tail_lines(&agent.stderr(), 20)
    );
    let _ = list_rnics(&mut op).await;
    assert!(agent.alive(), "agent exited");
}

#[test]
fn config_with_a_bad_key_exits_2_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agent.yaml");
    std::fs::write(
        &cfg,
        "agent_id: cfg\ntor_id: tor-c\ncontroller_addr: 127.0.0.1:1\nprobe_intervall_ms: 100\n",
    )
    .unwrap();
    let mut p = Proc::spawn(
        dir.path(),
        "agent",
        None,
        &bin(AGENT_BIN),
        &["--config".into(), cfg.display().to_string()],
    )
    .unwrap();
    let st = p
        .wait_exit(Duration::from_secs(10))
        .expect("agent with a bad config key must exit, not run");
    assert_eq!(st.code(), Some(2), "exit status: {st}\n{}", p.stderr());
    let err = p.stderr();
    let lines = non_empty_lines(&err);
    assert_eq!(
        lines.len(),
        1,
        "want exactly one line on stderr, got:\n{err}"
    );
    assert!(
        lines[0].contains("probe_intervall_ms"),
        "the error must name the bad key: {}",
        lines[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdma_transport_is_refused_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let controller = spawn_controller(
        dir.path(),
        "controller",
        None,
        "127.0.0.1:0",
        &["--metrics-enabled", "false"],
    )
    .expect("controller");
    let me = ip(8, 1);
    let mut args = AgentArgs::new("rdma", "tor-r", &controller.addr.to_string(), me)
        .flag("--metrics-enabled", "false")
        .to_args();
    // Replace the transport chosen by AgentArgs.
    let pos = args.iter().position(|a| a == "--transport").unwrap();
    args[pos + 1] = "rdma".into();
    let mut p = Proc::spawn(dir.path(), "agent", None, &bin(AGENT_BIN), &args).unwrap();
    let st = p
        .wait_exit(Duration::from_secs(10))
        .expect("agent with --transport rdma must exit on this machine");
    assert_eq!(st.code(), Some(1), "exit status: {st}\n{}", p.stderr());
    let err = p.stderr();
    let lines = non_empty_lines(&err);
    assert_eq!(
        lines.len(),
        1,
        "want exactly one line on stderr, got:\n{err}"
    );
    assert!(
        lines[0].to_ascii_lowercase().contains("rdma"),
        "the line must say the rdma transport is the problem: {}",
        lines[0]
    );
    let mut op = operator(&controller.endpoint()).await.unwrap();
    let rnics = list_rnics(&mut op).await.unwrap();
    assert!(
        rnics
            .iter()
            .all(|r| r.agent_id != "rdma" && r.rnic.as_ref().is_none_or(|r| r.gid != gid_of(me))),
        "the refused agent registered an RNIC: {rnics:?}"
    );
}
