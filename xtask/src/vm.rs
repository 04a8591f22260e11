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
        .map(|l| match l {
            Value::Object(m) => m,
            _ => unreachable!("json! of an object"),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rdma_lines_take_medians_and_ratios() {
        let v = json!({
            "rounds": [
                {"agent": {"value": 1000.0, "pipelined_16": 4000.0, "failed_or_invalid": 0},
                 "ud_pingpong": {"busy": {"usec_per_iter": 250.0}, "events": {"usec_per_iter": 500.0}}},
                {"agent": {"value": 1200.0, "pipelined_16": 5000.0, "failed_or_invalid": 1},
                 "ud_pingpong": {"busy": {"usec_per_iter": 200.0}, "events": {"usec_per_iter": 400.0}}},
                {"agent": {"value": 800.0, "pipelined_16": 3000.0, "failed_or_invalid": 0},
                 "ud_pingpong": {"busy": {"usec_per_iter": 400.0}, "events": {"usec_per_iter": 1000.0}}},
            ],
            "service_path_latency_ms": [900.0, 300.0, 600.0],
            "qps": 3,
            "report_interval_ms": 1000,
        });
        let l = rdma_lines(&v).unwrap();
        assert_eq!(l[0]["agent_in_flight_1"], 1000.0);
        assert_eq!(l[0]["ibv_ud_pingpong_busy"], 4000.0);
        assert_eq!(l[0]["ibv_ud_pingpong_events"], 2000.0);
        assert_eq!(l[0]["ratio_vs_events"], 0.5);
        assert_eq!(l[0]["agent_failed_or_invalid"], 1.0);
        assert_eq!(l[1]["median"], 600.0);
        assert_eq!(
            (l[1]["min"].as_f64(), l[1]["max"].as_f64()),
            (Some(300.0), Some(900.0))
        );
        assert!(rdma_lines(&json!({"rounds": [{"agent": {}}]})).is_err());
    }
}
