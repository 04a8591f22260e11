//! Randomized host scenarios with known ground truth, and how well Algorithm 1 finds the
//! broken link in them.
//!
//! A scenario is a host (drawn like the servers of the paper: one or two sockets, two or
//! three root ports each, PCIe switches holding an RNIC and GPUs, or a lone device under
//! a port), one fault of the paper's Figure 8/10 patterns (or none), and the host's mode.
//! Its sysfs tree is built ([`crate::synth`]) and discovered like a live one; loopback
//! timings are made up from each path's nominal bandwidth, the fault and noise, and go
//! through the same [`crate::loopback::judge`] and [`LinkStateInference`] as live ones,
//! for several rounds.
//!
//! Ground truth is (link, cause). A scenario whose faulty link no set of path verdicts
//! can tell apart from another link (both on exactly the same tested paths) is redrawn,
//! and the redraws are counted: no tomography can name it, so it measures nothing.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::linkstate::{Cause, LinkStateInference};
use crate::loopback::{judge, plan, HostMode, Timing, LARGE_BYTES, SMALL_BYTES};
use crate::paths::{full_mesh, HostPath, LinkId};
use crate::synth::{build, DeviceSpec, HostSpec, RootPortSpec};
use crate::topology::{HostTopology, PciRole};

/// The fault patterns (Figure 8: idle host; Figure 10: busy host; Figure 9: flapping).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HostFaultKind {
    RnicPcieLink,
    GpuPcieLink,
    MemoryChannel,
    Upi,
    CpuRootPort,
    AcsMisconfiguration,
    MemoryChannelFlapping,
    /// Figure 10(a): a GPU's link fails while the host carries traffic.
    GpuPcieLinkBusy,
    /// Figure 10(b): UPI overloaded by service traffic.
    UpiOverload,
    /// Figure 10(c): a memory channel overloaded.
    MemoryChannelOverload,
}

pub const FAULT_KINDS: [HostFaultKind; 10] = [
    HostFaultKind::RnicPcieLink,
    HostFaultKind::GpuPcieLink,
    HostFaultKind::MemoryChannel,
    HostFaultKind::Upi,
    HostFaultKind::CpuRootPort,
    HostFaultKind::AcsMisconfiguration,
    HostFaultKind::MemoryChannelFlapping,
    HostFaultKind::GpuPcieLinkBusy,
    HostFaultKind::UpiOverload,
    HostFaultKind::MemoryChannelOverload,
];

impl HostFaultKind {
    pub fn name(self) -> &'static str {
        match self {
            HostFaultKind::RnicPcieLink => "rnic_pcie_link",
            HostFaultKind::GpuPcieLink => "gpu_pcie_link",
            HostFaultKind::MemoryChannel => "memory_channel",
            HostFaultKind::Upi => "upi",
            HostFaultKind::CpuRootPort => "cpu_root_port",
            HostFaultKind::AcsMisconfiguration => "acs_misconfiguration",
            HostFaultKind::MemoryChannelFlapping => "memory_channel_flapping",
            HostFaultKind::GpuPcieLinkBusy => "gpu_pcie_link_busy",
            HostFaultKind::UpiOverload => "upi_overload",
            HostFaultKind::MemoryChannelOverload => "memory_channel_overload",
        }
    }

    fn mode(self) -> HostMode {
        match self {
            HostFaultKind::GpuPcieLinkBusy
            | HostFaultKind::UpiOverload
            | HostFaultKind::MemoryChannelOverload => HostMode::Busy,
            _ => HostMode::Idle,
        }
    }

    fn cause(self) -> Cause {
        match self {
            HostFaultKind::UpiOverload | HostFaultKind::MemoryChannelOverload => Cause::Congestion,
            HostFaultKind::MemoryChannelFlapping => Cause::Flapping,
            _ => Cause::Failure,
        }
    }
}

/// splitmix64: the suite's own seeded randomness (no dependency, same numbers forever).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// In [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// Roughly normal, mean 0, deviation 1 (sum of uniforms).
    pub fn gauss(&mut self) -> f64 {
        (0..6).map(|_| self.unit()).sum::<f64>() - 3.0
    }
}

/// A host drawn at random.
pub fn random_host(rng: &mut Rng) -> HostSpec {
    let sockets = if rng.unit() < 0.75 { 2 } else { 1 };
    let mut spec = HostSpec {
        sockets: Vec::new(),
        gen: 4,
        width: 16,
        downgrades: Vec::new(),
    };
    let gbps = if rng.unit() < 0.5 { 200 } else { 100 };
    for _ in 0..sockets {
        let ports = 2 + rng.below(2);
        let mut rps = Vec::new();
        for _ in 0..ports {
            if rng.unit() < 0.75 {
                let mut devices = Vec::new();
                let gpus = 1 + rng.below(3);
                for _ in 0..gpus {
                    devices.push(DeviceSpec::Gpu);
                }
                if rng.unit() < 0.8 {
                    let at = rng.below(devices.len() + 1);
                    devices.insert(at, DeviceSpec::Rnic { gbps });
                }
                rps.push(RootPortSpec {
                    switch: true,
                    devices,
                });
            } else {
                let dev = if rng.unit() < 0.5 {
                    DeviceSpec::Rnic { gbps }
                } else {
                    DeviceSpec::Gpu
                };
                rps.push(RootPortSpec {
                    switch: false,
                    devices: vec![dev],
                });
            }
        }
        spec.sockets.push(rps);
    }
    // At least two RNICs: R2R and most tomography need them.
    let rnics = spec
        .sockets
        .iter()
        .flatten()
        .flat_map(|rp| &rp.devices)
        .filter(|d| matches!(d, DeviceSpec::Rnic { .. }))
        .count();
    for k in rnics..2 {
        spec.sockets[k % sockets].push(RootPortSpec {
            switch: false,
            devices: vec![DeviceSpec::Rnic { gbps }],
        });
    }
    spec
}

/// One scenario, drawn and made identifiable.
#[derive(Debug, Clone)]
pub struct HostScenario {
    pub seed: u64,
    pub spec: HostSpec,
    /// `None`: a fault-free host.
    pub fault: Option<(HostFaultKind, LinkId)>,
    /// Bandwidth left on paths through the faulty link (for flapping: while it is down).
    pub factor: f64,
    pub mode: HostMode,
    /// Times the draw was repeated because the fault could not be told apart.
    pub redraws: u32,
}

/// The candidate links for a fault kind on this host.
fn candidates(kind: HostFaultKind, topo: &HostTopology, mesh: &[HostPath]) -> Vec<LinkId> {
    let on_paths: BTreeSet<LinkId> = mesh.iter().flat_map(|p| p.links.iter().cloned()).collect();
    let pcie_of = |role: PciRole| -> Vec<LinkId> {
        topo.pci
            .iter()
            .filter(|d| d.role == role)
            .map(|d| LinkId::Pcie(d.bdf.clone()))
            .collect()
    };
    let all: Vec<LinkId> = match kind {
        HostFaultKind::RnicPcieLink => pcie_of(PciRole::Rnic),
        HostFaultKind::GpuPcieLink | HostFaultKind::GpuPcieLinkBusy => pcie_of(PciRole::Gpu),
        HostFaultKind::MemoryChannel
        | HostFaultKind::MemoryChannelFlapping
        | HostFaultKind::MemoryChannelOverload => topo
            .numa_nodes
            .iter()
            .map(|n| LinkId::Memory(n.id))
            .collect(),
        HostFaultKind::Upi | HostFaultKind::UpiOverload => on_paths
            .iter()
            .filter(|l| matches!(l, LinkId::Upi(..)))
            .cloned()
            .collect(),
        HostFaultKind::CpuRootPort => on_paths
            .iter()
            .filter(|l| matches!(l, LinkId::RootPortTransit(_)))
            .cloned()
            .collect(),
        HostFaultKind::AcsMisconfiguration => on_paths
            .iter()
            .filter(|l| matches!(l, LinkId::SwitchP2p(_)))
            .cloned()
            .collect(),
    };
    all.into_iter().filter(|l| on_paths.contains(l)).collect()
}

/// Whether `link` can be told apart from every other link by the tested paths: every
/// path through it has a peer that does not cross it, no other link sits on exactly
/// the same tested paths, and, for flapping, it is on at least two (a link on one path
/// is never gray: its path is all it has).
fn identifiable(link: &LinkId, tested: &[HostPath], flapping: bool, mode: HostMode) -> bool {
    let on = |l: &LinkId| -> BTreeSet<usize> {
        (0..tested.len())
            .filter(|&i| tested[i].links.contains(l))
            .collect()
    };
    let mine = on(link);
    if mine.is_empty() || (flapping && mine.len() < 2) {
        return false;
    }
    // A slow path shows only against a peer that does not cross the link: on a busy
    // host its peers are its own RNIC's paths, on an idle one the whole host's.
    let has_peer = |i: usize| {
        tested.iter().any(|q| {
            !q.links.contains(link) && (mode == HostMode::Idle || q.rnic == tested[i].rnic)
        })
    };
    if !mine.iter().all(|&i| has_peer(i)) {
        return false;
    }
    let others: BTreeSet<&LinkId> = tested
        .iter()
        .flat_map(|p| &p.links)
        .filter(|l| *l != link)
        .collect();
    others.into_iter().all(|l| on(l) != mine)
}

/// Draws scenario `seed`: a fault of `kind` (or none), on a host where it can be named.
pub fn draw(seed: u64, kind: Option<HostFaultKind>) -> HostScenario {
    let mut redraws = 0;
    let mut rng = Rng::new(seed);
    loop {
        let spec = random_host(&mut rng);
        let topo = HostTopology::discover(&build(&spec)).expect("a built host is a valid tree");
        let mesh = full_mesh(&topo);
        let Some(kind) = kind else {
            let mode = if rng.unit() < 0.5 {
                HostMode::Idle
            } else {
                HostMode::Busy
            };
            return HostScenario {
                seed,
                spec,
                fault: None,
                factor: 1.0,
                mode,
                redraws,
            };
        };
        let mode = kind.mode();
        let tested = plan(&mesh, mode);
        let cands: Vec<LinkId> = candidates(kind, &topo, &tested)
            .into_iter()
            .filter(|l| {
                identifiable(
                    l,
                    &tested,
                    kind == HostFaultKind::MemoryChannelFlapping,
                    mode,
                )
            })
            .collect();
        if cands.is_empty() {
            redraws += 1;
            continue;
        }
        let link = cands[rng.below(cands.len())].clone();
        // A fault takes 30-75% of what crosses the link (Figure 8(e): milder ones exist;
        // 25% is where the 20% threshold starts to be reliable under noise).
        let factor = rng.range(0.25, 0.7);
        return HostScenario {
            seed,
            spec,
            fault: Some((kind, link)),
            factor,
            mode,
            redraws,
        };
    }
}

/// What a run of a scenario found: each link's last verdict (flapping, once declared,
/// stands: a flapping link's all-bad rounds are part of its flapping).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    pub truth: Option<(LinkId, Cause)>,
    pub found: BTreeMap<LinkId, Cause>,
}

/// Rounds of loopback tests a scenario runs (flapping needs three gray rounds in a row).
pub const ROUNDS: u32 = 20;

/// Runs a scenario: builds its tree, discovers it, and for each round makes up the
/// timings, judges the paths and runs Algorithm 1.
pub fn run(s: &HostScenario, abnormal_th: f64, util_high: f64) -> Outcome {
    let topo = HostTopology::discover(&build(&s.spec)).expect("a built host is a valid tree");
    let tested = plan(&full_mesh(&topo), s.mode);
    let mut rng = Rng::new(s.seed.wrapping_mul(31).wrapping_add(7));
    let calibration = rng.range(0.85, 1.0);
    let mut inference = LinkStateInference::new();
    let mut found: BTreeMap<LinkId, Cause> = BTreeMap::new();
    let (fault_kind, fault_link) = match &s.fault {
        Some((k, l)) => (Some(*k), Some(l.clone())),
        None => (None, None),
    };
    // Utilization the bus monitor reports: the overloaded link over util_high, some
    // others loaded below it on a busy host.
    let mut util: BTreeMap<LinkId, f64> = BTreeMap::new();
    let all_links: BTreeSet<LinkId> = tested
        .iter()
        .flat_map(|p| p.links.iter().cloned())
        .collect();
    if s.mode == HostMode::Busy {
        for l in &all_links {
            util.insert(l.clone(), rng.range(0.05, 0.75));
        }
    }
    if let (Some(k), Some(l)) = (fault_kind, &fault_link) {
        util.insert(
            l.clone(),
            if k.cause() == Cause::Congestion {
                rng.range(util_high, 1.0)
            } else {
                rng.range(0.0, 0.5)
            },
        );
    }
    // Service traffic an RNIC carries slows all its tests alike (busy hosts).
    let rnics: BTreeSet<&str> = tested.iter().map(|p| p.rnic.as_str()).collect();
    let load: BTreeMap<&str, f64> = rnics
        .iter()
        .map(|r| {
            (
                *r,
                if s.mode == HostMode::Busy {
                    rng.range(0.6, 1.0)
                } else {
                    1.0
                },
            )
        })
        .collect();
    for _ in 0..ROUNDS {
        let timings: Vec<(HostPath, Timing)> = tested
            .iter()
            .map(|p| {
                let mut gbps =
                    p.nominal_gbps.unwrap_or(100.0) * calibration * load[p.rnic.as_str()];
                gbps *= 1.0 + 0.02 * rng.gauss();
                if s.mode == HostMode::Busy {
                    gbps *= 1.0 - 0.05 * rng.unit();
                }
                if let (Some(k), Some(l)) = (fault_kind, &fault_link) {
                    let hit = p.links.contains(l)
                        && (k != HostFaultKind::MemoryChannelFlapping || rng.unit() < 0.5);
                    if hit {
                        gbps *= s.factor;
                    }
                }
                let small_ns = 2000.0 * (1.0 + 0.05 * rng.unit());
                let large_ns = small_ns + (LARGE_BYTES - SMALL_BYTES) as f64 * 8.0 / gbps.max(0.1);
                (p.clone(), Timing { small_ns, large_ns })
            })
            .collect();
        let verdicts = judge(&timings, s.mode, abnormal_th);
        let paths: Vec<_> = verdicts.iter().map(|m| m.verdict()).collect();
        let round = inference.round(&paths, &util, util_high);
        for f in round.findings {
            let keep_flapping = found.get(&f.link) == Some(&Cause::Flapping);
            if !keep_flapping {
                found.insert(f.link, f.cause);
            }
        }
    }
    Outcome {
        truth: s.fault.as_ref().map(|(k, l)| (l.clone(), k.cause())),
        found,
    }
}

/// Precision and recall of one kind (or of the fault-free hosts).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct KindScore {
    pub kind: String,
    pub scenarios: u32,
    pub true_findings: u32,
    pub false_findings: u32,
    pub missed: u32,
    pub redraws: u32,
    pub precision: f64,
    pub recall: f64,
}

/// The suite: `n` scenarios from `seed`, kinds in turn, every 11th fault-free.
pub fn evaluate(n: u32, seed: u64, abnormal_th: f64, util_high: f64) -> Vec<KindScore> {
    let mut by_kind: BTreeMap<String, KindScore> = BTreeMap::new();
    for i in 0..n {
        let kind = if i % 11 == 10 {
            None
        } else {
            Some(FAULT_KINDS[(i as usize - i as usize / 11) % FAULT_KINDS.len()])
        };
        let s = draw(seed.wrapping_add(i as u64 * 7919), kind);
        let out = run(&s, abnormal_th, util_high);
        let name = kind.map_or("fault_free", |k| k.name()).to_string();
        let e = by_kind.entry(name.clone()).or_insert_with(|| KindScore {
            kind: name,
            ..Default::default()
        });
        e.scenarios += 1;
        e.redraws += s.redraws;
        let mut hit = false;
        for (link, cause) in &out.found {
            if out.truth.as_ref() == Some(&(link.clone(), *cause)) {
                e.true_findings += 1;
                hit = true;
            } else {
                e.false_findings += 1;
            }
        }
        if out.truth.is_some() && !hit {
            e.missed += 1;
        }
    }
    let mut out: Vec<KindScore> = by_kind.into_values().collect();
    for k in &mut out {
        let found = k.true_findings + k.false_findings;
        k.precision = if found == 0 {
            1.0
        } else {
            k.true_findings as f64 / found as f64
        };
        let faults = k.true_findings + k.missed;
        k.recall = if faults == 0 {
            1.0
        } else {
            k.true_findings as f64 / faults as f64
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_found_on_its_scenario() {
        for (i, kind) in FAULT_KINDS.iter().enumerate() {
            let s = draw(1000 + i as u64, Some(*kind));
            let out = run(&s, 0.2, 0.9);
            let truth = out.truth.clone().unwrap();
            assert_eq!(
                out.found.get(&truth.0),
                Some(&truth.1),
                "{kind:?} on {:?}: found {:?}",
                truth.0,
                out.found
            );
            assert_eq!(out.found.len(), 1, "{kind:?}: {:?}", out.found);
        }
    }

    #[test]
    fn a_fault_free_host_has_no_findings() {
        for seed in 0..10 {
            let s = draw(seed, None);
            assert!(run(&s, 0.2, 0.9).found.is_empty(), "seed {seed}");
        }
    }

    #[test]
    fn draws_are_deterministic() {
        let a = draw(42, Some(HostFaultKind::Upi));
        let b = draw(42, Some(HostFaultKind::Upi));
        assert_eq!((a.fault, a.factor), (b.fault, b.factor));
    }

    #[test]
    fn a_small_suite_meets_the_target() {
        let scores = evaluate(44, 5, 0.2, 0.9);
        for k in &scores {
            assert!(k.precision >= 0.98 && k.recall >= 0.98, "{k:?}");
        }
    }
}
