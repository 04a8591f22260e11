//! Service paths end to end (root): a real controller and two agents on loopback; agent A
//! traces the fake-ibverbs fixture with uprobes. The fixture connects a QP to agent B's
//! GID: the controller lists the service path, agent A probes it as a SERVICE target and
//! its windows come back with pinglist_type SERVICE; after the QP is destroyed the path
//! disappears.

use std::net::Ipv4Addr;
use std::path::Path;

use std::time::{Duration, Instant};

use rpingmesh_e2e::fake_service::{build_fixture, Fixture};
use rpingmesh_e2e::*;
use rpingmesh_proto::controller_agent::PinglistType;
use rpingmesh_proto::operator::{ListServicePathsRequest, ServicePath};

const A_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 5, 1);
const B_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 5, 2);
const FLOW_LABEL: u32 = 0x5a5a5;
const SERVICE: &str = "fake-ibverbs";

async fn service_paths(endpoint: &str) -> Vec<ServicePath> {
    let Ok(mut op) = operator(endpoint).await else {
        return Vec::new();
    };
    op.list_service_paths(ListServicePathsRequest::default())
        .await
        .map(|r| r.into_inner().paths)
        .unwrap_or_default()
}

fn logs(p: &Proc) -> String {
    tail_lines(&p.stderr(), 30)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_path_is_learned_probed_and_removed() {
    if skip_unless_root("service_path_is_learned_probed_and_removed") {
        return;
    }
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let fixture = build_fixture(dir.path(), SERVICE);
    let ctl = spawn_controller(
        dir.path(),
        "controller",
        None,
        "127.0.0.1:0",
        &["--metrics-enabled", "false"],
    )
    .unwrap();
    let ep = ctl.endpoint();
    let common = |a: AgentArgs| {
        a.flag("--metrics-enabled", "false")
            .flag("--analysis-window-sec", 2)
            .flag("--probe-interval-ms", 200)
            .flag("--service-flow-report-interval-ms", 300)
    };
    let a = spawn_agent(
        dir.path(),
        None,
        &common(AgentArgs::new(
            "svc-a",
            "tor-a",
            &ctl.addr.to_string(),
            A_IP,
        ))
        .flag("--service-tracing-mode", "uprobe")
        .flag("--service-tracing-uprobe-targets", fixture.display()),
    )
    .unwrap();
    let b = spawn_agent(
        dir.path(),
        None,
        &common(AgentArgs::new(
            "svc-b",
            "tor-b",
            &ctl.addr.to_string(),
            B_IP,
        ))
        .flag("--service-tracing-mode", "off"),
    )
    .unwrap();

    // Both registered, and A's tracer attached to the fixture.
    let mut op = operator(&ep).await.unwrap();
    let registered = wait_for(Duration::from_secs(15), Duration::from_millis(200), || {
        let mut op = op.clone();
        async move {
            list_rnics(&mut op)
                .await
                .ok()
                .filter(|r| r.len() == 2)
                .map(|_| ())
        }
    })
    .await;
    assert!(
        registered.is_some(),
        "agents did not register:\nA: {}\nB: {}",
        logs(&a),
        logs(&b)
    );
    let tracing_on = wait_for(Duration::from_secs(10), Duration::from_millis(100), || {
        let on = a.stderr().contains("service tracing on");
        async move { on.then_some(()) }
    })
    .await;
    assert!(
        tracing_on.is_some(),
        "agent A did not start tracing:\n{}",
        logs(&a)
    );

    // The fixture connects a QP on A's pseudo-RNIC to B's GID.
    let (gid_a, gid_b) = (gid_of(A_IP), gid_of(B_IP));
    let mut fx = Fixture::qp_to(&fixture, B_IP, FLOW_LABEL);
    fx.expect("ready");
    fx.go();
    fx.expect("connected 837");

    let path = wait_for(Duration::from_secs(15), Duration::from_millis(200), || {
        let (ep, ga, gb) = (ep.clone(), gid_a.clone(), gid_b.clone());
        async move {
            service_paths(&ep)
                .await
                .into_iter()
                .find(|p| p.source_gid == ga && p.target_gid == gb)
        }
    })
    .await
    .unwrap_or_else(|| panic!("controller never listed the service path:\nA: {}", logs(&a)));
    assert!(path.monitored, "{path:?}");
    assert_eq!(path.flow_label, FLOW_LABEL);
    assert_eq!(path.service, SERVICE);
    assert_eq!(path.source_agent_id, "svc-a");
    assert_eq!(
        (path.source_tor_id.as_str(), path.target_tor_id.as_str()),
        ("tor-a", "tor-b")
    );

    // A probes it as a SERVICE target: its windows come back typed and named.
    let window = wait_for(Duration::from_secs(20), Duration::from_millis(500), || {
        let (mut op, ga, gb) = (op.clone(), gid_a.clone(), gid_b.clone());
        async move {
            all_windows(&mut op).await.ok()?.into_iter().find(|w| {
                w.source_gid == ga
                    && w.target_gid == gb
                    && w.pinglist_type == PinglistType::Service as i32
                    && w.probe_total > 0
            })
        }
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "no SERVICE window from agent A:\nA: {}\nB: {}",
            logs(&a),
            logs(&b)
        )
    });
    assert_eq!(window.service, SERVICE);
    assert!(window.probe_success > 0, "{window:?}");
    // ToR-mesh/inter-ToR windows stay untyped by service.
    let others = all_windows(&mut op).await.unwrap();
    assert!(others
        .iter()
        .filter(|w| w.pinglist_type != PinglistType::Service as i32)
        .all(|w| w.service.is_empty()));

    // Destroy the QP: the path disappears.
    fx.go();
    fx.expect("destroyed");
    let gone = wait_for(Duration::from_secs(10), Duration::from_millis(200), || {
        let (ep, ga, gb) = (ep.clone(), gid_a.clone(), gid_b.clone());
        async move {
            let ps = service_paths(&ep).await;
            (!ps.iter().any(|p| p.source_gid == ga && p.target_gid == gb)).then_some(())
        }
    })
    .await;
    assert!(
        gone.is_some(),
        "service path still listed after destroy:\nA: {}",
        logs(&a)
    );
    // One line said why tracing is on; no crash on either agent.
    drop(fx);
    let (mut a, mut b) = (a, b);
    assert!(
        a.alive() && b.alive(),
        "an agent died:\nA: {}\nB: {}",
        logs(&a),
        logs(&b)
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracing_failure_is_one_line_and_probing_continues() {
    if skip_unless_root("tracing_failure_is_one_line_and_probing_continues") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ctl = spawn_controller(
        dir.path(),
        "controller",
        None,
        "127.0.0.1:0",
        &["--metrics-enabled", "false"],
    )
    .unwrap();
    // The eBPF object cannot be read: tracing goes off with one line, the agent stays.
    let mut args = vec![
        "RPINGMESH_EBPF_OBJECT=/nonexistent/agent.bpf.o".to_string(),
        bin(AGENT_BIN).display().to_string(),
    ];
    args.extend(
        AgentArgs::new(
            "svc-off",
            "tor-a",
            &ctl.addr.to_string(),
            Ipv4Addr::new(127, 0, 5, 3),
        )
        .flag("--metrics-enabled", "false")
        .flag("--service-tracing-mode", "auto")
        .to_args(),
    );
    let a = Proc::spawn(
        dir.path(),
        "svc-off",
        None,
        Path::new("/usr/bin/env"),
        &args,
    )
    .unwrap();
    let op = operator(&ctl.endpoint()).await.unwrap();
    let registered = wait_for(Duration::from_secs(15), Duration::from_millis(200), || {
        let mut op = op.clone();
        async move {
            list_rnics(&mut op)
                .await
                .ok()
                .filter(|r| r.len() == 1)
                .map(|_| ())
        }
    })
    .await;
    assert!(
        registered.is_some(),
        "agent did not register:\n{}",
        logs(&a)
    );
    let log = a.stderr();
    let off: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("service tracing off"))
        .collect();
    assert_eq!(
        off.len(),
        1,
        "want exactly one 'service tracing off' line:\n{log}"
    );
    assert!(off[0].contains("/nonexistent/agent.bpf.o"), "{}", off[0]);
    assert!(!log.contains("service tracing on"), "{log}");
    let mut a = a;
    assert!(a.alive());
}
