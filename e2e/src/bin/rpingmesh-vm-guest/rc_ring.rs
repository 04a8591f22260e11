//! Scenarios rc_ring and rc_ring_peers: the polled RC write ring between real processes over
//! RDMA-CM, its validation list, dead servers and the agent's ring peers.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rpingmesh_e2e::vm::*;
use rpingmesh_e2e::*;
use serde_json::{json, Value};

use crate::bridge_net::*;
use crate::harness::*;
use crate::service_tracing::rc_ring_windows;

/// Seed 001's validation list over real RC QPs and RDMA-CM: rpingmesh-rc-ring server and
/// client processes between the two service rxe devices (behind their bridge), one run
/// per scenario (see `RC_RING_RUNS`). Afterwards, no QP of theirs may be left.
pub(crate) async fn rc_ring(dir: &Path) -> Result<Value> {
    svc_network()?;
    let mut v = json!({});
    for (i, run) in RC_RING_RUNS.iter().enumerate() {
        let port = 7600 + i as u16;
        let started = Instant::now();
        let budget = ["--budget".to_string(), run.budget.to_string()];
        let timeout = ["--timeout-sec".to_string(), "600".into()];
        let mut server_args = [&budget[..], &timeout[..]].concat();
        server_args.extend(["--connections".into(), run.connections.to_string()]);
        if run.sink {
            server_args.push("--sink".into());
        }
        let mut args = [&budget[..], &timeout[..]].concat();
        args.extend(run.scenario.iter().map(|s| s.to_string()));
        let name = format!("rc-ring-{}", run.name);
        let (mut server, mut client) = rc_ring_pair(dir, &name, port, &server_args, &args)?;
        let client_exit = client.wait_exit(Duration::from_secs(900));
        let server_exit = server.wait_exit(Duration::from_secs(30));
        let parse = |p: &Proc, exit: Option<std::process::ExitStatus>| -> Value {
            match exit {
                Some(s) if s.success() => serde_json::from_str(p.stdout().trim()).unwrap_or_else(
                    |e| json!({ "error": format!("bad output {:?}: {e}", p.stdout()) }),
                ),
                Some(s) => json!({ "error": format!("exit {s}: {}", p.stderr().trim()) }),
                None => json!({ "error": "did not exit in time" }),
            }
        };
        v[run.name] = json!({
            "client": parse(&client, client_exit),
            "server": parse(&server, server_exit),
            "elapsed_ms": started.elapsed().as_millis() as u64,
        });
    }
    // A peer that dies (its kernel disconnects it) and one that falls silent (its RoCE
    // frames dropped at the bridge: no disconnect can arrive, only the RC retries end it).
    v["dead_server"] = rc_ring_dead_server(dir, false)?;
    v["silent_server"] = rc_ring_dead_server(dir, true)?;
    v["qps_left"] = json!(res_qp()
        .as_array()
        .map(|a| a
            .iter()
            .filter(|q| q["comm"].as_str() == Some("rpingmesh-rc-ri"))
            .count())
        .unwrap_or(0));
    Ok(v)
}

/// A peer lost with its ring established, while the client pipelines: the echo server
/// killed -9, or (`silent`) every RoCE frame to and from it dropped at the bridge. The
/// client must end with one error line (the CM's disconnect, or a WRITE failed after the
/// RC retries), not wait out its timeout.
pub(crate) fn rc_ring_dead_server(dir: &Path, silent: bool) -> Result<Value> {
    let (port, what) = if silent {
        (7691, "silent")
    } else {
        (7690, "dead")
    };
    let timeout = ["--timeout-sec".to_string(), "120".into()];
    let mut client_args = timeout.to_vec();
    client_args.extend(
        [
            // 0.27 s a try, so a silent peer fails a WRITE after about 2 s (the CM's
            // default here is seconds a try).
            "--ack-timeout-exp",
            if silent { "16" } else { "0" },
            "pipeline",
            "100000000",
        ]
        .map(String::from),
    );
    let name = format!("rc-ring-{what}");
    let (mut server, mut client) = rc_ring_pair(dir, &name, port, &timeout, &client_args)?;
    // Messages flowing: the server's QP exists and some seconds passed.
    std::thread::sleep(Duration::from_secs(3));
    let running_before_kill = client.alive();
    let killed = Instant::now();
    let silenced = if silent {
        let port = format!("{}p", SVC_NETDEVS[1]);
        nft_apply(&format!(
            "table bridge rcsilent {{\n chain f {{\n  type filter hook forward priority 0; policy accept;\n  \
             iifname \"{port}\" udp dport 4791 drop\n  oifname \"{port}\" udp dport 4791 drop\n }}\n}}\n"
        ))
    } else {
        server.signal(libc::SIGKILL);
        server.wait_exit(Duration::from_secs(10));
        Ok(())
    };
    let exit = match silenced {
        Ok(()) => client.wait_exit(Duration::from_secs(90)),
        Err(_) => None,
    };
    if silent {
        let _ = sh(&["nft", "delete", "table", "bridge", "rcsilent"]);
        server.signal(libc::SIGKILL);
        server.wait_exit(Duration::from_secs(10));
    }
    silenced?;
    Ok(json!({
        "client_running_before_kill": running_before_kill,
        "client_exit": exit.map(|s| s.to_string()),
        "client_success": exit.map(|s| s.success()),
        "client_exit_after_kill_ms": exit.map(|_| killed.elapsed().as_millis() as u64),
        "client_stderr": client.stderr().trim(),
    }))
}

/// The rc_ring_peers agents: RC rings to their ToR mesh, several probes per window,
/// the windows of the service scenario (TCG's sleeps overshoot).
/// `tcg_windows`: polling windows wide enough for TCG's late wake-ups (else the defaults).
pub(crate) fn rc_peer_args(
    rc_lists: &str,
    interval_ms: u64,
    tcg_windows: bool,
) -> Vec<(&'static str, String)> {
    let mut a = vec![
        ("--service-tracing-mode", "off".into()),
        ("--analysis-window-sec", "2".into()),
        ("--pinglist-update-interval-sec", "3".into()),
        ("--tor-mesh-probe-rate-per-second", "10".into()),
        ("--rc-ring-pinglists", rc_lists.into()),
        ("--rc-ring-probe-interval-ms", interval_ms.to_string()),
        (
            "--rc-ring-probe-timeout-ms",
            interval_ms.min(500).to_string(),
        ),
    ];
    if tcg_windows {
        a.push(("--rc-ring-poll-lead-us", "20000".into()));
        a.push(("--rc-ring-hot-wait-us", "50000".into()));
        // The rings' ACK timeout set by the agent (0.27 s a try): exercised, not relied on
        // (a killed peer's kernel disconnects it at once).
        a.push(("--rc-ring-ack-timeout-exp", "16".into()));
    }
    a
}

/// The `retry_in_s` of every "rc ring: connect failed" line, in order.
pub(crate) fn connect_retries(log: &str) -> Vec<Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| {
            v["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("rc ring: connect failed"))
        })
        .map(|v| v["fields"]["retry_in_s"].clone())
        .collect()
}

/// Waits (up to 60 s each) until every agent has logged a ring of its own connected.
pub(crate) async fn wait_rings_up(agents: impl IntoIterator<Item = &Proc>) -> Result<()> {
    for p in agents {
        wait_for(
            Duration::from_secs(60),
            Duration::from_millis(200),
            || async { (count_lines(&p.stderr(), "rc ring connected") >= 1).then_some(()) },
        )
        .await
        .with_context(|| format!("{}: no RC ring within 60 s", p.name))?;
    }
    Ok(())
}

pub(crate) fn count_lines(log: &str, message: &str) -> usize {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["fields"]["message"] == message)
        .count()
}

/// Agents' RC rings over a peer's life: agents A and B hold rings to each other (their
/// ToR mesh); B is killed -9 with its ring established and stays down for
/// `RC_PEERS_DOWN_SECS` (A's connects back off meanwhile), then B starts again under the
/// same identity and A's ring comes back. Reports A's log lines about its ring and every
/// window A reported over rings, with the times of the kill and the restart.
pub(crate) async fn rc_ring_peers(dir: &Path) -> Result<Value> {
    svc_network()?;
    let g = [svc_gid_index(0), svc_gid_index(1)];
    let ctl = guest_controller(dir, "controller")?;
    let ep = ctl.endpoint();
    let extra = rc_peer_args("tor_mesh", RC_PEERS_INTERVAL_MS, true);
    let agent =
        |id: &str, i: usize| rdma_agent(dir, id, RC_PEERS_TOR, &ctl, SVC_DEVICES[i], g[i], &extra);
    let mut a = agent("rc-a", 0)?;
    let mut b = agent("rc-b", 1)?;
    wait_rnics(&ep, 2, Duration::from_secs(60)).await?;
    let t0 = Instant::now();
    wait_rings_up([&a, &b]).await?;
    let rings_up_ms = t0.elapsed().as_millis() as u64;
    let (cpu0, w0) = (cpu_seconds(a.pid()), Instant::now());
    tokio::time::sleep(Duration::from_secs(RC_PEERS_STEADY_SECS)).await;
    let a_cpu_pct_up = 100.0 * (cpu_seconds(a.pid()) - cpu0) / w0.elapsed().as_secs_f64();

    // The controller keeps a path's last 20 windows: take the early ones now.
    let early = rc_ring_windows(&ep).await;
    let retries_before_kill = connect_retries(&a.stderr()).len();
    let killed_unix_ns = unix_ns_now();
    let killed = Instant::now();
    b.signal(libc::SIGKILL);
    b.wait_exit(Duration::from_secs(10));
    let b_first_log = b.stderr();
    let closed = wait_for(
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            log_line_starting(&a.stderr(), "rc ring closed")
                .map(|l| (l, killed.elapsed().as_millis() as u64))
        },
    )
    .await;
    let (cpu0, w0) = (cpu_seconds(a.pid()), Instant::now());
    tokio::time::sleep(Duration::from_secs(RC_PEERS_DOWN_SECS).saturating_sub(killed.elapsed()))
        .await;
    let a_cpu_pct_down = 100.0 * (cpu_seconds(a.pid()) - cpu0) / w0.elapsed().as_secs_f64();
    // The back-offs since the kill (a first connect may have failed before B listened).
    let retries: Vec<Value> = connect_retries(&a.stderr())
        .into_iter()
        .skip(retries_before_kill)
        .collect();

    let restarted_unix_ns = unix_ns_now();
    let restarted = Instant::now();
    b = agent("rc-b", 1)?;
    let reconnected_ms = wait_for(
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            (count_lines(&a.stderr(), "rc ring connected") >= 2)
                .then(|| restarted.elapsed().as_millis() as u64)
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(RC_PEERS_STEADY_SECS)).await;
    let a_alive = a.alive();
    let a_gid = v4_gid(SVC_IPS[0]);
    let mut windows = rc_ring_windows(&ep).await;
    let mut seen = BTreeMap::new();
    for w in [&early, &windows]
        .iter()
        .filter_map(|v| v["windows"].as_array())
        .flatten()
    {
        let key = (
            w["source"].to_string(),
            w["target"].to_string(),
            w["start"].to_string(),
        );
        seen.entry(key).or_insert_with(|| w.clone());
    }
    windows["windows"] = json!(seen.into_values().collect::<Vec<_>>());
    Proc::stop_all([&mut a, &mut b]);
    let a_log = a.stderr();
    let ring_lines: Vec<&str> = a_log
        .lines()
        .filter(|l| l.contains("rc ring"))
        .take(40)
        .collect();
    Ok(json!({
        "rings_up_ms": rings_up_ms,
        "killed_unix_ns": killed_unix_ns,
        "closed_line": closed.as_ref().map(|c| c.0.clone()),
        "closed_after_kill_ms": closed.map(|c| c.1),
        "connect_retries_in_s": retries,
        "restarted_unix_ns": restarted_unix_ns,
        "reconnected_after_restart_ms": reconnected_ms,
        "a_alive": a_alive,
        "a_cpu_pct_rings_up": a_cpu_pct_up,
        "a_cpu_pct_peer_dead": a_cpu_pct_down,
        "a_gid": a_gid,
        "windows": windows,
        "a_ring_log": ring_lines,
        "b_first_connected": count_lines(&b_first_log, "rc ring connected"),
    }))
}
