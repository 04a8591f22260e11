//! The guest half of the VM tier (see `rpingmesh_e2e::vm`). Runs as root inside Debian's
//! stock kernel under qemu, with the host's filesystem shared in: sets up soft-RoCE
//! devices, starts the real controller, agents and RDMA programs, and records what it
//! observes (operator-API answers, `rdma res show qp` ground truth, times) in one JSON file
//! per scenario. It asserts nothing: the host test does, on these files.
//!
//! Usage: rpingmesh-vm-guest --out DIR [--only SCENARIO[,SCENARIO]]
//! (`--only bench_rdma` runs the benchmark of `cargo xtask bench`, with the binaries
//! next to this one: run the release build's copy for meaningful numbers.)
//!
//! One module per scenario family; `harness` holds what they all use and `bridge_net` the
//! two-device network most of them share. A new scenario: a module here, its name in
//! `rpingmesh_e2e::vm::SCENARIOS`, its arm below, its assertions in `e2e/tests/vm_rdma.rs`.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::bail;
use rpingmesh_e2e::vm::*;
use serde_json::json;

mod bench;
mod bridge_net;
mod faults;
mod harness;
mod hostping;
mod rc_ring;
mod service_tracing;
mod ud_probing;

use bench::{bench_rc_ring, bench_rdma, BENCH_RC_RING};
use faults::rdma_faults;
use harness::{prepare, write_json};
use hostping::hostping;
use rc_ring::{rc_ring, rc_ring_peers};
use service_tracing::service_tracing;
use ud_probing::ud_probing;

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
