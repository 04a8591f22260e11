//! `cargo xtask demo`: a controller and N agents over udp on loopback addresses, with a
//! live per-ToR-pair table from the operator API and the localized findings next to it.
//! As root (with nft), two faults follow each other: an RNIC down (every probe to and
//! from agent-3 dropped), then a ToR down (every probe of the last ToR's agents dropped);
//! each finding opens, then resolves when its fault ends.
//!
//! `cargo xtask demo --scenario NAME` runs a shipped simulator scenario
//! (`sim/scenarios/NAME.yaml`, or a file) paced in real time instead.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use rpingmesh_e2e::demo::DemoLayout;
use rpingmesh_proto::operator::{Finding, ListFindingsRequest, ListTorPairsRequest, TorPairStats};

use crate::procs::{self, Proc};

#[derive(Args)]
pub struct DemoArgs {
    /// Number of agents (one pseudo-RNIC each, on 127.0.1.1, 127.0.1.2, ...).
    #[arg(long, default_value_t = 8)]
    agents: u8,
    /// Number of ToRs the agents are spread over.
    #[arg(long, default_value_t = 2)]
    tors: u8,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long)]
    duration: Option<u64>,
    /// Do not inject the two faults.
    #[arg(long)]
    no_faults: bool,
    /// Run a simulator scenario instead: a name from sim/scenarios/ (demo, example,
    /// rnic_down, rnic_flap, host_stall, tor_down, link_loss, link_down, link_latency,
    /// fault_free) or a scenario file.
    #[arg(long)]
    scenario: Option<String>,
    /// With --scenario: real milliseconds per simulated analysis window.
    #[arg(long, default_value_t = 1500)]
    window_ms: u64,
}

/// The simulator's live view of a shipped scenario (or a file).
fn run_scenario(name: &str, window_ms: u64) -> Result<()> {
    let shipped = crate::root()
        .join("sim/scenarios")
        .join(format!("{name}.yaml"));
    let path = if shipped.is_file() {
        shipped
    } else if std::path::Path::new(name).is_file() {
        std::path::absolute(name)?
    } else {
        let known: Vec<String> = std::fs::read_dir(crate::root().join("sim/scenarios"))?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                e.file_name()
                    .to_str()?
                    .strip_suffix(".yaml")
                    .map(String::from)
            })
            .collect();
        bail!(
            "--scenario {name}: no such scenario (shipped: {})",
            known.join(", ")
        );
    };
    let mut cmd = crate::sim::sim_command();
    cmd.args(["--live", &window_ms.to_string(), "--scenario"]);
    cmd.arg(&path);
    crate::run_streamed(
        cmd,
        &format!("simulated fabric, scenario {}", path.display()),
    )
}

/// One injected fault of the real-mesh demo: the probes of `addrs` are dropped.
struct DemoFault {
    what: String,
    start: Duration,
    end: Duration,
    addrs: Vec<std::net::Ipv4Addr>,
}

/// The two faults: agent-3's RNIC from 40 s to 70 s, the last ToR from 100 s to 130 s
/// (pinglists refresh every 10 s, so every path is measured by 40 s).
fn fault_plan(layout: &DemoLayout) -> Vec<DemoFault> {
    let last_tor = layout.tor_of(layout.agents - 1);
    let tor_agents: Vec<usize> = (0..layout.agents)
        .filter(|&i| layout.tor_of(i) == last_tor)
        .collect();
    let victim = 2.min(layout.agents - 1);
    vec![
        DemoFault {
            what: format!(
                "RNIC down: every probe to and from {} ({}) dropped",
                layout.agent_id(victim),
                layout.agent_ip(victim)
            ),
            start: Duration::from_secs(40),
            end: Duration::from_secs(70),
            addrs: vec![layout.agent_ip(victim)],
        },
        DemoFault {
            what: format!(
                "ToR down: every probe of {last_tor}'s {} agents dropped",
                tor_agents.len()
            ),
            start: Duration::from_secs(100),
            end: Duration::from_secs(130),
            addrs: tor_agents.iter().map(|&i| layout.agent_ip(i)).collect(),
        },
    ]
}

const NFT_TABLE: &str = "rpingmesh_demo";

fn nft(script: &str) -> Result<()> {
    use std::io::Write;
    let mut child = std::process::Command::new("nft")
        .arg("-f")
        .arg("-")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .context("starting nft")?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(script.as_bytes())?;
    let st = child.wait()?;
    if !st.success() {
        bail!("nft failed ({st}) on:\n{script}");
    }
    Ok(())
}

/// Drops the probes (udp port `port`, both ways) of `addrs`; an empty list clears.
fn set_dropped(addrs: &[std::net::Ipv4Addr], port: u16) -> Result<()> {
    let mut script = format!(
        "table inet {NFT_TABLE} {{}}\ndelete table inet {NFT_TABLE}\n\
         table inet {NFT_TABLE} {{\n  chain out {{\n    type filter hook output priority 0;\n"
    );
    if !addrs.is_empty() {
        let set: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
        let set = set.join(", ");
        script += &format!(
            "    ip saddr {{ {set} }} udp sport {port} drop\n    ip daddr {{ {set} }} udp dport {port} drop\n"
        );
    }
    script += "  }\n}\n";
    nft(&script)
}

fn clear_faults() {
    let _ = nft(&format!(
        "table inet {NFT_TABLE} {{}}\ndelete table inet {NFT_TABLE}\n"
    ));
}

const REFRESH: Duration = Duration::from_secs(5);

pub fn run(a: DemoArgs) -> Result<()> {
    if let Some(name) = &a.scenario {
        return run_scenario(name, a.window_ms);
    }
    if a.agents < 2 {
        bail!("--agents must be at least 2 (got {})", a.agents);
    }
    if a.tors == 0 || a.tors > a.agents {
        bail!("--tors must be between 1 and --agents (got {})", a.tors);
    }
    if a.agents > 254 {
        bail!("--agents must be at most 254");
    }
    crate::cargo_release(
        &["rpingmesh-controller", "rpingmesh-agent"],
        &["--bin", "rpingmesh-controller", "--bin", "rpingmesh-agent"],
        "controller, agent",
    )?;
    let controller_bin = procs::release_bin("rpingmesh-controller")?;
    let agent_bin = procs::release_bin("rpingmesh-agent")?;

    let dir = tempfile::Builder::new()
        .prefix("rpingmesh-demo-")
        .tempdir()
        .context("creating the demo directory")?
        .keep();
    eprintln!("xtask demo: logs and database in {}", dir.display());

    let layout = DemoLayout {
        agents: a.agents as usize,
        tors: a.tors as usize,
        ..DemoLayout::DEFAULT
    };
    let port = procs::free_port()?;
    let listen = format!("127.0.0.1:{port}");
    let http = format!("127.0.0.1:{}", procs::free_port()?);
    let metrics = format!("127.0.0.1:{}", procs::free_port()?);
    let mut all: Vec<Proc> = Vec::new();
    let db = format!("sqlite:{}", dir.join("controller.db").display());
    all.push(Proc::spawn(
        &dir,
        "controller",
        None,
        &controller_bin,
        &layout.controller_args(&listen, &db, &http, &metrics),
    )?);
    let addr = procs::wait_listening(&mut all[0], Duration::from_secs(20))?;
    eprintln!("xtask demo: controller listening on {addr}");

    for i in 0..layout.agents {
        let id = layout.agent_id(i);
        all.push(Proc::spawn(
            &dir,
            &id,
            None,
            &agent_bin,
            &layout.agent_args(i, &listen),
        )?);
        eprintln!(
            "xtask demo: {id} on {}:18515 ({}), /metrics on http://{}/metrics",
            layout.agent_ip(i),
            layout.tor_of(i),
            layout.agent_metrics_addr(i)
        );
    }
    eprintln!("xtask demo: controller /metrics on http://{metrics}/metrics");
    eprintln!(
        "xtask demo: Prometheus and Grafana: deploy/prometheus/prometheus.yml and deploy/grafana/"
    );
    println!("\n  web page: http://{http}/   (ToR matrix, service paths, findings, RNICs)\n");
    eprintln!(
        "xtask demo: a table every 5 s (Ctrl-C to stop); pinglists refresh every 10 s, so \
         paths fill in as agents learn about peers that registered after them"
    );
    let faults = if a.no_faults {
        Vec::new()
    } else if !crate::is_root() || !crate::have_tool("nft") {
        eprintln!("xtask demo: not injecting the two faults: they need root and nft (nftables)");
        Vec::new()
    } else {
        let plan = fault_plan(&layout);
        for f in &plan {
            eprintln!(
                "xtask demo: fault at {}-{} s: {}",
                f.start.as_secs(),
                f.end.as_secs(),
                f.what
            );
        }
        plan
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let res = rt.block_on(show(
        &mut all,
        addr,
        a.duration.map(Duration::from_secs),
        &faults,
    ));
    if !faults.is_empty() {
        clear_faults();
    }
    eprintln!("xtask demo: stopping {} processes", all.len());
    procs::stop_all(&mut all);
    eprintln!("xtask demo: logs kept in {}", dir.display());
    res
}

async fn show(
    all: &mut [Proc],
    addr: std::net::SocketAddr,
    duration: Option<Duration>,
    faults: &[DemoFault],
) -> Result<()> {
    let mut op = procs::operator(addr).await?;
    let start = Instant::now();
    let mut active: Option<usize> = None;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut tick = tokio::time::interval(REFRESH);
    tick.tick().await;
    loop {
        let until_end = duration.map(|d| d.saturating_sub(start.elapsed()));
        let stop_at = tokio::time::sleep(until_end.unwrap_or(Duration::from_secs(86400 * 365)));
        tokio::select! {
            _ = &mut ctrl_c => { eprintln!("\nxtask demo: Ctrl-C"); return Ok(()); }
            _ = stop_at => { eprintln!("xtask demo: --duration reached"); return Ok(()); }
            _ = tick.tick() => {}
        }
        if let Some(st) = all[0].poll_exit() {
            bail!(
                "controller exited ({st}):\n{}",
                procs::log_tail(&all[0], 20)
            );
        }
        let mut dead = Vec::new();
        for p in all[1..].iter_mut() {
            if let Some(st) = p.poll_exit() {
                dead.push(format!("{} ({st})", p.name));
            }
        }
        let now = start.elapsed();
        let due = faults.iter().position(|f| f.start <= now && now < f.end);
        if due != active {
            let addrs = due.map(|i| faults[i].addrs.clone()).unwrap_or_default();
            set_dropped(&addrs, rpingmesh_e2e::demo::DEMO_PROBE_PORT)?;
            if let Some(i) = active {
                println!(
                    "\n>>> [{:>4}s] fault over: {}",
                    now.as_secs(),
                    faults[i].what
                );
            }
            if let Some(i) = due {
                println!("\n>>> [{:>4}s] FAULT: {}", now.as_secs(), faults[i].what);
            }
            active = due;
        }
        match op.list_tor_pairs(ListTorPairsRequest {}).await {
            Ok(r) => print!(
                "{}",
                render(
                    start.elapsed(),
                    all.len() - 1 - dead.len(),
                    all.len() - 1,
                    &r.into_inner().pairs
                )
            ),
            Err(e) => eprintln!("xtask demo: ListTorPairs failed: {}", e.message()),
        }
        let req = ListFindingsRequest {
            resolved_limit: 4,
            kind: String::new(),
        };
        match op.list_findings(req).await {
            Ok(r) => print!("{}", render_findings(&r.into_inner().findings)),
            Err(e) => eprintln!("xtask demo: ListFindings failed: {}", e.message()),
        }
        for d in &dead {
            eprintln!("xtask demo: agent {d} exited; see its log");
        }
    }
}

fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1000.0)
}

/// The localized findings under the table (pure, so it is tested).
pub fn render_findings(findings: &[Finding]) -> String {
    if findings.is_empty() {
        return "localized findings: none\n".into();
    }
    let mut s = String::from("localized findings:\n");
    for f in findings {
        let detail = f.evidence.as_ref().map(|e| e.detail.as_str()).unwrap_or("");
        s += &format!(
            "  {:<8} #{} {} {} {} (confidence {:.2}): {}\n",
            if f.open { "OPEN" } else { "resolved" },
            f.id,
            f.kind,
            f.location,
            f.symptom,
            f.confidence,
            detail
        );
    }
    s
}

/// The live table (pure, so it is tested).
pub fn render(elapsed: Duration, up: usize, total: usize, pairs: &[TorPairStats]) -> String {
    let mut s = format!(
        "\n[{:>4}s] agents up {up}/{total}; per ToR pair, latest window of each path\n",
        elapsed.as_secs()
    );
    s += &format!(
        "{:<10} {:<10} {:>5} {:>8} {:>7} {:>12} {:>12} {:>15} {:>18}\n",
        "SRC TOR",
        "DST TOR",
        "PATHS",
        "PROBES",
        "LOSS %",
        "RTT p50 us",
        "RTT p99 us",
        "PROBER p50 us",
        "RESPONDER p50 us"
    );
    if pairs.is_empty() {
        s += "(no path summaries yet: the first analysis window is 5 s)\n";
    }
    let mut sorted: Vec<&TorPairStats> = pairs.iter().collect();
    sorted.sort_by(|a, b| {
        (&a.source_tor_id, &a.target_tor_id).cmp(&(&b.source_tor_id, &b.target_tor_id))
    });
    for p in sorted {
        let loss = if p.probe_total > 0 {
            100.0 * p.probe_failed as f64 / p.probe_total as f64
        } else {
            0.0
        };
        s += &format!(
            "{:<10} {:<10} {:>5} {:>8} {:>7.2} {:>12} {:>12} {:>15} {:>18}\n",
            p.source_tor_id,
            p.target_tor_id,
            p.paths,
            p.probe_total,
            loss,
            us(p.network_rtt_p50_ns),
            us(p.network_rtt_p99_ns),
            us(p.prober_delay_p50_ns),
            us(p.responder_delay_p50_ns)
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_shows_loss_and_microseconds() {
        let p = TorPairStats {
            source_tor_id: "tor-1".into(),
            target_tor_id: "tor-2".into(),
            paths: 16,
            probe_total: 1000,
            probe_success: 990,
            probe_failed: 10,
            loss_ratio: 0.01,
            network_rtt_p50_ns: 1_500,
            network_rtt_p99_ns: 12_000,
            prober_delay_p50_ns: 40_000,
            responder_delay_p50_ns: 8_260,
            invalid_rtt_count: 0,
        };
        let t = render(Duration::from_secs(10), 8, 8, &[p]);
        let row = t.lines().find(|l| l.starts_with("tor-1")).unwrap();
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cols,
            ["tor-1", "tor-2", "16", "1000", "1.00", "1.5", "12.0", "40.0", "8.3"]
        );
        assert!(render(Duration::ZERO, 0, 8, &[]).contains("no path summaries yet"));
    }

    #[test]
    fn findings_lines_say_open_or_resolved() {
        let f = Finding {
            id: 2,
            kind: "rnic".into(),
            location: "agent-3/udp0".into(),
            symptom: "down".into(),
            confidence: 1.0,
            open: true,
            ..Default::default()
        };
        let closed = Finding {
            open: false,
            ..f.clone()
        };
        let s = render_findings(&[f, closed]);
        assert!(
            s.contains("OPEN     #2 rnic agent-3/udp0 down (confidence 1.00)"),
            "{s}"
        );
        assert!(s.contains("resolved #2 rnic agent-3/udp0 down"), "{s}");
        assert_eq!(render_findings(&[]), "localized findings: none\n");
    }
}
