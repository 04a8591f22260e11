//! Loopback tests: what to test, and what the timings say.
//!
//! An RNIC writes from a read region to a write region on an endpoint through an RC QP
//! connected to itself; the time from posting the write to polling its completion is
//! (the paper's Eq. 1) `Lat = T_proc + Lat_host + Size / BW_host`. A 1-byte write gives
//! `T_proc + Lat_host` (Eq. 2); the difference between a large write and the 1-byte one
//! gives `Size / BW_host` (Eq. 3), so the bandwidth needs no huge message.
//!
//! Which paths: when the host is idle (every RNIC under `thp_low` of its line rate), the
//! full mesh of RNIC x endpoint; when it is busy or abnormal (Tx pause over `pfc_high`),
//! only each RNIC's affinitive endpoints (memory, and GPUs under its root port).
//!
//! A path is abnormal when its bandwidth is `abnormal_th` below its peers'. Peers are
//! compared as shares of what a healthy path of the same distance carries
//! ([`crate::paths::Distance::healthy_share`]), against the host's own healthy level
//! (the 90th percentile of those shares), so a host whose RNICs all run a little slow is
//! not abnormal, and a broken UPI, which slows half of all paths, is. When the host is
//! busy, each RNIC's paths are compared among themselves (the service traffic it carries
//! slows all of them alike; the paper's comparison of affinitive endpoints).

use serde::Serialize;

use crate::linkstate::PathVerdict;
use crate::paths::HostPath;

/// The two message sizes: 1 byte (Eq. 2) and 256 KiB (enough for a 200 Gb/s RNIC).
pub const SMALL_BYTES: u64 = 1;
pub const LARGE_BYTES: u64 = 256 * 1024;

/// What one path measured: median completion times of the two sizes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Timing {
    pub small_ns: f64,
    pub large_ns: f64,
}

impl Timing {
    /// Eq. 2: T_proc + Lat_host, in microseconds.
    pub fn host_latency_us(&self) -> f64 {
        self.small_ns / 1000.0
    }

    /// Eq. 3: BW_host from the difference, Gb/s; `None` when the large write was not
    /// slower than the small one (a timing that says nothing).
    pub fn bandwidth_gbps(&self) -> Option<f64> {
        let dt = self.large_ns - self.small_ns;
        (dt > 0.0).then(|| (LARGE_BYTES - SMALL_BYTES) as f64 * 8.0 / dt)
    }
}

/// The median of samples (ns); `None` for none.
pub fn median(samples: &mut [f64]) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let n = samples.len();
    Some(if n % 2 == 1 {
        samples[n / 2]
    } else {
        (samples[n / 2 - 1] + samples[n / 2]) / 2.0
    })
}

/// How the host is doing, which decides what to test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HostMode {
    /// Every RNIC under thp_low: the full mesh.
    Idle,
    /// Carrying traffic: affinitive endpoints only.
    Busy,
    /// Tx pause over pfc_high: affinitive endpoints only, now.
    Abnormal,
}

/// The paths to test in `mode`.
pub fn plan(mesh: &[HostPath], mode: HostMode) -> Vec<HostPath> {
    match mode {
        HostMode::Idle => mesh.to_vec(),
        HostMode::Busy | HostMode::Abnormal => {
            mesh.iter().filter(|p| p.affinitive).cloned().collect()
        }
    }
}

/// One tested path and its verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PathMeasurement {
    pub path: HostPath,
    pub timing: Timing,
    pub bandwidth_gbps: Option<f64>,
    /// Bandwidth as a share of what a healthy path of its kind carries.
    pub share: Option<f64>,
    /// The share its peers set.
    pub reference: Option<f64>,
    pub abnormal: bool,
}

impl PathMeasurement {
    /// What Algorithm 1 needs of it.
    pub fn verdict(&self) -> PathVerdict {
        PathVerdict {
            rnic: self.path.rnic.clone(),
            endpoint: self.path.endpoint.to_string(),
            links: self.path.links.clone(),
            abnormal: self.abnormal,
        }
    }
}

fn p90(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let k = ((v.len() as f64 - 1.0) * 0.9).round() as usize;
    Some(v[k])
}

/// Verdicts for the tested paths. A path whose bandwidth could not be measured is
/// abnormal (the write did not finish in a telling time).
pub fn judge(
    tested: &[(HostPath, Timing)],
    mode: HostMode,
    abnormal_th: f64,
) -> Vec<PathMeasurement> {
    let shares: Vec<Option<f64>> = tested
        .iter()
        .map(|(p, t)| {
            let bw = t.bandwidth_gbps()?;
            Some(match p.nominal_gbps {
                Some(n) if n > 0.0 => bw / n,
                _ => bw / 100.0, // nothing known: compare raw Gb/s (scaled, as a share)
            })
        })
        .collect();
    let host_ref = p90(shares.iter().flatten().copied().collect());
    tested
        .iter()
        .zip(&shares)
        .map(|((p, t), share)| {
            let reference = match mode {
                HostMode::Idle => host_ref,
                HostMode::Busy | HostMode::Abnormal => p90(tested
                    .iter()
                    .zip(&shares)
                    .filter(|((q, _), _)| q.rnic == p.rnic)
                    .filter_map(|(_, s)| *s)
                    .collect()),
            };
            let abnormal = match (share, reference) {
                (Some(s), Some(r)) => *s < (1.0 - abnormal_th) * r,
                (None, _) => true,
                (Some(_), None) => false,
            };
            PathMeasurement {
                path: p.clone(),
                timing: *t,
                bandwidth_gbps: t.bandwidth_gbps(),
                share: *share,
                reference,
                abnormal,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paths::{Distance, Endpoint, HostPath};

    #[test]
    fn eq3_takes_bandwidth_from_the_difference() {
        // 256 KiB at 200 Gb/s is 10.49 us on top of a 2 us small write.
        let t = Timing {
            small_ns: 2000.0,
            large_ns: 2000.0 + (LARGE_BYTES - 1) as f64 * 8.0 / 200.0,
        };
        assert!((t.bandwidth_gbps().unwrap() - 200.0).abs() < 1e-9);
        assert_eq!(t.host_latency_us(), 2.0);
        assert_eq!(
            Timing {
                small_ns: 5.0,
                large_ns: 5.0
            }
            .bandwidth_gbps(),
            None
        );
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&mut []), None);
    }

    fn hp(rnic: &str, ep: u32, distance: Distance, affinitive: bool) -> HostPath {
        HostPath {
            rnic: rnic.into(),
            endpoint: Endpoint::Memory(ep),
            links: Vec::new(),
            distance,
            affinitive,
            nominal_gbps: Some(200.0 * distance.healthy_share()),
        }
    }

    fn at(gbps: f64) -> Timing {
        Timing {
            small_ns: 2000.0,
            large_ns: 2000.0 + (LARGE_BYTES - 1) as f64 * 8.0 / gbps,
        }
    }

    #[test]
    fn a_path_20_percent_below_its_peers_is_abnormal_by_distance() {
        let tested = vec![
            (hp("r0", 0, Distance::LocalMemory, true), at(195.0)),
            (hp("r0", 1, Distance::RemoteMemory, true), at(176.0)), // 0.9 share: healthy
            (hp("r1", 0, Distance::RemoteMemory, true), at(120.0)), // 0.67 of 0.9: abnormal
            (hp("r1", 1, Distance::LocalMemory, true), at(197.0)),
        ];
        let v = judge(&tested, HostMode::Idle, 0.2);
        let abnormal: Vec<bool> = v.iter().map(|m| m.abnormal).collect();
        assert_eq!(abnormal, vec![false, false, true, false]);
    }

    #[test]
    fn busy_hosts_compare_each_rnics_paths_among_themselves() {
        // r0 carries service traffic: everything it does is at about 60%.
        let tested = vec![
            (hp("r0", 0, Distance::LocalMemory, true), at(120.0)),
            (hp("r0", 1, Distance::LocalMemory, true), at(118.0)),
            (hp("r1", 0, Distance::LocalMemory, true), at(196.0)),
            (hp("r1", 1, Distance::LocalMemory, true), at(140.0)),
        ];
        let busy: Vec<bool> = judge(&tested, HostMode::Busy, 0.2)
            .iter()
            .map(|m| m.abnormal)
            .collect();
        assert_eq!(busy, vec![false, false, false, true]);
        let idle: Vec<bool> = judge(&tested, HostMode::Idle, 0.2)
            .iter()
            .map(|m| m.abnormal)
            .collect();
        assert_eq!(idle, vec![true, true, false, true]);
        let affinitive_only = plan(
            &[
                hp("a", 0, Distance::LocalMemory, true),
                hp("a", 1, Distance::CrossSocket, false),
            ],
            HostMode::Busy,
        );
        assert_eq!(affinitive_only.len(), 1);
    }

    #[test]
    fn an_unmeasurable_path_is_abnormal() {
        let tested = vec![
            (hp("r0", 0, Distance::LocalMemory, true), at(195.0)),
            (
                hp("r0", 1, Distance::LocalMemory, true),
                Timing {
                    small_ns: 9e9,
                    large_ns: 9e9,
                },
            ),
        ];
        assert!(judge(&tested, HostMode::Idle, 0.2)[1].abnormal);
    }
}
