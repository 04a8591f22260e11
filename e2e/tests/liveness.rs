//! Liveness over many threshold periods: a controller with a 3 s active and 6 s stale
//! threshold and three agents on loopback. Live agents heartbeat (the controller asks for
//! one per second, a third of the active threshold), so their RNICs stay active and their
//! paths stay probed for ten active periods; an agent killed with -9 goes inactive after
//! about the active threshold and is removed after about the stale threshold.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use rpingmesh_e2e::*;
use rpingmesh_proto::operator::RnicStatus;

const ACTIVE_SEC: u64 = 3;
const STALE_SEC: u64 = 6;
const IPS: [Ipv4Addr; 3] = [
    Ipv4Addr::new(127, 0, 6, 1),
    Ipv4Addr::new(127, 0, 6, 2),
    Ipv4Addr::new(127, 0, 6, 3),
];
/// Ten active-threshold periods of watching.
const WATCH: Duration = Duration::from_secs(10 * ACTIVE_SEC);
const WINDOW_SEC: u64 = 2;

fn active_of(rnics: &[RnicStatus], gid: &str) -> Option<bool> {
    rnics
        .iter()
        .find(|r| r.rnic.as_ref().is_some_and(|i| i.gid == gid))
        .map(|r| r.active)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_agents_stay_active_and_a_killed_one_goes_inactive_then_stale() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = spawn_controller(
        dir.path(),
        "controller",
        None,
        "127.0.0.1:0",
        &[
            "--metrics-enabled",
            "false",
            "--active-threshold-sec",
            &ACTIVE_SEC.to_string(),
            "--stale-threshold-sec",
            &STALE_SEC.to_string(),
        ],
    )
    .unwrap();
    let ep = ctl.endpoint();
    let mut agents: Vec<Proc> = IPS
        .iter()
        .enumerate()
        .map(|(i, ip)| {
            spawn_agent(
                dir.path(),
                None,
                &AgentArgs::new(&format!("live-{i}"), "tor-l", &ctl.addr.to_string(), *ip)
                    .flag("--metrics-enabled", "false")
                    .flag("--service-tracing-mode", "off")
                    // Longer than the active threshold: pinglist fetches alone would
                    // not keep the agents active; the heartbeat must.
                    .flag("--pinglist-update-interval-sec", 2 * ACTIVE_SEC)
                    .flag("--analysis-window-sec", WINDOW_SEC)
                    .flag("--probe-interval-ms", 200),
            )
            .unwrap()
        })
        .collect();
    let gids: Vec<String> = IPS.iter().map(|ip| gid_of(*ip)).collect();
    let mut op = operator(&ep).await.unwrap();
    let all = wait_for(Duration::from_secs(20), Duration::from_millis(200), || {
        let mut op = op.clone();
        async move {
            let r = list_rnics(&mut op).await.ok()?;
            (r.len() == IPS.len() && r.iter().all(|r| r.active)).then_some(())
        }
    })
    .await;
    assert!(all.is_some(), "agents did not all register");

    // Every sample over ten active periods: every RNIC active.
    let watch_from = unix_ns_now();
    let started = Instant::now();
    let mut samples = 0;
    while started.elapsed() < WATCH {
        let r = list_rnics(&mut op).await.unwrap();
        for g in &gids {
            assert_eq!(
                active_of(&r, g),
                Some(true),
                "{g} not active {:.1} s into the watch: {r:?}",
                started.elapsed().as_secs_f64()
            );
        }
        samples += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(samples >= 40, "{samples} samples");
    // Every path probed all along: its windows leave no gap.
    let windows = dedupe(all_windows(&mut op).await.unwrap());
    for s in &gids {
        for t in &gids {
            if s == t {
                continue;
            }
            let mut starts: Vec<u64> = windows
                .iter()
                .filter(|w| {
                    w.source_gid == *s && w.target_gid == *t && w.window_start_unix_ns >= watch_from
                })
                .map(|w| w.window_start_unix_ns)
                .collect();
            starts.sort_unstable();
            // The last windows may still be open or on their way (reports go out a few
            // seconds after a window closes).
            let span = WATCH.as_secs() / WINDOW_SEC;
            assert!(
                starts.len() as u64 >= span - 4,
                "{s} -> {t}: {} windows in {span} periods",
                starts.len()
            );
            for w in starts.windows(2) {
                assert!(
                    w[1] - w[0] <= WINDOW_SEC * 1_000_000_000,
                    "{s} -> {t}: a gap in probing between windows {} and {}",
                    w[0],
                    w[1]
                );
            }
        }
    }

    // Kill one agent: inactive after about the active threshold, gone after the stale one.
    let victim = gids[2].clone();
    agents[2].signal(libc::SIGKILL);
    let killed = Instant::now();
    let inactive = wait_for(Duration::from_secs(20), Duration::from_millis(100), || {
        let mut op = op.clone();
        let g = victim.clone();
        async move {
            let r = list_rnics(&mut op).await.ok()?;
            (active_of(&r, &g) == Some(false)).then_some(())
        }
    })
    .await;
    let to_inactive = killed.elapsed();
    assert!(inactive.is_some(), "{victim} never went inactive");
    let gone = wait_for(Duration::from_secs(30), Duration::from_millis(100), || {
        let mut op = op.clone();
        let g = victim.clone();
        async move {
            let r = list_rnics(&mut op).await.ok()?;
            active_of(&r, &g).is_none().then_some(())
        }
    })
    .await;
    let to_gone = killed.elapsed();
    assert!(gone.is_some(), "{victim} never removed");
    // Thresholds are whole seconds of the last heartbeat (up to 1 s before the kill);
    // the stale sweep runs every second here.
    let secs = |d: Duration| d.as_secs_f64();
    assert!(
        secs(to_inactive) >= (ACTIVE_SEC - 1) as f64
            && secs(to_inactive) <= (ACTIVE_SEC + 2) as f64,
        "inactive {:.1} s after the kill (active threshold {ACTIVE_SEC} s)",
        secs(to_inactive)
    );
    assert!(
        secs(to_gone) >= (STALE_SEC - 1) as f64 && secs(to_gone) <= (STALE_SEC + 3) as f64,
        "removed {:.1} s after the kill (stale threshold {STALE_SEC} s)",
        secs(to_gone)
    );
    // The survivors are still active.
    let r = list_rnics(&mut op).await.unwrap();
    for g in &gids[..2] {
        assert_eq!(active_of(&r, g), Some(true), "{g}: {r:?}");
    }
}

/// An agent that starts before its controller waits out its registration backoff, and its
/// heartbeat loop starts before any controller has named an interval. The first
/// registration's interval (a third of the active threshold) must take over from the
/// Go default of 60 s at once; pinglist fetches, four active periods apart here, cannot
/// keep it active on their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_started_before_its_controller_heartbeats_at_the_controllers_pace() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let ip = Ipv4Addr::new(127, 0, 6, 9);
    let _agent = spawn_agent(
        dir.path(),
        None,
        &AgentArgs::new("early", "tor-e", &addr, ip)
            .flag("--metrics-enabled", "false")
            .flag("--service-tracing-mode", "off")
            .flag("--hostping-enabled", "false")
            .flag("--pinglist-update-interval-sec", 4 * ACTIVE_SEC),
    )
    .unwrap();
    // The agent's first registration attempts fail: nothing listens yet.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let ctl = spawn_controller(
        dir.path(),
        "controller",
        None,
        &addr,
        &[
            "--metrics-enabled",
            "false",
            "--active-threshold-sec",
            &ACTIVE_SEC.to_string(),
            "--stale-threshold-sec",
            &STALE_SEC.to_string(),
        ],
    )
    .unwrap();
    let mut op = operator(&ctl.endpoint()).await.unwrap();
    let gid = gid_of(ip);
    let registered = wait_for(Duration::from_secs(20), Duration::from_millis(200), || {
        let mut op = op.clone();
        let g = gid.clone();
        async move {
            let r = list_rnics(&mut op).await.ok()?;
            (active_of(&r, &g) == Some(true)).then_some(())
        }
    })
    .await;
    assert!(registered.is_some(), "the agent never registered");
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(4 * ACTIVE_SEC) {
        let r = list_rnics(&mut op).await.unwrap();
        assert_eq!(
            active_of(&r, &gid),
            Some(true),
            "not active {:.1} s after registering: {r:?}",
            started.elapsed().as_secs_f64()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
