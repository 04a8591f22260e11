//! Loopback tests between each RNIC and the memory nodes and GPUs of its host (RC writes
//! to itself), and the verb failures among them.

use super::*;

/// Verb failures (a test that could not run) as (RNIC, line).
pub(super) fn loopback_verb_problems(l: &LoopbackReport) -> Vec<(String, String)> {
    l.verbs
        .iter()
        .filter(|(_, verb, _)| verb.starts_with("FAILED"))
        .map(|(rnic, verb, _)| {
            (
                rnic.clone(),
                format!(
                    "loopback on {rnic}: {}",
                    verb.trim_start_matches("FAILED: ")
                ),
            )
        })
        .collect()
}

/// A report of loopback tests that did not run, and why.
fn skipped(why: &str) -> LoopbackReport {
    LoopbackReport {
        skipped: Some(why.into()),
        ..Default::default()
    }
}

/// Every RNIC the config allows x every NUMA node's memory (the affinitive subset when
/// the host is busy), judged against peers, then a round of Algorithm 1 over the verdicts
/// (`inference` keeps the links' history between rounds: gray streaks, flapping). Blocks
/// for the length of the writes: call from a blocking context.
pub fn loopback_tests(
    cfg: &AgentConfig,
    topo: &HostTopology,
    mode: HostMode,
    inference: &mut rpingmesh_hostping::linkstate::LinkStateInference,
) -> LoopbackReport {
    if !cfg.hostping_loopback_enabled {
        return skipped("hostping_loopback_enabled: false");
    }
    if cfg.transport != Transport::Rdma {
        return skipped("transport udp (loopback tests write through RDMA)");
    }
    run_tests(cfg, topo, mode, inference)
}

#[cfg(not(feature = "rdma"))]
fn run_tests(
    _: &AgentConfig,
    _: &HostTopology,
    _: HostMode,
    _: &mut rpingmesh_hostping::linkstate::LinkStateInference,
) -> LoopbackReport {
    skipped("this build has no rdma backend (build with the `rdma` feature)")
}

#[cfg(feature = "rdma")]
fn run_tests(
    cfg: &AgentConfig,
    topo: &HostTopology,
    mode: HostMode,
    inference: &mut rpingmesh_hostping::linkstate::LinkStateInference,
) -> LoopbackReport {
    use rpingmesh_hostping::loopback::{judge, plan, Timing};
    use rpingmesh_hostping::paths::{full_mesh, Endpoint};
    use rpingmesh_verbs::rdma::loopback::{run_loopback, LoopbackOptions};
    let allowed = |name: &str| {
        cfg.allowed_device_names.is_empty() || cfg.allowed_device_names.iter().any(|d| d == name)
    };
    let mut report = LoopbackReport::default();
    let mut mesh: Vec<_> = full_mesh(topo)
        .into_iter()
        .filter(|p| allowed(&p.rnic))
        .collect();
    // GPU endpoints need the NVIDIA driver's libcuda: without it they are left out, once,
    // with the reason.
    if mesh.iter().any(|p| matches!(p.endpoint, Endpoint::Gpu(_))) {
        if let Err(e) = rpingmesh_verbs::rdma::gpu::Cuda::load() {
            report.gpu_skipped = Some(e.to_string());
            mesh.retain(|p| matches!(p.endpoint, Endpoint::Memory(_)));
        }
    }
    let tested_plan = plan(&mesh, mode);
    if tested_plan.is_empty() {
        return LoopbackReport {
            skipped: Some("no RNIC of the config is in the host tree".into()),
            ..report
        };
    }
    let mut timed = Vec::new();
    // A single-node kernel has no NUMA policy to set: leave it to the default.
    let numa = |n: Option<u32>| n.filter(|_| topo.numa_nodes.len() > 1);
    for p in &tested_plan {
        let mut o = LoopbackOptions::new(&p.rnic);
        o.gid_index = u32::try_from(cfg.gid_index).unwrap_or(0);
        o.samples = cfg.hostping_loopback_samples.max(1);
        match &p.endpoint {
            Endpoint::Memory(node) => o.numa_node = numa(Some(*node)),
            Endpoint::Gpu(bus) => {
                // The read region in host memory near the GPU; the writes land on it.
                o.gpu = Some(bus.clone());
                o.numa_node = numa(
                    topo.pci
                        .iter()
                        .find(|d| &d.bdf == bus)
                        .and_then(|d| d.numa_node),
                );
            }
        }
        match run_loopback(&o) {
            Ok(r) => {
                for v in &r.verbs {
                    report
                        .verbs
                        .push((p.rnic.clone(), v.verb.to_string(), v.micros));
                }
                let sums = r.summaries();
                let small = sums.iter().find(|s| s.size == 1);
                let large = sums.iter().find(|s| s.size > 1);
                if let (Some(a), Some(b)) = (small, large) {
                    let t = Timing {
                        small_ns: a.median_ns,
                        large_ns: b.median_ns,
                    };
                    timed.push((p.clone(), t));
                }
            }
            // GPU memory the host cannot give (driver, dma-buf, peer memory): a setup
            // limit, noted, not a failed verb.
            Err(e @ rpingmesh_verbs::rdma::RdmaError::Gpu(_)) => {
                report.gpu_skipped.get_or_insert_with(|| e.to_string());
            }
            Err(e) => report
                .verbs
                .push((p.rnic.clone(), format!("FAILED: {e}"), 0.0)),
        }
    }
    let verdicts = judge(&timed, mode, cfg.hostping_abnormal_th);
    // No per-link utilization Linux exposes for these paths (UPI, memory channels): the
    // congestion input stays empty, and an overloaded link reads as failed.
    let round = inference.round(
        &verdicts.iter().map(|m| m.verdict()).collect::<Vec<_>>(),
        &std::collections::BTreeMap::new(),
        cfg.hostping_util_high,
    );
    report.links = round.findings;
    report.paths = verdicts
        .iter()
        .map(|m| LoopbackPath {
            rnic: m.path.rnic.clone(),
            endpoint: m.path.endpoint.to_string(),
            host_latency_us: m.timing.host_latency_us(),
            bandwidth_gbps: m.bandwidth_gbps,
            abnormal: m.abnormal,
        })
        .collect();
    report
}
