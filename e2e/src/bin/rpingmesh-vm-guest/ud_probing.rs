//! Scenario ud_probing: agents probing over UD QPs on one rxe device, and the rdma
//! endpoint's timestamp accuracy against libibverbs' own UD ping-pong.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rpingmesh_e2e::vm::*;
use rpingmesh_e2e::*;
use serde_json::{json, Value};

use crate::harness::*;

/// Agents on one rxe device, one GID each: four IPv4-mapped GIDs in two ToRs under one
/// controller, two IPv6 GIDs in a third ToR under another (RoCE v2 cannot carry a probe
/// between an IPv4 and an IPv6 GID). Every agent probes for `UD_PROBE_SECS`; the result
/// holds every window the controllers received.
/// Then, with the agents stopped, the timestamp accuracy of the rdma endpoint: its
/// network RTT back to back (`rpingmesh-hw-check`) against libibverbs' own UD
/// ping-pong between the same two GIDs (sparse probes on an idle TCG guest mostly measure
/// how long a halted vCPU takes to wake, for any program alike).
pub(crate) async fn ud_probing(dir: &Path) -> Result<Value> {
    sh(&[
        "ip", "link", "add", UD_NETDEV, "type", "veth", "peer", "name", "vudp",
    ])?;
    for ip in UD_V4 {
        sh(&["ip", "addr", "add", &format!("{ip}/24"), "dev", UD_NETDEV])?;
    }
    for ip in UD_V6 {
        sh(&[
            "ip",
            "-6",
            "addr",
            "add",
            &format!("{ip}/64"),
            "dev",
            UD_NETDEV,
            "nodad",
        ])?;
    }
    sh(&["ip", "link", "set", UD_NETDEV, "up"])?;
    sh(&["ip", "link", "set", "vudp", "up"])?;
    sh(&[
        "rdma", "link", "add", UD_DEVICE, "type", "rxe", "netdev", UD_NETDEV,
    ])?;
    let want: Vec<String> = UD_V4
        .iter()
        .map(|ip| v4_gid(*ip))
        .chain(UD_V6.iter().map(|ip| v6_gid(ip)))
        .collect();
    let table = wait_gids(UD_DEVICE, &want)?;

    let ctl4 = guest_controller(dir, "controller-v4")?;
    let ctl6 = guest_controller(dir, "controller-v6")?;
    let common = [
        ("--service-tracing-mode", "off".to_string()),
        ("--analysis-window-sec", "3".into()),
        ("--pinglist-update-interval-sec", "5".into()),
    ];
    let mut agents = Vec::new();
    let mut plan = Vec::new();
    for (i, ip) in UD_V4.iter().enumerate() {
        let gid = v4_gid(*ip);
        let id = format!("ud-v4-{}", i + 1);
        agents.push(rdma_agent(
            dir,
            &id,
            UD_V4_TORS[i],
            &ctl4,
            UD_DEVICE,
            table[&gid],
            &common,
        )?);
        plan.push(json!({"agent": id, "gid": gid, "gid_index": table[&gid], "tor": UD_V4_TORS[i], "family": "v4"}));
    }
    for (i, ip) in UD_V6.iter().enumerate() {
        let gid = v6_gid(ip);
        let id = format!("ud-v6-{}", i + 1);
        agents.push(rdma_agent(
            dir,
            &id,
            UD_V6_TOR,
            &ctl6,
            UD_DEVICE,
            table[&gid],
            &common,
        )?);
        plan.push(json!({"agent": id, "gid": gid, "gid_index": table[&gid], "tor": UD_V6_TOR, "family": "v6"}));
    }
    wait_rnics(&ctl4.endpoint(), UD_V4.len(), Duration::from_secs(60)).await?;
    wait_rnics(&ctl6.endpoint(), UD_V6.len(), Duration::from_secs(60)).await?;
    let probing_from = unix_ns_now();
    tokio::time::sleep(Duration::from_secs(UD_PROBE_SECS)).await;
    let res = res_qp();

    // Stopping flushes the open windows to the controllers.
    Proc::stop_all(&mut agents);
    let mut windows = Vec::new();
    for ctl in [&ctl4, &ctl6] {
        let mut op = operator(&ctl.endpoint()).await?;
        windows.extend(dedupe(all_windows(&mut op).await?).iter().map(summary_json));
    }
    let agent_logs: BTreeMap<String, Value> = agents
        .iter()
        .map(|a| {
            let log = a.stderr();
            let errors: Vec<&str> = log
                .lines()
                .filter(|l| l.contains("\"level\":\"ERROR\"") || l.contains("\"level\":\"WARN\""))
                .take(20)
                .collect();
            (
                a.name.clone(),
                json!({ "warnings_and_errors": errors, "tail": tail_lines(&log, 5) }),
            )
        })
        .collect();
    drop(agents);
    let (ga, gb) = (table[&v4_gid(UD_V4[0])], table[&v4_gid(UD_V4[1])]);
    // One round: what an operator's hw-check shows. Its accuracy against ibv_ud_pingpong
    // is a ratio of timings, for `cargo xtask bench` (bench_rdma), not this scenario.
    let endpoint_rtt = vec![hw_check_rtt(dir, ga, gb, 0)];
    Ok(json!({
        "device": UD_DEVICE,
        "gid_table": table,
        "agents": plan,
        "probing_from_unix_ns": probing_from,
        "endpoint_rtt": endpoint_rtt,
        "windows": windows,
        "res_qp": res,
        "agent_logs": agent_logs,
    }))
}

/// `rpingmesh-hw-check` between two GID indexes of the UD device: 300 probes back to back
/// through two `RdmaEndpoint`s, network RTT (T5-T2)-(T4-T3) in ns.
pub(crate) fn hw_check_rtt(dir: &Path, gid_a: u32, gid_b: u32, round: u32) -> Value {
    let run = || -> Result<Value> {
        let mut p = Proc::spawn(
            dir,
            &format!("hw-check-{round}"),
            None,
            &bin("rpingmesh-hw-check"),
            &[
                "--gid-index",
                &format!("{gid_a},{gid_b}"),
                "--count",
                "300",
                UD_DEVICE,
            ]
            .map(String::from),
        )?;
        p.wait_exit(Duration::from_secs(120))
            .context("hw-check did not finish")?;
        let out = p.stdout();
        // "<path> <probes> <min_ns> <p50_ns> <p99_ns> <max_ns>" after the header.
        let row: Vec<u64> = out
            .lines()
            .skip_while(|l| !l.starts_with("path"))
            .nth(1)
            .map(|l| {
                l.split_whitespace()
                    .skip(1)
                    .filter_map(|w| w.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        if row.len() != 5 {
            bail!("no RTT row in hw-check output: {out}{}", p.stderr());
        }
        let mut v = json!({"probes": row[0], "min_ns": row[1], "p50_ns": row[2], "p99_ns": row[3], "max_ns": row[4]});
        if round == 0 {
            // What an operator sees (the host test checks its parts).
            v["stdout"] = json!(out);
        }
        Ok(v)
    };
    run().unwrap_or_else(|e| json!({ "error": format!("{e:#}") }))
}

/// `ibv_ud_pingpong` between (device, GID index) `a` (server) and `b`, `iters` round trips
/// of 40 bytes, busy-polling and with `-e`: each one's usec/iter.
pub(crate) fn ud_pingpong_between(
    dir: &Path,
    a: (&str, u32),
    b: (&str, u32),
    iters: u32,
    round: u32,
) -> Value {
    let (gid_a, gid_b) = (a.1, b.1);
    let run = |events: bool, port: u16| -> Result<Value> {
        let mut common: Vec<String> = [
            "-p",
            &port.to_string(),
            "-n",
            &iters.to_string(),
            "-s",
            "40",
        ]
        .map(String::from)
        .into();
        if events {
            common.push("-e".into());
        }
        let tag = format!("{}-{round}", if events { "events" } else { "busy" });
        let mut sa = common.clone();
        sa.extend(["-d".into(), a.0.into(), "-g".into(), gid_a.to_string()]);
        let side = |who: &str, args: &[String]| {
            let name = format!("ud_pingpong-{tag}-{who}");
            Proc::spawn(dir, &name, None, Path::new("ibv_ud_pingpong"), args)
        };
        let mut server = side("server", &sa)?;
        wait_listening(port, Duration::from_secs(20))?;
        let mut sb = common;
        sb.extend([
            "-d".into(),
            b.0.into(),
            "-g".into(),
            gid_b.to_string(),
            "127.0.0.1".into(),
        ]);
        let mut client = side("client", &sb)?;
        client.wait_exit(Duration::from_secs(60));
        server.wait_exit(Duration::from_secs(5));
        let text = client.stdout();
        let usec = text
            .lines()
            .find(|l| l.contains("usec/iter"))
            .and_then(|l| l.split_whitespace().rev().nth(1)?.parse::<f64>().ok());
        Ok(json!({ "usec_per_iter": usec, "output": text, "stderr": client.stderr() }))
    };
    let err = |e: anyhow::Error| json!({ "error": format!("{e:#}") });
    json!({
        "busy": run(false, 18777 + 2 * round as u16).unwrap_or_else(err),
        "events": run(true, 18778 + 2 * round as u16).unwrap_or_else(err),
    })
}
