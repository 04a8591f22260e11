//! The gray-failure suite: faults of the size that slows a training job down long before a
//! per-path SLA trips (a link dropping 0.5-2%, +10-50 us on a link, host stalls of
//! 0.5-2 ms, an RNIC dropping 0.5-2%), some lasting only 2-5 windows, some three at once,
//! on fabrics of 1,024 RNICs (two of them rail-optimized), over the realistic background
//! of [`Background::realistic`]. Seeded; each (kind, magnitude) gets its share.

use crate::fabric::FabricSpec;
use crate::rng::{below, spread_fault, uniform, Rng};
use crate::scenario::background::Background;
use crate::scenario::{Direction, Fault, FaultKind, Scenario};

/// The kinds of the gray suite, in the order its faults cycle through.
pub const GRAY_KINDS: [&str; 4] = ["link_loss", "link_latency", "host_stall", "rnic_loss"];

/// Magnitudes per kind (loss as a share, latency and stall in us), smallest first.
pub const MAGNITUDES: [[f64; 3]; 4] = [
    [0.005, 0.01, 0.02],
    [10.0, 20.0, 50.0],
    [500.0, 1000.0, 2000.0],
    [0.005, 0.01, 0.02],
];

/// (tors, spines, hosts_per_tor, rnics_per_host, rail_optimized): 1,024 RNICs each.
pub const GRAY_FABRICS: [(u32, u32, u32, u32, bool); 4] = [
    (64, 8, 4, 4, false),
    (64, 8, 16, 8, true),
    (128, 4, 2, 4, false),
    (128, 8, 8, 8, true),
];

/// Length of a gray suite scenario; faults start after `WARMUP_SEC` (the controller
/// starts cold: its baseline is learned from the first windows).
pub const GRAY_DURATION_SEC: u64 = 600;
pub const WARMUP_SEC: f64 = 150.0;
/// Every this-many-th scenario is fault-free.
pub const GRAY_FAULT_FREE_EVERY: usize = 8;

/// A fault's magnitude as the report groups it: "0.5%", "+10us", "2ms".
pub fn magnitude_label(k: &FaultKind) -> String {
    match *k {
        FaultKind::LinkLoss { loss, .. } | FaultKind::RnicLoss { loss } => {
            format!("{}%", loss * 100.0)
        }
        FaultKind::LinkLatency { add_us, .. } => format!("+{add_us}us"),
        FaultKind::HostStall { delay_us } => format!("{}ms", delay_us / 1000.0),
        _ => String::new(),
    }
}

pub fn gray_fabric(i: usize) -> FabricSpec {
    let (tors, spines, hosts_per_tor, rnics_per_host, rail_optimized) =
        GRAY_FABRICS[i % GRAY_FABRICS.len()];
    FabricSpec {
        tors,
        spines,
        hosts_per_tor,
        rnics_per_host,
        rail_optimized,
        link_latency_us: 2.0,
        link_jitter_us: 0.3,
    }
}

/// Fault `n` of the suite (kind and magnitude cycle with `n`) on ToR `tor` (1-based).
fn gray_fault(rng: &mut Rng, n: usize, tor: u32, f: &FabricSpec, start: f64, len: f64) -> Fault {
    let kind = n % GRAY_KINDS.len();
    let magnitude = MAGNITUDES[kind][(n / GRAY_KINDS.len()) % 3];
    let direction = match below(rng, 3) {
        0 => Direction::Up,
        1 => Direction::Down,
        _ => Direction::Both,
    };
    let s = 1 + below(rng, f.spines);
    // A host on this ToR: in a rail-optimized fabric hosts are named by their group.
    let group = if f.rail_optimized {
        (tor - 1) / f.rnics_per_host + 1
    } else {
        tor
    };
    let h = 1 + below(rng, f.hosts_per_tor);
    let r = if f.rail_optimized {
        (tor - 1) % f.rnics_per_host
    } else {
        below(rng, f.rnics_per_host)
    };
    let (kind, location) = match GRAY_KINDS[kind] {
        "link_loss" => (
            FaultKind::LinkLoss {
                loss: magnitude,
                direction,
            },
            format!("tor{tor}-spine{s}"),
        ),
        "link_latency" => (
            FaultKind::LinkLatency {
                add_us: magnitude,
                direction,
            },
            format!("tor{tor}-spine{s}"),
        ),
        "host_stall" => (
            FaultKind::HostStall {
                delay_us: magnitude,
            },
            format!("h{group}-{h}"),
        ),
        _ => (
            FaultKind::RnicLoss { loss: magnitude },
            format!("h{group}-{h}/r{r}"),
        ),
    };
    Fault::lasting(kind, location, start, len)
}

/// Scenario `i` of the gray suite seeded `seed`. Of every 8: one fault-free; three with
/// one fault of 5-10 windows; two with one short fault of 2-5 windows; two with three
/// faults of different kinds at once (on different ToRs, overlapping in time).
pub fn gray_scenario(seed: u64, i: usize) -> Scenario {
    let mut rng = Rng::new(seed ^ (i as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
    let f = gray_fabric(i);
    let block = i / GRAY_FAULT_FREE_EVERY;
    // Faults numbered across the suite so kinds and magnitudes rotate evenly.
    let mut n = block * 11;
    let mut faults = Vec::new();
    let (count, lo, hi) = match i % GRAY_FAULT_FREE_EVERY {
        7 => (0, 0.0, 0.0),
        0 | 2 | 4 => (1, 150.0, 300.0),
        1 | 5 => (1, 60.0, 150.0),
        _ => (3, 90.0, 240.0),
    };
    n += match i % GRAY_FAULT_FREE_EVERY {
        0 => 0,
        1 => 1,
        2 => 2,
        3 => 3,
        4 => 6,
        5 => 7,
        _ => 8,
    };
    let start = uniform(&mut rng, WARMUP_SEC, WARMUP_SEC + 120.0).round();
    let first_tor = 1 + below(&mut rng, f.tors);
    for j in 0..count {
        // A third of the fabric apart; starts within a window of each other.
        let (tor, s) = spread_fault(&mut rng, f.tors, first_tor, j, 3, start, 30.0);
        let s = s.max(WARMUP_SEC);
        let len = uniform(&mut rng, lo, hi).round();
        let len = len.min(GRAY_DURATION_SEC as f64 - s);
        faults.push(gray_fault(&mut rng, n + j, tor, &f, s, len));
    }
    Scenario {
        seed: seed.wrapping_add(1_000_000 + i as u64),
        duration_sec: GRAY_DURATION_SEC,
        fabric: f,
        faults,
        background: Background::realistic(),
    }
}

/// The fault-free day's fabric: 2,048 RNICs (64 ToRs x 8 spines, 4 hosts of 8 RNICs
/// per ToR) on the realistic background; hour `h` of it as its own seeded run.
pub fn fault_free_hour(seed: u64, h: usize) -> Scenario {
    Scenario {
        seed: seed ^ 0xDA7F_FEE0 ^ (h as u64).wrapping_mul(0x9E37_79B9),
        duration_sec: 3600,
        fabric: FabricSpec {
            tors: 64,
            spines: 8,
            hosts_per_tor: 4,
            rnics_per_host: 8,
            rail_optimized: false,
            link_latency_us: 2.0,
            link_jitter_us: 0.3,
        },
        faults: Vec::new(),
        background: Background::realistic(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn the_gray_suite_is_seeded_balanced_and_valid() {
        let a: Vec<Scenario> = (0..96).map(|i| gray_scenario(5, i)).collect();
        assert_eq!(a, (0..96).map(|i| gray_scenario(5, i)).collect::<Vec<_>>());
        let mut per: BTreeMap<(String, String), u32> = BTreeMap::new();
        let mut short = 0;
        for (i, s) in a.iter().enumerate() {
            s.validate().unwrap_or_else(|e| panic!("scenario {i}: {e}"));
            let f = &s.fabric;
            let rnics = if f.rail_optimized {
                f.tors * f.hosts_per_tor
            } else {
                f.tors * f.hosts_per_tor * f.rnics_per_host
            };
            assert!(rnics >= 1000, "scenario {i}: {rnics} RNICs");
            let kinds: std::collections::BTreeSet<&str> =
                s.faults.iter().map(|f| f.kind.name()).collect();
            assert_eq!(kinds.len(), s.faults.len(), "scenario {i}: kinds differ");
            for g in &s.faults {
                assert!(g.start_sec >= WARMUP_SEC);
                short += (g.end_sec - g.start_sec < 150.0) as u32;
                *per.entry((g.kind.name().to_string(), magnitude_label(&g.kind)))
                    .or_default() += 1;
            }
        }
        assert_eq!(per.len(), 12, "{per:?}");
        let (lo, hi) = (per.values().min().unwrap(), per.values().max().unwrap());
        assert!(hi - lo <= 3, "{per:?}");
        assert!(short >= 20, "{short}");
        assert_eq!(a.iter().filter(|s| s.faults.is_empty()).count(), 12);
        assert!(fault_free_hour(1, 0).validate().is_ok());
    }
}
