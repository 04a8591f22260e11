//! The benchmark scenarios of `cargo xtask bench` that need real RDMA: probe round trips
//! over rxe, service-path latency, the RC ring's CPU and latency, agent CPU under load.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rpingmesh_e2e::vm::*;
use rpingmesh_e2e::*;
use rpingmesh_proto::operator::ListServicePathsRequest;
use serde_json::{json, Value};

use crate::bridge_net::*;
use crate::faults::register_ghost_in;
use crate::harness::*;
use crate::rc_ring::{rc_peer_args, wait_rings_up};
use crate::service_tracing::{rc_ring_windows, Driven};
use crate::ud_probing::ud_pingpong_between;

/// The numbers of `cargo xtask bench` that need real RDMA (run from the release build):
/// 1. probe round trips/s of the agent's drivers over rxe (agent-bench --rdma) against
///    `ibv_ud_pingpong` between the same two GIDs, rounds alternated;
/// 2. service-path latency: from a QP's modify to RTR (rdma-qp-churn stamps it) until the
///    controller lists the path, for `BENCH_PAIRS` pairs, with agents in kprobe mode.
pub(crate) async fn bench_rdma(dir: &Path) -> Result<Value> {
    svc_network()?;
    let g = [svc_gid_index(0), svc_gid_index(1)];
    let mut rounds = Vec::new();
    for round in 0..BENCH_ROUNDS {
        let mut p = Proc::spawn(
            dir,
            &format!("agent-bench-{round}"),
            None,
            &bin("agent-bench"),
            &[
                "--rdma".to_string(),
                format!("{}:{},{}:{}", SVC_DEVICES[0], g[0], SVC_DEVICES[1], g[1]),
                "--runs".into(),
                "1".into(),
                "--seconds-per-run".into(),
                BENCH_SECONDS.to_string(),
            ],
        )?;
        p.wait_exit(Duration::from_secs(120))
            .context("agent-bench did not finish")?;
        let agent: Value = p
            .stdout()
            .lines()
            .find_map(|l| serde_json::from_str(l).ok())
            .with_context(|| format!("agent-bench printed nothing: {}", p.stderr()))?;
        let ud = ud_pingpong_between(
            dir,
            (SVC_DEVICES[0], g[0]),
            (SVC_DEVICES[1], g[1]),
            5000,
            round,
        );
        rounds.push(json!({ "agent": agent, "ud_pingpong": ud }));
    }

    // Service-path latency.
    let ctl = guest_controller(dir, "controller")?;
    let ep = ctl.endpoint();
    let extra = [
        (
            "--service-flow-report-interval-ms",
            BENCH_REPORT_INTERVAL_MS.to_string(),
        ),
        ("--pinglist-update-interval-sec", "5".into()),
    ];
    let mut agents = Vec::new();
    for i in 0..2 {
        agents.push(rdma_agent(
            dir,
            &format!("bench-{i}"),
            SVC_TORS[i],
            &ctl,
            SVC_DEVICES[i],
            g[i],
            &extra,
        )?);
    }
    wait_rnics(&ep, 2, Duration::from_secs(60)).await?;
    for a in &agents {
        wait_for(
            Duration::from_secs(90),
            Duration::from_millis(100),
            || async { a.stderr().contains("service tracing on").then_some(()) },
        )
        .await
        .with_context(|| format!("{}: tracing never came on", a.name))?;
    }
    let mut p = Driven::qp_churn(dir, g, 0, BENCH_PAIRS, &[])?;
    p.line("ready")?;
    p.line("churned")?;
    // (local GID, local QPN) -> RTR time, for both sides of every pair (the two devices
    // number their QPs independently, so a QPN alone is ambiguous).
    let gids = [v4_gid(SVC_IPS[0]), v4_gid(SVC_IPS[1])];
    let mut rtr: BTreeMap<(String, u32), u64> = BTreeMap::new();
    for _ in 0..BENCH_PAIRS {
        let f = p.line("pair")?;
        rtr.insert((gids[0].clone(), f[0].parse()?), f[3].parse()?);
        rtr.insert((gids[1].clone(), f[1].parse()?), f[4].parse()?);
    }
    // First time each QP is listed: sampled every 20 ms.
    let mut listed: BTreeMap<(String, u32), u64> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut op = operator(&ep).await?;
    while listed.len() < rtr.len() && Instant::now() < deadline {
        let paths = op
            .list_service_paths(ListServicePathsRequest::default())
            .await
            .map(|r| r.into_inner().paths)
            .unwrap_or_default();
        let now = unix_ns_now();
        for p in &paths {
            for q in &p.qps {
                let k = (p.source_gid.clone(), q.local_qpn);
                if rtr.contains_key(&k) {
                    listed.entry(k).or_insert(now);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = p.say("destroy");
    let latencies_ms: Vec<f64> = listed
        .iter()
        .map(|(q, at)| at.saturating_sub(rtr[q]) as f64 / 1e6)
        .collect();
    Proc::stop_all(&mut agents);
    drop(ctl);
    let load = bench_load(dir, g).await?;
    let rc_ring_cpu = bench_rc_ring_cpu(dir, g).await?;
    let rc_ring = (0..BENCH_ROUNDS)
        .map(|round| rc_ring_bench_round(dir, g, round))
        .collect::<Vec<_>>();
    Ok(json!({
        "rc_ring": rc_ring,
        "rc_ring_cpu": rc_ring_cpu,
        "rounds": rounds,
        "service_path_latency_ms": latencies_ms,
        "qps": rtr.len(),
        "report_interval_ms": BENCH_REPORT_INTERVAL_MS,
        "load": load,
    }))
}

/// The ring poller's CPU: two agents (each probes the other and answers it) with no ring
/// (`rc_ring_pinglists: service`, and no service runs), then with a ring each way on their
/// ToR mesh; the defaults otherwise (1 s ring probes, 200 us lead, 1 ms hot wait), UD probes
/// at 10/s in both. CPU of each agent over `RC_CPU_SECS`, after a warm-up.
pub(crate) async fn bench_rc_ring_cpu(dir: &Path, g: [u32; 2]) -> Result<Value> {
    let mut runs = Vec::new();
    for lists in ["service", "tor_mesh"] {
        let ctl = guest_controller(dir, &format!("controller-rc-cpu-{lists}"))?;
        let extra = rc_peer_args(lists, 1000, false);
        let mut agents = Vec::new();
        for i in 0..2 {
            agents.push(rdma_agent(
                dir,
                &format!("rc-cpu-{lists}-{i}"),
                RC_PEERS_TOR,
                &ctl,
                SVC_DEVICES[i],
                g[i],
                &extra,
            )?);
        }
        wait_rnics(&ctl.endpoint(), 2, Duration::from_secs(60)).await?;
        if lists == "tor_mesh" {
            wait_rings_up(agents.iter()).await?;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        let (cpu, secs) = cpu_pct_over(&agents, Duration::from_secs(RC_CPU_SECS)).await;
        let windows = rc_ring_windows(&ctl.endpoint()).await;
        Proc::stop_all(&mut agents);
        runs.push(json!({
            "rc_ring_pinglists": lists, "agent_cpu_pct": cpu, "secs": secs,
            "ring_windows": windows["windows"].as_array().map_or(0, Vec::len),
            "ring_probes": windows["windows"].as_array().map_or(0, |w| w
                .iter()
                .map(|w| w["total"].as_u64().unwrap_or(0))
                .sum::<u64>()),
        }));
    }
    Ok(json!(runs))
}

/// Each of `agents`' CPU, % of one core, over the next `span` (slept through), and the
/// seconds that really passed.
async fn cpu_pct_over(agents: &[Proc], span: Duration) -> (Vec<f64>, f64) {
    let cpu0: Vec<f64> = agents.iter().map(|a| cpu_seconds(a.pid())).collect();
    let w0 = Instant::now();
    tokio::time::sleep(span).await;
    let secs = w0.elapsed().as_secs_f64();
    let cpu = agents
        .iter()
        .zip(&cpu0)
        .map(|(a, c0)| 100.0 * (cpu_seconds(a.pid()) - c0) / secs)
        .collect();
    (cpu, secs)
}

/// Only the RC ring rounds of `bench_rdma` (`--only bench_rc_ring`): for working on them.
pub(crate) const BENCH_RC_RING: &str = "bench_rc_ring";

pub(crate) fn bench_rc_ring(dir: &Path) -> Result<Value> {
    svc_network()?;
    let g = [svc_gid_index(0), svc_gid_index(1)];
    let rc_ring = (0..BENCH_ROUNDS)
        .map(|round| rc_ring_bench_round(dir, g, round))
        .collect::<Vec<_>>();
    Ok(json!({ "rc_ring": rc_ring }))
}

/// One round of the RC ring bench between the two service devices, each measurement next
/// to its perftest baseline between the same GIDs: the ring's depth-one echo round trip
/// (32-byte messages) against `ib_write_lat` (which reports half a round trip), and
/// pipelined one-way messages per second through a 64 KiB ring against `ib_write_bw`.
pub(crate) fn rc_ring_bench_round(dir: &Path, g: [u32; 2], round: u32) -> Value {
    let server_ip = SVC_IPS[1];
    let ring = |what: &str, port: u16, sink: bool, scenario: &[&str]| -> Result<Value> {
        let timeout = ["--timeout-sec".to_string(), "300".into()];
        let mut sargs = timeout.to_vec();
        // Like ib_write_lat's, the echoing side spins rather than sleeps.
        sargs.push(if sink { "--sink" } else { "--busy-poll" }.into());
        let mut cargs = timeout.to_vec();
        cargs.extend(scenario.iter().map(|s| s.to_string()));
        let name = format!("ring-{what}-{round}");
        let (mut server, mut client) = rc_ring_pair(dir, &name, port, &sargs, &cargs)?;
        client
            .wait_exit(Duration::from_secs(320))
            .context("ring client did not finish")?;
        server.wait_exit(Duration::from_secs(10));
        serde_json::from_str(client.stdout().trim())
            .with_context(|| format!("ring client: {}", client.stderr()))
    };
    // perftest: the server listens for the client's TCP exchange, then both run.
    let perftest = |tool: &str, port: u16, extra: &[&str]| -> Result<Vec<f64>> {
        let common = |dev: &str, gid: u32| -> Vec<String> {
            let mut a: Vec<String> = [
                "-d",
                dev,
                "-x",
                &gid.to_string(),
                "-s",
                "32",
                "-p",
                &port.to_string(),
                "-F",
            ]
            .map(String::from)
            .to_vec();
            a.extend(extra.iter().map(|s| s.to_string()));
            a
        };
        let mut server = Proc::spawn(
            dir,
            &format!("{tool}-serve-{round}"),
            None,
            Path::new(tool),
            &common(SVC_DEVICES[1], g[1]),
        )?;
        wait_listening(port, Duration::from_secs(20))?;
        let mut cargs = common(SVC_DEVICES[0], g[0]);
        cargs.push(server_ip.to_string());
        let mut client = Proc::spawn(
            dir,
            &format!("{tool}-run-{round}"),
            None,
            Path::new(tool),
            &cargs,
        )?;
        client
            .wait_exit(Duration::from_secs(300))
            .with_context(|| format!("{tool} did not finish"))?;
        server.wait_exit(Duration::from_secs(10));
        // The result row: the last line starting with the message size.
        let out = client.stdout();
        out.lines()
            .rfind(|l| l.trim_start().starts_with("32 "))
            .map(|l| {
                l.split_whitespace()
                    .filter_map(|w| w.parse().ok())
                    .collect()
            })
            .with_context(|| format!("no result row from {tool}: {out}{}", client.stderr()))
    };
    let port = 7700 + round as u16 * 10;
    let r = (|| -> Result<Value> {
        let rtt = ring("rtt", port, false, &["rtt", "500", "5000"])?;
        // #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9% (usec, one way)
        let lat = perftest("ib_write_lat", port + 1, &["-n", "5000"])?;
        let tput = ring("stream", port + 2, true, &["stream", "100000"])?;
        // #bytes #iterations BW_peak BW_average MsgRate[Mpps]
        let bw = perftest("ib_write_bw", port + 3, &["-n", "100000"])?;
        Ok(json!({
            "ring_rtt_p50_ns": rtt["p50_ns"], "ring_rtt_p99_ns": rtt["p99_ns"],
            "ib_write_lat_typical_us": lat.get(4), "ib_write_lat_99_us": lat.get(7),
            "ring_msgs_per_sec": tput["msgs_per_sec"],
            "ib_write_bw_mpps": bw.get(4),
        }))
    })();
    r.unwrap_or_else(|e| json!({ "error": format!("{e:#}") }))
}

/// One prober agent and one responder-only agent at LOAD_PROBES_PER_SEC, on `transport`
/// between the two service devices' addresses: the prober's and the responder's CPU
/// (% of one core) over LOAD_SECS; on rdma also with a dead peer added to the prober's
/// pinglist, and the live target's probes/s in both phases (from the windows).
pub(crate) async fn bench_load(dir: &Path, g: [u32; 2]) -> Result<Value> {
    let mut out = json!({});
    for transport in ["rdma", "udp"] {
        let ctl = guest_controller(dir, &format!("controller-load-{transport}"))?;
        let mut agents = Vec::new();
        for (i, role) in ["prober", "responder"].iter().enumerate() {
            let mut args: Vec<String> = [
                ("--agent-id", format!("load-{role}")),
                ("--tor-id", BENCH_LOAD_TOR.to_string()),
                ("--controller-addr", ctl.addr.to_string()),
                ("--transport", transport.to_string()),
                ("--metrics-enabled", "false".into()),
                ("--service-tracing-mode", "off".into()),
                ("--analysis-window-sec", "2".into()),
                ("--pinglist-update-interval-sec", "3".into()),
                // One probe per round at exactly the offered rate (as the footprint
                // bench does: rounds of 1/rate; shorter rounds plus the rate cap
                // delivered only ~155 of 200/s to a lone target).
                (
                    "--probe-interval-ms",
                    (1000 / LOAD_PROBES_PER_SEC).max(1).to_string(),
                ),
                (
                    "--tor-mesh-probe-rate-per-second",
                    LOAD_PROBES_PER_SEC.to_string(),
                ),
                ("--responder-only", (i == 1).to_string()),
                // Measured as configured: no self-protection throttle, and no Hostping
                // (its host check's loopback tests would run inside the measurement).
                ("--self-protection-enabled", "false".into()),
                ("--hostping-enabled", "false".into()),
            ]
            .into_iter()
            .flat_map(|(k, v)| [k.to_string(), v])
            .collect();
            if transport == "rdma" {
                args.extend([
                    "--allowed-device-names".into(),
                    SVC_DEVICES[i].into(),
                    "--gid-index".into(),
                    g[i].to_string(),
                ]);
            } else {
                args.extend(["--udp-addresses".into(), SVC_IPS[i].to_string()]);
            }
            agents.push(Proc::spawn(
                dir,
                &format!("load-{transport}-{role}"),
                None,
                &bin(AGENT_BIN),
                &args,
            )?);
        }
        wait_rnics(&ctl.endpoint(), 2, Duration::from_secs(60)).await?;
        // Warm: the first pinglist, address handles, one window.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let mut phases = Vec::new();
        let mut ghost = None;
        for phase in ["alone", "dead_peer"] {
            if phase == "dead_peer" {
                if transport != "rdma" {
                    break;
                }
                ghost = Some(register_ghost_in(ctl.endpoint(), BENCH_LOAD_TOR));
                // One refresh puts it on the list; one window passes.
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            let t0 = unix_ns_now();
            let (cpu, _) = cpu_pct_over(&agents, Duration::from_secs(LOAD_SECS)).await;
            phases.push(json!({
                "phase": phase, "from_unix_ns": t0, "to_unix_ns": unix_ns_now(),
                "prober_cpu_pct": cpu[0], "responder_cpu_pct": cpu[1],
            }));
        }
        Proc::stop_all(&mut agents);
        if let Some(g) = ghost {
            g.abort();
        }
        let mut op = operator(&ctl.endpoint()).await?;
        let windows: Vec<Value> = dedupe(all_windows(&mut op).await?)
            .iter()
            .map(summary_json)
            .collect();
        out[transport] = json!({ "phases": phases, "windows": windows });
    }
    out["probes_per_sec"] = json!(LOAD_PROBES_PER_SEC);
    Ok(out)
}
