//! The guest half of the VM tier (see `rpingmesh_e2e::vm`). Runs as root inside Debian's
//! stock kernel under qemu, with the host's filesystem shared in: sets up soft-RoCE
//! devices, starts the real controller, agents and RDMA programs, and records what it
//! observes (operator-API answers, `rdma res show qp` ground truth, times) in one JSON file
//! per scenario. It asserts nothing: the host test does, on these files.
//!
//! Usage: rpingmesh-vm-guest --out DIR [--only SCENARIO[,SCENARIO]]
//! (`--only bench_rdma` runs the benchmark of `cargo xtask bench`, with the binaries
//! next to this one: run the release build's copy for meaningful numbers.)

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rpingmesh_e2e::vm::*;
use rpingmesh_e2e::*;
use rpingmesh_proto::controller_agent::{PathSummary, PinglistRequest, PinglistType};
use rpingmesh_proto::operator::{ListServicePathsRequest, ServicePath};
use serde_json::{json, Value};

fn main() {
    let mut out: Option<PathBuf> = None;
    let mut only: Option<Vec<String>> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--out" => out = args.next().map(PathBuf::from),
            "--only" => {
                only = args
                    .next()
                    .map(|s| s.split(',').map(String::from).collect())
            }
            _ => {
                eprintln!("rpingmesh-vm-guest: unknown argument {a:?}");
                std::process::exit(2);
            }
        }
    }
    let Some(out) = out else {
        eprintln!("rpingmesh-vm-guest: --out DIR is required");
        std::process::exit(2);
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut facts = json!({});
    if let Err(e) = rt.block_on(prepare(&mut facts)) {
        facts["error"] = json!(format!("{e:#}"));
    }
    write_json(&out.join("guest.json"), &facts);
    // The tests' scenarios by default; the benchmark only when asked for.
    let names: Vec<&str> = match &only {
        Some(o) => SCENARIOS
            .iter()
            .chain(&[BENCH_SCENARIO, BENCH_RC_RING])
            .copied()
            .filter(|n| o.iter().any(|s| s == n))
            .collect(),
        None => SCENARIOS.to_vec(),
    };
    for name in names {
        let started = Instant::now();
        let dir = out.join(name);
        let _ = std::fs::create_dir_all(&dir);
        eprintln!("vm-guest: scenario {name} ...");
        let r = rt.block_on(async {
            match name {
                "ud_probing" => ud_probing(&dir).await,
                "service_kprobe" => service_tracing(&dir, "auto").await,
                "service_uprobe" => service_tracing(&dir, "uprobe").await,
                "rdma_faults" => rdma_faults(&dir).await,
                "hostping" => hostping(&dir).await,
                "rc_ring" => rc_ring(&dir).await,
                "rc_ring_peers" => rc_ring_peers(&dir).await,
                BENCH_SCENARIO => bench_rdma(&dir).await,
                BENCH_RC_RING => bench_rc_ring(&dir),
                _ => bail!("unknown scenario"),
            }
        });
        let mut v = match r {
            Ok(v) => v,
            Err(e) => json!({ "error": format!("{e:#}") }),
        };
        v["elapsed_ms"] = json!(started.elapsed().as_millis() as u64);
        eprintln!(
            "vm-guest: scenario {name} done in {} ms{}",
            started.elapsed().as_millis(),
            v.get("error")
                .map(|e| format!(" (error: {e})"))
                .unwrap_or_default()
        );
        write_json(&result_file(&out, name), &v);
    }
    let _ = std::fs::write(out.join(DONE_FILE), b"done\n");
}

fn write_json(p: &Path, v: &Value) {
    let _ = std::fs::write(p, serde_json::to_vec_pretty(v).unwrap_or_default());
}

/// Runs a command, failing with its output when it fails.
fn sh(args: &[&str]) -> Result<String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .with_context(|| format!("running {args:?}"))?;
    if !out.status.success() {
        bail!(
            "{args:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn sysctl(key: &str, value: &str) -> Result<()> {
    sh(&["sysctl", "-qw", &format!("{key}={value}")]).map(drop)
}

/// Kernel facts and the module the scenarios need.
async fn prepare(facts: &mut Value) -> Result<()> {
    facts["kernel"] = json!(sh(&["uname", "-r"])?.trim());
    sh(&["modprobe", "rdma_rxe"])?;
    sh(&["ip", "link", "set", "lo", "up"])?;
    let kallsyms = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
    let syms: Vec<&str> = [
        "ib_create_qp_user",
        "ib_modify_qp_with_udata",
        "ib_destroy_qp_user",
    ]
    .into_iter()
    .filter(|s| {
        kallsyms
            .lines()
            .any(|l| l.split_whitespace().nth(2) == Some(*s))
    })
    .collect();
    facts["kprobe_symbols"] = json!(syms);
    facts["kprobe_pmu"] = json!(Path::new("/sys/bus/event_source/devices/kprobe/type").exists());
    facts["ib_core_btf"] = json!(Path::new("/sys/kernel/btf/ib_core").exists());
    Ok(())
}

/// The GID table of `device` port 1: (index, GID text) of every non-zero entry.
fn gid_table(device: &str) -> Vec<(u32, String)> {
    let dir = format!("/sys/class/infiniband/{device}/ports/1/gids");
    let mut v = Vec::new();
    for i in 0..64u32 {
        let Ok(g) = std::fs::read_to_string(format!("{dir}/{i}")) else {
            break;
        };
        let g = g.trim();
        if g.is_empty() || g == "0000:0000:0000:0000:0000:0000:0000:0000" {
            continue;
        }
        v.push((i, g.to_string()));
    }
    v
}

/// Waits until every GID in `want` is in `device`'s table; returns gid -> index.
fn wait_gids(device: &str, want: &[String]) -> Result<BTreeMap<String, u32>> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let t: BTreeMap<String, u32> = gid_table(device).into_iter().map(|(i, g)| (g, i)).collect();
        if want.iter().all(|g| t.contains_key(g)) {
            return Ok(t);
        }
        if Instant::now() >= deadline {
            bail!("{device}: GIDs {want:?} not all present after 15 s; table {t:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `rdma res show qp` as JSON (the ground truth of which QPs exist).
fn res_qp() -> Value {
    sh(&["rdma", "-j", "res", "show", "qp"])
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(Value::Null)
}

fn summary_json(s: &PathSummary) -> Value {
    json!({
        "source_gid": s.source_gid, "source_tor_id": s.source_tor_id,
        "target_gid": s.target_gid, "target_tor_id": s.target_tor_id,
        "target_qpn": s.target_qpn,
        "window_start_unix_ns": s.window_start_unix_ns,
        "window_duration_ms": s.window_duration_ms,
        "probe_total": s.probe_total, "probe_success": s.probe_success,
        "probe_failed": s.probe_failed, "invalid_rtt_count": s.invalid_rtt_count,
        "network_rtt_min_ns": s.network_rtt_min_ns, "network_rtt_p50_ns": s.network_rtt_p50_ns,
        "network_rtt_p99_ns": s.network_rtt_p99_ns, "network_rtt_max_ns": s.network_rtt_max_ns,
        "prober_delay_p50_ns": s.prober_delay_p50_ns,
        "responder_delay_p50_ns": s.responder_delay_p50_ns,
        "pinglist_type": PinglistType::try_from(s.pinglist_type)
            .map(|t| t.as_str_name()).unwrap_or("?"),
        "service": s.service,
    })
}

fn service_path_json(p: &ServicePath) -> Value {
    let w = p.workload.clone().unwrap_or_default();
    json!({
        "service": p.service,
        "workload": {"kind": w.kind, "key": w.key, "id": w.id, "part": w.part, "cgroup_path": w.cgroup_path},
        "source_gid": p.source_gid, "source_agent_id": p.source_agent_id,
        "target_gid": p.target_gid, "monitored": p.monitored,
        "flow_label": p.flow_label, "traffic_class": p.traffic_class,
        "service_level": p.service_level, "flows": p.flows,
        "qps": p.qps.iter().map(|q| json!({
            "local_qpn": q.local_qpn, "remote_qpn": q.remote_qpn, "pid": q.pid,
            "comm": q.comm, "first_seen_unix_ns": q.first_seen_unix_ns,
            "workload_part": q.workload_part,
        })).collect::<Vec<_>>(),
        "latest": p.latest.as_ref().map(summary_json),
    })
}

/// The first JSON log line of `log` whose message is `message`, as a value.
fn log_line(log: &str, message: &str) -> Option<Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["fields"]["message"] == message)
}

/// The first JSON log line whose message starts with `prefix` (messages that carry an
/// error after a colon).
fn log_line_starting(log: &str, prefix: &str) -> Option<Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| {
            v["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with(prefix))
        })
}

/// A controller on loopback (any port) without metrics export, as the scenarios run it.
fn guest_controller(dir: &Path, name: &str) -> Result<Controller> {
    spawn_controller(
        dir,
        name,
        None,
        "127.0.0.1:0",
        &["--metrics-enabled", "false"],
    )
}

/// Waits until the controller lists `n` RNICs.
async fn wait_rnics(endpoint: &str, n: usize, timeout: Duration) -> Result<()> {
    let ok = wait_for(timeout, Duration::from_millis(200), || async {
        let mut op = operator(endpoint).await.ok()?;
        let r = list_rnics(&mut op).await.ok()?;
        (r.len() >= n).then_some(())
    })
    .await;
    ok.with_context(|| format!("fewer than {n} RNICs registered at {endpoint} after {timeout:?}"))
}

fn rdma_agent(
    dir: &Path,
    id: &str,
    tor: &str,
    ctl: &Controller,
    device: &str,
    gid_index: u32,
    extra: &[(&str, String)],
) -> Result<Proc> {
    let mut args: Vec<String> = [
        ("--agent-id", id.to_string()),
        ("--tor-id", tor.to_string()),
        ("--controller-addr", ctl.addr.to_string()),
        ("--transport", "rdma".into()),
        ("--allowed-device-names", device.into()),
        ("--gid-index", gid_index.to_string()),
        ("--metrics-enabled", "false".into()),
        ("--log-level", "info".into()),
        // These scenarios measure probing (loss, timestamps, faults) on a 2-vCPU TCG
        // guest, where Hostping's R2R and the loopback tests' busy polling are load that
        // moves the numbers; the hostping scenario runs the daemon with it on.
        ("--hostping-enabled", "false".into()),
    ]
    .into_iter()
    .flat_map(|(k, v)| [k.to_string(), v])
    .collect();
    for (k, v) in extra {
        args.push(k.to_string());
        args.push(v.clone());
    }
    Proc::spawn(dir, id, None, &bin(AGENT_BIN), &args)
}

// ------------------------------------------------------------------------- UD probing

/// Agents on one rxe device, one GID each: four IPv4-mapped GIDs in two ToRs under one
/// controller, two IPv6 GIDs in a third ToR under another (RoCE v2 cannot carry a probe
/// between an IPv4 and an IPv6 GID). Every agent probes for `UD_PROBE_SECS`; the result
/// holds every window the controllers received.
/// Then, with the agents stopped, the timestamp accuracy of the rdma endpoint: its
/// network RTT back to back (`rpingmesh-hw-check`) against libibverbs' own UD
/// ping-pong between the same two GIDs (sparse probes on an idle TCG guest mostly measure
/// how long a halted vCPU takes to wake, for any program alike).
async fn ud_probing(dir: &Path) -> Result<Value> {
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
fn hw_check_rtt(dir: &Path, gid_a: u32, gid_b: u32, round: u32) -> Value {
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
fn ud_pingpong_between(
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
        let mut server = Proc::spawn(
            dir,
            &format!("ud_pingpong-{tag}-server"),
            None,
            Path::new("ibv_ud_pingpong"),
            &sa,
        )?;
        wait_listening(port, Duration::from_secs(20))?;
        let mut sb = common;
        sb.extend([
            "-d".into(),
            b.0.into(),
            "-g".into(),
            gid_b.to_string(),
            "127.0.0.1".into(),
        ]);
        let mut client = Proc::spawn(
            dir,
            &format!("ud_pingpong-{tag}-client"),
            None,
            Path::new("ibv_ud_pingpong"),
            &sb,
        )?;
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

/// Waits until an RDMA-CM id listens on `port` (`rdma res show cm_id`).
fn wait_cm_listening(port: u16, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let t = sh(&["rdma", "res", "show", "cm_id"]).unwrap_or_default();
        if t.lines()
            .any(|l| l.contains("LISTEN") && l.contains(&format!(":{port} ")))
        {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("no RDMA-CM listener on port {port} after {timeout:?}: {t}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until something listens on TCP `port` (the verbs example programs exchange
/// their QP numbers over TCP; a client started before the server listens gives up).
fn wait_listening(port: u16, timeout: Duration) -> Result<()> {
    let hex = format!(":{port:04X}");
    let deadline = Instant::now() + timeout;
    loop {
        for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
            let t = std::fs::read_to_string(f).unwrap_or_default();
            // Fields: sl local_address rem_address st ...; 0A = LISTEN.
            if t.lines().any(|l| {
                let mut w = l.split_whitespace();
                let local = w.nth(1).unwrap_or("");
                local.ends_with(&hex) && w.nth(1) == Some("0A")
            }) {
                return Ok(());
            }
        }
        if Instant::now() >= deadline {
            bail!("nothing listens on TCP port {port} after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

// --------------------------------------------------------------------- service tracing

/// Two rxe devices behind a bridge, one per "host" address, with policy routing so that
/// traffic between the two local addresses leaves by its own device and crosses the
/// bridge (notes/rdma-vm.md). Idempotent: the second service scenario reuses it.
fn svc_network() -> Result<BTreeMap<String, u32>> {
    bridged_rxe("brs", &SVC_NETDEVS, &SVC_IPS, &SVC_DEVICES, 20)
}

/// rxe devices on veths behind one bridge (a "ToR"), each on its own address of one /24,
/// with the policy routing that makes them talk to each other inside one kernel (see
/// ../shared/notes/rdma-vm.md). Idempotent. Returns device -> GID index of its address.
fn bridged_rxe(
    bridge: &str,
    netdevs: &[&str],
    ips: &[std::net::Ipv4Addr],
    devices: &[&str],
    table_base: usize,
) -> Result<BTreeMap<String, u32>> {
    let gid_indexes = || -> Result<BTreeMap<String, u32>> {
        let mut all = BTreeMap::new();
        for (dev, ip) in devices.iter().zip(ips) {
            let t = wait_gids(dev, &[v4_gid(*ip)])?;
            all.insert(dev.to_string(), t[&v4_gid(*ip)]);
        }
        Ok(all)
    };
    if Path::new(&format!("/sys/class/infiniband/{}", devices[0])).exists() {
        return gid_indexes();
    }
    sh(&["ip", "link", "add", bridge, "type", "bridge"])?;
    sh(&["ip", "link", "set", bridge, "up"])?;
    for k in ["all", "default"] {
        sysctl(&format!("net.ipv4.conf.{k}.accept_local"), "1")?;
        sysctl(&format!("net.ipv4.conf.{k}.rp_filter"), "0")?;
    }
    sysctl("net.ipv4.conf.all.arp_ignore", "1")?;
    sysctl("net.ipv4.conf.all.arp_announce", "2")?;
    if !sh(&["ip", "rule", "show"])?.contains("100:\tfrom all lookup local") {
        sh(&["ip", "rule", "add", "pref", "100", "lookup", "local"])?;
        sh(&["ip", "rule", "del", "pref", "0"])?;
    }
    let o = ips[0].octets();
    let subnet = format!("{}.{}.{}.0/24", o[0], o[1], o[2]);
    for (i, ((v, ip), dev)) in netdevs.iter().zip(ips).zip(devices).enumerate() {
        let p = format!("{v}p");
        sh(&["ip", "link", "add", v, "type", "veth", "peer", "name", &p])?;
        sh(&["ip", "link", "set", &p, "master", bridge])?;
        sh(&["ip", "addr", "add", &format!("{ip}/24"), "dev", v])?;
        sysctl(&format!("net.ipv4.conf.{v}.accept_local"), "1")?;
        sysctl(&format!("net.ipv4.conf.{v}.rp_filter"), "0")?;
        sh(&["ip", "link", "set", v, "up"])?;
        sh(&["ip", "link", "set", &p, "up"])?;
        let table = (table_base + i).to_string();
        let src = ip.to_string();
        sh(&[
            "ip", "route", "add", &subnet, "dev", v, "src", &src, "table", &table,
        ])?;
        sh(&[
            "ip", "rule", "add", "pref", "10", "from", &src, "iif", "lo", "lookup", &table,
        ])?;
        // Its own address stays local: a QP connected to itself (Hostping's loopback
        // tests) resolves its own GID, which would otherwise be ARPed for on the bridge.
        sh(&[
            "ip", "route", "add", "local", &src, "dev", v, "table", &table,
        ])?;
        sh(&["rdma", "link", "add", dev, "type", "rxe", "netdev", v])?;
    }
    gid_indexes()
}

fn svc_gid_index(device: usize) -> u32 {
    gid_table(SVC_DEVICES[device])
        .into_iter()
        .find(|(_, g)| *g == v4_gid(SVC_IPS[device]))
        .map(|(i, _)| i)
        .unwrap_or(1)
}

async fn service_paths(endpoint: &str) -> Vec<ServicePath> {
    let Ok(mut op) = operator(endpoint).await else {
        return Vec::new();
    };
    op.list_service_paths(ListServicePathsRequest::default())
        .await
        .map(|r| r.into_inner().paths)
        .unwrap_or_default()
}

/// Samples the controller's service paths every 100 ms until `done(paths)` or `timeout`;
/// returns the matching sample and when it was taken.
async fn watch_paths(
    endpoint: &str,
    timeout: Duration,
    done: impl Fn(&[ServicePath]) -> bool,
) -> Option<(u64, Vec<ServicePath>)> {
    wait_for(timeout, Duration::from_millis(100), || async {
        let p = service_paths(endpoint).await;
        done(&p).then(|| (unix_ns_now(), p))
    })
    .await
}

/// Paths carrying a QP of one of `pids`.
fn of_service<'a>(paths: &'a [ServicePath], pids: &[u32]) -> Vec<&'a ServicePath> {
    paths
        .iter()
        .filter(|p| p.qps.iter().any(|q| pids.contains(&q.pid)))
        .collect()
}

/// The SERVICE pinglist the controller hands `agent` for `gid` right now.
async fn service_pinglist(endpoint: &str, agent: &str, tor: &str, gid: &str) -> Value {
    let Ok(mut c) = controller_client(endpoint).await else {
        return Value::Null;
    };
    match c
        .get_pinglist(PinglistRequest {
            agent_id: agent.into(),
            tor_id: tor.into(),
            requester_gid: gid.into(),
            r#type: PinglistType::Service as i32,
        })
        .await
    {
        Ok(r) => json!(r
            .into_inner()
            .targets
            .iter()
            .map(
                |t| json!({"target_gid": t.target_gid, "flow_label": t.flow_label,
                             "flow_label_count": t.flow_label_count, "service": t.service})
            )
            .collect::<Vec<_>>()),
        Err(e) => json!({ "error": e.message() }),
    }
}

/// One service program's life, as the controller shows it: learned, probed, gone.
struct ServiceRun<'a> {
    endpoint: &'a str,
    comm: &'static str,
    /// The program's processes (the owners of its QPs).
    pids: Vec<u32>,
    /// Service paths expected (one per QP side).
    paths: usize,
}

impl ServiceRun<'_> {
    fn paths_json(&self, paths: &[ServicePath]) -> Value {
        json!(of_service(paths, &self.pids)
            .into_iter()
            .map(service_path_json)
            .collect::<Vec<_>>())
    }

    /// Waits (up to `timeout`) for the listing, then takes the ground truth and waits for
    /// successful SERVICE probes on every path; returns the observations.
    async fn observe(&self, started_unix_ns: u64, timeout: Duration) -> Value {
        let mut v =
            json!({ "started_unix_ns": started_unix_ns, "comm": self.comm, "pids": self.pids });
        let want = self.paths;
        let pids = &self.pids;
        let listed = watch_paths(self.endpoint, timeout, |p| {
            let ps = of_service(p, pids);
            ps.len() >= want && ps.iter().all(|p| p.monitored)
        })
        .await;
        let Some((at, paths)) = listed else {
            v["error"] = json!(format!(
                "{want} service paths of {} not listed within {timeout:?}; last: {}",
                self.comm,
                json!(service_paths(self.endpoint)
                    .await
                    .iter()
                    .map(service_path_json)
                    .collect::<Vec<_>>())
            ));
            return v;
        };
        v["listed_unix_ns"] = json!(at);
        v["paths"] = self.paths_json(&paths);
        v["res_qp"] = res_qp();
        let probed = watch_paths(self.endpoint, Duration::from_secs(60), |p| {
            let ps = of_service(p, pids);
            ps.len() >= want
                && ps.iter().all(|p| {
                    p.latest
                        .as_ref()
                        .is_some_and(|s| s.probe_total > 0 && s.probe_success > 0)
                })
        })
        .await;
        match probed {
            Some((at, paths)) => {
                v["probed_unix_ns"] = json!(at);
                v["probed_paths"] = self.paths_json(&paths);
            }
            None => {
                v["probe_error"] = json!("SERVICE probes of every path did not succeed within 60 s")
            }
        }
        v
    }

    /// After the QPs went away at `ended_unix_ns`: when the paths disappeared.
    async fn gone(&self, v: &mut Value, ended_unix_ns: u64) {
        v["ended_unix_ns"] = json!(ended_unix_ns);
        let pids = &self.pids;
        match watch_paths(self.endpoint, Duration::from_secs(30), |p| {
            of_service(p, pids).is_empty()
        })
        .await
        {
            Some((at, _)) => v["gone_unix_ns"] = json!(at),
            None => v["gone_error"] = json!("paths still listed 30 s after the QPs went away"),
        }
    }

    /// Kills `procs` with -9 and records when their paths disappeared.
    async fn kill(&self, v: &mut Value, procs: &mut [&mut Proc]) {
        let ended = unix_ns_now();
        for p in procs.iter_mut() {
            p.signal(libc::SIGKILL);
        }
        for p in procs.iter_mut() {
            p.wait_exit(Duration::from_secs(5));
        }
        self.gone(v, ended).await;
        v["stderr"] = json!(procs
            .iter()
            .map(|p| tail_lines(&p.stderr(), 5))
            .collect::<Vec<_>>());
    }
}

/// The Slurm job the guest's ibv_rc_pingpong pair runs in (kprobe and uprobe modes).
const SLURM_JOB: u32 = 4343;

/// A Slurm-shaped cgroup (job `job`, step 0, task 0) under the guest's unified hierarchy,
/// mounted at /sys/fs/cgroup first when the guest has none: its directory.
fn slurm_cgroup(job: u32) -> Result<PathBuf> {
    let mounted = |mi: &str| {
        mi.lines().find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            post.starts_with("cgroup2 ")
                .then(|| pre.split_whitespace().nth(4).map(PathBuf::from))?
        })
    };
    let root = match mounted(&std::fs::read_to_string("/proc/self/mountinfo")?) {
        Some(r) => r,
        None => {
            sh(&["mount", "-t", "cgroup2", "none", "/sys/fs/cgroup"])?;
            PathBuf::from("/sys/fs/cgroup")
        }
    };
    let dir = root.join(format!(
        "rpm-vm/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0"
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
    Ok(dir)
}

/// An `ibv_rc_pingpong` pair between the two service devices (server on the first),
/// running until killed, each side started inside `cgroup` when given; its QPN exchange
/// goes over TCP on loopback, its RC QPs between the two GIDs.
fn rc_pingpong_pair(
    dir: &Path,
    tag: &str,
    port: u16,
    gid_idx: [u32; 2],
    cgroup: Option<&Path>,
) -> Result<(Proc, Proc)> {
    let (port_s, iters) = (port.to_string(), "100000000");
    let spawn = |name: String, args: Vec<String>| match cgroup {
        // The shell joins the cgroup, then becomes the program (same pid).
        Some(cg) => {
            let mut a = vec![
                "-c".to_string(),
                "echo $$ > \"$0/cgroup.procs\" && exec \"$@\"".to_string(),
                cg.display().to_string(),
                "ibv_rc_pingpong".to_string(),
            ];
            a.extend(args);
            Proc::spawn(dir, &name, None, Path::new("sh"), &a)
        }
        None => Proc::spawn(dir, &name, None, Path::new("ibv_rc_pingpong"), &args),
    };
    let server = spawn(
        format!("{tag}-server"),
        [
            "-d",
            SVC_DEVICES[0],
            "-g",
            &gid_idx[0].to_string(),
            "-p",
            &port_s,
            "-n",
            iters,
        ]
        .map(String::from)
        .to_vec(),
    )?;
    wait_listening(port, Duration::from_secs(20))?;
    let client = spawn(
        format!("{tag}-client"),
        [
            "-d",
            SVC_DEVICES[1],
            "-g",
            &gid_idx[1].to_string(),
            "-p",
            &port_s,
            "-n",
            iters,
            "127.0.0.1",
        ]
        .map(String::from)
        .to_vec(),
    )?;
    Ok((server, client))
}

/// A process driven line by line on stdin/stdout (rdma-qp-churn); killed on drop.
struct Driven {
    child: Child,
    stdin: Option<ChildStdin>,
    out: BufReader<std::process::ChildStdout>,
}

impl Driven {
    fn spawn(program: &Path, args: &[String], stderr: &Path) -> Result<Driven> {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(stderr)?);
        die_with_parent(&mut cmd);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("spawning {}", program.display()))?;
        let stdin = child.stdin.take();
        let out = BufReader::new(child.stdout.take().expect("piped"));
        Ok(Driven { child, stdin, out })
    }

    fn line(&mut self, prefix: &str) -> Result<Vec<String>> {
        let mut l = String::new();
        self.out.read_line(&mut l)?;
        if !l.starts_with(prefix) {
            bail!("expected a {prefix:?} line, got {l:?}");
        }
        Ok(l.split_whitespace().skip(1).map(String::from).collect())
    }

    fn say(&mut self, s: &str) -> Result<()> {
        let w = self.stdin.as_mut().context("stdin closed")?;
        writeln!(w, "{s}")?;
        w.flush()?;
        Ok(())
    }
}

impl Drop for Driven {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Service tracing with agents in `mode` (auto = kprobes on this kernel, or uprobe) against
/// real libibverbs programs: an ibv_rc_pingpong pair connected before the agents start,
/// then ibv_rc_pingpong and rping (RDMA-CM) ended with -9, and rdma-qp-churn (hundreds of
/// QPs created and destroyed, then held pairs destroyed cleanly).
async fn service_tracing(dir: &Path, mode: &str) -> Result<Value> {
    svc_network()?;
    let gid_idx = [svc_gid_index(0), svc_gid_index(1)];
    let gids = [v4_gid(SVC_IPS[0]), v4_gid(SVC_IPS[1])];
    // A service connected before any agent runs (an agent restarted under a running job).
    let (mut pre_server, mut pre_client) = rc_pingpong_pair(dir, "pre", 18650, gid_idx, None)?;
    wait_for(
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let pids = [pre_server.pid(), pre_client.pid()];
            let t = res_qp();
            let n = t.as_array().map_or(0, |a| {
                a.iter()
                    .filter(|q| {
                        q["state"] == "RTS"
                            && q["pid"]
                                .as_u64()
                                .is_some_and(|p| pids.contains(&(p as u32)))
                    })
                    .count()
            });
            (n >= 2).then_some(())
        },
    )
    .await
    .context("the pre-existing ibv_rc_pingpong pair never reached RTS")?;

    let ctl = guest_controller(dir, "controller")?;
    let ep = ctl.endpoint();
    let extra = [
        ("--service-tracing-mode", mode.to_string()),
        (
            "--service-flow-report-interval-ms",
            REPORT_INTERVAL_MS.to_string(),
        ),
        ("--analysis-window-sec", "2".into()),
        ("--pinglist-update-interval-sec", "5".into()),
        // RC ring probing of the SERVICE targets (on by default): TCG sleeps overshoot by
        // milliseconds, so the polling windows are wider than on a real host.
        ("--rc-ring-poll-lead-us", "20000".into()),
        ("--rc-ring-hot-wait-us", "50000".into()),
        // The services run for seconds each: probe their rings four times a second.
        ("--rc-ring-probe-interval-ms", "250".into()),
        ("--rc-ring-probe-timeout-ms", "250".into()),
    ];
    let agent_ids = ["svc-a", "svc-b"];
    let mut agents = Vec::new();
    for i in 0..2 {
        agents.push(rdma_agent(
            dir,
            agent_ids[i],
            SVC_TORS[i],
            &ctl,
            SVC_DEVICES[i],
            gid_idx[i],
            &extra,
        )?);
    }
    wait_rnics(&ep, 2, Duration::from_secs(60)).await?;
    // Tracing must be on before the scenario's services start (loading the programs
    // takes seconds under TCG).
    let mut tracing = Vec::new();
    for a in &agents {
        let line = wait_for(
            Duration::from_secs(90),
            Duration::from_millis(200),
            || async {
                let log = a.stderr();
                log_line(&log, "service tracing on").or_else(|| {
                    log.lines()
                        .find(|l| l.contains("service tracing off"))
                        .map(|l| json!({ "off": l }))
                })
            },
        )
        .await
        .with_context(|| format!("{}: no service tracing line within 90 s", a.name))?;
        tracing.push(line);
    }
    let mut v = json!({
        "mode_requested": mode,
        "tracing": tracing,
        "gids": gids,
        "report_interval_ms": REPORT_INTERVAL_MS,
    });
    if tracing.iter().any(|t| t.get("off").is_some()) {
        bail!("service tracing is off in an agent: {tracing:?}");
    }

    // 0. The pre-existing pair: learned from the kernel's answers when the agent asks it
    //    about its QPs (kprobe mode); libibverbs uprobes cannot see it before it reconnects.
    {
        let run = ServiceRun {
            endpoint: &ep,
            comm: "ibv_rc_pingpong",
            pids: vec![pre_server.pid(), pre_client.pid()],
            paths: 2,
        };
        let wait = Duration::from_secs(if mode == "uprobe" { 5 } else { 30 });
        let mut r = run.observe(unix_ns_now(), wait).await;
        run.kill(&mut r, &mut [&mut pre_server, &mut pre_client])
            .await;
        v["preexisting"] = r;
    }

    // 1. ibv_rc_pingpong between the two devices, as a step of a Slurm job (a
    //    Slurm-shaped cgroup), killed with -9.
    {
        let started = unix_ns_now();
        let cg = slurm_cgroup(SLURM_JOB)?;
        v["slurm_job"] = json!(SLURM_JOB);
        let (mut server, mut client) = rc_pingpong_pair(dir, "rc", 18600, gid_idx, Some(&cg))?;
        let run = ServiceRun {
            endpoint: &ep,
            comm: "ibv_rc_pingpong",
            pids: vec![server.pid(), client.pid()],
            paths: 2,
        };
        let mut r = run.observe(started, Duration::from_secs(60)).await;
        run.kill(&mut r, &mut [&mut server, &mut client]).await;
        v["rc_pingpong"] = r;
    }

    // 2. rping (RDMA-CM: librdmacm creates and connects the QPs), killed with -9.
    {
        let started = unix_ns_now();
        let (server_ip, client_ip) = (SVC_IPS[0].to_string(), SVC_IPS[1].to_string());
        let mut server = Proc::spawn(
            dir,
            "rping-server",
            None,
            Path::new("rping"),
            &["-s", "-a", &server_ip, "-p", "18700", "-C", "100000000"].map(String::from),
        )?;
        wait_cm_listening(18700, Duration::from_secs(20))?;
        let mut client = Proc::spawn(
            dir,
            "rping-client",
            None,
            Path::new("rping"),
            &[
                "-c",
                "-a",
                &server_ip,
                "-I",
                &client_ip,
                "-p",
                "18700",
                "-C",
                "100000000",
            ]
            .map(String::from),
        )?;
        let run = ServiceRun {
            endpoint: &ep,
            comm: "rping",
            pids: vec![server.pid(), client.pid()],
            paths: 2,
        };
        let mut r = run.observe(started, Duration::from_secs(60)).await;
        run.kill(&mut r, &mut [&mut server, &mut client]).await;
        v["rping"] = r;
    }

    // 3. rdma-qp-churn: CHURN_CYCLES connected pairs created and destroyed, then
    //    CHURN_PAIRS held pairs on known flow labels, destroyed cleanly on request.
    {
        let started = unix_ns_now();
        let mut p = Driven::spawn(
            &bin("rdma-qp-churn"),
            &[
                "--dev-a",
                SVC_DEVICES[0],
                "--gid-a",
                &gid_idx[0].to_string(),
                "--dev-b",
                SVC_DEVICES[1],
                "--gid-b",
                &gid_idx[1].to_string(),
                "--churn",
                &CHURN_CYCLES.to_string(),
                "--pairs",
                &CHURN_PAIRS.to_string(),
                "--flow-label",
                &CHURN_FLOW_LABEL.to_string(),
            ]
            .map(String::from),
            &dir.join("qp-churn.stderr"),
        )?;
        let pid: u32 = p.line("ready")?[0].parse()?;
        let churned = p.line("churned")?;
        let mut pairs = Vec::new();
        for _ in 0..CHURN_PAIRS {
            let f = p.line("pair")?;
            pairs.push(
                json!({"qpn_a": f[0].parse::<u32>()?, "qpn_b": f[1].parse::<u32>()?,
                              "flow_label": f[2].parse::<u32>()?,
                              "rtr_unix_ns": [f[3].parse::<u64>()?, f[4].parse::<u64>()?]}),
            );
        }
        let run = ServiceRun {
            endpoint: &ep,
            comm: "rdma-qp-churn",
            pids: vec![pid],
            paths: 2 * CHURN_PAIRS as usize,
        };
        let mut r = run.observe(started, Duration::from_secs(60)).await;
        r["churned"] =
            json!({"cycles": churned[0].parse::<u32>()?, "ms": churned[1].parse::<u64>()?});
        r["pairs"] = json!(pairs);
        r["pinglist_a"] = service_pinglist(&ep, agent_ids[0], SVC_TORS[0], &gids[0]).await;
        p.say("destroy")?;
        let ended: u64 = p.line("destroyed")?[0].parse()?;
        run.gone(&mut r, ended).await;
        let _ = p.say("exit");
        v["qp_churn"] = r;
    }

    // 4. What the agents' RC rings measured on the SERVICE paths over the whole run.
    v["rc_ring"] = rc_ring_windows(&ep).await;

    Proc::stop_all(&mut agents);
    v["agent_logs"] = json!(agents
        .iter()
        .map(|a| {
            let log = a.stderr();
            let notable: Vec<&str> = log
                .lines()
                .filter(|l| {
                    l.contains("\"level\":\"ERROR\"")
                        || l.contains("\"level\":\"WARN\"")
                        || l.contains("existing QPs")
                        || l.contains("before tracing began")
                        || l.contains("rc ring")
                })
                .take(20)
                .collect();
            (a.name.clone(), json!(notable))
        })
        .collect::<BTreeMap<_, _>>());
    Ok(v)
}

/// Every retained path window that carries RC ring stats.
async fn rc_ring_windows(endpoint: &str) -> Value {
    let windows = match operator(endpoint).await {
        Ok(mut op) => all_windows(&mut op).await,
        Err(e) => Err(e),
    };
    let windows = match windows {
        Ok(w) => w,
        Err(e) => return json!({ "error": format!("{e:#}") }),
    };
    json!({ "windows": windows
        .iter()
        .filter_map(|s| {
            let r = s.rc_ring?;
            Some(json!({
                "source": s.source_gid, "target": s.target_gid, "type": s.pinglist_type,
                "service": s.service, "start": s.window_start_unix_ns,
                "dur_ms": s.window_duration_ms, "ud_total": s.probe_total,
                "total": r.probe_total, "lost": r.probe_lost, "late": r.probe_late,
                "min_ns": r.network_rtt_min_ns, "p50_ns": r.network_rtt_p50_ns,
                "responder_p50_ns": r.responder_delay_p50_ns,
            }))
        })
        .collect::<Vec<_>>() })
}

// ------------------------------------------------------------------------------ bench

/// The numbers of `cargo xtask bench` that need real RDMA (run from the release build):
/// 1. probe round trips/s of the agent's drivers over rxe (agent-bench --rdma) against
///    `ibv_ud_pingpong` between the same two GIDs, rounds alternated;
/// 2. service-path latency: from a QP's modify to RTR (rdma-qp-churn stamps it) until the
///    controller lists the path, for `BENCH_PAIRS` pairs, with agents in kprobe mode.
async fn bench_rdma(dir: &Path) -> Result<Value> {
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
    let mut p = Driven::spawn(
        &bin("rdma-qp-churn"),
        &[
            "--dev-a",
            SVC_DEVICES[0],
            "--gid-a",
            &g[0].to_string(),
            "--dev-b",
            SVC_DEVICES[1],
            "--gid-b",
            &g[1].to_string(),
            "--churn",
            "0",
            "--pairs",
            &BENCH_PAIRS.to_string(),
        ]
        .map(String::from),
        &dir.join("qp-churn.stderr"),
    )?;
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
async fn bench_rc_ring_cpu(dir: &Path, g: [u32; 2]) -> Result<Value> {
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
        let cpu0: Vec<f64> = agents.iter().map(|a| cpu_seconds(a.pid())).collect();
        let w0 = Instant::now();
        tokio::time::sleep(Duration::from_secs(RC_CPU_SECS)).await;
        let secs = w0.elapsed().as_secs_f64();
        let cpu: Vec<f64> = agents
            .iter()
            .zip(&cpu0)
            .map(|(a, c0)| 100.0 * (cpu_seconds(a.pid()) - c0) / secs)
            .collect();
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

/// Only the RC ring rounds of `bench_rdma` (`--only bench_rc_ring`): for working on them.
const BENCH_RC_RING: &str = "bench_rc_ring";

fn bench_rc_ring(dir: &Path) -> Result<Value> {
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
fn rc_ring_bench_round(dir: &Path, g: [u32; 2], round: u32) -> Value {
    let (server_ip, client_ip) = (SVC_IPS[1], SVC_IPS[0]);
    let ring = |what: &str, port: u16, sink: bool, scenario: &[&str]| -> Result<Value> {
        let mut sargs: Vec<String> = [
            "serve",
            "--bind",
            &format!("{server_ip}:{port}"),
            "--timeout-sec",
            "300",
        ]
        .map(String::from)
        .to_vec();
        if sink {
            sargs.push("--sink".into());
        } else {
            // Like ib_write_lat's, the echoing side spins rather than sleeps.
            sargs.push("--busy-poll".into());
        }
        let mut server = Proc::spawn(
            dir,
            &format!("ring-{what}-serve-{round}"),
            None,
            &bin("rpingmesh-rc-ring"),
            &sargs,
        )?;
        wait_cm_listening(port, Duration::from_secs(20))?;
        let mut cargs: Vec<String> = [
            "run",
            "--dst",
            &format!("{server_ip}:{port}"),
            "--src",
            &client_ip.to_string(),
            "--timeout-sec",
            "300",
        ]
        .map(String::from)
        .to_vec();
        cargs.extend(scenario.iter().map(|s| s.to_string()));
        let mut client = Proc::spawn(
            dir,
            &format!("ring-{what}-run-{round}"),
            None,
            &bin("rpingmesh-rc-ring"),
            &cargs,
        )?;
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

/// CPU seconds (user + system) a process has used so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the ")" that ends the command name: utime is the 12th, stime the 13th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|x| x.parse().ok())
        .collect();
    // SAFETY: plain sysconf query.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    f.iter().sum::<u64>() as f64 / hz
}

/// One prober agent and one responder-only agent at LOAD_PROBES_PER_SEC, on `transport`
/// between the two service devices' addresses: the prober's and the responder's CPU
/// (% of one core) over LOAD_SECS; on rdma also with a dead peer added to the prober's
/// pinglist, and the live target's probes/s in both phases (from the windows).
async fn bench_load(dir: &Path, g: [u32; 2]) -> Result<Value> {
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
            let cpu0: Vec<f64> = agents.iter().map(|a| cpu_seconds(a.pid())).collect();
            let (t0, w0) = (unix_ns_now(), Instant::now());
            tokio::time::sleep(Duration::from_secs(LOAD_SECS)).await;
            let secs = w0.elapsed().as_secs_f64();
            let cpu: Vec<f64> = agents
                .iter()
                .zip(&cpu0)
                .map(|(a, c0)| 100.0 * (cpu_seconds(a.pid()) - c0) / secs)
                .collect();
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

// ------------------------------------------------------------------------- faults

/// `rdma -j res show <what>` entries of process `pid`.
fn res_of_pid(what: &str, pid: u32) -> Value {
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
fn held_resources(pid: u32) -> Value {
    json!({
        "qp": res_of_pid("qp", pid), "mr": res_of_pid("mr", pid),
        "pd": res_of_pid("pd", pid), "cq": res_of_pid("cq", pid),
    })
}

/// Waits up to `timeout` for `device`'s port to report `want`; the state last seen.
async fn wait_link_state(device: &str, want: &str, timeout: Duration) -> String {
    wait_for(timeout, Duration::from_millis(100), || {
        let s = link_state(device);
        async move { (s == want).then_some(s) }
    })
    .await
    .unwrap_or_else(|| link_state(device))
}

/// `rdma link show <device>`'s state (ACTIVE, DOWN).
fn link_state(device: &str) -> String {
    sh(&["rdma", "-j", "link", "show", &format!("{device}/1")])
        .ok()
        .and_then(|s| serde_json::from_str::<Value>(&s).ok())
        .and_then(|v| v[0]["state"].as_str().map(String::from))
        .unwrap_or_default()
}

/// Keeps an RNIC registered whose GID is on no fabric (a dead host the controller still
/// lists), re-registering it like an agent would, until the task is aborted.
fn register_ghost(endpoint: String) -> tokio::task::JoinHandle<()> {
    register_ghost_in(endpoint, FAULT_TORS[0])
}

fn register_ghost_in(endpoint: String, tor: &'static str) -> tokio::task::JoinHandle<()> {
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
async fn rdma_faults(dir: &Path) -> Result<Value> {
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
    let ctl = guest_controller(dir, "controller")?;
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
    let mut peer = rdma_agent(
        dir,
        "peer",
        FAULT_TORS[0],
        &ctl,
        FAULT_DEVICES[1],
        gid_index,
        &common,
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

    // 1. The dead peer is on the ToR-mesh lists from the first refresh on.
    tokio::time::sleep(Duration::from_secs(FAULT_DEAD_PHASE_SECS)).await;

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
    let stray = Command::new(bin("rdma-qp-churn"))
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
            &FAULT_OVERSIZE_BYTES.to_string(),
            "--ud-count",
            "3",
        ])
        .output()
        .context("running rdma-qp-churn --ud-to-gid")?;
    let stray = json!({
        "status": stray.status.code(),
        "stdout": String::from_utf8_lossy(&stray.stdout),
        "stderr": String::from_utf8_lossy(&stray.stderr),
    });
    // Until a window that began after the stray datagrams shows the peer answering (a
    // loaded host reports late: bounded by ten windows, not a fixed sleep).
    let oversize_ns = phases["oversize"];
    let peer_gid = v4_gid(FAULT_IPS[1]);
    let _ = wait_for(
        Duration::from_secs(10 * FAULT_WINDOW_SEC),
        Duration::from_millis(500),
        || {
            let (mut op, peer_gid) = (op.clone(), peer_gid.clone());
            async move {
                let ws = all_windows(&mut op).await.ok()?;
                ws.iter()
                    .any(|w| {
                        w.target_gid == peer_gid
                            && w.window_start_unix_ns >= oversize_ns + 1_000_000_000
                            && w.probe_success > 0
                    })
                    .then_some(())
            }
        },
    )
    .await;
    let peer_qps_after = res_of_pid("qp", peer.pid());
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
        "killed_before": before_kill,
        "killed_after": after_kill,
        "windows": windows,
        "logs": logs,
    }))
}

// ------------------------------------------------------------------------- hostping

/// `rpingmesh-agent hostping --once` on the four devices: its JSON report and exit code.
/// `during` runs once R2R probing has begun (the agent logs it), on this thread.
fn hostping_run(
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

async fn hostping(dir: &Path) -> Result<Value> {
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
async fn hostping_daemon(dir: &Path, gid_index: u32) -> Result<Value> {
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

fn nft_apply(ruleset: &str) -> Result<()> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting nft")?;
    child
        .stdin
        .take()
        .context("nft stdin")?
        .write_all(ruleset.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("nft -f: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// Seed 001's validation list over real RC QPs and RDMA-CM: rpingmesh-rc-ring server and
/// client processes between the two service rxe devices (behind their bridge), one run
/// per scenario (see `RC_RING_RUNS`). Afterwards, no QP of theirs may be left.
async fn rc_ring(dir: &Path) -> Result<Value> {
    svc_network()?;
    let (server_ip, client_ip) = (SVC_IPS[1], SVC_IPS[0]);
    let mut v = json!({});
    for (i, run) in RC_RING_RUNS.iter().enumerate() {
        let port = 7600 + i as u16;
        let started = Instant::now();
        let mut server_args: Vec<String> = [
            "serve",
            "--bind",
            &format!("{server_ip}:{port}"),
            "--budget",
            &run.budget.to_string(),
            "--connections",
            &run.connections.to_string(),
            "--timeout-sec",
            "600",
        ]
        .map(String::from)
        .to_vec();
        if run.sink {
            server_args.push("--sink".into());
        }
        let mut server = Proc::spawn(
            dir,
            &format!("rc-ring-serve-{}", run.name),
            None,
            &bin("rpingmesh-rc-ring"),
            &server_args,
        )?;
        wait_cm_listening(port, Duration::from_secs(20))?;
        let mut args: Vec<String> = [
            "run",
            "--dst",
            &format!("{server_ip}:{port}"),
            "--src",
            &client_ip.to_string(),
            "--budget",
            &run.budget.to_string(),
            "--timeout-sec",
            "600",
        ]
        .map(String::from)
        .to_vec();
        args.extend(run.scenario.iter().map(|s| s.to_string()));
        let mut client = Proc::spawn(
            dir,
            &format!("rc-ring-run-{}", run.name),
            None,
            &bin("rpingmesh-rc-ring"),
            &args,
        )?;
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
    v["dead_server"] = rc_ring_dead_server(dir, server_ip, client_ip, false)?;
    v["silent_server"] = rc_ring_dead_server(dir, server_ip, client_ip, true)?;
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
fn rc_ring_dead_server(
    dir: &Path,
    server_ip: std::net::Ipv4Addr,
    client_ip: std::net::Ipv4Addr,
    silent: bool,
) -> Result<Value> {
    let (port, what) = if silent {
        (7691, "silent")
    } else {
        (7690, "dead")
    };
    let mut server = Proc::spawn(
        dir,
        &format!("rc-ring-serve-{what}"),
        None,
        &bin("rpingmesh-rc-ring"),
        &[
            "serve",
            "--bind",
            &format!("{server_ip}:{port}"),
            "--timeout-sec",
            "120",
        ]
        .map(String::from),
    )?;
    wait_cm_listening(port, Duration::from_secs(20))?;
    let mut client = Proc::spawn(
        dir,
        &format!("rc-ring-run-{what}"),
        None,
        &bin("rpingmesh-rc-ring"),
        &[
            "run",
            "--dst",
            &format!("{server_ip}:{port}"),
            "--src",
            &client_ip.to_string(),
            "--timeout-sec",
            "120",
            // 0.27 s a try, so a silent peer fails a WRITE after about 2 s (the CM's
            // default here is seconds a try).
            "--ack-timeout-exp",
            if silent { "16" } else { "0" },
            "pipeline",
            "100000000",
        ]
        .map(String::from),
    )?;
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
fn rc_peer_args(
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
fn connect_retries(log: &str) -> Vec<Value> {
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
async fn wait_rings_up(agents: impl IntoIterator<Item = &Proc>) -> Result<()> {
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

fn count_lines(log: &str, message: &str) -> usize {
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
async fn rc_ring_peers(dir: &Path) -> Result<Value> {
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
