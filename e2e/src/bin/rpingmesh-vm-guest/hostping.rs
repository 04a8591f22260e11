//! Scenario hostping: RNIC-to-RNIC probing inside one host over four rxe devices, once and as
//! part of the agent daemon, with links cut by nftables.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rpingmesh_e2e::vm::*;
use rpingmesh_e2e::*;
use serde_json::{json, Value};

use crate::bridge_net::*;
use crate::harness::*;

/// `rpingmesh-agent hostping --once` on the four devices: its JSON report and exit code.
/// `during` runs once R2R probing has begun (the agent logs it), on this thread.
pub(crate) fn hostping_run(
    dir: &Path,
    name: &str,
    gid_index: u32,
    secs: u64,
    during: impl FnOnce() -> Result<()>,
) -> Result<Value> {
    let devices = HOST_DEVICES.join(",");
    let record = dir.join(format!("{name}.sysfs"));
    let args: Vec<String> = [
        "hostping",
        "--once",
        "--json",
        "--transport",
        "rdma",
        "--allowed-device-names",
        &devices,
        "--gid-index",
        &gid_index.to_string(),
        "--r2r-sec",
        &secs.to_string(),
        "--hostping-r2r-window-sec",
        &HOST_WINDOW_SEC.to_string(),
        "--hostping-loopback-samples",
        "10",
        "--log-level",
        "info",
        "--record",
        &record.to_string_lossy(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let started = Instant::now();
    let mut child = Command::new(bin(AGENT_BIN))
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting rpingmesh-agent hostping")?;
    // Stderr is read on a thread (it must not fill up); the marker line is signalled.
    let stderr = child.stderr.take().context("hostping stderr")?;
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
            if line.contains(rpingmesh_hostping::r2r::STARTED_LOG) {
                let _ = tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let fault = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(()) => during(),
        Err(_) => Err(anyhow::anyhow!("hostping {name}: R2R never started")),
    };
    let out = child.wait_with_output()?;
    let log = reader.join().unwrap_or_default();
    let _ = std::fs::write(dir.join(format!("{name}.stderr")), &log);
    fault?;
    let report: Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "hostping {name}: stdout is not JSON: {}; stderr: {}",
            String::from_utf8_lossy(&out.stdout),
            tail_lines(&log, 10)
        )
    })?;
    Ok(json!({
        "exit_code": out.status.code(),
        "elapsed_ms": started.elapsed().as_millis() as u64,
        "report": report,
        "recording_lines": std::fs::read_to_string(&record).map(|t| t.lines().count()).unwrap_or(0),
    }))
}

pub(crate) async fn hostping(dir: &Path) -> Result<Value> {
    let table = bridged_rxe("brh", &HOST_NETDEVS, &HOST_IPS, &HOST_DEVICES, 40)?;
    let gid_index = table[HOST_DEVICES[0]];
    if HOST_DEVICES.iter().any(|d| table[*d] != gid_index) {
        bail!("hostping devices disagree on the GID index of their address: {table:?}");
    }
    let mut v = json!({ "gid_index": gid_index });
    v["healthy"] = hostping_run(dir, "healthy", gid_index, HOST_HEALTHY_SEC, || Ok(()))?;

    // One device's bridge port down, HOST_DOWN_AT_SEC into the run, until it ends.
    let port = format!("{}p", HOST_NETDEVS[HOST_DOWN_DEVICE]);
    let down = hostping_run(dir, "port_down", gid_index, HOST_DOWN_RUN_SEC, || {
        std::thread::sleep(Duration::from_secs(HOST_DOWN_AT_SEC));
        sh(&["ip", "link", "set", &port, "down"]).map(|_| ())
    });
    sh(&["ip", "link", "set", &port, "up"])?;
    v["port_down"] = down?;
    // The device's port comes back ACTIVE within a few seconds (notes/rdma-vm.md).
    let state = format!(
        "/sys/class/infiniband/{}/ports/1/state",
        HOST_DEVICES[HOST_DOWN_DEVICE]
    );
    let t = Instant::now();
    while !std::fs::read_to_string(&state)
        .unwrap_or_default()
        .contains("ACTIVE")
        && t.elapsed() < Duration::from_secs(20)
    {
        std::thread::sleep(Duration::from_millis(200));
    }

    // A share of the lossy device's RoCE frames dropped at the bridge, both ways.
    let lossy = format!("{}p", HOST_NETDEVS[HOST_LOSSY_DEVICE]);
    let ruleset = format!(
        "table bridge hostping {{\n chain lossy {{\n  type filter hook forward priority 0; policy accept;\n  \
         iifname \"{lossy}\" udp dport 4791 numgen random mod 10 < {HOST_DROP_TENTHS} drop\n  \
         oifname \"{lossy}\" udp dport 4791 numgen random mod 10 < {HOST_DROP_TENTHS} drop\n }}\n}}\n"
    );
    nft_apply(&ruleset)?;
    let lossy_run = hostping_run(dir, "lossy", gid_index, HOST_HEALTHY_SEC, || Ok(()));
    let _ = sh(&["nft", "delete", "table", "bridge", "hostping"]);
    v["lossy"] = lossy_run?;
    v["daemon"] = hostping_daemon(dir, gid_index).await?;
    Ok(v)
}

/// Hostping inside the running agent on the same four devices, reporting to a
/// controller: the first host check (loopback through RC QPs from the agent's monitor
/// task), then one device's bridge port down until the controller holds an R2R finding
/// for it, and up again until the host is clean. Times are measured from the change.
pub(crate) async fn hostping_daemon(dir: &Path, gid_index: u32) -> Result<Value> {
    use rpingmesh_proto::operator::GetHostRequest;
    let ctl = guest_controller(dir, "hp-controller")?;
    let ep = ctl.endpoint();
    let args: Vec<String> = [
        ("--agent-id", "hp-agent".to_string()),
        ("--hostname", HOST_DAEMON_HOSTNAME.into()),
        ("--tor-id", "tor-h".into()),
        ("--controller-addr", ctl.addr.to_string()),
        ("--transport", "rdma".into()),
        ("--allowed-device-names", HOST_DEVICES.join(",")),
        ("--gid-index", gid_index.to_string()),
        ("--metrics-enabled", "false".into()),
        ("--service-tracing-mode", "off".into()),
        ("--log-level", "info".into()),
        ("--hostping-r2r-window-sec", HOST_WINDOW_SEC.to_string()),
        ("--hostping-check-interval-sec", "600".into()),
        ("--hostping-loopback-samples", "5".into()),
    ]
    .into_iter()
    .flat_map(|(k, v)| [k.to_string(), v])
    .collect();
    let mut agent = Proc::spawn(dir, "hp-agent", None, &bin(AGENT_BIN), &args)?;
    // The newest report's JSON and findings (kind, location).
    let latest = || async {
        let mut op = operator(&ep).await.ok()?;
        let h = op
            .get_host(GetHostRequest {
                hostname: HOST_DAEMON_HOSTNAME.into(),
            })
            .await
            .ok()?
            .into_inner();
        let report: Value = serde_json::from_str(&h.report_json).ok()?;
        let findings: Vec<(String, String)> = h
            .findings
            .iter()
            .map(|f| (f.kind.clone(), f.location.clone()))
            .collect();
        Some((report, findings))
    };
    let result = async {
        // 1. The first check's report: loopback paths from the running agent.
        let first = wait_for(
            Duration::from_secs(180),
            Duration::from_millis(500),
            || async {
                let (r, f) = latest().await?;
                r["loopback"]["paths"]
                    .as_array()
                    .is_some_and(|p| !p.is_empty())
                    .then_some((r, f))
            },
        )
        .await
        .context("no host report with loopback results within 180 s")?;
        // 2. One device's port down: the controller holds r2r_down for it (the window
        //    the port went down in may read sporadic first).
        let dev = HOST_DEVICES[HOST_DOWN_DEVICE];
        let port = format!("{}p", HOST_NETDEVS[HOST_DOWN_DEVICE]);
        sh(&["ip", "link", "set", &port, "down"])?;
        let t = Instant::now();
        let down = wait_for(
            Duration::from_secs(60),
            Duration::from_millis(250),
            || async {
                let (_, f) = latest().await?;
                f.iter()
                    .any(|(k, l)| k == "r2r_down" && l == dev)
                    .then_some(f)
            },
        )
        .await;
        let down_ms = t.elapsed().as_millis() as u64;
        sh(&["ip", "link", "set", &port, "up"])?;
        let down = down.with_context(|| format!("no r2r_down for {dev} within 60 s"))?;
        // 3. Up again: the host clean.
        let t = Instant::now();
        wait_for(
            Duration::from_secs(90),
            Duration::from_millis(250),
            || async {
                let (_, f) = latest().await?;
                f.is_empty().then_some(())
            },
        )
        .await
        .context("the host's findings did not clear within 90 s of the port coming up")?;
        let cleared_ms = t.elapsed().as_millis() as u64;
        Ok::<Value, anyhow::Error>(json!({
            "first_report": first.0,
            "first_findings": first.1,
            "down_findings": down,
            "down_ms": down_ms,
            "cleared_ms": cleared_ms,
            "agent_alive": agent.alive(),
        }))
    }
    .await;
    let _ = std::fs::write(dir.join("hp-agent.stderr"), agent.stderr());
    agent.stop();
    let mut ctl = ctl;
    ctl.proc.stop();
    result
}
