//! The soft-RoCE VM test bed: Debian's stock kernel under qemu (TCG), booted by
//! virtme-ng with this machine's root filesystem shared in (notes: shared/notes/rdma-vm.md).
//! `ensure_test_bed` installs what it needs; the guest itself is booted by
//! e2e/tests/vm_rdma.rs, once for all its tests.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rpingmesh_e2e::vm::{self as bed, TestBed, VIRTME_NG};
use serde_json::{json, Map, Value};

use crate::{have_tool, install_needs, is_root, root, run_streamed, Need};

const VM_NEEDED: &[Need] = &[
    Need {
        what: "qemu-system-x86_64",
        present: || have_tool("qemu-system-x86_64"),
        package: "qemu-system-x86",
        why: "boots the VM test bed (TCG)",
    },
    Need {
        what: "a kernel with rdma_rxe modules",
        present: || bed::kernel_with_rxe().is_some(),
        package: "linux-image-amd64",
        why: "Debian's stock kernel: soft-RoCE, kprobes and module BTF in the VM",
    },
    Need {
        what: "busybox",
        present: || Path::new("/bin/busybox").is_file() || have_tool("busybox"),
        package: "busybox-static",
        why: "the VM's init",
    },
    Need {
        what: "ibv_rc_pingpong",
        present: || have_tool("ibv_rc_pingpong"),
        package: "ibverbs-utils",
        why: "real RC and UD services inside the VM (ibv_rc_pingpong, ibv_ud_pingpong)",
    },
    Need {
        what: "librxe",
        present: || {
            Path::new("/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so").is_file()
                || have_glob("/usr/lib/x86_64-linux-gnu/libibverbs", "librxe")
        },
        package: "ibverbs-providers",
        why: "the soft-RoCE userspace provider",
    },
    Need {
        what: "rping",
        present: || have_tool("rping"),
        package: "rdmacm-utils",
        why: "an RDMA-CM service inside the VM",
    },
    Need {
        what: "ib_write_lat",
        present: || have_tool("ib_write_lat"),
        package: "perftest",
        why: "the RC ring benchmark's baselines in the VM (ib_write_lat, ib_write_bw)",
    },
    Need {
        what: "python3 venv",
        present: || {
            Command::new(python())
                .args(["-c", "import ensurepip, venv"])
                .output()
                .is_ok_and(|o| o.status.success())
        },
        package: "python3-venv",
        why: "a virtualenv for virtme-ng",
    },
];

fn have_glob(dir: &str, prefix: &str) -> bool {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .any(|e| e.file_name().to_string_lossy().starts_with(prefix))
        })
        .unwrap_or(false)
}

/// Debian's python (the one python3-venv completes), else whatever python3 is on PATH.
fn python() -> PathBuf {
    let deb = PathBuf::from("/usr/bin/python3");
    if deb.is_file() {
        deb
    } else {
        PathBuf::from("python3")
    }
}

/// `<root>/.tools/vng`: the virtualenv holding virtme-ng.
pub fn vng_venv() -> PathBuf {
    bed::vng_venv(&root())
}

/// Installs the VM packages (root) and virtme-ng in its venv. Without root it only says
/// what is missing: the VM tests then print their SKIP lines.
pub fn ensure_test_bed() -> Result<()> {
    install_needs("vm", VM_NEEDED)?;
    if !is_root() {
        return Ok(());
    }
    let venv = vng_venv();
    let vng = venv.join("bin/vng");
    if vng.is_file() {
        return Ok(());
    }
    eprintln!("xtask vm: installing {VIRTME_NG} into {}", venv.display());
    let mut mk = Command::new(python());
    mk.args(["-m", "venv"]).arg(&venv);
    run_streamed(mk, &format!("python3 -m venv {}", venv.display()))?;
    let mut pip = Command::new(venv.join("bin/pip"));
    pip.args(["install", "--quiet", VIRTME_NG]);
    run_streamed(pip, &format!("pip install {VIRTME_NG}"))?;
    if !vng.is_file() {
        bail!("{VIRTME_NG} installed but {} is missing", vng.display());
    }
    Ok(())
}

/// `cargo xtask vm-test`: test bed, eBPF object, build, then the VM tests alone.
pub fn vm_test() -> Result<()> {
    crate::deps()?;
    ensure_test_bed()?;
    crate::build_ebpf::build_ebpf(&root())?;
    crate::build_for_tests()?;
    let mut t = crate::cargo();
    t.args([
        "test",
        "-p",
        "rpingmesh-e2e",
        "--test",
        "vm_rdma",
        "--",
        "--nocapture",
    ]);
    run_streamed(t, "cargo test -p rpingmesh-e2e --test vm_rdma")
}

/// `cargo xtask bench`'s RDMA numbers: boots the guest with the release build's runner
/// (`--only bench_rdma`) and turns its JSON into bench lines. Needs root and the test bed.
pub fn bench_lines() -> Result<Vec<Map<String, Value>>> {
    if !is_root() {
        bail!("needs root (a qemu guest with soft-RoCE): not measured");
    }
    ensure_test_bed()?;
    let tb = TestBed::find(&root()).map_err(anyhow::Error::msg)?;
    let release = crate::target_dir().join("release");
    let dir = crate::target_dir().join("vm-bench");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    eprintln!(
        "xtask bench: booting the soft-RoCE guest ({}) for the rdma benches",
        tb.version
    );
    let status = tb
        .run(
            &dir,
            &format!(
                "{} --out {} --only {}",
                release.join("rpingmesh-vm-guest").display(),
                dir.display(),
                bed::BENCH_SCENARIO
            ),
            Duration::from_secs(15 * 60),
        )
        .map_err(anyhow::Error::msg)?;
    let file = bed::result_file(&dir, bed::BENCH_SCENARIO);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&file).with_context(|| {
        format!(
            "{} (guest {status:?}; see {}/console.log)",
            file.display(),
            dir.display()
        )
    })?)?;
    if let Some(e) = v.get("error") {
        bail!("bench_rdma in the guest: {e}");
    }
    rdma_lines(&v)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return 0.0;
    }
    v[v.len() / 2]
}

/// Bench lines from the guest's `bench_rdma.json` (pure).
pub fn rdma_lines(v: &Value) -> Result<Vec<Map<String, Value>>> {
    let rounds = v["rounds"].as_array().context("no rounds")?;
    let mut agent = Vec::new();
    let mut piped = Vec::new();
    let mut busy = Vec::new();
    let mut events = Vec::new();
    let mut bad = 0.0;
    for r in rounds {
        agent.push(r["agent"]["value"].as_f64().context("agent probes/s")?);
        piped.push(r["agent"]["pipelined_16"].as_f64().unwrap_or(0.0));
        bad += r["agent"]["failed_or_invalid"].as_f64().unwrap_or(0.0);
        let rt = |k: &str| -> Result<f64> {
            let us = r["ud_pingpong"][k]["usec_per_iter"]
                .as_f64()
                .with_context(|| format!("ibv_ud_pingpong {k}: {}", r["ud_pingpong"][k]))?;
            Ok(1e6 / us)
        };
        busy.push(rt("busy")?);
        events.push(rt("events")?);
    }
    let (a, b, e) = (median(agent), median(busy), median(events));
    let lat: Vec<f64> = v["service_path_latency_ms"]
        .as_array()
        .context("no latencies")?
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    let (lmin, lmax) = lat
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(*x), hi.max(*x))
        });
    let lines = [
        json!({"bench": "rxe_probe_round_trips", "unit": "round_trips/s", "rounds": rounds.len(),
               "agent_in_flight_1": a, "agent_in_flight_16": median(piped),
               "ibv_ud_pingpong_busy": b, "ibv_ud_pingpong_events": e,
               "ratio_vs_busy": if b > 0.0 { a / b } else { 0.0 },
               "ratio_vs_events": if e > 0.0 { a / e } else { 0.0 },
               "agent_failed_or_invalid": bad}),
        json!({"bench": "service_path_latency", "unit": "ms", "qps": lat.len(),
               "expected_qps": v["qps"], "median": median(lat.clone()),
               "min": if lat.is_empty() { 0.0 } else { lmin },
               "max": if lat.is_empty() { 0.0 } else { lmax },
               "report_interval_ms": v["report_interval_ms"]}),
    ];
    Ok(lines
        .into_iter()
        .chain(rc_ring_lines(&v["rc_ring"]))
        .chain(rc_ring_cpu_lines(&v["rc_ring_cpu"]))
        .chain(load_lines(&v["load"]))
        .map(|l| match l {
            Value::Object(m) => m,
            _ => unreachable!("json! of an object"),
        })
        .collect())
}

/// The RC ring rounds of `bench_rdma`: echo RTT vs ib_write_lat (one way, so doubled),
/// stream msgs/s vs ib_write_bw, medians over the rounds that ran (pure).
pub fn rc_ring_lines(rounds: &Value) -> Vec<Value> {
    let ok: Vec<&Value> = rounds
        .as_array()
        .map(|a| a.iter().filter(|r| r.get("error").is_none()).collect())
        .unwrap_or_default();
    if ok.is_empty() {
        return Vec::new();
    }
    let m = |f: &dyn Fn(&Value) -> Option<f64>| median(ok.iter().filter_map(|r| f(r)).collect());
    let ring_p50 = m(&|r| r["ring_rtt_p50_ns"].as_f64());
    let ring_p99 = m(&|r| r["ring_rtt_p99_ns"].as_f64());
    let lat_rtt = m(&|r| {
        r["ib_write_lat_typical_us"]
            .as_f64()
            .map(|us| 2.0 * us * 1000.0)
    });
    let ring_rate = m(&|r| r["ring_msgs_per_sec"].as_f64());
    let bw_rate = m(&|r| r["ib_write_bw_mpps"].as_f64().map(|mpps| mpps * 1e6));
    vec![
        json!({"bench": "rc_ring_echo_rtt_rxe", "unit": "ns", "rounds": ok.len(), "message_bytes": 32,
               "ring_p50_ns": ring_p50, "ring_p99_ns": ring_p99,
               "baseline": "ib_write_lat round trip (2 x t_typical), same GIDs",
               "baseline_ns": lat_rtt,
               "ratio_to_baseline": if lat_rtt > 0.0 { ring_p50 / lat_rtt } else { 0.0 }}),
        json!({"bench": "rc_ring_throughput_rxe", "unit": "msgs/s", "rounds": ok.len(), "message_bytes": 32,
               "ring_bytes": 65536, "ring_msgs_per_sec": ring_rate,
               "baseline": "ib_write_bw message rate, same GIDs",
               "baseline_msgs_per_sec": bw_rate,
               "ratio_to_baseline": if bw_rate > 0.0 { ring_rate / bw_rate } else { 0.0 }}),
    ]
}

/// The ring poller's CPU: the same two agents with no ring, then with one ring each way
/// (pure; nothing when the guest did not run it).
pub fn rc_ring_cpu_lines(runs: &Value) -> Vec<Value> {
    let cpu = |lists: &str| -> Option<(f64, &Value)> {
        let r = runs
            .as_array()?
            .iter()
            .find(|r| r["rc_ring_pinglists"] == lists)?;
        let c = r["agent_cpu_pct"].as_array()?;
        let sum: f64 = c.iter().filter_map(Value::as_f64).sum();
        Some((sum / c.len().max(1) as f64, r))
    };
    let (Some((none, _)), Some((rings, r))) = (cpu("service"), cpu("tor_mesh")) else {
        return Vec::new();
    };
    vec![
        json!({"bench": "rc_ring_poller_cpu_rxe", "unit": "% of a core per agent",
                "rings_per_agent": 1, "ring_probe_interval_ms": 1000,
                "agent_cpu_pct_no_rings": none, "agent_cpu_pct_with_rings": rings,
                "ring_cost_pct": rings - none,
                "ring_probes_reported": r["ring_probes"],
                "ratio_with_to_without": if none > 0.0 { rings / none } else { 0.0 }}),
    ]
}

/// Live-target probes/s of the prober within `[from, to)`, from the windows (a window
/// counts when it lies inside the phase; the dead GID's windows are left out).
fn live_rate(windows: &[Value], from: u64, to: u64, dead_gid: &str) -> f64 {
    let (mut probes, mut ms) = (0.0, 0.0);
    for w in windows {
        let start = w["window_start_unix_ns"].as_u64().unwrap_or(0);
        let dur = w["window_duration_ms"].as_u64().unwrap_or(0);
        if start < from || start + dur * 1_000_000 > to || w["target_gid"] == dead_gid {
            continue;
        }
        probes += w["probe_total"].as_f64().unwrap_or(0.0);
        ms += dur as f64;
    }
    if ms > 0.0 {
        probes / (ms / 1000.0)
    } else {
        0.0
    }
}

/// The load runs of `bench_rdma` (agent CPU on rdma vs udp, the cost of a dead peer);
/// nothing when the guest did not run them (pure).
pub fn load_lines(load: &Value) -> Vec<Value> {
    const DEAD_GID: &str = "0000:0000:0000:0000:0000:ffff:c612:0363";
    let phase = |t: &str, name: &str| -> Option<(f64, f64, f64)> {
        let p = load[t]["phases"]
            .as_array()?
            .iter()
            .find(|p| p["phase"] == name)?;
        let w = load[t]["windows"].as_array()?;
        let rate = live_rate(
            w,
            p["from_unix_ns"].as_u64()?,
            p["to_unix_ns"].as_u64()?,
            DEAD_GID,
        );
        Some((
            p["prober_cpu_pct"].as_f64()?,
            p["responder_cpu_pct"].as_f64()?,
            rate,
        ))
    };
    let mut out = Vec::new();
    let offered = load["probes_per_sec"].as_f64().unwrap_or(0.0);
    let (Some(r), Some(u)) = (phase("rdma", "alone"), phase("udp", "alone")) else {
        return out;
    };
    for (t, (pc, rc, rate)) in [("rdma", r), ("udp", u)] {
        out.push(json!({"bench": "agent_cpu_rdma_vs_udp", "transport": t,
            "probes_per_sec_offered": offered, "probes_per_sec_achieved": rate,
            "prober_cpu_pct": pc, "responder_cpu_pct": rc,
            "prober_cpu_pct_per_1000_probes_s": if rate > 0.0 { pc * 1000.0 / rate } else { 0.0 }}));
    }
    let per_probe = |(pc, _, rate): (f64, f64, f64)| if rate > 0.0 { pc / rate } else { 0.0 };
    out.push(json!({"bench": "agent_cpu_rdma_vs_udp", "transport": "ratio rdma/udp",
        "probes_per_sec_achieved": if u.2 > 0.0 { r.2 / u.2 } else { 0.0 },
        "prober_cpu_pct": if u.0 > 0.0 { r.0 / u.0 } else { 0.0 },
        "responder_cpu_pct": if u.1 > 0.0 { r.1 / u.1 } else { 0.0 },
        "prober_cpu_pct_per_1000_probes_s": if per_probe(u) > 0.0 { per_probe(r) / per_probe(u) } else { 0.0 }}));
    if let Some(d) = phase("rdma", "dead_peer") {
        out.push(json!({"bench": "dead_peer_cost", "transport": "rdma",
            "live_probes_per_sec_alone": r.2, "live_probes_per_sec_with_dead_peer": d.2,
            "ratio_with_to_alone": if r.2 > 0.0 { d.2 / r.2 } else { 0.0 },
            "prober_cpu_pct_alone": r.0, "prober_cpu_pct_with_dead_peer": d.0}));
    }
    out
}

#[cfg(test)]
mod tests;
