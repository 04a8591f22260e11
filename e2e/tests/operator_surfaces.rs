//! The operator surfaces against a running demo (root): the demo's layout (a controller
//! and 8 agents on 2 ToRs, Prometheus exporters on) inside a network namespace, one agent
//! tracing a fake-ibverbs service with uprobes, a real Prometheus (Debian's) scraping
//! them with the config we ship, and the controller's web page in headless Chromium.
//!
//! Checked: the page's matrix has the demo's ToR pairs; nftables loss on one agent turns
//! its ToR pairs' cells red within two analysis windows (and leaves the other pair green);
//! the live service path is on the page; findings open and resolve; the page raises no
//! errors; every Grafana panel's query returns series from Prometheus; /metrics speaks
//! OpenMetrics.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rpingmesh_e2e::demo::{DemoLayout, DEMO_PROBE_PORT};
use rpingmesh_e2e::fake_service::{build_fixture, Fixture};
use rpingmesh_e2e::netns::{cleanup_stale, Netns};
use rpingmesh_e2e::*;
use serde_json::Value;

const SERVICE: &str = "fake-ibverbs";
const CONTROLLER_GRPC: &str = "127.0.0.1:50051";
const HTTP: &str = "127.0.0.1:8080";
const CONTROLLER_METRICS: &str = "127.0.0.1:9465";
const PROMETHEUS: &str = "127.0.0.1:9090";
/// The agent whose incoming probes are dropped (agent-8, on tor-2).
const LOSSY_AGENT: usize = 7;

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// GET inside the namespace, parsed as JSON.
fn get_json(ns: &Netns, at: &str, path: &str) -> Option<Value> {
    let (a, p) = (addr(at), path.to_string());
    let (status, _, body) = ns
        .run_in(move || http_get(a, &p, "application/json"))
        .ok()?
        .ok()?;
    (status == 200).then(|| serde_json::from_str(&body).ok())?
}

async fn wait_json<T>(
    ns: &Netns,
    timeout: Duration,
    at: &str,
    path: &str,
    f: impl Fn(&Value) -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(t) = get_json(ns, at, path).as_ref().and_then(&f) {
            return Some(t);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    None
}

/// Headless Chromium inside the namespace: the page's DOM after its first refreshes,
/// what the browser logged, and optionally a screenshot.
struct Page {
    dom: String,
    log: String,
}

fn chromium(ns: &Netns, dir: &Path, screenshot: Option<&Path>) -> Page {
    chromium_at(ns, dir, screenshot, "")
}

/// As [`chromium`], at `fragment` of the page (e.g. `#pair=tor-1,tor-2`).
fn chromium_at(ns: &Netns, dir: &Path, screenshot: Option<&Path>, fragment: &str) -> Page {
    let profile = tempfile::tempdir_in(dir).unwrap();
    let mut args: Vec<String> = [
        "netns",
        "exec",
        &ns.name,
        "chromium",
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--hide-scrollbars",
        "--enable-logging=stderr",
        "--v=0",
        "--window-size=1400,1500",
        // Virtual time waits for the page's fetches; 5 s is two refreshes.
        "--virtual-time-budget=5000",
    ]
    .map(String::from)
    .to_vec();
    args.push(format!("--user-data-dir={}", profile.path().display()));
    match screenshot {
        Some(p) => args.push(format!("--screenshot={}", p.display())),
        None => args.push("--dump-dom".into()),
    }
    args.push(format!("http://{HTTP}/{fragment}"));
    let out = Command::new("ip")
        .args(&args)
        .output()
        .expect("chromium runs");
    Page {
        dom: String::from_utf8_lossy(&out.stdout).to_string(),
        log: String::from_utf8_lossy(&out.stderr).to_string(),
    }
}

/// `data-status` of the matrix cell src -> dst in a dumped DOM.
fn cell_status(dom: &str, src: &str, dst: &str) -> Option<String> {
    let needle = format!("data-src=\"{src}\" data-dst=\"{dst}\" data-status=\"");
    let at = dom.find(&needle)? + needle.len();
    Some(dom[at..].split('"').next()?.to_string())
}

fn body_attr(dom: &str, name: &str) -> Option<u64> {
    let needle = format!("{name}=\"");
    let at = dom.find(&needle)? + needle.len();
    dom[at..].split('"').next()?.parse().ok()
}

/// What the page wrote to the console (Chromium logs every console message, errors and
/// failed loads included, as `:CONSOLE:` lines; the page itself logs nothing).
/// Console messages of the page: Chromium's own pages (`source: chrome://...`, e.g. its
/// "Slow network is detected" note on a loaded machine) are not the page's.
fn console_errors(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains(":CONSOLE") && !l.contains("source: chrome://"))
        .collect()
}

fn assert_page_is_clean(p: &Page, when: &str) {
    assert_eq!(
        body_attr(&p.dom, "data-js-errors"),
        Some(0),
        "{when}: the page counted errors:\n{}",
        tail_lines(&p.dom, 5)
    );
    assert!(
        body_attr(&p.dom, "data-refreshes").unwrap_or(0) >= 1,
        "{when}: the page never completed a refresh:\n{}\n{}",
        tail_lines(&p.dom, 5),
        tail_lines(&p.log, 10)
    );
    let errs = console_errors(&p.log);
    assert!(errs.is_empty(), "{when}: console errors: {errs:?}");
}

fn write_prometheus_config(dir: &Path, layout: &DemoLayout) -> PathBuf {
    let pdir = dir.join("prometheus");
    std::fs::create_dir_all(pdir.join("targets")).unwrap();
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus/prometheus.yml");
    std::fs::copy(&shipped, pdir.join("prometheus.yml")).expect("deploy/prometheus/prometheus.yml");
    let agents: Vec<String> = (0..layout.agents)
        .map(|i| layout.agent_metrics_addr(i))
        .collect();
    let targets = |t: Vec<String>| serde_json::json!([{ "targets": t, "labels": {} }]).to_string();
    std::fs::write(pdir.join("targets/agents.json"), targets(agents)).unwrap();
    std::fs::write(
        pdir.join("targets/controller.json"),
        targets(vec![CONTROLLER_METRICS.to_string()]),
    )
    .unwrap();
    pdir
}

fn prom_query(ns: &Netns, q: &str) -> Result<Vec<Value>, String> {
    let enc: String = q
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect();
    let v = get_json(ns, PROMETHEUS, &format!("/api/v1/query?query={enc}"))
        .ok_or_else(|| "no answer".to_string())?;
    if v["status"] != "success" {
        return Err(v.to_string());
    }
    Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_page_prometheus_and_dashboards_against_the_demo() {
    if skip_unless_root("web_page_prometheus_and_dashboards_against_the_demo") {
        return;
    }
    for tool in ["chromium", "prometheus"] {
        assert!(
            Path::new("/usr/bin").join(tool).exists(),
            "{tool} is missing: `cargo xtask deps` installs it"
        );
    }
    cleanup_stale();
    let ns = Netns::new(&format!("rpm{}ui", std::process::id())).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let layout = DemoLayout::DEFAULT;
    let window = Duration::from_secs(layout.window_sec);
    // Screenshots of each stage, kept for a look after the run.
    let shots = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/ui-screenshots");
    std::fs::create_dir_all(&shots).unwrap();

    // The demo, as `cargo xtask demo` starts it, in the namespace.
    let mut ctl = Proc::spawn(
        dir.path(),
        "controller",
        Some(&ns.name),
        &bin("rpingmesh-controller"),
        &layout.controller_args(CONTROLLER_GRPC, "sqlite::memory:", HTTP, CONTROLLER_METRICS),
    )
    .unwrap();
    let fixture = build_fixture(dir.path(), SERVICE);
    let mut agents = Vec::new();
    for i in 0..layout.agents {
        let mut args = layout.agent_args(i, CONTROLLER_GRPC);
        if i == 0 {
            args.extend(
                [
                    "--service-tracing-mode",
                    "uprobe",
                    "--service-tracing-uprobe-targets",
                    &fixture.display().to_string(),
                    "--service-flow-report-interval-ms",
                    "300",
                ]
                .map(String::from),
            );
        }
        agents.push(
            Proc::spawn(
                dir.path(),
                &layout.agent_id(i),
                Some(&ns.name),
                &bin("rpingmesh-agent"),
                &args,
            )
            .unwrap(),
        );
    }
    let pdir = write_prometheus_config(dir.path(), &layout);
    let mut prometheus = Proc::spawn(
        dir.path(),
        "prometheus",
        Some(&ns.name),
        Path::new("/usr/bin/prometheus"),
        &[
            format!("--config.file={}", pdir.join("prometheus.yml").display()),
            format!("--storage.tsdb.path={}", pdir.join("data").display()),
            format!("--web.listen-address={PROMETHEUS}"),
        ],
    )
    .unwrap();

    // 1. Everyone registered, every ToR pair measured, tracing on in agent-1.
    let pairs = wait_json(&ns, Duration::from_secs(60), HTTP, "/api/tor-pairs", |v| {
        let cells = v["cells"].as_array()?;
        (cells.len() == 4 && cells.iter().all(|c| c["status"] == "ok")).then_some(cells.len())
    })
    .await;
    assert!(
        pairs.is_some(),
        "the matrix never had 4 green cells: {:?}\ncontroller: {}\nagent-1: {}",
        get_json(&ns, HTTP, "/api/tor-pairs"),
        tail_lines(&ctl.stderr(), 10),
        tail_lines(&agents[0].stderr(), 10)
    );
    let overview = get_json(&ns, HTTP, "/api/overview").unwrap();
    assert_eq!(overview["agents"]["active"], layout.agents, "{overview}");
    let tracing_on = wait_for(Duration::from_secs(20), Duration::from_millis(200), || {
        let on = agents[0].stderr().contains("service tracing on");
        async move { on.then_some(()) }
    })
    .await;
    assert!(
        tracing_on.is_some(),
        "agent-1 did not start tracing:\n{}",
        tail_lines(&agents[0].stderr(), 20)
    );

    // 2. The service: a QP from agent-1's pseudo-RNIC to agent-5's GID.
    let target = layout.agent_ip(4);
    let mut fx = Fixture::qp_to(&fixture, target, 0x5a5a5);
    fx.expect("ready");
    fx.go();
    fx.expect("connected 837");
    let svc = wait_json(
        &ns,
        Duration::from_secs(30),
        HTTP,
        "/api/service-paths",
        |v| {
            let s = v["services"]
                .as_array()?
                .iter()
                .find(|s| s["service"] == SERVICE)?;
            let p = s["paths"].as_array()?.first()?.clone();
            (p["monitored"] == true && p["latest"].is_object()).then_some(p)
        },
    )
    .await
    .unwrap_or_else(|| {
        panic!(
            "no monitored, probed service path: {:?}\nagent-1: {}",
            get_json(&ns, HTTP, "/api/service-paths"),
            tail_lines(&agents[0].stderr(), 20)
        )
    });
    assert_eq!(svc["target_gid"], gid_of(target));
    assert_eq!(svc["qps"][0]["local_qpn"], 0x345);

    // 3. The page, healthy: the demo's ToR pairs, all green; the live service path.
    chromium(&ns, dir.path(), Some(&shots.join("healthy.png")));
    let page = chromium(&ns, dir.path(), None);
    assert_page_is_clean(&page, "healthy page");
    for (s, d) in [
        ("tor-1", "tor-1"),
        ("tor-1", "tor-2"),
        ("tor-2", "tor-1"),
        ("tor-2", "tor-2"),
    ] {
        assert_eq!(
            cell_status(&page.dom, s, d).as_deref(),
            Some("ok"),
            "cell {s}->{d} in:\n{}",
            page.dom
        );
    }
    assert!(
        page.dom
            .contains(&format!("class=\"svc-path\" data-service=\"{SERVICE}\"")),
        "the service path is not on the page:\n{}",
        page.dom
    );
    assert!(page
        .dom
        .contains("class=\"agent\" data-agent=\"agent-8\" data-active=\"true\""));
    // The drill-down of a pair (what a click on its cell shows: the cell sets this URL).
    chromium_at(
        &ns,
        dir.path(),
        Some(&shots.join("healthy-drill.png")),
        "#pair=tor-1,tor-2",
    );
    let drill = chromium_at(&ns, dir.path(), None, "#pair=tor-1,tor-2");
    assert_page_is_clean(&drill, "drill-down page");
    assert!(
        drill
            .dom
            .contains("data-src=\"tor-1\" data-dst=\"tor-2\">Paths tor-1 → tor-2"),
        "the drill-down is not of tor-1 -> tor-2:\n{}",
        drill.dom
    );
    assert!(
        drill.dom.contains("<tr class=\"path\" data-status=\"ok\">"),
        "no path rows:\n{}",
        drill.dom
    );

    // The job's page (what a click on a service group's name shows): its path, probed.
    let job = chromium_at(&ns, dir.path(), None, &format!("#job={SERVICE}"));
    assert_page_is_clean(&job, "job page");
    assert!(
        job.dom
            .contains("id=\"job-section\" style=\"display: block;\"")
            && job.dom.contains("<tr class=\"job-path\">")
            && job.dom.contains(&format!("href=\"#job={SERVICE}\"")),
        "no job page for {SERVICE}:\n{}",
        job.dom
    );

    // 4. Loss on agent-8: every probe arriving at it is dropped.
    let lossy_ip = layout.agent_ip(LOSSY_AGENT);
    ns.nft(&format!(
        "table inet rpm_ui_loss {{\n chain input {{\n  type filter hook input priority 0; policy accept;\n  \
         ip daddr {lossy_ip} udp dport {DEMO_PROBE_PORT} drop\n }}\n}}\n"
    ))
    .expect("nft rule");
    let injected = Instant::now();
    // Cells whose paths always include agent-8: its ToR's mesh, and its own inter-ToR
    // probes (their ACKs are dropped). tor-1 -> tor-2 has it only while an inter-ToR
    // sample of a tor-1 agent (fresh every pinglist refresh) picked it: not asserted.
    let lossy_cells = [("tor-2", "tor-1"), ("tor-2", "tor-2")];
    let red = |v: &Value| {
        let cells = v["cells"].as_array()?;
        let st = |s: &str, d: &str| {
            cells
                .iter()
                .find(|c| c["source_tor"] == s && c["target_tor"] == d)
                .map(|c| c["status"].as_str().unwrap_or("").to_string())
        };
        let all = lossy_cells
            .iter()
            .all(|(s, d)| st(s, d).as_deref() == Some("loss"));
        all.then_some(())
    };
    // When each cell turned red (for the failure message).
    let mut first_red: BTreeMap<String, f64> = BTreeMap::new();
    let mut red_in_api = None;
    while injected.elapsed() < 4 * window {
        if let Some(v) = get_json(&ns, HTTP, "/api/tor-pairs") {
            for c in v["cells"].as_array().into_iter().flatten() {
                if c["status"] == "loss" {
                    let k = format!("{}->{}", c["source_tor"], c["target_tor"]);
                    first_red
                        .entry(k)
                        .or_insert(injected.elapsed().as_secs_f64());
                }
            }
            if red(&v).is_some() {
                red_in_api = Some(injected.elapsed());
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let red_in_api = red_in_api.unwrap_or_else(|| {
        panic!(
            "cells of tor-2 not red after {:?} (first red: {first_red:?}): {:?}",
            4 * window,
            get_json(&ns, HTTP, "/api/tor-pairs")
        )
    });
    eprintln!("operator_surfaces: cells first red at (s) {first_red:?}");
    // The page shows it at its next refresh (every 2 s).
    let p = chromium(&ns, dir.path(), None);
    let red_on_page = injected.elapsed();
    assert_page_is_clean(&p, "page under loss");
    for (s, d) in lossy_cells {
        assert_eq!(
            cell_status(&p.dom, s, d).as_deref(),
            Some("loss"),
            "{s}->{d}:\n{}",
            p.dom
        );
    }
    // The pair without agent-8 stays green: the page points at the right place.
    assert_eq!(
        cell_status(&p.dom, "tor-1", "tor-1").as_deref(),
        Some("ok"),
        "{}",
        p.dom
    );
    assert!(
        p.dom
            .contains("class=\"finding\" data-status=\"open\" data-kind=\"loss\""),
        "{}",
        p.dom
    );
    eprintln!(
        "operator_surfaces: cells red in the API {:.1} s after the loss began, on the page by {:.1} s (windows of {} s)",
        red_in_api.as_secs_f64(),
        red_on_page.as_secs_f64(),
        layout.window_sec
    );
    // Two windows, plus the fixed latency in front of the page: a lost probe counts when
    // its 1 s timeout expires, closed windows are flushed every second, and the page
    // refreshes every 2 s (loss that begins in a window's last second shows only in the
    // next one).
    let bound = 2 * window + Duration::from_secs(1 + 1 + 2);
    assert!(
        red_on_page <= bound + Duration::from_secs(2),
        "red on the page after {red_on_page:?} (API {red_in_api:?}); bound {bound:?} + chromium's own start"
    );
    assert!(
        red_in_api <= bound,
        "red in the API after {red_in_api:?}; bound {bound:?}"
    );

    chromium(&ns, dir.path(), Some(&shots.join("loss.png")));

    // 5. Prometheus: every dashboard panel's query returns series (under loss, so the
    // violation and open-finding panels have something to show).
    let up = wait_for(Duration::from_secs(30), Duration::from_secs(1), || {
        let r = prom_query(&ns, "up == 1").map(|v| v.len()).unwrap_or(0);
        async move { (r == layout.agents + 1).then_some(()) }
    })
    .await;
    assert!(
        up.is_some(),
        "Prometheus does not see every target up:\n{}",
        tail_lines(&prometheus.stderr(), 20)
    );
    tokio::time::sleep(Duration::from_secs(12)).await; // rate() needs two scrapes of the loss
    let vars: BTreeMap<String, String> = [
        ("source_tor", "tor-1"),
        ("target_tor", "tor-2"),
        ("service", SERVICE),
        ("instance", "127.0.1.1:9464"),
        ("datasource", "rpingmesh-prometheus"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let mut empty = Vec::new();
    let mut checked = 0;
    for (file, dash) in grafana::load_dashboards(grafana::dashboards_dir()).unwrap() {
        for q in grafana::panel_queries(&dash) {
            let expr = grafana::substitute(&q.expr, &vars);
            checked += 1;
            match prom_query(&ns, &expr) {
                Ok(series) if !series.is_empty() => {}
                Ok(_) => empty.push(format!("{file} / {}: {expr} (no series)", q.panel)),
                Err(e) => empty.push(format!("{file} / {}: {expr} ({e})", q.panel)),
            }
        }
    }
    assert!(checked >= 40, "only {checked} panel queries found");
    assert!(
        empty.is_empty(),
        "{} of {checked} panel queries returned nothing:\n{}",
        empty.len(),
        empty.join("\n")
    );
    eprintln!("operator_surfaces: {checked} dashboard queries returned series");

    // 6. /metrics speaks OpenMetrics to Prometheus and the classic format to curl.
    let m = addr(&layout.agent_metrics_addr(0));
    let (st, ct, body) = ns
        .run_in(move || http_get(m, "/metrics", "application/openmetrics-text;version=1.0.0"))
        .unwrap()
        .unwrap();
    assert_eq!(st, 200);
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    assert!(
        body.ends_with("# EOF\n") && body.contains("rpingmesh_network_rtt_ns_bucket{"),
        "{body}"
    );
    let (_, ct, _) = ns
        .run_in(move || http_get(m, "/metrics", "*/*"))
        .unwrap()
        .unwrap();
    assert!(ct.starts_with("text/plain"), "{ct}");

    // 7. The loss ends: cells green again and the findings resolved.
    ns.exec(&["nft", "delete", "table", "inet", "rpm_ui_loss"])
        .unwrap();
    // A finding resolves after two clean windows (hysteresis); the window that was lossy
    // when the rule went away closes first, and each verdict waits for the analyzer's tick.
    // Five windows leave room for a loaded CI machine; the time taken is printed.
    let healed = std::time::Instant::now();
    let resolved = wait_json(
        &ns,
        5 * window + Duration::from_secs(10),
        HTTP,
        "/api/findings",
        |v| {
            (v["open"] == 0
                && v["findings"]
                    .as_array()?
                    .iter()
                    .any(|f| f["status"] == "resolved"))
            .then_some(())
        },
    )
    .await;
    assert!(
        resolved.is_some(),
        "findings did not resolve in {:?}: {:?}",
        healed.elapsed(),
        get_json(&ns, HTTP, "/api/findings")
    );
    eprintln!(
        "operator_surfaces: findings resolved {:.1} s after the loss ended",
        healed.elapsed().as_secs_f64()
    );
    let green = wait_json(
        &ns,
        2 * window + Duration::from_secs(5),
        HTTP,
        "/api/tor-pairs",
        |v| {
            v["cells"]
                .as_array()?
                .iter()
                .all(|c| c["status"] == "ok")
                .then_some(())
        },
    )
    .await;
    assert!(
        green.is_some(),
        "{:?}",
        get_json(&ns, HTTP, "/api/tor-pairs")
    );
    let page = chromium(&ns, dir.path(), None);
    assert_page_is_clean(&page, "page after the loss");
    assert!(
        page.dom
            .contains("class=\"finding\" data-status=\"resolved\""),
        "{}",
        page.dom
    );

    // Screenshots of each stage land in target/ui-screenshots/; the README's
    // docs/ui.png is a copy of loss.png.
    let shot = shots.join("recovered.png");
    let p = chromium(&ns, dir.path(), Some(&shot));
    let png = std::fs::read(&shot)
        .unwrap_or_else(|e| panic!("no screenshot {}: {e}\n{}", shot.display(), p.log));
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 20_000,
        "screenshot of {} bytes",
        png.len()
    );

    fx.go();
    fx.expect("destroyed");
    Proc::stop_all(agents.iter_mut().chain([&mut ctl, &mut prometheus]));
}
