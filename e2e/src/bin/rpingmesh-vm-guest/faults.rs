//! Scenario rdma_faults: what the agent does when the RDMA stack fails under it (a device
//! goes down, a peer dies, a ghost registers) and which resources it leaves behind.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rpingmesh_e2e::vm::*;
use rpingmesh_e2e::*;
use serde_json::{json, Value};

use crate::bridge_net::*;
use crate::harness::*;

/// `rdma -j res show <what>` entries of process `pid`.
pub(crate) fn res_of_pid(what: &str, pid: u32) -> Value {
    let all: Value = sh(&["rdma", "-j", "res", "show", what])
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(Value::Null);
    let mine: Vec<Value> = all
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|e| e["pid"].as_u64() == Some(pid as u64))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    json!(mine)
}

/// The QPs, MRs, PDs and CQs `rdma res` lists for process `pid`.
pub(crate) fn held_resources(pid: u32) -> Value {
    json!({
        "qp": res_of_pid("qp", pid), "mr": res_of_pid("mr", pid),
        "pd": res_of_pid("pd", pid), "cq": res_of_pid("cq", pid),
    })
}

/// Waits up to `timeout` for `device`'s port to report `want`; the state last seen.
pub(crate) async fn wait_link_state(device: &str, want: &str, timeout: Duration) -> String {
    wait_for(timeout, Duration::from_millis(100), || {
        let s = link_state(device);
        async move { (s == want).then_some(s) }
    })
    .await
    .unwrap_or_else(|| link_state(device))
}

/// `rdma link show <device>`'s state (ACTIVE, DOWN).
pub(crate) fn link_state(device: &str) -> String {
    sh(&["rdma", "-j", "link", "show", &format!("{device}/1")])
        .ok()
        .and_then(|s| serde_json::from_str::<Value>(&s).ok())
        .and_then(|v| v[0]["state"].as_str().map(String::from))
        .unwrap_or_default()
}

/// Keeps an RNIC registered whose GID is on no fabric (a dead host the controller still
/// lists), re-registering it like an agent would, until the task is aborted.
pub(crate) fn register_ghost(endpoint: String) -> tokio::task::JoinHandle<()> {
    register_ghost_in(endpoint, FAULT_TORS[0])
}

pub(crate) fn register_ghost_in(
    endpoint: String,
    tor: &'static str,
) -> tokio::task::JoinHandle<()> {
    use rpingmesh_proto::controller_agent::{AgentRegistrationRequest, RnicInfo};
    tokio::spawn(async move {
        loop {
            if let Ok(mut c) = controller_client(&endpoint).await {
                let _ = c
                    .register_agent(AgentRegistrationRequest {
                        agent_version: String::new(),
                        agent_id: "ghost".into(),
                        agent_ip: FAULT_DEAD_IP.to_string(),
                        hostname: "ghost".into(),
                        tor_id: tor.into(),
                        rnics: vec![RnicInfo {
                            gid: v4_gid(FAULT_DEAD_IP),
                            qpn: 4242,
                            ip_address: FAULT_DEAD_IP.to_string(),
                            host_name: "ghost".into(),
                            tor_id: tor.into(),
                            device_name: "ghost0".into(),
                        }],
                    })
                    .await;
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    })
}

/// What production does to the rdma transport, on one running fleet:
/// 1. a dead peer (registered, never on the fabric) on every ToR-mesh pinglist;
/// 2. the port of one of the multi-rail agent's RNICs goes down and comes back;
/// 3. a datagram larger than a receive slot, with our Q_Key, to the peer's QP;
/// 4. the multi-rail agent killed with -9: what it leaves in `rdma res`.
///
/// The host test reads the windows (each with its start time) against the phase times.
pub(crate) async fn rdma_faults(dir: &Path) -> Result<Value> {
    let table = bridged_rxe("brf", &FAULT_NETDEVS, &FAULT_IPS, &FAULT_DEVICES, 30)?;
    let gid_index = table[FAULT_DEVICES[0]];
    if FAULT_DEVICES.iter().any(|d| table[*d] != gid_index) {
        bail!("fault devices disagree on the GID index of their address: {table:?}");
    }
    // A device whose netdev has no IPv4 address: no GID at that index.
    if !Path::new(&format!("/sys/class/infiniband/{FAULT_NO_GID_DEVICE}")).exists() {
        sh(&["ip", "link", "add", "vfx", "type", "dummy"])?;
        // No IPv6 either: its link-local address would land at index 1 (later on a slow
        // guest, racing the agent's open).
        sysctl("net.ipv6.conf.vfx.disable_ipv6", "1")?;
        sh(&["ip", "link", "set", "vfx", "up"])?;
        sh(&[
            "rdma",
            "link",
            "add",
            FAULT_NO_GID_DEVICE,
            "type",
            "rxe",
            "netdev",
            "vfx",
        ])?;
    }
    // The host test reads every window of the run from the list taken at its end: the
    // controller keeps them all (the default 20 windows of 2 s had dropped the first ones
    // of a path by the time a slow guest finished, and with them the live windows before
    // the port fault the test counts).
    let ctl = spawn_controller(
        dir,
        "controller",
        None,
        "127.0.0.1:0",
        &[
            "--metrics-enabled",
            "false",
            "--analyzer-window-retention",
            "1000",
        ],
    )?;
    let ghost = register_ghost(ctl.endpoint());
    let common = [
        ("--service-tracing-mode", "off".to_string()),
        ("--analysis-window-sec", FAULT_WINDOW_SEC.to_string()),
        (
            "--pinglist-update-interval-sec",
            FAULT_REFRESH_SEC.to_string(),
        ),
        ("--tor-mesh-probe-rate-per-second", "20".into()),
        ("--inter-tor-probe-rate-per-second", "20".into()),
    ];
    let multi_devices = format!(
        "{},{},{}",
        FAULT_DEVICES[0], FAULT_DEVICES[2], FAULT_NO_GID_DEVICE
    );
    let device_tors = format!(
        "{}={},{}={},{}=tor-x",
        FAULT_DEVICES[0], FAULT_TORS[0], FAULT_DEVICES[2], FAULT_TORS[1], FAULT_NO_GID_DEVICE
    );
    let mut multi_extra = common.to_vec();
    multi_extra.push(("--device-tor-ids", device_tors));
    let mut multi = rdma_agent(
        dir,
        "multi",
        FAULT_TORS[0],
        &ctl,
        &multi_devices,
        gid_index,
        &multi_extra,
    )?;
    // The peer's /metrics shows its in-place QP resets (phase 3b).
    let mut peer_extra = common.to_vec();
    peer_extra.extend([
        ("--metrics-enabled", "true".to_string()),
        ("--metrics-exporter", "prometheus".into()),
        ("--prometheus-listen-addr", FAULT_PEER_METRICS.to_string()),
    ]);
    let mut peer = rdma_agent(
        dir,
        "peer",
        FAULT_TORS[0],
        &ctl,
        FAULT_DEVICES[1],
        gid_index,
        &peer_extra,
    )?;
    // ghost + multi's two RNICs + peer's one.
    wait_rnics(&ctl.endpoint(), 4, Duration::from_secs(90)).await?;
    let mut op = operator(&ctl.endpoint()).await?;
    let rnics: Vec<Value> = list_rnics(&mut op)
        .await?
        .iter()
        .filter_map(|r| r.rnic.as_ref().map(|n| (r, n)))
        .map(|(r, n)| {
            json!({"agent_id": r.agent_id, "device": n.device_name, "gid": n.gid,
                   "qpn": n.qpn, "tor_id": n.tor_id})
        })
        .collect();
    let peer_qpn = rnics
        .iter()
        .find(|r| r["agent_id"] == "peer")
        .and_then(|r| r["qpn"].as_u64())
        .context("peer's RNIC not listed")?;
    let mut phases = BTreeMap::new();
    phases.insert("registered", unix_ns_now());

    // 1. The dead peer is on the ToR-mesh lists from the first refresh on. The host test
    // needs live windows between the two ToR-mesh members before the port fault: on a
    // loaded guest the first ones come late, so wait for them (bounded) past the phase.
    tokio::time::sleep(Duration::from_secs(FAULT_DEAD_PHASE_SECS)).await;
    let gid_of = |device: &str| {
        rnics
            .iter()
            .find(|r| r["device"] == device)
            .and_then(|r| r["gid"].as_str())
            .map(str::to_string)
    };
    if let (Some(a), Some(b)) = (gid_of(FAULT_DEVICES[0]), gid_of(FAULT_DEVICES[1])) {
        let warm_ns = (FAULT_REFRESH_SEC + FAULT_WINDOW_SEC) * 1_000_000_000;
        wait_live_windows(&op, &a, &b, phases["registered"] + warm_ns, 2).await;
    }

    // 2. Port down under the running agent, then up.
    phases.insert("port_down", unix_ns_now());
    sh(&["ip", "link", "set", FAULT_NETDEVS[2], "down"])?;
    let down_state = wait_link_state(FAULT_DEVICES[2], "DOWN", Duration::from_secs(10)).await;
    // When the guest saw it DOWN (rxe may take a moment on a loaded machine).
    phases.insert("port_down_seen", unix_ns_now());
    tokio::time::sleep(Duration::from_secs(FAULT_DOWN_SECS)).await;
    phases.insert("port_up", unix_ns_now());
    sh(&["ip", "link", "set", FAULT_NETDEVS[2], "up"])?;
    let up_state = wait_link_state(FAULT_DEVICES[2], "ACTIVE", Duration::from_secs(20)).await;
    phases.insert("port_active", unix_ns_now());
    tokio::time::sleep(Duration::from_secs(FAULT_AFTER_UP_SECS)).await;

    // 3. A datagram bigger than a receive slot, with our Q_Key, to the peer's QP.
    phases.insert("oversize", unix_ns_now());
    let stray = stray_datagrams(gid_index, peer_qpn, FAULT_OVERSIZE_BYTES, 3)?;
    let peer_gid = v4_gid(FAULT_IPS[1]);
    wait_answered_after(&op, &peer_gid, phases["oversize"]).await;
    let peer_qps_after = res_of_pid("qp", peer.pid());

    // 3b. The MTU raised under the running agents, then a datagram longer than the
    // peer's receive slots (sized for the MTU at open): rxe puts its QP in the error
    // state, and the agent resets it in place, QPN unchanged. (From here on probes may be
    // lost on purpose: the port-down checks end at this phase.)
    phases.insert("mtu_raised", unix_ns_now());
    set_mtu(&[FAULT_NETDEVS[0], FAULT_NETDEVS[1]], 9000)?;
    let mtus = [
        wait_active_mtu(FAULT_DEVICES[0], 4096).await,
        wait_active_mtu(FAULT_DEVICES[1], 4096).await,
    ];
    phases.insert("overflow", unix_ns_now());
    let overflow = stray_datagrams(gid_index, peer_qpn, FAULT_OVERFLOW_BYTES, 1)?;
    let reset_seen = wait_for(Duration::from_secs(10), Duration::from_millis(200), || {
        let log = peer.stderr();
        async move { log.contains("reset in place").then_some(()) }
    })
    .await
    .is_some();
    wait_answered_after(&op, &peer_gid, phases["overflow"]).await;
    let peer_qps_after_overflow = res_of_pid("qp", peer.pid());
    let peer_qp_resets = counter_value(FAULT_PEER_METRICS, "rpingmesh_agent_qp_resets_total");
    set_mtu(&[FAULT_NETDEVS[0], FAULT_NETDEVS[1]], 1500)?;
    phases.insert("end", unix_ns_now());

    // 4. -9: the kernel must release everything the agent held.
    let multi_pid = multi.pid();
    let before_kill = held_resources(multi_pid);
    multi.signal(libc::SIGKILL);
    let _ = multi.wait_exit(Duration::from_secs(10));
    let after_kill = wait_for(Duration::from_secs(10), Duration::from_millis(200), || {
        let v = held_resources(multi_pid);
        async move {
            ["qp", "mr", "pd", "cq"]
                .iter()
                .all(|k| v[*k].as_array().is_some_and(|a| a.is_empty()))
                .then_some(v)
        }
    })
    .await
    .unwrap_or_else(|| held_resources(multi_pid));

    Proc::stop_all([&mut peer]);
    ghost.abort();
    let windows: Vec<Value> = dedupe(all_windows(&mut op).await?)
        .iter()
        .map(summary_json)
        .collect();
    let logs: BTreeMap<String, Value> = [&multi, &peer]
        .iter()
        .map(|a| {
            let log = a.stderr();
            let lines: Vec<&str> = log
                .lines()
                .filter(|l| !l.contains("\"level\":\"DEBUG\""))
                .collect();
            (a.name.clone(), json!(lines))
        })
        .collect();
    Ok(json!({
        "gid_index": gid_index,
        "rnics": rnics,
        "dead_gid": v4_gid(FAULT_DEAD_IP),
        "phases_unix_ns": phases,
        "link_state_down": down_state,
        "link_state_up": up_state,
        "stray": stray,
        "peer_qpn": peer_qpn,
        "peer_qps_after_stray": peer_qps_after,
        "active_mtus_raised": mtus,
        "overflow": overflow,
        "overflow_reset_seen": reset_seen,
        "peer_qps_after_overflow": peer_qps_after_overflow,
        "peer_qp_resets_metric": peer_qp_resets,
        "killed_before": before_kill,
        "killed_after": after_kill,
        "windows": windows,
        "logs": logs,
    }))
}

/// `count` datagrams of `bytes` with our Q_Key from a fresh UD QP on FAULT_DEVICES[0] to
/// the peer's QP: rdma-qp-churn's status line and output.
fn stray_datagrams(gid_index: u32, peer_qpn: u64, bytes: u32, count: u32) -> Result<Value> {
    let out = Command::new(bin("rdma-qp-churn"))
        .args([
            "--dev-a",
            FAULT_DEVICES[0],
            "--gid-a",
            &gid_index.to_string(),
            "--ud-to-gid",
            &FAULT_IPS[1].to_string(),
            "--ud-to-qpn",
            &peer_qpn.to_string(),
            "--ud-size",
            &bytes.to_string(),
            "--ud-count",
            &count.to_string(),
        ])
        .output()
        .context("running rdma-qp-churn --ud-to-gid")?;
    Ok(json!({
        "status": out.status.code(),
        "stdout": String::from_utf8_lossy(&out.stdout),
        "stderr": String::from_utf8_lossy(&out.stderr),
    }))
}

/// Sets the MTU of `netdevs` and of their bridge ports (`<netdev>p`).
fn set_mtu(netdevs: &[&str], mtu: u32) -> Result<()> {
    let m = mtu.to_string();
    for v in netdevs {
        for dev in [format!("{v}p"), v.to_string()] {
            sh(&["ip", "link", "set", &dev, "mtu", &m])?;
        }
    }
    Ok(())
}

/// Waits up to 10 s for `device`'s port 1 to report `want` as its active MTU
/// (`ibv_devinfo`); the value last seen (0 if unreadable).
async fn wait_active_mtu(device: &str, want: u32) -> u32 {
    let read = || -> u32 {
        sh(&["ibv_devinfo", "-d", device, "-i", "1"])
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.trim().strip_prefix("active_mtu:").map(str::to_string))
            })
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    wait_for(Duration::from_secs(10), Duration::from_millis(100), || {
        let m = read();
        async move { (m == want).then_some(m) }
    })
    .await
    .unwrap_or_else(read)
}

/// Waits until a window that began a second after `since_ns` shows `gid` answering (a
/// loaded host reports late: bounded by ten windows, not a fixed sleep).
async fn wait_answered_after(
    op: &rpingmesh_proto::operator::operator_service_client::OperatorServiceClient<
        tonic::transport::Channel,
    >,
    gid: &str,
    since_ns: u64,
) {
    let _ = wait_for(
        Duration::from_secs(10 * FAULT_WINDOW_SEC),
        Duration::from_millis(500),
        || {
            let (mut op, gid) = (op.clone(), gid.to_string());
            async move {
                let ws = all_windows(&mut op).await.ok()?;
                ws.iter()
                    .any(|w| {
                        w.target_gid == gid
                            && w.window_start_unix_ns >= since_ns + 1_000_000_000
                            && w.probe_success > 0
                    })
                    .then_some(())
            }
        },
    )
    .await;
}

/// Waits until both directions between `a` and `b` have `per_direction` reported windows
/// that began at `since_ns` or later (bounded by ten windows).
async fn wait_live_windows(
    op: &rpingmesh_proto::operator::operator_service_client::OperatorServiceClient<
        tonic::transport::Channel,
    >,
    a: &str,
    b: &str,
    since_ns: u64,
    per_direction: usize,
) {
    let _ = wait_for(
        Duration::from_secs(10 * FAULT_WINDOW_SEC),
        Duration::from_millis(500),
        || {
            let (mut op, a, b) = (op.clone(), a.to_string(), b.to_string());
            async move {
                let ws = all_windows(&mut op).await.ok()?;
                let count = |src: &str, dst: &str| {
                    ws.iter()
                        .filter(|w| {
                            w.source_gid == src
                                && w.target_gid == dst
                                && w.window_start_unix_ns >= since_ns
                        })
                        .count()
                };
                (count(&a, &b) >= per_direction && count(&b, &a) >= per_direction).then_some(())
            }
        },
    )
    .await;
}

/// The value of counter `name` on the Prometheus endpoint at `addr` (None when the scrape
/// fails or the series is absent).
fn counter_value(addr: &str, name: &str) -> Option<f64> {
    let (status, _, body) = http_get(addr.parse().ok()?, "/metrics", "text/plain").ok()?;
    if status != 200 {
        return None;
    }
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}
