//! What every scenario uses: shell commands, GID tables, JSON renderings of what the
//! controller answers, the guest's controller and rdma agents, waits on listening ports, a
//! process's CPU seconds and nftables rulesets.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rpingmesh_e2e::*;
use rpingmesh_proto::controller_agent::{PathSummary, PinglistType};
use rpingmesh_proto::operator::ServicePath;
use serde_json::{json, Value};

pub(crate) fn write_json(p: &Path, v: &Value) {
    let _ = std::fs::write(p, serde_json::to_vec_pretty(v).unwrap_or_default());
}

/// Runs a command, failing with its output when it fails.
pub(crate) fn sh(args: &[&str]) -> Result<String> {
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

pub(crate) fn sysctl(key: &str, value: &str) -> Result<()> {
    sh(&["sysctl", "-qw", &format!("{key}={value}")]).map(drop)
}

/// Kernel facts and the module the scenarios need.
pub(crate) async fn prepare(facts: &mut Value) -> Result<()> {
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
pub(crate) fn gid_table(device: &str) -> Vec<(u32, String)> {
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
pub(crate) fn wait_gids(device: &str, want: &[String]) -> Result<BTreeMap<String, u32>> {
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
pub(crate) fn res_qp() -> Value {
    sh(&["rdma", "-j", "res", "show", "qp"])
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(Value::Null)
}

pub(crate) fn summary_json(s: &PathSummary) -> Value {
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

pub(crate) fn service_path_json(p: &ServicePath) -> Value {
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
pub(crate) fn log_line(log: &str, message: &str) -> Option<Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["fields"]["message"] == message)
}

/// The first JSON log line whose message starts with `prefix` (messages that carry an
/// error after a colon).
pub(crate) fn log_line_starting(log: &str, prefix: &str) -> Option<Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| {
            v["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with(prefix))
        })
}

/// A controller on loopback (any port) without metrics export, as the scenarios run it.
pub(crate) fn guest_controller(dir: &Path, name: &str) -> Result<Controller> {
    spawn_controller(
        dir,
        name,
        None,
        "127.0.0.1:0",
        &["--metrics-enabled", "false"],
    )
}

/// Waits until the controller lists `n` RNICs.
pub(crate) async fn wait_rnics(endpoint: &str, n: usize, timeout: Duration) -> Result<()> {
    let ok = wait_for(timeout, Duration::from_millis(200), || async {
        let mut op = operator(endpoint).await.ok()?;
        let r = list_rnics(&mut op).await.ok()?;
        (r.len() >= n).then_some(())
    })
    .await;
    ok.with_context(|| format!("fewer than {n} RNICs registered at {endpoint} after {timeout:?}"))
}

pub(crate) fn rdma_agent(
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
    // A key in `extra` replaces the default (the agent refuses a flag given twice).
    .filter(|(k, _)| !extra.iter().any(|(e, _)| e == k))
    .flat_map(|(k, v)| [k.to_string(), v])
    .collect();
    for (k, v) in extra {
        args.push(k.to_string());
        args.push(v.clone());
    }
    Proc::spawn(dir, id, None, &bin(AGENT_BIN), &args)
}

/// Waits until an RDMA-CM id listens on `port` (`rdma res show cm_id`).
pub(crate) fn wait_cm_listening(port: u16, timeout: Duration) -> Result<()> {
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

/// An rpingmesh-rc-ring server bound to `SVC_IPS[1]:port` and, once it listens, its client
/// from `SVC_IPS[0]`; each takes its own further arguments (`serve` ..., `run` ...).
pub(crate) fn rc_ring_pair(
    dir: &Path,
    name: &str,
    port: u16,
    server_extra: &[String],
    client_extra: &[String],
) -> Result<(Proc, Proc)> {
    let (server_ip, client_ip) = (rpingmesh_e2e::vm::SVC_IPS[1], rpingmesh_e2e::vm::SVC_IPS[0]);
    let dst = format!("{server_ip}:{port}");
    let mut server_args: Vec<String> = vec!["serve".into(), "--bind".into(), dst.clone()];
    server_args.extend_from_slice(server_extra);
    let ring = bin("rpingmesh-rc-ring");
    let server = Proc::spawn(dir, &format!("{name}-serve"), None, &ring, &server_args)?;
    wait_cm_listening(port, Duration::from_secs(20))?;
    let src = client_ip.to_string();
    let mut client_args: Vec<String> = vec!["run".into(), "--dst".into(), dst, "--src".into(), src];
    client_args.extend_from_slice(client_extra);
    let client = Proc::spawn(dir, &format!("{name}-run"), None, &ring, &client_args)?;
    Ok((server, client))
}

/// Waits until something listens on TCP `port` (the verbs example programs exchange
/// their QP numbers over TCP; a client started before the server listens gives up).
pub(crate) fn wait_listening(port: u16, timeout: Duration) -> Result<()> {
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

/// CPU seconds (user + system) a process has used so far.
pub(crate) fn cpu_seconds(pid: u32) -> f64 {
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
pub(crate) fn nft_apply(ruleset: &str) -> Result<()> {
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
