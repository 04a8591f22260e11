//! `rpingmesh-agent hostping --once` over the udp transport, for real: four pseudo-RNICs
//! on loopback addresses inside a network namespace this test creates, R2R probing with
//! the agent's drivers and no controller, and nftables faults on their traffic. The
//! process's exit code and its JSON report are what is checked.

use std::process::Command;
use std::time::{Duration, Instant};

use rpingmesh_e2e::netns::{cleanup_stale, Netns};
use rpingmesh_e2e::{bin, http_get, skip_unless_root, spawn_controller, AGENT_BIN};
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
        "--hostping-r2r-window-sec",
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

/// The report reaches the controller (`--report`), `rpingmeshctl host NAME` prints the
/// agent's tree and verdict, `hosts --problems` lists it, and both survive a controller
/// restart (SQLite). A report that cannot be sent is one line and exit 2.
#[test]
fn hostping_report_is_stored_and_shown_by_rpingmeshctl_host() {
    if skip_unless_root("hostping_report_is_stored_and_shown_by_rpingmeshctl_host") {
        return;
    }
    cleanup_stale();
    let ns = Netns::new(&format!("rpm{}hr", std::process::id())).expect("netns");
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("controller.db").display());
    // Inside the namespace a fixed port is free.
    let metrics = [
        "--metrics-exporter",
        "prometheus",
        "--prometheus-listen-addr",
        "127.0.0.1:19464",
    ];
    let mut first = vec!["--database-uri", db.as_str()];
    first.extend_from_slice(&metrics);
    let ctl = spawn_controller(
        dir.path(),
        "controller",
        Some(&ns.name),
        "127.0.0.1:0",
        &first,
    )
    .unwrap();
    let addr = ctl.addr.to_string();

    drop_rules(
        &ns,
        "  ip daddr 127.0.0.13 drop\n  ip saddr 127.0.0.13 drop",
    );
    let ident = [
        "--report",
        "--controller-addr",
        &addr,
        "--hostname",
        "gpu-host-7",
        "--agent-id",
        "agent-7",
    ];
    let run = hostping(&ns, &ident);
    assert_eq!(run.code, Some(1), "{}", run.stderr);

    let ctl_cmd = |args: &[&str]| -> (Option<i32>, String, String) {
        let cli = bin("rpingmeshctl");
        let mut all = vec![
            "netns",
            "exec",
            &ns.name,
            cli.to_str().unwrap(),
            "--controller",
            &addr,
        ];
        all.extend_from_slice(args);
        let out = Command::new("ip").args(&all).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let check = |when: &str| {
        let (code, out, err) = ctl_cmd(&["host", "gpu-host-7"]);
        assert_eq!(code, Some(0), "{when}: {err}");
        assert!(out.contains("by agent agent-7"), "{when}: {out}");
        assert!(out.contains("host gpu-host-7\nsocket 0"), "{when}: {out}");
        assert!(out.contains("verdict: PROBLEM"), "{when}: {out}");
        assert!(out.contains("R2R: udp2 timed out on 100%"), "{when}: {out}");
        let (code, out, _) = ctl_cmd(&["hosts", "--problems", "--json"]);
        assert_eq!(code, Some(0));
        let rows: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(rows.len(), 1, "{when}: {out}");
        assert_eq!(rows[0]["findings"][0]["kind"], "r2r_down");
        assert_eq!(rows[0]["findings"][0]["location"], "udp2");
    };
    check("after the report");
    // The metric carries the host and the kind.
    let scrape = ns
        .run_in(|| http_get("127.0.0.1:19464".parse().unwrap(), "/metrics", "text/plain"))
        .unwrap()
        .unwrap();
    let line = scrape
        .2
        .lines()
        .find(|l| l.starts_with("rpingmesh_hostping_host_findings{"))
        .unwrap_or("");
    assert!(
        line.contains("hostname=\"gpu-host-7\"")
            && line.contains("kind=\"r2r_down\"")
            && line.ends_with(" 1"),
        "{line:?}"
    );
    let (code, _, err) = ctl_cmd(&["host", "no-such-host"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no-such-host"), "{err}");

    // A healthy host's report replaces the one before.
    let _ = ns.exec(&["nft", "delete", "table", "inet", "hostping"]);
    // Restart: the store has it.
    let mut ctl = ctl;
    ctl.proc.stop();
    let ctl = spawn_controller(
        dir.path(),
        "controller2",
        Some(&ns.name),
        &addr,
        &["--database-uri", &db],
    )
    .unwrap();
    check("after a restart");

    let ok = hostping(&ns, &ident);
    assert_eq!(ok.code, Some(0), "{}", ok.stderr);
    let (_, out, _) = ctl_cmd(&["hosts", "--json"]);
    assert!(out.contains("\"findings\":[]"), "{out}");
    let (_, out, _) = ctl_cmd(&["hosts", "--problems"]);
    assert!(!out.contains("gpu-host-7"), "{out}");

    // No controller: the report fails in one line, exit 2.
    let mut ctl = ctl;
    ctl.proc.stop();
    let failed = hostping(&ns, &ident);
    assert_eq!(failed.code, Some(2));
    let lines: Vec<&str> = failed.stderr.trim().lines().collect();
    assert_eq!(lines.len(), 1, "{}", failed.stderr);
    assert!(
        lines[0].contains("report to the controller"),
        "{}",
        failed.stderr
    );
}

/// Hostping inside the running agent: its four RNICs probe each other beside the
/// controller's lists, and the host's findings reach the controller (`rpingmeshctl
/// hosts`) and the agent's metrics when an RNIC is cut off, and clear when it is back.
/// Three cut/heal cycles with 2 s R2R windows: the behaviour over many of its periods.
#[test]
fn running_agent_reports_host_findings_as_they_open_and_clear() {
    if skip_unless_root("running_agent_reports_host_findings_as_they_open_and_clear") {
        return;
    }
    cleanup_stale();
    let ns = Netns::new(&format!("rpm{}hd", std::process::id())).expect("netns");
    let dir = tempfile::tempdir().unwrap();
    let ctl =
        spawn_controller(dir.path(), "controller", Some(&ns.name), "127.0.0.1:0", &[]).unwrap();
    let addr = ctl.addr.to_string();
    let agent = rpingmesh_e2e::AgentArgs {
        agent_id: "agent-9".into(),
        tor_id: "tor-9".into(),
        controller_addr: addr.clone(),
        udp_addresses: ADDRS.iter().map(|a| a.parse().unwrap()).collect(),
        extra: [
            "--hostname",
            "gpu-host-9",
            "--hostping-r2r-window-sec",
            "2",
            "--hostping-check-interval-sec",
            "5",
            "--metrics-exporter",
            "prometheus",
            "--prometheus-listen-addr",
            "127.0.0.1:19465",
            "--service-tracing-mode",
            "off",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
    };
    let mut proc = rpingmesh_e2e::spawn_agent(dir.path(), Some(&ns.name), &agent).unwrap();

    let hosts = || -> Vec<Value> {
        let cli = bin("rpingmeshctl");
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &ns.name,
                cli.to_str().unwrap(),
                "--controller",
                &addr,
                "hosts",
                "--json",
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let kinds = |rows: &[Value]| -> Option<Vec<(String, String)>> {
        let row = rows.iter().find(|r| r["hostname"] == "gpu-host-9")?;
        Some(
            row["findings"]
                .as_array()?
                .iter()
                .map(|f| {
                    (
                        f["kind"].as_str().unwrap_or("").to_string(),
                        f["location"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect(),
        )
    };
    let wait_for = |want: &[(&str, &str)], bound: Duration, what: &str| -> Duration {
        let t0 = Instant::now();
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(k, l)| (k.to_string(), l.to_string()))
            .collect();
        loop {
            let rows = hosts();
            if kinds(&rows).as_deref() == Some(&want[..]) {
                return t0.elapsed();
            }
            assert!(
                t0.elapsed() < bound,
                "{what}: not {want:?} after {bound:?}: {rows:?}\nagent log:\n{}",
                rpingmesh_e2e::tail_lines(&proc.stderr(), 30)
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    };
    let metric = |kind: &str| -> Option<String> {
        let scrape = ns
            .run_in(|| http_get("127.0.0.1:19465".parse().unwrap(), "/metrics", "text/plain"))
            .ok()?
            .ok()?;
        scrape
            .2
            .lines()
            .find(|l| {
                l.starts_with("rpingmesh_hostping_findings{")
                    && l.contains(&format!("kind=\"{kind}\""))
            })
            .map(str::to_string)
    };

    // Healthy: the first window's report, with nothing found.
    let first = wait_for(&[], Duration::from_secs(20), "healthy host");
    eprintln!("hostping daemon: first report after {first:?}");
    for cycle in 1..=3 {
        drop_rules(
            &ns,
            "  ip daddr 127.0.0.13 drop\n  ip saddr 127.0.0.13 drop",
        );
        // Within two windows (the one the cut lands in may still be mostly clean).
        let opened = wait_for(
            &[("r2r_down", "udp2")],
            Duration::from_secs(10),
            &format!("cycle {cycle}: cut"),
        );
        let line = metric("r2r_down").unwrap_or_default();
        assert!(
            line.contains("hostname=\"gpu-host-9\"") && line.ends_with(" 1"),
            "cycle {cycle}: {line:?}"
        );
        let _ = ns.exec(&["nft", "delete", "table", "inet", "hostping"]);
        let cleared = wait_for(
            &[],
            Duration::from_secs(10),
            &format!("cycle {cycle}: heal"),
        );
        let line = metric("r2r_down").unwrap_or_default();
        assert!(line.ends_with(" 0"), "cycle {cycle}: {line:?}");
        eprintln!("hostping daemon: cycle {cycle}: finding in {opened:?}, cleared in {cleared:?}");
    }
    // R2R stays inside the host: no ToR-pair series toward a "hostping" ToR, and the
    // agent's probing of the controller's lists went on (its ToR-mesh has the same RNICs).
    let scrape = ns
        .run_in(|| http_get("127.0.0.1:19465".parse().unwrap(), "/metrics", "text/plain"))
        .unwrap()
        .unwrap()
        .2;
    assert!(!scrape.contains("target_tor=\"hostping\""));
    assert!(
        scrape.contains("rpingmesh_hostping_r2r_timeout_ratio{"),
        "{scrape}"
    );
    assert!(scrape.contains("rpingmesh_hostping_host_mode{"), "{scrape}");
    assert!(proc.alive(), "{}", proc.stderr());
    let mut ctl = ctl;
    proc.stop();
    ctl.proc.stop();
}
