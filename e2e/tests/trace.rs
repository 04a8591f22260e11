//! An ECMP trace on demand, end to end (root): two agents on different ToRs probe over
//! IPv6 in network namespaces (the udp transport puts each probe's flow label in its IPv6
//! header), the controller knows the fabric's topology. nftables in the target's namespace
//! drops every probe of one flow label, the way a single bad ECMP path drops what hashes
//! onto it. `rpingmeshctl trace SRC DST` over 16 labels names that label, and only it,
//! with the spine the topology sends it over.

use std::net::Ipv6Addr;
use std::process::Command;
use std::time::Duration;

use rpingmesh_e2e::netns::BridgeNet;
use rpingmesh_e2e::*;

const WINDOW_SEC: u64 = 2;
const BAD_LABEL: u32 = 0x105;

fn v6(subnet: u8, host: u8) -> Ipv6Addr {
    format!("fd77:{subnet:x}::{host:x}").parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_names_the_one_bad_flow_label() {
    if skip_unless_root("a_trace_names_the_one_bad_flow_label") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let topo = d.join("topology.yaml");
    std::fs::write(
        &topo,
        "spines: [s1, s2, s3, s4]\ntors:\n  tor-a: [s1, s2, s3, s4]\n  tor-b: [s1, s2, s3, s4]\necmp: {model: fnv1a, seed: 1}\n",
    )
    .unwrap();
    let mut net = BridgeNet::new().expect("bridge");
    let c_ns = net.add_host("c", 1).expect("controller namespace");
    let listen = format!("{}:50051", net.ip(1));
    let ctl = spawn_controller(
        d,
        "controller",
        Some(&c_ns),
        &listen,
        &[
            "--metrics-enabled",
            "false",
            "--analyzer-localize-settle-sec",
            "1",
            "--analyzer-topology-file",
            &topo.display().to_string(),
        ],
    )
    .unwrap();
    let mut agents = Vec::new();
    let mut gids = Vec::new();
    for (i, (id, tor)) in [("tr-a", "tor-a"), ("tr-b", "tor-b")]
        .into_iter()
        .enumerate()
    {
        let host = 11 + i as u8;
        let ns = net.add_host(id, host).expect("agent namespace");
        let ip = v6(net.subnet, host);
        let h = net.host(&ns).unwrap();
        h.exec(&[
            "ip",
            "-6",
            "addr",
            "add",
            &format!("{ip}/64"),
            "dev",
            "eth0",
            "nodad",
        ])
        .expect("IPv6 address");
        let args = AgentArgs::new(id, tor, &listen, ip)
            .flag("--hostname", id)
            .flag("--metrics-enabled", "false")
            .flag("--hostping-enabled", "false")
            .flag("--service-tracing-mode", "off")
            .flag("--analysis-window-sec", WINDOW_SEC)
            .flag("--pinglist-update-interval-sec", 1)
            .flag("--focus-probe-rate-per-second", 200);
        agents.push((spawn_agent(d, Some(&ns), &args).unwrap(), ns));
        gids.push(rpingmesh_proto::gid::format_gid(&ip));
    }
    // One bad ECMP path: every probe of one label into B is dropped.
    net.host(&agents[1].1)
        .unwrap()
        .nft(&format!(
            "table ip6 rpm_label {{\n  chain input {{\n    type filter hook input priority 0; policy accept;\n    \
             ip6 flowlabel {BAD_LABEL:#x} udp dport {PROBE_PORT} counter drop\n  }}\n}}\n"
        ))
        .expect("the label's drop rule");
    // Both agents registered and reporting (the trace needs the source's windows).
    let op = operator(&ctl.endpoint()).await.unwrap();
    let up = wait_for(Duration::from_secs(30), Duration::from_millis(300), || {
        let mut op = op.clone();
        let gids = gids.clone();
        async move {
            let ws = all_windows(&mut op).await.ok()?;
            ws.iter()
                .any(|w| w.source_gid == gids[0] && w.target_gid == gids[1] && w.probe_success > 0)
                .then_some(())
        }
    })
    .await;
    assert!(
        up.is_some(),
        "A never probed B:\nA: {}\nB: {}",
        tail_lines(&agents[0].0.stderr(), 20),
        tail_lines(&agents[1].0.stderr(), 20)
    );
    let out = Command::new(bin("rpingmeshctl"))
        .args(["--controller", &ctl.addr.to_string(), "trace"])
        .args([&gids[0], &gids[1]])
        .args([
            "--first-label",
            "0x100",
            "--labels",
            "16",
            "--wait-sec",
            "60",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        text
    );
    eprintln!("{text}");
    assert!(text.contains(": done\n"), "{text}");
    let lossy = text
        .lines()
        .find_map(|l| l.strip_prefix("labels with loss: "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        lossy.starts_with(&format!("{BAD_LABEL:#07x} (100.00% loss via s"))
            && !lossy.contains(", "),
        "want only {BAD_LABEL:#x} at 100%: {lossy}\n{text}"
    );
    let audit = wait_for(Duration::from_secs(5), Duration::from_millis(200), || {
        let mut op = op.clone();
        async move {
            op.list_audit(rpingmesh_proto::operator::ListAuditRequest { limit: 20 })
                .await
                .ok()?
                .into_inner()
                .entries
                .into_iter()
                .find(|e| e.rpc == "StartTrace" && e.result.starts_with("ok"))
        }
    })
    .await;
    assert!(audit.is_some(), "StartTrace not audited");
    drop(agents);
    drop(ctl);
    drop(net);
}
