//! Tests of `hostping.rs`.

use super::*;
use rpingmesh_hostping::linkstate::LinkStateInference;

/// The paper's Figure 2 host (8 GPUs, 4 RNICs) on a machine with neither the NVIDIA
/// driver nor those RNICs: the GPU endpoints are left out with the driver's one line,
/// the memory endpoints are tried and each failure is the verb error it is.
#[test]
fn gpu_endpoints_without_the_driver_are_noted_not_failed() {
    let path = format!(
        "{}/../hostping/fixtures/figure2.sysfs",
        env!("CARGO_MANIFEST_DIR")
    );
    let rec = Recording::parse(&std::fs::read_to_string(path).unwrap()).unwrap();
    let topo = HostTopology::discover(&rec).unwrap();
    assert!(
        topo.pci.iter().any(|d| d.vendor == 0x10de),
        "GPUs in the tree"
    );
    let cfg = AgentConfig {
        transport: Transport::Rdma,
        ..AgentConfig::default()
    };
    let mut inf = LinkStateInference::new();
    let r = loopback_tests(&cfg, &topo, HostMode::Idle, &mut inf);
    if rpingmesh_verbs::rdma::gpu::Cuda::load().is_ok() {
        return; // a GPU host: this is about hosts without the driver
    }
    let why = r.gpu_skipped.clone().expect("GPU endpoints noted");
    assert!(why.contains("libcuda.so.1 cannot be loaded"), "{why}");
    // Every RNIC x NUMA node was tried (idle: the full mesh), none x GPU.
    let tried: std::collections::BTreeSet<&str> =
        r.verbs.iter().map(|(rnic, _, _)| rnic.as_str()).collect();
    assert_eq!(tried.len(), topo.rnics.len(), "{:?}", r.verbs);
    assert_eq!(r.verbs.len(), topo.rnics.len() * topo.numa_nodes.len());
    assert!(r.verbs.iter().all(|(_, v, _)| v.starts_with("FAILED: ")));
    assert!(render_loopback_line(&r).contains("GPU endpoints not tested"));
}

fn render_loopback_line(l: &LoopbackReport) -> String {
    let r = HostReport {
        hostname: "h".into(),
        topology: HostTopology::default(),
        downgrades: vec![],
        ports: vec![],
        mode: HostMode::Idle,
        r2r: R2rReport::default(),
        loopback: l.clone(),
        problems: vec![],
        findings: vec![],
    };
    render(&r)
}
