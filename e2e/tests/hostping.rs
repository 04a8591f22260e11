//! `rpingmesh-agent hostping --once` over the udp transport, for real: four pseudo-RNICs
//! on loopback addresses inside a network namespace this test creates, R2R probing with
//! the agent's drivers and no controller, and nftables faults on their traffic. The
//! process's exit code and its JSON report are what is checked.

use std::process::Command;

use rpingmesh_e2e::netns::{cleanup_stale, Netns};
use rpingmesh_e2e::{bin, skip_unless_root, AGENT_BIN};
use serde_json::Value;

const ADDRS: [&str; 4] = ["127.0.0.11", "127.0.0.12", "127.0.0.13", "127.0.0.14"];

struct Run {
    code: Option<i32>,
    report: Value,
    stderr: String,
}

fn hostping(ns: &Netns, extra: &[&str]) -> Run {
    hostping_on(ns, &ADDRS.join(","), extra)
}

fn hostping_on(ns: &Netns, addrs: &str, extra: &[&str]) -> Run {
    let agent = bin(AGENT_BIN);
    let mut args = vec![
        "netns",
        "exec",
        &ns.name,
        agent.to_str().unwrap(),
        "hostping",
        "--once",
        "--json",
        "--udp-addresses",
        addrs,
        "--r2r-sec",
        "4",
        "--r2r-window-sec",
        "2",
    ];
    args.extend_from_slice(extra);
    let out = Command::new("ip")
        .args(&args)
        .output()
        .expect("ip netns exec");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    Run {
        code: out.status.code(),
        report: serde_json::from_str(&stdout).unwrap_or(Value::Null),
        stderr: String::from_utf8_lossy(&out.stderr).to_string(),
    }
}

/// The last window's findings as (kind, RNICs).
fn verdict(r: &Run) -> Vec<(String, Vec<String>)> {
    r.report["r2r"]["findings"]
        .as_array()
        .unwrap_or_else(|| panic!("no report: {}", r.stderr))
        .iter()
        .map(|f| {
            let rnics = f["rnics"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_str().unwrap().to_string())
                .collect();
            (f["kind"].as_str().unwrap().to_string(), rnics)
        })
        .collect()
}

fn drop_rules(ns: &Netns, body: &str) {
    let _ = ns.exec(&["nft", "delete", "table", "inet", "hostping"]);
    ns.nft(&format!("table inet hostping {{\n chain out {{\n  type filter hook output priority 0; policy accept;\n{body}\n }}\n}}\n"))
        .expect("nft");
}

#[test]
fn hostping_once_r2r_names_down_sporadic_tor_and_miswired_rnics() {
    if skip_unless_root("hostping_once_r2r_names_down_sporadic_tor_and_miswired_rnics") {
        return;
    }
    cleanup_stale();
    let ns = Netns::new(&format!("rpm{}hp", std::process::id())).expect("netns");

    let healthy = hostping(&ns, &[]);
    assert_eq!(healthy.code, Some(0), "{}", healthy.stderr);
    let r2r = &healthy.report["r2r"];
    assert_eq!(r2r["rnics"].as_array().unwrap().len(), 4);
    // A probe per RNIC per 100 ms for 4 s: about 160.
    let probes = r2r["probes"].as_u64().unwrap();
    assert!((120..=220).contains(&probes), "{probes} probes");
    assert_eq!(r2r["timeouts"], 0);
    assert_eq!(r2r["windows"].as_array().unwrap().len(), 2);
    assert!(healthy.report["topology"]["numa_nodes"]
        .as_array()
        .is_some_and(|n| !n.is_empty()));

    // udp2 (127.0.0.13) cut off: everything to or from it dropped.
    drop_rules(
        &ns,
        "  ip daddr 127.0.0.13 drop\n  ip saddr 127.0.0.13 drop",
    );
    let down = hostping(&ns, &[]);
    assert_eq!(
        verdict(&down),
        vec![("down".to_string(), vec!["udp2".to_string()])]
    );
    assert_eq!(down.code, Some(1));
    assert!(
        down.report["r2r"]["findings"][0]["timeout_rate"]
            .as_f64()
            .unwrap()
            >= 0.99
    );

    // udp1 drops 3 datagrams in 10 it sends: sporadic.
    drop_rules(&ns, "  ip saddr 127.0.0.12 numgen random mod 10 < 3 drop");
    let lossy = hostping(&ns, &[]);
    let v = verdict(&lossy);
    assert_eq!(
        v,
        vec![("sporadic".to_string(), vec!["udp1".to_string()])],
        "{}",
        lossy.report["r2r"]
    );
    let rate = lossy.report["r2r"]["findings"][0]["timeout_rate"]
        .as_f64()
        .unwrap();
    assert!((0.1..0.9).contains(&rate), "{rate}");

    // {udp0, udp1} and {udp2, udp3} reach each other only within: miswired.
    drop_rules(
        &ns,
        "  ip saddr { 127.0.0.11, 127.0.0.12 } ip daddr { 127.0.0.13, 127.0.0.14 } drop\n  ip saddr { 127.0.0.13, 127.0.0.14 } ip daddr { 127.0.0.11, 127.0.0.12 } drop",
    );
    let split = hostping(&ns, &[]);
    assert_eq!(verdict(&split)[0].0, "miswired");
    assert_eq!(
        split.report["r2r"]["findings"][0]["groups"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(split.code, Some(1));

    // Nothing gets through: the ToR.
    drop_rules(&ns, "  udp dport 18515 drop");
    let tor = hostping(&ns, &[]);
    assert_eq!(verdict(&tor)[0].0, "tor");
    assert_eq!(tor.code, Some(1));

    // Bad input: one line and exit 2.
    let bad = hostping_on(&ns, "not-an-ip", &[]);
    assert_eq!(bad.code, Some(2));
    assert_eq!(bad.stderr.trim().lines().count(), 1, "{}", bad.stderr);
    assert!(bad.stderr.contains("udp_addresses"), "{}", bad.stderr);
    let bad = hostping(&ns, &["--sysfs-recording", "/nonexistent/recording"]);
    assert_eq!(bad.code, Some(2));
    assert!(
        bad.stderr.contains("/nonexistent/recording"),
        "{}",
        bad.stderr
    );
}
