//! Operators' drains and silences end to end: a controller process on a SQLite file, two
//! real agents on loopback and, over gRPC, a simulated third host whose RNIC is dead. The
//! operator (rpingmeshctl) drains agent B's RNIC: within one pinglist refresh A's list
//! loses it and B's own lists are empty; the finding of the dead host's RNIC is silenced.
//! Both survive a SIGKILL and a restart on the same file; ending the drain brings B back
//! into A's list within a refresh; the audit trail has every action.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rpingmesh_e2e::*;
use rpingmesh_proto::controller_agent::controller_service_client::ControllerServiceClient;
use rpingmesh_proto::controller_agent::{
    AgentRegistrationRequest, PathSummary, PinglistRequest, PinglistType, ProbeAnalysisReport,
    RnicInfo,
};
use rpingmesh_proto::operator::{Finding, ListActionsRequest, ListFindingsRequest};
use tonic::transport::Channel;

const A_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 9, 1);
const B_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 9, 2);
/// The simulated host's RNIC (registered and reported over gRPC only).
const X_GID: &str = "fd00::9:99";
/// The controller localizes a window this long after its end.
const SETTLE_SEC: u64 = 3;

fn ctl(addr: &str, args: &[&str]) -> Output {
    Command::new(bin("rpingmeshctl"))
        .args(["--controller", addr])
        .args(args)
        .output()
        .unwrap()
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "rpingmeshctl failed ({:?}): {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn controller(dir: &Path) -> Controller {
    let db = format!("sqlite:{}", dir.join("ctl.db").display());
    spawn_controller(
        dir,
        "controller",
        None,
        "127.0.0.1:0",
        &[
            "--database-uri",
            &db,
            "--metrics-enabled",
            "false",
            "--analyzer-localize-settle-sec",
            &SETTLE_SEC.to_string(),
        ],
    )
    .unwrap()
}

async fn tor_mesh(
    c: &mut ControllerServiceClient<Channel>,
    agent: &str,
    ip: Ipv4Addr,
) -> Vec<String> {
    c.get_pinglist(PinglistRequest {
        agent_id: agent.into(),
        tor_id: "tor-a".into(),
        requester_gid: gid_of(ip),
        r#type: PinglistType::TorMesh as i32,
    })
    .await
    .unwrap()
    .into_inner()
    .targets
    .into_iter()
    .map(|t| t.target_gid)
    .collect()
}

/// The dead host x: registered, and the agents' windows to and from it all lost.
async fn dead_host_windows(c: &mut ControllerServiceClient<Channel>) {
    let x = rpingmesh_proto::gid::normalize_gid(X_GID).unwrap();
    c.register_agent(AgentRegistrationRequest {
        agent_id: "host-x".into(),
        hostname: "host-x".into(),
        tor_id: "tor-b".into(),
        rnics: vec![RnicInfo {
            gid: x.clone(),
            device_name: "mlx5_0".into(),
            ..Default::default()
        }],
        ..Default::default()
    })
    .await
    .unwrap();
    // Three windows, the newest starting now: all four paths of each are in before it
    // settles (SETTLE_SEC after its end), as an agent's report would be. A window sent
    // after it settled is localized with whatever part of it had come in by then.
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    for k in 0..3u64 {
        let start = now - (2 - k) * 1_000_000_000;
        for (agent, ip) in [("agent-a", A_IP), ("agent-b", B_IP)] {
            let w = |src: String, dst: String, tor: &str| PathSummary {
                source_gid: src,
                source_tor_id: tor.into(),
                target_gid: dst,
                target_tor_id: if tor == "tor-a" { "tor-b" } else { "tor-a" }.into(),
                window_start_unix_ns: start,
                window_duration_ms: 1000,
                probe_total: 50,
                probe_failed: 50,
                pinglist_type: PinglistType::InterTor as i32,
                ..Default::default()
            };
            for (reporter, s) in [
                (agent, w(gid_of(ip), x.clone(), "tor-a")),
                ("host-x", w(x.clone(), gid_of(ip), "tor-b")),
            ] {
                c.report_probe_analysis(ProbeAnalysisReport {
                    agent_id: reporter.into(),
                    summaries: vec![s],
                    ..Default::default()
                })
                .await
                .unwrap();
            }
        }
    }
}

async fn findings(ep: &str) -> Vec<Finding> {
    let Ok(mut op) = operator(ep).await else {
        return Vec::new();
    };
    op.list_findings(ListFindingsRequest::default())
        .await
        .map(|r| r.into_inner().findings)
        .unwrap_or_default()
}

/// Waits until agent `p`'s newest ToR-mesh pinglist has `n` targets.
async fn agent_list_has(p: &Proc, n: usize, what: &str) {
    let want = format!("\"kind\":\"TorMesh\",\"targets\":{n}");
    let seen = wait_for(Duration::from_secs(10), Duration::from_millis(100), || {
        let log = p.stderr();
        let last = log
            .lines()
            .rfind(|l| l.contains("\"pinglist updated\"") && l.contains("TorMesh"))
            .map(str::to_string);
        let want = want.clone();
        async move { last.filter(|l| l.contains(&want)).map(|_| ()) }
    })
    .await;
    assert!(seen.is_some(), "{what}:\n{}", tail_lines(&p.stderr(), 15));
}

/// What the drain and the silence hold at the controller at `ep`: no ToR-mesh list for
/// or to B, x's finding (`finding`) silenced, both actions listed.
async fn held(ep: &str, finding: u64, tag: &str) -> Vec<rpingmesh_proto::operator::Action> {
    let mut c = ControllerServiceClient::connect(ep.to_string())
        .await
        .unwrap();
    assert!(
        tor_mesh(&mut c, "agent-a", A_IP).await.is_empty(),
        "{tag}: A's list"
    );
    assert!(
        tor_mesh(&mut c, "agent-b", B_IP).await.is_empty(),
        "{tag}: B's list"
    );
    let f = findings(ep)
        .await
        .into_iter()
        .find(|f| f.id == finding)
        .unwrap_or_else(|| panic!("{tag}: x's finding is gone"));
    assert_eq!(f.suppressed, "silenced", "{tag}: {f:?}");
    let mut op = operator(ep).await.unwrap();
    let acts = op
        .list_actions(ListActionsRequest {})
        .await
        .unwrap()
        .into_inner()
        .actions;
    assert_eq!(acts.len(), 2, "{tag}: {acts:?}");
    acts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drains_and_silences_hold_across_a_restart_and_end() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let c1 = controller(d);
    let addr = c1.addr.to_string();
    let agent = |id: &str, ip| {
        spawn_agent(
            d,
            None,
            &AgentArgs::new(id, "tor-a", &addr, ip)
                .flag("--metrics-enabled", "false")
                .flag("--hostping-enabled", "false")
                .flag("--service-tracing-mode", "off")
                .flag("--pinglist-update-interval-sec", 1),
        )
        .unwrap()
    };
    let (a, b) = (agent("agent-a", A_IP), agent("agent-b", B_IP));
    agent_list_has(&a, 1, "A never listed B").await;
    let mut c = ControllerServiceClient::connect(c1.endpoint())
        .await
        .unwrap();
    dead_host_windows(&mut c).await;
    let x_finding = wait_for(Duration::from_secs(15), Duration::from_millis(200), || {
        let ep = c1.endpoint();
        async move { findings(&ep).await.into_iter().find(|f| f.open) }
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "no finding of host-x:\n{}",
            tail_lines(&c1.proc.stderr(), 20)
        )
    });
    // x alone on its ToR: named as the RNIC or as its ToR, and neither A nor B.
    assert!(
        x_finding.location.starts_with("host-x") || x_finding.location == "tor-b",
        "{x_finding:?}"
    );
    eprintln!("x's finding: {} {}", x_finding.kind, x_finding.location);

    // Drain B's RNIC, silence x's finding (the CLI, as an operator would).
    let drained = ok(&ctl(
        &addr,
        &["drain", "--rnic", &gid_of(B_IP), "--reason", "swap optics"],
    ));
    assert!(drained.starts_with("drain rnic "), "{drained}");
    let silenced = ok(&ctl(
        &addr,
        &[
            "silence",
            "--finding",
            &x_finding.id.to_string(),
            "--duration-sec",
            "3600",
            "--reason",
            "known: host-x is being replaced",
        ],
    ));
    assert!(silenced.starts_with("silence finding "), "{silenced}");
    agent_list_has(&a, 0, "B still in A's list after a refresh").await;
    agent_list_has(&b, 0, "the drained B still probes").await;
    let before = held(&c1.endpoint(), x_finding.id, "before the restart").await;

    // SIGKILL and a restart on the same file: both hold.
    drop(c1);
    let c2 = controller(d);
    let ep2 = c2.endpoint();
    {
        // The agents know the old port: register A and B here as they would.
        let mut c = ControllerServiceClient::connect(ep2.clone()).await.unwrap();
        for (id, ip) in [("agent-a", A_IP), ("agent-b", B_IP)] {
            c.register_agent(AgentRegistrationRequest {
                agent_id: id.into(),
                hostname: id.into(),
                tor_id: "tor-a".into(),
                rnics: vec![RnicInfo {
                    gid: gid_of(ip),
                    device_name: "udp0".into(),
                    ..Default::default()
                }],
                ..Default::default()
            })
            .await
            .unwrap();
        }
    }
    let after = held(&ep2, x_finding.id, "after the restart").await;
    assert_eq!(before, after);

    // Undrain: B is listed again.
    let drain_id = before.iter().find(|a| a.kind == "drain").unwrap().id;
    let addr2 = c2.addr.to_string();
    let end = ok(&ctl(&addr2, &["end-action", &drain_id.to_string()]));
    assert!(end.starts_with("ended drain"), "{end}");
    let mut c = ControllerServiceClient::connect(ep2.clone()).await.unwrap();
    assert_eq!(tor_mesh(&mut c, "agent-a", A_IP).await, [gid_of(B_IP)]);
    // The trail takes the lines within a second.
    let audit = wait_for(Duration::from_secs(5), Duration::from_millis(200), || {
        let out = ok(&ctl(&addr2, &["audit"]));
        async move {
            ["Drain", "Silence", "EndAction"]
                .iter()
                .all(|rpc| out.contains(rpc))
                .then_some(out)
        }
    })
    .await;
    assert!(audit.is_some(), "{}", ok(&ctl(&addr2, &["audit"])));
    // A viewer's CLI error for an unknown action is exit 1 (the controller's answer).
    let missing = ctl(&addr2, &["end-action", "42"]);
    assert_eq!(missing.status.code(), Some(1));
    drop((a, b));
}
